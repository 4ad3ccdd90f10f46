"""What the explorer shows of a session's results, independent of Gradio: pictures, the timing table, the
figures, the theory panel, the benchmark's trade-off, and the API's JSON."""

from __future__ import annotations

import base64
import functools
import io
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from ..core.decode import Generation
from ..core.params import Param, clip, counted
from ..core.rules import RULES, AcceptanceRule, ModelTables, build_rule, omega_schedule, param, resolve_mu
from ..core.stats import Round
from ..core.theory import captured_theory, chain_theory, toy_chain, toy_neighbours
from ..core.trees import JacobiWindow, parse_draft
from ..models.bundle import DRAFTER_NAMES, Bundle
from . import frames, plots, series
from .session import DEFAULT_DRAFTER, DRAFTS, Comparison, Request, choice, flag, method_entries

DISPLAY_SCALE = 10
NATIVE_SIZE = 128  # images this large or larger are shown at 1x; smaller ones enlarged DISPLAY_SCALE times
BENCH_FILE = "bench_results.json"  # the benchmark a bundle directory may ship (coolsd.bench --out)


def display_scale(pixels: np.ndarray) -> int:
    """How many times an image is enlarged for display: small ones (under NATIVE_SIZE px) DISPLAY_SCALE times,
    larger ones not at all (native resolution)."""
    return DISPLAY_SCALE if max(pixels.shape[:2]) < NATIVE_SIZE else 1


def enlarge(pixels: np.ndarray, scale: int | None = None) -> Image.Image:
    """Upscale a small image without blur, so each pixel stays a crisp square; a large one stays at 1x."""
    image = Image.fromarray(pixels)
    scale = display_scale(pixels) if scale is None else scale
    if scale == 1:
        return image
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


MARKDOWN_SPECIAL = "\\`*_[]|~$"  # backslash-escaped anywhere; & < > become HTML entities
LINE_START = re.compile(r"^([#+=-]|\d+(?=[.)]))")  # a heading or a list item, were it at the start of a line


def plain(text: str, limit: int = 300) -> str:
    """User text (a prompt, a class name, an error message) as Markdown that shows it literally: on one line,
    clipped, every Markdown and HTML special character escaped, so ``**bold**`` or ``<b>`` is shown as typed."""
    text = clip(" ".join(str(text).split()), limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = "".join(f"\\{c}" if c in MARKDOWN_SPECIAL else c for c in text)
    return LINE_START.sub(lambda match: match.group(0) + "\\" if match.group(0)[0].isdigit() else
                          "\\" + match.group(0), text)


def drafter_shown(request: Request) -> str:
    """The drafter a request's chain or tree drafted with, as the page says it (``EAGLE-3``); empty where none
    drafted (a Jacobi window: the target drafts for itself)."""
    return DRAFTER_NAMES.get(request.drafter, request.drafter)


def with_drafter(label: str, request: Request, drafts: bool = True) -> str:
    """A drafting run's label with the drafter it drafted with: ``COOL-SD (EAGLE-3 drafter)``, or inside the
    label's parentheses (``Eagle-1 (lossless, EAGLE-3 drafter)``); unchanged for a run that drafts nothing (AR)
    or where no drafter drafted."""
    shown = drafter_shown(request)
    if not drafts or not shown:
        return label
    return f"{label[:-1]}, {shown} drafter)" if label.endswith(")") else f"{label} ({shown} drafter)"


def draft_words(request: Request) -> str:
    """The draft in the images' labels, with the drafter where it is not the default one: ``chain:5, EAGLE-3
    drafter`` (the timing table names every drafter)."""
    other = request.drafter and request.drafter != DEFAULT_DRAFTER
    return f"{request.draft}, {drafter_shown(request)} drafter" if other else request.draft


def image_labels(request: Request) -> tuple[str, str]:
    """The two images' labels, each naming the draft it used: the Eagle-1 run drafts with the draft structure
    (and the drafter) even when AR is chosen and that control is hidden."""
    eagle = f"Eagle-1 (lossless, {draft_words(request)})"
    if request.method == "eagle":
        return eagle, eagle
    return (f"{request.label} ({draft_words(request)})" if RULES[request.method].drafts else request.label), eagle


# What each refresh of a Jacobi window does (what Eagle-1's lossless test on it is known as: series.EAGLE_ON_WINDOW).
REFRESH_WORDS = {
    "independent": "redraws them from its new rows each round",
    "coupled": "keeps old drafts where a maximal coupling with its new rows allows",
    "gumbel": "redraws them with the same Gumbel noise per position each round",
}
FRESH_WORDS = {"uniform": "", "point": " (new positions: random tokens, tested as a point mass)"}


def draft_note(draft) -> str:
    """One line under the draft selector saying what the chosen draft is: who drafts, how much, and for a Jacobi
    window what its refresh does and what Eagle-1 on it is known as. Never raises (it follows the selector)."""
    try:
        tree = parse_draft(choice("draft structure", draft, DRAFTS))
    except ValueError as error:
        return f"⚠️ *{plain(str(error))}*"
    if isinstance(tree, JacobiWindow):
        refresh, known_as = REFRESH_WORDS[tree.refresh], series.EAGLE_ON_WINDOW[tree.refresh]
        return (f"**Jacobi window**, no draft model: the target drafts its next {tree.depth} tokens itself and "
                f"{refresh}{FRESH_WORDS[tree.fresh]}. Eagle-1 here is {known_as}.")
    if tree.is_chain:
        return f"**Chain**: the draft model proposes {tree.depth} token{'s' * (tree.depth > 1)} in a row."
    return f"**Tree**: the draft model proposes {tree.size} tokens, {tree.depth} deep, up to {tree.width} per position."


def setting_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


REUSED = ("Eagle-1's image was made earlier with this class, seed, draft, drafter and sampling, and is shown again, "
          "not decoded again (lossless: it would be the same image); the timing table and the race time every run "
          "afresh.")


def caption(bundle: Bundle, request: Request, eagle_reused: bool = False) -> str:
    """The caption above the images: both runs, the method's parameters, the condition and the seed (and that
    Eagle-1's image is an earlier run's, where it is: it appears whole at once while the method decodes)."""
    method, eagle = image_labels(request)
    params = ", ".join(f"{name}={setting_text(value)}" for name, value in request.params)
    condition = (f"Class *{plain(bundle.class_names[request.class_id])}*" if request.class_id is not None
                 else f"Prompt *“{plain(request.prompt)}”*")
    # With AR chosen the draft selector hides (AR drafts nothing), yet Eagle-1 on the right still drafts with its
    # value: say so, and where to change it, rather than name a draft the page does not show.
    hidden_draft = "" if RULES[request.method].drafts else (
        f" (AR drafts nothing: only Eagle-1 used {request.draft}, the Draft structure that a drafting method shows)")
    return (f"Left: **{plain(method)}**{f', {params}' if params else ''}. Right: **{plain(eagle)}**{hidden_draft}. "
            f"{condition}, seed {request.seed}." + (f" {REUSED}" if eagle_reused else ""))


def timing_runs(result: Comparison) -> list[tuple[str, str, object]]:
    """(timing key, row label, statistics) of each run in the table: the method, Eagle-1 unless it is the
    method, and AR unless it is (AR's statistics are implied: one target forward per token). Each drafting run's
    label names its drafter (:func:`with_drafter`); AR's claims none."""
    request = result.request
    runs = [("method", with_drafter(request.label, request, RULES[request.method].drafts), result.method.stats)]
    if request.method != "eagle":
        runs.append(("eagle", with_drafter("Eagle-1 (lossless)", request), result.eagle.stats))
    if request.method != "ar":
        runs.append(("ar", "AR (no drafting)", None))
    return runs


def speed_cells(timing, run: str) -> tuple[str, str]:
    """Latency (ms) and speed-up vs AR of one run: the median, with the min-max range on a second line."""
    if timing is None:  # not started: the figures are drawn first, then the timing step (with its progress bar)
        return "timing follows", "timing follows"
    median, low, high = timing.latency(run)
    latency = f"{1000 * median:.0f}<br><small>{1000 * low:.0f}–{1000 * high:.0f}</small>"
    if run == "ar":
        return latency, "1.00x"
    median, low, high = timing.speedup(run)
    return latency, f"**{median:.2f}x**<br><small>{low:.2f}–{high:.2f}</small>"


def timing_table(result: Comparison) -> str:
    """Markdown: per run, latency and speed-up vs AR (median and range over interleaved repeats, once
    measured) and tau; then, in a second table, forwards and relaxation cost. Two narrow tables, so both fit
    a phone's width."""
    speed = ["| run | latency (ms) | speed-up vs AR | tau |", "|---|---|---|---|"]
    work = ["| run | target forwards | drafter forwards | relaxation cost |", "|---|---|---|---|"]
    timing = result.timing
    for run, label, stats in timing_runs(result):
        latency, speedup = speed_cells(timing, run)
        if stats is None:  # AR: one target forward per token, no drafts, lossless
            speed.append(f"| {label} | {latency} | {speedup} | 1.00 |")
            work.append(f"| {label} | {result.method.stats.tokens} | 0 | 0 |")
        else:
            speed.append(f"| {label} | {latency} | {speedup} | {stats.tau:.2f} |")
            work.append(f"| {label} | {stats.target_forwards} | {stats.drafter_forwards} | "
                        f"{stats.relaxation_cost:.3f} |")
    if timing is None:
        note = ("Latencies are measured next, once the figures are drawn (a progress bar here shows the repeats): "
                "AR, Eagle-1 and this method, interleaved, in this request.")
    else:
        note = (f"Latency: median (min–max) of {timing.repeats} interleaved repeats of AR, Eagle-1 and this method "
                f"in this request, on {timing.device} ({timing.dtype}, {timing.steps} steps, {timing.threads} CPU "
                f"thread{'s' * (timing.threads > 1)}). Speed-up: AR's median "
                "latency / the run's median latency (below it: the lowest and highest per-repeat ratio, which always "
                "hold it; the bench's definition too), " + baseline(timing.steps, timing.device)
                + " tau: tokens per target forward.")
    return "\n".join(speed) + "\n\n" + "\n".join(work) + f"\n\n<small>{note}</small>"


EAGER_BASELINE = ("a CPU AR with compiled steps is faster than eager AR, and speculative decoding gains less "
                  "against it: the benchmark's CPU figures (python -m coolsd.bench, compiled by default) are "
                  "against that fastest AR.")


def baseline(steps: str, device: str) -> str:
    """Which AR a speed-up is measured against: the same steps as every run; on a CPU with eager steps, said to
    be slower than the compiled AR the benchmark compares with."""
    said = f"against AR with the same {steps} steps"
    return f"{said}; {EAGER_BASELINE}" if steps == "eager" and device.startswith("cpu") else f"{said}."


def grid_of(bundle: Bundle) -> tuple[int, int]:
    return bundle.config.grid_height, bundle.config.grid_width


def scheduled(rule: AcceptanceRule) -> bool:
    """Whether the rule has a relaxation schedule omega_d to show: it defines its own ``omega`` (COOL-SD,
    UniformRSD); Eagle-1 and LANTERN++ keep the base class's constant 1."""
    return type(rule).omega is not AcceptanceRule.omega


def figures(bundle: Bundle, result: Comparison, narrow: bool = False) -> dict:
    """Every figure of the results panel (``narrow``: laid out for a phone's panel, about 360 px wide)."""
    label = result.request.label
    runs = [(label, result.method.stats)]
    if result.request.method != "eagle":
        runs.append(("Eagle-1", result.eagle.stats))
    omegas = result.method.stats.omegas if scheduled(result.request.rule) else None
    grid = grid_of(bundle)
    return {
        "per_position": plots.per_position(runs, omegas, narrow=narrow),
        "lengths": plots.accepted_lengths(runs, narrow=narrow),
        "map_method": plots.acceptance_map(result.images["method"], result.method.stats, grid, label,
                                           narrow=narrow),
        "map_eagle": plots.acceptance_map(result.images["eagle"], result.eagle.stats, grid, "Eagle-1 (lossless)",
                                          narrow=narrow),
    }


TAB_WAITING = {"per_position": "the acceptance per draft position", "lengths": "the accepted drafts per round",
               "map_method": "where each token came from", "map_eagle": "where each of Eagle-1's tokens came from",
               "replay_plot": "each round, one at a time"}  # what each figure tab shows once there is a run


def first_figures(bundle: Bundle, result: Comparison | None) -> dict:
    """What the figure tabs show before the first click: the start-up run's figures, or (none made, as on
    ZeroGPU) what to press to see what."""
    if result is None:
        return {name: plots.message(f"Press Generate to see {what}.") for name, what in TAB_WAITING.items()}
    return dict(zip(TAB_WAITING, run_figures(bundle, result)))


def run_figures(bundle: Bundle, result: Comparison, narrow: bool = False, round_index: int = 0) -> list:
    """The run's figures in :data:`TAB_WAITING`'s order: :func:`figures`, then Replay at ``round_index``."""
    figs = figures(bundle, result, narrow)
    return [figs["per_position"], figs["lengths"], figs["map_method"], figs["map_eagle"],
            replay_figure(bundle, result, round_index, narrow)]


Pixels = np.ndarray  # a decoder's picture: uint8, height x width (x 3)


def live_pixels(bundle: Bundle, generation: Generation) -> Pixels:
    """A run's image so far, at the decoder's size (the model's work, small to send on): its tokens decoded, the
    positions not generated yet filled with its first token, an image token, so that a decoder that checks its
    positions accepts them (:func:`live_picture` covers them)."""
    length = bundle.config.image_tokens
    tokens = generation.tokens[:length]
    return bundle.image(tokens + tokens[:1] * (length - len(tokens)))


def live_picture(pixels: Pixels, grid: tuple[int, int], made: int, last: Round | None) -> Image.Image:
    """The live view's picture of a run's image so far (:func:`live_pixels`, ``made`` tokens of it): enlarged,
    the cells not generated yet covered and the last round's tokens coloured (:func:`frames.progress_frame`)."""
    enlarged = frames.rgb_pixels(np.asarray(enlarge(pixels)))
    return Image.fromarray(frames.progress_frame(enlarged, grid, made, last))


Made = tuple[int, int]  # how far a run in progress has got: its tokens, and the target forwards they took


def made_so_far(generation: Generation) -> Made:
    return len(generation.tokens), generation.stats.target_forwards


def live_caption(request: Request, shown: dict[str, Made], length: int, eagle_reused: bool = False) -> str:
    """The caption while both runs are in progress: how far each has got (of ``length`` tokens); Eagle-1's run,
    when it is an earlier one shown again, says so."""
    method, eagle = image_labels(request)

    def progress(label: str, made: Made) -> str:
        return f"**{plain(label)}**: {made[0]} of {counted(length, 'token')}, {counted(made[1], 'target forward')}"

    parts = [progress(method, shown["method"])] if shown.get("method") is not None else []
    if eagle_reused and request.method != "eagle":
        parts.append(f"**{plain(eagle)}**: made earlier for this setting, shown again")
    elif shown.get("eagle") is not None:
        parts.append(progress(eagle, shown["eagle"]))
    return "Generating… " + "; ".join(parts) + f" (seed {request.seed})"


RACE_RUNS = (("ar", "AR"), ("eagle", "Eagle-1"), ("method", None))  # lanes, top to bottom of the table


def race_lanes(result: Comparison) -> list[frames.Lane]:
    """The race's lanes: AR, Eagle-1 and the chosen method (when it is neither), each its timing run of median
    latency with its own image, finishing at the timing table's median latency; each drafting lane with the
    drafter it drafted with (AR's with none)."""
    timing, request = result.timing, result.request
    lanes = []
    for run, name in RACE_RUNS:
        if run not in timing.runs:  # "method" is timed only when it is neither AR nor Eagle-1
            continue
        generation = timing.runs[run]
        pixels = np.asarray(enlarge(timing.images[run]))  # made with the timing (on ZeroGPU, in its worker)
        drafts = run == "eagle" or (run == "method" and RULES[request.method].drafts)
        lanes.append(frames.Lane(name or request.label, frames.rgb_pixels(pixels), generation.stats,
                                 timing.latency(run)[0], drafter_shown(request) if drafts else ""))
    return lanes


def replay_figure(bundle: Bundle, result: Comparison, round_index: int, narrow: bool = False):
    """One round of the chosen method: the image with the round's tokens, and the tree it drafted."""
    return plots.replay(result.images["method"], result.method.stats, grid_of(bundle), round_index, narrow=narrow)


TOY_VOCAB = 64  # tokens of the toy distributions: LANTERN++'s largest k (50) needs 51 neighbours of each token
TOY_SEED = Param("toy_seed", 0, 2**31 - 1, 0, 1, "toy seed", integer=True)
TOY_DIM = 8  # the toy tokens' embedding size


def toy_embeddings(vocab: int, seed: int, dim: int = TOY_DIM) -> torch.Tensor:
    """GSD's embedding table for the toy tokens: random unit vectors from ``seed``, in a stream of their own (apart
    from the pairs' and LANTERN++'s neighbours'), scaled by 0.6 so that GSD's default squared distance (0.5)
    groups a token with a few of its nearest tokens rather than with none (two random unit vectors in 8
    dimensions are about 2 apart squared)."""
    codes = np.random.default_rng([seed, 2]).standard_normal((vocab, dim))
    return torch.from_numpy(0.6 * codes / np.linalg.norm(codes, axis=1, keepdims=True))


def toy_tables(vocab: int, seed: int) -> ModelTables:
    """What the rules read from a model, for the toy tokens: LANTERN++'s neighbours and GSD's embeddings."""
    table = toy_embeddings(vocab, seed)
    return ModelTables(toy_neighbours(vocab, seed), lambda: table)


def toy_case(request: Request, toy_seed: int) -> tuple[dict, str]:
    """The theory table on toy pairs, the rule built for them: LANTERN++ and GSD get the toy tokens' own tables."""
    depth = request.tree.depth
    p, q = toy_chain(vocab=TOY_VOCAB, length=depth, seed=toy_seed)
    rule = build_rule(request.method, request.param_dict, depth, toy_tables(TOY_VOCAB, toy_seed))
    return chain_theory(p, q, rule), (f"toy: Dirichlet(0.5) target/draft pairs over {TOY_VOCAB} tokens (seed "
                                      f"{toy_seed}; LANTERN++'s neighbours: random code vectors, by L2 distance; "
                                      f"GSD's embeddings: other random vectors of length 0.6)")


def captured_case(capture_bundle: Bundle, result: Comparison, request: Request) -> tuple[dict, str]:
    """The theory table on the pairs the last Eagle-1 run captured, the rule built for the model that made
    them (LANTERN++'s neighbours are that model's codes), whichever model is selected now."""
    depth, made = request.tree.depth, result.request
    rule = build_rule(request.method, request.param_dict, depth, capture_bundle)
    table = captured_theory(result.eagle.stats.captured, rule, depth)
    counts = ", ".join(str(n) for n in table["pairs"])
    note = (f"{len(result.eagle.stats.captured)} (p, q) pairs captured along the last Eagle-1 run (seed "
            f"{made.seed}, {made.draft}; per position: {counts}); each evaluated exactly under the current rule, "
            "then averaged per position")
    if made.model != request.model:
        note += f"; made with model {plain(made.model)}, not the selected model {plain(request.model)}"
    return table, note


def theory_panel(result: Comparison | None, request: Request, source: str, toy_seed: int = 0,
                 capture_bundle: Bundle | None = None, narrow: bool = False):
    """Exact beta_i, e_i, E[N] and TV bound under the current sliders (spec section 4), for the (p, q) pairs
    captured along the last Eagle-1 run by ``capture_bundle`` (each pair evaluated exactly, averaged per
    position) or for random toy pairs (also when nothing is generated yet). Returns (figure, table, notes);
    the figure draws omega_i only for a rule with a schedule."""
    if request.method == "ar":
        raise ValueError("AR drafts nothing: choose a speculative method to see its theory")
    notes = []
    if source == "toy" or result is None or capture_bundle is None:
        if source != "toy":
            notes.append(("Nothing generated yet", "these are toy distributions; Generate to see your image's pairs"))
        table, note = toy_case(request, TOY_SEED.check(toy_seed))
    else:
        table, note = captured_case(capture_bundle, result, request)
    notes.append(("Source", note))
    if request.tree.size > request.tree.depth:
        notes.append(("A chain, not the tree", f"{request.draft} is a tree, but these are the numbers of a chain of "
                      f"its depth ({request.tree.depth}), one candidate per position; a tree's siblings give a "
                      "rejected position more tries, so it accepts more"))
    shown = table if scheduled(request.rule) else {**table, "omega": None}
    return plots.theory(shown, request.label, narrow=narrow), table, notes


def omega_line(method: str, delta, nu, mu_auto, mu, draft: str, schedule: str) -> str:
    """COOL-SD's ``mu`` (computed, under auto) and ``omega_1..omega_L`` at the current sliders, or why they are
    invalid (empty for other methods). Never raises: it runs on every slider move."""
    if not isinstance(method, str) or method_entries().get(method, ("",))[0] != "cool":
        return ""
    try:
        auto = flag("mu auto", mu_auto)
        depth = parse_draft(choice("draft structure", draft, DRAFTS)).depth
        schedule = param("schedule").check(schedule)
        nu, mu = param("nu").check(nu), "auto" if auto else param("mu").check(mu)
        omegas = omega_schedule(param("delta").check(delta), nu, mu, depth, schedule)
        mu_value = resolve_mu(nu, mu, depth, schedule)
    except ValueError as error:
        return f"⚠️ *{plain(str(error), 600)}*"
    mu_text = f"μ = {mu_value:.4g} (auto: mean ω = δ)" if auto else f"μ = {mu_value:.4g}"
    return f"{mu_text}; ω_1..ω_{depth}: " + ", ".join(f"{w:.2f}" for w in omegas)


def theory_markdown(table: dict, notes: list[tuple[str, str]], schedule: bool = True, label: str = "") -> str:
    """The theory panel's text: whose theory (``label``: the figure's title is a picture), E[N], the TV bound,
    the notes (Markdown: their user text already escaped), and the table per position (with ``omega_i`` only for
    a rule that has a schedule)."""
    omega = ["omega_i"] if schedule else []
    rows = ["| " + " | ".join(["position i", *omega, "beta_i", "e_i", "P(reach i)"]) + " |",
            "|---" * (4 + len(omega)) + "|"]
    for d, w, b, e, r in zip(table["depth"], table["omega"], table["beta"], table["cost"], table["reach"]):
        rows.append("| " + " | ".join([str(d), *([f"{w:.3f}"] if schedule else []), f"{b:.4f}", f"{e:.4f}",
                                       f"{r:.4f}"]) + " |")
    said = "".join(f"*{label}:* {note}.\n\n" for label, note in notes)
    whose = f"{plain(label)}: " if label else ""
    return (f"{whose}E[N] = **{table['expected_accepted']:.3f}** accepted drafts per round "
            f"(**{table['expected_tokens']:.3f}** tokens per target forward); TV bound per round = "
            f"**{table['tv_bound']:.4f}**.\n\n{said}" + "\n".join(rows))


def load_bench(bundle: Bundle) -> dict:
    """The benchmark shipped in the bundle's directory, if any (read once per bundle)."""
    return _read_bench(bundle.path / BENCH_FILE) if bundle.path is not None else {}


@functools.cache
def _read_bench(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def shape_words(shape: dict | None) -> str:
    """A target's shape as a reader says it: ``32 layers of width 96``."""
    return f"{shape['n_layer']} layers of width {shape['dim']}" if shape else "another shape"


def other_model(bundle: Bundle, bench: dict) -> str | None:
    """Why the shipped benchmark's points are not this model's (another name, or the same name with other weights:
    a retrained model whose study has not been rerun), or None when they are."""
    if bench.get("model") != bundle.name:
        return f"model {bench.get('model')!r}, not {bundle.name!r}"
    recorded, loaded = bench.get("target_sha256"), bundle.weights_digest()
    if recorded and loaded and recorded != loaded:
        return (f"an earlier model {bundle.name!r} ({shape_words(bench.get('model_shape'))}), not the one loaded "
                f"({shape_words(bundle.config.to_dict())})")
    return None


def measured_run(bundle: Bundle, request: Request) -> dict | None:
    """The benchmark run made with exactly this setting: same model (and weights), sampling, draft and rule
    parameters (defaults filled in), or None when the benchmark did not measure it."""
    bench = load_bench(bundle)
    if other_model(bundle, bench) or bench.get("sampling") != request.sampling.to_dict():
        return None
    wanted = request.rule.params()
    for run in bench.get("runs", []):
        if run["method"] != request.method:
            continue
        drafts = RULES[request.method].drafts
        if drafts and (run["draft"] != request.draft or not same_drafter(run, request)):
            continue
        depth = parse_draft(run["draft"]).depth if drafts else 0
        if build_rule(run["method"], run["params"], depth, bundle).params() == wanted:
            return run
    return None


def same_drafter(run: dict, request: Request) -> bool:
    """Whether a benchmark run drafted with the request's drafter (a run that records none, made before the
    benchmark recorded drafters, drafted with Eagle-1's; a Jacobi window's with none)."""
    if not parse_draft(run["draft"]).needs_drafter:
        return True
    return (run.get("drafter") or DEFAULT_DRAFTER) == (request.drafter or DEFAULT_DRAFTER)


def measured_point(bundle: Bundle, request: Request, metric: str) -> tuple[float, float] | None:
    """``(tau, metric)`` of the benchmark run made with exactly this setting (see :func:`measured_run`)."""
    run = measured_run(bundle, request)
    return (run["tau"], run[metric]) if run is not None and run.get(metric) is not None else None


def default_metric(bundle: Bundle) -> str:
    """The quality axis the Trade-off tab starts on: the study's quietest measure, else judge-FID."""
    return plots.quietest_measure(load_bench(bundle)) or "fid"


def tradeoff_families(bundle: Bundle) -> tuple[dict[str, str], list[str]]:
    """The series the Trade-off tab can draw (display name -> key) and those it draws by default."""
    runs = load_bench(bundle).get("runs", [])
    study = plots.is_study(runs)
    return plots.family_choices(runs, study), plots.default_families(runs, study)


def setting_name(request: Request) -> str:
    """The current setting in the figures' words, e.g. ``COOL-SD (μ=auto, ν=0.7, exp), δ=2.5, chain:5``."""
    run = {"method": request.method, "params": request.param_dict}
    parts = [series.family_name(run)] + [series.point_label(run)] * bool(series.swept(request.method))
    return ", ".join(parts + [draft_words(request)] * RULES[request.method].drafts)


def off_grid(bundle: Bundle, request: Request) -> str:
    """Why the benchmark did not measure this setting: another model, other sampling, or a setting off its grid."""
    bench = load_bench(bundle)
    kind = "study" if plots.is_study(bench.get("runs", [])) else "benchmark"
    other = other_model(bundle, bench)
    if other:
        return f"the shipped {kind} was made with {other}"
    ran, now = bench.get("sampling") or {}, request.sampling.to_dict()
    changed = [f"{key} {now.get(key)} ({kind}: {ran.get(key)})" for key in sorted(set(ran) | set(now))
               if ran.get(key) != now.get(key)]
    if changed:
        return f"the current sampling is not the {kind}'s: {', '.join(changed)}"
    return f"the current setting ({setting_name(request)}) is not on the {kind}'s grid"


def _star(bundle: Bundle, result: Comparison | None, metric: str, study: bool) -> tuple[tuple | None, str]:
    """The current setting's point in the figure's coordinates, or None and why it has no star."""
    if result is None:
        return None, ""
    request = result.request
    run = measured_run(bundle, request)
    if run is None:
        return None, off_grid(bundle, request) + ": no star."
    value = (plots.study_difference(run, metric) or {}).get("value") if study else run.get(metric)
    if value is None:
        measure = plots.METRIC_LABELS.get(metric, metric).split(" (")[0]
        return None, f"the benchmark did not record {measure} for the current setting: no star."
    if study and request.method == "ar":
        return None, "AR (no drafting) is the study's noise floor: the grey band, not a point."
    return ((run["draft"], run["tau"], value) if study else (run["tau"], value)), ""


def tradeoff_panel(bundle: Bundle, result: Comparison | None, metric: str | None = None,
                   families: Sequence[str] | None = None, narrow: bool = False) -> tuple[Figure | None, str]:
    """The Trade-off tab: the shipped benchmark's quality/speed figure and a note for the text beside it (empty
    when there is nothing to say). A study (every run compared with Eagle-1 on the same images) shows each
    run's difference from Eagle-1 with its paired interval over the measured noise floor, one panel per draft;
    the current setting is starred when the study measured it, and the note says why when it did not.
    ``metric`` None: :func:`default_metric`; ``families``: keys of :func:`tradeoff_families`."""
    bench = load_bench(bundle)
    runs = bench.get("runs", [])
    if not runs:
        return None, f"this model ({bundle.name}) has no shipped study: no {BENCH_FILE} beside its weights."
    study = plots.is_study(runs)
    metric = metric or default_metric(bundle)
    current, note = _star(bundle, result, metric, study)
    other = other_model(bundle, bench)
    if other and bench.get("model") == bundle.name:  # a retrained model: say so, with or without a generation
        note = (f"These points were measured on {other}; the study has not been rerun on this model yet"
                + (": no star for the current setting." if result else "."))
    try:
        if study:
            return plots.study_quality(bench, metric, current, families=families, narrow=narrow), note
        return plots.tradeoff(runs, current, y_key=metric, families=families, narrow=narrow), note
    except ValueError as error:
        return None, str(error)


def tradeoff_figure(bundle: Bundle, result: Comparison | None, metric: str | None = None,
                    families: Sequence[str] | None = None, narrow: bool = False) -> Figure | None:
    """:func:`tradeoff_panel`'s figure alone, for a caller that shows no note."""
    return tradeoff_panel(bundle, result, metric, families, narrow)[0]


def png_base64(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def api_run(generation: Generation, pixels: np.ndarray, drafter: str | None = None) -> dict:
    """One image for API users: PNG base64 and raw pixels, the tokens, and the statistics, with the drafter its
    chain or tree drafted with (None where none drafted)."""
    return {"tokens": generation.tokens, "pixels": pixels.tolist(), "png_base64": png_base64(pixels),
            "stats": {**generation.stats.to_dict(rounds=False), "drafter": drafter}}


def run_drafters(request: Request) -> dict[str, str | None]:
    """The drafter of each image of a comparison: Eagle-1's drafts with the request's drafter, the method's too
    unless it drafts nothing (AR)."""
    drafter = request.drafter or None
    return {"method": drafter if RULES[request.method].drafts else None, "eagle": drafter}


def api_payload(result: Comparison) -> dict:
    """JSON for API users: both images, and the latencies when they were measured."""
    drafters = run_drafters(result.request)
    return {"method": api_run(result.method, result.images["method"], drafters["method"]),
            "eagle": api_run(result.eagle, result.images["eagle"], drafters["eagle"]),
            "timing": result.timing.to_dict() if result.timing is not None else None}


def api_batch_payload(results: list[Comparison]) -> dict:
    """JSON for a batch of seeds: per seed, both images; the batch size and each method's seconds for all of
    them (each image of a batch waits for the whole batch)."""
    first, drafters = results[0], run_drafters(results[0].request)
    return {"batch": len(results),
            "seconds": {"method": first.method.stats.seconds["total"], "eagle": first.eagle.stats.seconds["total"]},
            "images": [{"seed": result.request.seed,
                        "method": api_run(result.method, result.images["method"], drafters["method"]),
                        "eagle": api_run(result.eagle, result.images["eagle"], drafters["eagle"])}
                       for result in results]}
