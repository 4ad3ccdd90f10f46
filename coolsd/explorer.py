"""What the app computes, independent of Gradio: request validation, the side-by-side runs (chosen method,
lossless Eagle-1, AR timing), their tables and figures, and the theory panel."""

from __future__ import annotations

import base64
import functools
import io
import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from . import plots
from .bundle import ASSETS, Bundle
from .decode import Generation, build_rule, generate
from .rules import omega_schedule, resolve_mu
from .sampling import SamplingConfig
from .theory import chain_theory, round_summary, step_rates, toy_chain
from .trees import TREES, parse_draft

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
LIMITS = {"delta": (0.05, 10.0), "nu": (-2.0, 3.0), "mu": (-10.0, 10.0), "k": (0, 64), "lambda": (1.0, 20.0),
          "cfg_scale": (0.0, 20.0), "temperature": (0.05, 5.0), "top_p": (0.01, 1.0), "seed": (0, 2**31 - 1)}
DISPLAY_SCALE = 10
RESULTS_FILE = ASSETS / "fashion" / "bench_results.json"


def _number(name: str, value, integer: bool = False) -> float | int:
    """A finite number within ``LIMITS[name]`` (a numeric string is accepted); else a readable ValueError."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is missing")
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if integer:
        if number != int(number):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        number = int(number)
    low, high = LIMITS.get(name, (-math.inf, math.inf))
    if not low <= number <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value!r}")
    return number


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

    @property
    def param_dict(self) -> dict:
        return dict(self.params)


def parse_request(bundle: Bundle, method: str, delta, nu, mu_auto, mu, k, lam, draft: str, class_name: str, seed,
                  cfg_scale, temperature, top_k, top_p, schedule: str = "exp") -> Request:
    """Validate raw UI/API values (any type may arrive) into a :class:`Request`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of: {', '.join(METHODS)}; got {method!r}")
    name, fixed = METHODS[method]
    if draft not in DRAFTS:
        raise ValueError(f"draft structure must be one of: {', '.join(DRAFTS)}; got {draft!r}")
    if class_name not in bundle.class_names:
        raise ValueError(f"class must be one of: {', '.join(bundle.class_names)}; got {class_name!r}")
    if schedule not in ("exp", "linear"):
        raise ValueError(f"schedule must be 'exp' or 'linear', got {schedule!r}")
    params: dict = dict(fixed)
    if name in ("cool", "uniform"):
        params["delta"] = _number("delta", delta)
    if name == "cool":
        params["nu"] = _number("nu", nu)
        params["mu"] = "auto" if mu_auto in (True, "auto") else _number("mu", mu)
        params["schedule"] = schedule
    if name == "lantern":
        params["k"] = _number("k", k, integer=True)
        params["lambda"] = _number("lambda", lam)
    top_k = _number("top_k", top_k, integer=True)
    if not 0 <= top_k <= bundle.config.vocab_size:
        raise ValueError(f"top_k must be between 0 (off) and {bundle.config.vocab_size}, got {top_k}")
    sampling = SamplingConfig(cfg_scale=_number("cfg_scale", cfg_scale),
                              temperature=_number("temperature", temperature), top_k=top_k,
                              top_p=_number("top_p", top_p))
    request = Request(method, name, tuple(sorted(params.items())), draft, bundle.class_names.index(class_name),
                      _number("seed", seed, integer=True), sampling)
    rule_for(bundle, request)  # parameter combinations the rule itself refuses (e.g. a too steep linear nu)
    return request


def rule_for(bundle: Bundle, request: Request):
    depth = 0 if request.method == "ar" else parse_draft(request.draft).depth
    return build_rule(request.method, request.param_dict, depth, bundle.neighbours)


class ResultCache:
    """A small thread-safe LRU cache for deterministic runs (same request, same tokens)."""

    def __init__(self, size: int = 64) -> None:
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


EAGLE_CACHE, AR_CACHE = ResultCache(), ResultCache()


@dataclass
class Comparison:
    """The chosen method's run next to lossless Eagle-1 on the same class and seed, and AR's latency."""

    request: Request
    method: Generation
    eagle: Generation
    ar_seconds: float
    images: dict = field(default_factory=dict)


def compare(bundle: Bundle, request: Request, progress=None) -> Comparison:
    """Run the chosen method (and, cached per setting, Eagle-1 and AR) for one request."""
    say = progress or (lambda *args, **kwargs: None)
    sampling, cls, seed = request.sampling, request.class_id, request.seed
    eagle_key = (bundle.name, "eagle", request.draft, cls, seed, sampling)

    def run_eagle() -> Generation:
        return generate(bundle, cls, "eagle", {}, request.draft, sampling, seed, capture=True)

    say(0.1, desc=f"Generating with {request.label}")
    if request.method == "eagle":
        method = EAGLE_CACHE.get_or_run(eagle_key, run_eagle)
    else:
        method = generate(bundle, cls, request.method, request.param_dict, request.draft, sampling, seed)
    say(0.4, desc="Generating with Eagle-1 (lossless)")
    eagle = EAGLE_CACHE.get_or_run(eagle_key, run_eagle)
    say(0.6, desc="Timing AR")

    def time_ar() -> float:
        return generate(bundle, cls, "ar", {}, request.draft, sampling, seed).stats.seconds["total"]

    ar_seconds = method.stats.seconds["total"] if request.method == "ar" else \
        AR_CACHE.get_or_run((bundle.name, cls, seed, sampling), time_ar)
    images = {"method": bundle.image(method.tokens), "eagle": bundle.image(eagle.tokens)}
    return Comparison(request, method, eagle, ar_seconds, images)


def warm_up(bundle: Bundle) -> None:
    """One small generation per code path, so that the first user request does not pay torch's start-up."""
    for method in ("ar", "eagle"):
        generate(bundle, 0, method, {}, "chain:2", bundle.sampling, 0)


def enlarge(pixels: np.ndarray, scale: int = DISPLAY_SCALE) -> Image.Image:
    """Upscale without blur, so each pixel stays a crisp square."""
    image = Image.fromarray(pixels)
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def timing_table(result: Comparison) -> str:
    """Markdown: latency, speed-up vs AR, tau, forwards and relaxation cost for the runs and AR."""
    rows = ["| run | latency | speed-up vs AR | tau (tokens / target forward) | target forwards | drafter forwards "
            "| relaxation cost |", "|---|---|---|---|---|---|---|"]
    runs = [(result.request.label, result.method.stats)]
    if result.request.method != "eagle":
        runs.append(("Eagle-1 (lossless)", result.eagle.stats))
    for label, stats in runs:
        seconds = stats.seconds["total"]
        rows.append(f"| {label} | {1000 * seconds:.0f} ms | {result.ar_seconds / seconds:.2f}x | {stats.tau:.2f} | "
                    f"{stats.target_forwards} | {stats.drafter_forwards} | {stats.relaxation_cost:.3f} |")
    if result.request.method != "ar":
        tokens = result.method.stats.tokens
        rows.append(f"| AR (no drafting) | {1000 * result.ar_seconds:.0f} ms | 1.00x | 1.00 | {tokens} | 0 | 0 |")
    return "\n".join(rows)


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
    depth = parse_draft(request.draft).depth
    rule = rule_for(bundle, request)
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
    """COOL-SD's ``omega_1..omega_L`` at the current sliders, or why they are invalid (empty for other methods)."""
    if method != "COOL-SD":
        return ""
    try:
        omegas = omega_schedule(float(delta), float(nu), "auto" if mu_auto else float(mu), parse_draft(draft).depth,
                                schedule)
    except (ValueError, TypeError) as error:
        return f"*{error}*"
    return "omega: " + ", ".join(f"{w:.2f}" for w in omegas)


def mu_shown(nu, draft: str, schedule: str = "exp") -> float:
    """The value ``mu="auto"`` stands for at the current ``nu`` and draft depth."""
    return resolve_mu(_number("nu", nu), "auto", parse_draft(draft).depth, schedule)


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
    wanted = rule_for(bundle, request).params()
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
            "ar_latency_s": result.ar_seconds}
