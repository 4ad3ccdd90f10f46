"""Fixed-shape model steps for CUDA: a static KV cache and CUDA-graph replay, behind the same interface.

On a GPU a batch-1 step of a large target is bound by kernel launches and weight reads, so a round only pays
if its steps are cheap to launch. :class:`StaticKVCache` attends over its whole buffer with a mask built on the
device and commits on the device, so every round runs the same kernels on the same buffers, with nothing read
back to the host. :class:`Steps` wraps a target or a drafter, keeps its caches between images, optionally
compiles its forward, and carries the runner that captures the round's phases as CUDA graphs
(:class:`coolsd.core.graphs.CudaGraphPhases`). The decoding loop does not change: it sees a Target or Drafter
(:mod:`coolsd.core.interface`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..core.graphs import EAGER, CudaGraphPhases, PhaseRunner
from .gpt import KVCache

MODES = ("eager", "static", "graphs", "compiled")
MODE_HELP = ("model steps: eager (a cache sliced to its length; the CPU default, whose tokens the tests pin), "
             "static (a fixed-size cache attended with a mask), graphs (static, each step shape captured once as "
             "a CUDA graph and replayed; the CUDA default), compiled (static with a torch.compile-d forward, "
             "captured as CUDA graphs on CUDA)")


class StaticKVCache(KVCache):
    """A KV cache whose shapes never change: writes go to slots computed on the device from ``start`` (the
    committed length as a tensor), and attention reads the whole buffer through a mask. ``length`` is still
    kept on the host, for the loop's positions and for :meth:`commit`."""

    def __init__(self, n_layer: int, rows: int, n_head: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(n_layer, rows, n_head, head_dim, max_len, device, dtype)
        self.valid = torch.ones(rows, max_len, dtype=torch.bool, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.key_index = torch.arange(max_len, device=device)

    def reset(self) -> "StaticKVCache":
        """Empty again, keeping the buffers (a captured graph holds their addresses)."""
        self.length = 0
        self.start.zero_()
        self.valid.fill_(True)
        return self

    def commit(self, keep: "list[int] | Tensor | None", count: "Tensor | int | None" = None) -> None:
        """As :meth:`KVCache.commit`, with a tensor ``keep`` (padded: only the first ``count`` rows matter, the
        rest land past the new length) and ``count`` on the device: the kept rows are gathered into place and
        ``start`` advances, with nothing read to the host. ``length`` then no longer follows on the host."""
        if isinstance(keep, list):
            super().commit(keep)
            self.start.fill_(self.length)
            return
        if keep is not None:
            slots = self.start + self.key_index[:keep.shape[0]]
            index = self.start + keep
            self.keys.index_copy_(3, slots, self.keys.index_select(3, index))
            self.values.index_copy_(3, slots, self.values.index_select(3, index))
            self.valid.index_copy_(1, slots, self.valid.index_select(1, index))
        self.start.add_(count)
        if not isinstance(count, Tensor):
            self.length += count

    def slots(self, offset: int, count: int) -> Tensor:
        return self.start + offset + self.key_index[:count]

    def mark_valid(self, valid: Tensor, offset: int) -> None:
        self.valid.index_copy_(1, self.slots(offset, valid.shape[1]), valid)

    def write(self, layer: int, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        slots = self.slots(offset, k.shape[2])
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)
        return self.keys[layer], self.values[layer]

    def attention_mask(self, pending_mask: Tensor | None, length: int, offset: int = 0) -> Tensor:
        """The same visibility as :meth:`KVCache.attention_mask`, over all ``max_len`` keys: committed keys,
        ``pending_mask`` placed at the pending area, valid keys only, and each new position's own slot."""
        width = offset + length if pending_mask is None else pending_mask.shape[1]
        relative = self.key_index - self.start  # key slot relative to the pending area's start
        inside = (relative >= 0) & (relative < width)
        if pending_mask is None:
            pending = inside[None, :].expand(length, -1)
        else:
            pending = pending_mask[:, relative.clamp(0, width - 1)] & inside
        mask = (pending | (relative < 0))[None, None] & self.valid[:, None, None, :]
        own = self.start + width - length + self.key_index[:length]
        return mask | (self.key_index[None, :] == own[:, None])


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
        self.caches: dict[tuple[int, int], StaticKVCache] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model"], name)

    def new_cache(self, rows: int, max_len: int) -> StaticKVCache:
        """The cache of this shape from earlier images, emptied (so captured graphs stay valid)."""
        if (rows, max_len) not in self.caches:
            plain = self.model.new_cache(rows, max_len)
            n_layer, _, n_head, _, head_dim = plain.keys.shape
            self.caches[rows, max_len] = StaticKVCache(n_layer, rows, n_head, head_dim, max_len, plain.keys.device,
                                                       plain.keys.dtype)
        return self.caches[rows, max_len].reset()

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
