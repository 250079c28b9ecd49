"""The contract every question type keeps, and the registry a type joins by calling :func:`register`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vlm.commands.templates import TEMPLATES, Candidate, Template
from vlm.config import check
from vlm.scenes.schema import CATEGORIES, Scene

Slices = Callable[[dict, Scene, float, float], dict[str, str]]  # (question record, its scene, width, height)


@dataclass
class NoOptions:
    """The options of a type that has none (``commands.types.<name>: {}``)."""

    def validate(self, prefix: str) -> None:
        pass


@dataclass
class CategoryOptions:
    """The options of a type asked about object categories."""

    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))

    def validate(self, prefix: str) -> None:
        check(bool(self.categories), f"{prefix}.categories", "is empty: name categories, or drop the type")
        for c in self.categories:
            check(c in CATEGORIES, f"{prefix}.categories", f"unknown category {c!r} (known: {', '.join(CATEGORIES)})")
        check(len(set(self.categories)) == len(self.categories), f"{prefix}.categories",
              f"names a value twice: {self.categories}")  # it would ask its questions twice as often


@dataclass(frozen=True)
class QuestionType:
    """One kind of question: its phrasings and answer sets (``templates``), the rule that asks and answers it from a
    scene's labels (``ask``), its options (``commands.types.<name>`` in params.yaml), its colour in pictures and the
    robustness slices it adds (``slice_dimensions``, the values ``slices`` gives a question)."""

    name: str
    templates: tuple[Template, ...]
    # every question of the type the scene's labels answer (none where they do not decide it), from its options
    ask: Callable[[Scene, float, float, Any], list[Candidate]]
    color: tuple[int, int, int]  # RGB of its questions on contact sheets and its bars
    position: int = 100  # its place among the types: the defaults ask them, and tables list them, in this order
    options: type = NoOptions
    slice_dimensions: tuple[str, ...] = ()
    slices: Slices = lambda record, scene, width, height: {}


QUESTION_TYPES: dict[str, QuestionType] = {}  # name -> type, by position (then name)


def register(question_type: QuestionType) -> QuestionType:
    """Add ``question_type`` and its templates to the registries."""
    name = question_type.name
    if name in QUESTION_TYPES:
        raise ValueError(f"two question types are named {name!r}")
    for template in question_type.templates:
        if template.command_type != name or not template.id.startswith(f"{name}/") or template.id in TEMPLATES:
            raise ValueError(f"template {template.id!r} of type {name!r}: ids are '{name}/...' and unique")
        TEMPLATES[template.id] = template
    QUESTION_TYPES[name] = question_type
    return question_type
