"""The CUDA path on a GPU: real CUDA graphs of the round's phases (and a compiled forward), bf16, and no host
synchronisation inside a round.

Every test here needs a CUDA device and is skipped without one, with that reason; ``scripts/gpu_check.sh``
runs this file and says how many ran. Their CPU counterparts (static cache, the CPU stand-in for graphs that
refuses host reads and moving shapes, host reads per round, the exact laws through static steps) are in
test_steps.py and run everywhere.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_laws import bundle as law_bundle  # noqa: F401  (a fixture)
from test_prefix import BIG, PADDED, bundle, caption, engine_features, full_hidden, spec_prefix
from test_steps import check_law

from coolsd.core import decode as decode_module
from coolsd.core.decode import generate
from coolsd.core.rules import CoolSD, Eagle
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import random_bundle

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")


@pytest.mark.parametrize("steps", ["eager", "static"])
def test_cuda_steps_match_the_uncached_forward(steps):
    """float32 on the GPU: every feature the emitted tokens were sampled from equals one uncached forward."""
    model = bundle(BIG)
    cuda = copy.deepcopy(model).to("cuda")
    cap = caption(PADDED)
    for seed in range(3):
        tokens, got, _ = engine_features(cuda.target, cuda.drafter, cap, "tree:eagle25", seed, steps)
        embeds, valid = spec_prefix(model.target, cap)
        want = full_hidden(model.target, embeds, valid, torch.tensor([tokens]))[:, 0]
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("draft", ["chain:5", "tree:eagle25"])
def test_graphs_and_compiled_steps_give_the_eager_tokens(draft):
    """float32 on the GPU: the phases replayed from CUDA graphs (and compiled, then captured) draw the same
    random numbers and make the same choices as eager steps, image after image; the same seed twice gives the
    same tokens."""
    eager = random_bundle("tiny", device="cpu").to("cuda")
    tree = parse_draft(draft)
    for mode in ("graphs", "compiled"):
        stepped = eager.with_steps(mode)
        for seed in range(4):
            for rule in (Eagle(), CoolSD(delta=2.0, depth=tree.depth)):
                want = generate(eager, seed % 4, rule, tree, seed=seed).tokens
                assert generate(stepped, seed % 4, rule, tree, seed=seed).tokens == want, (mode, seed, rule)
        assert generate(stepped, 1, Eagle(), tree, seed=9).tokens == generate(stepped, 1, Eagle(), tree, seed=9).tokens


@pytest.mark.parametrize("name", ["eagle-tree", "cool-exp-auto", "lantern-gstar"])
def test_cuda_graphs_follow_the_spec_law(law_bundle, name):  # noqa: F811
    """The enumerated law of test_laws, sampled through CUDA graphs in float32 (the device draws its own
    random numbers; the law is what must hold)."""
    check_law(law_bundle, name, copy.deepcopy(law_bundle).to("cuda"), "graphs")


def test_compiled_cuda_graphs_follow_the_spec_law(law_bundle):  # noqa: F811
    """Each phase compiled by inductor, then captured as a CUDA graph: COOL-SD's enumerated law still holds."""
    check_law(law_bundle, "cool-exp-auto", copy.deepcopy(law_bundle).to("cuda"), "compiled")


def test_bf16_graphs_stay_close_to_float32():
    """bf16 weights change p slightly; the drafted and target distributions stay close to float32's."""
    full = random_bundle("tiny", device="cpu").to("cuda")
    half = copy.deepcopy(full).to("cuda", torch.bfloat16).with_steps("graphs")
    for seed in range(3):
        a = generate(full, seed, Eagle(), parse_draft("chain:3"), seed=seed, capture=True)
        b = generate(half, seed, Eagle(), parse_draft("chain:3"), seed=seed, capture=True)
        first_a, first_b = a.stats.captured[0]["p"], b.stats.captured[0]["p"]
        assert 0.5 * np.abs(first_a - first_b).sum() < 0.05


def test_rounds_do_not_synchronise(monkeypatch):
    """torch's sync debug mode warns at every synchronising call. Once a workspace's phases are captured, its
    rounds replay without one: the loop synchronises only when it reads how far the image got, once per batch
    of rounds it knew were needed (counted from the tokens each round emitted)."""
    model = random_bundle("tiny", device="cuda").with_steps("graphs")
    tree = parse_draft("tree:eagle25")
    generate(model, 0, Eagle(), tree, seed=0)  # captures the phases
    syncs = []
    original = decode_module.run_rounds

    def counted(ws, runner):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with pytest.warns(UserWarning) as caught:
                rounds = original(ws, runner)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs.append(len([w for w in caught if "synchroniz" in str(w.message)]))
        return rounds

    monkeypatch.setattr(decode_module, "run_rounds", counted)
    from test_steps import batches_needed
    for seed in range(1, 4):
        result = generate(model, seed % 4, Eagle(), tree, seed=seed)
        rounds = result.stats.rounds[1:]
        assert syncs[-1] == batches_needed([len(r.emitted) for r in rounds], model.config.image_tokens, tree.depth)
