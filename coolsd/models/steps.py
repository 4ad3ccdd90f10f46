"""Fixed-shape model steps for CUDA: a static KV cache and CUDA-graph replay, behind the same interface.

On a GPU a batch-1 step of a large target is bound by kernel launches and weight reads, so a round only pays
if its steps are cheap to launch. :class:`coolsd.models.cache.StaticKVCache` attends over its whole buffer with a
mask built on the device and commits on the device, so every round runs the same kernels on the same buffers,
with nothing read back to the host. :class:`Steps` wraps a target or a drafter, keeps its caches between images,
optionally compiles its forward, and carries the runner that captures the round's phases as CUDA graphs
(:class:`coolsd.core.graphs.CudaGraphPhases`). The decoding loop does not change: it sees a Target or Drafter
(:mod:`coolsd.core.interface`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..core.graphs import EAGER, CudaGraphPhases, PhaseRunner
from .cache import StaticKVCache

MODES = ("eager", "static", "graphs", "compiled")
MODE_HELP = ("model steps: eager (a cache sliced to its length; the CPU default, whose tokens the tests pin), "
             "static (a fixed-size cache attended with a mask), graphs (static, each step shape captured once as "
             "a CUDA graph and replayed; the CUDA default), compiled (static with a torch.compile-d forward, "
             "captured as CUDA graphs on CUDA)")


class Steps:
    """A target or drafter run with static caches, kept between images (a captured graph holds their buffers),
    and optionally a ``torch.compile``-d forward. Everything else is the wrapped model's (attribute access falls
    through). ``runner`` runs the decoding round's phases (CUDA graphs, for the graphs and compiled modes)."""

    def __init__(self, model: nn.Module, compile_forward: bool = False, runner: PhaseRunner = EAGER) -> None:
        self.model, self.runner = model, runner
        if compile_forward:  # one compilation per call shape: allow more than dynamo's default of 8
            config = torch._dynamo.config
            limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, limit, max(getattr(config, limit), 64))
        self.forward = torch.compile(model, dynamic=False, fullgraph=True) if compile_forward else model
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

    def __call__(self, *args) -> Tensor:
        """The model's forward with the positional arguments of its interface (the cache among them)."""
        return self.forward(*args)


def with_steps(target: nn.Module, drafter: nn.Module | None, mode: str) -> tuple[Any, Any]:
    """Target and drafter run as ``mode`` (one of MODES) asks; ``eager`` returns them unchanged. Both share one
    phase runner (on CUDA with graphs: :class:`coolsd.core.graphs.CudaGraphPhases`)."""
    if mode not in MODES:
        raise ValueError(f"steps must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "eager":
        return target, drafter
    cuda = target.device.type == "cuda"
    if mode == "graphs" and not cuda:
        raise ValueError(f"steps 'graphs' capture CUDA graphs and need a CUDA device; on {target.device} use "
                         "'eager', 'static' or 'compiled'")
    runner = CudaGraphPhases() if cuda and mode in ("graphs", "compiled") else EAGER
    wrap = lambda model: Steps(model, compile_forward=mode == "compiled", runner=runner)  # noqa: E731
    return wrap(target), (wrap(drafter) if drafter is not None else None)


def unwrapped(model: Any) -> Any:
    """The model inside a :class:`Steps` (anything else unchanged)."""
    return model.model if isinstance(model, Steps) else model


def default_mode(device: torch.device) -> str:
    return "graphs" if device.type == "cuda" else "eager"
