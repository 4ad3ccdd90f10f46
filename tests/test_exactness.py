"""Spec section 3, properties 1 and 3: lossless decoding reproduces the target's law; relaxed rules at their
lossless settings are bit-identical to Eagle-1."""

import pytest
from helpers import chi_square_pvalue, exact_distribution, named, peaky_bundle

from coolsd.core.decode import EMPTY, decode
from coolsd.core.rules import Eagle
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import DraftTree, chain
from coolsd.models.config import ModelConfig

# 4 codes, 5 tokens: 1,024 possible images, enumerated exactly.
ENUM_CFG = ModelConfig(vocab_size=4, dim=16, n_layer=1, n_head=2, num_classes=2, grid_height=1, grid_width=5,
                       multiple_of=16)
# tests/test_laws.py checks every rule's law as well (and catches every planted fault tried). At 1,000 images the
# deliberately wrong residual below is rejected at p ~ 1e-83, and UniformRSD delta=4 at p below 1e-300.
SAMPLES = 2_000
ALPHA = 1e-3  # a correct sampler fails with probability 0.1%; the seeds are fixed, so the outcome is too
# Depth 3 with siblings; with top_k=3 over 4 codes the fourth root child is always invalid.
SMALL_TREE = DraftTree(((0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0)), "small")
CASES = {
    "ar": (EMPTY, SamplingConfig(cfg_scale=1.5)),
    "eagle-chain": (chain(3), SamplingConfig(cfg_scale=1.5, top_p=0.95)),
    "eagle-tree": (SMALL_TREE, SamplingConfig(cfg_scale=1.5, top_k=3)),
}


class ResampleFromTarget(Eagle):
    """A deliberately wrong residual: after a rejection, sample from p instead of Norm([p - q]_+)."""

    def residual(self, p, q, rejected, depth, accepted=None):
        return p


def sampled_pvalue(rule, tree: DraftTree, sampling: SamplingConfig, samples: int) -> tuple[float, float]:
    bundle = peaky_bundle(ENUM_CFG)
    law = exact_distribution(bundle.target, 1, sampling)
    drawn, tau = [], 0.0
    for seed in range(samples):
        gen = decode(bundle.target, bundle.drafter, 1, rule, tree, sampling, seed)
        drawn.append(tuple(gen.tokens))
        tau += gen.stats.tau / samples
    return chi_square_pvalue(drawn, law), tau


@pytest.mark.parametrize("case", list(CASES))
def test_lossless_decoding_matches_enumerated_target(case):
    tree, sampling = CASES[case]
    pvalue, tau = sampled_pvalue(Eagle(), tree, sampling, SAMPLES)
    assert pvalue > ALPHA, f"{case}: chi-square p-value {pvalue:.2e} over {SAMPLES} images"
    if tree.size:
        assert tau > 1.2  # drafts really were accepted, so the speculative path was exercised


def test_negative_control_wrong_residual_is_detected():
    tree, sampling = CASES["eagle-chain"]
    pvalue, _ = sampled_pvalue(ResampleFromTarget(), tree, sampling, 1_000)
    assert pvalue < ALPHA * 1e-3, f"the broken residual went unnoticed (p-value {pvalue:.2e})"


@pytest.mark.parametrize("draft", ["chain:5", "tree:eagle25", "tree:wide57"])
def test_relaxed_rules_at_lossless_settings_are_bit_identical(draft):
    bundle = peaky_bundle(ModelConfig(vocab_size=32, dim=32, n_layer=2, n_head=2, num_classes=3, grid_height=4,
                                      grid_width=4, multiple_of=16), std=0.15)
    sampling = SamplingConfig(cfg_scale=2.0, top_k=20)
    for seed in range(3):
        reference = named(bundle, 2, "eagle", {}, draft, sampling, seed)
        for method, params in [("cool", {"delta": 1.0, "nu": 0.0, "mu": 0.0}), ("uniform", {"delta": 1.0})]:
            other = named(bundle, 2, method, params, draft, sampling, seed)
            assert other.tokens == reference.tokens
            assert [c.accept_prob for r in other.stats.rounds for c in r.tested] == \
                   [c.accept_prob for r in reference.stats.rounds for c in r.tested]
        assert reference.stats.target_forwards < bundle.config.image_tokens  # drafts were accepted


def test_same_seed_same_tokens_and_different_seeds_differ():
    bundle = peaky_bundle(ENUM_CFG)
    runs = [named(bundle, 1, "cool", {"delta": 2.0}, "tree:eagle25", SamplingConfig(), s).tokens
            for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) > 2


def test_relaxation_moves_the_distribution():
    """The same sampler with delta=4 is measurably not lossless (the test has power against relaxation)."""
    bundle = peaky_bundle(ENUM_CFG)
    sampling = SamplingConfig(cfg_scale=1.5)
    law = exact_distribution(bundle.target, 1, sampling)
    drawn = [tuple(named(bundle, 1, "uniform", {"delta": 4.0}, "chain:3", sampling, s).tokens)
             for s in range(1000)]
    assert chi_square_pvalue(drawn, law) < ALPHA
