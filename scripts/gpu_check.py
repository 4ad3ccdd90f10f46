"""The prepared GPU check (run through ``scripts/gpu_check.sh OUT_DIR``): the CUDA tests, then the component profile
at LlamaGen-XL text-to-image and LlamaGen-B class-to-image shapes with random weights (bf16, CFG, CUDA graphs),
checked against the goals of the CUDA path, and at the first shape an AR step and a round for batches of 1 to 64
images with the speed-ups over batched AR they imply (where batched AR overtakes), and there too a Jacobi round
(no drafter; windows of 16 and 32) for the same batches with its cost in AR steps, the tau at which it breaks
even with AR and the speed-ups it implies at the published tau. Needs no download and no gradio.
Without a GPU it runs what a CPU can (the CUDA tests, which skip and say so; a tiny profile) so that CI keeps it
working, and says that the CUDA parts were skipped. Writes ``gpu_check.json`` (and the pytest report) to OUT_DIR;
prints Markdown.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path

import torch

from coolsd.cli.profile import Setting, format_profile, profile, random_caption, timed
from coolsd.core.decode import Watch, accept, check_batch_memory, generate, score, verify_phase
from coolsd.core.rules import CoolSD, Eagle
from coolsd.core.sampling import SamplingConfig
from coolsd.core.stats import time_calls
from coolsd.core.trees import DraftTree, parse_draft
from coolsd.models.bundle import load_bundle, random_bundle, set_threads

# (random-init shape, sampling as LlamaGen samples it (the presets in assets/models), time the other steps modes)
CUDA_SHAPES = [("llamagen-t2i-xl", SamplingConfig(cfg_scale=3.0, top_k=2000), True),
               ("llamagen-b", SamplingConfig(cfg_scale=4.0, top_k=2000), False)]
CPU_SHAPES = [("tiny", SamplingConfig(cfg_scale=2.0), True)]
# Batch sizes whose AR step and rounds are timed (spec section 9), at the first CUDA shape; a size that does not
# fit in memory is skipped and said so. On a CPU, two sizes keep the table exercised.
CUDA_BATCHES, CPU_BATCHES = (1, 2, 4, 8, 16, 32, 64), (1, 4)
# The CUDA path's goals at LlamaGen-XL text-to-image shape, bf16, batch 1 with CFG, one H200: each part's cost in
# AR steps of our own CUDA-graph AR, the implied speed-ups at the paper's tau, and an implied COOL-SD image.
PAPER_TAUS = {"Eagle-1": 2.42, "COOL-SD delta=2": 3.34}
GOALS = {"drafter_level": 0.05, "acceptance chain:5": 0.03, "round chain:5": 1.4, "round tree:wide57": 1.5}
IMPLIED_GOALS = {"Eagle-1": 1.7, "COOL-SD delta=2": 2.3}
COMPILED_ROUND_GOAL = 1.4  # a chain:5 round of compiled phases (captured as graphs) in the fastest AR's steps
IMAGE_GOAL_S = 0.4  # the paper: 3.72 s on its hardware, AR about 10.1 s
# Jacobi windows (spec section 11), timed at the first shape for the same batch sizes: the target drafts its next L
# positions itself, so a round is one phase (the forward over L + 1 positions, the walk, the window's refresh) and
# one CUDA graph. Timed in SCD's exact form (Eagle-1 rule, coupled refresh); per window, the published tokens per
# round (step compression) on Lumina-mGPT at that L: (method, tau, whether tau is only a lower bound).
JACOBI_WINDOWS = {"jacobi:16:coupled": (("SJD", 2.22, False), ("GSD", 3.39, False)),
                  "jacobi:32:coupled": (("SCD", 4.2, True),)}


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
    table = [(f"{name} / AR step", f"at most {bound}", parts[name] / ar, parts[name] / ar <= bound)
             for name, bound in GOALS.items() if name in parts]
    for method, tau in PAPER_TAUS.items():
        best = max(row[f"at tau {tau} ({method})"] for row in result["implied"].values())
        table.append((f"implied speed-up at tau {tau} ({method}), best draft", f"at least {IMPLIED_GOALS[method]}x",
                      best, best >= IMPLIED_GOALS[method]))
    if "image_tokens" in result:  # the rounds one image needs at COOL-SD's tau, at the best draft's round cost
        round_s = min(parts[f"round {spec}"] for spec in result["implied"] if f"round {spec}" in parts)
        image = result["image_tokens"] / PAPER_TAUS["COOL-SD delta=2"] * round_s
        table.append(("implied COOL-SD delta=2 image (s)", f"at most {IMAGE_GOAL_S}", image, image <= IMAGE_GOAL_S))
    if "round chain:5 [compiled]" in parts:  # against the fastest AR step any mode gave
        fastest = min(value for name, value in parts.items() if name.split(" [")[0] == "ar_step")
        ratio = parts["round chain:5 [compiled]"] / fastest
        table.append(("round chain:5 [compiled] / fastest AR step", f"at most {COMPILED_ROUND_GOAL}", ratio,
                      ratio <= COMPILED_ROUND_GOAL))
    for name in parts:
        if name.startswith("ar_step ["):
            table.append((f"{name} / ar_step [{result['steps']}]", "report", parts[name] / ar, True))
    return table


def acceptance_dtypes(bundle, sampling: SamplingConfig) -> dict:
    """The acceptance phase (walk and commit, replayed from its CUDA graph) with the walk in float32 and in
    float64, per draft: the measurement behind the engine's float32 on CUDA."""
    out = {}
    for spec in ("chain:5", "tree:wide57"):
        for dtype in (torch.float32, torch.float64):
            setting = Setting(bundle, sampling, parse_draft(spec))
            setting.ws.dtype, setting.ws.index = dtype, setting.ws.tree.tensors(bundle.device, dtype)
            setting.run("score", score)
            seconds = time_calls(setting.step("acceptance", accept), 20, 3, bundle.device)
            out[f"{spec} {str(dtype).removeprefix('torch.')}"] = statistics.median(seconds)
    return out


def first_request(bundle, sampling: SamplingConfig) -> dict:
    """The app's click on a fresh worker, as on ZeroGPU (graphs are lost between requests): COOL-SD delta=2 and
    Eagle-1 on chain:5, one image each, with eager steps and with CUDA graphs captured inside the request."""
    tree, rules = parse_draft("chain:5"), (CoolSD(delta=2.0, depth=5), Eagle())
    condition = random_caption(bundle.config, 0) if bundle.config.text_conditioned else 0
    plain = bundle.with_steps("eager")
    out = {}
    for mode in ("eager", "graphs", "eager", "graphs"):  # interleaved, each with fresh steps (nothing captured)
        fresh = plain.with_steps(mode)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for rule in rules:
            generate(fresh, condition, rule, tree, sampling, 0)
        torch.cuda.synchronize()
        out.setdefault(mode, []).append(time.perf_counter() - began)
    out["capture pays within one request"] = min(out["graphs"]) < min(out["eager"])
    return out


def jacobi_rounds(bundle, sampling: SamplingConfig, batches: tuple[int, ...], ar_steps: dict[int, float],
                  repeats: int) -> dict:
    """Per Jacobi window and batch size B: a whole round for B images from a saved mid-image state (one replay of
    its one graph, timed as the profile times the other rounds), its cost in AR steps (``ar_steps``, by B: the
    batch table's AR steps; measured here where it has none) and the speed-ups it implies at the published tau (tau * AR
    step / round). Also the tokens the last timed round emitted per image (1 to L + 1 when the round ran). Sizes
    that do not fit are skipped, said so; an error is kept, so that it cannot lose the rest of the report."""
    began, rows = time.perf_counter(), []
    try:
        for spec, published in JACOBI_WINDOWS.items():
            tree = parse_draft(spec)
            for batch in batches:
                try:
                    check_batch_memory(bundle.target, None, tree, sampling, batch)
                except ValueError as error:
                    rows.append({"window": spec, "batch": batch, "skipped": str(error)})
                    continue
                if batch not in ar_steps:
                    ar = Setting(bundle, sampling, DraftTree(()), batch=batch)
                    ar_steps[batch] = timed(ar.step("verification", verify_phase), repeats, 3, bundle.device)[
                        "median_s"]
                    del ar
                setting = Setting(bundle, sampling, tree, rule=Eagle(), batch=batch)
                start = setting.ws.n.clone()  # every timed round starts from it
                round_s = timed(setting.round, repeats, 3, bundle.device)["median_s"]
                emitted = (setting.ws.n - start).tolist()
                del setting
                ar_s = ar_steps[batch]
                rows.append({"window": spec, "window_length": tree.depth, "batch": batch, "ar_step_s": ar_s,
                             "round_s": round_s, "round_over_ar_step": round_s / ar_s,
                             "break_even_tau": round_s / ar_s, "emitted_last_round": emitted,
                             "implied": [{"method": method, "tau": tau, "lower_bound": bound,
                                          "speedup": tau * ar_s / round_s} for method, tau, bound in published]})
        error = None
    except Exception as failure:  # noqa: BLE001 (reported in the summary; the other sections stay)
        error = f"{type(failure).__name__}: {failure}"
    if bundle.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"rule": "eagle", "rows": rows, "error": error, "seconds": time.perf_counter() - began}


def zero_gpu_click(cuda: bool) -> dict:
    """The ZeroGPU path's click on the shipped model (bf16 on CUDA, eager steps, as app/web/gpu.py runs it in the
    worker): the generation (COOL-SD delta=2 and Eagle-1 on chain:5, with the live view's picture every 0.1 s) and
    the timing run (5 repeats), each timed, and the duration each call would ask for before and after this
    server had measured the model (app/web/budget.py): what sizes ``duration`` on a Space."""
    from coolsd.app import session, views
    from coolsd.app.web.budget import Budget
    bundle = session.fast_steps(load_bundle(device="cuda" if cuda else "cpu"), zero_gpu=True)
    start = bundle.sampling
    request = session.parse_request(bundle, "COOL-SD", {"delta": 2.0}, "chain:5", bundle.class_names[1], 0,
                                    start.cfg_scale, start.temperature, start.top_k, start.top_p)
    repeats, tokens, plan, out = 5 if cuda else 2, bundle.config.image_tokens, Budget(), {}
    calls = {"generation": {"cool": tokens, "eagle": tokens}, "timing": dict.fromkeys(("ar", "eagle", "cool"),
                                                                                      repeats * tokens)}
    out["asked_first_s"] = {name: plan.seconds("default", count) for name, count in calls.items()}
    began = time.perf_counter()
    live = Watch(lambda images: views.live_pixels(bundle, images[0]), session.LIVE_INTERVAL)
    made = generate(bundle, 1, request.rule, request.tree, request.sampling, 0, watch=live)
    eagle = generate(bundle, 1, Eagle(), request.tree, request.sampling, 0)
    out["generation_s"] = time.perf_counter() - began
    for rule, run in (("cool", made), ("eagle", eagle)):
        plan.record("default", rule, run.stats.seconds["total"], len(run.tokens), run.stats.target_forwards)
    out["asked_timing_after_generation_s"] = plan.seconds("default", calls["timing"])  # AR not yet measured
    began = time.perf_counter()
    timing = session.measure_speed(bundle, request, repeats)
    out["timing_s"] = time.perf_counter() - began
    for run, rule in (("ar", "ar"), ("eagle", "eagle"), ("method", "cool")):
        plan.record("default", rule, sum(timing.seconds[run]), repeats * len(timing.runs[run].tokens),
                    repeats * timing.runs[run].stats.target_forwards)
    out["asked_after_s"] = {name: plan.seconds("default", count) for name, count in calls.items()}
    out.update(device=timing.device, dtype=timing.dtype, steps=timing.steps, repeats=repeats, tokens=tokens)
    return out


def run_profiles(cuda: bool) -> list[dict]:
    """One profile per shape, each with its own wall time; then, with the first shape's bundle (kept until then, so
    that nothing the Jacobi rounds might break on a device can cost the other sections), its Jacobi rounds."""
    results, first = [], None
    for index, (shape, sampling, compare) in enumerate(CUDA_SHAPES if cuda else CPU_SHAPES):
        began = time.perf_counter()
        bundle = random_bundle(shape, device="cuda" if cuda else "cpu")
        bundle = bundle.with_steps("graphs" if cuda else "eager")
        batches = (CUDA_BATCHES if cuda else CPU_BATCHES) if index == 0 else (1,)
        result = profile(bundle, sampling, repeats=20 if cuda else 5, images=4 if cuda else 2, compare_steps=compare,
                         batches=batches)
        result.update(shape=shape, sampling=sampling.to_dict(), image_tokens=bundle.config.image_tokens)
        if cuda:
            result.update(acceptance_dtypes=acceptance_dtypes(bundle, sampling),
                          first_request=first_request(bundle, sampling))
        result.update(seconds=time.perf_counter() - began,
                      goals=[dict(zip(("quantity", "goal", "measured", "met"), row)) for row in goals(result)])
        if cuda:
            result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        results.append(result)
        first = first or (bundle, sampling, batches)
        del bundle
        if cuda:
            torch.cuda.empty_cache()
    bundle, sampling, batches = first
    ar_steps = {row["batch"]: row["ar_step_s"] for row in results[0]["batches"] if "skipped" not in row}
    results[0]["jacobi"] = jacobi_rounds(bundle, sampling, batches, ar_steps, repeats=20 if cuda else 5)
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
        if "acceptance_dtypes" in result:
            lines += ["Acceptance phase by the walk's dtype (ms): " + ", ".join(
                f"{name} {1000 * value:.3f}" for name, value in result["acceptance_dtypes"].items()), ""]
        if "first_request" in result:
            first = result["first_request"]
            lines += [f"One click on a fresh worker (COOL-SD delta=2 + Eagle-1, chain:5), s: eager "
                      f"{', '.join(f'{t:.2f}' for t in first['eager'])}; graphs captured in the request "
                      f"{', '.join(f'{t:.2f}' for t in first['graphs'])}; capture pays: "
                      f"{'yes' if first['capture pays within one request'] else 'no'}", ""]
    for result in report["profiles"]:
        if "jacobi" in result:
            lines += [format_jacobi(result["jacobi"], result["shape"]), ""]
    click = report.get("zero_gpu_click")
    if click:
        lines += [f"ZeroGPU path on the shipped model ({click['device']}, {click['dtype']}, {click['steps']}): "
                  f"generation with live view {click['generation_s']:.2f} s, timing run of {click['repeats']} repeats "
                  f"{click['timing_s']:.2f} s; durations asked before measuring {click['asked_first_s']}, "
                  f"the timing's after the generation {click['asked_timing_after_generation_s']} s, "
                  f"after both {click['asked_after_s']}", ""]
    return "\n".join(lines)


def format_jacobi(jacobi: dict, shape: str) -> str:
    """The Jacobi table: per window, B and published tau, the AR step and the round (ms), the round in AR steps
    (the tau that breaks even with AR) and the speed-up implied at that tau; then what the taus are."""
    lines = [f"### Jacobi rounds at {shape} (SCD's form: Eagle-1 rule, coupled refresh; no drafter; "
             f"{jacobi['seconds']:.0f} s)", "",
             "A Jacobi round is one phase (on a GPU, one CUDA graph): the target's forward over [last token, "
             "d_1..d_L], the walk, the window's refresh. Implied speed-up over AR = tau * AR step / round at the "
             "tokens per round (step compression) published on Lumina-mGPT (random weights here, so no tau of "
             "ours); break-even tau = round / AR step.", "",
             "| window | B | AR step ms | round ms | round / AR step = break-even tau | published tau | "
             "implied speed-up |", "|---|---|---|---|---|---|---|"]
    timed_rows = [row for row in jacobi["rows"] if "skipped" not in row]
    for row in timed_rows:
        for at in row["implied"]:
            bound = ">= " if at["lower_bound"] else ""
            lines.append(f"| {row['window']} | {row['batch']} | {1000 * row['ar_step_s']:.3f} | "
                         f"{1000 * row['round_s']:.3f} | {row['break_even_tau']:.2f} | {at['method']} {bound}"
                         f"{at['tau']} | {bound}{at['speedup']:.2f}x |")
    lines += ["", "* tau: SJD 2.22 and GSD 3.39 at L = 16 are the step compressions the SJD-PAC README reproduces on "
              "Lumina-mGPT (COCO); SCD 4.2 at L = 32 is its paper's latency speed-up on Lumina-mGPT, a lower bound "
              "on its step compression (where a round costs at least an AR step), so its implied speed-up is a "
              "lower bound too (>=).",
              "* Only SCD's round was timed: the SJD (independent refresh) and GSD (grouped rule) rows assume its "
              "cost."]
    lines += [f"* {row['window']} B={row['batch']} skipped: {row['skipped']}" for row in jacobi["rows"]
              if "skipped" in row]
    if timed_rows:
        ran = all(1 <= count <= row["window_length"] + 1 for row in timed_rows for count in row["emitted_last_round"])
        lines.append(f"* every timed round emitted 1 to L + 1 tokens per image: {'yes' if ran else 'NO'}")
    if jacobi["error"]:
        lines.append(f"* **the Jacobi timing stopped with an error**: {jacobi['error']}")
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
    report["zero_gpu_click"] = zero_gpu_click(cuda)
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
