"""LANTERN's Eagle-1 drafters for Chameleon targets (Anole: ``jadohu/anole_drafter``; Lumina-mGPT: the same
format, trained with LANTERN's trainer or ours): ``config.json`` + ``pytorch_model.bin``; implements
:class:`coolsd.core.interface.Drafter`.

Facts read from LANTERN's ``models/drafters/cnets_lumina_mgpt.py`` and ``cnets_anole.py`` (class ``Model``),
``models/ea_model_lumina_mgpt.py`` and ``entrypoints/train_drafter/main.py``:

* State dict (``load_state_dict(strict=True)``): ``embed_tokens.weight`` [V, d] (its own table: the trainer
  builds it with ``load_emb=True``, a frozen copy of the target's ``model.embed_tokens``), ``fc.weight``
  [d, 2d] and ``fc.bias`` (config ``"bias"``, default true), and per layer ``i`` a whole Chameleon decoder
  layer: ``layers.i.self_attn.{q,k,v,o}_proj.weight``, ``q_norm`` / ``k_norm`` weight and bias ((heads,
  head_dim) in the Anole format, (model_parallel_size, head_dim) repeated over the heads in the Lumina-mGPT
  one), ``mlp.{gate,up,down}_proj.weight``, ``input_layernorm.weight`` (layer 0 too) and
  ``post_attention_layernorm.weight`` (RMSNorm, eps ``rms_norm_eps``). No final norm.
* Slot input: ``fc(cat([embed_tokens(next token), target feature]))``; the target's ``lm_head`` gives logits,
  with guidance and the target's position rules.
* Positions: ``attention_mask.cumsum(-1) - 1``, so each row is shifted by its padding as the target is; the
  unconditional row's padding slots carry zero features (LANTERN zero-pads them) and are hidden.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from .cache import KVCache, hide_invalid_keys, kv_cache
from .chameleon import ChameleonAttention, ChameleonConfig, ChameleonLayer, ChameleonMLP, Rotary, shifted
from .eagle import check_taps, fused_layer
from .gpt import RMSNorm, additive, attention_mask
from .lantern import load_strictly, read_weights


@dataclass(frozen=True)
class DrafterConfig:
    """The fields of a LANTERN Chameleon drafter's ``config.json`` that shape it."""

    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_attention_heads: int = 32
    num_hidden_layers: int = 1
    vocab_size: int = 65536
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    bias: bool = True
    model_parallel_size: int = 1  # rows of q_norm / k_norm in the Lumina-mGPT format
    norm_rows: int | None = None  # rows as the file has them (None: read from the weights)

    @classmethod
    def from_json(cls, meta: dict) -> "DrafterConfig":
        """Read ``config.json``; what our layer cannot reproduce is a ValueError naming it."""
        if not isinstance(meta, dict):
            raise ValueError(f"a LANTERN drafter config must be a JSON object, got {type(meta).__name__}")
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [k for k in required if k not in meta]
        if missing:
            raise ValueError(f"LANTERN drafter config.json lacks {', '.join(missing)}")
        for key, wanted in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
            if meta.get(key, wanted) != wanted:
                raise ValueError(f"LANTERN drafter config: {key}={meta[key]!r} is not supported (only {wanted!r})")
        kv = meta.get("num_key_value_heads") or meta["num_attention_heads"]
        if kv != meta["num_attention_heads"]:
            raise ValueError(f"LANTERN drafter config: grouped-query attention (num_key_value_heads={kv}) is not "
                             "supported")
        known = {f.name for f in fields(cls)} - {"norm_rows"}
        config = cls(**{k: meta[k] for k in known if meta.get(k) is not None})
        if config.num_hidden_layers < 1 or config.hidden_size % config.num_attention_heads:
            raise ValueError(f"LANTERN drafter config: {config.num_hidden_layers} layers of width "
                             f"{config.hidden_size} in {config.num_attention_heads} heads is not a valid shape")
        return config

    @classmethod
    def for_target(cls, target: ChameleonConfig) -> "DrafterConfig":
        """The drafter shape LANTERN trains for a target: its width, heads, vocabulary, MLP, q/k-norm rows."""
        return cls(hidden_size=target.dim, intermediate_size=target.ffn_dim, num_attention_heads=target.n_head,
                   vocab_size=target.vocab_size, rms_norm_eps=target.norm_eps, rope_theta=target.rope_theta,
                   model_parallel_size=target.qk_norm_rows, norm_rows=target.qk_norm_rows)

    def to_json(self) -> dict:
        """``config.json`` as LANTERN's ``EConfig`` reads it (q/k-norm rows as ``model_parallel_size``)."""
        out = {k: v for k, v in asdict(self).items() if k != "norm_rows"}
        out["model_parallel_size"] = self.norm_rows or self.model_parallel_size
        return {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "num_key_value_heads":
                self.num_attention_heads, "attention_bias": False, "mlp_bias": False, **out}


def feature_validity(features: Tensor) -> Tensor:
    """(rows, T) True where a slot carries a feature: the target returns padding slots' features as zeros."""
    return features.detach().abs().amax(-1) > 0


class ChameleonDrafter(nn.Module):
    """LANTERN's Chameleon drafter; parameter names are the published state dict's."""

    padding_from_zero_features = True  # padding slots are the zero features (the trainer keeps them zero)

    def __init__(self, config: DrafterConfig, target: ChameleonConfig) -> None:
        super().__init__()
        if config.hidden_size != target.dim or config.vocab_size != target.vocab_size:
            raise ValueError(f"LANTERN drafter width {config.hidden_size} / vocabulary {config.vocab_size} do not fit "
                             f"the target's {target.dim} / {target.vocab_size}")
        self.config, self.target_config = config, target
        heads, rows = config.num_attention_heads, config.norm_rows or config.model_parallel_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ChameleonLayer(config.hidden_size, heads, config.intermediate_size,
                                                   config.rms_norm_eps, rows) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.bias)
        self.rope = Rotary(config.hidden_size // heads, config.rope_theta)

    target_layers: tuple[int, ...] = ()  # it reads the target's final-normed features

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        """Draft logits: the target's ``head`` on the predicted features."""
        return head(features)

    def share_embedding(self, target: nn.Module) -> "ChameleonDrafter":
        """A no-op: the drafter embeds with its own table (present because Bundle offers every drafter its
        target's)."""
        return self

    def embed(self, tokens: Tensor) -> Tensor:
        return self.embed_tokens(tokens)

    def lead_inputs(self, prefix_embeds: Tensor) -> Tensor:
        """Next inputs of prefix slots 0..P-2: the embeddings of prefix tokens 1..P-1. LANTERN embeds them with
        the drafter's table, which its trainer copies from the target's (``load_emb=True``, frozen); the
        target's prefix embeddings are those rows."""
        return prefix_embeds[:, 1:]

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p, cfg = self.fc.weight, self.config
        heads = cfg.num_attention_heads
        return kv_cache(len(self.layers), rows, heads, cfg.hidden_size // heads, max_len, p.device, p.dtype, images)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        """As :class:`coolsd.models.lantern.LanternDrafter`: causal without a cache (or ``mask`` (T, T)); with
        one, every committed entry plus ``mask`` over the pending area. Slots with zero features are padding."""
        x = self.fc(torch.cat([inputs.to(features.dtype), features], dim=-1))
        rope, full_mask = padded_attention(self, features, positions, cache, offset, mask)
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, cache, index, offset, full_mask)
        return x


def padded_attention(drafter: nn.Module, features: Tensor, positions: Tensor, cache: KVCache | None, offset: int,
                     mask: Tensor | None) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """A Chameleon drafter's rotations and additive mask for slots whose zero ``features`` mark padding (LANTERN's
    rule): each row's positions shifted by its padding count, padding keys hidden (with a cache, remembered
    by it), causal without a cache unless ``mask`` (T, T) is given."""
    valid, length = feature_validity(features), features.shape[1]
    if cache is not None:
        cache.mark_valid(valid, offset)
        pads = (~cache.valid[:, :drafter.target_config.prefix_length]).sum(-1)  # padding is in the prefix only
        full_mask = attention_mask(cache, mask, length, offset=offset)
    else:
        pads = (~valid).sum(-1)
        base = mask if mask is not None else torch.ones(length, length, dtype=torch.bool,
                                                         device=features.device).tril()
        full_mask = hide_invalid_keys(base, valid, length)
    dtype = drafter.fc.weight.dtype
    return drafter.rope(shifted(positions, pads), dtype), additive(full_mask, dtype)


class ChameleonEagle3Drafter(nn.Module):
    """EAGLE-3 for a Chameleon target (:class:`coolsd.models.eagle.Eagle3Drafter`'s layout, with the target's
    attention: q/k norms, rotate-half RoPE shifted by each row's padding, padding slots the zero features):
    its own token table (a frozen copy of the target's, as LANTERN's drafters have), ``fc`` over the taps,
    one fused layer, its own ``norm`` before the target's head."""

    padding_from_zero_features = True

    def __init__(self, target: ChameleonConfig, taps: Sequence[int] | None = None) -> None:
        super().__init__()
        dim, heads = target.dim, target.n_head
        self.config = self.target_config = target
        self.target_layers = check_taps(taps, target.n_layer)
        self.embed_tokens = nn.Embedding(target.vocab_size, dim)
        self.fc = nn.Linear(len(self.target_layers) * dim, dim, bias=False)
        self.input_norm, self.hidden_norm = RMSNorm(dim, target.norm_eps), RMSNorm(dim, target.norm_eps)
        self.attention = ChameleonAttention(dim, heads, target.qk_norm_rows, in_dim=2 * dim)
        self.ffn_norm, self.feed_forward = RMSNorm(dim, target.norm_eps), ChameleonMLP(dim, target.ffn_dim)
        self.norm = RMSNorm(dim, target.norm_eps)
        self.rope = Rotary(dim // heads, target.rope_theta)

    share_embedding = ChameleonDrafter.share_embedding
    embed = ChameleonDrafter.embed
    lead_inputs = ChameleonDrafter.lead_inputs

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p, heads = self.fc.weight, self.target_config.n_head
        return kv_cache(1, rows, heads, self.target_config.dim // heads, max_len, p.device, p.dtype, images)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        """Target taps (k * dim wide, zero at padding) or its own features (dim), as Eagle3Drafter's."""
        rope, full_mask = padded_attention(self, features, positions, cache, offset, mask)
        return fused_layer(self, inputs.to(self.fc.weight.dtype), features,
                           lambda x: self.attention(x, rope, cache, 0, offset, full_mask))

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        return head(self.norm(features))


def load_chameleon_drafter(directory: str | Path, target: ChameleonConfig,
                           dtype: torch.dtype | None = torch.float32) -> ChameleonDrafter:
    """A LANTERN Chameleon drafter directory (``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``)
    for a target of shape ``target``, on the CPU in ``dtype`` (None: the file's). Strict: a missing, unexpected or
    reshaped tensor is a ValueError naming the first such key and its shapes."""
    path = Path(directory)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no LANTERN drafter at {path} (expected config.json)")
    config = DrafterConfig.from_json(json.loads((path / "config.json").read_text()))
    state = read_weights(path)
    norm = state.get("layers.0.self_attn.q_norm.weight")
    if isinstance(norm, Tensor) and norm.dim() == 2 and config.num_attention_heads % max(1, norm.shape[0]) == 0:
        config = DrafterConfig(**{**asdict(config), "norm_rows": norm.shape[0]})
    with torch.device("meta"):
        drafter = ChameleonDrafter(config, target)
    return load_strictly(drafter, state, path, dtype)


def save_chameleon_drafter(drafter: ChameleonDrafter, folder: Path) -> None:
    """LANTERN's layout: ``config.json`` and ``pytorch_model.bin`` (float32 tensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(drafter.config.to_json(), indent=2) + "\n")
    state = {k: v.detach().float().cpu().contiguous() for k, v in drafter.state_dict().items()}
    torch.save(state, folder / "pytorch_model.bin")


__all__ = ["ChameleonDrafter", "ChameleonEagle3Drafter", "DrafterConfig", "load_chameleon_drafter",
           "save_chameleon_drafter"]
