"""Reading the per-split commands files (``data/processed/commands/{split}.json``) with checked fields."""

import os
from typing import Any

from vlm.io import read_json

SPLITS = ("train", "val", "test")  # the dataset splits: one commands file (and one packed image file) each
_STRING_FIELDS = ("question_id", "image_id", "command", "answer", "command_type")


def read_commands(path: str | os.PathLike, fields: tuple[str, ...] = _STRING_FIELDS) -> list[dict[str, Any]]:
    """The records of a commands file; each of ``fields`` must be a non-empty string (see :func:`check_commands`)."""
    records = read_json(path, "commands file")
    check_commands(records, str(path), fields)
    return records


def check_commands(records: Any, source: str, fields: tuple[str, ...] = _STRING_FIELDS) -> None:
    """``records`` must be objects whose ``fields`` are non-empty strings (``metadata`` an object); errors say where."""
    if not isinstance(records, list):
        raise ValueError(f"{source}: expected a list of command records, got {type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{source}: record {index} must be an object, got {type(record).__name__}")
        for field in fields:
            value = record.get(field)
            if field == "metadata":
                if not isinstance(value, dict):
                    raise ValueError(f"{source}: record {index} field 'metadata' must be an object, got {value!r}")
            elif not isinstance(value, str) or not value:
                raise ValueError(f"{source}: record {index} field '{field}' must be a non-empty string, got {value!r}")
