"""``scripts/gpu_check.sh`` keeps working on machines without a GPU: it runs, writes its JSON, and says that the
CUDA parts were skipped; its goal table reads the profile right, and its Jacobi table's speed-ups are its
printed times' (one run of the script serves every test)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JACOBI_HEADER = ("| window | B | AR step ms | round ms | round / AR step = break-even tau | published tau | "
                 "implied speed-up |")


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The script run once without a GPU: its completed process and its JSON report."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], capture_output=True,
                          text=True, env=env, timeout=900)  # a cold inductor cache: 120 s alone
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads((out / "gpu_check.json").read_text())


def test_gpu_check_runs_green_without_a_gpu_and_says_so(cpu_run):
    done, report = cpu_run
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
              "parts": {"ar_step": part(2.0), "ar_step [eager]": part(6.0), "ar_step [compiled]": part(1.6),
                        "round chain:5 [compiled]": part(2.4), "round chain:5": part(2.6),
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
    assert rows["round chain:5 [compiled] / fastest AR step"] == (1.5, False)  # 2.4 ms over the compiled 1.6 ms


def test_jacobi_table_speedups_follow_from_its_printed_times(cpu_run):
    """Every window (L = 16 with SJD's and GSD's tau, L = 32 with SCD's, a lower bound) at every batch size has its
    rows, after the rest of the output, with finite numbers; the implied speed-up is tau * AR step / round and the
    break-even tau round / AR step, both recomputed here from the printed milliseconds (within their rounding)."""
    done, report = cpu_run
    lines = done.stdout.splitlines()
    assert JACOBI_HEADER in lines and lines.index(JACOBI_HEADER) > max(
        i for i, line in enumerate(lines) if line.startswith("| quantity | goal |"))  # the new table comes last
    table = lines[lines.index(JACOBI_HEADER) + 2:]
    rows = [line.strip("|").split(" | ") for line in table[:table.index("")]]
    seen = {(window, int(batch), tau.split()[0]) for window, batch, *_, tau, _ in (map(str.strip, r) for r in rows)}
    assert seen == {(window, batch, method) for window, methods in (("jacobi:16:coupled", ("SJD", "GSD")),
                                                                   ("jacobi:32:coupled", ("SCD",)))
                    for batch in (1, 4) for method in methods}
    published = {"SJD": ("2.22", ""), "GSD": ("3.39", ""), "SCD": ("4.2", ">= ")}
    for cells in rows:
        window, _, ar_ms, round_ms, break_even, tau_cell, speedup_cell = (cell.strip() for cell in cells)
        method, *bound, tau_text = tau_cell.split()
        assert (tau_text, ">= " if bound else "") == published[method]
        assert speedup_cell.startswith(published[method][1]) and speedup_cell.endswith("x")
        ar, round_, tau = float(ar_ms), float(round_ms), float(tau_text)
        speedup, break_even = float(speedup_cell.removeprefix(">= ").removesuffix("x")), float(break_even)
        assert all(math.isfinite(v) and v > 0 for v in (ar, round_, speedup, break_even))
        slack = 0.0005 / ar + 0.0005 / round_  # relative error of a ratio of two numbers printed to 0.001
        expected = tau * ar / round_
        assert abs(speedup - expected) <= 0.005 + expected * slack + 1e-9, cells
        assert abs(break_even - round_ / ar) <= 0.005 + round_ / ar * slack + 1e-9, cells
    assert "SCD 4.2 at L = 32 is its paper's latency speed-up" in done.stdout and "a lower bound" in done.stdout
    assert "every timed round emitted 1 to L + 1 tokens per image: yes" in done.stdout
    jacobi = report["profiles"][0]["jacobi"]
    assert jacobi["error"] is None and len(jacobi["rows"]) == 4 and all("skipped" not in r for r in jacobi["rows"])


def test_gpu_check_times_the_zero_gpu_path_and_the_durations_it_would_ask(cpu_run):
    """The ZeroGPU path's click on the shipped model (eager; bf16 on CUDA), timed, with the durations a Space would
    ask for before and after measuring it: each at least what the call took."""
    done, report = cpu_run
    click = report["zero_gpu_click"]
    assert click["steps"] == "eager" and click["tokens"] == 64 and click["generation_s"] > 0
    for call, took in (("generation", click["generation_s"]), ("timing", click["timing_s"])):
        assert click["asked_after_s"][call] >= took and click["asked_first_s"][call] >= took, click
    assert click["asked_timing_after_generation_s"] >= click["timing_s"], click  # AR sized by the rounds
    assert "ZeroGPU path on the shipped model" in done.stdout
