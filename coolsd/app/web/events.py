"""Which handler each event of the page runs, with which inputs and outputs: Generate's chain (check, images,
figures, timing, race), the figure tabs, the settings column among themselves, and the two public endpoints.
Every page handler is private: only ``/generate`` and ``/generate_batch`` are the API."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import gradio as gr

from ...core.params import PARAMS
from .. import session, tour, views
from ..controls import OMEGA_LINE
from . import api
from .generation import (GENERATE_OUTPUTS, on_check, on_figures_for_page, on_generate, on_race,
                         on_timing_with_progress, on_width)
from .inputs import on_range, ranged_params, session_of
from .panels import on_metric, on_play, on_replay, on_round, on_theory
from .settings import (MODEL_OUTPUTS, on_draft, on_method, on_model, on_mu_auto, on_reset, on_word, tour_controls,
                       tour_step)

PRIVATE = {"api_visibility": "private"}  # UI callbacks: not part of the API (only /generate and /generate_batch are)
RANDOM_SEED = f"() => Math.floor(Math.random() * {PARAMS['seed'].high + 1})"  # in the browser: no endpoint
NARROW = "() => window.innerWidth < 600"  # a phone: figures drawn for a panel about 360 px wide

# The race's first frame: when the Race tab is shown but the race is not wholly in view (at 1400x1000 the timing
# table pushes it below the window), scroll it to the window's top; once per race, so a user may scroll away.
SHOW_RACE = """() => {
    const race = document.querySelector('#race-image'), text = document.querySelector('#race-text');
    if (!race || race.offsetParent === null) return;
    const top = race.getBoundingClientRect().top, bottom = (text || race).getBoundingClientRect().bottom;
    if (top >= 0 && bottom <= window.innerHeight) return;
    if (Date.now() - (window.coolsdRaceShown || 0) < 10000) return;
    window.coolsdRaceShown = Date.now();
    race.scrollIntoView({behavior: 'smooth', block: 'start'});
}"""
FIGURES = ("per_position", "lengths", "map_method", "map_eagle", "replay_plot", "theory_plot", "theory_md",
           "tradeoff_plot", "tradeoff_note")  # every figure of the tabs and its text: on_figures's and on_width's

# A click that starts a generation hides the images and caption at once ("replaced"), in the click itself (a
# capture listener, before Gradio handles it), so that no picture of an older request still on its way shows
# after the click (the page applies every message it receives); the new request's first output, its serial
# (SHOW_NEW), or a refused setting shows them again. On a phone the images are below the settings: a click
# scrolls them into view, to watch them drawn.
HIDE_ON_CLICK = """document.addEventListener('click', event => {
        if (event.target.closest('#generate, #tour button')) document.body.classList.add('replaced');
    }, true);"""  # on <body>: Gradio re-renders its own elements' classes
START = ("() => { if (window.innerWidth < 600) document.querySelector('#caption')"
         ".scrollIntoView({behavior: 'smooth'}); }")
SHOW_NEW = "() => { document.body.classList.remove('replaced'); }"
# At load: the click listener above; whether the page is narrow, and from then on a click of the hidden #relayout
# each time the window's width crosses 600 px (a phone turned, a window resized), so that the figures are drawn
# again for it.
PAGE_LOAD = """() => {
    """ + HIDE_ON_CLICK + """
    let narrow = window.innerWidth < 600;
    window.addEventListener('resize', () => {
        if ((window.innerWidth < 600) !== narrow) {
            narrow = !narrow;
            document.querySelector('#relayout')?.click();
        }
    });
    return narrow;
}"""


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


def theory_inputs(ui: dict) -> list:
    """What the theory panel follows (:func:`coolsd.app.web.panels.on_theory`, after the last result): every
    control, the (p, q) source, the toy seed, whether the page is narrow."""
    return [*(ui[name] for name in session.value_names()), ui["source"], ui["toy_seed"], ui["narrow"]]


def generation_steps(ui: dict, start: Callable) -> dict:
    """Check, generate, then the figures, then the timings, after ``start`` (a click, or another event's
    ``.then``); the generation step's dependency. The check has no outputs, so a refused setting leaves the last
    result on the page; a newer generation's images make an older one's pending figures and timing stale
    (``generation.stale``)."""
    inputs = [ui[name] for name in session.value_names()]
    checking = start(on_check, inputs, None, **PRIVATE)
    checking.failure(None, js=SHOW_NEW)  # a refused setting: the last result stays, shown
    generating = checking.success(
        with_progress(on_generate, session=True), inputs, [ui[name] for name in GENERATE_OUTPUTS],
        concurrency_id="generate", show_progress_on=ui["timings"], trigger_mode="multiple", **PRIVATE)
    generating.then(
        on_figures_for_page, [ui[name] for name in ("result", "metric", "families")] + theory_inputs(ui),
        [ui[name] for name in FIGURES],
        trigger_mode="always_last", **PRIVATE).then(
        on_timing_with_progress, ui["result"], [ui["timings"], ui["result"]], api_name="on_timing",
        concurrency_id="generate", show_progress_on=ui["timings"], trigger_mode="always_last", **PRIVATE).then(
        on_race, ui["result"], [ui["race_image"], ui["race_text"]], concurrency_id="race", concurrency_limit=8,
        show_progress="hidden", trigger_mode="always_last", **PRIVATE)
    # "once" would drop a newer request's step while an older one's runs
    return generating


def stop_older_generations(demo: gr.Blocks, first_listeners: list[dict], generations: list[dict]) -> None:
    """Each start of a generation first stops (Gradio's ``cancels``) every generation still drawing, so that no
    picture of an older request arrives after the click. Its listener must be the first of its trigger, since
    the page runs a trigger's listeners in turn: set on ``first_listeners`` once every generation exists."""
    ids = [generation["id"] for generation in generations]
    for listener in first_listeners:
        demo.fns[listener["id"]].cancels = ids


def wire_generation(demo: gr.Blocks, ui: dict) -> None:
    """Generate (the button, and the tour's steps that generate); the theory panel follows the method's
    controls, from page load on."""
    first = [ui["run"].click(None, js=START)]  # stops older generations too (stop_older_generations)
    generations = [generation_steps(ui, functools.partial(ui["run"].click, trigger_mode="multiple"))]
    outputs = [ui[name] for name in tour_controls()] + [ui["tour_text"]]
    for index, button in enumerate(ui["tour_buttons"]):
        if tour.STEPS[index].generate:
            first.append(button.click(None, js=START))
        step = button.click(tour_step(index), None, outputs, **PRIVATE)
        if tour.STEPS[index].generate:
            generations.append(generation_steps(ui, step.then))
    stop_older_generations(demo, first, generations)
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
    ui["race_image"].change(None, js=SHOW_RACE)
    ui["shown_serial"].change(None, js=SHOW_NEW)  # a new generation's first output: no older picture follows it
    ui["race_again"].click(on_race, ui["result"], [ui["race_image"], ui["race_text"]], concurrency_id="race",
                           show_progress="hidden", **PRIVATE)
    gr.on([ui["metric"].input, ui["families"].input], on_metric,
          [ui[name] for name in ("result", "metric", "families", "model", "narrow")],
          [ui["tradeoff_plot"], ui["tradeoff_note"]], **PRIVATE)
    # .select: a dropdown's .input fires twice per choice. Loads have their own queue: a slow or failing download
    # never holds a generation's place (Models.get loads one model at a time anyway).
    ui["model"].select(with_progress(on_model), [ui[name] for name in ("model", "model_state", "narrow", "draft",
                                                                       "drafter")],
                       [ui[name] for name in MODEL_OUTPUTS], concurrency_id="load", concurrency_limit=4, **PRIVATE)
    ui["examples"].input(lambda example: (example or gr.skip(), None), ui["examples"],
                         [ui["prompt"], ui["examples"]], **PRIVATE)


def wire_controls(demo: gr.Blocks, ui: dict, boxes: list[gr.Column]) -> None:
    """The controls among themselves: visibility per method, word checkboxes, the omega line, seed dice,
    presets and Reset."""
    ui["method"].change(on_method, ui["method"], [*boxes, ui["draft_box"]], **PRIVATE)
    ui["draft"].change(views.draft_note, ui["draft"], ui["draft_note"], show_progress="hidden", **PRIVATE)
    ui["draft"].change(on_draft, [ui["draft"], ui["model"]], ui["drafter"], show_progress="hidden", **PRIVATE)
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


def wire(demo: gr.Blocks, ui: dict, boxes: list[gr.Column], start: dict) -> None:
    """Every event of the page, then the public API, whose values a call leaves out default to ``start`` (the
    default model's starting values)."""
    demo.load(None, None, ui["narrow"], js=PAGE_LOAD)
    ui["relayout"].click(None, None, ui["narrow"], js=NARROW)
    ui["narrow"].change(on_width, [ui[name] for name in ("result", "metric", "families", "model", "round_slider")]
                        + theory_inputs(ui), [ui[name] for name in FIGURES], trigger_mode="always_last", **PRIVATE)
    wire_generation(demo, ui)
    wire_controls(demo, ui, boxes)
    gr.api(api.documented(api.generate, start), api_name="generate", concurrency_id="generate")
    gr.api(api.documented(api.generate_batch, start), api_name="generate_batch", concurrency_id="generate")
