"""Question templates: what can be asked about a scene, in several phrasings, with the answer. A template with its
parameters is a *question key* (``counting/more_than|car|3``): answer balancing works on keys, not phrasings. The
templates themselves live with their question types (vlm/commands/types), which fill :data:`TEMPLATES`."""

import difflib
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from vlm.commands import rules
from vlm.scenes.schema import LIGHT_COLORS

PLURALS = {"pedestrian": "pedestrians", "rider": "riders", "car": "cars", "truck": "trucks", "bus": "buses",
           "train": "trains", "motorcycle": "motorcycles", "bicycle": "bicycles",
           "traffic light": "traffic lights", "traffic sign": "traffic signs"}


YES_NO = ("yes", "no")
YES_NO_MAYBE = ("yes", "no", "maybe")
COUNTS = tuple(str(n) for n in range(10))  # "how many" answers are single digits (commands.max_count <= 9)


@dataclass(frozen=True)
class Template:
    id: str
    command_type: str
    answers: tuple[str, ...]  # every answer its rule can give: what constrained decoding chooses among
    phrasings: tuple[str, ...]

    @cached_property
    def _patterns(self) -> tuple[re.Pattern, ...]:
        """Each phrasing as a regular expression with a named group per field, matching only its values."""
        return tuple(re.compile("".join(f"(?P<{field}>{_FIELD_VALUES[field]})" if field else re.escape(literal)
                                        for literal, field in _pieces(phrasing)))
                     for phrasing in self.phrasings)

    @cached_property
    def loose_patterns(self) -> tuple[re.Pattern, ...]:
        """:attr:`_patterns` for :func:`match_template`: any case, no question mark at the end."""
        return tuple(re.compile(p.pattern.removesuffix(re.escape("?")), re.IGNORECASE) for p in self._patterns)

    def parse(self, command: str) -> dict[str, str]:
        """The parameters a question of this template was written with (the inverse of :meth:`Candidate.text`):
        ``category`` (from ``{plural}`` too), ``k``, ``color``, ``side``, ``manoeuvre``."""
        for pattern in self._patterns:
            match = pattern.fullmatch(command)
            if match:
                values = match.groupdict()
                if "plural" in values:
                    values["category"] = CATEGORY_OF_PLURAL[values.pop("plural")]
                if "action" in values:
                    values["manoeuvre"] = MANOEUVRE_OF_ACTION[values.pop("action")]
                return values
        raise ValueError(f"{command!r} is no phrasing of the template {self.id!r}")


def _pieces(phrasing: str) -> list[tuple[str, str | None]]:
    """``"Is there a {category}?"`` -> [("Is there a ", None), ("", "category"), ("?", None)]."""
    return [piece for literal, field, _, _ in string.Formatter().parse(phrasing)
            for piece in ((literal, None), ("", field)) if piece[0] or piece[1]]


# every template of every question type, by id: each type's file (vlm/commands/types) adds its own when imported
TEMPLATES: dict[str, Template] = {}

ACTIONS = {"left": "turn left", "straight": "go straight", "right": "turn right"}
CATEGORY_OF_PLURAL = {plural: category for category, plural in PLURALS.items()}
MANOEUVRE_OF_ACTION = {action: manoeuvre for manoeuvre, action in ACTIONS.items()}
# what each field of a phrasing can hold, as a regular expression (longest alternatives first)
_FIELD_VALUES = {field: "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)) for field, values in {
    "category": PLURALS, "plural": PLURALS.values(), "color": LIGHT_COLORS, "side": rules.SIDES,
    "action": ACTIONS.values()}.items()} | {"k": "[0-9]+"}


def match_template(command: str) -> Template | None:
    """The template ``command`` is a phrasing of, read loosely (any case and spacing, the question mark optional), or
    None."""
    text = " ".join(command.split()).rstrip("?").rstrip()
    return next((template for template in TEMPLATES.values()
                 if any(pattern.fullmatch(text) for pattern in template.loose_patterns)), None)


def closest_phrasings(command: str, n: int = 3) -> list[str]:
    """The ``n`` phrasings (fields in braces) most like ``command``, for a message about a question no template
    reads."""
    phrasings = [p for template in TEMPLATES.values() for p in template.phrasings]
    return difflib.get_close_matches(command, phrasings, n=n, cutoff=0.0)


def fitting_answers(template_ids: Sequence[str | None], answers: Sequence[str]) -> np.ndarray:
    """bool ``[Q, C]``: which of the model's ``answers`` the template of each question can give (its
    :attr:`~vlm.commands.templates.Template.answers`); every answer for a question of no template (None), or of one
    none of whose answers the model knows."""
    known = np.asarray(answers, dtype=object)
    rows = []
    for template_id in template_ids:
        row = np.isin(known, TEMPLATES[template_id].answers) if template_id is not None else np.ones(len(known), bool)
        rows.append(row if row.any() else np.ones(len(known), bool))
    return np.stack(rows) if rows else np.zeros((0, len(known)), bool)


@dataclass(frozen=True)
class Candidate:
    """One askable question about one scene: template, parameters and the label-derived answer."""

    template: str
    params: tuple[tuple[str, str], ...]
    answer: str

    @property
    def command_type(self) -> str:
        return TEMPLATES[self.template].command_type

    @property
    def key(self) -> str:
        return "|".join([self.template, *(v for _, v in self.params)])

    def text(self, phrasing: int) -> str:
        template = TEMPLATES[self.template]
        values = dict(self.params)
        if "category" in values:
            values["plural"] = PLURALS[values["category"]]
        if "manoeuvre" in values:
            values["action"] = ACTIONS[values["manoeuvre"]]
        return template.phrasings[phrasing % len(template.phrasings)].format(**values)
