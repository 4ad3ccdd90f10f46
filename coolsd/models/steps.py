"""Fixed-shape model steps for CUDA: a static KV cache and CUDA-graph replay, behind the same interface.

On a GPU a batch-1 step of a large target is bound by kernel launches and weight reads, so a round only pays
if its steps are cheap to launch. :class:`coolsd.models.cache.StaticKVCache` attends over its whole buffer with a
mask built on the device and commits on the device, so every round runs the same kernels on the same buffers,
with nothing read back to the host. :class:`Steps` wraps a target or a drafter, keeps its caches between images,
and carries the runner of the round's phases: captured as CUDA graphs (:class:`coolsd.core.graphs.CudaGraphPhases`)
or, in the compiled mode, each phase one ``torch.compile`` region (on a CPU
:class:`coolsd.core.graphs.CompiledPhases`; on CUDA compiled, then captured). The decoding loop does not change:
it sees a Target or Drafter (:mod:`coolsd.core.interface`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..core.graphs import EAGER, CompiledPhases, CudaGraphPhases, PhaseRunner
from .cache import StaticKVCache

MODES = ("eager", "static", "graphs", "compiled")
MODE_HELP = ("model steps: eager (a cache sliced to its length, the tokens the tests pin; the app's CPU mode), "
             "static (a fixed-size cache attended with a mask), graphs (static, each phase of the round captured "
             "once as a CUDA graph and replayed; the CUDA default), compiled (static, each phase of the round one "
             "torch.compile region, captured as CUDA graphs on CUDA; the benchmark's CPU default where a C++ "
             "compiler is found). $COOLSD_STEPS sets the default")


class Steps:
    """A target or drafter run with static caches, kept between images (a captured graph or a compiled phase
    holds their buffers). Everything else is the wrapped model's (attribute access falls
    through). ``runner`` runs the decoding round's phases (CUDA graphs, for the graphs and compiled modes)."""

    def __init__(self, model: nn.Module, runner: PhaseRunner = EAGER) -> None:
        self.model, self.runner = model, runner
        self.caches: dict[tuple[int, int, int], StaticKVCache] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model"], name)

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> StaticKVCache:
        """The cache of this shape from earlier images, emptied (so captured graphs stay valid)."""
        key = (rows, max_len, images)
        if key not in self.caches:
            plain = self.model.new_cache(rows, 1)
            n_layer, _, n_head, _, head_dim = plain.keys.shape
            self.caches[key] = StaticKVCache(n_layer, rows, n_head, head_dim, max_len, plain.keys.device,
                                             plain.keys.dtype, images)
        return self.caches[key].reset()

    def __call__(self, *args, **options) -> Tensor:
        """The model's forward with the arguments of its interface (the cache among them)."""
        return self.model(*args, **options)


def with_steps(target: nn.Module, drafter: "nn.Module | list[nn.Module] | None", mode: str) -> tuple[Any, Any]:
    """Target and drafter (or a list of drafters, each wrapped) run as ``mode`` (one of MODES) asks; ``eager``
    returns them unchanged. All share one phase runner (on CUDA with graphs:
    :class:`coolsd.core.graphs.CudaGraphPhases`)."""
    if mode not in MODES:
        raise ValueError(f"steps must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "eager":
        return target, drafter
    cuda = target.device.type == "cuda"
    if mode == "graphs" and not cuda:
        raise ValueError(f"steps 'graphs' capture CUDA graphs and need a CUDA device; on {target.device} use "
                         "'eager', 'static' or 'compiled'")
    if mode == "compiled":
        keep_compilations()
        runner = CudaGraphPhases(compiled=True) if cuda else CompiledPhases()
    else:
        runner = CudaGraphPhases() if mode == "graphs" else EAGER
    wrap = lambda model: Steps(model, runner=runner) if model is not None else None  # noqa: E731
    return wrap(target), ([wrap(d) for d in drafter] if isinstance(drafter, list) else wrap(drafter))


def unwrapped(model: Any) -> Any:
    """The model inside a :class:`Steps` (anything else unchanged)."""
    return model.model if isinstance(model, Steps) else model


def default_mode(device: torch.device, many_images: bool = False) -> str:
    """The measured fastest steps where they pay: CUDA graphs on CUDA; on a CPU, compiled phases for a run of
    ``many_images`` (the benchmark: a first compilation takes a minute or more, cached on disk after) where a C++
    compiler is found, else eager (the app and one-off generations: the first compiled image costs more than it
    saves).
    ``$COOLSD_STEPS`` overrides both."""
    chosen = os.environ.get("COOLSD_STEPS")
    if chosen:
        if chosen not in MODES or (chosen == "graphs" and device.type != "cuda"):
            raise ValueError(f"$COOLSD_STEPS must be one of {', '.join(MODES)} (graphs only on CUDA), "
                             f"got {chosen!r}")
        return chosen
    if device.type == "cuda":
        return "graphs"
    return "compiled" if many_images and cpp_compiler() else "eager"


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU ($CXX, else c++, g++ or clang++ on the PATH), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    return next((found for found in map(shutil.which, names) if found), None)


def keep_compilations() -> Path:
    """Inductor's compiled kernels kept in the user's cache (``$TORCHINDUCTOR_CACHE_DIR`` if set), not in a
    temporary folder, so that a second start loads them instead of compiling (measured: a first compiled COOL-SD
    image took 88 s, the same image in a new process 16 s). One folder per version of this package's code: a
    kernel an earlier version compiled was once loaded for a phase of this one whose graph inputs differ, and
    failed its size check (a tree:eagle25 verification)."""
    folder = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "coolsd" / "torchinductor"
                                                                  / source_digest()))
    return Path(folder)


@functools.cache
def source_digest() -> str:
    """12 hex digits of the sha256 of this package's Python sources (their paths and contents, in order)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
