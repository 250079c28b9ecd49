"""Reading the per-split commands files (``data/processed/commands/{split}.json``) with checked fields."""

from __future__ import annotations

import os
from typing import Any

from vlm.io import read_json

SPLITS = ("train", "val", "test")
_STRING_FIELDS = ("question_id", "image_id", "command", "answer", "command_type")


def read_commands(path: str | os.PathLike, fields: tuple[str, ...] = _STRING_FIELDS) -> list[dict[str, Any]]:
    """The records of a commands file; each of ``fields`` must be a non-empty string.

    One error names the file, the record index and the field. ``metadata``, when checked,
    must be an object.
    """
    records = read_json(path, "commands file")
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a list of command records, got {type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record {index} must be an object, got {type(record).__name__}")
        for field in fields:
            value = record.get(field)
            if field == "metadata":
                if not isinstance(value, dict):
                    raise ValueError(f"{path}: record {index} field 'metadata' must be an object, got {value!r}")
            elif not isinstance(value, str) or not value:
                raise ValueError(f"{path}: record {index} field '{field}' must be a non-empty string, got {value!r}")
    return records
