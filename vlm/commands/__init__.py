"""Questions about scenes: the answer rules (rules), templates and question keys (templates), the question types
(types, one file each) and the balanced records of every split (generate)."""

from vlm.commands import types  # noqa: F401  (fills templates.TEMPLATES with every type's templates)
