"""``python -m coolsd.bench --profile``: what one round's parts cost, measured, and the speed-ups they imply.

A speculative round costs one verification forward (root + draft tree), its drafting phase (the drafter catches
up on the accepted tokens, then one step per draft level) and the host-side acceptance walk; it emits ``tau``
tokens on average, where AR emits one per step. So the speed-up over AR implied by the parts is
``tau * ar_step / (verify + drafting + acceptance)``: below
``tau`` by exactly what a round costs beyond one AR step. Every part is timed after warm-up, as the median
with its quartiles over repeats. On a CPU each part's weight matrix multiplies are also timed alone, which
bounds what a cheaper drafting step could give (:func:`ceiling`).
"""

from __future__ import annotations

import statistics
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..core.decode import State, draft, generate, to_host
from ..core.rules import AR, CoolSD, Eagle
from ..core.sampling import SamplingConfig, probabilities
from ..core.stats import time_calls
from ..core.trees import DraftTree, parse_draft
from ..core.verify import verify
from ..models.bundle import Bundle, device_name
from ..models.gpt import Caption
from ..models.steps import MODES

WARMUP_IMAGES = 2
PAPER_TAUS = {"Eagle-1": 2.42, "LANTERN++": 2.67, "COOL-SD delta=1.1": 2.73, "COOL-SD delta=2": 3.34}
DRAFTS = ("chain:5", "tree:eagle25", "tree:wide57")


def timed(step: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> dict:
    """Median and quartiles (seconds) of ``step`` over ``repeats`` runs after ``warmup`` untimed ones; on a CPU
    also the seconds its weight matrix multiplies take alone (:func:`matmul_seconds`)."""
    seconds = time_calls(step, repeats, warmup, device)
    part = {"median_s": statistics.median(seconds), "iqr_s": [float(np.percentile(seconds, q)) for q in (25, 75)],
            "repeats": repeats}
    if device.type == "cpu":
        part.update(matmul_seconds(step, repeats))
    return part


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
    """A target and drafter cache filled to half an image, the state a round starts from mid-image."""

    def __init__(self, bundle: Bundle, sampling: SamplingConfig, tree: DraftTree, seed: int = 0) -> None:
        self.bundle, self.sampling, self.tree = bundle, sampling, tree
        target, device = bundle.target, bundle.device
        rows, prefix = sampling.rows, target.prefix_length
        self.start = target.image_tokens // 2  # image tokens already emitted
        self.max_len = prefix + target.image_tokens + tree.size
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, target.vocab_size, (self.start,), generator=generator).to(device)
        self.rows, self.device = rows, device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def target_cache(self, target=None):
        """A target cache holding the prefix and the emitted tokens but the last (the next round's root); the
        keys' values do not change the cost of attending to them."""
        target = target or self.bundle.target
        cache = target.new_cache(self.rows, self.max_len)
        cache.commit(list(range(target.prefix_length + self.start - 1)))
        return cache

    def drafter_state(self) -> tuple[object, State]:
        drafter = self.bundle.drafter
        cache = drafter.new_cache(self.rows, self.max_len)
        cache.commit(list(range(self.bundle.target.prefix_length + self.start - 2)))
        features = torch.zeros(self.rows, 1, self.bundle.config.dim, device=self.device,
                               dtype=next(drafter.parameters()).dtype)
        return cache, State(self.tokens.tolist(), self.tokens[-1:].tolist(), features)


def verification(setting: Setting, tree: DraftTree, target=None) -> Callable[[], object]:
    """One target forward over root + ``tree`` (the empty tree: one AR step), then its logits; ``target``
    (default: the bundle's) may run its steps differently."""
    target = target or setting.bundle.target
    cache = setting.target_cache(target)
    index = tree.tensors(setting.device)
    nodes = torch.zeros(tree.size + 1, dtype=torch.long, device=setting.device)
    positions = target.prefix_length - 1 + setting.start + index["depths"]

    def step():
        with torch.inference_mode():
            hidden = target(target.embed(nodes)[None].expand(setting.rows, -1, -1), positions, cache, 0,
                            index["mask"] if tree.size else None)
            return target.logits(hidden)
    return step


def drafter_level(setting: Setting) -> Callable[[], object]:
    """One drafter level of a chain: catch up one pair, draft one token (its forward, head, transform, draw)."""
    one = parse_draft("chain:1")

    def step():
        with torch.inference_mode():
            cache, state = setting.drafter_state()
            return draft(setting.bundle.drafter, setting.bundle.target, cache, one, state, setting.sampling,
                         setting.generator)
    return step


def drafting(setting: Setting, tree: DraftTree, pending: int = 3) -> Callable[[], object]:
    """The whole drafting phase of a round, as ``decode_round`` runs it: catch up ``pending`` (input, feature)
    pairs (a chain:5 round accepts about 2 tokens, plus the target's own), then draft ``tree`` level by level."""

    def step():
        with torch.inference_mode():
            cache, state = setting.drafter_state()
            features = state.pending_features.expand(-1, pending, -1)
            state = State(state.tokens, setting.tokens[-pending:].tolist(), features)
            return draft(setting.bundle.drafter, setting.bundle.target, cache, tree, state, setting.sampling,
                         setting.generator)
    return step


def acceptance(setting: Setting, tree: DraftTree) -> Callable[[], object]:
    """What a round does after its verification forward, as ``decode_round`` does it: the sampling transform
    of root + tree logits, the one copy to the host (:func:`to_host`), float64 rows and the walk."""
    logits = verification(setting, tree)()
    q = probabilities(logits, setting.sampling).roll(1, dims=-1)  # a stand-in draft distribution, unlike p
    ranked = torch.argsort(q, dim=-1, descending=True)  # a child of rank r drafts its parent's r-th likeliest
    drafted = [0] + [int(ranked[tree.parent[node], tree.paths[node - 1][-1]]) for node in range(1, tree.size + 1)]
    tokens = torch.tensor(drafted, device=setting.device)
    valid, rule = torch.ones(tree.size + 1, dtype=torch.bool, device=setting.device), Eagle()
    rng = np.random.default_rng(0)

    def step():
        p_rows, q_rows, host_tokens, host_valid = to_host(probabilities(logits, setting.sampling), q, tokens, valid,
                                                          tree)
        return verify(tree, host_tokens, host_valid, p_rows, q_rows, rule, rng)
    return step


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
            seed: int = 0, compare_steps: bool = False) -> dict:
    """Every part's time, the speed-ups they imply at the paper's tau, and measured whole-image speed-ups;
    with ``compare_steps``, the AR step under every other steps mode this device runs."""
    device = bundle.device
    widest = parse_draft(DRAFTS[-1], None).truncated(bundle.target.image_tokens // 2 - 2)
    setting = Setting(bundle, sampling, widest, seed)
    parts = {"ar_step": timed(verification(setting, DraftTree(())), repeats, warmup, device)}
    if compare_steps:
        for mode in device_modes(device):
            if mode != bundle.steps:
                other = bundle.with_steps(mode).target
                parts[f"ar_step [{mode}]"] = timed(verification(setting, DraftTree(()), other), repeats, warmup, device)
    for spec in DRAFTS:
        tree = parse_draft(spec).truncated(bundle.target.image_tokens // 2 - 2)
        parts[f"verify {spec}"] = timed(verification(setting, tree), repeats, warmup, device)
        if bundle.drafter is not None:
            parts[f"drafting {spec}"] = timed(drafting(setting, tree), repeats, warmup, device)
        parts[f"acceptance {spec}"] = timed(acceptance(setting, tree), repeats, warmup, device)
    if bundle.drafter is not None:
        parts["drafter_level"] = timed(drafter_level(setting), repeats, warmup, device)
    tokens = torch.randint(0, bundle.config.vocab_size, (bundle.config.image_tokens,)).tolist()
    parts["image_decode"] = timed(lambda: bundle.image(tokens), max(3, repeats // 4), 1, device)
    return {"model": bundle.name, "device": device_name(device), "dtype": str(bundle.dtype).removeprefix("torch."),
            "steps": bundle.steps, "threads": torch.get_num_threads(), "parts": parts, "implied": implied(parts),
            "ceiling": ceiling(parts) if bundle.drafter is not None and device.type == "cpu" else {},
            "measured": wall_clock(bundle, sampling, images, seed) if bundle.drafter is not None and images else {}}


def device_modes(device: torch.device) -> tuple[str, ...]:
    """The steps modes a device runs: CUDA graphs only on CUDA."""
    return tuple(m for m in MODES if device.type == "cuda" or m != "graphs")


def implied(parts: dict) -> dict:
    """Implied (not measured) speed-up over AR at the paper's tau, per draft: tau * ar / round, where a round
    is its verification, its whole drafting phase and its acceptance."""
    ar = parts["ar_step"]["median_s"]
    out = {}
    for spec in DRAFTS:
        drafting_s = parts.get(f"drafting {spec}", {}).get("median_s", 0.0)
        round_s = parts[f"verify {spec}"]["median_s"] + drafting_s + parts[f"acceptance {spec}"]["median_s"]
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
             + (" in matmuls ms |" if matmuls else ""), "|---|---|---|---|" + ("---|" if matmuls else "")]
    for name, part in result["parts"].items():
        low, high = part["iqr_s"]
        lines.append(f"| {name} | {1000 * part['median_s']:.3f} | {1000 * low:.3f}-{1000 * high:.3f} | "
                     f"{part['median_s'] / ar:.2f} |" + (f" {1000 * part['matmul_s']:.3f} |" if matmuls else ""))
    taus = " | ".join(f"implied at tau {t}" for t in PAPER_TAUS.values())
    lines += ["", f"| draft | round / AR step | {taus} |", "|---" * (2 + len(PAPER_TAUS)) + "|"]
    for spec, row in result["implied"].items():
        lines.append(f"| {spec} | {row['round_over_ar_step']:.2f} | {speedup_cells(row)} |")
    if result.get("ceiling"):
        lines += ["", "Ceiling: the round with drafting reduced to its matrix multiplies (last column: every part "
                  "and the AR step reduced to theirs).", "",
                  f"| draft | drafting in matmuls | round / AR step | {taus} | all at matmuls: round / AR step |",
                  "|---" * (4 + len(PAPER_TAUS)) + "|"]
        for spec, row in result["ceiling"].items():
            lines.append(f"| {spec} | {100 * row['drafting_matmul_share']:.0f}% | {row['round_over_ar_step']:.2f} | "
                         f"{speedup_cells(row)} | {row['matmuls_only_round_over_ar_step']:.2f} |")
    if result["measured"]:
        lines += ["", "| whole images (measured) | latency ms | tau | speed-up vs AR |", "|---|---|---|---|"]
        lines += [f"| {name} | {1000 * v['latency_median_s']:.1f} | {v['tau']:.2f} | {v['speedup_vs_ar']:.2f}x |"
                  for name, v in result["measured"].items()]
    return "\n".join(lines)
