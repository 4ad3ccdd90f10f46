"""LlamaGen-style target transformer and its KV cache (spec sections 5 and 7), class- or text-conditioned.

Module and parameter names follow LlamaGen's GPT (``tok_embeddings``, ``cls_embedding.embedding_table``,
``cls_embedding.cap_proj.fc1``, ``layers.N.attention.wqkv`` ...) so that LlamaGen state dicts load without
renaming. The model implements :class:`coolsd.core.interface.Target`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.interface import Prefix
from ..core.params import shorten
from .cache import KVCache, hide_invalid_keys, kv_cache
from .config import ModelConfig


@dataclass(frozen=True)
class ClassLabel:
    """Condition of a class-to-image model."""

    class_id: int

    def describe(self) -> dict:
        return {"class_id": self.class_id}


@dataclass(frozen=True, eq=False)
class Caption:
    """Condition of a text-to-image model: encoded caption ``features`` (P, caption_dim) and ``valid`` (P,)
    bool, False at padding slots (LlamaGen moves the real tokens to the end, so padding comes first)."""

    features: Tensor
    valid: Tensor
    text: str = ""

    def describe(self) -> dict:
        return {"caption": self.text, "caption_tokens": int(self.valid.sum())}

    def __repr__(self) -> str:
        return f"Caption({self.text!r}, {int(self.valid.sum())} of {len(self.valid)} slots)"


def rope_table(cfg: ModelConfig, zero_rows: int | None = None) -> Tensor:
    """2-D RoPE rotations per sequence position as LlamaGen's ``freqs_cis`` holds them, (cos, sin) pairs in
    float32 (P + image_tokens, D/2, 2): ``zero_rows`` (default ``P``) rows of zeros for the prefix, then one row
    per grid cell. As in LlamaGen, half of each head's rotation pairs follow the grid row, half the column; a
    zero row zeroes queries and keys (spec section 7)."""
    zero_rows = cfg.prefix_length if zero_rows is None else zero_rows
    quarter = cfg.head_dim // 4
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, 2 * quarter, 2).float() / (2 * quarter)))
    rows = torch.outer(torch.arange(cfg.grid_height).float(), inv_freq)  # (H, quarter)
    cols = torch.outer(torch.arange(cfg.grid_width).float(), inv_freq)  # (W, quarter)
    angles = torch.cat([rows[:, None, :].expand(-1, cfg.grid_width, -1),
                        cols[None, :, :].expand(cfg.grid_height, -1, -1)], dim=-1)
    turns = torch.polar(torch.ones(cfg.image_tokens, 2 * quarter), angles.reshape(cfg.image_tokens, 2 * quarter))
    table = torch.stack([turns.real, turns.imag], dim=-1)
    return torch.cat([torch.zeros(zero_rows, 2 * quarter, 2), table])


class RotaryTable:
    """The RoPE table, kept in float32 on whichever device asks for it; deliberately not a buffer, so that
    casting a model to bf16 leaves the rotations exact (as LlamaGen keeps ``freqs_cis`` out of its state). A
    call gives, for the positions, what :func:`apply_rope` multiplies by."""

    def __init__(self, cfg: ModelConfig, zero_rows: int | None = None) -> None:
        self.table = rope_table(cfg, zero_rows)
        self.expanded: tuple[Tensor, Tensor, Tensor] | None = None

    def __call__(self, positions: Tensor, inner_dims: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """(cos, sin, swap): per dimension, its pair's cosine, and its pair's sine with the sign its element
        takes (``-sin`` first, ``sin`` second), shaped (T, 1 x inner_dims, D) for positions (T,) shared by every
        row, or (rows, T, 1 x inner_dims, D) for per-row positions (rows, T), to broadcast over ``x``
        (rows, T, <inner_dims>, D); ``swap`` (D,) exchanges the two elements of every pair."""
        if self.expanded is None or self.expanded[0].device != positions.device:
            cos, sin = self.table[..., 0], self.table[..., 1]
            swap = torch.arange(cos.shape[-1] * 2).view(-1, 2).flip(-1).flatten()
            self.expanded = (cos.repeat_interleave(2, -1).to(positions.device),
                             torch.stack([-sin, sin], dim=-1).flatten(-2).to(positions.device), swap.to(positions.device))
        shape = (*positions.shape, *([1] * inner_dims), -1)
        cos, sin, swap = self.expanded
        flat = positions if positions.dim() == 1 else positions.reshape(-1)
        return cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape), swap


def apply_rope(x: Tensor, rope: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """Rotate adjacent pairs of ``x`` (B, T, ..., D) in real arithmetic, as LlamaGen's ``apply_rotary_emb``:
    ``(x0 cos - x1 sin, x1 cos + x0 sin)`` per pair, in float32, cast back."""
    cos, sin, swap = rope
    x32 = x if x.dtype == torch.float32 else x.float()
    out = x32 * cos + x32.index_select(-1, swap) * sin
    return out if out.dtype == x.dtype else out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """LlamaGen's order: normalise in float32, cast back, then scale. In float32 the cast is nothing, and
        one call that also scales gives the same numbers with fewer operations."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, eps=self.eps)
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
    def __init__(self, cfg: ModelConfig, in_dim: int | None = None) -> None:
        """``in_dim``: the width of the input (default the model's; EAGLE-3's layer reads two features side by
        side)."""
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.wqkv = nn.Linear(in_dim or cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        rows, length, _ = x.shape
        qkv = self.wqkv(x).view(rows, length, 3, self.n_head, self.head_dim)
        q, k = apply_rope(qkv[:, :, :2], rope).permute(2, 0, 3, 1, 4).unbind(0)  # (rows, H, T, D) each
        v = qkv[:, :, 2].transpose(1, 2)
        if cache is not None:
            k, v = cache.write(layer, k, v, offset)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=cache is None and mask is None)
        return self.wo(y.transpose(1, 2).reshape(rows, length, -1))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, cache, layer, offset, mask)
        return h + self.feed_forward(self.ffn_norm(h))


def attention_mask(cache: KVCache | None, pending_mask: Tensor | None, length: int,
                   valid: Tensor | None = None, offset: int = 0) -> Tensor | None:
    """Boolean attention mask for ``length`` new positions, or None where SDPA needs none.

    With a cache, the cache builds it (:meth:`KVCache.attention_mask`). Without one: causal over the new
    positions, with keys marked invalid in ``valid`` hidden as below.
    """
    if cache is not None:
        return cache.attention_mask(pending_mask, length, offset)
    if valid is None:
        return None
    return hide_invalid_keys(torch.ones(length, length, dtype=torch.bool, device=valid.device).tril(), valid, length)


def additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean mask in SDPA's additive form (0 where a key is seen, -inf where hidden), built once per
    forward: given the boolean mask, SDPA converts it again in every layer (the scores are the same)."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class ClassEmbedder(nn.Module):
    """Class embedding with one extra row for the unconditional ("no class") input."""

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: Tensor) -> Tensor:
        return self.embedding_table(labels)


class CaptionEmbedder(nn.Module):
    """LlamaGen's text conditioning: caption features through ``cap_proj`` (fc1, GELU tanh, fc2; no biases);
    the unconditional input is the buffer ``uncond_embedding`` (P, caption_dim) (spec section 7)."""

    def __init__(self, caption_dim: int, dim: int, slots: int) -> None:
        super().__init__()
        self.cap_proj = nn.Module()
        self.cap_proj.fc1 = nn.Linear(caption_dim, dim, bias=False)
        self.cap_proj.fc2 = nn.Linear(dim, dim, bias=False)
        self.register_buffer("uncond_embedding", torch.randn(slots, caption_dim) / caption_dim ** 0.5)

    def forward(self, features: Tensor) -> Tensor:
        return self.cap_proj.fc2(F.gelu(self.cap_proj.fc1(features), approximate="tanh"))


def check_class(condition: "ClassLabel | int", cfg: ModelConfig) -> int:
    """A class model's condition: a ClassLabel or a plain class index in range."""
    class_id = condition.class_id if isinstance(condition, ClassLabel) else condition
    if isinstance(class_id, bool) or not isinstance(class_id, (int, np.integer)) or \
            not 0 <= class_id < cfg.num_classes:
        raise ValueError(f"class must be an integer in [0, {cfg.num_classes - 1}], got {shorten(condition)}")
    return int(class_id)


def check_caption(condition: "Caption", cfg: ModelConfig) -> "Caption":
    """A text model's condition: features (P, caption_dim) and a bool padding mask (P,)."""
    if not isinstance(condition, Caption):
        raise ValueError(f"this text-to-image model needs a caption, got {shorten(condition)}")
    slots = cfg.cls_token_num
    if tuple(condition.features.shape) != (slots, cfg.caption_dim):
        raise ValueError(f"caption features must have shape ({slots}, {cfg.caption_dim}), "
                         f"got {tuple(condition.features.shape)}")
    if condition.valid.dtype != torch.bool or tuple(condition.valid.shape) != (slots,):
        raise ValueError(f"caption mask must be a bool tensor of shape ({slots},), got "
                         f"{condition.valid.dtype} {tuple(condition.valid.shape)}")
    return condition


class Transformer(nn.Module):
    """The target model: ``P`` prefix positions (a class token, or caption slots), then image token ``i`` at
    position ``P + i`` (spec sections 5 and 7)."""

    position_rules = None  # every token may be drawn at every position (spec section 8)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        if cfg.text_conditioned:
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.cls_token_num)
        else:
            self.cls_embedding = ClassEmbedder(cfg.num_classes, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = RotaryTable(cfg)
        self.apply(init_weights)

    @property
    def prefix_length(self) -> int:
        return self.config.prefix_length

    @property
    def image_tokens(self) -> int:
        return self.config.image_tokens

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p = self.output.weight
        return kv_cache(len(self.layers), rows, self.config.n_head, self.config.head_dim, max_len, p.device, p.dtype,
                        images)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache | None = None, offset: int = 0,
                mask: Tensor | None = None, valid: Tensor | None = None,
                taps: tuple[int, ...] = ()) -> Tensor | tuple[Tensor, Tensor]:
        """Embedded inputs ``x`` (rows, T, dim) at sequence ``positions`` (T,) -> final-normed features; with
        ``taps`` (layer indices, for an EAGLE-3 drafter), also the inputs of those layers concatenated in layer
        order (rows, T, len(taps) * dim).

        Without a cache the attention is causal over ``x`` (training, reference). With one, ``mask`` is the
        pending-area mask of :func:`attention_mask`. ``valid`` (rows, T): which new positions are real keys
        (a padded caption prefix); with a cache it is remembered for later forwards.
        """
        if cache is not None and valid is not None:
            cache.mark_valid(valid, offset)
        rope = self.rope(positions, inner_dims=2)  # queries and keys together: (rows, T, 2, H, D)
        full_mask = additive(attention_mask(cache, mask, x.shape[1], valid, offset), x.dtype)
        tapped = []
        for layer, block in enumerate(self.layers):
            if layer in taps:
                tapped.append(x)
            x = block(x, rope, cache, layer, offset, full_mask)
        return (self.norm(x), torch.cat(tapped, -1)) if taps else self.norm(x)

    def logits(self, features: Tensor) -> Tensor:
        """float32 logits, as LlamaGen returns them."""
        return self.output(features).float()

    def embed(self, tokens: Tensor) -> Tensor:
        return self.tok_embeddings(tokens)

    def prefix(self, condition: "ClassLabel | Caption | int", rows: int) -> Prefix:
        """Row 0 the condition, row 1 (when ``rows`` is 2) the unconditional input: the null class, or the
        checkpoint's unconditional caption with the same padding mask (as LlamaGen samples)."""
        cfg = self.config
        device = self.output.weight.device
        if cfg.text_conditioned:
            caption = check_caption(condition, cfg)
            features = torch.stack([caption.features.to(device), self.cls_embedding.uncond_embedding])[:rows]
            embeds = self.cls_embedding(features.to(self.output.weight.dtype))
            return Prefix(embeds, caption.valid.to(device)[None].expand(rows, -1))
        labels = torch.tensor([check_class(condition, cfg), cfg.null_class][:rows], device=device)
        return Prefix(self.cls_embedding(labels)[:, None, :])

    def sequence_inputs(self, prefix: Prefix, tokens: Tensor) -> Tensor:
        """Teacher-forcing inputs: the prefix, then ``tokens[:, :-1]`` -> (B, P + T - 1, dim)."""
        return torch.cat([prefix.embeds, self.tok_embeddings(tokens[:, :-1])], dim=1)

    def class_prefix(self, labels: Tensor) -> Prefix:
        """A batch of class labels (B,) (the null class allowed) -> their one-token prefixes (training)."""
        return Prefix(self.cls_embedding(labels)[:, None, :])


def init_weights(module: nn.Module) -> None:
    """LlamaGen's initialisation: normal(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
