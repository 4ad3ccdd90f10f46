"""LlamaGen GPT checkpoints into :class:`coolsd.models.gpt.Transformer` (spec section 7).

Two namings are read. *Official*: the state dict of LlamaGen's own ``Transformer`` (``tok_embeddings``,
``layers.N.attention.wqkv``, ``feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``, ``norm``, ``output``,
``cls_embedding.*``), which our model's names follow, as released in ``.pt`` files (``{"model": ...}`` and the
like). *Hugging Face*: the Llama-style renaming used by LANTERN's ``LlamaForCausalLM`` port (for instance
``jadohu/LlamaGen-T2I``'s ``model.safetensors``): ``model.embed_tokens``, ``model.layers.N.self_attn.q_proj /
k_proj / v_proj / o_proj``, ``mlp.gate_proj / up_proj / down_proj``, ``input_layernorm``,
``post_attention_layernorm``, ``model.norm``, ``lm_head``, ``model.cls_embedding.*``; ``wqkv`` is split by rows
into q, k, v there, with no RoPE permutation, so converting back is a row concatenation.

How LlamaGen's ``ModelArgs`` map onto :class:`ModelConfig` (read from LlamaGen's ``autoregressive/models/gpt.py``):

* SwiGLU width ``find_multiple(int(2 * 4 * dim / 3), multiple_of)`` = ``ModelConfig.ffn_dim``; LlamaGen's
  ``ffn_dim_multiplier`` (None in every released model) and grouped KV heads (``n_kv_head``, None) have no
  counterpart in our config and are refused when set.
* ``norm_eps`` (1e-5) and ``rope_base`` (10000) are carried over.
* The class table has ``num_classes + 1`` rows when ``class_dropout_prob > 0`` (the default 0.1, used by every
  released model), the extra row being the unconditional input; with 0 it has ``num_classes`` rows, which our
  model cannot hold, so that is refused.
* A text model's ``uncond_embedding`` buffer always has 120 rows in LlamaGen (``CaptionEmbedder``'s
  ``token_num`` default), ours ``cls_token_num``; they agree for the released models (``cls_token_num`` 120).
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .gpt import RotaryTable, Transformer

# LlamaGen's ModelArgs fields and their defaults (the ones that shape the network or its numerics).
MODEL_ARGS_DEFAULTS: dict = {
    "dim": 4096, "n_layer": 32, "n_head": 32, "n_kv_head": None, "multiple_of": 256, "ffn_dim_multiplier": None,
    "rope_base": 10000, "norm_eps": 1e-5, "num_classes": 1000, "caption_dim": 2048, "class_dropout_prob": 0.1,
    "model_type": "c2i", "vocab_size": 16384, "cls_token_num": 1, "block_size": 256,
}
# ModelArgs fields that only matter for training or for LlamaGen's own cache sizes: accepted and ignored.
IGNORED_ARGS = {"initializer_range", "token_dropout_p", "attn_dropout_p", "resid_dropout_p", "ffn_dropout_p",
                "drop_path_rate", "max_batch_size", "max_seq_len"}
REQUIRED_ARGS = ("dim", "n_layer", "n_head")


def _preset(dim: int, n_layer: int, n_head: int, grid: int, text: bool) -> dict:
    args = {"dim": dim, "n_layer": n_layer, "n_head": n_head, "vocab_size": 16384, "block_size": grid * grid}
    if text:
        return {**args, "model_type": "t2i", "cls_token_num": 120, "caption_dim": 2048}
    return {**args, "model_type": "c2i", "cls_token_num": 1, "num_classes": 1000}


# The released LlamaGen GPTs (LlamaGen README and GPT_models: B 12x768/12 heads, L 24x1024/16, XL 36x1280/20;
# VQ-16 codes, so 256 px is a 16x16 grid, 384 px 24x24, 512 px 32x32).
LLAMAGEN_ARGS: dict[str, dict] = {
    "t2i-xl-stage1-256": _preset(1280, 36, 20, 16, text=True),
    "t2i-xl-stage2-512": _preset(1280, 36, 20, 32, text=True),
    "c2i-b-256": _preset(768, 12, 12, 16, text=False),
    "c2i-b-384": _preset(768, 12, 12, 24, text=False),
    "c2i-l-256": _preset(1024, 24, 16, 16, text=False),
    "c2i-l-384": _preset(1024, 24, 16, 24, text=False),
    "c2i-xl-256": _preset(1280, 36, 20, 16, text=False),  # no released checkpoint at 256 px (README: XL at 384)
    "c2i-xl-384": _preset(1280, 36, 20, 24, text=False),
}


def config_from_args(model_args: dict) -> ModelConfig:
    """Our config for a LlamaGen GPT described by its ``ModelArgs`` fields (missing ones take LlamaGen's
    defaults, except ``dim``, ``n_layer`` and ``n_head``, which are required); raises ValueError for a field we
    do not know or a setting our model cannot reproduce exactly."""
    unknown = sorted(set(model_args) - set(MODEL_ARGS_DEFAULTS) - IGNORED_ARGS)
    if unknown:
        raise ValueError(f"unknown LlamaGen model_args field(s): {', '.join(unknown)}")
    missing = [key for key in REQUIRED_ARGS if key not in model_args]
    if missing:
        raise ValueError(f"model_args lacks {', '.join(missing)}")
    args = {**MODEL_ARGS_DEFAULTS, **model_args}
    model_type = args["model_type"]
    if model_type not in ("c2i", "t2i"):
        raise ValueError(f"model_type must be 'c2i' or 't2i', got {model_type!r}")
    if args["n_kv_head"] is not None and int(args["n_kv_head"]) != int(args["n_head"]):
        raise ValueError(f"n_kv_head={args['n_kv_head']} (grouped keys/values) is not supported: n_kv_head must "
                         f"be unset or equal n_head={args['n_head']}")
    if args["ffn_dim_multiplier"] is not None:
        raise ValueError(f"ffn_dim_multiplier={args['ffn_dim_multiplier']} is not supported (our SwiGLU width is "
                         "find_multiple(int(8 * dim / 3), multiple_of), LlamaGen's width without a multiplier)")
    block_size = int(args["block_size"])
    side = math.isqrt(block_size)
    if side * side != block_size:
        raise ValueError(f"block_size {block_size} is not a square grid of image tokens")
    text = model_type == "t2i"
    dropout = float(args["class_dropout_prob"])
    if not text and dropout <= 0:
        raise ValueError("class_dropout_prob=0 gives LlamaGen a class table without the unconditional row; our "
                         "class model always has num_classes + 1 rows")
    return ModelConfig(vocab_size=int(args["vocab_size"]), dim=int(args["dim"]), n_layer=int(args["n_layer"]),
                       n_head=int(args["n_head"]), num_classes=int(args["num_classes"]), grid_height=side,
                       grid_width=side, multiple_of=int(args["multiple_of"]), norm_eps=float(args["norm_eps"]),
                       rope_base=float(args["rope_base"]), class_dropout=dropout,
                       cls_token_num=int(args["cls_token_num"]) if text else 1,
                       caption_dim=int(args["caption_dim"]) if text else 0)


# ---------------------------------------------------------------------------------------------------------------
# Reading files

WRAPPERS = ("model", "module", "state_dict")  # LlamaGen's order: DDP, DeepSpeed, Lightning-style
# Keys some files carry that are not weights: LlamaGen's RoPE table and masks (plain attributes in the current
# code, but sample_c2i.py still has a commented-out pop of ``freqs_cis`` for older files), KV-cache buffers of a
# model saved after ``setup_caches``, and HF Llama's rotary buffers.
IGNORED_KEY = re.compile(r"(^|\.)(freqs_cis|causal_mask|kv_cache\.[kv]_cache|rotary_emb\.(inv_freq|cos_cached|"
                         r"sin_cached))$")
COMPILE_PREFIXES = ("_orig_mod.", "module.")  # torch.compile / DDP wrappers saved without unwrapping


def _unwrap(obj: object, path: Path) -> dict[str, Tensor]:
    if isinstance(obj, dict):
        for key in WRAPPERS:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{path}: not a state dict (expected tensors, or a dict with one under "
                         f"{', '.join(repr(k) for k in WRAPPERS)})")
    for prefix in COMPILE_PREFIXES:
        if all(key.startswith(prefix) for key in obj):
            obj = {key[len(prefix):]: value for key, value in obj.items()}
    return dict(obj)


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors of a LlamaGen GPT file, in official naming: a ``.safetensors`` file, or a ``.pt`` checkpoint
    (``{"model": ...}``, ``{"module": ...}``, ``{"state_dict": ...}`` or a bare state dict; a training
    checkpoint's ``args`` Namespace is allowed by the weights-only loader). Hugging Face names are converted."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(path), device="cpu")
    else:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, weights_only=True, map_location="cpu")
    state = _unwrap(state, path)
    return from_hf(state) if naming(state) == "hf" else state


def naming(state: dict[str, Tensor]) -> str:
    """``"hf"`` for Llama-style names (``model.*``, ``lm_head.*``), else ``"official"``."""
    return "hf" if any(key.startswith(("model.", "lm_head.")) for key in state) else "official"


HF_RENAMES = [  # (HF pattern, official replacement), applied to whole keys
    (r"^lm_head\.", "output."),
    (r"^model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.norm\.", "norm."),
    (r"^model\.cls_embedding\.", "cls_embedding."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.attention.wo."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.feed_forward.w3."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.feed_forward.w2."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attention_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
]
HF_QKV = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)$")


def from_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face (LANTERN) names -> official LlamaGen names; ``q_proj | k_proj | v_proj`` rows are stacked into
    ``wqkv``. Keys neither scheme knows keep their name (so a strict load reports them)."""
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}
    for key, value in state.items():
        match = HF_QKV.match(key)
        if match:
            layer, part, kind = match.groups()
            qkv.setdefault((layer, kind), {})[part] = value
            continue
        for pattern, replacement in HF_RENAMES:
            new, count = re.subn(pattern, replacement, key)
            if count:
                key = new
                break
        out[key] = value
    for (layer, kind), parts in qkv.items():
        absent = [p for p in "qkv" if p not in parts]
        if absent:
            raise ValueError(f"model.layers.{layer}.self_attn.{absent[0]}_proj.{kind} is missing (needed with the "
                             f"other projections of that layer to build layers.{layer}.attention.wqkv.{kind})")
        out[f"layers.{layer}.attention.wqkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Loading

def _shape(shape: torch.Size) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def load_strict(model: nn.Module, state: dict[str, Tensor], assign: bool = False) -> None:
    """Load ``state`` into ``model`` requiring the same keys and shapes (non-weight keys such as ``freqs_cis`` are
    dropped first); a mismatch raises ValueError naming the first missing and the first unexpected key, or the
    first key whose shape differs, with both shapes. ``assign``: take the file's tensors as they are (for a model
    built on the meta device)."""
    state = {key: value for key, value in state.items() if not IGNORED_KEY.search(key)}
    expected = model.state_dict(keep_vars=True)
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    if missing or unexpected:
        parts = ([f"missing key {missing[0]} (the file lacks it)"] if missing else []) + \
                ([f"unexpected key {unexpected[0]} (the model has no such tensor)"] if unexpected else [])
        raise ValueError(f"state dict does not match the model: {'; '.join(parts)} "
                         f"({len(missing)} missing, {len(unexpected)} unexpected in all)")
    for key, tensor in expected.items():
        if state[key].shape != tensor.shape:
            raise ValueError(f"{key}: file has {_shape(state[key].shape)}, model expects {_shape(tensor.shape)}")
    model.load_state_dict(state, strict=True, assign=assign)


def load_llamagen_gpt(path: str | Path, model_args: dict, dtype: torch.dtype = torch.float32) -> Transformer:
    """A LlamaGen GPT file (official ``.pt`` / ``.safetensors``, or Hugging Face naming) as our Transformer in
    eval mode, its tensors in ``dtype``. The model is built on the meta device and takes the file's tensors,
    so no random initialisation is spent on a large model and its weights are held once."""
    config = config_from_args(model_args)
    state = {key: value.to(dtype) if value.is_floating_point() else value
             for key, value in read_state_dict(path).items()}
    with torch.device("meta"):
        model = Transformer(config)
    load_strict(model, state, assign=True)
    model.rope = RotaryTable(config)  # built on the meta device with the model: rebuild it on the CPU
    on_meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        raise RuntimeError(f"tensors left on the meta device after loading: {', '.join(on_meta[:3])}")
    return model.eval()
