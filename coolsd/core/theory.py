"""Exact per-round quantities for a chain (spec section 4): acceptance rates, TV costs, E[N], TV bound."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .rules import AcceptanceRule, nearest_codes, step_cost


def one_step(p: np.ndarray, q: np.ndarray, rule: AcceptanceRule, depth: int = 1) -> dict:
    """Law of one verification step (draft ``y ~ q``, accept with ``f``, else draw from the residual), its
    acceptance rate ``beta``, its cost ``e = sum [q f - p]_+`` and its exact TV distance to ``p``."""
    p_t, q_t = torch.from_numpy(np.asarray(p, dtype=np.float64)), torch.from_numpy(np.asarray(q, dtype=np.float64))
    accepted = rule.accepted_mass(p_t, q_t, depth)
    rejected = q_t - accepted  # q(y) (1 - f(y)): drafting y and refusing it
    tokens = torch.arange(len(p_t))  # a heuristic residual may depend on which token was refused: one row each
    residuals = rule.residual(p_t.expand(len(p_t), -1), q_t.expand(len(p_t), -1), tokens, depth,
                              accepted.expand(len(p_t), -1))
    output = (accepted + (rejected[:, None] * residuals).sum(0)).numpy()
    return {"beta": float(accepted.sum()), "cost": float(step_cost(p_t, accepted)), "output": output,
            "tv": float(0.5 * np.abs(output - p).sum())}


def step_rates(p: np.ndarray, q: np.ndarray, rule: AcceptanceRule, depth: int) -> tuple[float, float]:
    """``beta = sum_y q(y) f(y)`` and ``e = sum_y [q(y) f(y) - p(y)]_+`` of one draft position."""
    p_t, q_t = torch.from_numpy(np.asarray(p, dtype=np.float64)), torch.from_numpy(np.asarray(q, dtype=np.float64))
    accepted = rule.accepted_mass(p_t, q_t, depth)
    return float(accepted.sum()), float(step_cost(p_t, accepted))


def round_summary(depths: list[int], beta: list[float], cost: list[float], omegas: list[float]) -> dict:
    """``E[N] = sum_i prod_{j<=i} beta_j`` and the TV bound ``sum_i prod_{j<i} beta_j e_i`` (spec section 4)."""
    survive = np.cumprod(beta)
    reach = np.concatenate([[1.0], survive[:-1]])
    return {"depth": list(depths), "omega": list(omegas), "beta": list(beta), "cost": list(cost),
            "reach": reach.tolist(), "expected_accepted": float(survive.sum()),
            "expected_tokens": float(survive.sum() + 1), "tv_bound": float((reach * np.asarray(cost)).sum())}


def chain_theory(p: np.ndarray, q: np.ndarray, rule: AcceptanceRule) -> dict:
    """The round summary for per-position target/draft distributions ``p, q`` (L, V)."""
    depths = list(range(1, len(p) + 1))
    rates = [step_rates(p[i], q[i], rule, d) for i, d in enumerate(depths)]
    return round_summary(depths, [b for b, _ in rates], [e for _, e in rates], [rule.omega(d) for d in depths])


def captured_theory(captured: list[dict], rule: AcceptanceRule, depth: int) -> dict:
    """The round summary for the (depth, p, q) pairs a run captured (``decode(..., capture=True)``): each pair
    evaluated exactly under ``rule``, then ``beta`` and ``e`` averaged per position; ``pairs`` counts them."""
    by_depth: dict[int, list] = {}
    for item in captured:
        by_depth.setdefault(item["depth"], []).append(item)
    reached = [d for d in range(1, depth + 1) if d in by_depth]
    if not reached:
        raise ValueError("the last run captured no draft positions")
    rates = {d: np.array([step_rates(item["p"].astype(np.float64), item["q"].astype(np.float64), rule, d)
                          for item in by_depth[d]]).mean(axis=0) for d in reached}
    table = round_summary(reached, [rates[d][0] for d in reached], [rates[d][1] for d in reached],
                          [rule.omega(d) for d in reached])
    return {**table, "pairs": [len(by_depth[d]) for d in reached]}


def toy_chain(vocab: int = 16, length: int = 5, seed: int = 0,
              concentration: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Random Dirichlet target/draft pairs per position, for exploring the theory without a model."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, concentration), size=length)
    q = rng.dirichlet(np.full(vocab, concentration), size=length)
    return p, q


def toy_neighbours(vocab: int = 16, seed: int = 0, dim: int = 8) -> Callable[[int], np.ndarray]:
    """LANTERN++'s neighbour table for toy distributions, as a bundle gives it (``neighbours(count)``): random
    unit code vectors drawn from ``seed`` (a stream apart from :func:`toy_chain`'s), neighbours by L2 distance."""
    codes = np.random.default_rng([seed, 1]).standard_normal((vocab, dim))
    table = nearest_codes(torch.from_numpy(codes / np.linalg.norm(codes, axis=1, keepdims=True)), vocab - 1)
    return lambda count: table[:, :count]


def solve_scale(expected_accepted: float, make_rule: Callable[[float], AcceptanceRule], p: np.ndarray,
                q: np.ndarray, low: float = 1e-3, high: float = 1e3, steps: int = 100) -> float:
    """The ``delta`` at which ``make_rule(delta)`` reaches a given ``E[N]`` (bisection; E[N] grows with delta)."""
    for _ in range(steps):
        mid = (low * high) ** 0.5
        if chain_theory(p, q, make_rule(mid))["expected_accepted"] < expected_accepted:
            low = mid
        else:
            high = mid
    return (low * high) ** 0.5
