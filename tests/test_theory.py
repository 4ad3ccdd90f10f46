"""Spec section 4: exact E[N] and TV bound of a chain round, against sampling and exact enumeration."""

import numpy as np
import pytest
import torch

from coolsd.core.rules import CoolSD, Eagle, UniformRSD
from coolsd.core.theory import chain_theory, solve_scale, toy_chain
from coolsd.core.trees import chain
from coolsd.core.verify import walk


def exact_round_law(p, q, rule):
    """Law of the L+1 tokens of one chain round (rows 0..L-1 of p, q are draft positions, row L the bonus),
    a rejection being followed by exact target sampling; toy positions are independent, so the target's law
    is the product of the p_i."""
    length = len(p) - 1
    law = target = p[length]
    for i in range(length - 1, -1, -1):
        mass = rule.accepted_mass(torch.from_numpy(p[i]), torch.from_numpy(q[i]), i + 1).numpy()
        residual = rule.residual(torch.from_numpy(p[i]), torch.from_numpy(q[i]), 0, i + 1).numpy()
        law = np.multiply.outer(mass, law) + (1 - mass.sum()) * np.multiply.outer(residual, target)
        target = np.multiply.outer(p[i], target)
    return law, target


@pytest.mark.parametrize("rule", [Eagle(), UniformRSD(2.0), CoolSD(2.0, 0.7, "auto", 3), CoolSD(1.5, -0.5, 0.0, 3)])
def test_expected_accepted_matches_sampling_through_the_walk(rule):
    """40,000 chain rounds through the engine's acceptance walk (one batched call): the mean accepted count
    is E[N] of the exact theory."""
    p, q = toy_chain(vocab=6, length=3, seed=1)
    theory = chain_theory(p, q, rule)
    index = chain(3).tensors(torch.device("cpu"))
    # node i's target distribution is that of position i+1; q_rows[i] drafted node i+1
    p_rows = torch.from_numpy(np.vstack([p, np.full(6, 1 / 6)]))
    q_rows = torch.from_numpy(np.vstack([q, np.zeros(6)]))
    draws, generator = 40_000, torch.Generator().manual_seed(0)
    drafted = torch.stack([torch.zeros(draws, dtype=torch.long)] + [
        torch.multinomial(q_rows[i].float(), draws, replacement=True, generator=generator) for i in range(3)], 1)
    verdict = walk(index, drafted, torch.ones(draws, 4, dtype=torch.bool), p_rows.expand(draws, -1, -1),
                   q_rows[:3].expand(draws, -1, -1), rule,
                   torch.rand(draws, 5, generator=generator, dtype=torch.float64))
    accepted = (verdict.count - 1).double()
    stderr = accepted.std() / np.sqrt(draws)
    assert abs(float(accepted.mean()) - theory["expected_accepted"]) < 4 * float(stderr)


@pytest.mark.parametrize("seed", range(5))
def test_tv_bound_holds_against_the_exact_round_law(seed):
    p, q = toy_chain(vocab=4, length=4, seed=seed)  # 3 draft positions + the bonus position
    for rule in (UniformRSD(1.7), CoolSD(2.0, 0.7, "auto", 3), CoolSD(3.0, 0.0, 0.0, 3)):
        law, target = exact_round_law(p, q, rule)
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        tv = 0.5 * np.abs(law - target).sum()
        bound = chain_theory(p[:3], q[:3], rule)["tv_bound"]
        assert tv <= bound + 1e-12
        assert bound > 0
    law, target = exact_round_law(p, q, Eagle())
    assert 0.5 * np.abs(law - target).sum() < 1e-12
    assert chain_theory(p[:3], q[:3], Eagle())["tv_bound"] == 0.0


def test_closed_forms_of_chain_theory():
    p, q = toy_chain(vocab=8, length=4, seed=3)
    rule = CoolSD(2.0, 0.7, "auto", 4)
    t = chain_theory(p, q, rule)
    beta = [np.minimum(q[i], rule.omega(i + 1) * p[i]).sum() for i in range(4)]
    cost = [np.maximum(np.minimum(q[i], rule.omega(i + 1) * p[i]) - p[i], 0).sum() for i in range(4)]
    assert t["beta"] == pytest.approx(beta)
    assert t["cost"] == pytest.approx(cost)
    assert t["expected_accepted"] == pytest.approx(sum(np.prod(beta[:i + 1]) for i in range(4)))
    assert t["tv_bound"] == pytest.approx(sum(np.prod(beta[:i]) * cost[i] for i in range(4)))
    assert t["expected_tokens"] == pytest.approx(t["expected_accepted"] + 1)


@pytest.mark.parametrize("seed", range(6))
def test_annealing_claim_on_toy_distributions(seed):
    """At the E[N] of UniformRSD(delta=2), a gently decaying omega pays a smaller TV bound than uniform, and an
    increasing omega a larger one. (With the same (p, q) at every position, steep decay such as nu=0.7 can
    lose to uniform, and at delta=1.1 uniform is best: what holds is that some decay wins at delta=2.)"""
    rng = np.random.default_rng(seed)
    p1 = rng.dirichlet(np.full(16, 0.5))
    q1 = rng.dirichlet(np.full(16, 0.5))
    p, q = np.tile(p1, (5, 1)), np.tile(q1, (5, 1))  # the same pair at every position
    goal = chain_theory(p, q, UniformRSD(2.0))["expected_accepted"]

    def bound_at_goal(nu):
        make = (lambda d: CoolSD(d, nu, "auto", 5))
        theory = chain_theory(p, q, make(solve_scale(goal, make, p, q)))
        assert theory["expected_accepted"] == pytest.approx(goal, rel=1e-6)
        return theory["tv_bound"]

    uniform = bound_at_goal(0.0)
    assert uniform == pytest.approx(chain_theory(p, q, UniformRSD(2.0))["tv_bound"], rel=1e-6)
    assert min(bound_at_goal(nu) for nu in (0.1, 0.2, 0.3)) < uniform
    assert bound_at_goal(-0.3) > uniform
