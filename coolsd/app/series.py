"""The names the app, its figures and the study's summary give methods and benchmark series, read from the rule
registry: a method's label, a series' key and display name, a point's label, a Jacobi window's published name.
Without matplotlib, so that :mod:`coolsd.app.claims` (``bench --summary``) can name families too."""

from __future__ import annotations

from ..core.params import Choice
from ..core.rules import RULES
from ..core.trees import DraftTree, parse_draft

# Names the app shows: from the rule registry ------------------------------------------------------------
SYMBOLS = {"delta": "δ", "nu": "ν", "mu": "μ", "lambda": "λ"}
# The relaxed rules whose families the study's summary compares, by the registry's label (``COOL-SD``)
FAMILY_NAMES = {name: RULES[name].label for name in ("cool", "lantern", "uniform", "gsd")}


def _variant(method: str, params: dict | None) -> tuple[str, dict]:
    """The app's entry for a method and its parameters: (label, the parameters that entry fixes)."""
    spec = RULES.get(method)
    if spec is None:
        return method, {}
    for label, fixed in spec.variants.items():
        if all((params or {}).get(key) == value for key, value in fixed.items()):
            return label, fixed
    return spec.label, {}


def method_name(method: str, params: dict | None = None) -> str:
    """The app's label for an internal method name, so figures speak the UI's language."""
    return _variant(method, params)[0]


def swept(method: str) -> tuple[str, ...]:
    """The parameters whose values vary along one of the method's lines (its relaxation strength)."""
    return RULES[method].swept if method in RULES else ()


def _named(method: str, key: str) -> bool:
    """Whether the parameter takes named values (a schedule): shown bare, after the numbers."""
    return method in RULES and isinstance(next((p for p in RULES[method].params if p.name == key), None), Choice)


def _parameter(method: str, key: str, value) -> str:
    """``δ=2`` for a parameter; a named value shows bare (``linear``)."""
    return str(value) if _named(method, key) else f"{SYMBOLS.get(key, key)}={value}"


# A Jacobi window's refresh, as the published method it makes with Eagle-1's rule (spec section 11)
WINDOW_NAMES = {"independent": "SJD", "coupled": "SCD", "gumbel": "Gumbel coupling"}
# What Eagle-1's lossless test on a window of each refresh is known as, in the draft selector's note: a Gumbel
# coupling refreshes SJD's window, so it is "SJD with Gumbel coupling" there
EAGLE_ON_WINDOW = {**WINDOW_NAMES, "gumbel": f"{WINDOW_NAMES['independent']} with {WINDOW_NAMES['gumbel']}"}


def jacobi_window(run: dict) -> DraftTree | None:
    """The run's Jacobi window, or None for a draft model's draft (or none): the drafter-free runs are told apart
    by how their window is refreshed, not by their method alone (Eagle-1 on a window is SJD, SCD, ...)."""
    draft = run.get("draft")
    if not draft or draft == "none" or not draft.startswith("jacobi"):
        return None
    return parse_draft(draft)


def family(run: dict) -> str:
    """A benchmark run's series: its method and every parameter except the relaxation strength, and for a Jacobi
    window its kind (refresh and fresh-draft law, not its length: ``eagle @ jacobi:coupled:point``). Internal
    names; :func:`family_name` is what the figure shows."""
    fixed = ", ".join(f"{key}={value}" for key, value in sorted(run["params"].items())
                      if key not in swept(run["method"]))
    key = f"{run['method']} ({fixed})" if fixed else run["method"]
    window = jacobi_window(run)
    return key if window is None else f"{key} @ jacobi:{window.refresh}:{window.fresh}"


def window_name(window: DraftTree) -> str:
    """``SCD`` for a coupled window whose fresh drafts are point masses (as published), ``SCD, uniform fresh``
    for the other law."""
    return WINDOW_NAMES[window.refresh] + ("" if window.fresh == "point" else f", {window.fresh} fresh")


def family_name(run: dict) -> str:
    """A series' display name: the app's method name plus the fixed parameters, e.g. ``COOL-SD (ν=0.3, linear)``;
    on a Jacobi window, the published method (``SJD``, ``GSD``) or the rule and its window (``COOL-SD on SCD``)."""
    params = run["params"]
    name, in_name = _variant(run["method"], params)
    keys = sorted(params, key=lambda key: (_named(run["method"], key), key))  # "COOL-SD (ν=0.3, linear)"
    fixed = [_parameter(run["method"], key, params[key]) for key in keys
             if key not in swept(run["method"]) and key not in in_name]
    name = f"{name} ({', '.join(fixed)})" if fixed else name
    window = jacobi_window(run)
    if window is None:
        return name
    if run["method"] == "eagle":
        return window_name(window)
    if run["method"] == "gsd" and (window.refresh, window.fresh) == ("independent", "point"):
        return name  # GSD as published
    return f"{name} on {window_name(window)}"


def point_label(run: dict) -> str:
    """What varies along a series at this point (``δ=2``, ``k=10, λ=5``); the series' name for a lone point
    (``Eagle-1``, or ``SCD`` for Eagle-1 on a coupled Jacobi window)."""
    method, params = run["method"], run["params"]
    varied = [_parameter(method, key, params[key]) for key in swept(method) if key in params]
    return ", ".join(varied) if varied else family_name(run).split(" (")[0]
