"""Robustness slices: the conditions each test question was asked under (a value per dimension, ``None`` where it does
not apply; the dimensions: docs/architecture.md, evaluate), from the labels only (synthetic and BDD100K alike)."""

import pandas as pd

from vlm.commands.types import QUESTION_TYPES
from vlm.scenes.schema import Scene

OBJECT_BINS = ((0, 4), (5, 9), (10, 19), (20, None))  # labelled objects per frame, inclusive
# every question's conditions, then those its type adds (vlm/commands/types: a type's slice_dimensions)
DIMENSIONS = ("timeofday", "weather", "scene", "objects",
              *dict.fromkeys(d for t in QUESTION_TYPES.values() for d in t.slice_dimensions))


def object_bin(count: int) -> str:
    for low, high in OBJECT_BINS:
        if high is None or count <= high:
            return f"{low}+" if high is None else f"{low}-{high}"
    raise AssertionError("the last bin is open")


def _order(dimension: str, value: str) -> tuple:
    """Object bins in numeric order, every other value alphabetically."""
    return (int(value.split("-")[0].rstrip("+")),) if dimension == "objects" else (0, value)


def question_conditions(record: dict, scene: Scene, width: float, height: float) -> dict[str, str | None]:
    """The value of every dimension for one question record about ``scene`` (None where it does not apply)."""
    conditions: dict[str, str | None] = dict.fromkeys(DIMENSIONS)
    conditions.update(timeofday=scene.timeofday, weather=scene.weather, scene=scene.scene,
                      objects=object_bin(len(scene.objects)))
    conditions.update(QUESTION_TYPES[record["command_type"]].slices(record, scene, width, height))
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
