"""LlamaGen-style target transformer, its KV cache, and the Eagle-1 draft head (spec section 5).

Module and parameter names follow LlamaGen's GPT (``tok_embeddings``, ``cls_embedding.embedding_table``,
``layers.N.attention.wqkv`` ...) so that a LlamaGen class-to-image state dict loads without renaming.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a target model; the drafter reuses ``dim``, ``n_head`` and the vocabulary."""

    vocab_size: int = 1024
    dim: int = 256
    n_layer: int = 12
    n_head: int = 8
    num_classes: int = 10
    grid_height: int = 8
    grid_width: int = 8
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    class_dropout: float = 0.1

    @property
    def image_tokens(self) -> int:
        return self.grid_height * self.grid_width

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_dim(self) -> int:
        """LlamaGen's SwiGLU width: 2/3 of 4*dim, rounded up to ``multiple_of``."""
        hidden = int(2 * 4 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    @property
    def null_class(self) -> int:
        """Index of the extra class-embedding row used as the "no class" input for guidance."""
        return self.num_classes

    def to_dict(self) -> dict:
        return asdict(self)

    def __post_init__(self) -> None:
        if self.dim % self.n_head or self.head_dim % 4:
            raise ValueError(f"dim={self.dim} must split into n_head={self.n_head} heads of a size divisible by 4")


# Shapes of LlamaGen's class-conditional models (256px, 16x16 grid, 16384 codes, 1000 classes), and ours.
CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, num_classes=4, grid_height=4, grid_width=4,
                        multiple_of=16),
    "small": ModelConfig(vocab_size=1024, dim=256, n_layer=12, n_head=8, num_classes=10, grid_height=16, grid_width=16),
    "llamagen-b": ModelConfig(vocab_size=16384, dim=768, n_layer=12, n_head=12, num_classes=1000,
                              grid_height=16, grid_width=16),
    "llamagen-l": ModelConfig(vocab_size=16384, dim=1024, n_layer=24, n_head=16, num_classes=1000,
                              grid_height=16, grid_width=16),
    "llamagen-xl": ModelConfig(vocab_size=16384, dim=1280, n_layer=36, n_head=20, num_classes=1000,
                               grid_height=16, grid_width=16),
}


def rope_table(cfg: ModelConfig) -> Tensor:
    """2-D RoPE rotations (complex, unit or zero) per sequence position: row 0 is the class token, row s>=1
    is grid cell s-1. As in LlamaGen, half of each head's rotation pairs follow the grid row, half the
    column, and the class token's table is all zeros."""
    quarter = cfg.head_dim // 4
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, 2 * quarter, 2).float() / (2 * quarter)))
    rows = torch.outer(torch.arange(cfg.grid_height).float(), inv_freq)  # (H, quarter)
    cols = torch.outer(torch.arange(cfg.grid_width).float(), inv_freq)  # (W, quarter)
    angles = torch.cat([rows[:, None, :].expand(-1, cfg.grid_width, -1),
                        cols[None, :, :].expand(cfg.grid_height, -1, -1)], dim=-1)
    table = torch.polar(torch.ones(cfg.image_tokens, 2 * quarter), angles.reshape(cfg.image_tokens, 2 * quarter))
    return torch.cat([torch.zeros(1, 2 * quarter, dtype=table.dtype), table])  # (1 + image_tokens, head_dim/2)


class RotaryTable:
    """The RoPE table kept in complex64 on whichever device asks for it; deliberately not a buffer, so that
    casting a model to bf16 leaves the rotations exact (as LlamaGen keeps ``freqs_cis`` out of its state)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.table = rope_table(cfg)

    def __call__(self, positions: Tensor) -> Tensor:
        if self.table.device != positions.device:
            self.table = self.table.to(positions.device)
        return self.table[positions]


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate adjacent pairs of ``x`` (B, T, ..., D) by the complex ``table`` (T, D/2)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    table = table.view(1, table.shape[0], *([1] * (x.dim() - 3)), table.shape[1])
    return torch.view_as_real(pairs * table).flatten(-2).type_as(x)


class KVCache:
    """Preallocated keys/values. ``length`` entries are committed; a forward writes its tokens after them
    (at ``offset`` within the pending area) without committing, and ``commit`` keeps a chosen subset."""

    def __init__(self, n_layer: int, rows: int, n_head: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (n_layer, rows, n_head, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def write(self, layer: int, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """Store pending ``k, v`` (rows, H, T, D); return everything visible to them."""
        start = self.length + offset
        end = start + k.shape[2]
        if end > self.keys.shape[3]:
            raise ValueError(f"KV cache overflow: need {end} slots, have {self.keys.shape[3]}")
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def commit(self, keep: list[int]) -> None:
        """Append the pending entries ``keep`` (indices into the pending area, in order); drop the rest."""
        n = len(keep)
        if keep != list(range(n)):
            index = torch.tensor(keep, device=self.keys.device) + self.length
            self.keys[:, :, :, self.length:self.length + n] = self.keys.index_select(3, index)
            self.values[:, :, :, self.length:self.length + n] = self.values.index_select(3, index)
        self.length += n


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, rope: Tensor, cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        rows, length, _ = x.shape
        qkv = self.wqkv(x).view(rows, length, 3, self.n_head, self.head_dim)
        q, k = apply_rope(qkv[:, :, :2], rope).permute(2, 0, 3, 1, 4).unbind(0)  # (rows, H, T, D) each
        v = qkv[:, :, 2].transpose(1, 2)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k, v = cache.write(layer, k, v, offset)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(rows, length, -1))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: Tensor, rope: Tensor, cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, cache, layer, offset, mask)
        return h + self.feed_forward(self.ffn_norm(h))


def visibility_mask(cache: KVCache, offset: int, pending_mask: Tensor | None, length: int) -> Tensor | None:
    """Full boolean attention mask for ``length`` new tokens: all committed entries, plus ``pending_mask``
    (length, offset + length) over the pending area; ``None`` means "see everything" (a single new token)."""
    if pending_mask is None:
        return None
    committed = torch.ones(length, cache.length, dtype=torch.bool, device=pending_mask.device)
    return torch.cat([committed, pending_mask], dim=1)


class ClassEmbedder(nn.Module):
    """Class embedding with one extra row for the unconditional ("no class") input."""

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: Tensor) -> Tensor:
        return self.embedding_table(labels)


class Transformer(nn.Module):
    """The target model P: class token at position 0, image token x_i at position i (spec section 5)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.cls_embedding = ClassEmbedder(cfg.num_classes, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = RotaryTable(cfg)
        self.apply(init_weights)

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        p = self.output.weight
        return KVCache(len(self.layers), rows, self.config.n_head, self.config.head_dim, max_len, p.device, p.dtype)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache | None = None, offset: int = 0,
                mask: Tensor | None = None) -> Tensor:
        """Embedded inputs ``x`` (rows, T, dim) at sequence ``positions`` (T,) -> last normed hidden states.

        Without a cache the attention is causal over ``x`` (training, reference). With one, ``mask`` is the
        pending-area mask described in :func:`visibility_mask`.
        """
        rope = self.rope(positions)
        full_mask = visibility_mask(cache, offset, mask, x.shape[1]) if cache is not None else None
        for layer, block in enumerate(self.layers):
            x = block(x, rope, cache, layer, offset, full_mask)
        return self.norm(x)

    def class_inputs(self, labels: Tensor) -> Tensor:
        """(rows,) labels -> (rows, 1, dim) class-token embeddings."""
        return self.cls_embedding(labels)[:, None, :]

    def sequence_inputs(self, labels: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forcing inputs: class token then ``tokens[:, :-1]`` -> (B, T, dim)."""
        return torch.cat([self.class_inputs(labels), self.tok_embeddings(tokens[:, :-1])], dim=1)


class Drafter(nn.Module):
    """Eagle-1 head: ``fc(concat(embed(x_{t+1}), h_t))`` then one decoder layer predicts ``h_{t+1}``; the
    target's frozen output head turns that into draft logits (spec section 5)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=True)
        self.layer = TransformerBlock(cfg)
        self.rope = RotaryTable(cfg)
        self.apply(init_weights)

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        p = self.fc.weight
        return KVCache(1, rows, self.config.n_head, self.config.head_dim, max_len, p.device, p.dtype)

    def forward(self, token_embeds: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        x = self.fc(torch.cat([token_embeds, features], dim=-1))
        full_mask = visibility_mask(cache, offset, mask, x.shape[1]) if cache is not None else None
        return self.layer(x, self.rope(positions), cache, 0, offset, full_mask)


def init_weights(module: nn.Module) -> None:
    """LlamaGen's initialisation: normal(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
