"""The Eagle-1 draft head (spec section 5); implements :class:`coolsd.core.interface.Drafter`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .cache import KVCache, kv_cache
from .config import ModelConfig
from .gpt import (
    RotaryTable,
    Transformer,
    TransformerBlock,
    attention_mask,
    init_weights,
)


class Drafter(nn.Module):
    """Eagle-1 head: ``fc(concat(embed(x_{t+1}), h_t))`` then one decoder layer predicts ``h_{t+1}``; the
    target's frozen output head turns that into draft logits. Slot ``s`` is rotated like the target's position
    ``s`` (its feature's), so the prefix slots get the zero rotations. Its token embedding is the target's
    input table, shared (not copied) with :meth:`share_embedding`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=True)
        self.layer = TransformerBlock(cfg)
        self.rope = RotaryTable(cfg)
        self.shared: tuple[nn.Embedding, ...] = ()  # a tuple, so the target's table is not one of our parameters
        self.apply(init_weights)

    def share_embedding(self, target: Transformer) -> "Drafter":
        self.shared = (target.tok_embeddings,)
        return self

    def embed(self, tokens: Tensor) -> Tensor:
        if not self.shared:
            raise RuntimeError("this drafter embeds tokens with its target's table: call share_embedding(target)")
        return self.shared[0](tokens)

    def lead_inputs(self, prefix_embeds: Tensor) -> Tensor:
        """Slot s < P-1 is paired with the prefix's embedding at s + 1: the target's next input (Eagle's rule)."""
        return prefix_embeds[:, 1:]

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p = self.fc.weight
        return kv_cache(1, rows, self.config.n_head, self.config.head_dim, max_len, p.device, p.dtype, images)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        x = self.fc(torch.cat([inputs, features], dim=-1))
        mask = attention_mask(cache, mask, x.shape[1], offset=offset)
        return self.layer(x, self.rope(positions, inner_dims=2), cache, 0, offset, mask)
