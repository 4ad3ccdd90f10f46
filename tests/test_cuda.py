"""The CUDA path on a GPU: real CUDA graphs (and a compiled forward), bf16, and one host sync per round.

Every test here needs a CUDA device and is skipped without one, with that reason; ``scripts/gpu_check.sh``
runs this file and says how many ran. Their CPU counterparts (static cache, replay stand-in, host reads, the
exact laws through static steps) are in test_steps.py and run everywhere.
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
from coolsd.core.rules import Eagle
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import random_bundle

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")


@pytest.mark.parametrize("steps", ["eager", "graphs", "compiled"])
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


@pytest.mark.parametrize("name", ["eagle-tree", "cool-exp-auto", "lantern-gstar"])
def test_cuda_graphs_follow_the_spec_law(law_bundle, name):  # noqa: F811
    """The enumerated law of test_laws, sampled through CUDA graphs in float32 (the device draws its own
    random numbers; the law is what must hold)."""
    check_law(law_bundle, name, copy.deepcopy(law_bundle).to("cuda"), "graphs")


def test_bf16_graphs_stay_close_to_float32():
    """bf16 weights change p slightly; the drafted and target distributions stay close to float32's."""
    full = random_bundle("tiny", device="cpu").to("cuda")
    half = copy.deepcopy(full).to("cuda", torch.bfloat16).with_steps("graphs")
    for seed in range(3):
        a = generate(full, seed, Eagle(), parse_draft("chain:3"), seed=seed, capture=True)
        b = generate(half, seed, Eagle(), parse_draft("chain:3"), seed=seed, capture=True)
        first_a, first_b = a.stats.captured[0]["p"], b.stats.captured[0]["p"]
        assert 0.5 * np.abs(first_a - first_b).sum() < 0.05


def test_one_host_sync_per_round(monkeypatch):
    """torch's sync debug mode warns at every synchronising call; a round makes exactly one (its copy). A
    graph's capture synchronises, so rounds that capture a new call shape (the drafter's catch-up takes as many
    inputs as the last round emitted; trees are cut near the image's end) are counted apart: after a few
    images most rounds capture nothing, and each of those must synchronise exactly once."""
    model = random_bundle("tiny", device="cuda").with_steps("graphs")
    tree = parse_draft("tree:eagle25")
    for seed in range(12):  # capture outside the count
        generate(model, seed % 4, Eagle(), tree, seed=seed)
    counts, where = {"captured": [], "replayed": []}, set()
    original = decode_module.decode_round

    def captures() -> int:
        return len(model.target.captured) + len(model.drafter.captured)

    def counted(run, state):
        before = captures()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with pytest.warns(UserWarning) as caught:
                out = original(run, state)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        synced = [w for w in caught if "synchroniz" in str(w.message)]
        replayed = captures() == before
        counts["replayed" if replayed else "captured"].append(len(synced))
        if replayed:
            where.update(f"{w.filename}:{w.lineno}" for w in synced)
        return out

    monkeypatch.setattr(decode_module, "decode_round", counted)
    for seed in range(100, 106):
        generate(model, seed % 4, Eagle(), tree, seed=seed)
    assert len(counts["replayed"]) >= 10, counts
    assert set(counts["replayed"]) == {1}, (counts, sorted(where))
