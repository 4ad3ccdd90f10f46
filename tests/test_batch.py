"""Batches (spec section 9): B images decoded in lockstep rounds, each committing its own accepted count.

* Each image's law in a batch of 3 with different conditions, for every rule on a chain and a tree, against the
  exact enumeration of ``test_laws`` (the spec's rounds, computed here), and the images' independence (the joint
  law of pairs of tokens across images against the product of the enumerated marginals).
* On the shipped model, every method's tokens in a batch are those of decoding each image alone (the recorded
  fingerprints), also through the CPU stand-in for CUDA graphs; an image that finishes early and one that
  finishes late keep their own tokens, rounds and statistics.
* The per-image cache: its mask and its commit against their definitions, row by row.
* Bad input: no image, mismatched counts, a batch too large for memory; one-line errors.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import chi_square_pvalue, l2_neighbours, peaky_bundle
from test_fingerprint import DRAFTS, METHODS, RECORD, key
from test_laws import (
    ENUM_CFG,
    SIBLINGS,
    Law,
    SpecRule,
    TinyWorld,
    chain_paths,
    sequence_law,
    total_variation,
    vanilla_law,
)

import coolsd
from coolsd.core import decode as decode_module
from coolsd.core.decode import batch_memory, decode, decode_batch, generate_batch
from coolsd.core.graphs import CheckedPhases, EagerPhases
from coolsd.core.rules import build_rule
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import DraftTree, parse_draft
from coolsd.models.bundle import Bundle, load_bundle
from coolsd.models.cache import StaticKVCache
from coolsd.models.steps import Steps, unwrapped

CONDITIONS = (0, 1, 2)  # one batch: three images of three classes
BATCH_CFG = replace(ENUM_CFG, num_classes=3)
EMPTY_TREE = frozenset()
# every rule on a chain and on a tree with siblings (and AR, which drafts nothing)
BATCH_CASES = {
    "ar": ("ar", {}, EMPTY_TREE, SamplingConfig(cfg_scale=2.0, top_k=3)),
    "eagle-chain": ("eagle", {}, chain_paths(3), SamplingConfig(cfg_scale=1.5, top_p=0.9, temperature=0.8)),
    "eagle-tree": ("eagle", {}, SIBLINGS, SamplingConfig(cfg_scale=2.0, top_k=3)),
    "uniform-chain": ("uniform", {"delta": 2.0}, chain_paths(2), SamplingConfig(temperature=1.3)),
    "uniform-tree": ("uniform", {"delta": 2.0}, SIBLINGS, SamplingConfig(cfg_scale=2.0)),
    "cool-chain": ("cool", {"delta": 2.0, "nu": 0.7, "mu": "auto"}, chain_paths(3), SamplingConfig(cfg_scale=2.0)),
    "cool-tree": ("cool", {"delta": 2.0, "nu": 0.5, "mu": -0.5}, SIBLINGS, SamplingConfig(temperature=0.8, top_k=3)),
    "lantern-chain": ("lantern", {"k": 2, "lambda": 2.0, "residual": "gstar"}, chain_paths(2),
                      SamplingConfig(cfg_scale=2.0, top_p=0.95)),
    "lantern-tree": ("lantern", {"k": 2, "lambda": 2.0, "residual": "lantern"}, SIBLINGS,
                     SamplingConfig(cfg_scale=2.0)),
}
BATCHES = 1000  # calls of a batch of 3: 1,000 images of each condition
ALPHA = 1e-4  # per test: a correct sampler fails one with probability 1e-4 (fixed seeds: a fixed outcome)
JOINT_POSITIONS = (0, 2, 4)  # the first token (drawn at the prefill), one in the middle, the last


@pytest.fixture(scope="module")
def three_classes() -> Bundle:
    """Random weights whose every image token stays random in every class (no token above probability 0.85), so
    that dependence between images can show, with a drafter flatter than the target (drafts are often refused)."""
    return peaky_bundle(BATCH_CFG, seed=2, std=0.5, drafter_std=0.3)


@pytest.fixture(scope="module")
def shipped() -> Bundle:
    torch.set_num_threads(1)
    return load_bundle(device="cpu")


def case_law(bundle: Bundle, case: tuple, class_id: int) -> Law:
    """The spec's law of one image of ``class_id`` (vanilla AR's for AR)."""
    method, params, paths, sampling = case
    world = TinyWorld(bundle, class_id, sampling)
    if method == "ar":
        return vanilla_law(world)
    rule = SpecRule(method, params, max(map(len, paths)), l2_neighbours(bundle.codebook))
    return sequence_law(world, paths, rule)


def token_marginal(law: Law, position: int) -> np.ndarray:
    """P(x_position = v) for every token v, from a law of whole images."""
    marginal = np.zeros(BATCH_CFG.vocab_size)
    for sequence, probability in law.items():
        marginal[sequence[position]] += probability
    return marginal


def batched_images(bundle: Bundle, case: tuple, batches: int) -> tuple[list[list[tuple]], float]:
    """``batches`` calls of a batch of 3 (classes 0, 1, 2; seeds 3c, 3c + 1, 3c + 2): per call, its images; and
    the mean tokens per round."""
    method, params, paths, sampling = case
    tree = DraftTree(tuple(paths), "batch")
    rule = build_rule(method, params, max(tree.depth, 1), bundle)
    calls, taus = [], []
    for call in range(batches):
        runs = decode_batch(bundle.target, bundle.drafter, list(CONDITIONS), rule, tree, sampling,
                            [3 * call + image for image in range(3)])
        calls.append([tuple(run.tokens) for run in runs])
        taus += [run.stats.tau for run in runs]
    return calls, float(np.mean(taus))


@pytest.mark.parametrize("name", list(BATCH_CASES))
def test_each_image_of_a_batch_follows_its_own_law_independently(three_classes, name):
    """Per image: Pearson's chi-square of its 1,000 draws against the enumerated law of its class. Across images:
    the joint law of (image a's token t, image b's token t), for every pair and t in JOINT_POSITIONS, against
    the product of the enumerated marginals (images that share random numbers or rows fail it)."""
    case = BATCH_CASES[name]
    laws = [case_law(three_classes, case, c) for c in CONDITIONS]
    calls, tau = batched_images(three_classes, case, BATCHES)
    if case[0] != "ar":
        assert tau > 1.1  # drafts were accepted: the speculative path ran
    if case[0] not in ("ar", "eagle"):  # the relaxed law is far from the target's: the test tells them apart
        world = TinyWorld(three_classes, CONDITIONS[-1], case[3])
        assert total_variation(laws[-1], vanilla_law(world)) > 0.05
    for image, law in enumerate(laws):
        pvalue = chi_square_pvalue([call[image] for call in calls], law)
        assert pvalue > ALPHA, f"{name}: image {image} (class {CONDITIONS[image]}): p-value {pvalue:.2e}"
    for a, b in itertools.combinations(range(len(CONDITIONS)), 2):
        for t in JOINT_POSITIONS:
            first, second = token_marginal(laws[a], t), token_marginal(laws[b], t)
            product = {(u, v): first[u] * second[v] for u in range(len(first)) for v in range(len(second))}
            pvalue = chi_square_pvalue([(call[a][t], call[b][t]) for call in calls], product)
            assert pvalue > ALPHA, f"{name}: images {a} and {b} at token {t} are dependent: p-value {pvalue:.2e}"


def test_the_joint_test_sees_images_that_share_their_random_numbers(three_classes, monkeypatch):
    """Negative control: every image drawing the first image's numbers (a plausible batching fault) fails the
    joint test, while each image alone keeps its law."""
    def shared(self, uniforms):
        generator = self.generators[0]
        uniforms[0].uniform_(generator=generator)
        uniforms.copy_(uniforms[:1].expand_as(uniforms))
        for races, _ in self.source.randoms:
            races[0].exponential_(generator=generator)
            races.copy_(races[:1].expand_as(races))

    monkeypatch.setattr(decode_module.Workspace, "draw_randoms", shared)
    case = BATCH_CASES["eagle-chain"]
    laws = [case_law(three_classes, case, c) for c in CONDITIONS[:2]]
    calls, _ = batched_images(three_classes, case, 400)
    marginals = [token_marginal(law, 0) for law in laws]
    product = {(u, v): marginals[0][u] * marginals[1][v] for u in range(4) for v in range(4)}
    assert chi_square_pvalue([(call[0][0], call[1][0]) for call in calls], product) < ALPHA * 1e-3


def fingerprint_cases() -> list[tuple[str, dict, str]]:
    return [(method, params, draft) for method, params in METHODS for draft in DRAFTS
            if not (method == "ar" and draft != DRAFTS[0])]


def test_every_method_gives_each_image_its_alone_tokens(shipped):
    """The fingerprint test's four (class, seed) images of every method and draft, as one batch: each image's
    tokens are the recorded tokens of decoding it alone (tests/test_fingerprint.py checks those)."""
    recorded = json.loads(RECORD.read_text())
    pairs = [(0, 0), (0, 1), (7, 0), (7, 1)]
    for method, params, draft in fingerprint_cases():
        tree = parse_draft(draft)
        rule = build_rule(method, params, tree.depth, shipped.neighbours)
        runs = generate_batch(shipped, [c for c, _ in pairs], rule, tree, shipped.sampling, [s for _, s in pairs])
        for (class_id, seed), run in zip(pairs, runs):
            assert run.tokens == recorded[key(method, params, draft, class_id, seed)], (method, params, draft,
                                                                                        class_id, seed)
            assert run.stats.batch == 4


def graph_like(bundle: Bundle) -> tuple[Bundle, CheckedPhases]:
    runner = CheckedPhases()
    target, drafter = (Steps(unwrapped(model), runner=runner) for model in (bundle.target, bundle.drafter))
    return replace(bundle, target=target, drafter=drafter, steps="graphs"), runner


@pytest.mark.parametrize("method, draft", [("ar", "chain:5"), ("cool", "chain:5"), ("eagle", "tree:eagle25")])
def test_a_batch_through_the_graph_stand_in_reads_nothing_and_keeps_the_tokens(shipped, method, draft):
    """Under the CPU stand-in for CUDA graphs every round of a batch of 5 runs with no host read and one fixed
    operation sequence per phase, and gives the eager batch's tokens."""
    graphs, runner = graph_like(shipped)
    tree = parse_draft(draft)
    rule = build_rule(method, {"delta": 2.0} if method == "cool" else {}, tree.depth, shipped.neighbours)
    conditions, seeds = [0, 3, 5, 7, 9], [11, 12, 13, 14, 15]
    want = generate_batch(shipped, conditions, rule, tree, None, seeds)
    got = generate_batch(graphs, conditions, rule, tree, None, seeds)
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert runner.calls > 10 and len(runner.workspaces) == 1


# Two images of the shipped model that finish far apart under COOL-SD delta=2, chain:5: (class, seed) pairs found
# by search; the test checks that they still do.
EARLY, LATE = (0, 4), (8, 4)


def same_rounds(got: list, want: list, exact: bool) -> None:
    """Rounds equal field by field: tokens, validity and outcomes exactly; probabilities and costs exactly, or
    to float32 rounding (a one-image step multiplies 2 rows, which the CPU's matrix multiply computes with
    another kernel than 4 or more: logits then differ by about 1e-5)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = a.to_dict(), b.to_dict()
        for name in ("start", "drafted", "valid", "emitted", "next_origin"):
            assert a[name] == b[name], name
        for x, y in zip(a["tested"], b["tested"]):
            assert (x["node"], x["depth"], x["accepted"]) == (y["node"], y["depth"], y["accepted"])
            for name in ("accept_prob", "cost"):
                assert x[name] == y[name] if exact else x[name] == pytest.approx(y[name], rel=1e-4, abs=1e-5)


def test_an_image_that_finishes_early_stops_committing_and_keeps_its_own_statistics(shipped):
    """In a batch, the early image's rounds stop while the late one's go on: each image's tokens, rounds,
    per-round records and statistics are those of decoding it alone, and the batch ran the late one's rounds.
    In batches of 2 and more an image's records do not depend on the others at all: bit for bit the same."""
    tree = parse_draft("chain:5")
    rule = build_rule("cool", {"delta": 2.0}, tree.depth, shipped.neighbours)
    batch = generate_batch(shipped, [EARLY[0], LATE[0]], rule, tree, None, [EARLY[1], LATE[1]])
    alone = [coolsd.decode_image(shipped, c, rule, tree, seed=s) for c, s in (EARLY, LATE)]
    early, late = (run.stats.target_forwards for run in alone)
    assert late - early >= 8, f"the chosen images no longer finish apart ({early} and {late} rounds)"
    for got, want in zip(batch, alone):
        assert got.tokens == want.tokens and got.stats.target_forwards == want.stats.target_forwards
        same_rounds(got.stats.rounds, want.stats.rounds, exact=False)
        assert got.stats.token_origin == want.stats.token_origin and got.stats.tau == want.stats.tau
    # the early image counts only the drafting of the rounds it took part in
    assert batch[0].stats.drafter_forwards < batch[1].stats.drafter_forwards
    others = generate_batch(shipped, [LATE[0], 3, EARLY[0], 9], rule, tree, None, [LATE[1], 5, EARLY[1], 7])
    same_rounds(others[2].stats.rounds, batch[0].stats.rounds, exact=True)
    same_rounds(others[0].stats.rounds, batch[1].stats.rounds, exact=True)


def test_per_image_cache_mask_is_the_definition():
    """A cache of 2 images x 2 guidance rows whose images stand at different lengths: each row's mask is the
    definition of ``test_steps.spec_mask`` at its own image's length."""
    from test_steps import spec_mask

    generator = torch.Generator().manual_seed(0)
    max_len, lengths = 16, [3, 7]
    cache = StaticKVCache(1, 4, 1, 4, max_len, torch.device("cpu"), torch.float32, images=2)
    cache.commit(None, torch.tensor(lengths))
    cache.valid = torch.rand(4, max_len, generator=generator) > 0.3
    pending = torch.rand(3, 5, generator=generator) > 0.4
    got = cache.attention_mask(pending, 3)
    for row in range(4):
        want = spec_mask(lengths[row % 2], 5, 3, pending, cache.valid[row:row + 1], max_len)
        assert torch.equal(got[row:row + 1], want), row


def test_per_image_cache_commits_each_images_own_path():
    """Pending keys at each row's own slots; a commit keeps each image's listed entries (its count of them) in
    order after its committed ones, in both of its guidance rows, and moves each row's start by its count."""
    cache = StaticKVCache(1, 4, 1, 1, 12, torch.device("cpu"), torch.float32, images=2)
    cache.commit(None, torch.tensor([2, 4]))
    pending = torch.arange(4 * 5, dtype=torch.float32).view(4, 1, 5, 1) + 100  # row r, pending slot j: 100+5r+j
    cache.write(0, pending, pending, 0)
    keep, count = torch.tensor([[0, 2, 3], [0, 4, 1]]), torch.tensor([3, 2])
    cache.commit(keep, count)
    assert cache.start.tolist() == [5, 6, 5, 6]
    for row in range(4):
        image, start = row % 2, [2, 4][row % 2]
        kept = cache.keys[0, row, 0, start:start + count[image], 0].tolist()
        assert kept == [100 + 5 * row + j for j in keep[image, :count[image]].tolist()], row


def test_the_memory_estimate_counts_the_caches_a_batch_allocates(shipped):
    """The estimate's KV caches are exactly the bytes of the caches a batch's workspace holds."""
    tree = parse_draft("tree:eagle25")
    rule = build_rule("eagle", {}, tree.depth, shipped.neighbours)
    ws = decode_module.Workspace(shipped.target, shipped.drafter, rule, tree, shipped.sampling, batch=6)
    held = sum(2 * cache.keys.numel() * cache.keys.element_size() for cache in (ws.target_cache, ws.source.cache))
    assert batch_memory(shipped.target, shipped.drafter, tree, shipped.sampling, 6)["caches"] == held


@pytest.mark.parametrize("conditions, seeds, message", [
    ([], [], "a batch needs at least one image"),
    ([0, 1, 2], [0, 1], "a batch needs one seed per image: got 3 conditions and 2 seeds"),
    ([0], [-1], "seed must be"),
    (0, [0], "a batch takes a list of conditions and a list of seeds"),
])
def test_bad_batches_are_one_line_errors(shipped, conditions, seeds, message):
    rule = build_rule("eagle", {}, 5, shipped.neighbours)
    with pytest.raises(ValueError, match=message) as error:
        coolsd.decode_images(shipped, conditions, rule, parse_draft("chain:5"), seeds=seeds)
    assert "\n" not in str(error.value)


def test_a_batch_that_does_not_fit_is_refused_before_anything_is_allocated(shipped, monkeypatch):
    """Far too many images for this machine: refused in one line naming the need and the largest batch that fits;
    with only 50 MB free, 64 images do not fit and the message says how many would."""
    rule = build_rule("eagle", {}, 5, shipped.neighbours)
    tree = parse_draft("chain:5")
    with pytest.raises(ValueError, match=r"a batch of 1000000 images needs about [\d.]+ [GT]B") as error:
        coolsd.decode_images(shipped, [0] * 10**6, rule, tree, seeds=[0] * 10**6)
    assert "\n" not in str(error.value)
    monkeypatch.setattr(decode_module, "available_memory", lambda device: 50_000_000)
    need = batch_memory(shipped.target, shipped.drafter, tree, shipped.sampling, 64)["total"]
    fits = int(64 * 50_000_000 / need)
    assert 0 < fits < 64
    with pytest.raises(ValueError, match=f"use a batch of at most {fits}$"):
        coolsd.decode_images(shipped, [0] * 64, rule, tree, seeds=list(range(64)))
    assert len(coolsd.decode_images(shipped, [0] * fits, rule, tree, seeds=list(range(fits)))) == fits


def test_decode_of_one_image_is_a_batch_of_one(three_classes):
    """``decode`` is ``decode_batch`` of one: the same tokens and statistics (a refactor guard)."""
    tree = DraftTree(tuple(SIBLINGS), "siblings")
    rule = build_rule("cool", {"delta": 2.0}, tree.depth, three_classes.neighbours)
    sampling = SamplingConfig(cfg_scale=2.0)
    alone = decode(three_classes.target, three_classes.drafter, 2, rule, tree, sampling, 5)
    (batch,) = decode_batch(three_classes.target, three_classes.drafter, [2], rule, tree, sampling, [5])
    assert alone.tokens == batch.tokens and alone.stats.tau == batch.stats.tau


@pytest.mark.parametrize("method, draft", [("cool", "chain:5"), ("eagle", "tree:eagle25")])
def test_a_round_in_cudas_float32_acceptance_is_recorded(shipped, monkeypatch, method, draft):
    """CUDA runs the acceptance in float32 (the CPU in float64; its uniforms differ, so the tokens do): its rounds
    are recorded all the same (a float32 record row once failed to go into the float64 records), and the records
    say what was generated: each round starts where the last one ended, and their emitted tokens are the image."""
    tree = parse_draft(draft)
    rule = build_rule(method, {"delta": 2.0} if method == "cool" else {}, tree.depth, shipped.neighbours)
    monkeypatch.setattr(decode_module, "acceptance_dtype", lambda device: torch.float32)
    runs = decode_batch(shipped.target, shipped.drafter, [1, 6], rule, tree, shipped.sampling, [3, 4],
                        runner=EagerPhases())  # a runner of its own: a pooled workspace keeps its dtype
    for run in runs:
        rounds = [r.to_dict() for r in run.stats.rounds]
        assert [r["start"] for r in rounds] == list(np.cumsum([0] + [len(r["emitted"]) for r in rounds[:-1]]))
        assert [token for r in rounds for token in r["emitted"]] == run.tokens
        probs = [t["accept_prob"] for r in rounds for t in r["tested"]]
        assert probs and all(0 <= p <= 1 for p in probs)
        assert any(t["accepted"] for r in rounds for t in r["tested"])
