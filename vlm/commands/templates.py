"""Question templates: what can be asked about a scene, in several phrasings, with the answer. A template with its
parameters is a *question key* (``counting/more_than|car|3``): answer balancing works on keys, not phrasings."""

import difflib
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from vlm.commands import rules
from vlm.scenes.schema import LIGHT_COLORS, Scene

COMMAND_TYPES = ("detection", "counting", "traffic_light", "spatial", "safety", "scene")

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
    def _loose_patterns(self) -> tuple[re.Pattern, ...]:
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


TEMPLATES = {t.id: t for t in (
    Template("detection/present", "detection", YES_NO, (
        "Is there a {category}?", "Is there a {category} in the image?", "Can you see a {category}?",
        "Are there any {plural}?", "Is a {category} visible?")),
    Template("counting/how_many", "counting", COUNTS, (
        "How many {plural} are there?", "How many {plural} can you see?", "What is the number of {plural}?",
        "How many {plural} are in the scene?")),
    Template("counting/more_than", "counting", YES_NO, (
        "Are there more than {k} {plural}?", "Can you see more than {k} {plural}?",
        "Is the number of {plural} greater than {k}?")),
    Template("traffic_light/color", "traffic_light", (*LIGHT_COLORS, "maybe"), (
        "What color is the traffic light?", "What colour is the traffic light?", "What color is the light?",
        "Which color is the signal showing?")),
    Template("traffic_light/is_color", "traffic_light", YES_NO_MAYBE, (
        "Is the traffic light {color}?", "Is the light {color}?", "Does the traffic light show {color}?",
        "Is the signal {color}?")),
    Template("spatial/on_side", "spatial", YES_NO, (
        "Is there a {category} on the {side} side?", "Is there a {category} on the {side}?",
        "Can you see a {category} on the {side} side of the image?", "Is a {category} visible on the {side}?")),
    Template("safety/manoeuvre", "safety", YES_NO_MAYBE, (
        "Can the car safely {action}?", "Is it safe to {action}?", "Can we {action} now?",
        "Is it safe for the car to {action}?")),
    Template("scene/night", "scene", YES_NO, ("Is it night?", "Is it nighttime?", "Was this taken at night?")),
    Template("scene/rain", "scene", YES_NO, ("Is it raining?", "Is it rainy?", "Is the weather rainy?")),
    Template("scene/fog", "scene", YES_NO, ("Is it foggy?", "Is there fog?", "Is the weather foggy?")),
    Template("scene/highway", "scene", YES_NO,
             ("Is this a highway?", "Is the car on a highway?", "Is this scene on a highway?")),
)}

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
                 if any(pattern.fullmatch(text) for pattern in template._loose_patterns)), None)


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


@dataclass(frozen=True)
class TemplateOptions:
    detection_categories: tuple[str, ...]
    counting_categories: tuple[str, ...]
    spatial_categories: tuple[str, ...]
    more_than: tuple[int, ...]
    max_count: int


def candidates(scene: Scene, width: float, height: float, options: TemplateOptions,
               command_types: tuple[str, ...] = COMMAND_TYPES) -> list[Candidate]:
    """Every question the templates can ask about ``scene``, with answers from its labels."""
    out: list[Candidate] = []
    types = set(command_types)
    if "detection" in types:
        for c in options.detection_categories:
            out.append(Candidate("detection/present", (("category", c),), rules.is_present(scene, c)))
    if "counting" in types:
        for c in options.counting_categories:
            n = rules.count(scene, c)
            if n <= options.max_count:
                out.append(Candidate("counting/how_many", (("category", c),), str(n)))
            for k in options.more_than:
                out.append(Candidate("counting/more_than", (("category", c), ("k", str(k))),
                                     rules.YES if n > k else rules.NO))
    if "traffic_light" in types and rules.count(scene, "traffic light"):
        out.append(Candidate("traffic_light/color", (), rules.light_color(scene)))
        for color in LIGHT_COLORS:
            out.append(Candidate("traffic_light/is_color", (("color", color),), rules.light_is(scene, color)))
    if "spatial" in types:
        for c in options.spatial_categories:
            for side in rules.SIDES:
                out.append(Candidate("spatial/on_side", (("category", c), ("side", side)),
                                     rules.on_side(scene, c, side, width)))
    if "safety" in types:
        for manoeuvre in rules.PATHS:
            out.append(Candidate("safety/manoeuvre", (("manoeuvre", manoeuvre),),
                                 rules.safety(scene, manoeuvre, width, height)))
    if "scene" in types:
        for attribute in rules.FRAME_ATTRIBUTES:
            answer = rules.scene_attribute(scene, attribute)
            if answer is not None:
                out.append(Candidate(f"scene/{attribute}", (), answer))
    return out
