"""The public API: ``/generate`` and ``/generate_batch`` (the only endpoints; docs/app.md), their answers' types,
and how an API call's values become a validated request, with the same readable errors as the page's."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypedDict

from ...core.params import PARAMS, Choice, Param, check, shorten
from ...core.rules import schema
from ...models.bundle import DRAFTER_NAMES, Bundle
from .. import session, views
from ..controls import model_defaults
from . import gpu
from .inputs import checked, checked_steps, defaults
from .runtime import current

API_DRAFT = "chain:5"  # the API's documented default draft (a model without a draft model takes its own instead)
MODEL_VALUES = ("class_name", "cfg_scale", "temperature", "top_k", "top_p")  # default: the chosen model's own
GSD_DEFAULTS = [schema(name).default for name in ("ranks", "gap", "dist")]
API_DRAFTER = session.DEFAULT_DRAFTER  # the documented drafter (a model without it drafts with its own instead)
# values added to the API later, last: clients may leave them out (/generate's model and prompt, GSD's, the drafter)
OPTIONAL_TRAILING = {"generate": ["", "", *GSD_DEFAULTS, API_DRAFTER], "generate_batch": [*GSD_DEFAULTS, API_DRAFTER]}


class ModelOwn:
    """The Python default of a model-dependent value (``MODEL_VALUES``): the chosen model's own. Not None, which
    a client may send and which is refused as any missing value is."""

    def __repr__(self) -> str:
        return "the model's own"


MODEL_OWN = ModelOwn()


class Run(TypedDict):
    """One generation: its image tokens, the decoded picture, and its statistics."""

    tokens: list[int]
    pixels: list[list[list[int]]]  # height x width x 3 (RGB): the API page shows this type
    png_base64: str
    stats: dict[str, Any]


class GenerateResult(TypedDict):
    """``/generate``'s answer: the chosen method's run, lossless Eagle-1's run on the same class and seed, and
    the latencies of AR, Eagle-1 and the method from interleaved repeats (None when ``timing_repeats`` is 0)."""

    method: Run
    eagle: Run
    timing: dict[str, Any] | None


def generate(method: str = "COOL-SD", delta: float = 2.0, nu: float = 0.7, mu: str = "auto", k: int = 10,
             lam: float = 5.0, draft: str = API_DRAFT, class_name: str | ModelOwn = MODEL_OWN,
             seed: int = 0, cfg_scale: float | ModelOwn = MODEL_OWN, temperature: float | ModelOwn = MODEL_OWN,
             top_k: int | ModelOwn = MODEL_OWN, top_p: float | ModelOwn = MODEL_OWN, schedule: str = "exp",
             timing_repeats: int = 0, model: str = "", prompt: str = "", ranks: int = 7, gap: float = 0.15,
             dist: float = 0.5, drafter: str = API_DRAFTER) -> GenerateResult:
    """Generate with one method and with lossless Eagle-1: both images (PNG base64 and pixels), tokens and
    statistics. ``mu`` is "auto" or a number. ``timing_repeats`` > 0 also times AR, Eagle-1 and the method
    that many times each, interleaved. ``model``: one of the app's model choices (empty: the default model);
    a text model takes ``prompt`` instead of ``class_name``; with another model, a class or sampling value left
    at its default stands for that model's default, and so does the draft ``chain:5`` on a model without a draft
    model. ``ranks``, ``gap``, ``dist``: GSD's; ``drafter``: which of the model's drafters a chain or tree drafts
    with, in both images (last, so that older clients keep their positions). Parameter ranges: see docs/app.md."""
    request = api_request(method, delta, nu, mu, k, lam, draft, class_name, seed, cfg_scale, temperature, top_k,
                          top_p, schedule, model, prompt, ranks, gap, dist, drafter)
    repeats = checked(lambda: check("timing_repeats", timing_repeats))
    *_, result = checked_steps(gpu.compare(request, live=False))
    if repeats:
        *_, result.timing = checked_steps(gpu.measure(request, repeats))  # on ZeroGPU too, like the UI's timing
    return views.api_payload(result)


def generate_batch(method: str = "COOL-SD", delta: float = 2.0, nu: float = 0.7, mu: str = "auto", k: int = 10,
                   lam: float = 5.0, draft: str = API_DRAFT,
                   class_name: str | ModelOwn = MODEL_OWN, seeds: list[int] = [0, 1, 2, 3],  # noqa: B006
                   cfg_scale: float | ModelOwn = MODEL_OWN, temperature: float | ModelOwn = MODEL_OWN,
                   top_k: int | ModelOwn = MODEL_OWN, top_p: float | ModelOwn = MODEL_OWN, schedule: str = "exp",
                   model: str = "", prompt: str = "", ranks: int = 7, gap: float = 0.15, dist: float = 0.5,
                   drafter: str = API_DRAFTER) -> dict:
    """As ``/generate``, for a list of 1 to 16 seeds decoded as one batch per method (each image gets the
    tokens it gets alone, spec section 9): per seed both images, tokens and statistics, and each batch's seconds.
    No timing repeats (``/generate`` measures them)."""
    checked_seeds = checked(lambda: session.check_seeds(seeds))
    request = api_request(method, delta, nu, mu, k, lam, draft, class_name, checked_seeds[0], cfg_scale, temperature,
                          top_k, top_p, schedule, model, prompt, ranks, gap, dist, drafter)
    return views.api_batch_payload(checked(lambda: gpu.compare_batch(request, checked_seeds)))


def documented(endpoint: Callable, start: dict[str, Any]) -> Callable:
    """``endpoint`` as Gradio lists and calls it: its model-dependent values (``MODEL_VALUES``, ``MODEL_OWN`` in
    Python) default to the default model's ``start`` values, with their plain types, so that the API page shows
    the values a call that leaves them out gets; its docstring ends with a line per value (:func:`value_notes`),
    which Gradio's MCP server gives each tool parameter."""
    hints = typing.get_type_hints(endpoint)
    parameters = [parameter.replace(annotation=hints[name]) if name not in MODEL_VALUES else
                  parameter.replace(annotation=plain(hints[name]), default=start[name])
                  for name, parameter in inspect.signature(endpoint).parameters.items()]

    @functools.wraps(endpoint)
    def call(*args, **kwargs):
        return endpoint(*args, **kwargs)

    call.__signature__ = inspect.Signature(parameters, return_annotation=hints["return"])
    notes = value_notes()
    call.__doc__ = inspect.getdoc(endpoint) + "\n\nArgs:\n" + "\n".join(
        f"    {parameter.name}: {notes[parameter.name]}" for parameter in parameters)
    call.__annotations__ = {**{parameter.name: parameter.annotation for parameter in parameters},
                            "return": hints["return"]}
    return call


def value_notes() -> dict[str, str]:
    """One line per API value, read from the registry now: what it is, its range, and for a method's parameter
    the entries that take it. An MCP client reads nothing else about a tool's parameters (no docs/app.md)."""
    notes = {control.name: f"{param_note(control.schema)}; taken by {', '.join(sorted(control.labels))}"
             for control in session.method_controls()}
    notes.update({name: param_note(PARAMS[name]) for name in ("cfg_scale", "temperature", "top_p", "seed")})
    seed = PARAMS["seed"]
    return {**notes, "lam": notes["lambda"],
            "method": "the method, one of " + ", ".join(session.method_entries()),
            "draft": "the draft structure, one of " + ", ".join(session.DRAFTS),
            "drafter": "the drafter a chain or tree drafts with, in both images: "
                       + ", ".join(f"{name} ({shown})" for name, shown in DRAFTER_NAMES.items())
                       + f", by name or display name, one the model carries (default {API_DRAFTER}; a Jacobi "
                       "window needs none)",
            "class_name": "the class to draw, one of the model's class names (a class-to-image model)",
            "top_k": "Top-k: sample among the k likeliest tokens, 0 (off) to the model's vocabulary size",
            "timing_repeats": f"{param_note(PARAMS['timing_repeats'])}: above 0, also time AR, Eagle-1 and the "
                              "method that many times each, interleaved",
            "model": "one of the app's model choices (empty: the default model)",
            "prompt": f"a text-to-image model's prompt, at most {session.PROMPT_CHARS} characters (it takes this, "
                      "not class_name)",
            "seeds": f"a list of 1 to {session.BATCH_SEEDS} seeds, each {seed.span()} (whole)"}


def param_note(param: Param | Choice) -> str:
    """A registry parameter in words: its label, its range or choices, and its help."""
    allowed = ("one of " + ", ".join(param.choices) if isinstance(param, Choice) else
               param.span() + (" (whole)" if param.integer else ""))
    return "; ".join(part for part in (param.label, allowed, param.help) if part)


def plain(hint):
    """``X`` for ``X | ModelOwn``."""
    return typing.Union[tuple(arg for arg in typing.get_args(hint) if arg is not ModelOwn)]  # noqa: UP007


def api_request(method, delta, nu, mu, k, lam, draft, class_name, seed, cfg_scale, temperature, top_k, top_p,
                schedule, model, prompt, ranks=7, gap=0.15, dist=0.5, drafter=API_DRAFTER) -> session.Request:
    """An API call's values validated into a request (readable errors, as the UI's)."""
    params = {"delta": delta, "nu": nu, "mu": mu, "k": k, "lambda": lam, "schedule": schedule, "ranks": ranks,
              "gap": gap, "dist": dist}
    state = current()
    bundle = checked(lambda: state.models.get(model))
    key = state.models.key(model)
    start = defaults(state.bundle)
    given = {"class_name": class_name, "cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
             "top_p": top_p}
    given = {name: start[name] if value is MODEL_OWN else value for name, value in given.items()}
    checked(lambda: refuse_unused(bundle, method, params, given["class_name"], prompt, start))
    if draft == API_DRAFT and not session.suits(bundle, draft):  # the documented default, on a model it does not fit
        draft = session.default_draft(bundle)
    if drafter == API_DRAFTER and drafter not in bundle.drafters:  # likewise: the model's own drafter, if any
        drafter = session.default_drafter(bundle)
    if bundle is not state.bundle:  # the documented defaults are the default model's: untouched ones follow the model
        own = model_defaults(bundle)
        given = {name: own[name] if isinstance(value, (str, int, float)) and value == start[name] else value
                 for name, value in given.items()}
    return checked(lambda: session.parse_request(
        bundle, method, params, draft, given["class_name"], seed, given["cfg_scale"], given["temperature"],
        given["top_k"], given["top_p"], prompt=prompt, model=key, drafter=drafter))


def refuse_unused(bundle: Bundle, method, params: dict, class_name, prompt, start: dict[str, Any]) -> None:
    """A ValueError for an API value the request cannot use, as the command line refuses one: another
    method's parameter set off its default, a prompt for a class model, a class for a text model (``start``: the
    default model's starting values)."""
    if isinstance(method, str) and method in session.method_entries():  # else parse_request names the bad one
        session.refuse_foreign(method, params)
    text = session.text_model(bundle)
    if not text and isinstance(prompt, str) and prompt.strip():
        raise ValueError(f"prompt is for text-to-image models; {bundle.name} is a class-to-image model: give "
                         f"class_name, not prompt (got a prompt of {len(prompt)} characters)")
    if text and class_name not in (None, "", start["class_name"]):
        raise ValueError(f"class_name is for class-to-image models; {bundle.name} is a text-to-image model: give "
                         f"prompt, not class_name (got {shorten(class_name)})")
