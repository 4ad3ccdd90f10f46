"""``python -m coolsd.bench --profile``: what one round's parts cost, measured, and the speed-ups they imply.

A speculative round is the engine's two phases: drafting (the drafter catches up on the kept tokens, then one
step per draft level, sampling included) and verification (one target forward over root + draft tree, then the
acceptance walk and the commit, on the device). It emits ``tau`` tokens on average, where an AR step (one
forward and one draw) emits one. So the speed-up over AR implied by the parts is ``tau * ar_step / round``:
below ``tau`` by exactly what a round costs beyond one AR step. Every part runs from the same saved mid-image
state through the bundle's phase runner (CUDA graphs on a GPU), timed after warm-up, as the median with its
quartiles over repeats; verification is also timed as its two halves (``verify``: the forward; ``acceptance``:
the rest). On a CPU each part's weight matrix multiplies are also timed alone, which bounds what a cheaper
drafting step could give (:func:`ceiling`); :func:`structure` counts what a round costs the host.
"""

from __future__ import annotations

import statistics
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.decode import (
    Workspace,
    accept,
    check_batch_memory,
    decode_batch,
    draft_phase,
    draw,
    generate,
    score,
    verify_phase,
)
from ..core.graphs import CheckedPhases, DrawnPhase, HostReadError
from ..core.rules import AR, CoolSD, Eagle
from ..core.sampling import SamplingConfig
from ..core.stats import time_calls, time_interleaved
from ..core.trees import DraftTree, parse_draft
from ..models.bundle import Bundle, device_name
from ..models.gpt import Caption
from ..models.steps import MODES

WARMUP_IMAGES = 2
PAPER_TAUS = {"Eagle-1": 2.42, "LANTERN++": 2.67, "COOL-SD delta=1.1": 2.73, "COOL-SD delta=2": 3.34}
DRAFTS = ("chain:5", "tree:eagle25", "tree:wide57")


def timed(step: Callable[[], object], repeats: int, warmup: int, device: torch.device,
          count_operations: bool = True) -> dict:
    """One part timed alone: :func:`timed_together` of one."""
    return timed_together({"part": step}, repeats, warmup, device,
                          {"part"} if count_operations else set())["part"]


def timed_together(steps: dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device,
                   counted: set[str] = frozenset()) -> dict[str, dict]:
    """Median and quartiles (seconds) of each step over ``repeats`` runs after ``warmup`` untimed ones, the steps
    interleaved (repeat r runs every step once, in turn), so that every part sees the same machine conditions and
    parts that add up are comparable (a round is never cheaper than its own verification for lack of it). On a
    CPU also the seconds each step's weight matrix multiplies take alone (:func:`matmul_seconds`) and, for the
    steps in ``counted`` (a ``torch.compile``-d step cannot run under the counting mode), its ATen operations."""
    seconds = time_interleaved(steps, repeats, warmup, device)
    parts = {}
    for name, step in steps.items():
        part = {"median_s": statistics.median(seconds[name]),
                "iqr_s": [float(np.percentile(seconds[name], q)) for q in (25, 75)], "repeats": repeats}
        if device.type == "cpu":
            part.update(matmul_seconds(step, repeats))
            if name in counted:
                part["operations"] = operation_count(step)
        parts[name] = part
    return parts


class OperationCount(TorchDispatchMode):
    """Counts the ATen operations dispatched inside it (views included): what a part costs in per-operation work,
    a figure that does not depend on the machine's speed."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def operation_count(step: Callable[[], object]) -> int:
    """The ATen operations one call of ``step`` dispatches."""
    with OperationCount() as counted:
        step()
    return counted.count


class LinearCalls(TorchFunctionMode):
    """Records the arguments of every ``F.linear`` call made inside it (the weight matrix multiplies)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            self.calls.append((args, kwargs))
        return func(*args, **kwargs)


def matmul_seconds(step: Callable[[], object], repeats: int) -> dict:
    """The median seconds of ``step``'s weight matrix multiplies replayed alone, in order, and their count. That
    arithmetic is paid by any implementation; the rest of a part is per-operation work (Python, dispatch,
    small kernels) that only a fused step could remove. The replay's own loop is included, so this errs high."""
    with LinearCalls() as recorded:
        step()
    calls = recorded.calls

    def replay():
        with torch.inference_mode():
            for args, kwargs in calls:
                F.linear(*args, **kwargs)
    seconds = time_calls(replay, repeats, 1, torch.device("cpu"))
    return {"matmul_s": statistics.median(seconds), "matmul_calls": len(calls)}


class Setting:
    """A workspace in the state a round starts from mid-image: half the image emitted, the caches filled that
    far (the keys' values do not change the cost of attending to them), three pairs pending for the drafter (a
    chain:5 round keeps about two drafts and the target's token), and a drafted tree (a Jacobi window, which has
    no drafter: a window drafted afresh, and a round that is its verification alone). Every timed call of a
    phase starts from this saved state, through the bundle's phase runner (on CUDA: replays of its graphs)."""

    def __init__(self, bundle: Bundle, sampling: SamplingConfig, tree: DraftTree, rule=None, seed: int = 0,
                 batch: int = 1) -> None:
        self.bundle, self.runner = bundle, bundle.runner
        target = bundle.target
        rule = rule or (Eagle() if tree.size else AR())
        ws = Workspace(target, bundle.drafter if tree.size else None, rule, tree, sampling, batch=batch)
        ws.captured_phases = {}  # its own graphs (a graph runner keeps them on the workspace)
        ws.reset([seed + image for image in range(batch)])
        device, start = bundle.device, target.image_tokens // 2
        generator = torch.Generator().manual_seed(seed)
        ws.tokens[:, :start] = torch.randint(0, target.vocab_size, (batch, start), generator=generator).to(device)
        ws.n.fill_(start)
        ws.draw_randoms(ws.walk_uniforms)  # the races drafting reads, as the last verification leaves them
        committed = target.prefix_length + start - 1  # every emitted token but the last (the next root)
        ws.target_cache.commit(None, committed)
        source = ws.source
        if source.drafting_phase:  # a drafter: its cache that far, the pairs pending
            pending = min(3, tree.depth + 1)
            source.cache.commit(None, committed - pending)
            width = bundle.config.dim * max(1, len(ws.taps))  # the target's features, or an EAGLE-3 drafter's taps
            source.feature_buffers(ws, torch.zeros(sampling.rows, 1, width, device=device,
                                                   dtype=next(bundle.drafter.parameters()).dtype))
            source.pending_tokens[:, :pending] = ws.tokens[:, start - pending:start]
            source.pending_count.fill_(pending)
        elif tree.size:  # a Jacobi window (no drafting phase): drafted afresh, its random numbers drawn above
            source.start(ws, None, None)
        self.ws = ws
        self.saved = self.save()
        if source.drafting_phase:
            self.run("drafting", draft_phase)  # a drafted tree to verify
            self.saved = self.save()

    def save(self) -> dict:
        ws, source = self.ws, self.ws.source
        tensors = [ws.n, ws.rounds, ws.node_tokens, ws.node_valid, ws.node_origin, ws.q, *source.state()]
        caches = [ws.target_cache, *source.caches()]
        return {"tensors": [(t, t.clone()) for t in tensors],
                "caches": [(c, c.length, c.start.clone() if hasattr(c, "start") else None) for c in caches]}

    def restore(self) -> None:
        for tensor, value in self.saved["tensors"]:
            tensor.copy_(value)
        for cache, length, start in self.saved["caches"]:
            cache.length = length
            if start is not None:
                cache.start.copy_(start)

    def run(self, name: str, phase: Callable) -> None:
        """One call of ``phase`` from the saved state (on CUDA, captured on the first call and replayed after)."""
        with torch.inference_mode():
            self.restore()
            self.runner.run(self.ws, name, phase)

    def step(self, name: str, phase: Callable) -> Callable[[], None]:
        return lambda: self.run(name, phase)

    def round(self) -> None:
        """One whole round from the saved state: drafting (for a source that has that phase), then verification."""
        with torch.inference_mode():
            self.restore()
            if self.ws.source.drafting_phase:
                self.runner.run(self.ws, "drafting", draft_phase)
            self.runner.run(self.ws, "verification", verify_phase)


class Census(TorchFunctionMode):
    """While active and not ``paused``: every torch operation issued, and every value read back to the host
    with the bytes it moves (what a round costs the host, apart from the phases a graph would replay). A read
    is a copy off the device (``cpu``, ``tolist``, ``item`` and Python's conversions); turning the copy into
    numpy moves nothing more."""

    READS = {"cpu", "tolist", "item", "__bool__", "__int__", "__float__", "__index__"}

    def __init__(self) -> None:
        super().__init__()
        self.operations, self.reads, self.read_bytes, self.paused = 0, 0, 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.operations += 1
            if getattr(func, "__name__", "") in self.READS and isinstance(args[0], torch.Tensor):
                self.reads += 1
                self.read_bytes += args[0].numel() * args[0].element_size()
        return func(*args, **(kwargs or {}))


class CountedPhases:
    """A phase runner that runs another's phases (the CPU stand-in for CUDA graphs) with ``census`` paused, so
    the census sees only what happens outside the phases; ``runs`` counts phase runs (a GPU's replays) and
    ``phase_reads`` the host reads the stand-in refused inside one (it raises on the first)."""

    def __init__(self, inner: CheckedPhases, census: Census) -> None:
        self.inner, self.census, self.runs, self.phase_reads = inner, census, 0, 0
        self.rounds = 0  # verification phases: one per round

    def workspace(self, key: tuple, build: Callable):
        return self.inner.workspace(key, build)

    def generation(self):
        return self.inner.generation()

    def run(self, workspace, name: str, phase: Callable) -> None:
        self.census.paused, self.runs = True, self.runs + 1
        self.rounds += name == "verification"
        try:
            self.inner.run(workspace, name, phase)
        except HostReadError:
            self.phase_reads += 1
            raise
        finally:
            self.census.paused = False


def structure(bundle: Bundle, sampling: SamplingConfig, spec: str, rule, condition, seed: int = 0,
              batch: int = 1) -> dict:
    """What one image's rounds (or a batch's, of ``batch`` images with the same condition and seeds from
    ``seed``) cost the host, counted on the CPU (the figures do not depend on the hardware): phase runs per
    round (the replays a GPU makes), torch operations issued outside the phases per round, and host reads with
    the bytes they copy, per round and per image (per batch). The phases run under the CPU stand-in for CUDA
    graphs, which refuses a host read inside them or an operation sequence that changes between rounds."""
    static = bundle.with_steps("static")
    census = Census()
    runner = CountedPhases(CheckedPhases(), census)
    tree = parse_draft(spec) if rule.drafts else DraftTree(())
    with census:
        results = decode_batch(static.target, static.drafter, [condition] * batch, rule, tree, sampling,
                               [seed + image for image in range(batch)], runner=runner)
    rounds = runner.rounds  # the batch's rounds (the prefill is not one)
    return {"draft": spec if rule.drafts else "none", "method": rule.name, "rounds": rounds, "batch": batch,
            "tau": float(np.mean([result.stats.tau for result in results])),
            "phase_runs_per_round": runner.runs / rounds, "host_reads_in_rounds": runner.phase_reads,
            "operations_outside_phases_per_round": census.operations / rounds,
            "host_reads_per_image": census.reads, "host_bytes_per_image": census.read_bytes,
            "host_bytes_per_round": census.read_bytes / rounds}


def random_caption(config, seed: int) -> Caption:
    """A stand-in caption for random weights: random features in every slot, none padded."""
    features = torch.randn(config.cls_token_num, config.caption_dim, generator=torch.Generator().manual_seed(seed))
    return Caption(features, torch.ones(config.cls_token_num, dtype=torch.bool), "random caption")


def wall_clock(bundle: Bundle, sampling: SamplingConfig, images: int, seed: int) -> dict:
    """Whole images with AR, Eagle-1 chain:5 and COOL-SD delta=2 chain:5, interleaved: latency and tau."""
    tree = parse_draft("chain:5")
    runs = {"AR": AR(), "Eagle-1 chain:5": Eagle(), "COOL-SD delta=2 chain:5": CoolSD(delta=2.0, depth=tree.depth)}
    out = {name: {"seconds": [], "tau": []} for name in runs}
    condition = lambda i: random_caption(bundle.config, seed + i) if bundle.config.text_conditioned else \
        i % bundle.config.num_classes  # noqa: E731
    # untimed first images (their own seeds, after the timed ones): caches, graph captures, compilation
    for i in list(range(images, images + WARMUP_IMAGES)) + list(range(images)):
        for name, rule in runs.items():
            result = generate(bundle, condition(i), rule, tree, sampling, seed + i)
            if i < images:
                out[name]["seconds"].append(result.stats.seconds["total"])
                out[name]["tau"].append(result.stats.tau)
    ar = statistics.median(out["AR"]["seconds"])
    return {name: {"latency_median_s": statistics.median(v["seconds"]), "tau": float(np.mean(v["tau"])),
                   "speedup_vs_ar": ar / statistics.median(v["seconds"])} for name, v in out.items()}


def profile(bundle: Bundle, sampling: SamplingConfig, repeats: int = 20, warmup: int = 3, images: int = 2,
            seed: int = 0, compare_steps: bool = False, batches: tuple[int, ...] = (1,)) -> dict:
    """Every part's time, the speed-ups they imply at the paper's tau, and measured whole-image speed-ups;
    with ``compare_steps``, the AR step and the chain:5 round's parts under every other steps mode this device
    runs too (``by_steps``); with ``batches`` other than (1,), the rounds of each batch size
    (:func:`batch_rounds`). A part is a phase of the round as the engine runs it (or, for verification, its two
    halves), from a saved state; all parts of all modes are timed interleaved, in one loop."""
    device = bundle.device
    cut = bundle.target.image_tokens // 2 - 2  # the trees must fit the half image left
    modes = [bundle.steps] + ([m for m in device_modes(device) if m != bundle.steps] if compare_steps else [])
    steps, counted = {}, set()
    for mode in modes:
        stepped = bundle if mode == bundle.steps else bundle.with_steps(mode)
        tag = mode_tag(mode, bundle.steps)
        drafts = DRAFTS if mode == bundle.steps else DRAFTS[:1]
        for name, step in round_parts(stepped, sampling, drafts, cut, seed).items():
            steps[name + tag] = step
            if mode != "compiled":
                counted.add(name + tag)
    parts = timed_together(steps, repeats, warmup, device, counted)
    tokens = torch.randint(0, bundle.config.vocab_size, (bundle.config.image_tokens,)).tolist()
    parts["image_decode"] = timed(lambda: bundle.image(tokens), max(3, repeats // 4), 1, device)
    return {"model": bundle.name, "device": device_name(device), "dtype": str(bundle.dtype).removeprefix("torch."),
            "steps": bundle.steps, "threads": torch.get_num_threads(), "parts": parts, "implied": implied(parts),
            "by_steps": by_steps(parts, modes) if compare_steps else {},
            "ceiling": ceiling(parts) if bundle.drafter is not None and device.type == "cpu" else {},
            "measured": wall_clock(bundle, sampling, images, seed) if bundle.drafter is not None and images else {},
            "batches": batch_rounds(bundle, sampling, batches, repeats, warmup) if batches != (1,) else []}


# The acceptance half of a verification: the round's draws, the walk and the commit.
draw_and_accept = DrawnPhase(draw, accept)


def round_parts(bundle: Bundle, sampling: SamplingConfig, drafts: tuple[str, ...], cut: int, seed: int
                ) -> dict[str, Callable[[], None]]:
    """The parts to time, as steps from saved states: the AR step, and per draft its verification's two
    halves (the forward; the draws, walk and commit), its drafting and the whole round; one drafter level."""
    ar = Setting(bundle, sampling, DraftTree(()), seed=seed)
    steps = {"ar_step": ar.step("verification", verify_phase)}
    for spec in drafts:
        setting = Setting(bundle, sampling, parse_draft(spec).truncated(cut), seed=seed)
        steps[f"verify {spec}"] = setting.step("score", score)
        setting.run("score", score)  # the logits the acceptance reads
        steps[f"acceptance {spec}"] = setting.step("acceptance", draw_and_accept)
        if bundle.drafter is not None:
            steps[f"drafting {spec}"] = setting.step("drafting", draft_phase)
            steps[f"round {spec}"] = setting.round
    if bundle.drafter is not None:
        steps["drafter_level"] = Setting(bundle, sampling, parse_draft("chain:1"), seed=seed).step(
            "drafting", draft_phase)
    return steps


def mode_tag(mode: str, main: str) -> str:
    """How a part's name says its steps mode: nothing for the bundle's own (``main``), `` [mode]`` otherwise."""
    return "" if mode == main else f" [{mode}]"


def by_steps(parts: dict, modes: list[str]) -> dict[str, dict]:
    """Per steps mode, the chain:5 round's parts (seconds, and in that mode's AR steps): ``parts`` holds the
    first mode's under their plain names and the others' tagged (:func:`mode_tag`)."""
    names = ("ar_step", "verify chain:5", "acceptance chain:5", "drafting chain:5", "round chain:5")
    out = {}
    for mode in modes:
        tag = mode_tag(mode, modes[0])
        found = {name: parts[name + tag]["median_s"] for name in names if name + tag in parts}
        out[mode] = {name: {"median_s": value, "over_ar_step": value / found["ar_step"]}
                     for name, value in found.items()}
    return out


BATCH_DRAFTS = ("chain:5", "tree:eagle25")


def batch_rounds(bundle: Bundle, sampling: SamplingConfig, batches: tuple[int, ...], repeats: int = 20,
                 warmup: int = 3, drafts: tuple[str, ...] = BATCH_DRAFTS) -> list[dict]:
    """Per batch size B (spec section 9): an AR step and a whole round of each draft for B images in lockstep,
    timed from a saved mid-image state as :func:`profile` times them, and the speed-up over batched AR they
    imply at the paper's tau (tau * AR step / round: both advance B images, a round by tau tokens each on
    average). The lockstep cost (a batch runs until its slowest image is done) is not in it: the measured
    images per second of ``bench --latency-batch`` are. Sizes whose caches do not fit are left out, said so."""
    rows = []
    for batch in batches:
        try:
            check_batch_memory(bundle.target, bundle.drafter, parse_draft(drafts[-1]), sampling, batch)
        except ValueError as error:
            rows.append({"batch": batch, "skipped": str(error)})
            continue
        ar = Setting(bundle, sampling, DraftTree(()), seed=0, batch=batch)
        row = {"batch": batch, "ar_step_s": timed(ar.step("verification", verify_phase), repeats, warmup,
                                                  bundle.device)["median_s"]}
        del ar
        for spec in drafts if bundle.drafter is not None else ():
            setting = Setting(bundle, sampling, parse_draft(spec), seed=0, batch=batch)
            round_s = timed(setting.round, repeats, warmup, bundle.device)["median_s"]
            row[f"round {spec}"] = {"round_s": round_s, **round_speedups(round_s, row["ar_step_s"])}
            del setting
        rows.append(row)
    return rows


def format_batch_rounds(rows: list[dict]) -> str:
    """The batch table: per B, the AR step and each draft's round (ms), and the implied speed-ups; then the
    smallest B where batched AR overtakes each draft at each tau."""
    timed_rows = [row for row in rows if "skipped" not in row]
    drafts = [key for key in timed_rows[0] if key.startswith("round ")] if timed_rows else []
    taus = [key for key in timed_rows[0][drafts[0]] if key.startswith("at tau")] if drafts else []
    lines = ["| B | AR step ms | " + " | ".join(f"{d} ms | {d} / AR | " + " | ".join(f"{d} {t}" for t in taus)
                                               for d in drafts) + " |",
             "|---" * (2 + len(drafts) * (2 + len(taus))) + "|"]
    for row in timed_rows:
        cells = [str(row["batch"]), f"{1000 * row['ar_step_s']:.2f}"]
        for draft in drafts:
            cells += [f"{1000 * row[draft]['round_s']:.2f}", f"{row[draft]['round_over_ar_step']:.2f}"]
            cells += [f"{row[draft][tau]:.2f}x" for tau in taus]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"* B={row['batch']} skipped: {row['skipped']}" for row in rows if "skipped" in row]
    for draft in drafts:
        for tau in taus:
            over = [row["batch"] for row in timed_rows if row[draft][tau] < 1]
            lines.append(f"* {draft}, {tau}: " + (f"batched AR overtakes from B = {over[0]}" if over else
                                                  "speculative decoding still pays at every B measured"))
    return "\n".join(lines)


def device_modes(device: torch.device) -> tuple[str, ...]:
    """The steps modes a device runs: CUDA graphs only on CUDA."""
    return tuple(m for m in MODES if device.type == "cuda" or m != "graphs")


def implied(parts: dict) -> dict:
    """Implied (not measured) speed-up over AR at the paper's tau, per draft: tau * ar / round, with the round
    timed whole (its drafting and verification phases, as the engine runs them), or, for a model without a
    drafter, its verification forward and acceptance."""
    ar = parts["ar_step"]["median_s"]
    out = {}
    for spec in DRAFTS:
        whole = parts.get(f"round {spec}")
        round_s = whole["median_s"] if whole else parts[f"verify {spec}"]["median_s"] + \
            parts[f"acceptance {spec}"]["median_s"]
        out[spec] = round_speedups(round_s, ar)
    return out


def round_speedups(round_s: float, ar_s: float) -> dict:
    """A round's cost in AR steps and the speed-ups it implies at the paper's tau (tau * ar / round)."""
    return {"round_over_ar_step": round_s / ar_s,
            **{f"at tau {tau} ({name})": tau * ar_s / round_s for name, tau in PAPER_TAUS.items()}}


def ceiling(parts: dict) -> dict:
    """Per draft, the implied speed-up if drafting cost only its matrix multiplies (the drafter's arithmetic)
    while the target's steps stay as measured: what a drafting step with no per-operation work would give. Also
    the round when every part costs only its matrix multiplies, in AR steps that do too (a fully fused limit)."""
    ar = parts["ar_step"]
    out = {}
    for spec in DRAFTS:
        verify, drafting_part, accept = (parts[f"{name} {spec}"] for name in ("verify", "drafting", "acceptance"))
        round_s = verify["median_s"] + drafting_part["matmul_s"] + accept["median_s"]
        fused_s = verify["matmul_s"] + drafting_part["matmul_s"] + accept["matmul_s"]
        out[spec] = {"drafting_matmul_share": drafting_part["matmul_s"] / drafting_part["median_s"],
                     **round_speedups(round_s, ar["median_s"]),
                     "matmuls_only_round_over_ar_step": fused_s / ar["matmul_s"]}
    return out


def speedup_cells(row: dict) -> str:
    """A row's implied speed-ups at the paper's tau, as Markdown cells."""
    return " | ".join(f"{value:.2f}x" for key, value in row.items() if key.startswith("at tau"))


def format_profile(result: dict) -> str:
    """A Markdown summary: measured parts (ms, and in AR steps), implied and measured speed-ups."""
    ar = result["parts"]["ar_step"]["median_s"]
    matmuls = "matmul_s" in result["parts"]["ar_step"]
    lines = [f"### Profile: {result['model']} on {result['device']} ({result['dtype']}, steps {result['steps']}, "
             f"{result['threads']} CPU thread(s))", "", "| part (measured) | median ms | quartiles ms | / AR step |"
             + (" in matmuls ms | operations |" if matmuls else ""), "|---|---|---|---|" + ("---|---|" if matmuls else "")]
    for name, part in result["parts"].items():
        low, high = part["iqr_s"]
        lines.append(f"| {name} | {1000 * part['median_s']:.3f} | {1000 * low:.3f}-{1000 * high:.3f} | "
                     f"{part['median_s'] / ar:.2f} |"
                     + (f" {1000 * part['matmul_s']:.3f} | {part.get('operations', '-')} |" if matmuls else ""))
    taus = " | ".join(f"implied at tau {t}" for t in PAPER_TAUS.values())
    lines += ["", f"| draft | round / AR step | {taus} |", "|---" * (2 + len(PAPER_TAUS)) + "|"]
    for spec, row in result["implied"].items():
        lines.append(f"| {spec} | {row['round_over_ar_step']:.2f} | {speedup_cells(row)} |")
    if result.get("by_steps"):
        modes = list(result["by_steps"])
        lines += ["", "Steps modes (all timed in the same interleaved loop): ms, and in AR steps of the same mode.", "",
                  "| part | " + " | ".join(modes) + " |", "|---" * (1 + len(modes)) + "|"]
        for name in result["by_steps"][modes[0]]:
            cells = [f"{1000 * row[name]['median_s']:.3f} ({row[name]['over_ar_step']:.2f})" if name in row else "-"
                     for row in result["by_steps"].values()]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result.get("ceiling"):
        lines += ["", "Ceiling: the round with drafting reduced to its matrix multiplies (last column: every part "
                  "and the AR step reduced to theirs).", "",
                  f"| draft | drafting in matmuls | round / AR step | {taus} | all at matmuls: round / AR step |",
                  "|---" * (4 + len(PAPER_TAUS)) + "|"]
        for spec, row in result["ceiling"].items():
            lines.append(f"| {spec} | {100 * row['drafting_matmul_share']:.0f}% | {row['round_over_ar_step']:.2f} | "
                         f"{speedup_cells(row)} | {row['matmuls_only_round_over_ar_step']:.2f} |")
    if result.get("batches"):
        lines += ["", "Batches: an AR step and a round for B images in lockstep (implied speed-ups over batched AR "
                  "at the same B, lockstep cost not included):", "", format_batch_rounds(result["batches"])]
    if result["measured"]:
        lines += ["", "| whole images (measured) | latency ms | tau | speed-up vs AR |", "|---|---|---|---|"]
        lines += [f"| {name} | {1000 * v['latency_median_s']:.1f} | {v['tau']:.2f} | {v['speedup_vs_ar']:.2f}x |"
                  for name, v in result["measured"].items()]
    return "\n".join(lines)
