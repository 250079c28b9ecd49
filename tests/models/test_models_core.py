"""The PaliGemma core stands alone: no module of it imports the traffic perception, the question rules, the
scenes or the data path, directly or through another module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted((ROOT / "vlm" / "models").glob("*.py"))  # vlm/models/perception/ is beside the core, not in it
ALLOWED = ("vlm.batch", "vlm.config")  # the input contract and the typed configs, both task-free


def project_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name == "vlm" or name.startswith("vlm.")}


def test_the_core_imports_nothing_task_specific():
    core_modules = {f"vlm.models.{path.stem}" for path in CORE} | {"vlm.models"}
    assert {"vlm.models.paligemma", "vlm.models.siglip", "vlm.models.gemma", "vlm.models.extension"} <= core_modules
    for path in CORE:
        outside = project_imports(path) - core_modules - set(ALLOWED)
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}: the core must not"
    for allowed in ALLOWED:  # and what the core may import imports nothing task-specific itself
        module = ROOT / (allowed.replace(".", "/") + ".py")
        assert not project_imports(module) - {"vlm"}, f"{allowed} must stay task-free"
