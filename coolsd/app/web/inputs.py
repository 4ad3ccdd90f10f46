"""Control values in, a validated request out: the page's starting values, the typed controls' ranges, and bad
input as one readable message in the UI (never a stack trace) and one line in the log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import gradio as gr

from ...core.params import PARAMS, Param, clip
from ...core.rules import schema
from ...models.bundle import Bundle
from .. import controls, session, views
from .runtime import current

log = logging.getLogger("coolsd.app")
INVALID_SETTING = "Invalid setting"  # the title of a refused setting (the API answers it with HTTP 422)


def defaults(bundle: Bundle | None = None) -> dict[str, Any]:
    """Every control's starting (and Reset) value by value name (``session.value_names``); class, sampling and
    draft from ``bundle`` (default: the default model's)."""
    return controls.defaults(bundle or current().bundle)


def checked(compute):
    """Run ``compute``; bad input becomes a readable error in the UI, never a stack trace; a rejected request
    is one line in the log."""
    try:
        return compute()
    except gr.Error:
        raise
    except ValueError as error:
        log.info("rejected request: %s", clip(str(error), 300))
        raise gr.Error(str(error), title=INVALID_SETTING, print_exception=False) from None
    except Exception as error:  # keep the server up and say what happened
        log.exception("request failed")
        raise gr.Error(f"Generation failed: {type(error).__name__}: {clip(str(error), 200)}", title="Error",
                       print_exception=False) from None


END = object()


def checked_steps(steps: Iterator) -> Iterator:
    """``steps`` with each step :func:`checked`: bad input or a failure at any step is one readable error.
    Closing it closes ``steps`` (a GPU call's: its work stops there)."""
    with closing(steps):
        while (step := checked(lambda: next(steps, END))) is not END:
            yield step


def ranged_params() -> dict[str, Param]:
    """The typed controls and the range each is checked against: every numeric method parameter (from the
    registry now), the seed and the sampling settings, and the theory's toy seed."""
    names = [control.name for control in session.method_controls() if isinstance(control.schema, Param)]
    return {**{name: schema(name) for name in names}, **{name: PARAMS[name] for name in (
        "cfg_scale", "temperature", "top_k", "top_p", "seed")}, "toy_seed": views.TOY_SEED}


def parse(values, progress=None, load: bool = True) -> tuple[Bundle, session.Request]:
    """Validate the control values (``session.value_names`` order) into the chosen model (loaded on first use,
    unless ``load`` is False) and a ``session.Request`` (a readable error otherwise)."""
    state, names = current(), session.value_names()
    if len(values) != len(names):  # parse_controls says what is wrong
        return state.bundle, checked(lambda: session.parse_controls(state.bundle, values))
    named = dict(zip(names, values))
    bundle = checked(lambda: state.models.get(named["model"], progress, load=load))
    named["model"] = state.models.key(named["model"])
    for name, param in ranged_params().items():  # typed out of range: its own event warned and set it back
        fix = controls.corrected(param, named[name], bundle.config.vocab_size if name == "top_k" else None) \
            if name in named else None
        if fix is not None:
            named[name] = fix[0]
    return bundle, checked(lambda: session.parse_controls(bundle, list(named.values())))


def session_of(request: gr.Request | None) -> str | None:
    """The browser session an event came from (None for a direct call, which is never stale)."""
    return getattr(request, "session_hash", None)


def on_range(param: Param) -> Callable:
    """The check of one typed control: a value outside ``param``'s range is one warning that names it, and
    the control is set back to the value that will run (the nearest end)."""
    def check_range(value, model=None):
        bundle = current().models.peek(model) or current().bundle
        fix = controls.corrected(param, value, bundle.config.vocab_size if param.name == "top_k" else None)
        if fix is None:
            return gr.skip()
        log.info("corrected %s: %s", param.name, clip(fix[1], 300))
        gr.Warning(fix[1], title="Out of range")
        return fix[0]
    check_range.__name__ = f"check_{param.name}"
    return check_range
