"""Method specifications as users type them: ``cool:delta=2,nu=0.7`` or ``lantern:k=10,lambda=5,residual=gstar``.
Names and parameters come from the rule registry (:data:`coolsd.core.rules.RULES`)."""

from __future__ import annotations

import numpy as np
import torch

from ..core.params import Param, shorten
from ..core.rules import RULES, ModelTables, build_rule, rule_spec


def parse_value(text: str) -> int | float | str:
    """``3`` -> 3, ``2.5`` -> 2.5, anything else (``auto``, ``gstar``) stays a string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_param(method: str, key: str, value: int | float | str) -> int | float | str:
    """One parameter of ``method`` checked against its schema. Numbers keep the type they were typed in (unless
    the parameter is whole), so labels read ``delta=2`` as typed."""
    schema = rule_spec(method).param(key)
    checked = schema.check(value)
    keep_typed = isinstance(schema, Param) and not schema.integer and isinstance(value, (int, float))
    return value if keep_typed else checked


def parse_method(spec: str) -> tuple[str, dict]:
    """``name[:key=value,...]`` -> (name, params), each value checked against the method's schema."""
    name, _, rest = spec.strip().partition(":")
    if name not in RULES:
        raise ValueError(f"method must be one of {', '.join(RULES)}; got {shorten(name)} in {shorten(spec)}")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"method parameters look like key=value, got {shorten(item)} in {shorten(spec)}")
        params[key.strip()] = check_param(name, key.strip(), parse_value(value.strip()))
    return name, params


def check_rule(name: str, params: dict, depth: int, vocab_size: int) -> None:
    """Build the method's acceptance rule once, with stand-ins for LANTERN++'s neighbour table (as wide as
    the model's vocabulary allows) and GSD's embeddings, so that everything the rule itself refuses (a too steep linear ``nu``, a
    ``k`` beyond the vocabulary) is refused before a model is loaded."""
    def neighbours(count: int) -> np.ndarray:
        return np.zeros((1, min(count, vocab_size - 1)), dtype=np.int64)

    build_rule(name, params, depth, ModelTables(neighbours, lambda: torch.zeros(1, 1)))


def method_label(name: str, params: dict) -> str:
    """Inverse of :func:`parse_method`, for tables and legends."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


# Named sweeps for ``bench --preset``: method specs, each checked like a typed one. LANTERN++'s lambda grid runs
# from a mild relaxation (1.5) through 2 to the app's default 5; k from one neighbour to 20.
SWEEPS: dict[str, list[str]] = {
    "cool": [f"cool:delta={delta},nu={nu},schedule={schedule}" for delta in (1.1, 1.5, 2, 3, 4)
             for nu in (0.7, 0.3) for schedule in ("exp", "linear")],
    "uniform": [f"uniform:delta={delta}" for delta in (1.1, 1.5, 2, 3, 4)],
    "lantern": [f"lantern:k={k},lambda={lam},residual={residual}" for k in (1, 5, 10, 20) for lam in (1.5, 2, 5)
                for residual in ("lantern", "gstar")],
}
PAPER_DRAFTS = ("chain:5", "tree:eagle25")  # the paper's comparison: every sweep and Eagle-1 on both drafts
# The drafter-free methods (spec section 11) as published, with their fresh drafts' point-mass q, then ours: SJD and
# SCD with the default (uniform) fresh drafts, GSD with G* as its residual, and COOL-SD's delta grid (the paper
# sweep's, at nu=0.7) on coupled drafts; at each window of JACOBI_WINDOWS.
JACOBI_WINDOWS = (8, 16)
JACOBI_METHODS = (("eagle", "jacobi:{L}:point"), ("eagle", "jacobi:{L}"), ("eagle", "jacobi:{L}:coupled:point"),
                  ("eagle", "jacobi:{L}:coupled"), ("eagle", "jacobi:{L}:gumbel"), ("gsd", "jacobi:{L}:point"),
                  ("gsd:residual=gstar", "jacobi:{L}:point"),
                  *((f"cool:delta={delta}", "jacobi:{L}:coupled") for delta in (1.1, 1.5, 2, 3, 4)))
PRESETS = (*SWEEPS, "paper", "jacobi")


def preset_methods(preset: str, draft: str) -> list[tuple[str, str]]:
    """(method spec, draft spec) pairs of a preset: a sweep runs on ``draft``; ``paper`` is Eagle-1 and every
    sweep on each of :data:`PAPER_DRAFTS`; ``jacobi`` the drafter-free methods (SJD, SCD, Gumbel coupling, GSD with
    either residual, COOL-SD's delta grid on coupled drafts) on each of :data:`JACOBI_WINDOWS` (AR, which drafts nothing, is added once by the
    benchmark)."""
    if preset == "paper":
        return [(spec, paper_draft) for paper_draft in PAPER_DRAFTS
                for spec in ["eagle", *(spec for sweep in SWEEPS.values() for spec in sweep)]]
    if preset == "jacobi":
        return [(spec, window.format(L=length)) for length in JACOBI_WINDOWS for spec, window in JACOBI_METHODS]
    return [(spec, draft) for spec in SWEEPS[preset]]
