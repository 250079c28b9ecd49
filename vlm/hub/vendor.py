"""The model's code for an export folder: :data:`ENTRY` and every project module they import, found by following
their ``from vlm... import`` lines, each written as one file with those imports made relative. transformers copies a
remote-code model's module and the files it imports relatively (``from .name import``) from one folder, so the
project's packages become flat names (``vlm.models.gemma`` -> ``models_gemma.py``)."""

import ast
import re
from pathlib import Path

import vlm

PACKAGE = Path(vlm.__file__).parent
ENTRY = ("vlm.hub.configuration_traffic_vlm", "vlm.hub.modeling_traffic_vlm")  # what config.json's auto_map names
_PROJECT_IMPORT = re.compile(r"^(\s*from )vlm\.([\w.]+)( import )", re.MULTILINE)
# how a plug-in package imports every module beside it (vlm/models/perception/heads); flat, it imports each by name
_DISCOVERY = ("for _module in pkgutil.iter_modules(__path__):\n"
              "    importlib.import_module(f\"{__name__}.{_module.name}\")\n")


def module_file(module: str) -> Path:
    """The file of a project module (a package's ``__init__.py``)."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def flat_name(module: str) -> str:
    """A project module's name in the export folder: its dotted path after ``vlm.`` (and ``hub.``) with underscores."""
    return module.removeprefix("vlm.").removeprefix("hub.").replace(".", "_")


def plugins(module: str, text: str) -> list[str]:
    """The modules a plug-in package imports by discovery (none for any other module)."""
    if _DISCOVERY not in text:
        return []
    return sorted(f"{module}.{path.stem}" for path in module_file(module).parent.glob("*.py")
                  if path.name != "__init__.py")


def project_imports(module: str, text: str) -> list[str]:
    """The project modules ``module`` imports (``from vlm.x import names``); a module imported as a name or with
    ``import vlm.x`` is refused: a flat folder has no packages to import it from."""
    where = module_file(module)
    found = []
    for node in ast.walk(ast.parse(text, filename=str(where))):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "vlm" for alias in node.names):
            raise ValueError(f"{where}:{node.lineno}: 'import vlm...' cannot be exported; import names from the "
                             f"module (from vlm.x import y)")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vlm":
            submodules = [a.name for a in node.names if module_file(f"{node.module}.{a.name}").exists()]
            if node.module == "vlm" or submodules:
                raise ValueError(f"{where}:{node.lineno}: imports the module {node.module}.{(submodules or ['?'])[0]}"
                                 f" as a name, which cannot be exported; import the names it uses from it")
            found.append(node.module)
    return found


def sources() -> dict[str, str]:
    """File name -> text of every module of the export's code, its project imports relative."""
    todo, texts = list(ENTRY), {}
    while todo:
        module = todo.pop()
        if module in texts:
            continue
        text = module_file(module).read_text(encoding="utf-8")
        found = plugins(module, text)
        todo += project_imports(module, text) + found
        text = text.replace(_DISCOVERY, "".join(f"from .{flat_name(m)} import *  # noqa: F403 (its head joins HEADS)\n"
                                                for m in found))
        texts[module] = _PROJECT_IMPORT.sub(lambda m: f"{m[1]}.{flat_name('vlm.' + m[2])}{m[3]}", text)
    return {f"{flat_name(module)}.py": text for module, text in sorted(texts.items())}
