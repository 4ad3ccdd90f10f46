"""The fixed-shape step path of :mod:`coolsd.models.steps` (the CUDA path's structure), checked on the CPU:

1. The static cache's mask is the definition (spec sections 1 and 7), built here independently.
2. Static steps give the shipped model's exact tokens (AR, Eagle-1, COOL-SD; chain and tree).
3. Replay: a CPU stand-in for CUDA-graph capture that, like a graph, runs on fixed input buffers only; the
   engine then still gives eager's tokens, every cache is reused across images, a second image captures no
   new shape, and a stand-in that loses one input (a planted bug) is caught.
4. Each round reads the device once: every host read (``cpu``, ``tolist``, ``item``, ``bool`` ...) inside
   ``decode_round`` is counted.
5. ``torch.compile`` traces the whole step without a graph break (``fullgraph``) and matches eager.
6. Eagle-1 and COOL-SD keep their exact laws through static steps (the enumerated laws of test_laws).
The same properties on a GPU, with real CUDA graphs and bf16, are in test_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import chi_square_pvalue
from test_laws import CLASS_ID, LAW_CASES, expected_law
from test_laws import bundle as law_bundle  # noqa: F401  (a fixture)
from torch.overrides import TorchFunctionMode

from coolsd.core import decode as decode_module
from coolsd.core.decode import decode, generate
from coolsd.core.rules import AR, CoolSD, Eagle, build_rule
from coolsd.core.trees import DraftTree, parse_draft
from coolsd.models import steps as steps_module
from coolsd.models.bundle import load_bundle, random_bundle
from coolsd.models.gpt import KVCache
from coolsd.models.steps import StaticKVCache, Steps, with_steps

RULES = {"ar": AR(), "eagle": Eagle(), "cool": CoolSD(delta=2.0, depth=5)}


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    return load_bundle(device="cpu")


def spec_mask(length: int, width: int, count: int, pending: torch.Tensor, valid: torch.Tensor, max_len: int):
    """Query i (slot ``length + width - count + i``) sees key j iff j is committed, or in the pending area where
    ``pending`` allows it, and a valid key; and always its own slot. Loops, from the definition."""
    rows = valid.shape[0]
    mask = torch.zeros(rows, 1, count, max_len, dtype=torch.bool)
    for r in range(rows):
        for i in range(count):
            for j in range(max_len):
                seen = j < length or (length <= j < length + width and bool(pending[i, j - length]))
                mask[r, 0, i, j] = (seen and bool(valid[r, j])) or j == length + width - count + i
    return mask


@pytest.mark.parametrize("length, width, count", [(0, 1, 1), (5, 1, 1), (5, 4, 4), (7, 6, 3)])
def test_static_mask_is_the_definition(length, width, count):
    generator = torch.Generator().manual_seed(length + width)
    max_len = 16
    cache = StaticKVCache(1, 2, 1, 4, max_len, torch.device("cpu"), torch.float32)
    cache.commit(list(range(length)))
    cache.valid = torch.rand(2, max_len, generator=generator) > 0.3
    pending = torch.rand(count, width, generator=generator) > 0.4
    got = cache.attention_mask(pending if width > 1 else None, count)
    want = spec_mask(length, width, count, pending if width > 1 else torch.ones(1, 1, dtype=torch.bool),
                     cache.valid, max_len)
    assert torch.equal(got.expand_as(want), want)


@pytest.mark.parametrize("offset", [0, 3])
def test_a_single_position_without_a_pending_mask_sees_the_whole_pending_area(offset):
    """No pending mask (a chain level's drafter forward, written at ``offset``) means an all-True one over
    ``offset + 1`` pending slots, in both caches, padding still hidden."""
    generator = torch.Generator().manual_seed(offset)
    for cache in (KVCache(1, 2, 1, 4, 16, torch.device("cpu"), torch.float32),
                  StaticKVCache(1, 2, 1, 4, 16, torch.device("cpu"), torch.float32)):
        cache.commit(list(range(5)))
        cache.valid = torch.rand(2, 16, generator=generator) > 0.3
        want = cache.attention_mask(torch.ones(1, offset + 1, dtype=torch.bool), 1)
        assert torch.equal(cache.attention_mask(None, 1, offset), want)


CASES = [("ar", "chain:5"), ("eagle", "chain:5"), ("eagle", "tree:eagle25"), ("cool", "tree:eagle25")]


@pytest.mark.parametrize("method, draft", CASES)
def test_static_steps_give_the_eager_tokens(shipped, method, draft):
    static = shipped.with_steps("static")
    for seed in range(3):
        want = generate(shipped, seed, RULES[method], parse_draft(draft), seed=seed)
        got = generate(static, seed, RULES[method], parse_draft(draft), seed=seed)
        assert got.tokens == want.tokens
        assert got.stats.tau == want.stats.tau


class ReplayOnCPU:
    """Stands in for :class:`coolsd.models.steps.CapturedStep` on a CPU, as faithful to a replayed graph as
    Python allows: each call runs the step on its own input buffers only, and with every cache's host-side
    ``length`` frozen at its capture-time value (a graph replays what the host computed once). ``lose`` (a
    planted bug) leaves one input's buffer stale."""

    made: list = []
    lose: int | None = None

    def __init__(self, forward, args: tuple) -> None:
        self.forward = forward
        self.inputs = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        self.frozen = [(a, a.length) for a in args if isinstance(a, StaticKVCache)]
        ReplayOnCPU.made.append(self)

    def __call__(self, args: tuple) -> torch.Tensor:
        for index, (buffer, value) in enumerate(zip(self.inputs, args)):
            if isinstance(buffer, torch.Tensor) and index != ReplayOnCPU.lose:
                buffer.copy_(value)
        live = [(cache, cache.length) for cache, _ in self.frozen]
        for cache, length in self.frozen:
            cache.length = length
        try:
            return self.forward(*self.inputs).clone()
        finally:
            for cache, length in live:
                cache.length = length


def replayed(bundle):
    """The bundle with Steps that capture (the stand-in replays) on the CPU."""
    target, drafter = Steps(bundle.target, capture=True), Steps(bundle.drafter, capture=True)
    from dataclasses import replace
    return replace(bundle, target=target, drafter=drafter, steps="graphs")


def test_replayed_steps_give_the_eager_tokens_and_reuse_everything(shipped, monkeypatch):
    monkeypatch.setattr(steps_module, "CapturedStep", ReplayOnCPU)
    monkeypatch.setattr(ReplayOnCPU, "made", [])
    graphs = replayed(shipped)
    tree = parse_draft("tree:eagle25")
    for seed in range(2):
        want = generate(shipped, seed, Eagle(), tree, seed=seed)
        got = generate(graphs, seed, Eagle(), tree, seed=seed)
        assert got.tokens == want.tokens
        if seed == 0:
            captured = len(ReplayOnCPU.made)
            caches = dict(graphs.target.caches), dict(graphs.drafter.caches)
    assert captured > 0
    assert (dict(graphs.target.caches), dict(graphs.drafter.caches)) == caches  # same cache objects, reused
    # the same image again captures nothing new: every call shape of it was seen
    before = len(ReplayOnCPU.made)
    again = generate(graphs, 0, Eagle(), tree, seed=0)
    assert len(ReplayOnCPU.made) == before and again.tokens == generate(shipped, 0, Eagle(), tree, seed=0).tokens
    # a replay that leaves the positions' buffer stale (argument 1 of the target's forward) is caught
    monkeypatch.setattr(ReplayOnCPU, "lose", 1)
    stale = replayed(shipped)
    assert generate(stale, 0, Eagle(), tree, seed=0).tokens != again.tokens


class HostReads(TorchFunctionMode):
    """Counts every call that reads a tensor's value into Python (a device-to-host copy on a GPU), and every
    ``.cpu()``; a ``.to`` counts when it moves a tensor off a GPU (moves onto one, such as an index table's
    first use, are host-to-device)."""

    READS = {"cpu", "tolist", "item", "__bool__", "__int__", "__float__", "__index__", "__array__"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        off_gpu = name == "to" and args[0].device.type != "cpu" and \
            "cpu" in map(str, list(args[1:]) + list((kwargs or {}).values()))
        if name in self.READS or off_gpu:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("steps", ["eager", "static"])
@pytest.mark.parametrize("method, draft", [("ar", "chain:5"), ("eagle", "chain:5"), ("cool", "tree:eagle25")])
def test_each_round_reads_the_device_once(shipped, monkeypatch, steps, method, draft):
    per_round = []
    original = decode_module.decode_round

    def counted(run, state):
        with HostReads() as reads:
            out = original(run, state)
        per_round.append(reads.reads)
        return out

    monkeypatch.setattr(decode_module, "decode_round", counted)
    generate(shipped.with_steps(steps), 4, RULES[method], parse_draft(draft), seed=1)
    assert per_round and all(reads == ["cpu"] for reads in per_round), per_round[:3]


def test_host_read_counter_sees_a_second_read(shipped, monkeypatch):
    """Negative control: a round that also reads the drafted tokens with tolist is counted."""
    original = decode_module.to_host

    def reads_twice(p, q, tokens, valid, tree):
        tokens.tolist()
        return original(p, q, tokens, valid, tree)

    monkeypatch.setattr(decode_module, "to_host", reads_twice)
    with HostReads() as reads:
        generate(shipped, 4, Eagle(), parse_draft("chain:5"), seed=1)
    assert reads.reads.count("tolist") >= 10


def test_compiled_steps_trace_whole_and_match_eager():
    """torch.compile with ``fullgraph`` fails on any graph break; tiny random model, guidance on, a tree."""
    torch.set_num_threads(1)
    model = random_bundle("tiny", device="cpu")
    compiled = model.with_steps("compiled")
    tree = parse_draft("chain:3")
    for seed in range(2):
        want = generate(model, seed % 10, Eagle(), tree, seed=seed, capture=True)
        got = generate(compiled, seed % 10, Eagle(), tree, seed=seed, capture=True)
        assert got.tokens == want.tokens
        for a, b in zip(got.stats.captured, want.stats.captured):
            np.testing.assert_allclose(a["p"], b["p"], atol=1e-5)


def check_law(laws, name: str, models, steps: str) -> None:
    """Images decoded with ``models`` (the bundle ``laws``, perhaps on another device) run as ``steps``, against
    the enumerated law of test_laws' case ``name``: chi-square, and drafts were accepted."""
    case = LAW_CASES[name]
    law, _ = expected_law(laws, case)
    tree = DraftTree(tuple(case.paths), name)
    rule = build_rule(case.method, case.params, tree.depth, laws.neighbours)
    target, drafter = with_steps(models.target, models.drafter, steps)
    runs = [decode(target, drafter, CLASS_ID, rule, tree, case.sampling, seed) for seed in range(1500)]
    assert chi_square_pvalue([tuple(run.tokens) for run in runs], law) > 1e-4
    assert np.mean([run.stats.tau for run in runs]) > 1.1


@pytest.mark.parametrize("name", ["eagle-tree", "cool-exp-auto"])
def test_static_steps_follow_the_spec_law(law_bundle, name):  # noqa: F811
    check_law(law_bundle, name, law_bundle, "static")
