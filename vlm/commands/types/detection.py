"""Is there a car? Presence of a category anywhere in the frame."""

from vlm.commands import rules
from vlm.commands.templates import YES_NO, Candidate, Template
from vlm.commands.types.base import CategoryOptions, QuestionType, register

PRESENT = Template("detection/present", "detection", YES_NO, (
    "Is there a {category}?", "Is there a {category} in the image?", "Can you see a {category}?",
    "Are there any {plural}?", "Is a {category} visible?"))


def ask(scene, width, height, options: CategoryOptions) -> list[Candidate]:
    return [Candidate(PRESENT.id, (("category", c),), rules.is_present(scene, c)) for c in options.categories]


register(QuestionType(
    "detection", (PRESENT,), ask, color=(20, 90, 170), position=0, options=CategoryOptions,
    slice_dimensions=("detection_category",),
    slices=lambda record, scene, width, height: {"detection_category": PRESENT.parse(record["command"])["category"]}))
