"""LANTERN's published Eagle-1 drafter for LlamaGen (``jadohu/llamagen_drafter``: ``config.json`` and
``pytorch_model.bin``), with LANTERN's numerics and parameter names (spec section 7); implements
:class:`coolsd.core.interface.Drafter`.

Facts read from LANTERN's ``models/drafters/cnets_llamagen.py`` (class ``Model``) and ``models/ea_model_llamagen.py``:

* State dict (``Model`` is loaded with ``strict=True``): ``embed_tokens.weight`` [V, d] (its own table),
  ``fc.weight`` [d, 2d] and ``fc.bias`` [d] (config ``"bias"``, default true), and per decoder layer ``i``
  ``layers.i.self_attn.{q,k,v,o}_proj.weight`` (q/k/v biases only when the config has ``qkv_bias``),
  ``layers.i.mlp.{gate,up,down}_proj.weight``, ``layers.i.post_attention_layernorm.weight``, and
  ``layers.i.input_layernorm.weight`` for ``i >= 1`` only (layer 0 has no input norm). No final norm; the
  rotary buffers are non-persistent and the 2-D RoPE table is a plain attribute, so neither is in the file.
* Slot input: ``fc(cat([embed_tokens(x), feature]))``, the token embedding first.
* Decoder layer: ``h = x + attn(x)`` (layer 0; later layers normalise ``x`` first), then
  ``h + down(silu(gate(n)) * up(n))`` with ``n = post_attention_layernorm(h)`` (RMSNorm in float32, eps from
  the config: 1e-6), attention scaled by ``1/sqrt(head_dim)``.
* RoPE: LlamaGen's 2-D interleaved-pair rotations with base 10000 (forced by ``Model.__init__``), indexed by
  the drafter's own sequence index, whose table starts with ``cls_token_num`` = 119 zero rows for text models
  (0 for class models), i.e. ``P - 1``, then the grid, then 20 zero rows. The drafter's slot ``s`` holds the
  target's feature at position ``s`` and the token at ``s + 1``, so it is rotated by its *token's* grid cell;
  our engine passes ``s`` (the feature's target position) and this table is indexed by it directly.
* Attention: causal (a tree mask in the pending area) over everything the drafter has seen, the caption slots
  included, with no padding mask (``Model.forward`` builds an all-ones ``attention_mask``).
* The caption slots' inputs: LANTERN pairs every caption feature but the last with token id 0 (see
  :meth:`LanternDrafter.lead_inputs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache, kv_cache
from .config import ModelConfig
from .gpt import RMSNorm, RotaryTable, apply_rope, attention_mask, init_weights

ROPE_BASE = 10000.0  # Model.__init__ sets config.rope_base = 10000 for every input type
TAIL_ZERO_ROWS = 20  # precompute_freqs_cis_2d appends 10 zero rows, Model.__init__ 10 more
CAPTION_TOKEN = 0  # the token id LANTERN feeds at caption slots 0..P-2 (a zero-filled input_ids prefix)
# input_type -> (image tokens, zero rows of the drafter's RoPE table) that Model.__init__ hard-codes. We take
# the grid and P from the target's config instead (the same numbers for the target the drafter was trained on),
# and check only the kind: t2i/t2i2 drafters need a text-conditioned target, c2i a class-conditioned one.
INPUT_TYPES = {"c2i": (576, 0), "t2i": (256, 119), "t2i2": (1024, 119)}


@dataclass(frozen=True)
class LanternConfig:
    """The fields of LANTERN's drafter ``config.json`` (a Hugging Face Llama config) that shape the model;
    the published LlamaGen text-to-image drafter is the default."""

    hidden_size: int = 1280
    intermediate_size: int = 3584
    num_attention_heads: int = 20
    num_hidden_layers: int = 1
    vocab_size: int = 16384
    rms_norm_eps: float = 1e-6
    bias: bool = True  # fc's bias (EaModel reads con["bias"], default True)
    qkv_bias: bool = False  # q/k/v biases (LlamaAttention, only when the config has the field)
    input_type: str | None = "t2i"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, meta: dict) -> LanternConfig:
        """Read a LANTERN drafter ``config.json`` (as a dict); what our implementation cannot reproduce is a
        ValueError (fields that do not change the numerics, e.g. ``pretraining_tp`` or ``rope_scaling``, which
        LANTERN's drafter never uses, are ignored)."""
        if not isinstance(meta, dict):  # a malformed file is a ValueError, as every other loader error
            kind = type(meta).__name__
            raise ValueError(f"a LANTERN drafter config must be a JSON object, got {kind}")  # noqa: TRY004
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [name for name in required if name not in meta]
        if missing:
            raise ValueError(f"LANTERN drafter config.json lacks {', '.join(missing)}")
        if meta.get("hidden_act", "silu") != "silu":
            raise ValueError(f"LANTERN drafter config: hidden_act must be 'silu', got {meta['hidden_act']!r}")
        kv_heads = meta.get("num_key_value_heads")
        if kv_heads is not None and kv_heads != meta["num_attention_heads"]:
            raise ValueError(f"LANTERN drafter config: grouped-query attention (num_key_value_heads={kv_heads}, "
                             f"num_attention_heads={meta['num_attention_heads']}) is not supported")
        known = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in meta.items() if k in known})
        if config.input_type is not None and config.input_type not in INPUT_TYPES:
            raise ValueError(f"LANTERN drafter config: input_type must be one of {', '.join(INPUT_TYPES)}, "
                             f"got {config.input_type!r}")
        if config.hidden_size % config.num_attention_heads or config.head_dim % 4:
            raise ValueError(f"LANTERN drafter config: hidden_size={config.hidden_size} must split into "
                             f"{config.num_attention_heads} heads of a size divisible by 4")
        if config.num_hidden_layers < 1:
            raise ValueError(f"LANTERN drafter config: num_hidden_layers must be >= 1, got {config.num_hidden_layers}")
        return config

    @classmethod
    def for_target(cls, target: ModelConfig, **overrides) -> LanternConfig:
        """The drafter shape LANTERN trains for a LlamaGen target: its width, heads, vocabulary, SwiGLU size."""
        input_type = "c2i" if not target.text_conditioned else ("t2i2" if target.image_tokens == 1024 else "t2i")
        base = cls(hidden_size=target.dim, intermediate_size=target.ffn_dim, num_attention_heads=target.n_head,
                   vocab_size=target.vocab_size, input_type=input_type)
        return replace(base, **overrides)


class LanternAttention(nn.Module):
    """Llama attention with separate q/k/v/o projections and LlamaGen's 2-D RoPE."""

    def __init__(self, config: LanternConfig) -> None:
        super().__init__()
        dim, bias = config.hidden_size, config.qkv_bias
        self.n_head, self.head_dim = config.num_attention_heads, config.head_dim
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        rows, length, _ = x.shape
        shape = (rows, length, self.n_head, self.head_dim)
        q = apply_rope(self.q_proj(x).view(shape), rope).transpose(1, 2)  # (rows, H, T, D)
        k = apply_rope(self.k_proj(x).view(shape), rope).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        if cache is not None:
            k, v = cache.write(layer, k, v, offset)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=cache is None and mask is None)
        return self.o_proj(y.transpose(1, 2).reshape(rows, length, -1))


class LanternMLP(nn.Module):
    def __init__(self, config: LanternConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LanternLayer(nn.Module):
    """LANTERN's ``LlamaDecoderLayer``: layer 0 has no ``input_layernorm``."""

    def __init__(self, config: LanternConfig, index: int) -> None:
        super().__init__()
        if index:
            self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LanternAttention(config)
        self.mlp = LanternMLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.index = index

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], cache: KVCache | None, offset: int, mask: Tensor | None) -> Tensor:
        attn_in = self.input_layernorm(x) if self.index else x
        h = x + self.self_attn(attn_in, rope, cache, self.index, offset, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


def lantern_rope(target: ModelConfig) -> RotaryTable:
    """LANTERN's drafter RoPE table: ``P - 1`` zero rows (119 for LlamaGen's text model, 0 for a class model),
    the target's grid at base 10000, then 20 zero rows; always built on the CPU (also under a meta-device
    context), in float32, moved to the positions' device on first use."""
    with torch.device("cpu"):
        rope = RotaryTable(replace(target, rope_base=ROPE_BASE), target.prefix_length - 1)
        rope.table = torch.cat([rope.table, torch.zeros(TAIL_ZERO_ROWS, *rope.table.shape[1:])])
    return rope


class LanternDrafter(nn.Module):
    """LANTERN's Eagle-1 drafter for a LlamaGen target. Parameter names are those of the published state dict
    (see the module docstring), so ``state_dict()`` and the file agree key for key.

    Engine contract: ``forward(inputs, features, positions, ...)`` with ``positions`` the target position of
    each feature, which is also the index into LANTERN's RoPE table; the drafter cache never carries a
    padding mask, so every caption slot is visible. At the prefill, the caption slots ``0..P-2`` must be fed
    :meth:`lead_inputs` (token id 0's embedding), not the target's prefix embeddings."""

    def __init__(self, config: LanternConfig, target: ModelConfig) -> None:
        super().__init__()
        if config.hidden_size != target.dim:
            raise ValueError(f"LANTERN drafter width {config.hidden_size} != target width {target.dim}")
        if config.vocab_size != target.vocab_size:
            raise ValueError(f"LANTERN drafter vocabulary {config.vocab_size} != target vocabulary {target.vocab_size}")
        if config.input_type is not None and (config.input_type != "c2i") != target.text_conditioned:
            kind = "text" if target.text_conditioned else "class"
            raise ValueError(f"LANTERN drafter input_type {config.input_type!r} does not fit a {kind}-conditioned "
                             "target")
        self.config = config
        self.target_config = target
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LanternLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.bias)
        self.rope = lantern_rope(target)
        self.apply(init_weights)

    target_layers: tuple[int, ...] = ()  # it reads the target's final-normed features

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        """Draft logits: the target's ``head`` on the predicted features."""
        return head(features)

    def share_embedding(self, target: nn.Module) -> LanternDrafter:
        """A no-op: LANTERN's drafter embeds tokens with its own ``embed_tokens`` table (spec section 7: in the
        published file it equals the target's output matrix, not its input table), part of its own weights. Present
        because ``Bundle`` hands every drafter its target's table."""
        return self

    def embed(self, tokens: Tensor) -> Tensor:
        return self.embed_tokens(tokens)

    def lead_inputs(self, prefix_embeds: Tensor) -> Tensor:
        """The next-input embeddings of prefix slots ``0..P-2`` at the prefill, (rows, P-1, dim), from the
        target's prefix embeddings (rows, P, dim), of which only the shape is used: LANTERN pairs each of these
        caption features with token id 0 (``EaModel.initialize_tree`` builds ``input_ids`` as 120 zeros + the
        first token and ``topK_genrate`` drops the first; training pads the same way), then the last slot with
        the first image token."""
        rows, length = prefix_embeds.shape[:2]
        ids = torch.full((max(length - 1, 0),), CAPTION_TOKEN, dtype=torch.long, device=self.embed_tokens.weight.device)
        return self.embed_tokens(ids)[None].expand(rows, -1, -1).to(prefix_embeds.dtype)

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p = self.fc.weight
        return kv_cache(len(self.layers), rows, self.config.num_attention_heads, self.config.head_dim, max_len,
                        p.device, p.dtype, images)

    def forward(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: KVCache | None = None,
                offset: int = 0, mask: Tensor | None = None) -> Tensor:
        """Without a cache: causal over the given slots (or ``mask`` (T, T) if given). With one: every committed
        entry plus ``mask`` over the pending area (None: a single slot, which sees everything)."""
        x = self.fc(torch.cat([inputs.to(features.dtype), features], dim=-1))
        rope = self.rope(positions)
        full_mask = attention_mask(cache, mask, x.shape[1], offset=offset) if cache is not None else mask
        for layer in self.layers:
            x = layer(x, rope, cache, offset, full_mask)
        return x


def state_problems(module: nn.Module, state: dict) -> list[str]:
    """Differences between a module's state dict and a loaded one, module order first: missing, reshaped,
    then unexpected keys, each with its shapes."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    problems = []
    for key, shape in expected.items():
        if key not in state:
            problems.append(f"missing {key} (expected shape {list(shape)})")
        elif not isinstance(state[key], Tensor):
            problems.append(f"{key} is a {type(state[key]).__name__}, not a tensor (expected shape {list(shape)})")
        elif tuple(state[key].shape) != shape:
            problems.append(f"{key} has shape {list(state[key].shape)}, expected {list(shape)}")
    for key, value in state.items():
        if key not in expected:
            shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
            problems.append(f"unexpected {key} (shape {shape})")
    return problems


def read_weights(path: Path) -> dict:
    """``pytorch_model.bin`` (tried first, as LANTERN does) or ``model.safetensors``, on the CPU."""
    bin_path, st_path = path / "pytorch_model.bin", path / "model.safetensors"
    if bin_path.exists():
        state = torch.load(bin_path, map_location="cpu", weights_only=True)
    elif st_path.exists():
        from safetensors.torch import load_file
        state = load_file(st_path)
    else:
        raise FileNotFoundError(f"no LANTERN drafter weights in {path} "
                                "(expected pytorch_model.bin or model.safetensors)")
    if not isinstance(state, dict):  # a malformed file is a ValueError, as every other loader error
        kind = type(state).__name__
        raise ValueError(f"LANTERN drafter weights in {path} are a {kind}, not a state dict")  # noqa: TRY004
    return state


def load_lantern_drafter(directory: str | Path, target_config: ModelConfig,
                         dtype: torch.dtype | None = torch.float32) -> LanternDrafter:
    """A LANTERN drafter directory (``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``) for a
    target of shape ``target_config``, on the CPU in ``dtype`` (None: the file's). Strict: a missing,
    unexpected or reshaped tensor is a ValueError naming the first such key and its shapes."""
    path = Path(directory)
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no LANTERN drafter at {path} (expected config.json)")
    config = LanternConfig.from_json(json.loads(config_path.read_text()))
    state = read_weights(path)
    with torch.device("meta"):
        drafter = LanternDrafter(config, target_config)
    return load_strictly(drafter, state, path, dtype)


def load_strictly(drafter: nn.Module, state: dict, path: Path, dtype: torch.dtype | None) -> nn.Module:
    """``state`` into the meta-built ``drafter`` (cast to ``dtype``; None: the file's), or a ValueError naming the
    first missing, unexpected or reshaped tensor of the files in ``path``."""
    problems = state_problems(drafter, state)
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else ""
        raise ValueError(f"LANTERN drafter weights in {path} do not fit: {problems[0]}{more}")
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    drafter.load_state_dict(state, strict=True, assign=True)
    return drafter.eval()


__all__ = ["CAPTION_TOKEN", "ROPE_BASE", "LanternConfig", "LanternDrafter", "load_lantern_drafter"]
