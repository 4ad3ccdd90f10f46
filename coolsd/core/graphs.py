"""How a round's phases run: eagerly, compiled, or captured once as CUDA graphs and replayed.

A phase (``coolsd.core.decode.draft_phase``, ``verify_phase``) reads and writes only the fixed buffers of its
workspace and never reads a value back to the host, so the same kernels run every round on the same memory:
exactly what a CUDA graph replays, and what ``torch.compile`` turns into one region of fixed shapes
(:class:`CompiledPhases`, the CPU's counterpart). :class:`CheckedPhases` proves that on a CPU (it runs each phase
under a recorder and refuses a host read or an operation sequence that changes between rounds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch.overrides import TorchFunctionMode

Phase = Callable[[Any], None]


@dataclass(frozen=True)
class DrawnPhase:
    """A phase that first draws its random numbers from the images' generators (``draw``), then runs ``body``
    on them. A graph captures both; a compiling runner compiles ``body`` alone and runs ``draw`` eagerly before
    it (dynamo cannot trace a draw from an explicit generator, and a graph break inside a phase would leave the
    rest of it uncompiled)."""

    draw: Phase
    body: Phase

    def __call__(self, workspace: Any) -> None:
        self.draw(workspace)
        self.body(workspace)


class PhaseRunner(Protocol):
    """Runs a workspace's phases. ``workspace(key, build)`` gives the buffers of one kind of generation (kept,
    for a runner whose captured phases hold their memory); ``generation()`` is held for a whole image."""

    def workspace(self, key: tuple, build: Callable[[], Any]) -> Any: ...

    def generation(self): ...

    def run(self, workspace: Any, name: str, phase: Phase) -> None: ...


class EagerPhases:
    """Each phase as plain Python. Idle workspaces are pooled by kind (the ``KEPT`` most recent kinds, at most
    ``IDLE`` of each): a generation takes one for its image and gives it back when it ends, so concurrent
    generations (the app's two images at once on a CPU) share nothing, and memory grows with the generations
    running at once, not with the threads that ever ran one."""

    KEPT, IDLE = 8, 2

    def __init__(self) -> None:
        self.idle: OrderedDict[tuple, list] = OrderedDict()
        self.lock = threading.Lock()
        self.local = threading.local()

    def workspace(self, key: tuple, build: Callable[[], Any]) -> Any:
        with self.lock:
            pool = self.idle.get(key)
            workspace = pool.pop() if pool else None
        workspace = build() if workspace is None else workspace
        taken = getattr(self.local, "taken", None)
        if taken is not None:  # inside generation(): given back when it ends
            taken.append((key, workspace))
        return workspace

    @contextmanager
    def generation(self):
        outer = getattr(self.local, "taken", None)
        self.local.taken = []
        try:
            yield
        finally:
            taken, self.local.taken = self.local.taken, outer
            with self.lock:
                for key, workspace in taken:
                    pool = self.idle.setdefault(key, [])
                    self.idle.move_to_end(key)
                    if len(pool) < self.IDLE:
                        pool.append(workspace)
                while len(self.idle) > self.KEPT:
                    self.idle.popitem(last=False)

    def run(self, workspace: Any, name: str, phase: Phase) -> None:
        phase(workspace)


EAGER = EagerPhases()


class NullTimer:
    """Times nothing: a phase's own timers while it is being warmed up, captured or compiled (a plain
    ``nullcontext``, which ``torch.compile`` traces through)."""

    seconds: dict = {}

    def phase(self, name: str) -> nullcontext:
        return nullcontext()


# a whole phase's timer, by phase name (the profile also runs a verification's halves as phases)
TIMED = {"drafting": "drafting", "verification": "target_forward", "score": "target_forward",
         "acceptance": "acceptance"}


def timed_as(name: str) -> str:
    """The timer a phase run as one piece counts under (``drafting:3`` is drafting)."""
    return TIMED.get(name.split(":")[0], name)


class KeptPhases:
    """What a capturing runner shares: its workspaces, kept by key (the most recent ``KEPT``; a workspace's
    captured phases live on it and go with it), and one generation at a time (they share their models' static
    caches)."""

    KEPT = 8

    def __init__(self) -> None:
        self.workspaces: OrderedDict[tuple, Any] = OrderedDict()
        self.lock = threading.RLock()

    def workspace(self, key: tuple, build: Callable[[], Any]) -> Any:
        if key in self.workspaces:
            self.workspaces.move_to_end(key)
        else:
            self.workspaces[key] = build()
            self.workspaces[key].captured_phases = {}
            while len(self.workspaces) > self.KEPT:
                self.workspaces.popitem(last=False)
        return self.workspaces[key]

    def generation(self):
        return self.lock


class CudaGraphPhases(KeptPhases):
    """Each phase of a workspace captured as a CUDA graph on its first call and replayed after: a speculative
    round is two replays (drafting, verification; near the image's end, drafting at each shallower depth is
    its own graph), an AR step one. The first call is the round itself, run on a
    side stream (allocations, cuBLAS workspaces, compilation), then the phase is captured without running.
    Replays are timed as a whole: ``drafting``, and ``target_forward`` for the verification with its walk.
    ``compiled``: each phase is ``torch.compile``-d before it is captured (its kernels fused inside the graph),
    after a first eager call (as :class:`CompiledPhases` does)."""

    def __init__(self, compiled: bool = False) -> None:
        super().__init__()
        self.compiled = compiled
        if compiled:
            allow_recompiles()

    def run(self, workspace: Any, name: str, phase: Phase) -> None:
        graphs = workspace.captured_phases
        if graphs.get(name) is not None:
            with workspace.timer.phase(timed_as(name)):
                graphs[name].replay()
            return
        if self.compiled and name not in graphs:  # an eager round first: lazy tables are made then, not traced
            graphs[name] = None
            phase(workspace)
            return
        phase = compiled_phase(phase) if self.compiled else phase
        timer, workspace.timer = workspace.timer, NullTimer()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                phase(workspace)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            for generator in workspace.generators:  # one per image
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph):
                phase(workspace)
        finally:
            workspace.timer = timer
        graphs[name] = graph


def allow_recompiles() -> None:
    """Let dynamo keep a compilation per phase shape: every drafting depth, rule and draft tree is one (its
    default limit of 8 per function would fall back to eager, silently, after the eighth)."""
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), 1024))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4096)


def compiled_phase(phase: Phase, backend: Any = "inductor") -> Phase:
    """A phase as one ``torch.compile`` region of fixed shapes (the workspace's buffers never change shape); a
    :class:`DrawnPhase`'s draws stay outside it, run eagerly first."""
    if isinstance(phase, DrawnPhase):
        return DrawnPhase(phase.draw, torch.compile(phase.body, dynamic=False, backend=backend))
    return torch.compile(phase, dynamic=False, backend=backend)


class CompiledPhases(KeptPhases):
    """The CPU counterpart of :class:`CudaGraphPhases`: each phase of a workspace is one ``torch.compile`` region
    (the forward, the walk, the commit, the record and the source's refresh fused into a few kernels, no Python
    between them). Workspaces are kept as the graph runner
    keeps them, so a phase compiles once per kind of generation; compilations are cached on disk by inductor
    (:func:`coolsd.models.steps.keep_compilations`). As with a graph, a phase's first call is an eager warm-up
    (lazy tables, such as rotary angles, are made then and are not traced as changing state), compiled from the
    second on. A phase is timed as a whole, as a replayed graph is."""

    def __init__(self, backend: Any = "inductor") -> None:
        super().__init__()
        self.backend = backend  # inductor; a test may count the traced graphs instead
        allow_recompiles()

    def run(self, workspace: Any, name: str, phase: Phase) -> None:
        compiled = workspace.captured_phases
        if name not in compiled:  # the warm-up
            compiled[name] = None
            phase(workspace)
            return
        if compiled[name] is None:
            compiled[name] = compiled_phase(phase, self.backend)
        timer, workspace.timer = workspace.timer, NullTimer()
        try:
            with timer.phase(timed_as(name)):
                compiled[name](workspace)
        finally:
            workspace.timer = timer


class HostReadError(RuntimeError):
    """A phase read a device value into Python: a CUDA graph could not hold it."""


class OperationLog(TorchFunctionMode):
    """Records every torch operation (name and argument shapes) and refuses any that reads a tensor's value
    into Python (on a GPU: a device-to-host copy, which a graph cannot contain)."""

    READS = {"cpu", "tolist", "item", "__bool__", "__int__", "__float__", "__index__", "__array__", "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.operations: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.READS:
            raise HostReadError(f"a phase read a device value into Python ({name})")
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.operations.append((name, shapes))
        return func(*args, **(kwargs or {}))


class CheckedPhases(KeptPhases):
    """A CPU stand-in for :class:`CudaGraphPhases`: workspaces are kept as the graph runner keeps them, and each
    phase runs eagerly under an :class:`OperationLog`. As there, the first call of a phase is a warm-up (lazy
    tables are made then) and the second is the one captured: it fixes the phase's operations, and a later call
    that issues a different sequence (another shape, a branch on a value) raises, as replaying it would go wrong
    on a GPU; a host read raises in any call. ``calls`` counts phase runs (the replays a GPU would do)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def run(self, workspace: Any, name: str, phase: Phase) -> None:
        with OperationLog() as log:
            phase(workspace)
        self.calls += 1
        seen = workspace.captured_phases
        if name not in seen:
            seen[name] = None  # warmed up
            return
        first = seen[name] = seen[name] or log.operations
        if log.operations != first:
            at = next(i for i, (a, b) in enumerate(zip(log.operations + [None], first + [None])) if a != b)
            raise RuntimeError(f"phase {name!r} changed between rounds at operation {at}: "
                               f"{first[at:at + 1]} then {log.operations[at:at + 1]}")
