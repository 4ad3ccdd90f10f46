"""Acceptance rules and residuals against their closed forms (spec section 3, property 2)."""

import inspect
import math

import numpy as np
import pytest
import torch
from helpers import l2_neighbours

from coolsd.core.rules import RULES as REGISTERED
from coolsd.core.rules import (
    CoolSD,
    Eagle,
    Lantern,
    ModelTables,
    RuleSpec,
    UniformRSD,
    build_rule,
    nearest_codes,
    omega_schedule,
    resolve_mu,
)
from coolsd.core.theory import one_step
from coolsd.core.trees import DraftTree, parse_draft
from coolsd.core.verify import BONUS_CODE, RESAMPLED_CODE, TARGET_CODE, walk

V = 12
RNG = np.random.default_rng(0)


def random_pairs(count=50, vocab=V, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        alpha = rng.choice([0.2, 1.0, 5.0])
        p, q = rng.dirichlet(np.full(vocab, alpha)), rng.dirichlet(np.full(vocab, alpha))
        p[rng.random(vocab) < 0.2] = 0  # filtered tokens have exactly zero mass
        q[rng.random(vocab) < 0.2] = 0
        if p.sum() == 0 or q.sum() == 0:
            continue
        yield p / p.sum(), q / q.sum()


def brute_force_m_star(p, neighbours, k, lam, y):
    """m* = max{m <= k : S_m(y) <= (lambda-1) p(y)} and S_{m*}(y), by trying every m."""
    best_m, best_s = 0, 0.0
    for m in range(0, k + 1):
        s_m = sum(p[neighbours[y, j]] for j in range(m))
        if s_m <= (lam - 1) * p[y]:
            best_m, best_s = m, s_m
    return best_m, best_s


def brute_force_lantern_target(p, neighbours, k, lam):
    """p~(y) = p(y) + S_{m*}(y), one token at a time."""
    return np.array([p[y] + brute_force_m_star(p, neighbours, k, lam, y)[1] for y in range(len(p))])


CODEBOOK = torch.nn.functional.normalize(torch.randn(V, 4, generator=torch.Generator().manual_seed(1)), dim=-1)
NEIGHBOURS = l2_neighbours(CODEBOOK)  # the expected neighbourhoods, independent of nearest_codes


def lantern_rule(k=3, lam=2.0, residual="gstar"):
    return Lantern(nearest_codes(CODEBOOK, k + 1), k=k, lam=lam, residual=residual)


RULES = {
    "eagle": Eagle(),
    "uniform": UniformRSD(delta=2.0),
    "cool": CoolSD(delta=2.0, nu=0.7, mu="auto", depth=5),
    "cool-manual-mu": CoolSD(delta=1.1, nu=0.3, mu=-0.5, depth=5),
    "lantern": lantern_rule(),
    "lantern-heuristic": lantern_rule(residual="lantern"),
}


def spec_omega(name: str, depth: int) -> float:
    """omega_d as spec section 3 writes it, computed here (mu="auto": the mean of omega_1..omega_5 is delta)."""
    if name == "uniform":
        return 2.0
    if name == "cool":
        weights = [math.exp(-0.7 * d) for d in range(1, 6)]
        return 2.0 * math.exp(-0.7 * depth) / (sum(weights) / 5)
    if name == "cool-manual-mu":
        return 1.1 * math.exp(-0.3 * depth + 0.5)
    return 1.0


def spec_accept(name: str, p: np.ndarray, q: np.ndarray, depth: int) -> np.ndarray:
    """f_d(y) = min(1, p_hat(y) / q(y)) wherever q(y) > 0 (0 elsewhere), from the spec's formulas."""
    rule = RULES[name]
    numerator = brute_force_lantern_target(p, NEIGHBOURS, rule.k, rule.lam) if name.startswith("lantern") else \
        spec_omega(name, depth) * p
    return np.where(q > 0, np.minimum(1, numerator / np.where(q > 0, q, 1)), 0)


def batch(pairs: list) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(np.stack([p for p, _ in pairs])), torch.from_numpy(np.stack([q for _, q in pairs])))


def spec_normalised(mass: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    return mass / mass.sum() if mass.sum() > 1e-12 else fallback


@pytest.mark.parametrize("name", list(RULES))
def test_acceptance_probability_closed_form_over_batched_rows(name):
    """One call over many rows, each at its own draft depth (as the engine evaluates a whole tree), against
    f_d computed per row from the spec; an int depth gives the same rows."""
    rule, pairs = RULES[name], list(random_pairs())
    p, q = batch(pairs)
    depth = torch.from_numpy(np.random.default_rng(3).integers(1, 8, (len(pairs), 1)))  # 6, 7: past the schedule
    mass = rule.accepted_mass(p, q, depth)
    for i, (p_i, q_i) in enumerate(pairs):
        d = min(int(depth[i]), 5)
        f = np.where(q_i > 0, mass[i].numpy() / np.where(q_i > 0, q_i, 1), 0)
        np.testing.assert_allclose(f, spec_accept(name, p_i, q_i, d), rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(rule.accepted_mass(p[i], q[i], d).numpy(), mass[i].numpy())
    y = torch.zeros(len(pairs), dtype=torch.long)
    torch.testing.assert_close(rule.residual(p, q, y, depth), rule.residual(p, q, y, depth, mass), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["eagle", "uniform", "cool", "cool-manual-mu", "lantern"])
def test_gstar_closed_form_and_property_2(name):
    """G* = Norm([p - q f]_+) with q f from the spec (not from the rule); the step's law q f + (1 - sum q f) G*
    equals p when q f <= p pointwise, and its TV distance to p always equals e = sum [q f - p]_+."""
    rule = RULES[name]
    exact_steps = relaxed_steps = 0
    for p, q in random_pairs():
        for depth in (1, 3, 5):
            qf = q * spec_accept(name, p, q, depth)
            gstar = rule.residual(torch.from_numpy(p), torch.from_numpy(q), 0, depth).numpy()
            np.testing.assert_allclose(gstar, spec_normalised(np.maximum(p - qf, 0), p), atol=1e-12)
            if name in ("uniform", "cool", "cool-manual-mu"):  # the spec's equivalent form
                alt = np.maximum(np.maximum(p - q, (1 - spec_omega(name, depth)) * p), 0)
                np.testing.assert_allclose(gstar, spec_normalised(alt, p), atol=1e-12)
            step = one_step(p, q, rule, depth)
            assert step["cost"] == pytest.approx(np.maximum(qf - p, 0).sum(), abs=1e-12)
            if np.all(qf <= p):
                exact_steps += 1
                np.testing.assert_allclose(step["output"], p, atol=1e-12)
                assert step["cost"] == 0.0
            else:
                relaxed_steps += 1
            assert step["tv"] == pytest.approx(step["cost"], abs=1e-12)
            assert step["output"].sum() == pytest.approx(1.0, abs=1e-12)
    assert exact_steps > 0
    assert relaxed_steps > 0 or name == "eagle"


@pytest.mark.parametrize("name", list(RULES))
def test_rows_with_no_draft_mass_or_no_residual_mass(name):
    """A row where q is zero accepts nothing; a row where q f covers p entirely (p = q) leaves a residual of
    zero mass, which falls back to p (spec section 3); float32 rows give the float64 values to rounding."""
    rule = RULES[name]
    p = torch.from_numpy(np.random.default_rng(5).dirichlet(np.ones(V), size=3))
    q = torch.stack([torch.zeros(V, dtype=torch.float64), p[1], p[2]])
    mass = rule.accepted_mass(p, q, 1)
    assert torch.all(mass[0] == 0)
    residual = rule.residual(p, q, torch.tensor([0, 3, 5]), 1, mass)
    torch.testing.assert_close(residual[0], p[0], rtol=0, atol=1e-15)  # nothing accepted: G* is p itself
    if not name.endswith("heuristic"):  # the heuristic clears q near the refused token first
        torch.testing.assert_close(residual[1:], p[1:], rtol=0, atol=0)  # zero mass: the fallback, exactly
    single = rule.residual(p.float(), q.float(), torch.tensor([0, 3, 5]), 1)
    torch.testing.assert_close(single, residual.float(), rtol=1e-5, atol=1e-6)


def test_lossless_rules_have_zero_cost_and_exact_law():
    for p, q in random_pairs():
        for rule in (Eagle(), CoolSD(delta=1.0, nu=0.0, mu=0.0, depth=3), UniformRSD(delta=0.5)):
            step = one_step(p, q, rule)
            assert step["cost"] == 0.0
            np.testing.assert_allclose(step["output"], p, atol=1e-12)


def test_lantern_heuristic_residual():
    """On rejecting y with m*(y) >= 1, q is cleared on y's k+1 nearest codes (not on y), then Norm([p - q]_+);
    the neighbours are brute-force L2 nearest codes, not the rule's own table. One call per pair, one row per
    refused token."""
    rule = RULES["lantern-heuristic"]
    hits = 0
    for p, q in random_pairs():
        rows = torch.from_numpy(p).expand(V, -1), torch.from_numpy(q).expand(V, -1)
        got = rule.residual(*rows, torch.arange(V), 1).numpy()
        for y in range(V):
            q_mod = q.copy()
            if brute_force_m_star(p, NEIGHBOURS, rule.k, rule.lam, y)[0] >= 1:
                q_mod[NEIGHBOURS[y, :rule.k + 1]] = 0
                hits += 1
            np.testing.assert_allclose(got[y], spec_normalised(np.maximum(p - q_mod, 0), p), atol=1e-12)
    assert hits > 50


def test_lantern_target_is_bounded_and_brute_force_matches():
    for k, lam in [(0, 3.0), (1, 1.0), (3, 2.0), (10, 5.0)]:
        rule = lantern_rule(k=k, lam=lam)
        pairs = list(random_pairs(20))
        relaxed = rule.relaxed_target(batch(pairs)[0], 1).numpy()
        for row, (p, _) in zip(relaxed, pairs):
            np.testing.assert_allclose(row, brute_force_lantern_target(p, NEIGHBOURS, k, lam), atol=1e-15)
            assert np.all(row <= lam * p + 1e-15)
            assert np.all(row >= p)


def test_nearest_codes_order():
    codebook = torch.tensor([[0.0], [1.0], [3.0], [6.0], [10.0]])
    table = nearest_codes(codebook, 3)
    assert table.tolist() == [[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 4, 1], [3, 2, 1]]
    assert nearest_codes(codebook, 3, chunk=2).tolist() == table.tolist()


def test_mu_auto_makes_mean_omega_delta():
    for delta in (1.1, 2.0, 3.7):
        for nu in (0.0, 0.3, 0.7, 1.5, -0.5):
            for depth in (1, 3, 5, 8):
                assert np.mean(omega_schedule(delta, nu, "auto", depth)) == pytest.approx(delta, rel=1e-12)
        assert np.mean(omega_schedule(delta, 0.1, "auto", 5, "linear")) == pytest.approx(delta, rel=1e-12)
    assert resolve_mu(0.7, "auto", 5) == pytest.approx(math.log(np.mean(np.exp(-0.7 * np.arange(1, 6)))))
    # decaying: relax early positions more
    omegas = omega_schedule(2.0, 0.7, "auto", 5)
    assert all(a > b for a, b in zip(omegas, omegas[1:]))
    assert omega_schedule(1.0, 0.0, 0.0, 5) == [1.0] * 5
    assert omega_schedule(2.0, 0.5, 0.1, 3) == pytest.approx([2.0 * math.exp(-0.5 * d - 0.1) for d in (1, 2, 3)])


def test_raising_delta_never_lowers_acceptance():
    deltas = [0.5, 1.0, 1.1, 1.5, 2.0, 4.0, 10.0]
    p, q = batch(list(random_pairs()))
    for make in (lambda d: UniformRSD(d), lambda d: CoolSD(d, 0.7, "auto", 5), lambda d: CoolSD(d, 0.2, 0.3, 5)):
        for depth in range(1, 6):
            probs = [make(d).accepted_mass(p, q, depth) for d in deltas]
            for low, high in zip(probs, probs[1:]):
                assert torch.all(high >= low - 1e-15)
    p, q = batch(list(random_pairs(20)))  # LANTERN++: larger lambda and k never lower it either
    low, high = lantern_rule(3, 1.5).accepted_mass(p, q, 1), lantern_rule(3, 3.0).accepted_mass(p, q, 1)
    assert torch.all(high >= low - 1e-15)


@pytest.mark.parametrize("call, needle", [
    (lambda: UniformRSD(-1.0), "delta"),
    (lambda: UniformRSD(0.0), "delta"),
    (lambda: CoolSD(delta=-2.0), "delta"),
    (lambda: CoolSD(delta=2.0, nu=float("nan")), "nu"),
    (lambda: CoolSD(delta=2.0, mu="sometimes"), "mu"),
    (lambda: CoolSD(delta=2.0, nu=0.7, schedule="linear"), "nu"),
    (lambda: CoolSD(delta=2.0, schedule="cosine"), "schedule"),
    (lambda: lantern_rule(k=-1), "k"),
    (lambda: lantern_rule(lam=0.5), "lambda"),
    (lambda: lantern_rule(residual="other"), "residual"),
    (lambda: build_rule("medusa", {}, 5), "method"),
    (lambda: build_rule("cool", {"k": 3}, 5), "k"),
    (lambda: build_rule("lantern", {"k": 2.5}, 5, lambda n: np.zeros((V, n), dtype=int)), "k"),
    (lambda: DraftTree(((0,), (0, 0, 0))), "parent"),
    (lambda: parse_draft(DraftTree(())), "draft tree is empty"),
    (lambda: parse_draft("chain:0"), "chain length"),
    (lambda: DraftTree(((1,),)), "sibling"),
])
def test_invalid_parameters_raise_named_value_errors(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()



# a schema name that is a Python keyword, or shortened -> the constructor argument it is passed as
ARGUMENT = {"lambda": "lam", "dist": "distance"}


def default_mismatches(spec: RuleSpec, rule_class: type) -> list[str]:
    """Where ``rule_class``'s constructor defaults disagree with ``spec``'s schema (or lack a parameter)."""
    arguments = inspect.signature(rule_class.__init__).parameters
    found = []
    for schema in spec.params:
        argument = arguments.get(ARGUMENT.get(schema.name, schema.name))
        if argument is None or argument.default != schema.default:
            found.append(f"{rule_class.__name__}: {schema.name} defaults to "
                         f"{argument.default if argument else 'nothing'}, the schema to {schema.default}")
    return found


def test_one_default_per_parameter_the_schemas():
    """A parameter not given takes its schema's default (README: delta 2, not the lossless 1), and every
    registered rule class's constructor defaults to the same values."""
    tables = ModelTables(lambda count: nearest_codes(CODEBOOK, count), lambda: CODEBOOK)
    for name, spec in REGISTERED.items():
        rule = build_rule(name, {}, 5, tables)
        assert rule.params() == {schema.name: schema.default for schema in spec.params}, name
        assert default_mismatches(spec, type(rule)) == [], name
    assert build_rule("uniform", {}, 5).omega(1) == 2.0 and build_rule("uniform", {"delta": 3}, 5).delta == 3.0

    class Drifted(UniformRSD):  # negative control: a constructor default that left its schema is caught
        def __init__(self, delta: float = 1.0) -> None:
            super().__init__(delta)

    assert default_mismatches(REGISTERED["uniform"], Drifted) == [
        "Drifted: delta defaults to 1.0, the schema to 2.0"]


def test_walk_sibling_with_tiny_remaining_draft_mass():
    """A sibling drawn where q is nearly one-hot: after removing the first draw, q must be renormalised even
    though its remaining mass is tiny (a regression the enumeration test caught)."""
    tree = DraftTree(((0,), (1,)))
    p = torch.tensor([0.2, 0.05, 0.3, 0.45], dtype=torch.float64)
    q = torch.tensor([1e-20, 3e-20, 1.0, 1e-21], dtype=torch.float64)
    q /= q.sum()
    verdict = walk(tree.tensors(torch.device("cpu")), torch.tensor([[0, 2, 1]]), torch.ones(1, 3, dtype=torch.bool),
                   p.expand(1, 3, -1), q[None, None], Eagle(),
                   torch.full((1, 4), 0.5, dtype=torch.float64))
    # second sibling: target residual Norm([p - q]_+) = (0.2, 0.05, 0, 0.45)/0.7; q without 2 is (1/4.1e-20)*(...)
    residual = np.array([0.2, 0.05, 0, 0.45]) / 0.7
    q_rest = np.array([1e-20, 3e-20, 0, 1e-21]) / 4.1e-20
    assert float(verdict.accept_prob[0, 2]) == pytest.approx(min(1, residual[1] / q_rest[1]), rel=1e-9)
    assert float(verdict.accept_prob[0, 1]) == pytest.approx(0.3, rel=1e-9)


@pytest.mark.parametrize("paths, valid, uniforms, kept, tested, origin", [
    # chain of 2: every draft accepted, then a bonus token below the leaf
    (((0,), (0, 0)), [1, 1, 1], [0.0, 0.0, 0.0], [0, 1, 2], [1, 2], BONUS_CODE),
    # chain of 2: the first draft refused, the last token resampled at the root
    (((0,), (0, 0)), [1, 1, 1], [0.0, 0.999, 0.0], [0], [1], RESAMPLED_CODE),
    # chain of 2, the second draft invalid (past the image's end): a bonus below the first
    (((0,), (0, 0)), [1, 1, 0], [0.0, 0.0, 0.0], [0, 1], [1], BONUS_CODE),
    # nothing valid: the target's own draw at the root
    (((0,), (0, 0)), [1, 0, 0], [0.0, 0.0, 0.0], [0], [], TARGET_CODE),
    # two siblings: the first refused, the second accepted, its child refused (resampled below the second)
    (((0,), (1,), (1, 0)), [1, 1, 1, 1], [0.0, 0.999, 0.0, 0.999], [0, 2], [1, 2, 3], RESAMPLED_CODE),
])
def test_walk_keeps_the_path_and_names_the_last_tokens_origin(paths, valid, uniforms, kept, tested, origin):
    """Outcomes forced by the uniforms (0 accepts, 0.999 refuses f < 1): the kept nodes, the tested ones, the
    count, the emitted drafts and where the last token came from, as the spec's walk defines them."""
    tree = DraftTree(paths)
    n = tree.size + 1
    p = torch.full((1, n, 3), 1 / 3, dtype=torch.float64)
    q = torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64).expand(1, len(tree.inner_nodes), 3)
    tokens = torch.tensor([[2] + [rank for *_, rank in paths]])  # node i draws token = its rank (q(0) = 0.9)
    verdict = walk(tree.tensors(torch.device("cpu")), tokens, torch.tensor([valid], dtype=torch.bool), p, q,
                   Eagle(), torch.tensor([uniforms + [0.5]], dtype=torch.float64))
    assert int(verdict.count[0]) == len(kept)
    assert verdict.keep[0, :len(kept)].tolist() == kept and not verdict.keep[0, len(kept):].any()
    assert verdict.on_path[0].nonzero().flatten().tolist() == kept
    assert verdict.tested[0].nonzero().flatten().tolist() == tested
    assert verdict.emitted[0, :len(kept) - 1].tolist() == tokens[0, kept[1:]].tolist()
    assert int(verdict.origin[0]) == origin


def independent_siblings(p: np.ndarray, q: np.ndarray, drawn: list[int], omega: float) -> tuple[list, list, float]:
    """The spec's section 3 for one node whose children ``drawn`` are tried in order under ``f = min(1, omega
    p / q)`` with the G* residual, written again in numpy: each child's ``f`` and step cost ``sum [q f - p]_+``
    against the residual and renormalised ``q`` it was tested with, and P(some child accepted)."""
    fs, costs, q = [], [], q.copy()
    for rank, y in enumerate(drawn):
        f_all = np.minimum(1.0, omega * p / np.maximum(q, 1e-300))
        fs.append(f_all[y])
        costs.append(np.maximum(q * f_all - p, 0).sum())
        rest = np.maximum(p - q * f_all, 0)
        p = rest / rest.sum()
        q = q.copy()
        q[y] = 0
        q = q / q.sum()
    return fs, costs, 1 - np.prod([1 - f for f in fs])


@pytest.mark.parametrize("rule, omega", [(UniformRSD(delta=2.0), 2.0),
                                         (CoolSD(delta=2.0, nu=0.7, mu=-0.5), 2.0 * math.exp(-0.2))])
def test_a_later_siblings_cost_and_the_levels_acceptance_are_the_independent_computation(rule, omega):
    """At a node with three children: each child's recorded relaxation cost is measured against the residual that
    child was tested against (``q`` renormalised without the earlier siblings), and the node's acceptance
    probability is ``1 - prod(1 - f_j)``, as an independent numpy walk of the spec computes them."""
    tree = DraftTree(((0,), (1,), (2,)))
    rng = np.random.default_rng(2)
    p_root, q_root = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    drawn = [7, 6, 0]  # found by search: the second child's f is inside (0, 1) and its cost positive
    p = torch.from_numpy(np.tile(p_root, (1, tree.size + 1, 1)))
    verdict = walk(tree.tensors(torch.device("cpu")), torch.tensor([[0, *drawn]]), torch.ones(1, 4, dtype=torch.bool),
                   p, torch.from_numpy(q_root)[None, None], rule, torch.full((1, 5), 0.999, dtype=torch.float64))
    fs, costs, level = independent_siblings(p_root, q_root, drawn, omega)
    assert verdict.accept_prob[0, 1:4].tolist() == pytest.approx(fs, rel=1e-12)
    assert verdict.cost[0, 1:4].tolist() == pytest.approx(costs, rel=1e-12, abs=1e-15)
    assert float(verdict.level_prob[0, 0]) == pytest.approx(level, rel=1e-12)
    assert 0 < fs[1] < 1 and costs[1] > 1e-3  # the case the test is for: a later sibling tested and relaxed
