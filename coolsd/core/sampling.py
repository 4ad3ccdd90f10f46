"""The sampling transform shared by target and drafter (spec section 1): guidance, top-k/top-p, temperature."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from .params import number


@dataclass(frozen=True)
class SamplingConfig:
    """``cfg_scale`` s mixes ``l_uncond + s * (l_cond - l_uncond)``; ``top_k=0`` and ``top_p=1`` switch filtering
    off."""

    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        """Mathematically valid values (the app's narrower ranges are checked where requests are parsed)."""
        checked = {"cfg_scale": number("cfg_scale", self.cfg_scale, 0),
                   "temperature": number("temperature", self.temperature, above=0),
                   "top_k": number("top_k", self.top_k, 0, integer=True),
                   "top_p": number("top_p", self.top_p, high=1, above=0)}
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def rows(self) -> int:
        """Batch rows per sequence: conditional then unconditional, unless guidance is the identity."""
        return 1 if self.cfg_scale == 1 else 2

    def to_dict(self) -> dict:
        return asdict(self)


def probabilities(logits: Tensor, cfg: SamplingConfig, allowed: Tensor | None = None) -> Tensor:
    """Model logits (rows, ..., V) -> guided, filtered, tempered distributions (..., V) in float32. ``allowed``
    (..., V) bool, where positions are constrained: what it excludes gets probability 0, after guidance and
    before filtering (spec section 8; a forced position becomes a point mass)."""
    logits = logits if logits.dtype == torch.float32 else logits.float()
    if cfg.rows == 1:
        guided = logits[0]
    else:
        cond, uncond = logits.unbind(0)
        guided = uncond + cfg.cfg_scale * (cond - uncond)
    if allowed is not None:
        guided = guided.masked_fill(~allowed, -math.inf)
    if cfg.top_k and cfg.top_k < guided.shape[-1]:
        kth = torch.topk(guided, cfg.top_k, dim=-1).values[..., -1:]
        guided = guided.masked_fill(guided < kth, -math.inf)
    if cfg.top_p < 1:
        ordered, order = torch.sort(guided, dim=-1, descending=True)
        mass = ordered.softmax(-1)
        drop = mass.cumsum(-1) - mass >= cfg.top_p  # keep the smallest prefix whose mass reaches top_p
        guided = guided.scatter(-1, order, ordered.masked_fill(drop, -math.inf))
    return (guided if cfg.temperature == 1 else guided / cfg.temperature).softmax(-1)


def draw_without_replacement(probs: Tensor, k: int, races: Tensor) -> tuple[Tensor, Tensor]:
    """Draw ``k`` tokens per row without replacement, in draw order, from ``races``: Exp(1) draws of ``probs``'
    shape, made beforehand by whoever owns the random stream. Returns the tokens and their race values.

    Exponential races (equivalent to Gumbel-top-k): the order of ``q / E`` with ``E ~ Exp(1)`` is a sequential
    draw without replacement from ``q``. A row with fewer than ``k`` tokens of nonzero probability has race
    values of 0 for the rest: those draws are not real tokens (a caller drawing one token per row always gets a
    real one, and need not look).
    """
    top = torch.topk(probs / races, k, dim=-1)
    return top.indices, top.values


def sample(probs: Tensor, uniforms: Tensor) -> Tensor:
    """One draw per row of a (possibly unnormalised) nonnegative ``probs`` (..., V) by inversion, from
    ``uniforms`` (...) in [0, 1): the first token whose cumulative mass exceeds ``u`` times the total."""
    cumulative = probs.cumsum(-1)
    index = torch.searchsorted(cumulative, uniforms[..., None] * cumulative[..., -1:], right=True)[..., 0]
    return index.clamp_max(probs.shape[-1] - 1)
