"""Is there a pedestrian on the left side? The object's box centre in the left or right third of the frame."""

from dataclasses import dataclass, field

from vlm.commands import rules
from vlm.commands.templates import YES_NO, Candidate, Template
from vlm.commands.types.base import CategoryOptions, QuestionType, register

ON_SIDE = Template("spatial/on_side", "spatial", YES_NO, (
    "Is there a {category} on the {side} side?", "Is there a {category} on the {side}?",
    "Can you see a {category} on the {side} side of the image?", "Is a {category} visible on the {side}?"))


@dataclass
class SpatialOptions(CategoryOptions):
    categories: list[str] = field(default_factory=lambda: ["car", "pedestrian", "truck", "bus"])


def ask(scene, width, height, options: SpatialOptions) -> list[Candidate]:
    return [Candidate(ON_SIDE.id, (("category", c), ("side", side)), rules.on_side(scene, c, side, width))
            for c in options.categories for side in rules.SIDES]


def sides(scene, category: str, width: float) -> str:
    """Where the category is: "both" sides, "one side" or "neither" (a slice: a "no" is hardest when it is on the
    other side)."""
    left, right = (rules.on_side(scene, category, side, width) == rules.YES for side in ("left", "right"))
    return "both" if left and right else "one side" if left or right else "neither"


register(QuestionType(
    "spatial", (ON_SIDE,), ask, color=(20, 120, 60), position=3, options=SpatialOptions,
    slice_dimensions=("spatial_sides",), slices=lambda record, scene, width, height: {
        "spatial_sides": sides(scene, ON_SIDE.parse(record["command"])["category"], width)}))
