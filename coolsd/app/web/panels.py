"""Handlers of the figure tabs that follow the controls without a new generation: the theory panel, Replay's
round slider and Play button, and the trade-off figure's quality axis and series."""

from __future__ import annotations

import time

import gradio as gr

from ...core.params import Param
from .. import session, views
from .inputs import on_range
from .runtime import current


def theory_outputs(result, request, source, toy_seed, narrow=False):
    """Figure and table of the theory panel, or (an empty figure, why) where it does not apply. Errors are
    shown in the panel: it follows every slider move, and a toast per move would bury the user. Captured pairs
    are evaluated with the rule of the model that made them."""
    if request.method == "ar":
        return None, "AR drafts nothing: choose a speculative method to see its theory."
    capture = current().models.peek(result.request.model) if result is not None else None
    try:
        figure, table, notes = views.theory_panel(
            result, request, "toy" if source == "toy distributions" else "captured", toy_seed, capture, bool(narrow))
    except ValueError as error:
        return None, f"⚠️ {views.plain(str(error), 600)}"
    return figure, views.theory_markdown(table, notes, views.scheduled(request.rule), request.label)


def on_theory(result, *values):
    """Recompute the theory panel when a slider moves (no new generation). ``values``: the controls
    (``session.value_names`` order), then the (p, q) source, the toy seed and whether the page is narrow."""
    *controls, source, toy_seed, narrow = values
    names, state = session.value_names(), current()
    bundle = state.models.peek(controls[names.index("model")]) if len(controls) == len(names) else state.bundle
    if bundle is None:  # a model not loaded yet: the panel follows once it is
        return None, "Choose a model and generate first."
    try:
        request = session.parse_controls(bundle, controls)
    except ValueError as error:
        return None, f"⚠️ {views.plain(str(error), 600)}"
    return theory_outputs(result, request, source, toy_seed, narrow)


def on_round(result, round_index):
    """A typed Round: outside the last generation's rounds, one warning and the nearest round, as for every
    other typed number (:func:`coolsd.app.web.inputs.on_range`)."""
    rounds = len(result.method.stats.rounds) if result is not None else 2
    return on_range(Param("round", 0, max(1, rounds - 1), 0, 1, "Round", integer=True))(round_index)


def on_replay(result, round_index, narrow=False):
    if result is None:
        return gr.skip()
    try:
        index = int(round_index)
    except (TypeError, ValueError):
        return gr.skip()
    return views.replay_figure(current().bundle_of(result.request), result, index, bool(narrow))


def on_play(result):
    """Step through every round (a short animation); the slider's change event draws each frame."""
    if result is None:
        raise gr.Error("Generate an image first.", title="Nothing to replay", print_exception=False)
    for index in range(len(result.method.stats.rounds)):
        yield index
        time.sleep(0.3)


def tradeoff_outputs(bundle, result, metric, families, narrow) -> tuple:
    """The trade-off figure and its note, for the figure's and the note's components."""
    figure, note = views.tradeoff_panel(bundle, result, metric, families, bool(narrow))
    return figure, views.plain(note, 600) if note else ""


def on_metric(result, metric, families, model="", narrow=False):
    """The trade-off figure and note again, for another quality axis or set of series."""
    state = current()
    bundle = state.bundle_of(result.request) if result is not None else state.models.peek(model) or state.bundle
    return tradeoff_outputs(bundle, result, metric, families, narrow)
