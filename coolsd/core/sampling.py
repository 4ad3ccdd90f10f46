"""The sampling transform shared by target and drafter (spec section 1): guidance, top-k/top-p, temperature."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingConfig:
    """``cfg_scale`` s mixes ``l_uncond + s * (l_cond - l_uncond)``; ``top_k=0`` and ``top_p=1`` switch filtering off."""

    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.cfg_scale, (int, float)) and math.isfinite(self.cfg_scale) and self.cfg_scale >= 0):
            raise ValueError(f"cfg_scale must be a finite number >= 0, got {self.cfg_scale!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def rows(self) -> int:
        """Batch rows per sequence: conditional then unconditional, unless guidance is the identity."""
        return 1 if self.cfg_scale == 1 else 2

    def to_dict(self) -> dict:
        return asdict(self)


def probabilities(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """Model logits (rows, ..., V) -> guided, filtered, tempered distributions (..., V) in float32."""
    logits = logits.float()
    guided = logits[0] if cfg.rows == 1 else logits[1] + cfg.cfg_scale * (logits[0] - logits[1])
    if cfg.top_k and cfg.top_k < guided.shape[-1]:
        kth = torch.topk(guided, cfg.top_k, dim=-1).values[..., -1:]
        guided = guided.masked_fill(guided < kth, -math.inf)
    if cfg.top_p < 1:
        ordered, order = torch.sort(guided, dim=-1, descending=True)
        mass = ordered.softmax(-1)
        drop = mass.cumsum(-1) - mass >= cfg.top_p  # keep the smallest prefix whose mass reaches top_p
        guided = guided.scatter(-1, order, ordered.masked_fill(drop, -math.inf))
    return (guided if cfg.temperature == 1 else guided / cfg.temperature).softmax(-1)


def draw_without_replacement(probs: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Draw ``k`` tokens per row without replacement, in draw order.

    Exponential races (equivalent to Gumbel-top-k): the order of ``q / E`` with ``E ~ Exp(1)`` is a sequential
    draw without replacement from ``q``. A row with fewer than ``k`` tokens of nonzero probability marks the
    rest invalid.
    """
    races = torch.empty_like(probs).exponential_(generator=generator)
    top = torch.topk(probs / races, k, dim=-1)
    return top.indices, top.values > 0


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a (possibly unnormalised) nonnegative vector."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(probs) - 1)
