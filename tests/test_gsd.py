"""GSD's grouped acceptance (spec section 11) against a direct computation of its formula, and the relaxation
cost of Jacobi rounds with relaxed rules against the spec's ``e`` (section 3), from the rows the round used."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_batch import shipped  # noqa: F401  (a fixture)

from coolsd.core.decode import decode
from coolsd.core.rules import Grouped, ModelTables, build_rule
from coolsd.core.trees import parse_draft

V, DIM = 40, 3


def random_rows(seed: int, rows: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of p and q with zeros (filtered tokens), ties among them, and embeddings at mixed distances."""
    rng = np.random.default_rng(seed)
    p = rng.gamma(0.3, size=(rows, V)) * (rng.random((rows, V)) > 0.3)
    q = rng.gamma(0.3, size=(rows, V)) * (rng.random((rows, V)) > 0.3)
    q[:, 0] += 0.1  # no empty row
    p[:, 1] += 0.1
    embeddings = rng.normal(0, 0.5, size=(V, DIM))
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True), embeddings


def direct_f(p: np.ndarray, q: np.ndarray, y: int, embeddings: np.ndarray, ranks: int, gap: float,
             dist: float) -> float:
    """The spec's f(y) for one row, written out: the tokens at ranks [c - ranks, c + ranks) of a stable ascending
    order of p (cut at the ends), kept where |p(g) - p(y)| < gap and ||E_g - E_y||^2 < dist."""
    order = list(np.argsort(p, kind="stable"))
    c = order.index(y)
    window = order[max(0, c - ranks):c + ranks]
    group = [g for g in window if abs(p[g] - p[y]) < gap and np.sum((embeddings[g] - embeddings[y]) ** 2) < dist]
    return min(1.0, sum(p[g] for g in group) / sum(q[g] for g in group))


@pytest.mark.parametrize("seed, ranks, gap, dist", [(0, 7, 0.15, 0.5), (1, 3, 0.05, 1.0), (2, 20, 1.0, 100.0),
                                                    (3, 1, 0.15, 0.5)])
def test_grouped_acceptance_is_the_formula(seed, ranks, gap, dist):
    p, q, embeddings = random_rows(seed)
    rule = Grouped(torch.from_numpy(embeddings), ranks, gap, dist)
    mass = rule.accepted_mass(torch.from_numpy(p), torch.from_numpy(q), 1).numpy()
    groups_larger_than_one = 0
    for row in range(len(p)):
        for y in np.flatnonzero(q[row] > 0):
            want = direct_f(p[row], q[row], y, embeddings, ranks, gap, dist)
            assert mass[row, y] == pytest.approx(q[row, y] * want, rel=1e-12, abs=1e-15)
            groups_larger_than_one += want != min(1.0, p[row, y] / q[row, y])
        assert np.all(mass[row, q[row] == 0] == 0)
    if ranks > 1:
        assert groups_larger_than_one > 10  # the groups did change f: the test saw more than Eagle-1's ratio


def test_grouped_residuals():
    """``gsd``: the published token-level Norm([p - q]_+); ``gstar``: Norm([p - q f]_+) with the grouped f."""
    p, q, embeddings = random_rows(4)
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    for residual in ("gsd", "gstar"):
        rule = Grouped(torch.from_numpy(embeddings), residual=residual)
        got = rule.residual(pt, qt, torch.zeros(len(p), dtype=torch.long), 1).numpy()
        qf = rule.accepted_mass(pt, qt, 1).numpy() if residual == "gstar" else np.minimum(p, q)
        want = np.maximum(p - qf, 0)
        np.testing.assert_allclose(got, want / want.sum(1, keepdims=True), rtol=1e-12, atol=1e-15)


def test_gsd_needs_the_targets_embeddings():
    with pytest.raises(ValueError, match="input embeddings"):
        build_rule("gsd", {}, 5, ModelTables())


def spec_cost(p: np.ndarray, q: np.ndarray, f) -> float:
    """e = sum_y [q(y) f(y) - p(y)]_+ (spec section 3), over the draft's support."""
    return float(sum(max(q[y] * f(y) - p[y], 0.0) for y in np.flatnonzero(q > 0)))


@pytest.mark.parametrize("method, params, draft", [("cool", {"delta": 2.0}, "jacobi:8:coupled"),
                                                   ("uniform", {"delta": 3.0}, "jacobi:8"),
                                                   ("gsd", {"residual": "gstar"}, "jacobi:8:gumbel:point")])
def test_the_relaxation_cost_of_a_jacobi_round_is_the_specs_e(shipped, method, params, draft):  # noqa: F811
    """Each tested candidate's cost against e computed here from the (p, q) rows the round captured at its
    parent, with f written from the spec (COOL-SD, UniformRSD: min(1, omega p/q); GSD: the formula above)."""
    tree = parse_draft(draft)
    rule = build_rule(method, params, tree.depth, shipped)
    embeddings = shipped.embeddings().double().numpy()
    stats = decode(shipped.target, None, 3, rule, tree, shipped.sampling, 2, capture=True).stats
    captured = iter(stats.captured)
    checked = 0
    for round_ in stats.rounds[1:]:
        for candidate in round_.tested:
            rows = next(captured)
            assert rows["depth"] == candidate.depth
            p, q = rows["p"].astype(np.float64), rows["q"].astype(np.float64)
            p, q = p / p.sum(), q / q.sum()
            if method == "gsd":
                f = lambda y: direct_f(p, q, y, embeddings, 7, 0.15, 0.5)  # noqa: E731
            else:
                f = lambda y: min(1.0, rule.omega(candidate.depth) * p[y] / q[y])  # noqa: E731
            assert candidate.cost == pytest.approx(spec_cost(p, q, f), abs=2e-5)
            checked += candidate.cost > 1e-4
    assert checked > 5
