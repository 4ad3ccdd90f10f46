"""The package layout stays true: import boundaries between core, models, toy, app and cli, read from the
source (so a lazy import inside a function counts too), and the traps the layout removed stay removed."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coolsd"

# Which coolsd packages, and which third-party libraries, each package may import.
ALLOWED = {
    "core": ({"core"}, {"torch", "numpy"}),
    "models": ({"core", "models"}, {"torch", "numpy", "safetensors", "huggingface_hub", "transformers",
                                    "threadpoolctl", "yaml"}),  # yaml: the Chameleon VQGAN's official config
    "toy": ({"core", "models", "toy", "distill"}, {"torch", "numpy", "safetensors", "torchmetrics", "tqdm", "PIL"}),
    "distill": ({"core", "models", "distill"}, {"torch", "numpy", "safetensors", "tqdm"}),
    "app": ({"core", "models", "app"}, {"torch", "numpy", "matplotlib", "PIL"}),
    # the command line draws the study's figures with the app's plotting code (bench --plots)
    "cli": ({"core", "models", "cli", "app"}, {"torch", "numpy", "tqdm", "PIL"}),
}


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, relative level) for every import statement in a file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def target_package(package: str, module: str, level: int) -> str | None:
    """The coolsd package an import reaches (None for a library outside coolsd)."""
    if level == 1:
        return package
    if level == 2:
        return module.split(".")[0] or "coolsd"
    if module == "coolsd" or module.startswith("coolsd."):
        return module.split(".")[1] if "." in module else "coolsd"
    return None


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_the_layout_allows(package):
    ours, libraries = ALLOWED[package]
    files = sorted((PACKAGE / package).glob("*.py"))
    assert files, package
    for path in files:
        for module, level in imports(path):
            reached = target_package(package, module, level)
            name = f"{'.' * level}{module}"
            if reached is not None:
                assert reached in ours, \
                    f"{path.parent.name}/{path.name} imports {name}: {package} may not import {reached}"
            else:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or top in libraries or top == "__future__", \
                    f"{path.parent.name}/{path.name} imports {name}: {package} may not depend on {top}"


def test_app_py_is_wiring_over_the_app_package():
    reached = {target_package("", module, level) for module, level in imports(ROOT / "app.py")}
    assert reached - {None} <= {"app", "core", "models"}


def test_the_layout_test_fails_on_a_forbidden_import(tmp_path, monkeypatch):
    """Negative control: a core module that reaches into models, or into gradio, is caught."""
    bad = tmp_path / "coolsd" / "core"
    bad.mkdir(parents=True)
    (bad / "leak.py").write_text("def f():\n    from ..models.gpt import Transformer\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "coolsd")
    with pytest.raises(AssertionError, match="core may not import models"):
        test_packages_import_only_what_the_layout_allows("core")
    (bad / "leak.py").write_text("import gradio\n")
    with pytest.raises(AssertionError, match="core may not depend on gradio"):
        test_packages_import_only_what_the_layout_allows("core")


def test_command_line_modules_do_not_shadow_the_library():
    """``python -m coolsd.generate`` is a module; the library's function has its own name, so importing the
    command line never replaces it (it used to: ``coolsd.generate`` was both)."""
    import coolsd
    importlib.import_module("coolsd.bench")
    importlib.import_module("coolsd.generate")
    assert callable(coolsd.decode_image) and coolsd.decode_image.__module__ == "coolsd.core.decode"
    assert type(coolsd.generate).__name__ == "module" and hasattr(coolsd.generate, "main")


def test_the_shipped_shape_lives_in_the_config_table():
    from coolsd.models.config import CONFIGS, ModelConfig
    from coolsd.toy.train import TARGET_CONFIG
    shipped = json.loads((ROOT / "assets" / "fashion" / "config.json").read_text())["model"]
    assert ModelConfig(**shipped) == CONFIGS["fashion-deep"] == TARGET_CONFIG


def module_name(path: Path, package: Path) -> str:
    """``coolsd/models/bundle.py`` -> ``coolsd.models.bundle``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ours a file imports, nested (lazy) imports included: ``from .x import y`` reaches
    ``<package>.x.y`` when that is a module, else ``<package>.x``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    reached = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            reached |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            reached |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return reached & known - {name}


def import_graph(package: Path) -> dict[str, set[str]]:
    files = {module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    return {name: imported_modules(path, name, set(files)) for name, path in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that reaches itself (depth-first search, in sorted order)."""
    cycles, seen = [], set()
    for start in sorted(graph):
        if start in seen:
            continue
        stack = [(start, [start])]
        visited = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append(path + [start])
                    seen.update(path)
                    stack = []
                    break
                if nxt not in visited:
                    visited.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return cycles


def test_no_two_modules_import_each_other_directly_or_through_a_cycle():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_test_finds_direct_and_longer_cycles(tmp_path):
    """Negative control: a lazy import back (a <-> b) and a three-module circle (c -> d -> e -> c) are found,
    a chain without a way back is not."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from . import b\n")
    (root / "b.py").write_text("def f():\n    from .a import thing\n")
    (root / "sub" / "c.py").write_text("from ..sub.d import x\n")
    (root / "sub" / "d.py").write_text("import pkg.e\n")
    (root / "e.py").write_text("from .sub import c\n")
    (root / "f.py").write_text("from .a import thing\nfrom .sub.c import y\n")
    cycles = import_cycles(import_graph(root))
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.e", "pkg.sub.c", "pkg.sub.d", "pkg.e"]]
