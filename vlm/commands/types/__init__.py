"""The question types, one file each: every module here is imported, so a type joins ``QUESTION_TYPES`` (and its
templates ``TEMPLATES``) by being here and calling :func:`register`; params.yaml's ``commands.types`` asks it."""

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from vlm.commands.templates import TEMPLATES, Candidate
from vlm.commands.types.base import QUESTION_TYPES, CategoryOptions, NoOptions, QuestionType, register
from vlm.scenes.schema import Scene

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
_order = {name: (t.position, name) for name, t in QUESTION_TYPES.items()}  # whichever file imported another first
for _registry, _key in ((QUESTION_TYPES, lambda item: _order[item[0]]),
                        (TEMPLATES, lambda item: _order[item[1].command_type])):
    _items = sorted(_registry.items(), key=_key)
    _registry.clear()
    _registry.update(_items)


def candidates(scene: Scene, width: float, height: float, asked: Mapping[str, Any]) -> list[Candidate]:
    """Every question the ``asked`` types (name -> options) can ask about ``scene``, with answers from its labels."""
    return [c for name, options in asked.items() for c in QUESTION_TYPES[name].ask(scene, width, height, options)]


__all__ = ["QUESTION_TYPES", "CategoryOptions", "NoOptions", "QuestionType", "candidates", "register"]
