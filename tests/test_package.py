"""``pip install .`` gives a working package: the wheel holds every subpackage and the shipped model, and an
installed ``coolsd`` loads it from anywhere, also beside a folder named ``coolsd`` (a clone's), which Python
would otherwise import as an empty namespace package."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "coolsd").rglob("__init__.py")}
    assert listed == found | {"coolsd.assets"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):  # built from a copy: a build leaves build/ and egg-info behind
        shutil.copy(ROOT / name, source)
    for name in ("coolsd", "assets"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    return next(out.glob("coolsd-*.whl"))


def test_the_wheel_holds_the_package_the_default_model_and_the_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("coolsd/__init__.py", "coolsd/core/decode.py", "coolsd/assets/fashion/target.safetensors",
                 "coolsd/assets/fashion/drafter.safetensors", "coolsd/assets/fashion/config.json",
                 "coolsd/assets/models/llamagen-c2i-b.json"):
        assert name in names, name
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "coolsd-generate = coolsd.cli.generate:main" in text and "coolsd-bench = coolsd.cli.bench:main" in text


def test_an_installed_coolsd_loads_its_model_from_anywhere(wheel, tmp_path):
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr[-2000:]
    elsewhere = tmp_path / "work"
    (elsewhere / "coolsd").mkdir(parents=True)  # a clone's folder beside the script: no __init__.py at its top
    script = ("import coolsd; bundle = coolsd.load_bundle(device='cpu'); "
              "print(coolsd.__file__); print(bundle.path); print(bundle.config.n_layer)")
    ran = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    module, model, layers = ran.stdout.split()
    assert module.startswith(str(site)) and model.startswith(str(site / "coolsd" / "assets" / "fashion"))
    assert int(layers) >= 8


# How each console script of pyproject is run as a module (the docs' way): the usage must name the one that ran.
MODULE_FORMS = {"coolsd-generate": "python -m coolsd.generate", "coolsd-bench": "python -m coolsd.bench",
                "coolsd-train": "python -m coolsd.train", "coolsd-card": "python -m coolsd.card"}


def usage_of(entry_point: str, argv0: str, args: list[str], monkeypatch, capsys) -> str:
    """The first line ``--help`` prints when ``entry_point`` (``module:function``) runs with ``sys.argv[0]``
    as a console script or ``python -m`` sets it."""
    module, _, function = entry_point.partition(":")
    monkeypatch.setattr(sys, "argv", [argv0, *args])
    try:
        assert getattr(__import__(module, fromlist=[function]), function)(args) == 0
    except SystemExit as done:  # argparse's --help
        assert done.code == 0
    return capsys.readouterr().out.splitlines()[0]


def test_each_console_script_names_itself_in_its_usage(tmp_path, monkeypatch, capsys):
    """Issue 42.12: the installed ``coolsd-generate`` printed ``usage: python -m coolsd.generate``."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(MODULE_FORMS)
    for script, entry_point in scripts.items():
        module_file = str(ROOT / MODULE_FORMS[script].split()[-1].replace(".", "/")) + ".py"  # what -m puts there
        for argv0, name in ((str(tmp_path / "bin" / script), script), (module_file, MODULE_FORMS[script])):
            assert usage_of(entry_point, argv0, ["--help"], monkeypatch, capsys).startswith(f"usage: {name} ")
            if script == "coolsd-train":  # its commands' own parsers
                for command in (["drafter", "--help"], ["judge", "--help"]):
                    line = usage_of(entry_point, argv0, command, monkeypatch, capsys)
                    assert line.startswith(f"usage: {name} {'drafter ' if command[0] == 'drafter' else ''}"), line
