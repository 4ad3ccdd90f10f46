"""coolsd explorer: relaxed speculative decoding (COOL-SD and friends) next to lossless Eagle-1.

Run ``python app.py`` and open http://127.0.0.1:7860. The UI lives here; everything it computes lives in
``coolsd/app/``. ``COOLSD_THREADS`` sets torch's CPU threads (default 1, the fastest measured for the
shipped model; concurrent requests then use one core each).
"""

import ctypes
import time

STARTED = time.perf_counter()


def say(message: str) -> None:
    """Start-up progress on the console, so a slow start is visible and attributable."""
    print(f"coolsd [{time.perf_counter() - STARTED:5.1f}s] {message}", flush=True)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own heap ("arena") and seldom returns freed memory, so a
    server whose requests run on a pool of threads grows with the pool (measured, 4 clients: 597 -> 653 MB
    from 20 to 100 UI generations with glibc's default, 527 -> 534 MB from 20 to 60 with 2 arenas). No-op off
    glibc."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # -8 = M_ARENA_MAX
    except (OSError, AttributeError):
        pass


limit_malloc_arenas()  # before any worker thread exists
say("importing gradio and torch")
import dataclasses  # noqa: E402
import functools
import inspect
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypedDict  # noqa: E402

import gradio as gr  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from coolsd.app import frames, models, session, tour, views  # noqa: E402
from coolsd.app.controls import (  # noqa: E402
    OMEGA_LINE,
    control_defaults,
    corrected,
    drafting_labels,
    method_boxes,
    slider_start,
    word_label,
)
from coolsd.core.params import PARAMS, Choice, Param, check, clip, shorten  # noqa: E402
from coolsd.core.rules import schema  # noqa: E402
from coolsd.models.bundle import Bundle, load_bundle, random_bundle, set_threads  # noqa: E402
from coolsd.models.registry import EXAMPLE_PROMPTS  # noqa: E402

try:  # Hugging Face ZeroGPU: the GPU is attached only inside functions wrapped by spaces.GPU
    import spaces
except ImportError:
    spaces = None

log = logging.getLogger("coolsd.app")


def load_model():
    """The shipped default model, or ``COOLSD_MODEL`` (a bundle directory, or ``random:tiny|small``)."""
    choice = os.environ.get("COOLSD_MODEL", "")
    if choice.startswith("random:"):
        return random_bundle(choice.split(":", 1)[1])
    return load_bundle(choice or None)


THREADS = set_threads()
say(f"loading the model ({THREADS} torch thread{'s' * (THREADS > 1)}; set COOLSD_THREADS to change)")
BUNDLE = session.fast_steps(load_model(), zero_gpu=spaces is not None)  # CUDA graphs on a dedicated GPU
if spaces is None:  # on ZeroGPU, CUDA work may only run inside spaces.GPU functions
    say("warming up")
    session.warm_up(BUNDLE)
# the selector's models: the default now, the others loaded on first use
MODELS = models.Models(BUNDLE, lambda key: session.fast_steps(load_bundle(key), zero_gpu=spaces is not None))


DEFAULT_METHOD = "COOL-SD"
QUALITY_AXES = [("judge-FID (lower is better)", "fid"), ("class consistency", "judge_accuracy"),
                ("log-likelihood per token (the target's own score)", "log_likelihood_per_token")]
PRIVATE = {"api_visibility": "private"}  # UI callbacks: not part of the API (only /generate and /generate_batch are)
PAPER = {"method": "COOL-SD", "nu": 0.7, "mu_auto": True, "schedule": "exp"}  # the paper's COOL-SD; any draft
PRESETS = {  # button -> the control values it sets: every one the setting depends on (the draft stays the user's)
    "Paper: COOL-SD δ=1.1": {**PAPER, "delta": 1.1},
    "Paper: COOL-SD δ=2": {**PAPER, "delta": 2.0},
}
LATEST = session.Latest()  # each browser session's newest generation: older ones' timing and figures are dropped
TOUR_FACTS = tour.study_facts(tour.read_study())  # the numbers the guided tour cites, read from the study now


def model_defaults(bundle: Bundle) -> dict[str, Any]:
    """A model's own starting values: its default class (the second, as before) and its sampling settings."""
    names, sampling = bundle.class_names, bundle.sampling
    return {"class_name": names[1] if len(names) > 1 else (names[0] if names else None),
            "cfg_scale": sampling.cfg_scale, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p}


def defaults(bundle: Bundle | None = None) -> dict[str, Any]:
    """Every control's starting (and Reset) value by value name (``session.value_names``), read from the rule
    registry now; class, sampling and draft from ``bundle`` (default: the default model's)."""
    values: dict[str, Any] = {"method": DEFAULT_METHOD}
    for control in session.method_controls():
        values.update(control_defaults(control))
    bundle = bundle or BUNDLE
    return {**values, "draft": session.default_draft(bundle), "seed": 0, **model_defaults(bundle),
            "model": models.DEFAULT, "prompt": EXAMPLE_PROMPTS[0]}


DEFAULTS = defaults()


INTRO = """
# coolsd: watch speculative decoding generate an image
A small **draft** model proposes the next few image tokens; the big **target** model checks them all in
one forward pass and keeps a prefix. *Lossless* Eagle-1 accepts a draft `y` with probability
`min(1, p(y)/q(y))`, so the image has exactly the target's distribution. *Relaxed* methods accept more
(faster) at a measured distortion: **COOL-SD** multiplies the ratio by `omega_i = delta * exp(-nu*i - mu)`,
relaxing early draft positions more than late ones, and resamples rejections from the optimal residual `G*`.
A **Jacobi window** (`jacobi:16`, ...) needs no draft model: the target drafts its own next tokens from its
last forward (Eagle-1 on it is SJD; on `jacobi:16:coupled`, SCD), and every method runs on it.
Pick a method, move the sliders, and compare with the lossless image on the right.
"""
METHOD_NOTES = """
| method | accept draft `y` at position `i` with probability | after a rejection, sample from |
|---|---|---|
| AR | (no drafts: one target forward per token) | `p` |
| Eagle-1 | `min(1, p(y)/q(y))` | `Norm([p - q]_+)` (exact: the target's distribution) |
| UniformRSD | `min(1, delta * p(y)/q(y))` | `G* = Norm([p - q f]_+)` |
| COOL-SD | `min(1, omega_i * p(y)/q(y))`, `omega_i = delta * exp(-nu*i - mu)` | `G*` |
| LANTERN++ | `min(1, p~(y)/q(y))`, `p~(y) = p(y) + ` mass of up to `k` nearest codes, `p~ <= lambda * p` | heuristic: clear `q` near `y`, then `Norm([p - q]_+)` |
| LANTERN++ with G* | the same | `G*` |
| GSD | `min(1, p(G)/q(G))`, `G`: tokens within `ranks` ranks of `y` in `p`'s order, `p` within `gap` of `p(y)`, embeddings within `dist` | `Norm([p - q]_+)` |
| GSD with G* | the same | `G*` |

*mean accepted length* `tau` = image tokens / target forward passes (AR: 1). *Relaxation cost* sums, over
the tested drafts, the total-variation distance that step adds (`e = sum [q f - p]_+`); it is 0 for lossless
decoding. `mu = auto` makes the mean of `omega_1..omega_L` equal `delta`, so COOL-SD and UniformRSD at the same
`delta` spend the same total relaxation.

The trade-off figure shows the shipped study: each setting's quality minus Eagle-1's with its paired 95% interval.
The grey band is the study's measured noise floor (AR minus Eagle-1 on the same images: both sample the target).
"""


def unchecked(component: gr.components.Component) -> gr.components.Component:
    """``component`` (a slider or number box) passing a typed value on as it is, for our schema to check
    (``Param.check``: one message that names the parameter): Gradio's own check raises an unnamed range error
    once per event that reads the control. (A subclass would do the same, but Gradio writes a ``.pyi`` file
    next to the module of every component subclass.) Gradio rebuilds a component whose properties a handler
    updates (a range, its visibility): :meth:`Explorer.postprocess_data` marks the rebuilt one again."""
    component.preprocess = lambda payload: payload
    component.unchecked = True
    return component


def slider(param: Param, **kwargs) -> gr.Slider:
    """A slider whose range, step, default and label come from the parameter's one definition (the rule
    registry or ``coolsd.core.params``), which the API and the command line check too."""
    maximum = kwargs.pop("maximum", param.high)
    return unchecked(gr.Slider(param.low, maximum, **{"value": slider_start(param, maximum), "step": param.step,
                                                      "label": param.label, **kwargs}))


def checked(compute):
    """Run ``compute``; bad input becomes a readable error in the UI, never a stack trace; a rejected request
    is one line in the log."""
    try:
        return compute()
    except gr.Error:
        raise
    except ValueError as error:
        log.info("rejected request: %s", clip(str(error), 300))
        raise gr.Error(str(error), title="Invalid setting", print_exception=False) from None
    except Exception as error:  # keep the server up and say what happened
        log.exception("request failed")
        raise gr.Error(f"Generation failed: {type(error).__name__}: {clip(str(error), 200)}", title="Error",
                       print_exception=False) from None


def parse(values, progress=None, load: bool = True) -> tuple[Bundle, session.Request]:
    """Validate the control values (``session.value_names`` order) into the chosen model (loaded on first use,
    unless ``load`` is False) and a ``session.Request`` (a readable error otherwise)."""
    names = session.value_names()
    if len(values) != len(names):  # parse_controls says what is wrong
        return BUNDLE, checked(lambda: session.parse_controls(BUNDLE, values))
    named = dict(zip(names, values))
    bundle = checked(lambda: MODELS.get(named["model"], progress, load=load))
    named["model"] = MODELS.key(named["model"])
    for name, param in ranged_params().items():  # typed out of range: its own event warned and set it back
        fix = corrected(param, named[name], bundle.config.vocab_size if name == "top_k" else None) \
            if name in named else None
        if fix is not None:
            named[name] = fix[0]
    return bundle, checked(lambda: session.parse_controls(bundle, list(named.values())))


def bundle_of(request: session.Request) -> Bundle:
    """The model a validated request was made for (already loaded)."""
    return MODELS.get(request.model)


def session_of(request: gr.Request | None) -> str | None:
    """The browser session an event came from (None for a direct call, which is never stale)."""
    return getattr(request, "session_hash", None)


def with_progress(callback: Callable, session: bool = False) -> Callable:
    """``callback(*values, progress=...)`` (and ``session=`` the browser session, if asked) as Gradio must see
    it to pass them: positional parameters annotated ``gr.Request`` and defaulting to ``gr.Progress()`` (Gradio
    stops looking at ``*values``); same name, for its API."""
    def run(request: gr.Request, progress=gr.Progress(), *values):
        extra = {"session": session_of(request)} if session else {}
        return callback(*values, progress=progress, **extra)

    def stream(request: gr.Request, progress=gr.Progress(), *values):  # noqa: B008 (as run's: Gradio's marker)
        yield from run(request, progress, *values)

    wrapped = stream if inspect.isgeneratorfunction(callback) else run
    wrapped.__name__ = callback.__name__
    return wrapped


def on_check(*values) -> None:
    """Generate's first step: validate the setting, loading no model. It has no outputs, so a refused setting is
    one toast and the last result stays on the page, whole."""
    parse(values, load=False)


class Replaced(Exception):
    """Raised in a generation's live view once a newer click of its browser session has replaced it."""


# The generations whose pictures are streamed while they run (a few long-lived threads: a thread per request
# would give the allocator a new arena each time).
LIVE_RUNS = ThreadPoolExecutor(2, thread_name_prefix="live")
LIVE_INTERVAL = session.LIVE_INTERVAL


def on_generate(*values, progress=None, session: str | None = None):
    """The Generate button: validate, then run both images while showing them drawn round by round (at most
    every ``session.LIVE_INTERVAL`` seconds; figures and timings follow). The result is the session's newest
    from the click on (:data:`LATEST`): an older request still running is stale."""
    bundle, request = parse(values, progress)
    serial = LATEST.claim(session)
    started = time.perf_counter()
    shown: dict = {}

    def live(run: str, generation) -> None:
        if not LATEST.current(session, serial):  # a newer click: stop decoding this one (its runs end here)
            raise Replaced
        shown[run] = generation

    running = LIVE_RUNS.submit(run_comparison, request, None, None if spaces is not None else live)
    drawn: dict = {}
    length = bundle.config.image_tokens
    method_label, eagle_label = views.image_labels(request)
    while not wait([running], timeout=LIVE_INTERVAL).done:
        fresh = {run: generation for run, generation in list(shown.items()) if drawn.get(run) is not generation}
        if not fresh or not LATEST.current(session, serial):
            continue
        drawn.update(fresh)
        if progress is not None and "method" in drawn:
            progress(len(drawn["method"].tokens) / length, desc=f"Generating with {request.label}")
        pictures = {run: views.live_picture(bundle, generation) for run, generation in fresh.items()}
        yield (pictures.get("method", gr.skip()), pictures.get("eagle", gr.skip()), gr.skip(),
               views.live_caption(request, drawn, length), gr.skip(), gr.skip())
    if not LATEST.current(session, serial):
        log.info("generate %s seed=%d: stopped after %.2fs, a newer click replaced it", request.label, request.seed,
                 time.perf_counter() - started)
        yield tuple(gr.skip() for _ in range(6))  # the newer click's images are (or will be) on the page
        return
    result = checked(running.result)
    result.serial = serial
    condition = f"class={request.class_id}" if request.class_id is not None else f"prompt={clip(request.prompt, 60)!r}"
    log.info("generate %s model=%s %s seed=%d: %.2fs", request.label, request.model, condition, request.seed,
             time.perf_counter() - started)
    rounds = len(result.method.stats.rounds)
    yield (gr.update(value=views.enlarge(result.images["method"]), label=method_label),
           gr.update(value=views.enlarge(result.images["eagle"]), label=eagle_label), views.timing_table(result),
           views.caption(bundle, request), gr.update(maximum=max(1, rounds - 1), value=0), result)


def stale(result, request: gr.Request | None) -> bool:
    """Whether a newer generation of the same browser session has replaced ``result`` (or there is none)."""
    return result is None or not LATEST.current(session_of(request), result.serial)


def on_figures(result, metric, families=None, narrow=False, request: gr.Request | None = None):
    """Every figure of the last generation (drawn after the images are on screen; ``narrow``: laid out for a
    phone), unless a newer one of the session has replaced it meanwhile."""
    if stale(result, request):
        return [gr.skip()] * 9
    bundle, narrow = bundle_of(result.request), bool(narrow)
    figs = views.figures(bundle, result, narrow)
    theory_fig, theory_md = theory_outputs(result, result.request, "last generation", 0, narrow)
    return (figs["per_position"], figs["lengths"], figs["map_method"], figs["map_eagle"],
            views.replay_figure(bundle, result, 0, narrow), theory_fig, theory_md,
            *tradeoff_outputs(bundle, result, metric, families, narrow))


def on_timing(result, request: gr.Request | None = None, progress=None):
    """Latencies of AR, Eagle-1 and the chosen method, measured now in interleaved repeats (after the images
    and figures, so that nobody waits for them to see a picture), with a progress bar. They belong to
    ``result``'s request: when a newer generation of the session replaces it, before or during the measurement,
    the measurement stops and nothing is shown; the ``result`` state keeps the newer one."""
    def replaced() -> bool:
        return stale(result, request)

    if replaced() or result.timing is not None:
        return gr.skip(), gr.skip()
    started = time.perf_counter()
    local = spaces is None  # ZeroGPU: arguments are pickled
    timing = checked(lambda: measure(result.request, stop=replaced if local else None,
                                     progress=progress if local else None))
    dropped = timing is None or replaced()
    log.info("timing %s seed=%d: %.2fs%s", result.request.label, result.request.seed, time.perf_counter() - started,
             " (dropped: a newer generation replaced it)" if dropped else "")
    if dropped:
        return gr.skip(), gr.skip()
    timed = dataclasses.replace(result, timing=timing)
    return views.timing_table(timed), timed


def on_timing_with_progress(result, request: gr.Request, progress=gr.Progress()):  # noqa: B008 (Gradio's marker)
    """:func:`on_timing` as Gradio must see it to pass the request and a progress bar."""
    return on_timing(result, request, progress)


def run_comparison(request, progress, live=None):
    return session.compare(bundle_of(request), request, progress, live)


def run_batch(request, seeds: list[int]):
    return session.compare_batch(bundle_of(request), request, seeds)


def measure(request, repeats: int = session.TIMING_REPEATS, stop: Callable[[], bool] | None = None, progress=None):
    return session.measure_speed(bundle_of(request), request, repeats, stop, progress)


if spaces is not None:
    run_comparison = spaces.GPU(duration=60)(run_comparison)
    run_batch = spaces.GPU(duration=60)(run_batch)
    measure = spaces.GPU(duration=60)(measure)


RACE_WAITING = "The race starts once the timing run has measured every round of AR, Eagle-1 and this method."


def on_race(result, request: gr.Request | None = None):
    """The race: AR, Eagle-1 and the chosen method replayed side by side on one clock, each round ending at its
    measured time, all slowed by one factor so that the slowest takes ``frames.RACE_SECONDS`` (at most
    ``frames.FRAMES_PER_SECOND`` pictures a second). A newer generation of the session stops it."""
    if result is None or result.timing is None or not result.timing.runs:
        yield gr.skip(), RACE_WAITING
        return
    if stale(result, request):
        return
    bundle = bundle_of(result.request)
    lanes = views.race_lanes(bundle, result)
    factor, grid = frames.slowdown(lanes), views.grid_of(bundle)
    began = time.perf_counter()
    for clock in frames.race_clocks(lanes, factor):
        if stale(result, request):
            return
        time.sleep(max(0.0, began + clock * factor - time.perf_counter()))
        table = frames.race_table(lanes, clock, factor)
        finished = all(clock >= lane.finish for lane in lanes)
        yield (gr.update(value=frames.race_frame(lanes, grid, clock), visible=True),
               (frames.race_verdict(lanes) + "\n\n" if finished else "") + table)


def theory_outputs(result, request, source, toy_seed, narrow=False):
    """Figure and table of the theory panel, or (an empty figure, why) where it does not apply. Errors are
    shown in the panel: it follows every slider move, and a toast per move would bury the user. Captured pairs
    are evaluated with the rule of the model that made them."""
    if request.method == "ar":
        return None, "AR drafts nothing: choose a speculative method to see its theory."
    capture = MODELS.peek(result.request.model) if result is not None else None
    try:
        figure, table, notes = views.theory_panel(
            result, request, "toy" if source == "toy distributions" else "captured", toy_seed, capture, bool(narrow))
    except ValueError as error:
        return None, f"⚠️ {views.plain(str(error), 600)}"
    return figure, views.theory_markdown(table, notes, views.scheduled(request.rule))


def on_theory(result, *values):
    """Recompute the theory panel when a slider moves (no new generation). ``values``: the controls
    (``session.value_names`` order), then the (p, q) source, the toy seed and whether the page is narrow."""
    *controls, source, toy_seed, narrow = values
    names = session.value_names()
    bundle = MODELS.peek(controls[names.index("model")]) if len(controls) == len(names) else BUNDLE
    if bundle is None:  # a model not loaded yet: the panel follows once it is
        return None, "Choose a model and generate first."
    try:
        request = session.parse_controls(bundle, controls)
    except ValueError as error:
        return None, f"⚠️ {views.plain(str(error), 600)}"
    return theory_outputs(result, request, source, toy_seed, narrow)


def on_method(method):
    """Show only the controls that apply to ``method``: one switch per box of ``method_boxes``, then the draft
    structure."""
    return [gr.update(visible=method in labels) for labels, _ in method_boxes()] + \
        [gr.update(visible=method in drafting_labels())]  # the draft selector and its note


def on_word(ticked):
    """A word's checkbox (such as "auto") hides its slider while ticked."""
    return gr.update(visible=not ticked)


def on_mu_auto(mu_auto, nu, draft, schedule):
    """"μ auto" hides the μ slider (the value it stands for is shown under the sliders); turning it off starts
    the slider at that value, clipped to the slider's range."""
    if mu_auto:
        return gr.update(visible=False)
    try:
        value = session.auto_mu(nu, draft, schedule)
    except ValueError:
        return gr.update(visible=True)
    param = schema("mu")
    return gr.update(visible=True, value=round(min(max(value, param.low), param.high), 2))


def on_round(result, round_index):
    """A typed Round: outside the last generation's rounds, one warning and the nearest round, as for every
    other typed number (:func:`on_range`)."""
    rounds = len(result.method.stats.rounds) if result is not None else 2
    return on_range(Param("round", 0, max(1, rounds - 1), 0, 1, "Round", integer=True))(round_index)


def on_replay(result, round_index, narrow=False):
    if result is None:
        return gr.skip()
    try:
        index = int(round_index)
    except (TypeError, ValueError):
        return gr.skip()
    return views.replay_figure(bundle_of(result.request), result, index, bool(narrow))


def on_play(result):
    """Step through every round (a short animation); the slider's change event draws each frame."""
    if result is None:
        raise gr.Error("Generate an image first.", title="Nothing to replay", print_exception=False)
    for index in range(len(result.method.stats.rounds)):
        yield index
        time.sleep(0.3)


class Run(TypedDict):
    """One generation: its image tokens, the decoded picture, and its statistics."""

    tokens: list[int]
    pixels: list[list[int]]
    png_base64: str
    stats: dict[str, Any]


class GenerateResult(TypedDict):
    """``/generate``'s answer: the chosen method's run, lossless Eagle-1's run on the same class and seed, and
    the latencies of AR, Eagle-1 and the method from interleaved repeats (None when ``timing_repeats`` is 0)."""

    method: Run
    eagle: Run
    timing: dict[str, Any] | None


def api_generate(method: str = "COOL-SD", delta: float = 2.0, nu: float = 0.7, mu: str = "auto", k: int = 10,
                 lam: float = 5.0, draft: str = "chain:5", class_name: str = DEFAULTS["class_name"], seed: int = 0,
                 cfg_scale: float = DEFAULTS["cfg_scale"], temperature: float = DEFAULTS["temperature"],
                 top_k: int = DEFAULTS["top_k"], top_p: float = DEFAULTS["top_p"], schedule: str = "exp",
                 timing_repeats: int = 0, model: str = "", prompt: str = "", ranks: int = 7, gap: float = 0.15,
                 dist: float = 0.5) -> GenerateResult:
    """Generate with one method and with lossless Eagle-1: both images (PNG base64 and pixels), tokens and
    statistics. ``mu`` is "auto" or a number. ``timing_repeats`` > 0 also times AR, Eagle-1 and the method
    that many times each, interleaved. ``model``: one of the app's model choices (empty: the default model);
    a text model takes ``prompt`` instead of ``class_name``; with another model, a class or sampling value left
    at its default stands for that model's default, and so does the draft ``chain:5`` on a model without a draft
    model. ``ranks``, ``gap``, ``dist``: GSD's (last, so that older clients keep their positions). Parameter
    ranges: see docs/app.md."""
    request = api_request(method, delta, nu, mu, k, lam, draft, class_name, seed, cfg_scale, temperature, top_k,
                          top_p, schedule, model, prompt, ranks, gap, dist)
    repeats = checked(lambda: check("timing_repeats", timing_repeats))
    result = checked(lambda: run_comparison(request, None))
    if repeats:
        result.timing = checked(lambda: measure(request, repeats))  # on ZeroGPU too, like the UI's timing
    return views.api_payload(result)


def api_generate_batch(method: str = "COOL-SD", delta: float = 2.0, nu: float = 0.7, mu: str = "auto", k: int = 10,
                       lam: float = 5.0, draft: str = "chain:5", class_name: str = DEFAULTS["class_name"],
                       seeds: list[int] = [0, 1, 2, 3], cfg_scale: float = DEFAULTS["cfg_scale"],  # noqa: B006
                       temperature: float = DEFAULTS["temperature"], top_k: int = DEFAULTS["top_k"],
                       top_p: float = DEFAULTS["top_p"], schedule: str = "exp", model: str = "",
                       prompt: str = "", ranks: int = 7, gap: float = 0.15, dist: float = 0.5) -> dict:
    """As ``/generate``, for a list of 1 to 16 seeds decoded as one batch per method (each image gets the
    tokens it gets alone, spec section 9): per seed both images, tokens and statistics, and each batch's seconds.
    No timing repeats (``/generate`` measures them)."""
    checked_seeds = checked(lambda: session.check_seeds(seeds))
    request = api_request(method, delta, nu, mu, k, lam, draft, class_name, checked_seeds[0], cfg_scale, temperature,
                          top_k, top_p, schedule, model, prompt, ranks, gap, dist)
    return views.api_batch_payload(checked(lambda: run_batch(request, checked_seeds)))


def api_request(method, delta, nu, mu, k, lam, draft, class_name, seed, cfg_scale, temperature, top_k, top_p,
                schedule, model, prompt, ranks=7, gap=0.15, dist=0.5) -> session.Request:
    """An API call's values validated into a request (readable errors, as the UI's)."""
    params = {"delta": delta, "nu": nu, "mu": mu, "k": k, "lambda": lam, "schedule": schedule, "ranks": ranks,
              "gap": gap, "dist": dist}
    bundle = checked(lambda: MODELS.get(model))
    key = MODELS.key(model)
    checked(lambda: refuse_unused(bundle, method, params, class_name, prompt))
    if draft == API_DRAFT and not session.suits(bundle, draft):  # the documented default, on a model it does not fit
        draft = session.default_draft(bundle)
    given = {"class_name": class_name, "cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
             "top_p": top_p}
    if bundle is not BUNDLE:  # the documented defaults are the default model's: untouched ones follow the model
        own = model_defaults(bundle)
        given = {name: own[name] if isinstance(value, (str, int, float)) and value == DEFAULTS[name] else value
                 for name, value in given.items()}
    return checked(lambda: session.parse_request(
        bundle, method, params, draft, given["class_name"], seed, given["cfg_scale"], given["temperature"],
        given["top_k"], given["top_p"], prompt=prompt, model=key))


def refuse_unused(bundle: Bundle, method, params: dict, class_name, prompt) -> None:
    """A ValueError for an API value the request cannot use, as the command line refuses one: another
    method's parameter set off its default, a prompt for a class model, a class for a text model."""
    if isinstance(method, str) and method in session.method_entries():  # else parse_request names the bad one
        session.refuse_foreign(method, params)
    text = session.text_model(bundle)
    if not text and isinstance(prompt, str) and prompt.strip():
        raise ValueError(f"prompt is for text-to-image models; {bundle.name} is a class-to-image model: give "
                         f"class_name, not prompt (got a prompt of {len(prompt)} characters)")
    if text and class_name not in (None, "", DEFAULTS["class_name"]):
        raise ValueError(f"class_name is for class-to-image models; {bundle.name} is a text-to-image model: give "
                         f"prompt, not class_name (got {shorten(class_name)})")


API_DRAFT = "chain:5"  # the API's documented default draft (a model without a draft model takes its own instead)
GSD_DEFAULTS = [schema(name).default for name in ("ranks", "gap", "dist")]
# values added to the API later, last: clients may leave them out (/generate's model and prompt, then GSD's)
OPTIONAL_TRAILING = {"generate": ["", "", *GSD_DEFAULTS], "generate_batch": GSD_DEFAULTS}


class Explorer(gr.Blocks):
    """``gr.Blocks`` whose endpoints answer a malformed request with a readable error: Gradio itself rejects too
    few values with an empty error, silently drops extra ones, and hides why a value could not be read."""

    named: dict  # set by build_demo: value names (session.value_names) and output names -> components

    def validate_inputs(self, block_fn, inputs):
        optional = OPTIONAL_TRAILING.get(block_fn.api_name, [])
        wanted = len(block_fn.inputs)
        if wanted - len(optional) <= len(inputs) < wanted:  # a client of the older contract: defaults follow
            inputs.extend(optional[len(inputs) - wanted:])
        if len(inputs) != wanted:
            count = f"{wanted - len(optional)} to {wanted}" if optional else str(wanted)
            message = f"/{block_fn.api_name} takes {count} values, got {len(inputs)}"
            log.info("rejected request: %s", message)
            raise gr.Error(message, title="Invalid request", print_exception=False)

    def launch(self, *args, **kwargs):
        """Gradio's launch, with :class:`KnownEndpoints` in front of the app."""
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), Middleware(KnownEndpoints, blocks=self)]
        return super().launch(*args, app_kwargs=app_kwargs, **kwargs)

    async def postprocess_data(self, block_fn, predictions, state):
        """Gradio's, then every output it rebuilt from an :func:`unchecked` one made unchecked too."""
        outputs = await super().postprocess_data(block_fn, predictions, state)
        for block in block_fn.outputs:
            if getattr(block, "unchecked", False) and state is not None and block._id in state:
                unchecked(state[block._id])
        return outputs

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        self.validate_inputs(block_fn, inputs)  # its own message (Gradio's call of it then passes)
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except gr.Error as error:  # Gradio refuses a value (one no dropdown offers): one line, no traceback
            reason = clip(str(error.message), 300)
            log.info("rejected request: %s", reason)
            raise gr.Error(reason, title="Invalid request", print_exception=False) from None
        except Exception as error:  # Gradio's message: "Could not preprocess ... \n\nExpected ... was: value"
            parts = str(error).split("\n\n")
            reason = parts[0].split(" with input components")[0] + (f": {parts[1]}" if len(parts) > 1 else "")
            log.info("rejected request: %s", clip(reason, 300))
            raise gr.Error(clip(reason, 300), title="Invalid request", print_exception=False) from None


CALL = re.compile(r"/gradio_api/call/([^/]+)/?$")


class KnownEndpoints:
    """ASGI middleware: ``POST /gradio_api/call/<name>`` for a name that is not a documented endpoint (unknown, an
    event that runs in the browser, such as the seed dice, or one of the page's own handlers, which Gradio
    serves there although they are private: ``on_model`` would start loading a 7B model) answers 404 with one
    readable line. Gradio itself answers an unknown name with HTTP 500 and runs a browser-only one into a
    traceback."""

    def __init__(self, app, blocks: gr.Blocks) -> None:
        self.app, self.blocks = app, blocks

    def public(self) -> set[str]:
        """The names callable at /gradio_api/call: events with a Python function that are not private."""
        return {fn.api_name for fn in self.blocks.fns.values()
                if fn.fn and getattr(fn, "api_visibility", "public") != "private"}

    async def __call__(self, scope, receive, send) -> None:
        called = CALL.search(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if called is not None and called.group(1) not in self.public():
            name = clip(repr(called.group(1)), 80)
            log.info("rejected request: no endpoint %s", name)
            response = JSONResponse({"error": f"this app has no endpoint {name}; its API is /generate"}, 404)
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


SESSIONS_KEPT = 64  # per-session results (about 1 MB each) kept for at most this many browser sessions

CSS = """
.pixelated img, .race-picture img { image-rendering: pixelated; }
#generate { position: sticky; bottom: 8px; z-index: 20; box-shadow: 0 2px 10px rgba(0, 0, 0, 0.25); }
.gradio-container { overflow: clip !important; }  /* clips as Gradio's "hidden" does, but lets #generate stick */
.timings table { width: 100%; font-size: 0.9em; }
.timings th, .timings td { white-space: normal; overflow-wrap: normal !important; word-break: normal !important;
                           padding: 4px 6px !important; }
"""


def method_control(control: session.MethodControl, start: dict) -> dict[str, gr.components.Component]:
    """One method parameter's widgets by value name: a radio for named choices; a slider for a number, after a
    checkbox per word it also takes (ticked: the word stands, and the slider hides)."""
    param = control.schema
    if isinstance(param, Choice):
        return {control.name: gr.Radio(list(param.choices), value=start[control.name], label=param.label)}
    widgets = {name: gr.Checkbox(value=start[name], label=word_label(param, word), info=param.help or None)
               for name, word in control.words.items()}
    hidden = any(start[name] for name in widgets)
    widgets[control.name] = slider(param, value=start[control.name], visible=not hidden,
                                   elem_id=f"{control.name}-slider")
    return widgets


def method_panel(start: dict) -> tuple[dict, list[gr.Column]]:
    """The method controls, box by box (:func:`method_boxes`), each box visible for the entries it applies to."""
    controls = {control.name: control for control in session.method_controls()}
    named: dict = {}
    boxes = []
    for labels, items in method_boxes():
        with gr.Column(visible=start["method"] in labels, elem_classes="method-controls") as box:
            for item in items:
                if item == OMEGA_LINE:
                    named[OMEGA_LINE] = gr.Markdown(elem_id="omega-line")
                else:
                    named.update(method_control(controls[item], start))
        boxes.append(box)
    return named, boxes


def settings_panel(start: dict) -> tuple[dict, list[gr.Column]]:
    """The left column: model, method, presets, the method's controls, draft, class or prompt, seed, sampling,
    Generate."""
    named: dict = {"model": gr.Dropdown([(choice.label, choice.key) for choice in MODELS.choices()],
                                        value=start["model"], label="Model", elem_id="model")}
    notes = models.warnings()  # broken COOLSD_MODELS entries (met while listing the choices): in the log and here
    gr.Markdown("\n".join(f"⚠️ {views.plain(note, 400)}  " for note in notes), visible=bool(notes),
                elem_id="model-warnings")
    named["method"] = gr.Radio(list(session.method_entries()), value=start["method"], label="Method")
    with gr.Row():
        named["presets"] = {gr.Button(text, size="sm"): values for text, values in PRESETS.items()}
        named["reset"] = gr.Button("Reset", size="sm")
    controls, boxes = method_panel(start)
    named.update(controls)
    with gr.Column(visible=start["method"] in drafting_labels(), elem_id="draft-box") as named["draft_box"]:
        named["draft"] = gr.Dropdown(session.DRAFTS, value=start["draft"], label="Draft structure")
        named["draft_note"] = gr.Markdown(views.draft_note(start["draft"]), elem_id="draft-note")
    text = session.text_model(BUNDLE)
    named["class_name"] = gr.Dropdown(BUNDLE.class_names, value=start["class_name"], label="Class",
                                      visible=not text, elem_id="class-name")
    with gr.Column(visible=text) as named["prompt_box"]:
        named["prompt"] = gr.Textbox(value=start["prompt"], label="Prompt", lines=2, max_lines=6,
                                     max_length=session.PROMPT_CHARS, elem_id="prompt")
        named["examples"] = gr.Dropdown(list(EXAMPLE_PROMPTS), value=None, label="Example prompts",
                                        elem_id="example-prompts")
    with gr.Row():
        named["seed"] = unchecked(gr.Number(value=start["seed"], precision=0, label="Seed", minimum=PARAMS["seed"].low,
                                            maximum=PARAMS["seed"].high, elem_id="seed"))
        named["dice"] = gr.Button("Random seed", size="sm")
    with gr.Accordion("Advanced: sampling", open=False):
        for name in ("cfg_scale", "temperature", "top_k", "top_p"):
            top = {"maximum": BUNDLE.config.vocab_size} if name == "top_k" else {}
            named[name] = slider(PARAMS[name], value=start[name], **top)
    # last among the settings, but pinned to the window's bottom while they are in view (CSS: #generate)
    named["run"] = gr.Button("Generate", variant="primary", elem_id="generate")
    return named, boxes


def first_images() -> dict:
    """What the images show before any click: both runs of the starting settings, made once at start-up (not on
    ZeroGPU, where no CUDA work may run outside a request), with a caption that says so."""
    start = defaults()
    request = session.parse_controls(BUNDLE, [start[name] for name in session.value_names()])
    labels = views.image_labels(request)
    if spaces is not None:
        return {"caption": "Press **Generate**.", "labels": labels}
    made = session.compare(BUNDLE, request)
    return {"method": views.enlarge(made.images["method"]), "eagle": views.enlarge(made.images["eagle"]),
            "labels": labels, "caption": f"{views.caption(BUNDLE, request)} Made at start-up with the settings on "
                                         "the left: press **Generate** to watch it drawn, and to time it."}


def results_panel() -> dict:
    """The right column: both images, the timing table, and the figure tabs."""
    first = FIRST_IMAGES
    named: dict = {"caption": gr.Markdown(first["caption"], elem_id="caption")}
    with gr.Row():
        named["image_method"] = gr.Image(first.get("method"), label=first["labels"][0], type="pil", format="png",
                                         height=300, elem_classes="pixelated", interactive=False)
        named["image_eagle"] = gr.Image(first.get("eagle"), label=first["labels"][1], type="pil", format="png",
                                        height=300, elem_classes="pixelated", interactive=False)
    named["timings"] = gr.Markdown(elem_classes="timings", elem_id="timings")
    with gr.Tabs(overflow_behavior="wrap"):  # every tab's name in view, on two lines on a phone
        with gr.Tab("Race"):
            named["race_image"] = gr.Image(show_label=False, type="pil", format="png", interactive=False,
                                           elem_id="race-image", elem_classes="race-picture", visible=False)
            named["race_text"] = gr.Markdown(RACE_WAITING, elem_id="race-text", elem_classes="timings")
            named["race_again"] = gr.Button("▶ Race again", size="sm")
        with gr.Tab("Per position"):
            named["per_position"] = gr.Plot(show_label=False)
        with gr.Tab("Accepted lengths"):
            named["lengths"] = gr.Plot(show_label=False)
        with gr.Tab("Acceptance maps"), gr.Row():  # side by side; one above the other on a phone
            named["map_method"] = gr.Plot(show_label=False, min_width=340)
            named["map_eagle"] = gr.Plot(show_label=False, min_width=340)
        with gr.Tab("Replay"):
            with gr.Row():
                named["round_slider"] = unchecked(gr.Slider(0, 1, value=0, step=1, label="Round",
                                                            elem_id="round-slider"))
                named["play"] = gr.Button("▶ Play", size="sm")
            named["replay_plot"] = gr.Plot(show_label=False, elem_id="replay-plot")
        with gr.Tab("Theory"):
            named.update(theory_tab())
        with gr.Tab("Trade-off"):
            named.update(tradeoff_tab())
    return named


def tradeoff_tab() -> dict:
    """The study's quality/speed figure: its quietest measure first, the methods at their default parameters
    (the other series on demand), and a note when the current setting is not on the study's grid."""
    metric, (choices, shown) = views.default_metric(BUNDLE), views.tradeoff_families(BUNDLE)
    figure, note = views.tradeoff_panel(BUNDLE, None, metric, shown)
    named = {"metric": gr.Radio(QUALITY_AXES, value=metric, label="quality axis"),
             "families": gr.CheckboxGroup(list(choices.items()), value=shown, label="series", elem_id="families"),
             "tradeoff_plot": gr.Plot(value=figure, show_label=False, elem_id="tradeoff-plot"),
             "tradeoff_note": gr.Markdown(views.plain(note, 600) if note else "", elem_id="tradeoff-note")}
    gr.Markdown(METHOD_NOTES)
    return named


def tradeoff_outputs(bundle, result, metric, families, narrow) -> tuple:
    """The trade-off figure and its note, for the figure's and the note's components."""
    figure, note = views.tradeoff_panel(bundle, result, metric, families, bool(narrow))
    return figure, views.plain(note, 600) if note else ""


def tour_panel() -> dict:
    """The guided tour: a button per step (:data:`coolsd.app.tour.STEPS`) and the chosen step's text."""
    with gr.Accordion("Guided tour", open=False, elem_id="tour"):
        gr.Markdown(f"{len(tour.STEPS)} steps through what the methods do, each with what our study of the shipped model "
                    "measured. A step sets the controls and generates; then look where its text says.")
        with gr.Row():
            buttons = [gr.Button(step.title, size="sm") for step in tour.STEPS]
        text = gr.Markdown(elem_id="tour-text")
    return {"tour_buttons": buttons, "tour_text": text}


def theory_tab() -> dict:
    """The theory panel: where its (p, q) pairs come from, its figure and its table."""
    gr.Markdown("Exact per-position acceptance rate `beta_i`, TV cost `e_i`, expected accepted drafts "
                "`E[N]` and the bound on the total-variation distance of one round, under the current "
                "sliders: move them and watch the trade-off. For a chain, "
                "`E[N] = sum_i prod_{j<=i} beta_j` and the bound is `sum_i (prod_{j<i} beta_j) e_i`.")
    named = {}
    with gr.Row():
        named["source"] = gr.Radio(["last generation", "toy distributions"], value="last generation",
                                   label="(p, q) pairs from")
        named["toy_seed"] = unchecked(gr.Number(value=views.TOY_SEED.default, precision=0, label=views.TOY_SEED.label,
                                                minimum=views.TOY_SEED.low, maximum=views.TOY_SEED.high,
                                                elem_id="toy-seed"))
    named["theory_plot"] = gr.Plot(show_label=False, elem_id="theory-plot")
    named["theory_md"] = gr.Markdown(elem_id="theory-text")
    return named


def on_metric(result, metric, families, model="", narrow=False):
    """The trade-off figure and note again, for another quality axis or set of series."""
    bundle = bundle_of(result.request) if result is not None else MODELS.peek(model) or BUNDLE
    return tradeoff_outputs(bundle, result, metric, families, narrow)


MODEL_OUTPUTS = ("model", "class_name", "prompt_box", "top_k", "cfg_scale", "temperature", "top_p", "draft", "metric",
                 "families", "tradeoff_plot", "tradeoff_note", "model_state")


def on_model(choice, previous, narrow=False, draft=None, progress=None):
    """The model selector: load the chosen model (first use only), then show its class dropdown or prompt box,
    its top-k range, its sampling defaults, a draft it can run (``draft`` kept where it can: a model without a
    draft model gets a Jacobi window) and its trade-off figure (``MODEL_OUTPUTS``). A model that cannot be
    loaded is a notice, and the selection goes back to ``previous``."""
    try:
        bundle = MODELS.get(choice, progress)
    except ValueError as error:
        log.info("model not loaded: %s", clip(str(error), 300))
        gr.Warning(clip(str(error), 400), title="Model not available")
        return (gr.update(value=previous), *[gr.skip()] * (len(MODEL_OUTPUTS) - 2), previous)
    start, text = model_defaults(bundle), session.text_model(bundle)
    metric, (choices, shown) = views.default_metric(bundle), views.tradeoff_families(bundle)
    suited = session.suited_draft(bundle, draft) if draft is not None else draft
    return (gr.skip(), gr.update(choices=bundle.class_names, value=start["class_name"], visible=not text),
            gr.update(visible=text), gr.update(maximum=bundle.config.vocab_size, value=start["top_k"]),
            start["cfg_scale"], start["temperature"], start["top_p"], gr.skip() if suited == draft else suited, metric,
            gr.update(choices=list(choices.items()), value=shown),
            *tradeoff_outputs(bundle, None, metric, shown, narrow), MODELS.key(choice))


def on_reset(model):
    """Reset: every control's starting value, with the chosen model's class, sampling and draft (not the model, nor
    the prompt)."""
    start = defaults(MODELS.peek(model) or BUNDLE)
    return [start[name] for name in session.value_names() if name not in session.CONDITION]


RANDOM_SEED = f"() => Math.floor(Math.random() * {PARAMS['seed'].high + 1})"  # in the browser: no endpoint
NARROW = "() => window.innerWidth < 600"  # a phone: figures drawn for a panel about 360 px wide
# on a phone the images are below the settings: scroll them into view, to watch them drawn
SHOW_IMAGES = ("() => { if (window.innerWidth < 600) document.querySelector('#caption')"
               ".scrollIntoView({behavior: 'smooth'}); }")


def ranged_params() -> dict[str, Param]:
    """The typed controls and the range each is checked against: every numeric method parameter (from the
    registry now), the seed and the sampling settings, and the theory's toy seed."""
    names = [control.name for control in session.method_controls() if isinstance(control.schema, Param)]
    return {**{name: schema(name) for name in names}, **{name: PARAMS[name] for name in (
        "cfg_scale", "temperature", "top_k", "top_p", "seed")}, "toy_seed": views.TOY_SEED}


def on_range(param: Param) -> Callable:
    """The check of one typed control: a value outside ``param``'s range is one warning that names it, and
    the control is set back to the value that will run (the nearest end)."""
    def check_range(value, model=None):
        bundle = MODELS.peek(model) or BUNDLE
        fix = corrected(param, value, bundle.config.vocab_size if param.name == "top_k" else None)
        if fix is None:
            return gr.skip()
        log.info("corrected %s: %s", param.name, clip(fix[1], 300))
        gr.Warning(fix[1], title="Out of range")
        return fix[0]
    check_range.__name__ = f"check_{param.name}"
    return check_range


def on_tour(index: int) -> list:
    """A tour step's button: the values it sets (:func:`tour_controls` order; a skip keeps the control as it is)
    and its text."""
    step = tour.STEPS[index]
    return [step.values.get(name, gr.skip()) for name in tour_controls()] + [tour.step_text(step, TOUR_FACTS)]


def tour_step(index: int) -> Callable[[], list]:
    """Step ``index``'s button handler (:func:`on_tour`, with the index fixed)."""
    def on_tour_step() -> list:
        return on_tour(index)
    return on_tour_step


def tour_controls() -> list[str]:
    """Every control some tour step sets, in ``session.value_names`` order."""
    wanted = {name for step in tour.STEPS for name in step.values}
    return [name for name in session.value_names() if name in wanted]


def generation_steps(ui: dict, start: Callable) -> None:
    """Check, generate, then the figures, then the timings, after ``start`` (a click, or another event's
    ``.then``). The check has no outputs, so a refused setting leaves the last result on the page; a newer
    generation's images make an older one's pending figures and timing stale (:func:`stale`)."""
    inputs = [ui[name] for name in session.value_names()]
    start(on_check, inputs, None, **PRIVATE).success(
        with_progress(on_generate, session=True), inputs, [ui[name] for name in (
            "image_method", "image_eagle", "timings", "caption", "round_slider", "result")],
        concurrency_id="generate", show_progress_on=ui["timings"], trigger_mode="multiple", **PRIVATE).then(
        on_figures, [ui[name] for name in ("result", "metric", "families", "narrow")], [ui[name] for name in (
            "per_position", "lengths", "map_method", "map_eagle", "replay_plot", "theory_plot", "theory_md",
            "tradeoff_plot", "tradeoff_note")], trigger_mode="always_last", **PRIVATE).then(
        on_timing_with_progress, ui["result"], [ui["timings"], ui["result"]], api_name="on_timing",
        concurrency_id="generate", show_progress_on=ui["timings"], trigger_mode="always_last", **PRIVATE).then(
        on_race, ui["result"], [ui["race_image"], ui["race_text"]], concurrency_id="race", concurrency_limit=8,
        show_progress="hidden", trigger_mode="always_last", **PRIVATE)
    # "once" would drop a newer request's step while an older one's runs


def wire_generation(demo: gr.Blocks, ui: dict) -> None:
    """Generate (the button, and the tour's steps that generate); the theory panel follows the method's
    controls, from page load on."""
    generation_steps(ui, functools.partial(ui["run"].click, trigger_mode="multiple"))  # the last click wins
    ui["run"].click(None, js=SHOW_IMAGES)
    outputs = [ui[name] for name in tour_controls()] + [ui["tour_text"]]
    for index, button in enumerate(ui["tour_buttons"]):
        step = button.click(tour_step(index), None, outputs, **PRIVATE)
        if tour.STEPS[index].generate:
            generation_steps(ui, step.then)
    inputs = [ui[name] for name in session.value_names()]
    method_values = [ui[name] for name in session.value_names()
                     if name not in session.COMMON and name not in session.CONDITION]
    gr.on([demo.load] + [control.change for control in (*method_values, ui["source"], ui["toy_seed"])], on_theory,
          [ui["result"], *inputs, ui["source"], ui["toy_seed"], ui["narrow"]], [ui["theory_plot"], ui["theory_md"]],
          show_progress="hidden", trigger_mode="always_last", **PRIVATE)
    ui["round_slider"].input(on_round, [ui["result"], ui["round_slider"]], ui["round_slider"],
                             show_progress="hidden", **PRIVATE)
    ui["round_slider"].change(on_replay, [ui["result"], ui["round_slider"], ui["narrow"]], ui["replay_plot"],
                              show_progress="hidden", **PRIVATE)
    ui["play"].click(on_play, ui["result"], ui["round_slider"], **PRIVATE)
    ui["race_again"].click(on_race, ui["result"], [ui["race_image"], ui["race_text"]], concurrency_id="race",
                           show_progress="hidden", **PRIVATE)
    gr.on([ui["metric"].input, ui["families"].input], on_metric,
          [ui[name] for name in ("result", "metric", "families", "model", "narrow")],
          [ui["tradeoff_plot"], ui["tradeoff_note"]], **PRIVATE)
    # .select: a dropdown's .input fires twice per choice. Loads have their own queue: a slow or failing download
    # never holds a generation's place (Models.get loads one model at a time anyway).
    ui["model"].select(with_progress(on_model), [ui["model"], ui["model_state"], ui["narrow"], ui["draft"]],
                       [ui[name] for name in MODEL_OUTPUTS], concurrency_id="load", concurrency_limit=4, **PRIVATE)
    ui["examples"].input(lambda example: (example or gr.skip(), None), ui["examples"],
                         [ui["prompt"], ui["examples"]], **PRIVATE)


def wire_controls(demo: gr.Blocks, ui: dict, boxes: list[gr.Column], start: dict) -> None:
    """The controls among themselves: visibility per method, word checkboxes, the omega line, seed dice,
    presets and Reset."""
    ui["method"].change(on_method, ui["method"], [*boxes, ui["draft_box"]], **PRIVATE)
    ui["draft"].change(views.draft_note, ui["draft"], ui["draft_note"], show_progress="hidden", **PRIVATE)
    for control in session.method_controls():
        for name in control.words:
            if name == "mu_auto":  # unticking starts the slider at the value auto stood for
                ui[name].change(on_mu_auto, [ui[key] for key in ("mu_auto", "nu", "draft", "schedule")],
                                ui["mu"], **PRIVATE)
            else:
                ui[name].change(on_word, ui[name], ui[control.name], **PRIVATE)
    if OMEGA_LINE in ui:
        omega_inputs = [ui[name] for name in ("method", "delta", "nu", "mu_auto", "mu", "draft", "schedule")]
        gr.on([demo.load] + [control.change for control in omega_inputs], views.omega_line, omega_inputs,
              ui[OMEGA_LINE], trigger_mode="always_last", **PRIVATE)  # "once" would drop the newest value
    ui["dice"].click(None, None, ui["seed"], js=RANDOM_SEED)
    for button, values in ui["presets"].items():
        button.click(lambda values=values: list(values.values()), None, [ui[name] for name in values], **PRIVATE)
    for name, param in ranged_params().items():
        ui[name].input(on_range(param), [ui[name], ui["model"]], ui[name], show_progress="hidden", **PRIVATE)
    names = [name for name in session.value_names() if name not in session.CONDITION]
    ui["reset"].click(on_reset, ui["model"], [ui[name] for name in names], **PRIVATE)


def build_demo() -> Explorer:
    """The explorer's page, its method controls read from the rule registry now (a method registered before
    the call gets its controls); ``demo.named`` maps names (value names, outputs) to components."""
    start = defaults()
    with Explorer(title="coolsd explorer", delete_cache=(3600, 3600)) as demo:  # image files: an hour
        named: dict = {"result": gr.State(None), "model_state": gr.State(start["model"]),
                       "narrow": gr.Checkbox(False, visible=False, elem_id="narrow")}  # set in the browser
        gr.Markdown(INTRO)
        named.update(tour_panel())
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                settings, boxes = settings_panel(start)
            with gr.Column(scale=2, min_width=300):
                named.update(results_panel())
        named.update(settings)
        demo.named = named
        demo.load(None, None, named["narrow"], js=NARROW)
        wire_generation(demo, named)
        wire_controls(demo, named, boxes, start)
        gr.api(api_generate, api_name="generate", concurrency_id="generate")
        gr.api(api_generate_batch, api_name="generate_batch", concurrency_id="generate")
    demo.queue(default_concurrency_limit=2, max_size=64)
    return demo


say("making the first images")
FIRST_IMAGES = first_images()
say("building the interface")
demo = build_demo()

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    say("starting the web server")
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=True,
                state_session_capacity=SESSIONS_KEPT)
