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
from .generation import on_check, on_figures, on_generate, on_race, on_timing_with_progress
from .inputs import on_range, ranged_params, session_of
from .panels import on_metric, on_play, on_replay, on_round, on_theory
from .settings import MODEL_OUTPUTS, on_method, on_model, on_mu_auto, on_reset, on_word, tour_controls, tour_step

PRIVATE = {"api_visibility": "private"}  # UI callbacks: not part of the API (only /generate and /generate_batch are)
RANDOM_SEED = f"() => Math.floor(Math.random() * {PARAMS['seed'].high + 1})"  # in the browser: no endpoint
NARROW = "() => window.innerWidth < 600"  # a phone: figures drawn for a panel about 360 px wide
# on a phone the images are below the settings: scroll them into view, to watch them drawn
SHOW_IMAGES = ("() => { if (window.innerWidth < 600) document.querySelector('#caption')"
               ".scrollIntoView({behavior: 'smooth'}); }")


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


def generation_steps(ui: dict, start: Callable) -> None:
    """Check, generate, then the figures, then the timings, after ``start`` (a click, or another event's
    ``.then``). The check has no outputs, so a refused setting leaves the last result on the page; a newer
    generation's images make an older one's pending figures and timing stale (``generation.stale``)."""
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


def wire_controls(demo: gr.Blocks, ui: dict, boxes: list[gr.Column]) -> None:
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


def wire(demo: gr.Blocks, ui: dict, boxes: list[gr.Column], start: dict) -> None:
    """Every event of the page, then the public API, whose values a call leaves out default to ``start`` (the
    default model's starting values)."""
    demo.load(None, None, ui["narrow"], js=NARROW)
    wire_generation(demo, ui)
    wire_controls(demo, ui, boxes)
    gr.api(api.documented(api.generate, start), api_name="generate", concurrency_id="generate")
    gr.api(api.documented(api.generate_batch, start), api_name="generate_batch", concurrency_id="generate")
