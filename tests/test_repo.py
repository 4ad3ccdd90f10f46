"""The README's two set-up commands are the ones CI and users run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert len(ci_lines) == 1
    assert ci_lines[0].strip() in readme.splitlines()
    assert "pip install -r requirements.txt && python app.py" in readme.splitlines()


def test_torch_is_pinned():
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text().split()
