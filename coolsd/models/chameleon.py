"""Chameleon-family targets (Lumina-mGPT, Anole) from their Hugging Face files, with the official numerics
(spec section 10); implements :class:`coolsd.core.interface.Target`.

Facts read from transformers' ``models/chameleon/modeling_chameleon.py`` and Lumina-mGPT's fork of it
(``lumina_mgpt/model/chameleon/modeling_chameleon.py``):

* Pre-norm decoder layers: ``h = x + o_proj(attn(input_layernorm(x)))``, then
  ``h + down_proj(silu(gate_proj(n)) * up_proj(n))`` with ``n = post_attention_layernorm(h)``; a final
  ``model.norm``; an untied ``lm_head``. RMSNorm normalises in float32, casts back, then scales.
* Queries and keys pass a LayerNorm over the head dimension (eps 1e-5, statistics only) scaled and shifted
  per head: ``q_norm.weight`` / ``bias`` are (heads, head_dim) in transformers' layout and
  (model_parallel_size, head_dim) in Lumina-mGPT's, each row repeated over ``heads / rows`` heads; then
  rotate-half RoPE (theta from the config, 1e4), cos/sin computed in float32 and cast to the activations'
  dtype; attention scaled by ``1/sqrt(head_dim)``.
* ``swin_norm`` (norms after attention and MLP) is false for these checkpoints and refused here.
* The shards may carry the VQ encoder (``model.vqmodel.*``); an image generator does not use it.

Guidance (LANTERN's parallel CFG, ``models/ea_model_lumina_mgpt.py``): both rows share one sequence of ``P``
prefix slots; each row's real tokens sit at its end after padding slots (no key for anyone), and each row's
RoPE positions are shifted by its padding count, so the conditional prompt starts at 0 and the
unconditional context (image-start and size tokens for Lumina-mGPT, BOS and image-start for Anole) sits at
0, 1, 2 as in the official samplers. The shift is read from the key validity the cache holds. Features of
padding slots are returned as zeros (LANTERN's drafter sees the unconditional row zero-padded), which is how
the drafter of :mod:`coolsd.models.chameleon_drafter` recognises them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.interface import PositionRules, Prefix
from ..core.memory import available_memory
from ..core.params import shorten
from .cache import KVCache, kv_cache
from .gpt import RMSNorm, additive, attention_mask

IMAGE_START, IMAGE_END, NEWLINE, SIZE_BASE, SEPARATOR = 8197, 8196, 8803, 8804, 8710
LAYOUTS = ("lumina", "anole")
VQ_DOWNSAMPLE = 16  # the Chameleon VQGAN: one code per 16 x 16 pixels
IGNORED_PREFIXES = ("model.vqmodel.",)


@dataclass(frozen=True)
class ChameleonConfig:
    """The shape of a Chameleon decoder (the fields of its ``config.json`` that shape it) and the image layout.
    It also answers what the bundle, the command line and the trainer ask any target's config."""

    vocab_size: int = 65536
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    ffn_dim: int = 11008
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    qk_norm_rows: int = 32  # rows of q_norm / k_norm in the files: heads, or model_parallel_size
    bos_id: int = 0
    pad_id: int = 1
    image_size: int = 768
    layout: str = "lumina"
    prefix_slots: int = 256

    num_classes = 0
    text_conditioned = True
    caption_dim = 0

    def __post_init__(self) -> None:
        if self.dim % self.n_head or (self.dim // self.n_head) % 2:
            raise ValueError(f"hidden_size={self.dim} must split into {self.n_head} heads of an even size")
        if self.n_head % self.qk_norm_rows:
            raise ValueError(f"q_norm rows {self.qk_norm_rows} must divide the {self.n_head} heads")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {shorten(self.layout)}")
        if self.image_size % (2 * VQ_DOWNSAMPLE) or not 32 <= self.image_size <= 2048:
            raise ValueError(f"image_size must be a multiple of 32 from 32 to 2048 px, got {shorten(self.image_size)}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def grid_height(self) -> int:
        """VQ codes per image column (48 at 768 px)."""
        return self.image_size // VQ_DOWNSAMPLE

    grid_width = grid_height

    @property
    def image_tokens(self) -> int:
        """Generated positions, structural ones included: rows closed by newlines, then end-of-image (Lumina-mGPT),
        or the bare grid (Anole)."""
        side = self.grid_height
        return side * (side + 1) + 1 if self.layout == "lumina" else side * side

    @property
    def prefix_length(self) -> int:
        return self.prefix_slots

    cls_token_num = prefix_length

    def image_start(self) -> list[int]:
        """What the prefix ends with: image-start and the two size tokens (Lumina-mGPT: ``8804 + px / 32`` each,
        from ``item_processor.get_n_grids_token``), or the separator and image-start (Anole, as LANTERN runs it)."""
        if self.layout == "lumina":
            size = SIZE_BASE + self.image_size // 32
            return [IMAGE_START, size, size]
        return [SEPARATOR, IMAGE_START]

    def unconditional(self) -> list[int]:
        """The unconditional context (spec section 10): image-start and size tokens (Lumina-mGPT's sampler
        takes ``input_ids[image_start_index:]``), or BOS and image-start (LANTERN's Anole)."""
        return self.image_start() if self.layout == "lumina" else [self.bos_id, IMAGE_START]

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


HF_FIELDS = {"hidden_size": "dim", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
             "intermediate_size": "ffn_dim", "vocab_size": "vocab_size", "rms_norm_eps": "norm_eps"}


def config_from_hf(meta: dict, image_size: int = 768, layout: str = "lumina", prefix_slots: int = 256,
                   vocabulary: dict[str, int] | None = None) -> ChameleonConfig:
    """Our config from a Chameleon ``config.json`` (as a dict); a setting our forward cannot reproduce is a
    ValueError naming it. BOS and padding are the vocabulary's ``<s>`` and ``<pad>`` (0 and 1 in Chameleon's,
    as LANTERN's Anole sampler writes them), not ``config.json``'s ``bos_token_id``, which disagrees."""
    missing = [key for key in HF_FIELDS if key not in meta]
    if missing:
        raise ValueError(f"Chameleon config.json lacks {', '.join(missing)}")
    checks = [("swin_norm", False), ("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"),
              ("tie_word_embeddings", False)]
    for key, wanted in checks:
        if meta.get(key, wanted) != wanted:
            raise ValueError(f"Chameleon config: {key}={meta[key]!r} is not supported (only {wanted!r})")
    heads, kv_heads = meta["num_attention_heads"], meta.get("num_key_value_heads") or meta["num_attention_heads"]
    if kv_heads != heads:
        raise ValueError(f"Chameleon config: grouped-query attention (num_key_value_heads={kv_heads}, "
                         f"num_attention_heads={heads}) is not supported")
    rope = meta.get("rope_parameters") or {}
    if meta.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise ValueError("Chameleon config: RoPE scaling is not supported")
    theta = float(rope.get("rope_theta", meta.get("rope_theta", 10000.0)))
    values = {ours: meta[theirs] for theirs, ours in HF_FIELDS.items()}
    rows = int(heads)  # transformers' layout; the files' own row count is read by load_chameleon
    vocabulary = vocabulary or {}
    return ChameleonConfig(**values, rope_theta=theta, qk_norm_rows=rows, bos_id=int(vocabulary.get("<s>", 0)),
                           pad_id=int(vocabulary.get("<pad>", 1)), image_size=image_size, layout=layout,
                           prefix_slots=prefix_slots)


# ---------------------------------------------------------------------------------------------------------------
# Conditions and position rules

@dataclass(frozen=True, eq=False)
class ChameleonPrompt:
    """A prompt turned into the conditional prefix's token ids (BOS, template, separator, image start)."""

    tokens: tuple[int, ...]
    text: str = ""

    def describe(self) -> dict:
        return {"caption": self.text, "prompt_tokens": len(self.tokens)}

    def __repr__(self) -> str:
        return f"ChameleonPrompt({self.text!r}, {len(self.tokens)} tokens)"


def image_ids(vocabulary: dict[str, int]) -> dict[int, int]:
    """Token id -> VQGAN code from the vocabulary's image-token names (``IMGIMG`` + the code's digits written
    as letters A-J, one closing letter; transformers' ``ChameleonImageVocabularyMapping.bpe2img``)."""
    digits = {chr(ord("A") + i): str(i) for i in range(10)}
    table = {}
    for name, token in vocabulary.items():
        if name.startswith("IMGIMG"):
            table[int(token)] = int("".join(digits.get(c, c) for c in name[len("IMGIMG"):-1]))
    if not table:
        raise ValueError("the vocabulary has no IMGIMG image tokens")
    return table


def position_rules(config: ChameleonConfig, image_tokens: list[int]) -> PositionRules:
    """Per generated position, what may be drawn (spec section 8): image codes; a newline closing each row and
    end-of-image last (Lumina-mGPT's ``MultiModalLogitsProcessor``: a newline where ``(t + 1) % (w + 1) == 0``,
    end-of-image at ``t = (w + 1) h``); Anole's grid is image codes throughout."""
    side, total = config.grid_height, config.image_tokens
    allowed = torch.zeros(3, config.vocab_size, dtype=torch.bool)
    allowed[0, image_tokens] = True
    allowed[1, NEWLINE] = True
    allowed[2, IMAGE_END] = True
    t = torch.arange(total)
    kinds = torch.zeros(total, dtype=torch.long)
    if config.layout == "lumina":
        kinds[(t + 1) % (side + 1) == 0] = 1
        kinds[-1] = 2
    return PositionRules(kinds, allowed)


# ---------------------------------------------------------------------------------------------------------------
# The network

class HeadNorm(nn.Module):
    """LayerNorm over the head dimension, statistics only, then each head's scale and shift; the parameters
    keep the file's shape (rows, head_dim), each row serving ``heads / rows`` consecutive heads."""

    def __init__(self, rows: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(rows, head_dim))
        self.bias = nn.Parameter(torch.zeros(rows, head_dim))
        self.repeat = heads // rows

    def forward(self, x: Tensor) -> Tensor:
        """(..., heads, head_dim)."""
        weight, bias = self.weight, self.bias
        if self.repeat > 1:
            weight, bias = weight.repeat_interleave(self.repeat, 0), bias.repeat_interleave(self.repeat, 0)
        return F.layer_norm(x, (x.shape[-1],), None, None, eps=1e-5) * weight + bias


def rope_inverse_frequencies(head_dim: int, theta: float) -> Tensor:
    """transformers' default RoPE frequencies, in float32 on the CPU."""
    with torch.device("cpu"):
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary:
    """cos/sin of rotate-half RoPE for (rows, T) positions, computed in float32 and cast to the activations'
    dtype (transformers' ``ChameleonRotaryEmbedding``). Not a buffer, so a bf16 cast leaves it exact."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.inv_freq = rope_inverse_frequencies(head_dim, theta)

    def __call__(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (rows, 1, T, D): broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)


class ChameleonAttention(nn.Module):
    def __init__(self, dim: int, heads: int, norm_rows: int, in_dim: int | None = None) -> None:
        """``in_dim``: the input's width (default ``dim``; an EAGLE-3 head reads two features side by side)."""
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(in_dim or dim, dim, bias=False)
        self.k_proj = nn.Linear(in_dim or dim, dim, bias=False)
        self.v_proj = nn.Linear(in_dim or dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.q_norm = HeadNorm(norm_rows, heads, self.head_dim)
        self.k_norm = HeadNorm(norm_rows, heads, self.head_dim)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        rows, length, _ = x.shape
        shape = (rows, length, self.heads, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(shape)).transpose(1, 2)  # (rows, H, T, D)
        k = self.k_norm(self.k_proj(x).view(shape)).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = rope
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.write(layer, k, v, offset)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=cache is None and mask is None)
        return self.o_proj(y.transpose(1, 2).reshape(rows, length, -1))


class ChameleonMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ChameleonLayer(nn.Module):
    """A pre-norm Chameleon decoder layer (``swin_norm`` false), also the drafter's layer."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float, norm_rows: int) -> None:
        super().__init__()
        self.self_attn = ChameleonAttention(dim, heads, norm_rows)
        self.mlp = ChameleonMLP(dim, hidden)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], cache: KVCache | None, layer: int, offset: int,
                mask: Tensor | None) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, offset, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


def padding_counts(cache: KVCache | None, valid: Tensor | None, rows: int, device: torch.device,
                   prefix: int) -> Tensor:
    """Each row's padding slots (rows,): the prefix keys marked invalid in the cache, else in ``valid``, else
    none."""
    if cache is not None and cache.valid is not None:
        return (~cache.valid[:, :prefix]).sum(-1)
    if valid is not None:
        return (~valid).sum(-1)
    return torch.zeros(rows, dtype=torch.long, device=device)


def shifted(positions: Tensor, pads: Tensor) -> Tensor:
    """Each row's RoPE positions (rows, T): the sequence positions (shared (T,), or per row (rows, T)) less the
    row's padding count; padding slots themselves (negative) are clamped to 0, their values being seen by no one."""
    return (positions - pads[:, None]).clamp_min(0)


class ChameleonBody(nn.Module):
    """``model.*`` of the Hugging Face checkpoint: embeddings, layers, final norm."""

    def __init__(self, cfg: ChameleonConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(ChameleonLayer(cfg.dim, cfg.n_head, cfg.ffn_dim, cfg.norm_eps, cfg.qk_norm_rows)
                                    for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class ChameleonTarget(nn.Module):
    """The target: ``P`` prefix slots (a left-padded prompt), then generated position ``t`` at ``P + t``
    (spec sections 7, 8, 10). Parameter names are the Hugging Face checkpoint's (``model.*``, ``lm_head``)."""

    def __init__(self, cfg: ChameleonConfig, image_tokens: list[int] | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = ChameleonBody(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta)
        self.image_token_ids = sorted(image_tokens) if image_tokens is not None else list(range(4, 8196))
        with torch.device("cpu"):
            self.position_rules = position_rules(cfg, self.image_token_ids)

    prefix_length = property(lambda self: self.config.prefix_length)
    image_tokens = property(lambda self: self.config.image_tokens)
    vocab_size = property(lambda self: self.config.vocab_size)
    device = property(lambda self: self.lm_head.weight.device)
    output = property(lambda self: self.lm_head)  # what the trainer asks of a target's head

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> KVCache:
        p, cfg = self.lm_head.weight, self.config
        return kv_cache(cfg.n_layer, rows, cfg.n_head, cfg.head_dim, max_len, p.device, p.dtype, images)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache | None = None, offset: int = 0,
                mask: Tensor | None = None, valid: Tensor | None = None,
                taps: tuple[int, ...] = ()) -> Tensor | tuple[Tensor, Tensor]:
        """Embedded inputs ``x`` (rows, T, dim) at sequence ``positions`` (T,) -> final-normed features, zero at
        padding slots (``valid`` False). As :class:`coolsd.models.gpt.Transformer`: causal without a cache,
        ``mask`` over the pending area with one; ``valid`` is remembered by the cache; ``taps`` also returns
        those layers' inputs, concatenated (zero at padding slots too)."""
        if cache is not None and valid is not None:
            cache.mark_valid(valid, offset)
        pads = padding_counts(cache, valid, x.shape[0], x.device, self.config.prefix_length)
        rope = self.rope(shifted(positions, pads), x.dtype)
        full_mask = additive(attention_mask(cache, mask, x.shape[1], valid, offset), x.dtype)
        tapped = []
        for layer, block in enumerate(self.model.layers):
            if layer in taps:
                tapped.append(x)
            x = block(x, rope, cache, layer, offset, full_mask)
        outputs = [self.model.norm(x), *([torch.cat(tapped, -1)] if taps else [])]
        if valid is not None:
            outputs = [out * valid[..., None].to(out.dtype) for out in outputs]
        return tuple(outputs) if taps else outputs[0]

    def logits(self, features: Tensor) -> Tensor:
        """float32 logits over the whole vocabulary (no text-generation masking of image tokens)."""
        return self.lm_head(features).float()

    def embed(self, tokens: Tensor) -> Tensor:
        return self.model.embed_tokens(tokens)

    def prefix_tokens(self, condition: ChameleonPrompt, rows: int) -> tuple[Tensor, Tensor]:
        """Token ids (rows, P) and validity (rows, P): the prompt, then the unconditional context, each at the end
        of its row after padding slots."""
        cfg = self.config
        if not isinstance(condition, ChameleonPrompt):
            raise ValueError(f"this Chameleon model needs a prompt, got {shorten(condition)}")
        if len(condition.tokens) > cfg.prefix_slots:
            raise ValueError(f"prompt has {len(condition.tokens)} tokens with its template, at most "
                             f"{cfg.prefix_slots} fit (prefix_slots); shorten the prompt")
        ids = torch.full((rows, cfg.prefix_slots), cfg.pad_id, dtype=torch.long)
        valid = torch.zeros(rows, cfg.prefix_slots, dtype=torch.bool)
        for row, tokens in enumerate([list(condition.tokens), cfg.unconditional()][:rows]):
            ids[row, cfg.prefix_slots - len(tokens):] = torch.tensor(tokens)
            valid[row, cfg.prefix_slots - len(tokens):] = True
        return ids.to(self.device), valid.to(self.device)

    def prefix(self, condition: ChameleonPrompt, rows: int) -> Prefix:
        ids, valid = self.prefix_tokens(condition, rows)
        return Prefix(self.embed(ids), valid)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------------------------
# Text: the prompt template and the tokenizer

class PromptEncoder:
    """Prompts -> :class:`ChameleonPrompt`: BOS, the template's text with the prompt (its separator token
    included, e.g. Lumina-mGPT's ``<reserved08706>``), then the layout's image-start tokens, as LANTERN builds
    the conditional input. The tokenizer is the model directory's (``transformers.AutoTokenizer``)."""

    def __init__(self, tokenizer, config: ChameleonConfig, template: str) -> None:
        if "{prompt}" not in template:
            raise ValueError(f"prompt_template must contain {{prompt}}, got {shorten(template)}")
        self.tokenizer, self.config, self.template = tokenizer, config, template

    def encode(self, prompt: str) -> ChameleonPrompt:
        text = self.template.replace("{prompt}", prompt)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        tokens = [self.config.bos_id, *ids, *self.config.image_start()]
        return ChameleonPrompt(tuple(int(t) for t in tokens), prompt)

    def __call__(self, prompts: list[str]) -> list[ChameleonPrompt]:
        return [self.encode(p) for p in prompts]


def load_tokenizer(directory: Path):
    """The text tokenizer of a Chameleon model directory (``tokenizer.json`` and its config)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(directory))


def read_vocabulary(directory: Path, meta: dict) -> dict[str, int]:
    """The vocabulary names: ``vocabulary_map`` of ``config.json``, else ``tokenizer.json``'s model vocabulary."""
    if meta.get("vocabulary_map"):
        return meta["vocabulary_map"]
    path = directory / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{directory} has neither a vocabulary_map in config.json nor tokenizer.json")
    return json.loads(path.read_text())["model"]["vocab"]


# ---------------------------------------------------------------------------------------------------------------
# Loading the Hugging Face shards: strictly, lazily, after checking the memory

def shard_files(directory: Path) -> list[Path]:
    """The safetensors shards of a model directory: those its ``model.safetensors.index.json`` names, or the
    single ``model.safetensors``."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / name for name in names]
    if (directory / "model.safetensors").exists():
        return [directory / "model.safetensors"]
    raise FileNotFoundError(f"no safetensors weights in {directory} (expected model.safetensors.index.json or "
                            "model.safetensors)")


def file_shapes(shards: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Every tensor's shape and shard, read from the shard headers (no weights are read)."""
    from safetensors import safe_open
    found = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                found[key] = (tuple(f.get_slice(key).get_shape()), shard)
    return found


def check_keys(model: nn.Module, found: dict[str, tuple[tuple[int, ...], Path]]) -> None:
    """The file's keys and shapes against the model's: the first missing key, the first unexpected one, or the
    first key whose shape differs (both shapes named) is a ValueError."""
    expected = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    present = {key: shape for key, (shape, _) in found.items() if not key.startswith(IGNORED_PREFIXES)}
    missing = [key for key in expected if key not in present]
    unexpected = [key for key in present if key not in expected]
    if missing or unexpected:
        parts = ([f"missing key {missing[0]} (the files lack it)"] if missing else []) + \
                ([f"unexpected key {unexpected[0]} (the model has no such tensor)"] if unexpected else [])
        raise ValueError(f"Chameleon weights do not match the model: {'; '.join(parts)} "
                         f"({len(missing)} missing, {len(unexpected)} unexpected in all)")
    for key, shape in expected.items():
        if present[key] != shape:
            raise ValueError(f"{key}: file has {list(present[key])}, model expects {list(shape)}")


def memory_needed(cfg: ChameleonConfig, dtype: torch.dtype, rows: int = 2, tree_nodes: int = 64) -> dict[str, int]:
    """Bytes the target needs: weights, and the KV cache of ``rows`` guidance rows over prefix, image and a draft
    tree (computed from the shape, not measured)."""
    width = torch.finfo(dtype).bits // 8
    weights = parameter_count(meta_target(cfg))
    length = cfg.prefix_length + cfg.image_tokens + tree_nodes
    cache = 2 * cfg.n_layer * rows * length * cfg.dim
    return {"weights": weights * width, "cache": cache * width, "parameters": weights}


def check_memory(cfg: ChameleonConfig, device: torch.device, dtype: torch.dtype) -> dict[str, int]:
    """Say what the model needs before loading it, and refuse (one line) on a device that cannot hold it."""
    need = memory_needed(cfg, dtype)
    total, free = need["weights"] + need["cache"], available_memory(device)
    gb = lambda n: f"{n / 1e9:.1f} GB"  # noqa: E731
    print(f"Chameleon target: {need['parameters']:,} parameters; needs about {gb(total)} on {device} "
          f"({gb(need['weights'])} weights in {str(dtype).removeprefix('torch.')}, {gb(need['cache'])} KV cache); "
          f"{gb(free)} available", file=sys.stderr, flush=True)
    if total > free:
        raise MemoryError(f"this model needs about {gb(total)} on {device}, only {gb(free)} is available: use a "
                          "device with more memory")
    return need


def load_weights(model: nn.Module, found: dict, dtype: torch.dtype, device: torch.device, progress: bool) -> None:
    """Read the tensors shard by shard into the meta-built ``model`` (each one cast and moved as it is read, so
    the weights are held once), with a progress bar."""
    from huggingface_hub.utils import tqdm
    from safetensors import safe_open

    params = dict(model.named_parameters())
    by_shard: dict[Path, list[str]] = {}
    for key, (_, shard) in found.items():
        if key in params:
            by_shard.setdefault(shard, []).append(key)
    bar = tqdm(total=len(params), desc="loading Chameleon weights", unit="tensor", disable=not progress)
    for shard, keys in by_shard.items():
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for key in keys:
                module_name, _, name = key.rpartition(".")
                module = model.get_submodule(module_name)
                tensor = f.get_tensor(key).to(device=device, dtype=dtype)
                setattr(module, name, nn.Parameter(tensor, requires_grad=False))
                bar.update()
    bar.close()


def load_chameleon(directory: str | Path, image_size: int = 768, layout: str = "lumina", prefix_slots: int = 256,
                   device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                   progress: bool = True) -> ChameleonTarget:
    """A Chameleon model directory (``config.json`` + safetensors shards, as published) as our target in eval
    mode, on ``device`` in ``dtype`` (default: bf16 on CUDA, float32 on the CPU)."""
    directory, device = Path(directory), torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    meta = json.loads((directory / "config.json").read_text())
    vocabulary = read_vocabulary(directory, meta)
    cfg = config_from_hf(meta, image_size, layout, prefix_slots, vocabulary)
    found = file_shapes(shard_files(directory))
    norm = found.get("model.layers.0.self_attn.q_norm.weight")
    if norm is not None and len(norm[0]) == 2 and norm[0][0] and cfg.n_head % norm[0][0] == 0:
        cfg = replace(cfg, qk_norm_rows=norm[0][0])  # one row per head, or Lumina-mGPT's model_parallel_size rows
    with torch.device("meta"):
        model = ChameleonTarget(cfg, list(image_ids(vocabulary)))
    check_keys(model, found)
    check_memory(cfg, device, dtype)
    load_weights(model, found, dtype, device, progress)
    return model.eval()


def meta_target(cfg: ChameleonConfig) -> ChameleonTarget:
    """A full-size target on the meta device (no memory), for counting parameters."""
    with torch.device("meta"):
        return ChameleonTarget(cfg)


# The published 7B shapes (Lumina-mGPT-7B-768 and Anole-7b config.json: Chameleon-7B's decoder).
CHAMELEON_7B = ChameleonConfig(vocab_size=65536, dim=4096, n_layer=32, n_head=32, ffn_dim=11008)

__all__ = ["CHAMELEON_7B", "ChameleonConfig", "ChameleonPrompt", "ChameleonTarget", "PromptEncoder",
           "config_from_hf", "image_ids", "load_chameleon", "position_rules"]
