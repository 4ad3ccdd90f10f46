"""Handlers of the settings column: which controls each method shows, word checkboxes ("auto"), the model
selector, Reset, and the guided tour's steps (each sets controls; some then generate)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import gradio as gr

from ...core.params import clip
from ...core.rules import schema
from ...models.bundle import Bundle
from .. import session, tour, views
from ..controls import drafter_choices, drafting_labels, method_boxes, model_defaults, shows_drafter, suited_drafter
from .inputs import defaults
from .panels import tradeoff_outputs
from .runtime import current

log = logging.getLogger("coolsd.app")
MODEL_OUTPUTS = ("model", "class_name", "prompt_box", "top_k", "cfg_scale", "temperature", "top_p", "draft", "drafter",
                 "metric", "families", "tradeoff_plot", "tradeoff_note", "model_state")


def on_method(method):
    """Show only the controls that apply to ``method``: one switch per box of ``method_boxes``, then the draft
    structure."""
    return [gr.update(visible=method in labels) for labels, _ in method_boxes()] + \
        [gr.update(visible=method in drafting_labels())]  # the draft selector and its note


def on_draft(draft, model=None):
    """The drafter selector follows the draft: shown for a chain or tree of a model with a choice of drafters,
    hidden for a Jacobi window (the target drafts for itself; :func:`coolsd.app.controls.shows_drafter`)."""
    bundle = current().models.peek(model) or current().bundle
    return gr.update(visible=shows_drafter(bundle, draft))


def drafter_update(bundle: Bundle, draft: str, drafter) -> dict:
    """The drafter selector for a model just chosen: its drafters, the user's choice where it has it (else its
    default drafter), shown where it is a choice for ``draft``."""
    return gr.update(choices=drafter_choices(bundle), value=suited_drafter(bundle, drafter),
                     visible=shows_drafter(bundle, draft))


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


def on_model(choice, previous, narrow=False, draft=None, drafter=None, progress=None):
    """The model selector: load the chosen model (first use only), then show its class dropdown or prompt box,
    its top-k range, its sampling defaults, a draft it can run (``draft`` kept where it can: a model without a
    draft model gets a Jacobi window), its drafters (``drafter`` kept where it has it) and its trade-off figure
    (``MODEL_OUTPUTS``). A model that cannot be loaded is a notice, and the selection goes back to ``previous``."""
    state = current()
    try:
        bundle = state.models.get(choice, progress)
    except ValueError as error:
        log.info("model not loaded: %s", clip(str(error), 300))
        gr.Warning(clip(str(error), 400), title="Model not available")
        return (gr.update(value=previous), *[gr.skip()] * (len(MODEL_OUTPUTS) - 2), previous)
    start, text = model_defaults(bundle), session.text_model(bundle)
    metric, (choices, shown) = views.default_metric(bundle), views.tradeoff_families(bundle)
    suited = session.suited_draft(bundle, draft) if draft is not None else draft
    return (gr.skip(), gr.update(choices=bundle.class_names, value=start["class_name"], visible=not text),
            gr.update(visible=text), gr.update(maximum=bundle.config.vocab_size, value=start["top_k"]),
            start["cfg_scale"], start["temperature"], start["top_p"], gr.skip() if suited == draft else suited,
            drafter_update(bundle, suited if suited is not None else session.default_draft(bundle), drafter), metric,
            gr.update(choices=list(choices.items()), value=shown),
            *tradeoff_outputs(bundle, None, metric, shown, narrow), state.models.key(choice))


def on_reset(model):
    """Reset: every control's starting value, with the chosen model's class, sampling and draft (not the model, nor
    the prompt)."""
    start = defaults(current().models.peek(model))
    return [start[name] for name in session.value_names() if name not in session.CONDITION]


def tour_controls() -> list[str]:
    """Every control some tour step sets, in ``session.value_names`` order."""
    wanted = {name for step in tour.STEPS for name in step.values}
    return [name for name in session.value_names() if name in wanted]


def on_tour(index: int) -> list:
    """A tour step's button: the values it sets (:func:`tour_controls` order; a skip keeps the control as it is)
    and its text."""
    step = tour.STEPS[index]
    return [step.values.get(name, gr.skip()) for name in tour_controls()] + [tour.step_text(step, current().tour_facts)]


def tour_step(index: int) -> Callable[[], list]:
    """Step ``index``'s button handler (:func:`on_tour`, with the index fixed)."""
    def on_tour_step() -> list:
        return on_tour(index)
    return on_tour_step
