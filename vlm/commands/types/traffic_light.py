"""What colour is the traffic light? The governing light's colour (:func:`~vlm.commands.rules.governing_light`)."""

from vlm.commands import rules
from vlm.commands.templates import YES_NO_MAYBE, Candidate, Template
from vlm.commands.types.base import QuestionType, register
from vlm.scenes.schema import LIGHT_COLORS

COLOR = Template("traffic_light/color", "traffic_light", (*LIGHT_COLORS, rules.MAYBE), (
    "What color is the traffic light?", "What colour is the traffic light?", "What color is the light?",
    "Which color is the signal showing?"))
IS_COLOR = Template("traffic_light/is_color", "traffic_light", YES_NO_MAYBE, (
    "Is the traffic light {color}?", "Is the light {color}?", "Does the traffic light show {color}?",
    "Is the signal {color}?"))
FAR_LIGHT = 0.05  # a governing light shorter than this fraction of the frame height is "far" (a slice)


def ask(scene, width, height, options) -> list[Candidate]:
    """Asked of a frame with a traffic light whose labels give the lights' colours."""
    if not rules.count(scene, "traffic light") or not rules.light_colors_labelled(scene):
        return []
    return [Candidate(COLOR.id, (), rules.light_color(scene)),
            *(Candidate(IS_COLOR.id, (("color", color),), rules.light_is(scene, color)) for color in LIGHT_COLORS)]


def light_condition(scene, height: float) -> str:
    light = rules.governing_light(scene)
    if light is not None:
        return "far" if light.box[3] - light.box[1] < FAR_LIGHT * height else "near"
    return "unreadable" if rules.count(scene, "traffic light") else "no light"


def light_slices(record, scene, width, height) -> dict[str, str]:
    """The slices of a question whose answer depends on the light: how far it is, whether one is occluded."""
    occluded = any(o.category == "traffic light" and o.occluded for o in scene.objects)
    return {"light": light_condition(scene, height), "occluded_light": "yes" if occluded else "no"}


register(QuestionType("traffic_light", (COLOR, IS_COLOR), ask, color=(180, 20, 20), position=2,
                      slice_dimensions=("light", "occluded_light"), slices=light_slices))
