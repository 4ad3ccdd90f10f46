"""The package layout stays true: import boundaries between core, models, toy, app and cli, read from the
source (so a lazy import inside a function counts too), and the traps the layout removed stay removed."""

from __future__ import annotations

import ast
import subprocess
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coolsd"

# Which coolsd rooms, and which third-party libraries, each room may import. A room is a package, or a folder
# inside one with rules of its own ("app/web", the Gradio app over the explorer's Gradio-free logic); a file
# belongs to the deepest room that holds it, so "app" covers app/plots but not app/web.
ALLOWED = {
    "core": ({"core"}, {"torch", "numpy"}),
    "models": ({"core", "models"}, {"torch", "numpy", "safetensors", "huggingface_hub", "transformers",
                                    "threadpoolctl", "yaml"}),  # yaml: the Chameleon VQGAN's official config
    "toy": ({"core", "models", "toy", "distill"}, {"torch", "numpy", "safetensors", "torchmetrics", "tqdm", "PIL"}),
    "distill": ({"core", "models", "distill"}, {"torch", "numpy", "safetensors", "tqdm"}),
    "app": ({"core", "models", "app"}, {"torch", "numpy", "matplotlib", "PIL"}),
    "app/web": ({"core", "models", "app", "app/web"}, {"torch", "gradio", "fastapi", "starlette", "spaces", "PIL"}),
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


def room(parts: list[str] | tuple[str, ...]) -> str:
    """The deepest room of :data:`ALLOWED` that holds the path ``parts`` below ``coolsd/`` (``coolsd`` itself for
    the top-level modules)."""
    for depth in range(len(parts), 0, -1):
        if "/".join(parts[:depth]) in ALLOWED:
            return "/".join(parts[:depth])
    return "coolsd"


def target_package(package: str, module: str, level: int) -> str | None:
    """The coolsd room an import reaches (None for a library outside coolsd), from a file in the folder
    ``package`` (a path below ``coolsd/``, such as ``app/web``; empty for a file outside the package)."""
    if level:
        folder = package.split("/") if package else []
        parts = folder[:len(folder) - level + 1] + (module.split(".") if module else [])
    elif module == "coolsd" or module.startswith("coolsd."):
        parts = module.split(".")[1:]
    else:
        return None
    return room(parts)


def room_files(package: str) -> list[Path]:
    """The source files of a room: those below its folder that no deeper room holds."""
    return [path for path in sorted((PACKAGE / package).rglob("*.py"))
            if room(path.relative_to(PACKAGE).parent.parts) == package]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_the_layout_allows(package):
    ours, libraries = ALLOWED[package]
    files = room_files(package)
    assert files, package
    for path in files:
        folder = "/".join(path.relative_to(PACKAGE).parent.parts)
        for module, level in imports(path):
            reached = target_package(folder, module, level)
            name = f"{'.' * level}{module}"
            where = path.relative_to(PACKAGE)
            if reached is not None:
                assert reached in ours, f"{where} imports {name}: {package} may not import {reached}"
            else:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or top in libraries or top == "__future__", \
                    f"{where} imports {name}: {package} may not depend on {top}"


def test_app_py_is_an_entry_point_over_the_web_app():
    reached = {target_package("", module, level) for module, level in imports(ROOT / "app.py")}
    assert reached - {None} <= {"app/web"}


def test_rooms_are_found_below_their_package():
    """The layout sees into sub-folders: a module of app/plots is app's, one of app/web is app/web's, and a
    relative import from a sub-folder reaches the room it names."""
    assert room(("app", "plots")) == "app" and room(("app", "web")) == "app/web" and room(()) == "coolsd"
    assert target_package("app/plots", "series", 2) == "app"
    assert target_package("app/web", "core.rules", 3) == "core"
    assert target_package("app", "web.api", 1) == "app/web"
    assert target_package("app/web", "", 1) == "app/web"


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
    web, plots = tmp_path / "coolsd" / "app" / "web", tmp_path / "coolsd" / "app" / "plots"
    web.mkdir(parents=True)
    plots.mkdir(parents=True)
    (web / "page.py").write_text("import gradio\nfrom ..session import Request\n")
    test_packages_import_only_what_the_layout_allows("app/web")  # the web app may use Gradio
    (plots / "leak.py").write_text("import gradio\n")  # the explorer's logic may not, in a sub-folder neither
    with pytest.raises(AssertionError, match="app may not depend on gradio"):
        test_packages_import_only_what_the_layout_allows("app")
    (plots / "leak.py").write_text("from ..web import page\n")
    with pytest.raises(AssertionError, match="app may not import app/web"):
        test_packages_import_only_what_the_layout_allows("app")


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


IMPORT_WEB_APP = """
import json, pkgutil, threading, importlib
import coolsd.models.bundle as bundle
loads = []
bundle.load_bundle = lambda *args, **kwargs: loads.append("load_bundle")
bundle.random_bundle = lambda *args, **kwargs: loads.append("random_bundle")
import coolsd.app.web as web
for module in pkgutil.iter_modules(web.__path__):
    importlib.import_module(f"coolsd.app.web.{{module.name}}")
from coolsd.app.web import runtime
{planted}
print(json.dumps({{"loads": loads, "threads": threading.active_count(), "started": runtime.RUNTIME is not None}}))
"""


def import_web_app(planted: str = "") -> dict:
    """What importing every module of the web app does, in a fresh interpreter: model loads tried, Python
    threads running, and whether the app's state exists."""
    code = IMPORT_WEB_APP.format(planted=planted)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_web_app_loads_no_model_and_starts_no_thread():
    """Every handler, the API and the layout can be imported for a test without starting the app: only
    ``runtime.start`` (which app.py calls) loads a model; the check sees it when a module would call it."""
    assert import_web_app() == {"loads": [], "threads": 1, "started": False}
    assert import_web_app("runtime.Device.detect = lambda: runtime.Device(zero_gpu=True)\n"
                          "try:\n    runtime.start()\nexcept Exception:\n    pass")["loads"] == ["load_bundle"]
