"""Is it night? Is it raining? The frame's attributes (weather, time of day, scene), where they are labelled."""

from vlm.commands import rules
from vlm.commands.templates import YES_NO, Candidate, Template
from vlm.commands.types.base import QuestionType, register

TEMPLATES = (
    Template("scene/night", "scene", YES_NO, ("Is it night?", "Is it nighttime?", "Was this taken at night?")),
    Template("scene/rain", "scene", YES_NO, ("Is it raining?", "Is it rainy?", "Is the weather rainy?")),
    Template("scene/fog", "scene", YES_NO, ("Is it foggy?", "Is there fog?", "Is the weather foggy?")),
    Template("scene/highway", "scene", YES_NO,
             ("Is this a highway?", "Is the car on a highway?", "Is this scene on a highway?")),
)


def ask(scene, width, height, options) -> list[Candidate]:
    answers = ((attribute, rules.scene_attribute(scene, attribute)) for attribute in rules.FRAME_ATTRIBUTES)
    return [Candidate(f"scene/{attribute}", (), answer) for attribute, answer in answers if answer is not None]


register(QuestionType("scene", TEMPLATES, ask, color=(60, 60, 60), position=5))
