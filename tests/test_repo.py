"""The README's two set-up commands are the ones CI and users run."""

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert len(ci_lines) == 1
    assert ci_lines[0].strip() in readme.splitlines()
    assert "pip install -r requirements.txt && python app.py" in readme.splitlines()


ZERO_GPU_TORCH = ("2.8.0", "2.9.1", "2.10.0", "2.11.0")  # what a ZeroGPU Space builds with (docs/space.md)
SPACE_PYTHONS = ("3.10", "3.12")  # what ZeroGPU runs
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}


def front_matter() -> dict:
    """The Space's settings: the README's YAML front matter."""
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def requirement(name: str) -> str:
    """The one line of requirements.txt that installs ``name`` (extras included)."""
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
             if re.match(rf"{re.escape(name)}(\[.*\])?\s*([=<>!~]|$)", line.strip())]
    assert len(lines) == 1, (name, lines)
    return lines[0]


def test_torch_is_pinned_to_a_version_zero_gpu_accepts():
    assert requirement("torch").split("==")[1] in ZERO_GPU_TORCH


def test_the_space_gets_the_gradio_its_front_matter_names_with_the_mcp_extra():
    """A Space installs gradio at ``sdk_version``: requirements.txt must not ask for another."""
    assert requirement("gradio") == f"gradio[mcp]=={front_matter()['sdk_version']}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"gradio[mcp]=={front_matter()["sdk_version"]}"' in pyproject


def test_transformers_accepts_the_huggingface_hub_gradio_needs():
    """gradio 6.31 needs huggingface_hub>=1.16, which only transformers 5 accepts."""
    assert requirement("transformers") == "transformers>=5,<6"
    assert requirement("huggingface_hub") == "huggingface_hub>=1.16,<2"


def test_every_source_file_is_valid_for_the_spaces_python():
    """The front matter's ``python_version`` is one ZeroGPU runs, every Python file parses at that version, and
    none imports a module that version no longer has."""
    version = str(front_matter()["python_version"])
    assert version in SPACE_PYTHONS
    feature = tuple(int(part) for part in version.split("."))
    files = [ROOT / "app.py", *(path for folder in ("coolsd", "scripts", "tests")
                                for path in (ROOT / folder).rglob("*.py"))]
    for path in files:
        tree = ast.parse(path.read_text(), str(path), feature_version=feature)
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & REMOVED_IN_312, (path, imported & REMOVED_IN_312)
    assert len(files) > 100
