"""How many cars are there? Are there more than 5 pedestrians?"""

from dataclasses import dataclass, field

from vlm.commands import rules
from vlm.commands.templates import COUNTS, YES_NO, Candidate, Template
from vlm.commands.types.base import CategoryOptions, QuestionType, register
from vlm.config import check

HOW_MANY = Template("counting/how_many", "counting", COUNTS, (
    "How many {plural} are there?", "How many {plural} can you see?", "What is the number of {plural}?",
    "How many {plural} are in the scene?"))
MORE_THAN = Template("counting/more_than", "counting", YES_NO, (
    "Are there more than {k} {plural}?", "Can you see more than {k} {plural}?",
    "Is the number of {plural} greater than {k}?"))


@dataclass
class CountingOptions(CategoryOptions):
    categories: list[str] = field(default_factory=lambda: ["car", "pedestrian"])
    # BDD100K frames hold a median of 9 cars (p90 18), a pedestrian in a third of them
    more_than: list[int] = field(default_factory=lambda: [1, 3, 5, 10, 15])
    max_count: int = 9  # "how many" is asked only of frames with at most this many: its answers are single digits

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        check(0 <= self.max_count <= 9, f"{prefix}.max_count",
              f"must be in 0..9 (answers are single digits), got {self.max_count}")
        for k in self.more_than:
            check(k >= 0, f"{prefix}.more_than", f"thresholds must be >= 0, got {k}")
        check(len(set(self.more_than)) == len(self.more_than), f"{prefix}.more_than",
              f"names a value twice: {self.more_than}")


def ask(scene, width, height, options: CountingOptions) -> list[Candidate]:
    out = []
    for c in options.categories:
        n = rules.count(scene, c)
        if n <= options.max_count:
            out.append(Candidate(HOW_MANY.id, (("category", c),), str(n)))
        out.extend(Candidate(MORE_THAN.id, (("category", c), ("k", str(k))), rules.YES if n > k else rules.NO)
                   for k in options.more_than)
    return out


def _category(record, scene, width, height) -> dict[str, str]:
    template = HOW_MANY if record["template"] == HOW_MANY.id else MORE_THAN
    return {"counting_category": template.parse(record["command"])["category"]}


register(QuestionType("counting", (HOW_MANY, MORE_THAN), ask, color=(150, 60, 10), position=1,
                      options=CountingOptions, slice_dimensions=("counting_category",), slices=_category))
