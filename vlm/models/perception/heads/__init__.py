"""The perception heads, one file each: every module here is imported, so a head joins ``HEADS`` by being here."""

import importlib
import pkgutil

from vlm.models.perception.heads.base import HEADS, AuxiliaryHead

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["HEADS", "AuxiliaryHead"]
