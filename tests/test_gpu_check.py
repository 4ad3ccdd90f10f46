"""``scripts/gpu_check.sh`` keeps working on machines without a GPU: it runs, writes its JSON, and says that the
CUDA parts were skipped; its goal table reads the profile right."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_green_without_a_gpu_and_says_so(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["cuda"] is False and "the CUDA parts were skipped" in done.stdout
    tests = report["tests"]
    assert tests["tests"] >= 4 and tests["skipped"] == tests["tests"] and tests["failures"] == tests["errors"] == 0
    assert tests["skip_reasons"] == ["no CUDA GPU visible to torch"]
    (profile,) = report["profiles"]
    assert profile["shape"] == "tiny" and "ar_step [static]" in profile["parts"]
    assert profile["measured"]["AR"]["tau"] == 1.0 and "| quantity | goal | measured | met |" in done.stdout
    assert [row["batch"] for row in profile["batches"]] == [1, 4] and "| B | AR step ms |" in done.stdout
    assert all(row["round chain:5"]["round_s"] > 0 for row in profile["batches"])


def test_goal_table_reads_the_profile():
    script = load_script()
    part = lambda ms: {"median_s": ms / 1000}  # noqa: E731
    result = {"steps": "graphs", "image_tokens": 256,
              "parts": {"ar_step": part(2.0), "ar_step [eager]": part(6.0), "round chain:5": part(2.6),
                        "round tree:wide57": part(3.2), "drafter_level": part(0.5), "acceptance chain:5": part(0.05)},
              "implied": {"chain:5": {"at tau 2.42 (Eagle-1)": 1.86, "at tau 3.34 (COOL-SD delta=2)": 2.57},
                          "tree:wide57": {"at tau 2.42 (Eagle-1)": 1.51, "at tau 3.34 (COOL-SD delta=2)": 2.09}}}
    rows = {name: (round(value, 9), met) for name, _, value, met in script.goals(result)}
    assert rows["round chain:5 / AR step"] == (1.3, True)
    assert rows["round tree:wide57 / AR step"] == (1.6, False)
    assert rows["drafter_level / AR step"] == (0.25, False)
    assert rows["acceptance chain:5 / AR step"] == (0.025, True)
    assert rows["implied speed-up at tau 2.42 (Eagle-1), best draft"] == (1.86, True)
    assert rows["implied speed-up at tau 3.34 (COOL-SD delta=2), best draft"] == (2.57, True)
    image, met = rows["implied COOL-SD delta=2 image (s)"]  # 256 tokens / tau 3.34 rounds at the best round
    assert abs(image - 256 / 3.34 * 0.0026) < 1e-9 and met
    assert rows["ar_step [eager] / ar_step [graphs]"][0] == 3.0
