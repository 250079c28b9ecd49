"""Robustness slices: the conditions each test question was asked under (a value per dimension, ``None`` where it does
not apply; the dimensions: docs/architecture.md, evaluate), from the labels only (synthetic and BDD100K alike)."""

import pandas as pd

from vlm.commands import rules
from vlm.commands.templates import TEMPLATES
from vlm.scenes.schema import Scene

OBJECT_BINS = ((0, 4), (5, 9), (10, 19), (20, None))  # labelled objects per frame, inclusive
FAR_LIGHT = 0.05  # a governing light shorter than this fraction of the frame height is "far"
DIMENSIONS = ("timeofday", "weather", "scene", "objects", "light", "occluded_light", "detection_category",
              "counting_category", "spatial_sides")
LIGHT_TYPES = ("traffic_light", "safety")  # the command types whose answer depends on the light


def object_bin(count: int) -> str:
    for low, high in OBJECT_BINS:
        if high is None or count <= high:
            return f"{low}+" if high is None else f"{low}-{high}"
    raise AssertionError("the last bin is open")


def _order(dimension: str, value: str) -> tuple:
    """Object bins in numeric order, every other value alphabetically."""
    return (int(value.split("-")[0].rstrip("+")),) if dimension == "objects" else (0, value)


def light_condition(scene: Scene, height: float) -> str:
    light = rules.governing_light(scene)
    if light is not None:
        return "far" if light.box[3] - light.box[1] < FAR_LIGHT * height else "near"
    return "unreadable" if rules.count(scene, "traffic light") else "no light"


def sides(scene: Scene, category: str, width: float) -> str:
    left, right = (rules.on_side(scene, category, side, width) == rules.YES for side in ("left", "right"))
    return "both" if left and right else "one side" if left or right else "neither"


def question_conditions(record: dict, scene: Scene, width: float, height: float) -> dict[str, str | None]:
    """The value of every dimension for one question record about ``scene`` (None where it does not apply)."""
    command_type = record["command_type"]
    conditions: dict[str, str | None] = dict.fromkeys(DIMENSIONS)
    conditions.update(timeofday=scene.timeofday, weather=scene.weather, scene=scene.scene,
                      objects=object_bin(len(scene.objects)))
    if command_type in LIGHT_TYPES:
        occluded = any(o.category == "traffic light" and o.occluded for o in scene.objects)
        conditions.update(light=light_condition(scene, height), occluded_light="yes" if occluded else "no")
    if command_type in ("detection", "counting"):
        conditions[f"{command_type}_category"] = TEMPLATES[record["template"]].parse(record["command"])["category"]
    if command_type == "spatial":
        category = TEMPLATES[record["template"]].parse(record["command"])["category"]
        conditions["spatial_sides"] = sides(scene, category, width)
    return conditions


def conditions_table(records: list[dict], scenes: dict[str, Scene], width: float, height: float) -> pd.DataFrame:
    """One row per record, one column per dimension."""
    return pd.DataFrame([question_conditions(r, scenes[r["image_id"]], width, height) for r in records],
                        columns=list(DIMENSIONS))


def slice_accuracy(table: pd.DataFrame, correct_columns: dict[str, str]) -> tuple[dict, dict]:
    """Accuracy per (dimension, value) of each model's boolean ``correct_columns[model]`` column of ``table``, and the
    questions per slice: ``{model: {dimension: {value: accuracy}}}`` and ``{dimension: {value: n}}``."""
    accuracy: dict[str, dict] = {model: {} for model in correct_columns}
    counts: dict[str, dict] = {}
    for dimension in DIMENSIONS:
        groups = sorted(table.dropna(subset=[dimension]).groupby(dimension), key=lambda g: _order(dimension, g[0]))
        if not groups:
            continue
        counts[dimension] = {str(value): int(len(group)) for value, group in groups}
        for model, column in correct_columns.items():
            accuracy[model][dimension] = {str(value): round(float(group[column].mean()), 4) for value, group in groups}
    return accuracy, counts
