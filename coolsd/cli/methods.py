"""Method specifications as users type them: ``cool:delta=2,nu=0.7`` or ``lantern:k=10,lambda=5,residual=gstar``."""

from __future__ import annotations

import numpy as np

from ..core.params import PARAMS, check, shorten
from ..core.rules import METHODS, build_rule

NUMERIC = ("delta", "nu", "mu", "k", "lambda")  # the method parameters whose ranges live in coolsd.params


def parse_value(text: str) -> int | float | str:
    """``3`` -> 3, ``2.5`` -> 2.5, anything else (``auto``, ``gstar``) stays a string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_param(key: str, value: int | float | str) -> int | float | str:
    """A method parameter checked against :mod:`coolsd.params` (``mu`` may also be ``auto``); others
    (``schedule``, ``residual``) pass through for the rule to check. Integer parameters come back as ints;
    other numbers keep the type they were typed in, so labels read ``delta=2`` as typed."""
    if key not in NUMERIC or (key == "mu" and value == "auto"):
        return value
    try:
        number = check(key, value)
    except ValueError as error:
        raise ValueError(f"{error}; or auto" if key == "mu" else str(error)) from None
    return number if PARAMS[key].integer or isinstance(value, str) else value


def parse_method(spec: str) -> tuple[str, dict]:
    """``name[:key=value,...]`` -> (name, params), numeric values within the app's ranges."""
    name, _, rest = spec.strip().partition(":")
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {shorten(name)} in {shorten(spec)}")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"method parameters look like key=value, got {shorten(item)} in {shorten(spec)}")
        params[key.strip()] = check_param(key.strip(), parse_value(value.strip()))
    return name, params


def check_rule(name: str, params: dict, depth: int, vocab_size: int) -> None:
    """Build the method's acceptance rule once, with a stand-in for LANTERN++'s neighbour table (as wide as
    the model's vocabulary allows), so that everything the rule itself refuses (a parameter the method does
    not take, an unknown schedule or residual, a too steep linear ``nu``, a ``k`` beyond the vocabulary) is
    refused before a model is loaded."""
    def neighbours(count: int) -> np.ndarray:
        return np.zeros((1, min(count, vocab_size - 1)), dtype=np.int64)

    build_rule(name, params, depth, neighbours)


def method_label(name: str, params: dict) -> str:
    """Inverse of :func:`parse_method`, for tables and legends."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
