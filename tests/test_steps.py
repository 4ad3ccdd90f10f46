"""The fixed-shape step path of :mod:`coolsd.models.steps` (the CUDA path's structure), checked on the CPU:

1. The static cache's mask is the definition (spec sections 1 and 7), built here independently.
2. Static steps give the shipped model's exact tokens (AR, Eagle-1, COOL-SD; chain and tree).
3. Graph safety: under the CPU stand-in for CUDA graphs (:class:`coolsd.core.graphs.CheckedPhases`) every
   phase of every round reads nothing back to the host and issues the same operations on the same shapes as
   its first run; the tokens are eager's and workspaces and caches are reused across images; a planted
   ``.item()`` and a planted shape change are caught.
4. Host reads: a round reads nothing; the loop reads the image's length once per batch of rounds it knew
   were needed (every host read, ``cpu``, ``tolist``, ``item``, ``bool`` ..., is counted).
5. Compiled phases: each phase of the round traces as one graph (the draws just before it, eagerly), nothing
   recompiles for a second image, and the tokens are eager's (chain, tree, Jacobi windows, a batch; inductor too).
6. Eagle-1 and COOL-SD keep their exact laws through static steps (the enumerated laws of test_laws).
The same properties on a GPU, with real CUDA graphs and bf16, are in test_cuda.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import pytest
import torch
from helpers import chi_square_pvalue, plant_host_read
from test_laws import CLASS_ID, LAW_CASES, expected_law
from test_laws import bundle as law_bundle  # noqa: F401  (a fixture)
from torch.overrides import TorchFunctionMode

from coolsd.core import decode as decode_module
from coolsd.core.sources import DrafterSource
from coolsd.core.decode import decode, decode_batch, generate
from coolsd.core.graphs import EAGER, CheckedPhases, CompiledPhases, EagerPhases, HostReadError
from coolsd.core.rules import AR, CoolSD, Eagle, build_rule
from coolsd.core.trees import DraftTree, parse_draft
from coolsd.models.bundle import load_bundle, random_bundle
from coolsd.models.eagle import Eagle3Drafter
from coolsd.models.gpt import KVCache
from coolsd.models.steps import StaticKVCache, Steps, unwrapped, with_steps

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


def graph_like(bundle):
    """Static steps whose target and drafter share one :class:`CheckedPhases` runner, the CPU stand-in for
    CUDA graphs (as ``with_steps`` shares its graph runner)."""
    runner = CheckedPhases()
    target, drafter = (Steps(unwrapped(model), runner=runner) for model in (bundle.target, bundle.drafter))
    return replace(bundle, target=target, drafter=drafter, steps="graphs"), runner


def test_eager_workspaces_are_never_shared_at_once_and_are_reused_by_any_thread():
    """Two generations at once get two workspaces; later generations on fresh threads reuse them, so the
    workspaces built are the most ever running at once (not the threads that ran); at most IDLE of a kind wait,
    and only the KEPT most recent kinds."""
    import threading
    runner, built = EagerPhases(), []

    def build():
        built.append(object())
        return built[-1]

    def generate_on_a_thread(key, barrier=None):
        def work():
            with runner.generation():
                got.append(runner.workspace(key, build))
                if barrier is not None:
                    barrier.wait(timeout=10)
        thread = threading.Thread(target=work)
        thread.start()
        return thread

    got, barrier = [], threading.Barrier(2)
    for thread in [generate_on_a_thread(("a",), barrier) for _ in range(2)]:
        thread.join()
    assert len(built) == 2 and got[0] is not got[1]
    for _ in range(6):
        generate_on_a_thread(("a",)).join()
    assert len(built) == 2 and set(map(id, got)) == set(map(id, built))
    assert len(runner.idle[("a",)]) == runner.IDLE == 2
    for kind in range(runner.KEPT):
        generate_on_a_thread(("kind", kind)).join()
    assert ("a",) not in runner.idle and len(runner.idle) == runner.KEPT
    generate_on_a_thread(("a",)).join()
    assert len(built) == 3 + runner.KEPT  # the evicted kind was built again


@pytest.mark.parametrize("method, draft", CASES)
def test_checked_phases_give_the_eager_tokens_and_reuse_their_workspaces(shipped, method, draft):
    """Every phase of every round runs with no host read and the same operations on the same shapes as its
    first run (what a CUDA graph needs); the tokens are eager's; a second image reuses the first's workspace
    and its caches; a round is one phase run per phase (two, or one for AR)."""
    graphs, runner = graph_like(shipped)
    rounds = 0
    for seed in range(2):
        want = generate(shipped, seed, RULES[method], parse_draft(draft), seed=seed)
        got = generate(graphs, seed, RULES[method], parse_draft(draft), seed=seed)
        assert got.tokens == want.tokens and got.stats.tau == want.stats.tau
        emitted = [len(r.emitted) for r in got.stats.rounds[1:]]
        rounds += len(emitted) + schedule(emitted, shipped.config.image_tokens, got.stats.tree_depth)[1]
    assert len(runner.workspaces) == 1  # both images ran on the same buffers
    assert len(graphs.target.caches) == 1 and (method == "ar" or len(graphs.drafter.caches) == 1)
    assert runner.calls == rounds  # one run per phase of every round


def test_checked_phases_catch_a_host_read_and_a_shape_that_moves(shipped, monkeypatch):
    """Planted faults: an ``.item()`` inside the verification phase; and a drafting phase whose operations
    change between rounds (a graph replays the first round's)."""
    graphs, _ = graph_like(shipped)
    original = decode_module.walk
    plant_host_read(monkeypatch)
    with pytest.raises(HostReadError, match="item"):
        generate(graphs, 4, Eagle(), parse_draft("chain:5"), seed=1)
    monkeypatch.setattr(decode_module, "walk", original)

    graphs, _ = graph_like(shipped)
    drafting, calls = DrafterSource.draft, []

    def branching(self, ws, levels):  # a Python-side branch: an extra operation every other round
        calls.append(1)
        drafting(self, ws, levels)
        if len(calls) % 2:
            ws.q.sum()

    monkeypatch.setattr(DrafterSource, "draft", branching)
    with pytest.raises(RuntimeError, match="changed between rounds"):
        generate(graphs, 4, Eagle(), parse_draft("chain:5"), seed=1)


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


def schedule(emitted: list[int], images: int, depth: int) -> tuple[int, int]:
    """What the loop must do, from the tokens each round emitted, computed here: how many times it looks at the
    image's length (it enqueues every round it knows is needed, at most depth + 1 tokens each, then looks), and
    how many rounds draft (not those that start where the image surely has one token left: every round emits
    at least one, so the loop knows a lower bound)."""
    known, rounds, looks, drafting = 1, iter(emitted), 0, 0
    while known < images:
        batch = -(-(images - known) // (depth + 1))
        drafting += sum(depth > 0 and images - at_least - 1 > 0 for at_least in range(known, known + batch))
        for _ in range(batch):
            known += next(rounds)
        looks += 1
    return looks, drafting


def batches_needed(emitted: list[int], images: int, depth: int) -> int:
    return schedule(emitted, images, depth)[0]


@pytest.mark.parametrize("steps", ["static", "eager"])
@pytest.mark.parametrize("method, draft", [("ar", "chain:5"), ("eagle", "chain:5"), ("cool", "tree:eagle25")])
def test_rounds_read_nothing_and_the_loop_reads_once_per_batch(shipped, monkeypatch, steps, method, draft):
    """With static steps no phase of any round reads the device (eager steps read the count their cache
    commits, free on a CPU: one per phase); between rounds the loop reads the image's length once per batch of
    rounds it knew were needed, and at the end the records and the tokens once each."""
    inside = []
    run = EagerPhases.run

    def counted_phase(self, ws, name, phase):
        with HostReads() as reads:
            run(self, ws, name, phase)
        inside.append(reads.reads)

    monkeypatch.setattr(EagerPhases, "run", counted_phase)
    with HostReads() as everything:
        result = generate(shipped.with_steps(steps), 4, RULES[method], parse_draft(draft), seed=1)
    rounds = result.stats.rounds[1:]
    looks, drafting = schedule([len(r.emitted) for r in rounds], shipped.config.image_tokens, result.stats.tree_depth)
    assert [len(reads) for reads in inside] == [0 if steps == "static" else 1] * len(inside), inside[:4]
    assert len(inside) == len(rounds) + drafting and (method == "ar") == (drafting == 0)
    assert sum(map(len, inside)) == (0 if steps == "static" else len(inside))
    between = list(everything.reads)
    for name in (name for reads in inside for name in reads):
        between.remove(name)
    assert sorted(between) == sorted(["__int__"] * looks + ["cpu", "tolist"]), between


class GraphCount:
    """A ``torch.compile`` backend that runs each traced graph as traced and keeps it: a graph break, or a
    recompilation, shows as one graph more."""

    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, graph_module, inputs):
        self.graphs.append(graph_module)
        return graph_module.forward


SMALL_TREE = DraftTree(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)), "tree:small")
COMPILED_CASES = [("ar", "chain:3", 1), ("eagle", "chain:3", 1), ("cool", SMALL_TREE, 1),
                  ("eagle", "jacobi:4:coupled", 1), ("eagle", "jacobi:4:gumbel", 1), ("uniform", "chain:3", 2),
                  ("eagle3", "chain:3", 1), ("eagle3-cool", SMALL_TREE, 2)]


@pytest.mark.parametrize("method, draft, batch", COMPILED_CASES)
def test_compiled_phases_are_one_region_each_and_give_eager_tokens(method, draft, batch):
    """Each phase of the round traces as one graph (the draws run eagerly just before, outside it): the first
    image of a kind traces exactly one graph per phase it ran, a second image of the same kind traces none
    (nothing recompiles), and the tokens are eager's. Traced graphs run as traced here (no inductor), so this is
    the tracing alone; inductor's arithmetic is checked below."""
    torch.set_num_threads(1)
    model = random_bundle("tiny", device="cpu")
    if method.startswith("eagle3"):  # an EAGLE-3 head: the verification's target forward also returns its taps
        method = method.removeprefix("eagle3").removeprefix("-") or "eagle"
        model = replace(model, drafter=Eagle3Drafter(model.config).share_embedding(model.target).eval())
    counted = GraphCount()
    target, drafter = with_steps(model.target, model.drafter, "static")
    runner = CompiledPhases(backend=counted)
    rule = build_rule(method, {"delta": 2.0} if method in ("cool", "uniform") else {}, 3)
    tree = parse_draft(draft)
    conditions, seeds = [3, 1][:batch], [7, 8][:batch]
    first = decode_batch(target, drafter, conditions, rule, tree, model.sampling, seeds, runner=runner)
    (ws,) = runner.workspaces.values()

    def compiled() -> set:  # the phases run more than once (the first run of each is an eager warm-up)
        return {name for name, function in ws.captured_phases.items() if function is not None}
    assert "verification" in compiled() and len(counted.graphs) == len(compiled()), sorted(ws.captured_phases)
    seen, phases = len(counted.graphs), compiled()
    second = decode_batch(target, drafter, conditions, rule, tree, model.sampling, [s + 10 for s in seeds],
                          runner=runner)
    # only a phase the first image ran at most once (a drafting depth near its end) traces anew
    assert len(counted.graphs) == seen + len(compiled() - phases)
    for got, want_seeds in ((first, seeds), (second, [s + 10 for s in seeds])):
        want = decode_batch(model.target, model.drafter, conditions, rule, tree, model.sampling, want_seeds)
        assert [g.tokens for g in got] == [w.tokens for w in want]


def test_compiled_steps_match_eager_with_inductor():
    """The compiled mode as shipped (inductor's kernels): a tiny random model with guidance, a chain and a tree,
    Eagle-1 and COOL-SD: eager's tokens, and the target rows within float32 rounding (inductor may fuse a
    softmax differently; the acceptance arithmetic is float64 either way)."""
    torch.set_num_threads(1)
    model = random_bundle("tiny", device="cpu")
    compiled = model.with_steps("compiled")
    assert isinstance(compiled.runner, CompiledPhases)
    for seed, (rule, draft) in enumerate([(Eagle(), "chain:3"), (CoolSD(delta=2.0, depth=3), SMALL_TREE)]):
        want = generate(model, seed % 10, rule, parse_draft(draft), seed=seed, capture=True)
        got = generate(compiled, seed % 10, rule, parse_draft(draft), seed=seed, capture=True)
        assert got.tokens == want.tokens
        for a, b in zip(got.stats.captured, want.stats.captured):
            np.testing.assert_allclose(a["p"], b["p"], atol=1e-5)


def check_law(laws, name: str, models, steps: str, runner=None, samples: int = 1500) -> None:
    """Images decoded with ``models`` (the bundle ``laws``, perhaps on another device) run as ``steps`` (their
    phases by ``runner``, default the steps' own), against the enumerated law of test_laws' case ``name``:
    chi-square over ``samples`` images, and drafts were accepted."""
    case = LAW_CASES[name]
    law, _ = expected_law(laws, case)
    tree = DraftTree(tuple(case.paths), name)
    rule = build_rule(case.method, case.params, tree.depth, laws.neighbours)
    target, drafter = with_steps(models.target, models.drafter, steps)
    runner = runner or getattr(target, "runner", EAGER)
    runs = [decode(target, drafter, CLASS_ID, rule, tree, case.sampling, seed, runner=runner)
            for seed in range(samples)]
    assert chi_square_pvalue([tuple(run.tokens) for run in runs], law) > 1e-4
    assert np.mean([run.stats.tau for run in runs]) > 1.1


@pytest.mark.parametrize("name", ["eagle-tree", "cool-exp-auto"])
def test_static_steps_follow_the_spec_law(law_bundle, name):  # noqa: F811
    """Static steps give eager's tokens (tested above), so fewer images than test_laws' suffice to show that they
    keep the law."""
    check_law(law_bundle, name, law_bundle, "static", samples=600)


def test_compiled_phases_follow_the_spec_law(law_bundle):  # noqa: F811
    """Compiled phases (inductor) keep COOL-SD's exact law on a tree."""
    check_law(law_bundle, "cool-exp-auto", law_bundle, "compiled", samples=600)


@pytest.mark.parametrize("name", ["lantern-heuristic", "cool-hand-mu"])
def test_checked_phases_follow_the_spec_law(law_bundle, name):  # noqa: F811
    """Through the CPU stand-in for CUDA graphs (every round's phases checked), trees with siblings. The stand-in
    runs the eager phases under a recorder (tokens equal to eager's, tested above), so fewer images than
    test_laws' suffice to show that replaying them keeps the law; the recorder makes each image slow."""
    check_law(law_bundle, name, law_bundle, "static", CheckedPhases(), samples=600)


def test_default_steps_are_the_measured_fastest_per_device(monkeypatch, tmp_path):
    """CUDA graphs on CUDA; on a CPU compiled phases for the benchmark where a C++ compiler is found, else
    eager (the app, one-off generations); $COOLSD_STEPS overrides and is checked; compilations are kept in the
    user's cache unless $TORCHINDUCTOR_CACHE_DIR says where."""
    from coolsd.models import steps as steps_module
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("COOLSD_STEPS", raising=False)
    monkeypatch.setattr(steps_module, "cpp_compiler", lambda: "/usr/bin/c++")
    assert steps_module.default_mode(cuda) == steps_module.default_mode(cuda, many_images=True) == "graphs"
    assert steps_module.default_mode(cpu) == "eager" and steps_module.default_mode(cpu, many_images=True) == "compiled"
    monkeypatch.setattr(steps_module, "cpp_compiler", lambda: None)
    assert steps_module.default_mode(cpu, many_images=True) == "eager"
    monkeypatch.setenv("COOLSD_STEPS", "static")
    assert steps_module.default_mode(cpu) == steps_module.default_mode(cuda, many_images=True) == "static"
    for wrong in ("graphs", "fast"):
        monkeypatch.setenv("COOLSD_STEPS", wrong)
        with pytest.raises(ValueError, match=r"^\$COOLSD_STEPS must be one of eager, static, graphs, compiled"):
            steps_module.default_mode(cpu)
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert steps_module.cpp_compiler() is None
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    digest = steps_module.source_digest()
    assert steps_module.keep_compilations() == tmp_path / ".cache" / "coolsd" / "torchinductor" / digest
    assert len(digest) == 12 and int(digest, 16) >= 0
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert steps_module.keep_compilations() == tmp_path / "mine"
