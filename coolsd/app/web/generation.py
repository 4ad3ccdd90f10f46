"""Generate's handlers, in the order one click runs them: check the setting, decode both images while showing
them drawn, then the figures, then the timing run, then the race. Each later step belongs to its click: a newer
click of the same browser session makes it stale, and it shows nothing (:func:`stale`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import closing

import gradio as gr

from ...core.params import clip
from .. import frames, views
from .. import session as session_module  # (on_generate's parameter ``session`` is the browser's)
from . import gpu
from .inputs import checked_steps, parse, session_of
from .panels import on_metric, on_theory, theory_outputs, tradeoff_outputs
from .runtime import current

log = logging.getLogger("coolsd.app")
LIVE_INTERVAL = session_module.LIVE_INTERVAL
RACE_WAITING = "The race starts once the timing run has measured every round of AR, Eagle-1 and this method."


def on_check(*values) -> None:
    """Generate's first step: validate the setting, loading no model. It has no outputs, so a refused setting is
    one toast and the last result stays on the page, whole."""
    parse(values, load=False)


GENERATE_OUTPUTS = ("image_method", "image_eagle", "timings", "caption", "round_slider", "result", "race_image",
                    "race_text", "shown_serial")  # what on_generate's each yield sets, in order


def outputs(**values) -> tuple:
    """One yield of :func:`on_generate`: the named outputs set, every other left as it is."""
    return tuple(values.get(name, gr.skip()) for name in GENERATE_OUTPUTS)


def on_generate(*values, progress=None, session: str | None = None):
    """The Generate button: validate, clear the last run's race, then run both images while showing them drawn
    round by round (at most every ``LIVE_INTERVAL`` seconds; figures and timings follow). The result is the
    session's newest from the click on (``Runtime.latest``): an older request still running is stale."""
    state = current()
    serial = state.latest.claim(session)
    # first (before a model load that may fail): the last run's race and caption go, and the serial tells the
    # page that no older request's picture follows
    yield outputs(caption="Generating…", race_image=gr.update(value=None, visible=False), race_text=RACE_WAITING,
                  shown_serial=serial)
    bundle, request = parse(values, progress)
    started = time.perf_counter()
    drawn: dict = {}
    length, grid = bundle.config.image_tokens, views.grid_of(bundle)
    method_label, eagle_label = views.image_labels(request)
    reused = session_module.eagle_reused(bundle, request)
    result, shown = None, -LIVE_INTERVAL
    # a newer click stops the runs: it closes the steps here, or the runs see it (session, serial)
    with closing(checked_steps(gpu.compare(request, owner=(session, serial)))) as steps:
        for step in steps:
            if not state.latest.current(session, serial):
                break
            if isinstance(step, session_module.Comparison):
                result = step
                continue
            time.sleep(max(0.0, shown + LIVE_INTERVAL - time.perf_counter()))  # meanwhile newer frames merge
            drawn.update(step.made)
            if progress is not None and "method" in drawn:
                progress(drawn["method"][0] / length, desc=f"Generating with {request.label}")
            pictures = step.pictures(grid)
            shown = time.perf_counter()
            yield outputs(image_method=pictures.get("method", gr.skip()), image_eagle=pictures.get("eagle", gr.skip()),
                          caption=views.live_caption(request, drawn, length, reused))
    if result is None or not state.latest.current(session, serial):
        log.info("generate %s seed=%d: stopped after %.2fs, a newer click replaced it", request.label, request.seed,
                 time.perf_counter() - started)
        return  # the newer click's images are (or will be) on the page
    result.serial = serial
    condition = f"class={request.class_id}" if request.class_id is not None else f"prompt={clip(request.prompt, 60)!r}"
    log.info("generate %s model=%s %s seed=%d: %.2fs", request.label, request.model, condition, request.seed,
             time.perf_counter() - started)
    rounds = len(result.method.stats.rounds)
    yield outputs(image_method=gr.update(value=views.enlarge(result.images["method"]), label=method_label),
                  image_eagle=gr.update(value=views.enlarge(result.images["eagle"]), label=eagle_label),
                  timings=views.timing_table(result), caption=views.caption(bundle, request, result.eagle_reused),
                  round_slider=gr.update(maximum=max(1, rounds - 1), value=0), result=result)


def stale(result, request: gr.Request | None) -> bool:
    """Whether a newer generation of the same browser session has replaced ``result`` (or there is none)."""
    return result is None or not current().latest.current(session_of(request), result.serial)


def on_figures(result, metric, families=None, narrow=False, request: gr.Request | None = None,
               theory: tuple | None = None):
    """Every figure of the last generation (drawn after the images are on screen; ``narrow``: laid out for a
    phone), unless a newer one of the session has replaced it meanwhile. The theory panel follows ``theory``
    (the controls as :func:`on_theory` takes them) when given: a method chosen while the images were decoding
    stays the panel's method."""
    if stale(result, request):
        return [gr.skip()] * 9
    bundle, narrow = current().bundle_of(result.request), bool(narrow)
    theory_fig, theory_md = (on_theory(result, *theory, narrow) if theory is not None
                             else theory_outputs(result, result.request, "last generation", 0, narrow))
    return (*views.run_figures(bundle, result, narrow), theory_fig, theory_md,
            *tradeoff_outputs(bundle, result, metric, families, narrow))


def on_figures_for_page(request: gr.Request, result, metric, families, *theory):
    """:func:`on_figures` as Gradio must see it to pass the request; ``theory``: the theory panel's inputs, whether
    the page is narrow last (as :func:`on_width` takes them)."""
    return on_figures(result, metric, families, theory[-1], request, theory[:-1])


def on_width(request: gr.Request, result, metric, families, model, round_index, *theory):
    """Every figure again, for the page's new width class (``theory``'s last value: narrow, below 600 px; a
    phone turned, a window resized across it). The run's figures only while it is the session's newest; the
    theory and trade-off panels always."""
    narrow = bool(theory[-1])
    if stale(result, request):  # no run yet, or a newer one is being drawn (its figures follow the new width)
        runs = [gr.skip()] * 5
    else:
        index = int(round_index) if isinstance(round_index, (int, float)) else 0
        runs = views.run_figures(current().bundle_of(result.request), result, narrow, index)
    return (*runs, *on_theory(result, *theory), *on_metric(result, metric, families, model, narrow))


def on_timing(result, request: gr.Request | None = None, progress=None):
    """Latencies of AR, Eagle-1 and the chosen method, measured now in interleaved repeats (after the images
    and figures, so that nobody waits for them to see a picture), with a progress bar. They belong to
    ``result``'s request: when a newer generation of the session replaces it, before or during the measurement,
    the measurement stops and nothing is shown; the ``result`` state keeps the newer one."""
    def replaced() -> bool:
        return stale(result, request)

    if replaced() or result.timing is not None:
        return gr.skip(), gr.skip()
    started, timing = time.perf_counter(), None
    with closing(checked_steps(gpu.measure(result.request))) as steps:
        for step in steps:
            if replaced():
                break  # closed: the timing run stops before its next run
            if isinstance(step, session_module.Timing):
                timing = step
            elif progress is not None:
                progress(step[0], desc=step[1])
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


def on_race(result, request: gr.Request | None = None):
    """The race: AR, Eagle-1 and the chosen method replayed side by side on one clock, each round ending at its
    measured time, all slowed by one factor so that the slowest takes ``frames.RACE_SECONDS`` (at most
    ``frames.FRAMES_PER_SECOND`` pictures a second). A newer generation of the session stops it."""
    if result is None or result.timing is None or not result.timing.runs:
        yield gr.skip(), RACE_WAITING
        return
    if stale(result, request):
        return
    lanes = views.race_lanes(result)
    factor, grid = frames.slowdown(lanes), views.grid_of(current().bundle_of(result.request))
    began = time.perf_counter()
    for clock in frames.race_clocks(lanes, factor):
        if stale(result, request):
            return
        time.sleep(max(0.0, began + clock * factor - time.perf_counter()))
        table = frames.race_table(lanes, clock, factor, result.timing.steps)
        finished = all(clock >= lane.finish for lane in lanes)
        yield (gr.update(value=frames.race_frame(lanes, grid, clock), visible=True),
               (frames.race_verdict(lanes) + "\n\n" if finished else "") + table)
