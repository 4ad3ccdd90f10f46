"""The prepared GPU check (run through ``scripts/gpu_check.sh OUT_DIR``): the CUDA tests, then the component
profile at LlamaGen-XL text-to-image and LlamaGen-B class-to-image shapes with random weights (bf16, CFG, CUDA
graphs), checked against the goals of the CUDA path. Needs no download and no gradio. Without a GPU it runs
what a CPU can (the CUDA tests, which skip and say so; a tiny profile) so that CI keeps it working, and says
that the CUDA parts were skipped. Writes ``gpu_check.json`` (and the pytest report) to OUT_DIR; prints Markdown.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path

import torch

from coolsd.cli.profile import format_profile, profile
from coolsd.core.sampling import SamplingConfig
from coolsd.models.bundle import random_bundle, set_threads

# (random-init shape, sampling as LlamaGen samples it (the presets in assets/models), time the other steps modes)
CUDA_SHAPES = [("llamagen-t2i-xl", SamplingConfig(cfg_scale=3.0, top_k=2000), True),
               ("llamagen-b", SamplingConfig(cfg_scale=4.0, top_k=2000), False)]
CPU_SHAPES = [("tiny", SamplingConfig(cfg_scale=2.0), True)]
# The CUDA path's goals at LlamaGen-XL text-to-image shape, bf16, batch 1 with CFG, one H200.
PAPER = {"Eagle-1": 2.03, "COOL-SD delta=2": 2.72}


def run_tests(out: Path, cuda: bool) -> dict:
    """The CUDA tests (and, on a GPU, their CPU counterparts too); counts from pytest's JUnit report."""
    files = ["tests/test_cuda.py"] + (["tests/test_steps.py"] if cuda else [])
    report = out / "pytest.xml"
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-o",
                           "addopts=", f"--junitxml={report}", "-rs"], capture_output=True, text=True)
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    reasons = sorted({element.get("message", "") for element in suite.iter("skipped")})
    return {"files": files, **counts, "skip_reasons": reasons, "seconds": time.perf_counter() - began,
            "ok": done.returncode == 0, "tail": done.stdout[-3000:] if done.returncode else ""}


def goals(result: dict) -> list[tuple[str, str, float, bool]]:
    """(quantity, goal, measured, met) for one profile, from its parts and implied speed-ups."""
    parts = {name: part["median_s"] for name, part in result["parts"].items()}
    ar = parts["ar_step"]
    rows = [("57-node tree verification / AR step", "at most 1.5", parts["verify tree:wide57"] / ar),
            ("one drafter level / AR step", "at most 0.2", parts["drafter_level"] / ar),
            ("host-side acceptance per round (chain:5) / AR step", "at most 0.1", parts["acceptance chain:5"] / ar)]
    table = [(name, goal, value, value <= float(goal.split()[-1])) for name, goal, value in rows]
    best = {f"at tau {tau}": max(row[key] for row in result["implied"].values() for key in row if key.startswith(
        f"at tau {tau} ")) for tau in (2.42, 3.34)}
    table.append(("implied speed-up at tau 2.42 (Eagle-1), best draft", f"above {PAPER['Eagle-1']}x",
                  best["at tau 2.42"], best["at tau 2.42"] > PAPER["Eagle-1"]))
    table.append(("implied speed-up at tau 3.34 (COOL-SD delta=2), best draft", f"above {PAPER['COOL-SD delta=2']}x",
                  best["at tau 3.34"], best["at tau 3.34"] > PAPER["COOL-SD delta=2"]))
    for name in parts:
        if name.startswith("ar_step ["):
            table.append((f"{name} / ar_step [{result['steps']}]", "report", parts[name] / ar, True))
    return table


def run_profiles(cuda: bool) -> list[dict]:
    """One profile per shape, each with its own wall time."""
    results = []
    for shape, sampling, compare in CUDA_SHAPES if cuda else CPU_SHAPES:
        began = time.perf_counter()
        bundle = random_bundle(shape, device="cuda" if cuda else "cpu")
        bundle = bundle.with_steps("graphs" if cuda else "eager")
        result = profile(bundle, sampling, repeats=20 if cuda else 5, images=4 if cuda else 2, compare_steps=compare)
        result.update(shape=shape, sampling=sampling.to_dict(), seconds=time.perf_counter() - began,
                      goals=[dict(zip(("quantity", "goal", "measured", "met"), row)) for row in goals(result)])
        if cuda:
            result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        results.append(result)
        del bundle
        if cuda:
            torch.cuda.empty_cache()
    return results


def summary(report: dict) -> str:
    """The Markdown printed at the end (and kept in the JSON)."""
    tests = report["tests"]
    lines = [f"## GPU check, {report['date']}: {report['device']}", "",
             f"torch {report['torch']}, Python {report['python']}; total {report['seconds']:.0f} s", ""]
    if not report["cuda"]:
        lines += ["**No CUDA GPU is visible: the CUDA parts were skipped** (the CUDA tests skip themselves; the "
                  "profile ran at a tiny shape on the CPU instead of the LlamaGen shapes).", ""]
    lines += [f"Tests ({', '.join(tests['files'])}): {tests['passed']} passed, {tests['skipped']} skipped, "
              f"{tests['failures'] + tests['errors']} failed, in {tests['seconds']:.0f} s"]
    lines += [f"* skipped: {reason}" for reason in tests["skip_reasons"]] + [""]
    for result in report["profiles"]:
        heading = "Goals" if report["cuda"] else ("Goals (set for LlamaGen-XL text-to-image on an H200; at this tiny "
                                                  "CPU shape they are shown only so that the table is exercised)")
        lines += [format_profile(result), "", f"{heading} at {result['shape']} ({result['seconds']:.0f} s for this "
                  "shape" + (f", peak GPU memory {result['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in result
                             else "") + "):", "", "| quantity | goal | measured | met |", "|---|---|---|---|"]
        lines += [f"| {g['quantity']} | {g['goal']} | {g['measured']:.3g} | {'yes' if g['met'] else 'NO'} |"
                  for g in result["goals"]] + [""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: scripts/gpu_check.sh OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    cuda = torch.cuda.is_available()
    set_threads(1)
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cuda": cuda,
              "device": torch.cuda.get_device_name(0) if cuda else f"CPU only ({platform.processor() or 'cpu'})",
              "torch": torch.__version__, "python": platform.python_version()}
    report["tests"] = run_tests(out, cuda)
    report["profiles"] = run_profiles(cuda)
    report["seconds"] = time.perf_counter() - began
    report["summary"] = summary(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(report["summary"])
    if not report["tests"]["ok"]:
        print(report["tests"]["tail"], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
