"""The Eagle draft heads (spec section 5); both implement :class:`coolsd.core.interface.Drafter`.

* :class:`Drafter`, Eagle-1: ``fc(concat(embed(x_{t+1}), h_t))`` then one decoder layer predicts the target's
  final-normed feature ``h_{t+1}``; the target's head turns it into draft logits.
* :class:`Eagle3Drafter`, EAGLE-3 (Li et al. 2025, arXiv 2503.01840; layout of ``SafeAILab/EAGLE``'s
  ``traineagle3``): it reads the inputs of a low, a middle and a high target layer, fused by ``fc``, and is
  trained with training-time test on its own predicted features (:mod:`coolsd.distill.objective`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from .cache import KVCache, kv_cache
from .config import ModelConfig
from .gpt import (
    Attention,
    FeedForward,
    RMSNorm,
    RotaryTable,
    Transformer,
    TransformerBlock,
    attention_mask,
    init_weights,
)


class SharedTableDrafter(nn.Module):
    """What both heads share: the target's input table (shared, not copied, by :meth:`share_embedding`), the
    prefill's lead inputs, a one-layer cache. Slot ``s`` is rotated like the target's position ``s`` (its
    feature's), so the prefix slots get the zero rotations."""

    config: ModelConfig
    target_layers: tuple[int, ...] = ()  # the target's final-normed features

    def share_embedding(self, target: Transformer) -> "SharedTableDrafter":
        self.shared = (target.tok_embeddings,)  # a tuple, so the target's table is not one of our parameters
        return self

    def embed(self, tokens: Tensor) -> Tensor:
        if not getattr(self, "shared", ()):
            raise RuntimeError("this drafter embeds tokens with its target's table: call share_embedding(target)")
        return self.shared[0](tokens)

    def lead_inputs(self, prefix_embeds: Tensor) -> Tensor:
        """Slot s < P-1 is paired with the prefix's embedding at s + 1: the target's next input (Eagle's rule)."""
        return prefix_embeds[:, 1:]

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p = self.fc.weight
        return kv_cache(1, rows, self.config.n_head, self.config.head_dim, max_len, p.device, p.dtype, images)

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        """Draft logits of predicted features through the target's output ``head``."""
        return head(features)


class Drafter(SharedTableDrafter):
    """Eagle-1 head: ``fc(concat(embed(x_{t+1}), h_t))`` then one decoder layer predicts ``h_{t+1}``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=True)
        self.layer = TransformerBlock(cfg)
        self.rope = RotaryTable(cfg)
        self.shared: tuple[nn.Embedding, ...] = ()
        self.apply(init_weights)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        x = self.fc(torch.cat([inputs, features], dim=-1))
        mask = attention_mask(cache, mask, x.shape[1], offset=offset)
        return self.layer(x, self.rope(positions, inner_dims=2), cache, 0, offset, mask)


def default_taps(n_layer: int) -> tuple[int, ...]:
    """EAGLE-3's choice: the inputs of layers 2, n // 2 and n - 3 (a low, a middle and a high one)."""
    return tuple(sorted({min(2, n_layer - 1), n_layer // 2, max(0, n_layer - 3)}))


class Eagle3Drafter(SharedTableDrafter):
    """EAGLE-3 head. A target feature is the inputs of ``taps`` target layers side by side, reduced by ``fc``
    (k * dim -> dim, no bias); its own predicted feature (dim wide) goes in as it is. One decoder layer whose
    attention reads ``concat(input_norm(embed(x_{t+1})), hidden_norm(h_t))`` (2 dim) and whose residual is
    ``h_t`` predicts the next (un-normed) feature; ``norm`` then the target's head give the draft logits.
    ``extra_layers`` plain decoder layers may follow (EAGLE-3 has none; measured in docs/training.md)."""

    def __init__(self, cfg: ModelConfig, taps: Sequence[int] | None = None, extra_layers: int = 0) -> None:
        super().__init__()
        self.config, self.target_layers = cfg, check_taps(taps, cfg.n_layer)
        taps = self.target_layers
        self.fc = nn.Linear(len(taps) * cfg.dim, cfg.dim, bias=False)
        self.input_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hidden_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, in_dim=2 * cfg.dim)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(extra_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.rope = RotaryTable(cfg)
        self.shared: tuple[nn.Embedding, ...] = ()
        self.apply(init_weights)

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p = self.fc.weight
        return kv_cache(1 + len(self.layers), rows, self.config.n_head, self.config.head_dim, max_len, p.device,
                        p.dtype, images)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        """As Eagle-1's, where ``features`` are the target's taps (k * dim wide) or the drafter's own (dim)."""
        mask = attention_mask(cache, mask, inputs.shape[1], offset=offset)
        rope = self.rope(positions, inner_dims=2)
        x = fused_layer(self, inputs, features, lambda x: self.attention(x, rope, cache, 0, offset, mask))
        for index, block in enumerate(self.layers, start=1):
            x = block(x, rope, cache, index, offset, mask)
        return x

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        return head(self.norm(features))


def fused_layer(drafter: nn.Module, inputs: Tensor, features: Tensor, attend: Callable[[Tensor], Tensor]) -> Tensor:
    """EAGLE-3's decoder layer around a family's attention ``attend`` (2 dim -> dim): target taps are reduced by
    ``fc`` first (a feature as wide as ``fc``'s output is the drafter's own); the attention reads the normed
    next-input embedding and feature side by side, the residual is the feature."""
    hidden = drafter.fc(features) if features.shape[-1] != drafter.fc.out_features else features
    h = hidden + attend(torch.cat([drafter.input_norm(inputs), drafter.hidden_norm(hidden)], dim=-1))
    return h + drafter.feed_forward(drafter.ffn_norm(h))


def check_taps(taps: Sequence[int] | None, n_layer: int) -> tuple[int, ...]:
    """An EAGLE-3 drafter's target layers: 2 or more distinct ones in range (default: EAGLE-3's choice)."""
    taps = tuple(default_taps(n_layer) if taps is None else sorted(set(taps)))
    if len(taps) < 2 or not all(0 <= t < n_layer for t in taps):
        raise ValueError(f"an EAGLE-3 drafter fuses 2 or more distinct target layers in [0, {n_layer - 1}], "
                         f"got {list(taps)}")
    return taps
