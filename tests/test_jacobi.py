"""Jacobi windows (spec section 11): drafts the target makes for itself, verified by the same walk.

* Property 1 for every refresh (independent, coupled, Gumbel) and both fresh-draft laws with the Eagle-1 rule:
  images decoded in batches against vanilla AR's law, enumerated here on a tiny model with guidance, top-k and a
  constrained (forced) position; the law's ``p`` is computed here from uncached forwards (numpy guidance, mask,
  filter). Planted faults (SCD's published bookkeeping, a Gumbel vector reused after its position was tested, a
  fresh draft drawn from one law and stored with another ``q``) fail the same test.
* Greedy (top-k 1): every window gives greedy AR's tokens. Batch-vs-alone identity on the shipped model.
* The round under the CPU graph stand-in: no host read, one operation sequence.
* Bad input: one line each.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from helpers import chi_square_pvalue, peaky_bundle, reference_probabilities
from test_batch import graph_like
from test_batch import shipped  # noqa: F401  (a fixture)

from coolsd.core.decode import EMPTY, decode, decode_batch, generate_batch
from coolsd.core.interface import PositionRules
from coolsd.core.jacobi import JacobiSource
from coolsd.core.rules import AR, Eagle, build_rule
from coolsd.core.sampling import SamplingConfig, sample
from coolsd.core.sources import FRESH_CODE, KEPT_CODE, REFRESHED_CODE, gather_rows
from coolsd.core.trees import FRESH_LAWS, REFRESHES, parse_draft
from coolsd.models.bundle import Bundle
from coolsd.models.config import ModelConfig

# 4 codes and a forced fifth token at the third of 6 positions; top-k 2 of the 4 allowed codes
TINY = ModelConfig(vocab_size=5, dim=16, n_layer=1, n_head=2, num_classes=2, grid_height=1, grid_width=6,
                   multiple_of=16)
KINDS = (0, 0, 1, 0, 0, 0)
FORCED = 4
SAMPLING = SamplingConfig(cfg_scale=2.0, top_k=2)
CLASS_ID = 1
IMAGES = 2400  # a correct sampler passes with probability 1 - ALPHA; every planted fault below gave < 1e-9
BATCH = 300
ALPHA = 1e-4


def tiny_rules() -> PositionRules:
    allowed = torch.zeros(2, TINY.vocab_size, dtype=torch.bool)
    allowed[0, :FORCED] = True
    allowed[1, FORCED] = True
    return PositionRules(torch.tensor(KINDS), allowed)


@pytest.fixture(scope="module")
def tiny() -> Bundle:
    bundle = peaky_bundle(TINY, seed=3, std=0.6)
    bundle.target.position_rules = tiny_rules()
    return bundle


@torch.no_grad()
def ar_law(bundle: Bundle, sampling: SamplingConfig) -> dict[tuple, float]:
    """Vanilla AR's law of every image: each sequence teacher-forced through the uncached target, guidance,
    the position's mask (a disallowed logit is -1e9 in both rows, so guidance keeps it out) and top-k in numpy."""
    target, rules = bundle.target, tiny_rules()
    allowed = rules.allowed[rules.kinds].numpy()  # (T, V)
    labels = torch.tensor([CLASS_ID, TINY.num_classes][:sampling.rows])
    law = {}
    for free in itertools.product(range(FORCED), repeat=len(KINDS) - 1):
        seq = list(free[:2]) + [FORCED] + list(free[2:])
        tokens = torch.tensor(seq)[None].expand(len(labels), -1)
        hidden = target(target.sequence_inputs(target.class_prefix(labels), tokens), torch.arange(len(seq)))
        logits = target.output(hidden).numpy().astype(np.float64)  # (rows, T, V): row t predicts token t
        logits = np.where(allowed[None], logits, -1e9)
        probs = reference_probabilities(logits, sampling)
        law[tuple(seq)] = float(np.prod([probs[t, seq[t]] for t in range(len(seq))]))
    return law


def sampled(bundle: Bundle, draft: str, images: int = IMAGES, rule=None, sampling=SAMPLING) -> list[tuple]:
    tree = parse_draft(draft)
    rule = rule or Eagle()
    out = []
    for start in range(0, images, BATCH):
        runs = decode_batch(bundle.target, bundle.drafter, [CLASS_ID] * BATCH, rule, tree, sampling,
                            list(range(start, start + BATCH)))
        out += [tuple(run.tokens) for run in runs]
    return out


WINDOWS = [f"jacobi:3:{refresh}:{fresh}" for refresh in REFRESHES for fresh in FRESH_LAWS] + ["jacobi:4:coupled"]


@pytest.fixture(scope="module")
def law(tiny) -> dict[tuple, float]:
    law = ar_law(tiny, SAMPLING)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    return law


@pytest.mark.parametrize("draft", WINDOWS)
def test_every_jacobi_window_keeps_ar_law(tiny, law, draft):
    """Property 1 (spec section 11) with the Eagle-1 rule, in batches of 300 images (each image its own
    stream: its law is its law alone, spec section 9)."""
    images = sampled(tiny, draft)
    assert all(image[2] == FORCED for image in images)
    pvalue = chi_square_pvalue(images, law)
    assert pvalue > ALPHA, f"{draft}: chi-square p-value {pvalue:.2e} over {IMAGES} images"


def test_the_law_test_sees_a_relaxed_rule(tiny, law):
    """Negative control of the test itself: a relaxed rule on the same windows moves the law."""
    images = sampled(tiny, "jacobi:3:coupled", rule=build_rule("uniform", {"delta": 3.0}, 3))
    assert chi_square_pvalue(images, law) < 1e-6


# --- planted faults -----------------------------------------------------------------------------------------

def stale_q_for_kept_drafts(monkeypatch) -> None:
    """SCD's Lumina-mGPT code: a draft the coupling kept is stored with its *old* q, not this round's p."""
    original = JacobiSource.observe

    def observe(self, ws, verdict, p, count):
        old_q = ws.q.clone()
        original(self, ws, verdict, p, count)
        rows = (count[:, None] + self.slots).clamp_max(self.window - 1)
        kept = ws.node_origin[:, 1:] == KEPT_CODE
        ws.q.copy_(torch.where(kept[..., None], gather_rows(old_q, rows), ws.q))

    monkeypatch.setattr(JacobiSource, "observe", observe)


def fresh_law_mismatch(monkeypatch) -> None:
    """Fresh drafts drawn with four times the weight on the lowest allowed token, stored as uniform."""
    def fresh_drafts(self, ws):
        allowed = ws.allowed(self.slots).to(ws.dtype)
        tilted = allowed.clone()
        tilted[..., 0] *= 4
        return sample(tilted, self.uniforms[:, 2]), allowed / allowed.sum(-1, keepdim=True)

    monkeypatch.setattr(JacobiSource, "fresh_drafts", fresh_drafts)


@pytest.mark.parametrize("plant, draft", [(stale_q_for_kept_drafts, "jacobi:4:coupled:uniform"),
                                          (fresh_law_mismatch, "jacobi:4")], ids=["scd-stale-q", "fresh-law"])
def test_planted_faults_fail_the_law_test(tiny, law, monkeypatch, plant, draft):
    images = sampled(tiny, draft)
    assert chi_square_pvalue(images, law) > ALPHA  # the same window passes without the fault
    plant(monkeypatch)
    pvalue = chi_square_pvalue(sampled(tiny, draft), law)
    assert pvalue < 1e-6, f"{plant.__name__}: the fault passed (p-value {pvalue:.2e})"


def gumbel_vectors(shipped, draft: str = "jacobi:8:gumbel") -> list[str]:
    """Where Gumbel coupling's bookkeeping departs from the spec: every absolute position owns one vector, the
    same in every window until the position is committed, and no vector serves two positions. The noise of each
    window (after each refresh) is read by position; returns what broke those rules."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    broken = []
    original = JacobiSource.refreshed

    def refreshed(self, ws, *args):
        out = original(self, ws, *args)
        for image in range(ws.batch):
            for slot in range(self.window):
                key = (image, int(ws.n[image]) + slot)
                vector = self.noise[image, slot].clone()
                if key in seen and not torch.equal(seen[key], vector):
                    broken.append(f"position {key} changed its vector")
                seen.setdefault(key, vector)
        return out

    JacobiSource.refreshed = refreshed
    try:
        decode_batch(shipped.target, None, [1, 4], Eagle(), parse_draft(draft), shipped.sampling, [0, 1])
    finally:
        JacobiSource.refreshed = original
    vectors = list(seen.items())
    for (key, a), (other, b) in itertools.combinations(vectors, 2):
        if torch.equal(a, b):
            broken.append(f"positions {key} and {other} share a vector")
    return broken


def test_each_position_owns_its_gumbel_vector(shipped):
    assert gumbel_vectors(shipped) == []


@pytest.mark.parametrize("fault", ["unshifted", "reused"])
def test_gumbel_bookkeeping_faults_are_caught(shipped, monkeypatch, fault):
    """SCD's code keeps one vector through its AR stretches (here: slots never shifted); a vector passed on from
    the position just tested to the next one. The law test has little power against these (the coupled tokens
    are a minority on a tiny image), so the bookkeeping itself is checked."""
    def refreshed(self, ws, rows, p_rows, old_tokens, drafted):
        if fault == "reused":
            self.noise.copy_(gather_rows(self.noise, (rows - 1).clamp(0, self.window - 1)))
        tokens = (p_rows / self.noise).argmax(-1)
        return tokens, drafted & (tokens == old_tokens)

    monkeypatch.setattr(JacobiSource, "refreshed", refreshed)
    assert gumbel_vectors(shipped) != []


# --- tokens -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("draft", ["jacobi:1", "jacobi:8", "jacobi:16:coupled", "jacobi:30:gumbel:point"])
def test_greedy_jacobi_gives_greedy_ar_tokens(shipped, draft):
    greedy = SamplingConfig(cfg_scale=2.0, top_k=1)
    for cls, seed in ((1, 0), (7, 3)):
        ar = decode(shipped.target, None, cls, AR(), EMPTY, greedy, seed).tokens
        got = decode(shipped.target, None, cls, Eagle(), parse_draft(draft), greedy, seed + 1)
        assert got.tokens == ar, draft
        assert got.stats.tau > 1.2  # drafts were accepted, not merely replaced token by token


@pytest.mark.parametrize("method, params, draft", [("eagle", {}, "jacobi:16"), ("eagle", {}, "jacobi:8:gumbel"),
                                                   ("cool", {"delta": 2.0}, "jacobi:16:coupled"),
                                                   ("gsd", {}, "jacobi:16:point")])
def test_an_image_in_a_batch_gets_its_tokens_alone(shipped, method, params, draft):
    tree = parse_draft(draft)
    rule = build_rule(method, params, tree.depth, shipped)
    classes, seeds = [3, 8, 1], [11, 12, 13]
    batch = decode_batch(shipped.target, None, classes, rule, tree, shipped.sampling, seeds)
    for cls, seed, got in zip(classes, seeds, batch):
        alone = decode(shipped.target, None, cls, rule, tree, shipped.sampling, seed)
        assert got.tokens == alone.tokens
        assert [r.sources for r in got.stats.rounds] == [r.sources for r in alone.stats.rounds]


def test_records_name_where_each_draft_came_from(shipped):
    """The first window is fresh; later windows hold refreshed drafts (rows this forward scored) and, with the
    coupling, kept ones; a fresh draft appears only where the forward did not reach."""
    stats = decode(shipped.target, None, 2, Eagle(), parse_draft("jacobi:8:coupled"), shipped.sampling, 5).stats
    rounds = stats.rounds[1:]
    assert rounds[0].sources == ["fresh"] * 8
    seen = {origin for r in rounds for origin in r.sources}
    assert seen == {"fresh", "refreshed", "kept"}
    for before, after in zip(rounds, rounds[1:]):
        scored = 8 - len(before.emitted) + 1  # rows of the last forward that lie in the new window
        assert all(origin != "fresh" for origin in after.sources[:scored])
        assert all(origin == "fresh" for origin in after.sources[scored:])
    assert (FRESH_CODE, REFRESHED_CODE, KEPT_CODE) == (1, 2, 3)


def test_a_jacobi_round_is_graph_safe(shipped):
    """The CPU stand-in for CUDA graphs: no host read inside a round, the same operations every round (the
    Gumbel refresh and GSD's groups included), and the eager tokens."""
    graphs, runner = graph_like(shipped)
    rule = build_rule("gsd", {"residual": "gstar"}, 8, shipped)
    for draft in ("jacobi:8:coupled", "jacobi:8:gumbel:point"):
        tree = parse_draft(draft)
        want = generate_batch(shipped, [1, 2], rule, tree, None, [0, 1])
        got = generate_batch(graphs, [1, 2], rule, tree, None, [0, 1])
        assert [g.tokens for g in got] == [w.tokens for w in want]
    assert runner.calls > 10


# --- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("jacobi:0", "a Jacobi window must be a whole number of drafts"),
    ("jacobi:x", "a Jacobi window must be a whole number of drafts"),
    ("jacobi:63", "deeper than this model can use"),
    ("jacobi:5000", "deeper than this model can use"),
    ("jacobi:8:wobbly", "unknown Jacobi option"),
    ("jacobi:8:coupled:gumbel", "names the refresh twice"),
])
def test_bad_jacobi_windows_are_one_line_errors(spec, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_draft(spec, 62)
    assert "\n" not in str(error.value)


def test_a_model_without_a_drafter_defaults_to_a_jacobi_window():
    """Lumina-mGPT has no published drafter: its preset's draft is SCD's coupled window, which the command line
    takes when --draft is not given; the shipped model keeps chain:5."""
    from coolsd.cli.common import model_info
    lumina = model_info("lumina-mgpt-7b-768", None)
    assert parse_draft(lumina.draft, lumina.config.image_tokens - 2).needs_drafter is False
    assert model_info(None, None).draft == "chain:5"
