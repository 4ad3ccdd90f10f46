"""How the explorer lays out each method's controls, derived from the rule registry and independent of Gradio:
which controls exist, their starting values (a model's own included), which method entries show them, and how they
group into boxes."""

from __future__ import annotations

import math
from typing import Any

from ..core.params import Choice, Param, show_number
from ..core.rules import RULES
from ..models.bundle import DRAFTER_NAMES, Bundle
from ..models.registry import EXAMPLE_PROMPTS
from . import models, session

OMEGA_LINE = "omega_line"  # COOL-SD's computed mu and omegas, shown under its controls
DEFAULT_METHOD = "COOL-SD"


def slider_start(param: Param, maximum: float | None = None) -> float:
    """A slider's first value: the default, or 0 clipped into the range when the default is a word (mu: auto)."""
    maximum = param.high if maximum is None else maximum
    return param.default if not isinstance(param.default, str) else min(max(0, param.low), maximum)


def control_defaults(control: session.MethodControl) -> dict[str, Any]:
    """A method control's starting values by value name: a word's checkbox is ticked when it is the default."""
    param = control.schema
    if isinstance(param, Choice):
        return {control.name: param.default}
    ticked = {name: param.default == word for name, word in control.words.items()}
    return {**ticked, control.name: slider_start(param)}


def model_defaults(bundle: Bundle) -> dict[str, Any]:
    """A model's own starting values: its default class (the second, as before) and its sampling settings."""
    names, sampling = bundle.class_names, bundle.sampling
    return {"class_name": names[1] if len(names) > 1 else (names[0] if names else None),
            "cfg_scale": sampling.cfg_scale, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p}


def defaults(bundle: Bundle) -> dict[str, Any]:
    """Every control's starting (and Reset) value by value name (``session.value_names``), read from the rule
    registry now; class, sampling and draft from ``bundle``."""
    values: dict[str, Any] = {"method": DEFAULT_METHOD}
    for control in session.method_controls():
        values.update(control_defaults(control))
    return {**values, "draft": session.default_draft(bundle), "drafter": session.default_drafter(bundle), "seed": 0,
            **model_defaults(bundle), "model": models.DEFAULT, "prompt": EXAMPLE_PROMPTS[0]}


def layout_items() -> list[tuple[str, frozenset[str]]]:
    """The method controls in registry order as (name, the entries it is shown for), with COOL-SD's omega line
    right after the last control COOL-SD takes."""
    items = [(control.name, control.labels) for control in session.method_controls()]
    cool = frozenset(label for label, (name, _) in session.method_entries().items() if name == "cool")
    last = max((i for i, (_, labels) in enumerate(items) if labels & cool), default=None)
    if last is not None:
        items.insert(last + 1, (OMEGA_LINE, cool))
    return items


def method_boxes() -> list[tuple[frozenset[str], list[str]]]:
    """Consecutive items shown for the same entries share a box: one visibility switch per box follows the
    method, and a hidden box leaves no gap."""
    boxes: list[tuple[frozenset[str], list[str]]] = []
    for name, labels in layout_items():
        if boxes and boxes[-1][0] == labels:
            boxes[-1][1].append(name)
        else:
            boxes.append((labels, [name]))
    return boxes


def drafting_labels() -> set[str]:
    """The method entries that draft (all but AR): only they show the draft structure."""
    return {label for label, (name, _) in session.method_entries().items() if RULES[name].drafts}


def drafter_choices(bundle: Bundle) -> list[tuple[str, str]]:
    """The drafter selector's choices for ``bundle``: (display name, name) of each drafter it carries."""
    return [(DRAFTER_NAMES.get(name, name), name) for name in bundle.drafters]


def shows_drafter(bundle: Bundle, draft) -> bool:
    """Whether the drafter selector shows: only where there is a choice (the model carries two drafters or more)
    that matters (the draft is a chain or tree; a Jacobi window needs no drafter, and AR hides the whole box)."""
    if len(bundle.drafters) < 2:
        return False
    try:
        return session.model_draft(bundle, session.choice("draft structure", draft, session.DRAFTS)).needs_drafter
    except ValueError:
        return False


def suited_drafter(bundle: Bundle, drafter) -> str | None:
    """``drafter`` where ``bundle`` carries it (a model switch keeps the user's choice where it can), else the
    model's :func:`session.default_drafter`."""
    return drafter if isinstance(drafter, str) and drafter in bundle.drafters else session.default_drafter(bundle)


def word_label(param: Param, word: str) -> str:
    """``μ auto``: the parameter's symbol (its label's first word) and the word."""
    return f"{param.label.split(' (')[0]} {word}"


def corrected(param: Param, value: Any, high: float | None = None) -> tuple[float | int, str] | None:
    """None when ``value`` is what will run; else the value a typed control is set back to and why: a number
    outside the range goes to its nearest end (whole for an integer parameter), anything else to the start."""
    top = param.high if high is None else high
    try:
        param.check(value, high)
        return None
    except ValueError as error:
        reason = str(error)
    if value is None:  # what a browser sends for an empty box, or for a number it cannot hold (1e999)
        reason = f"{param.name} must be a number from {param.span()}; the box held none it could read (empty, or too large)"
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        fixed = slider_start(param, top)
    else:
        fixed = min(max(number, param.low), top)
    fixed = int(round(fixed)) if param.integer else fixed
    return fixed, f"{reason} (set to {show_number(fixed)})"
