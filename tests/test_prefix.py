"""The prefix path of a text-conditioned target (spec section 7): P = 8 caption slots of random features with
a padding mask (padding first, as LlamaGen does), guidance on (cfg_scale 2: the caption row, and the
unconditional caption with the same mask). On tiny random models this file proves:

1. The engine's KV cache is exact: in ``decode`` (Eagle-1, chain:3 and tree:eagle25) the target features of
   the prefill and of every round's root + accepted nodes, i.e. everything the emitted tokens were sampled
   from, equal one uncached forward over prefix + image with the mask. The mask matters in this setting: an
   uncached forward without it, and an engine whose cache forgets it, differ clearly. The same holds with the
   CUDA path's fixed-shape cache (``--steps static``).
2. Padding semantics, without trusting the mask code: the spec's mask, built here, is the model's; caption
   features at padded slots reach no image position (cached or not), features at valid slots do.
3. Eagle-1 is lossless here (spec property 1): images from ``decode`` follow the target's law, enumerated from
   uncached forwards and the independent ``helpers.reference_probabilities`` (chi-square); the same samples
   refute the law of a target that ignores the mask and the unguided law (the test has power).
4. ``Transformer.prefix`` is the spec's prefix (built here from ``cap_proj`` and ``uncond_embedding``), and a
   condition of the wrong kind (a class id for a text model, a caption for a class model) is a ValueError.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import chi_square_pvalue, peaky_bundle, reference_probabilities

from coolsd.core.decode import causal, decode
from coolsd.core.rules import Eagle
from coolsd.core.sampling import SamplingConfig, probabilities
from coolsd.core.trees import parse_draft
from coolsd.models.config import ModelConfig
from coolsd.models.gpt import Caption, ClassLabel, KVCache, Transformer, attention_mask
from coolsd.models.steps import StaticKVCache, with_steps

P, CAPTION_DIM, PADDED = 8, 12, 5
GUIDED = SamplingConfig(cfg_scale=2.0)
# 16 codes, 3x4 images: room for the whole eagle25 tree. ENUM: 4 codes, 1x5 images (1,024), listed exactly.
BIG = ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, grid_height=3, grid_width=4, multiple_of=16,
                  cls_token_num=P, caption_dim=CAPTION_DIM)
ENUM = replace(BIG, vocab_size=4, dim=16, n_layer=1, grid_height=1, grid_width=5)
SAMPLES = 1500
ALPHA = 1e-3  # a correct sampler fails with probability 0.1%; the seeds are fixed, so the outcome is too


def bundle(cfg: ModelConfig):
    """Peaky random target; a drafter with small weights (flatter q), so that drafts are often accepted.
    Frozen: nothing here needs gradients."""
    model = peaky_bundle(cfg, std=0.3, drafter_std=0.05)
    model.target.requires_grad_(False), model.drafter.requires_grad_(False)
    return model


def caption(padded: int, seed: int = 1) -> Caption:
    """Random features in every slot (padded ones too: the mask alone must hide them), first ``padded`` padding."""
    features = torch.randn(P, CAPTION_DIM, generator=torch.Generator().manual_seed(seed))
    return Caption(features, torch.arange(P) >= padded, f"{padded} padded")


def spec_prefix(target: Transformer, cap: Caption, uncond: torch.Tensor | None = None):
    """(embeds (2, P, dim), valid (2, P)) as spec section 7 says: fc1, GELU (tanh), fc2 of the caption's
    features (row 0) and of the ``uncond_embedding`` buffer (row 1); both rows use the caption's mask."""
    proj = target.cls_embedding.cap_proj
    uncond = target.cls_embedding.uncond_embedding if uncond is None else uncond
    embeds = proj.fc2(F.gelu(proj.fc1(torch.stack([cap.features, uncond])), approximate="tanh"))
    return embeds, cap.valid[None].expand(2, -1)


@torch.no_grad()
def full_hidden(target: Transformer, embeds, valid, seqs: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """One uncached forward over prefix + ``seqs[:, :-1]`` (the last token is never read) for each of the
    (B, n) sequences -> features (rows, B, P + n - 1, dim); position P - 1 + t predicts token t."""
    rows, batch, n = embeds.shape[0], seqs.shape[0], seqs.shape[1]
    inputs = torch.cat([embeds.repeat_interleave(batch, 0), target.embed(seqs[:, :-1]).repeat(rows, 1, 1)], 1)
    keys = torch.cat([valid.repeat_interleave(batch, 0), torch.ones(rows * batch, n - 1, dtype=torch.bool)], 1)
    hidden = target(inputs, torch.arange(P + n - 1), valid=keys if masked else None)
    return hidden.view(rows, batch, P + n - 1, -1)


@torch.no_grad()
def cached_hidden(target: Transformer, embeds, valid, tokens: list[int]) -> torch.Tensor:
    """The prefix through a KV cache (which keeps the mask), then the image inputs as one pending chain."""
    cache = target.new_cache(2, P + len(tokens))
    first = target(embeds, torch.arange(P), cache, 0, causal(P, cache.keys.device), valid)
    cache.commit(list(range(P)))
    rest = target(target.embed(torch.tensor(tokens[:-1]))[None].expand(2, -1, -1),
                  torch.arange(P, P + len(tokens) - 1), cache, 0, causal(len(tokens) - 1, cache.keys.device))
    return torch.cat([first, rest], 1)


class Recorded:
    """The engine's target with every output it returns recorded. A forward hook would not do: under CUDA
    graphs the module runs for warm-up and capture only, and replays bypass it."""

    def __init__(self, model) -> None:
        self.model, self.outputs = model, []

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)

    def __call__(self, *args):
        out = self.model(*args)
        self.outputs.append(out.clone())
        return out


def engine_features(target, drafter, cap: Caption, draft: str, seed: int, steps: str = "eager"):
    """Decode one image with Eagle-1 and catch every target forward of the engine: returns the tokens, the
    features (rows, P + N - 1, dim) at the prefix and at each round's root + accepted path (the positions the
    emitted tokens were sampled from), and each round's kept nodes."""
    stepped, drafter = with_steps(target, drafter, steps)
    recorded = Recorded(stepped)
    gen = decode(recorded, drafter, cap, Eagle(), parse_draft(draft), GUIDED, seed)
    outputs = recorded.outputs
    rounds = gen.stats.rounds[1:]
    keeps = [[0] + [c.node for c in r.tested if c.accepted] for r in rounds]
    assert len(outputs) == len(rounds) + 1 and [len(k) for k in keeps] == [len(r.emitted) for r in rounds]
    return gen.tokens, torch.cat([outputs[0]] + [out[:, k] for out, k in zip(outputs[1:], keeps)], 1), keeps


@pytest.mark.parametrize("steps", ["eager", "static"])  # static: the fixed-shape cache of the CUDA path
@pytest.mark.parametrize("padded", [PADDED, 0])
@pytest.mark.parametrize("draft", ["chain:3", "tree:eagle25"])
def test_engine_cache_matches_uncached_forward(draft, padded, steps, monkeypatch):
    model = bundle(BIG)
    target, cap = model.target, caption(padded)
    embeds, valid = spec_prefix(target, cap)
    keeps = []
    for seed in range(4):
        tokens, got, kept = engine_features(target, model.drafter, cap, draft, seed, steps)
        keeps += kept
        want = full_hidden(target, embeds, valid, torch.tensor([tokens]))[:, 0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        p_engine = probabilities(target.logits(got[:, P - 1:]), GUIDED).double().numpy()
        p_reference = reference_probabilities(target.logits(want[:, P - 1:]).numpy(), GUIDED)
        np.testing.assert_allclose(p_engine, p_reference, atol=1e-5)
    assert max(map(len, keeps)) >= 3  # rounds accepted two drafts or more
    if draft.startswith("tree"):  # a path off the first children: the cache reorders kept entries
        assert any(k != list(range(len(k))) for k in keeps)
    if padded:  # negative controls: the mask changes the features, and a cache that forgets it is caught
        unmasked = full_hidden(target, embeds, valid, torch.tensor([tokens]), masked=False)[:, 0]
        assert (unmasked - want)[:, P - 1:].abs().max() > 1e-2
        for cache_class in (KVCache, StaticKVCache):
            monkeypatch.setattr(cache_class, "mark_valid", lambda self, valid, offset: None)
        tokens, got, _ = engine_features(target, model.drafter, cap, draft, 0, steps)
        want = full_hidden(target, embeds, valid, torch.tensor([tokens]))[:, 0]
        assert (got - want)[:, P - 1:].abs().max() > 1e-2


def test_attention_mask_is_the_spec_mask():
    """Query i sees key j iff (j <= i and (j >= P or valid[j])) or j == i; uncached, and from a cache."""
    length = P + 4
    keys = torch.ones(2, length, dtype=torch.bool)
    keys[0, :PADDED], keys[1, :2] = False, False  # rows may differ
    expected = torch.tensor([[[(j <= i and (j >= P or bool(keys[r, j]))) or j == i for j in range(length)]
                              for i in range(length)] for r in range(2)])
    assert torch.equal(attention_mask(None, None, length, keys)[:, 0], expected)
    cache = KVCache(1, 2, 1, 4, length, torch.device("cpu"), torch.float32)
    cache.mark_valid(keys[:, :P], 0)
    cache.commit(list(range(P)))
    pending = attention_mask(cache, causal(3, torch.device("cpu")), 3)[:, 0]
    assert torch.equal(pending, expected[:, P:P + 3, :P + 3])


@pytest.mark.parametrize("cached", [False, True])
def test_padded_slots_cannot_reach_the_image(cached):
    """New features at padded slots (both rows) leave every image position's logits unchanged; at one
    valid slot they change them."""
    target, cap = bundle(BIG).target, caption(PADDED)
    tokens = torch.randint(BIG.vocab_size, (BIG.image_tokens,), generator=torch.Generator().manual_seed(0))
    uncond = target.cls_embedding.uncond_embedding

    def image_logits(slots: list[int]) -> torch.Tensor:
        noise = torch.randn(2, P, CAPTION_DIM, generator=torch.Generator().manual_seed(7))
        features, other = cap.features.clone(), uncond.clone()
        features[slots], other[slots] = noise[0, slots], noise[1, slots]
        embeds, valid = spec_prefix(target, Caption(features, cap.valid), other)
        hidden = (cached_hidden(target, embeds, valid, tokens.tolist()) if cached
                  else full_hidden(target, embeds, valid, tokens[None])[:, 0])
        return target.logits(hidden[:, P - 1:])

    base = image_logits([])
    torch.testing.assert_close(image_logits(list(range(PADDED))), base, atol=1e-6, rtol=0)
    assert (image_logits([PADDED]) - base).abs().min(dim=-1).values.max() > 1e-3


def enumerated_law(target: Transformer, cap: Caption, sampling: SamplingConfig, masked: bool = True) -> dict:
    """P(x_1..x_N) of every image (vanilla AR's law) from one uncached forward over all of them."""
    seqs = torch.tensor(list(itertools.product(range(ENUM.vocab_size), repeat=ENUM.image_tokens)))
    embeds, valid = spec_prefix(target, cap)
    with torch.no_grad():
        logits = target.logits(full_hidden(target, embeds, valid, seqs, masked)[:, :, P - 1:])
    probs = reference_probabilities(logits.numpy(), sampling)  # (images, N, V)
    chosen = np.take_along_axis(probs, seqs.numpy()[..., None], axis=-1)[..., 0].prod(-1)
    return dict(zip(map(tuple, seqs.tolist()), chosen.tolist()))


@pytest.mark.parametrize("draft", ["chain:3", "tree:eagle25"])
def test_eagle_is_lossless_on_a_padded_caption(draft):
    model = bundle(ENUM)
    target, cap = model.target, caption(PADDED)
    law = enumerated_law(target, cap, GUIDED)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    runs = [decode(target, model.drafter, cap, Eagle(), parse_draft(draft), GUIDED, seed) for seed in range(SAMPLES)]
    drawn = [tuple(run.tokens) for run in runs]
    tau = sum(run.stats.tau for run in runs) / SAMPLES
    pvalue = chi_square_pvalue(drawn, law)
    # negative controls: the same images against the law of a target that ignores the mask, and the unguided law
    unmasked = chi_square_pvalue(drawn, enumerated_law(target, cap, GUIDED, masked=False))
    unguided = chi_square_pvalue(drawn, enumerated_law(target, cap, SamplingConfig()))
    print(f"\n{draft}: p-value {pvalue:.3g} (mask ignored {unmasked:.3g}, unguided {unguided:.3g}), tau {tau:.2f}")
    assert pvalue > ALPHA, f"{draft}: chi-square p-value {pvalue:.2e} over {SAMPLES} images"
    assert tau > 1.2  # drafts were accepted: the speculative path was exercised
    assert unmasked < 1e-9 and unguided < 1e-9


def test_prefix_is_the_spec_prefix_and_refuses_the_wrong_condition():
    target, cap = bundle(ENUM).target, caption(PADDED)
    embeds, valid = spec_prefix(target, cap)
    with torch.no_grad():
        for rows in (1, 2):
            prefix = target.prefix(cap, rows)
            torch.testing.assert_close(prefix.embeds, embeds[:rows])
            assert torch.equal(prefix.valid, valid[:rows]) and prefix.length == P
    for condition in (1, ClassLabel(1)):
        with pytest.raises(ValueError, match="needs a caption"):
            target.prefix(condition, 2)
    class_model = Transformer(replace(ENUM, caption_dim=0, cls_token_num=1))
    with pytest.raises(ValueError, match="class must be an integer"):
        class_model.prefix(cap, 2)
    assert class_model.prefix(1, 2).embeds.shape == (2, 1, ENUM.dim)


@pytest.mark.parametrize("features, valid, needle", [
    (torch.zeros(P, CAPTION_DIM), torch.ones(P - 3, dtype=torch.bool), "mask must be a bool tensor of shape"),
    (torch.zeros(P, CAPTION_DIM), torch.ones(P + 1, dtype=torch.bool), "mask must be a bool tensor of shape"),
    (torch.zeros(P, CAPTION_DIM), torch.ones(P), "mask must be a bool tensor of shape"),
    (torch.zeros(P - 1, CAPTION_DIM), torch.ones(P, dtype=torch.bool), "features must have shape"),
    (torch.zeros(P, CAPTION_DIM - 2), torch.ones(P, dtype=torch.bool), "features must have shape"),
])
def test_malformed_caption_is_refused_not_half_masked(features, valid, needle):
    """A mask shorter than P would leave the last slots unmasked; a longer one would mask an image position."""
    with pytest.raises(ValueError, match=needle):
        bundle(ENUM).target.prefix(Caption(features, valid), 2)
