"""What the app computes, independent of Gradio: request validation, the side-by-side runs (chosen method,
lossless Eagle-1, AR timing), their tables and figures, and the theory panel."""

from __future__ import annotations

import base64
import functools
import io
import json
import statistics
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..core.decode import Generation, generate
from ..core.params import check, shorten
from ..core.rules import AR, AcceptanceRule, Eagle, build_rule, omega_schedule, resolve_mu
from ..core.sampling import SamplingConfig
from ..core.theory import chain_theory, round_summary, step_rates, toy_chain
from ..core.trees import TREES, DraftTree, chain, parse_draft
from ..models.bundle import ASSETS, Bundle
from . import plots

# UI label -> (method, fixed parameters)
METHODS: dict[str, tuple[str, dict]] = {
    "COOL-SD": ("cool", {}),
    "UniformRSD": ("uniform", {}),
    "LANTERN++": ("lantern", {"residual": "lantern"}),
    "LANTERN++ with G*": ("lantern", {"residual": "gstar"}),
    "Eagle-1 (lossless)": ("eagle", {}),
    "AR (no drafting)": ("ar", {}),
}
DRAFTS = [f"chain:{n}" for n in range(1, 9)] + [f"tree:{name}" for name in TREES]
SCHEDULES = ("exp", "linear")
DISPLAY_SCALE = 10
TIMING_REPEATS = 5
RESULTS_FILE = ASSETS / "fashion" / "bench_results.json"


def choice(name: str, value, options) -> str:
    """``value`` if it is one of ``options`` (strings), else a readable ValueError (the value shortened)."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of: {', '.join(options)}; got {shorten(value)}")
    return value


def flag(name: str, value) -> bool:
    """A checkbox value: True/False (or the strings "true"/"false"/"auto" an API client may send)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "auto"):
        return value.strip().lower() != "false"
    raise ValueError(f"{name} must be true or false, got {shorten(value)}")


@dataclass(frozen=True)
class Request:
    """One validated generation request."""

    label: str
    method: str
    params: tuple
    draft: str
    class_id: int
    seed: int
    sampling: SamplingConfig
    rule: AcceptanceRule = field(compare=False)  # built once, from method and params
    tree: DraftTree = field(compare=False)

    @property
    def param_dict(self) -> dict:
        return dict(self.params)


def parse_request(bundle: Bundle, method: str, delta, nu, mu_auto, mu, k, lam, draft: str, class_name: str, seed,
                  cfg_scale, temperature, top_k, top_p, schedule: str = "exp") -> Request:
    """Validate raw UI/API values (any type may arrive) into a :class:`Request`; ranges from ``coolsd.params``."""
    name, fixed = METHODS[choice("method", method, METHODS)]
    choice("draft structure", draft, DRAFTS)
    choice("class", class_name, bundle.class_names)
    choice("schedule", schedule, SCHEDULES)
    params: dict = dict(fixed)
    if name in ("cool", "uniform"):
        params["delta"] = check("delta", delta)
    if name == "cool":
        params["nu"] = check("nu", nu)
        params["mu"] = "auto" if flag("mu auto", mu_auto) else check("mu", mu)
        params["schedule"] = schedule
    if name == "lantern":
        params["k"] = check("k", k)
        params["lambda"] = check("lambda", lam)
    sampling = SamplingConfig(cfg_scale=check("cfg_scale", cfg_scale), temperature=check("temperature", temperature),
                              top_k=check("top_k", top_k, high=bundle.config.vocab_size), top_p=check("top_p", top_p))
    tree = parse_draft(draft)
    rule = build_rule(name, params, tree.depth, bundle.neighbours)  # refuses e.g. a too steep linear nu
    return Request(method, name, tuple(sorted(params.items())), draft, bundle.class_names.index(class_name),
                   check("seed", seed), sampling, rule, tree)


class ResultCache:
    """A small thread-safe LRU cache for deterministic runs (same request, same tokens)."""

    def __init__(self, size: int = 32) -> None:
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()

    def get_or_run(self, key, run):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = run()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


EAGLE_CACHE = ResultCache()


@dataclass
class Comparison:
    """The chosen method's run next to lossless Eagle-1 on the same class and seed, and (once measured) the
    latencies of both and of AR."""

    request: Request
    method: Generation
    eagle: Generation
    images: dict = field(default_factory=dict)
    timing: "Timing | None" = None


def compare(bundle: Bundle, request: Request, progress=None) -> Comparison:
    """Run the chosen method and (cached per setting) lossless Eagle-1 for one request; no timing yet."""
    say = progress or (lambda *args, **kwargs: None)
    sampling, cls, seed = request.sampling, request.class_id, request.seed
    eagle_key = (bundle.name, request.draft, cls, seed, sampling)

    def run_eagle() -> Generation:
        return generate(bundle, cls, Eagle(), request.tree, sampling, seed, capture=True)

    say(0.1, desc=f"Generating with {request.label}")
    if request.method == "eagle":
        method = EAGLE_CACHE.get_or_run(eagle_key, run_eagle)
    else:
        method = generate(bundle, cls, request.rule, request.tree, sampling, seed)
    say(0.6, desc="Generating with Eagle-1 (lossless)")
    eagle = EAGLE_CACHE.get_or_run(eagle_key, run_eagle)
    images = {"method": bundle.image(method.tokens), "eagle": bundle.image(eagle.tokens)}
    return Comparison(request, method, eagle, images)


@dataclass
class Timing:
    """Latencies (seconds) of AR, Eagle-1 and the chosen method, from interleaved repeats in one request, so
    that every ratio compares runs made under the same machine conditions."""

    seconds: dict[str, list[float]]  # "ar" | "eagle" | "method" -> one latency per repeat
    threads: int

    @property
    def repeats(self) -> int:
        return len(self.seconds["ar"])

    def latency(self, run: str) -> tuple[float, float, float]:
        """Median, min and max latency of ``run``."""
        values = self.seconds[run]
        return statistics.median(values), min(values), max(values)

    def speedup(self, run: str) -> tuple[float, float, float]:
        """Median AR latency / median ``run`` latency, and the min and max of the per-repeat ratios."""
        ratios = [ar / other for ar, other in zip(self.seconds["ar"], self.seconds[run])]
        return statistics.median(self.seconds["ar"]) / statistics.median(self.seconds[run]), min(ratios), max(ratios)

    def to_dict(self) -> dict:
        return {"repeats": self.repeats, "threads": self.threads, "seconds": self.seconds,
                **{f"speedup_vs_ar_{run}": self.speedup(run) for run in ("eagle", "method")}}


def measure_speed(bundle: Bundle, request: Request, repeats: int = TIMING_REPEATS) -> Timing:
    """Time AR, Eagle-1 and the chosen method ``repeats`` times each, interleaved, in rotating order (no run
    always goes first); the same class, seed and sampling as the images, so the tokens are the same too."""
    runs = {"ar": AR(), "eagle": Eagle()}
    if request.method not in runs:
        runs["method"] = request.rule
    order = list(runs)
    seconds: dict[str, list[float]] = {run: [] for run in runs}
    for repeat in range(repeats):
        for run in order[repeat % len(order):] + order[:repeat % len(order)]:
            generation = generate(bundle, request.class_id, runs[run], request.tree, request.sampling, request.seed)
            seconds[run].append(generation.stats.seconds["total"])
    if "method" not in seconds:  # AR or Eagle-1 chosen: it is one of the two
        seconds["method"] = seconds[request.method]
    return Timing(seconds, torch.get_num_threads())


def warm_up(bundle: Bundle) -> None:
    """One small generation per code path, so that the first user request does not pay torch's start-up."""
    for rule in (AR(), Eagle()):
        generate(bundle, 0, rule, chain(2), bundle.sampling, 0)


def enlarge(pixels: np.ndarray, scale: int = DISPLAY_SCALE) -> Image.Image:
    """Upscale without blur, so each pixel stays a crisp square."""
    image = Image.fromarray(pixels)
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def timing_table(result: Comparison) -> str:
    """Markdown: per run, latency and speed-up vs AR (median and range over interleaved repeats, once
    measured), tau, forwards and relaxation cost."""
    rows = ["| run | latency (ms) | speed-up vs AR | tau | target forwards | drafter forwards | relaxation cost |",
            "|---|---|---|---|---|---|---|"]
    runs = [("method", result.request.label, result.method.stats)]
    if result.request.method != "eagle":
        runs.append(("eagle", "Eagle-1 (lossless)", result.eagle.stats))
    if result.request.method != "ar":
        runs.append(("ar", "AR (no drafting)", None))
    timing = result.timing
    for run, label, stats in runs:
        if timing is None:
            latency = speedup = "measuring…"
        else:
            median, low, high = timing.latency(run)
            latency = f"{1000 * median:.0f} ({1000 * low:.0f}–{1000 * high:.0f})"
            median, low, high = timing.speedup(run) if run != "ar" else (1.0, 1.0, 1.0)
            speedup = f"**{median:.2f}x** ({low:.2f}–{high:.2f})" if run != "ar" else "1.00x"
        if stats is None:  # AR: one target forward per token, no drafts, lossless
            tokens = result.method.stats.tokens
            rows.append(f"| {label} | {latency} | {speedup} | 1.00 | {tokens} | 0 | 0 |")
        else:
            rows.append(f"| {label} | {latency} | {speedup} | {stats.tau:.2f} | {stats.target_forwards} | "
                        f"{stats.drafter_forwards} | {stats.relaxation_cost:.3f} |")
    if timing is None:
        note = "Latencies are being measured: AR, Eagle-1 and this method, interleaved, in this request."
    else:
        note = (f"Latency: median (min–max) of {timing.repeats} interleaved repeats of AR, Eagle-1 and this method "
                f"in this request, {timing.threads} torch thread{'s' * (timing.threads > 1)}. Speed-up: median AR "
                "latency / median latency (min–max of the per-repeat ratios). tau: tokens per target forward.")
    return "\n".join(rows) + f"\n\n<small>{note}</small>"


def grid_of(bundle: Bundle) -> tuple[int, int]:
    return bundle.config.grid_height, bundle.config.grid_width


def figures(bundle: Bundle, result: Comparison) -> dict:
    """Every figure of the results panel."""
    label = result.request.label
    runs = [(label, result.method.stats)]
    if result.request.method != "eagle":
        runs.append(("Eagle-1", result.eagle.stats))
    omegas = result.method.stats.omegas if result.request.method in ("cool", "uniform") else None
    grid = grid_of(bundle)
    return {
        "per_position": plots.per_position(runs, omegas),
        "lengths": plots.accepted_lengths(runs),
        "map_method": plots.acceptance_map(result.images["method"], result.method.stats, grid, label),
        "map_eagle": plots.acceptance_map(result.images["eagle"], result.eagle.stats, grid, "Eagle-1 (lossless)"),
    }


def replay_figure(bundle: Bundle, result: Comparison, round_index: int):
    return plots.replay(result.images["method"], result.method.stats, grid_of(bundle), round_index)


def theory_panel(bundle: Bundle, result: Comparison | None, request: Request, source: str, toy_seed: int = 0):
    """Exact beta_i, e_i, E[N] and TV bound under the current sliders, for the (p, q) pairs captured along the
    last Eagle-1 run (each pair evaluated exactly, averaged per position) or for random toy pairs."""
    if request.method == "ar":
        raise ValueError("AR drafts nothing: choose a speculative method to see its theory")
    depth, rule = request.tree.depth, request.rule
    if source == "toy" or result is None:
        p, q = toy_chain(vocab=16, length=depth, seed=toy_seed)
        table = chain_theory(p, q, rule)
        note = f"toy: Dirichlet(0.5) target/draft pairs over 16 tokens (seed {toy_seed})"
    else:
        captured = result.eagle.stats.captured
        by_depth: dict[int, list] = {}
        for item in captured:
            by_depth.setdefault(item["depth"], []).append(item)
        reached = [d for d in range(1, depth + 1) if d in by_depth]
        if not reached:
            raise ValueError("the last run captured no draft positions")
        rates = {d: np.array([step_rates(item["p"].astype(np.float64), item["q"].astype(np.float64), rule, d)
                              for item in by_depth[d]]).mean(axis=0) for d in reached}
        table = round_summary(reached, [rates[d][0] for d in reached], [rates[d][1] for d in reached],
                              [rule.omega(d) for d in reached])
        counts = ", ".join(f"{len(by_depth[d])}" for d in reached)
        note = (f"{len(captured)} (p, q) pairs captured along the last Eagle-1 run (per position: {counts}); "
                "each evaluated exactly under the current rule, then averaged per position")
    return plots.theory(table, request.label), table, note


def omega_line(method: str, delta, nu, mu_auto, mu, draft: str, schedule: str) -> str:
    """COOL-SD's ``mu`` (computed, under auto) and ``omega_1..omega_L`` at the current sliders, or why they are
    invalid (empty for other methods). Never raises: it runs on every slider move."""
    if method != "COOL-SD":
        return ""
    try:
        auto = flag("mu auto", mu_auto)
        depth = parse_draft(choice("draft structure", draft, DRAFTS)).depth
        schedule = choice("schedule", schedule, SCHEDULES)
        nu, mu = check("nu", nu), "auto" if auto else check("mu", mu)
        omegas = omega_schedule(check("delta", delta), nu, mu, depth, schedule)
        mu_value = resolve_mu(nu, mu, depth, schedule)
    except ValueError as error:
        return f"⚠️ *{error}*"
    mu_text = f"μ = {mu_value:.4g} (auto: mean ω = δ)" if auto else f"μ = {mu_value:.4g}"
    return f"{mu_text}; ω_1..ω_{depth}: " + ", ".join(f"{w:.2f}" for w in omegas)


def auto_mu(nu, draft: str, schedule: str = "exp") -> float:
    """The value ``mu="auto"`` stands for at the current ``nu``, draft depth and schedule."""
    return resolve_mu(check("nu", nu), "auto", parse_draft(choice("draft structure", draft, DRAFTS)).depth,
                      choice("schedule", schedule, SCHEDULES))


def theory_markdown(table: dict, note: str) -> str:
    rows = ["| position i | omega_i | beta_i | e_i | P(reach i) |", "|---|---|---|---|---|"]
    rows += [f"| {d} | {w:.3f} | {b:.4f} | {e:.4f} | {r:.4f} |"
             for d, w, b, e, r in zip(table["depth"], table["omega"], table["beta"], table["cost"], table["reach"])]
    return (f"E[N] = **{table['expected_accepted']:.3f}** accepted drafts per round "
            f"(**{table['expected_tokens']:.3f}** tokens per target forward); TV bound per round = "
            f"**{table['tv_bound']:.4f}**.\n\n*Source:* {note}.\n\n" + "\n".join(rows))


@functools.cache
def load_bench(path: Path = RESULTS_FILE) -> dict:
    """The shipped benchmark (read once: the file does not change while the app runs)."""
    return json.loads(path.read_text()) if path.exists() else {}


def measured_point(bundle: Bundle, request: Request, metric: str) -> tuple[float, float] | None:
    """``(tau, metric)`` of the benchmark run made with exactly this setting: same model, sampling, draft and
    rule parameters (defaults filled in), or None when the benchmark did not measure it."""
    bench = load_bench()
    if bench.get("model") != bundle.name or bench.get("sampling") != request.sampling.to_dict():
        return None
    wanted = request.rule.params()
    for run in bench.get("runs", []):
        if run["method"] != request.method or run.get(metric) is None:
            continue
        if request.method != "ar" and run["draft"] != request.draft:
            continue
        depth = parse_draft(run["draft"]).depth if request.method != "ar" else 0
        if build_rule(run["method"], run["params"], depth, bundle.neighbours).params() == wanted:
            return run["tau"], run[metric]
    return None


def tradeoff_figure(bundle: Bundle, result: Comparison | None, metric: str = "fid"):
    """The shipped benchmark's quality/speed points, with the current setting starred when it was measured."""
    runs = load_bench().get("runs", [])
    if not runs:
        return None
    current = measured_point(bundle, result.request, metric) if result is not None else None
    return plots.tradeoff(runs, current, y_key=metric)


def png_base64(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def api_payload(result: Comparison) -> dict:
    """JSON for API users: both images (PNG base64 and raw pixels), the tokens, and the statistics."""
    def run(generation: Generation, pixels: np.ndarray) -> dict:
        return {"tokens": generation.tokens, "pixels": pixels.tolist(), "png_base64": png_base64(pixels),
                "stats": generation.stats.to_dict(rounds=False)}
    return {"method": run(result.method, result.images["method"]), "eagle": run(result.eagle, result.images["eagle"]),
            "timing": result.timing.to_dict() if result.timing is not None else None}
