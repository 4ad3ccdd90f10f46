"""``scripts/space_build.sh``, the Space's build simulated offline: what it uploads, its check of the front matter
against requirements.txt, and (slow: a fresh venv with torch) the whole build, start and one /generate call."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "space_build.sh"
CHECK = ROOT / "scripts" / "space_check.py"
MIB = 1024 * 1024
UPLOAD_LIMIT_MIB = 60  # measured 18.5 MiB: the model bundle (14 MiB of it one file) and the code
# Only what the app reads at run time and what the README links to ships (the script's SHIPPED says why).
NEVER_SHIPPED = ("tests/", "scripts/", ".ci/", ".git", "assets/fashion/study/", "assets/fashion/samples.png",
                 "assets/fashion/bench_results.csv")


def build(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPACE_PYTHON=sys.executable)  # the Python running the tests, venv or not
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"no '{pattern}' in:\n{text}"
    return float(found.group(1))


def front_matter_lines() -> list[str]:
    """The real README's front matter, read now: the Space's settings as they are."""
    lines = (ROOT / "README.md").read_text().splitlines()
    return lines[:lines.index("---", 1) + 1]


def test_the_upload_holds_the_app_and_what_it_reads_from_tracked_files_only(tmp_path):
    run = build("--layout-only", str(tmp_path / "space"), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    space = tmp_path / "space"
    shipped = {path.relative_to(space).as_posix(): path.stat().st_size for path in space.rglob("*") if path.is_file()}
    tracked = set(subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split("\0")) - {""}
    assert set(shipped) <= tracked
    assert {"README.md", "app.py", "requirements.txt", "coolsd/app/web/api.py", "assets/fashion/config.json",
            "assets/fashion/target.safetensors", "assets/fashion/bench_results.json",
            "assets/models/imagenet_classes.json", "docs/space.md", "assets/screenshot.png",
            "assets/fashion/README.md"} <= set(shipped)
    assert {path for path in tracked if path.startswith("coolsd/")} <= set(shipped)
    assert not [path for path in shipped if path.startswith(NEVER_SHIPPED) or "__pycache__" in path]
    assert number(r"upload: \d+ files, ([\d.]+) MiB", run.stdout) == pytest.approx(sum(shipped.values()) / MIB,
                                                                                    abs=0.05)
    big = sorted(path for path, size in shipped.items() if size > 10 * MIB)
    assert re.findall(r"over 10 MiB .*: (\S+) [\d.]+ MiB", run.stdout) == big
    assert sum(shipped.values()) / MIB < UPLOAD_LIMIT_MIB
    assert "requirements.txt agrees on gradio" in run.stdout


def test_an_occupied_folder_is_refused_in_one_line(tmp_path):
    (tmp_path / "left-over.txt").write_text("x")
    run = build("--layout-only", str(tmp_path), timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == f"space_build: FAILED: {tmp_path} is not empty: give a new or " \
                                                  "empty folder"


def check_config(tmp_path: Path, requirements: str, front_matter: list[str] | None = None,
                 python: str = "3.11.7") -> subprocess.CompletedProcess:
    """``space_check.py config`` on an upload with the real front matter (or ``front_matter``) and this
    requirements.txt."""
    (tmp_path / "README.md").write_text("\n".join(front_matter or front_matter_lines()) + "\n\n# the Space\n")
    (tmp_path / "requirements.txt").write_text(requirements)
    (tmp_path / "app.py").write_text("")
    return subprocess.run([sys.executable, str(CHECK), "config", str(tmp_path), python], capture_output=True,
                          text=True, timeout=60)


def sdk_version() -> str:
    return next(line.split(":", 1)[1].strip().strip("'\"") for line in front_matter_lines()
                if line.startswith("sdk_version:"))


@pytest.mark.parametrize("requirements", ["gradio[mcp]=={sdk}\n", "gradio=={sdk}  # the sdk's\n", "gradio\n",
                                          "gradio>=5\ntorch\n", "numpy\n# gradio==1.0\n", "-r other.txt\ntorch\n"])
def test_requirements_that_admit_the_sdks_gradio_pass(tmp_path, requirements):
    run = check_config(tmp_path, requirements.format(sdk=sdk_version()))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "requirements.txt agrees on gradio" in run.stdout


@pytest.mark.parametrize("line", ["gradio[mcp]==6.30.0", "Gradio==5.0", "gradio>=99", "gradio<1",
                                  "gradio @ https://example.invalid/gradio-1.0-py3-none-any.whl"])
def test_a_gradio_other_than_the_sdks_fails_in_one_line(tmp_path, line):
    run = check_config(tmp_path, f"torch\n{line}\n")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"space_build: FAILED: requirements.txt line 2 '{line}' asks for another gradio than sdk_version "
        f"{sdk_version()}"]


def test_a_python_other_than_the_spaces_is_said_and_the_build_goes_on(tmp_path):
    settings = [line for line in front_matter_lines() if not line.startswith("python_version:")]
    other = check_config(tmp_path, "gradio\n", [*settings[:-1], 'python_version: "3.12"', "---"], "3.11.7")
    assert other.returncode == 0 and "NOTE: the Space runs Python 3.12" in other.stdout
    same = check_config(tmp_path, "gradio\n", [*settings[:-1], "python_version: 3.11", "---"], "3.11.7")
    assert same.returncode == 0 and "Python 3.11.7, as python_version 3.11 asks" in same.stdout
    unset = check_config(tmp_path, "gradio\n", settings, "3.11.7")
    assert unset.returncode == 0 and "python_version unset" in unset.stdout


def test_a_readme_without_front_matter_fails(tmp_path):
    (tmp_path / "requirements.txt").write_text("gradio\n")
    (tmp_path / "README.md").write_text("# no settings\n")
    run = subprocess.run([sys.executable, str(CHECK), "config", str(tmp_path), "3.11.7"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip() == "space_build: FAILED: README.md has no front matter (a first line ---)"


def test_the_space_builds_starts_and_answers_generate(tmp_path):
    """The whole build (minutes: a fresh venv with torch), its sizes and times printed and sane."""
    space = tmp_path / "space"
    try:
        run = build(str(space), timeout=1800)
    finally:
        shutil.rmtree(space / ".venv", ignore_errors=True)  # gigabytes
    out = run.stdout
    (tmp_path / "space_build.log").write_text(out + run.stderr)  # its sizes and times, kept with pytest's tmp dirs
    assert run.returncode == 0, out + run.stderr
    assert out.strip().splitlines()[-1] == "space_build: OK"
    assert number(r"upload: \d+ files, ([\d.]+) MiB", out) < UPLOAD_LIMIT_MIB
    installed = re.search(r"installed: (.*)", out).group(1).split()
    assert f"gradio=={sdk_version()}" in installed and any(name.startswith("spaces==") for name in installed)
    torch_pin = re.search(r"^torch==\S+", (ROOT / "requirements.txt").read_text(), re.M).group(0)
    assert [name for name in installed if name == torch_pin or name.startswith(f"{torch_pin}+")]
    seconds = {name: number(rf"{label}: ([\d.]+) s", out) for name, label in
               [("install", "install"), ("start", "start to HTTP 200"), ("generate", "/generate")]}
    assert seconds["start"] < 240 and seconds["generate"] < 240, seconds
    assert re.search(r"/generate: .*method (\d+)x\1, \d+ colours; eagle (\d+)x\2, \d+ colours", out), out
    print(f"space build: {seconds}")
