"""Can the car safely turn left? The light and the road users in the manoeuvre's path
(:func:`~vlm.commands.rules.safety`)."""

from vlm.commands import rules
from vlm.commands.templates import YES_NO_MAYBE, Candidate, Template
from vlm.commands.types.base import QuestionType, register
from vlm.commands.types.traffic_light import light_slices

MANOEUVRE = Template("safety/manoeuvre", "safety", YES_NO_MAYBE, (
    "Can the car safely {action}?", "Is it safe to {action}?", "Can we {action} now?",
    "Is it safe for the car to {action}?"))


def ask(scene, width, height, options) -> list[Candidate]:
    """Asked of a frame whose labels give the lights' colours and every road user's occlusion."""
    if not (rules.light_colors_labelled(scene) and rules.occlusion_labelled(scene)):
        return []
    return [Candidate(MANOEUVRE.id, (("manoeuvre", m),), rules.safety(scene, m, width, height)) for m in rules.PATHS]


register(QuestionType("safety", (MANOEUVRE,), ask, color=(120, 20, 140), position=4,
                      slice_dimensions=("light", "occluded_light"), slices=light_slices))
