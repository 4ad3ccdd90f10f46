"""LlamaGen GPT loading (coolsd.models.llamagen): every file format and naming loads strictly into our Transformer,
mismatches are named, full-size shapes have the official parameter counts, and our forward equals an
independent straightforward implementation of LlamaGen's forward (spec section 7)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from coolsd.models.config import CONFIGS
from coolsd.models.gpt import Transformer, parameter_count
from coolsd.models.llamagen import (
    LLAMAGEN_ARGS,
    config_from_args,
    load_llamagen_gpt,
    load_strict,
    naming,
    read_state_dict,
)

TINY = {
    "c2i": {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": 24, "num_classes": 5, "block_size": 16,
            "model_type": "c2i", "multiple_of": 16},
    "t2i": {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": 24, "cls_token_num": 6, "caption_dim": 12,
            "block_size": 16, "model_type": "t2i", "multiple_of": 16},
}


def random_model(args: dict, seed: int = 0) -> Transformer:
    """A tiny model with large random weights (norm weights too), so a misplaced tensor changes the logits."""
    torch.manual_seed(seed)
    model = Transformer(config_from_args(args)).eval()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.normal_(0, 0.5)
    return model


def to_hf(state: dict) -> dict:
    """Official LlamaGen names -> the Llama-style names of LANTERN's LlamaForCausalLM (modeling_llamagen_kv.py:
    model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
    post_attention_layernorm, model.norm, lm_head, model.cls_embedding), wqkv split into thirds by rows."""
    layer_parts = {"attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
                   "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
                   "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    out = {}
    for key, value in state.items():
        if key == "output.weight":
            out["lm_head.weight"] = value
        elif key == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = value
        elif key.startswith(("norm.", "cls_embedding.")):
            out["model." + key] = value
        else:
            _, index, rest = key.split(".", 2)
            module, leaf = rest.rsplit(".", 1)
            if module == "attention.wqkv":
                for name, part in zip("qkv", value.chunk(3, dim=0)):
                    out[f"model.layers.{index}.self_attn.{name}_proj.{leaf}"] = part.clone()
            else:
                out[f"model.layers.{index}.{layer_parts[module]}.{leaf}"] = value
    return out


def example_inputs(model: Transformer, seed: int = 1):
    """A condition prefix (rows 2: conditional and unconditional) and 10 image tokens -> sequence inputs."""
    cfg = model.config
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, 10), generator=generator)
    if cfg.text_conditioned:
        features = torch.randn(2, cfg.cls_token_num, cfg.caption_dim, generator=generator)
        prefix = model.cls_embedding(features.to(model.output.weight.dtype))
    else:
        prefix = model.cls_embedding(torch.tensor([3, cfg.num_classes]))[:, None]
    return tokens, torch.cat([prefix, model.tok_embeddings(tokens)], dim=1)


@torch.no_grad()
def our_logits(model: Transformer, seed: int = 1) -> torch.Tensor:
    _, x = example_inputs(model, seed)
    return model.logits(model(x, torch.arange(x.shape[1]))).float()


def write_formats(model: Transformer, tmp_path) -> dict:
    """The model's weights in every format a LlamaGen GPT comes in."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    paths = {name: tmp_path / f"{name}.pt" for name in ("ddp", "raw", "deepspeed", "state_dict", "training")}
    torch.save({"model": state}, paths["ddp"])
    torch.save(state, paths["raw"])
    torch.save({"module": state}, paths["deepspeed"])
    torch.save({"state_dict": state}, paths["state_dict"])
    optimizer = torch.optim.AdamW(model.parameters()).state_dict()
    torch.save({"model": state, "optimizer": optimizer, "steps": 5, "args": argparse.Namespace(gpt_model="GPT-B")},
               paths["training"])
    paths["safetensors"] = tmp_path / "official.safetensors"
    save_file(state, paths["safetensors"])
    paths["hf"] = tmp_path / "model.safetensors"
    save_file(to_hf(state), paths["hf"])
    return paths


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_every_format_loads_strictly_with_the_same_logits(kind, tmp_path):
    model = random_model(TINY[kind])
    expected = our_logits(model)
    for name, path in write_formats(model, tmp_path).items():
        state = read_state_dict(path)
        assert set(state) == set(model.state_dict()), name
        loaded = load_llamagen_gpt(path, TINY[kind])
        assert not loaded.training and loaded.output.weight.dtype == torch.float32
        torch.testing.assert_close(our_logits(loaded), expected, atol=0, rtol=0, msg=name)
    hf_state = to_hf(model.state_dict())
    assert naming(hf_state) == "hf" and naming(model.state_dict()) == "official"
    assert {"model.layers.1.self_attn.k_proj.weight", "lm_head.weight", "model.embed_tokens.weight"} <= set(hf_state)


def test_hf_and_official_naming_give_identical_logits_in_bf16(tmp_path):
    """A bf16 file (as the Hub copy may be) loads exactly, whatever its naming."""
    model = random_model(TINY["t2i"]).to(torch.bfloat16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    save_file(to_hf(state), tmp_path / "hf.safetensors")
    torch.save({"model": state}, tmp_path / "official.pt")
    a = load_llamagen_gpt(tmp_path / "hf.safetensors", TINY["t2i"], dtype=torch.bfloat16)
    b = load_llamagen_gpt(tmp_path / "official.pt", TINY["t2i"], dtype=torch.bfloat16)
    for key, value in state.items():
        assert torch.equal(a.state_dict()[key], value) and torch.equal(b.state_dict()[key], value), key
    torch.testing.assert_close(our_logits(a), our_logits(b), atol=0, rtol=0)


def test_non_weight_keys_are_ignored(tmp_path):
    """Older LlamaGen files may hold ``freqs_cis``; a model saved after ``setup_caches`` holds KV buffers."""
    model = random_model(TINY["c2i"])
    state = dict(model.state_dict())
    state["freqs_cis"] = torch.zeros(17, 8, 2)
    state["layers.0.attention.kv_cache.k_cache"] = torch.zeros(1, 2, 24, 16)
    torch.save({"model": state}, tmp_path / "old.pt")
    torch.testing.assert_close(our_logits(load_llamagen_gpt(tmp_path / "old.pt", TINY["c2i"])), our_logits(model))


@pytest.mark.parametrize("hf", [False, True])
def test_mismatches_are_named(hf, tmp_path):
    """A file with one renamed tensor, and one with one reshaped tensor, in official (.pt) or HF naming."""
    model = random_model(TINY["t2i"])
    state = to_hf(model.state_dict()) if hf else dict(model.state_dict())
    wo, w2 = ("model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight") if hf else \
        ("layers.1.attention.wo.weight", "layers.1.feed_forward.w2.weight")
    renamed = dict(state)
    renamed[wo.replace("o_proj", "out_proj").replace(".wo.", ".w0.")] = renamed.pop(wo)
    reshaped = {**state, w2: torch.zeros(32, 48)}
    for name, bad in (("renamed", renamed), ("reshaped", reshaped)):
        path = tmp_path / f"{name}.{'safetensors' if hf else 'pt'}"
        if hf:
            save_file(bad, path)
        else:
            torch.save({"model": bad}, path)
        with pytest.raises(ValueError) as error:
            load_llamagen_gpt(path, TINY["t2i"])
        message = str(error.value)
        if name == "renamed":
            wrong = "model.layers.1.self_attn.out_proj.weight" if hf else "layers.1.attention.w0.weight"
            assert "missing key layers.1.attention.wo.weight" in message, message
            assert f"unexpected key {wrong}" in message, message
        else:
            assert message == "layers.1.feed_forward.w2.weight: file has [32, 48], model expects [32, 96]"


def test_load_strict_names_the_shapes():
    model = random_model(TINY["c2i"])
    state = dict(model.state_dict())
    state["layers.1.attention.wqkv.weight"] = torch.zeros(96, 48)
    with pytest.raises(ValueError, match=r"^layers\.1\.attention\.wqkv\.weight: file has \[96, 48\], model "
                                         r"expects \[96, 32\]$"):
        load_strict(model, state)


def test_hf_file_missing_a_projection_is_named(tmp_path):
    hf = to_hf(random_model(TINY["c2i"]).state_dict())
    del hf["model.layers.0.self_attn.v_proj.weight"]
    save_file(hf, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.v_proj\.weight is missing"):
        read_state_dict(tmp_path / "model.safetensors")


def test_config_from_args():
    assert config_from_args(LLAMAGEN_ARGS["c2i-b-256"]) == CONFIGS["llamagen-b"]
    assert config_from_args(LLAMAGEN_ARGS["c2i-l-256"]) == CONFIGS["llamagen-l"]
    assert config_from_args(LLAMAGEN_ARGS["c2i-xl-256"]) == CONFIGS["llamagen-xl"]
    t2i = config_from_args(LLAMAGEN_ARGS["t2i-xl-stage1-256"])
    assert (t2i.grid_height, t2i.cls_token_num, t2i.caption_dim, t2i.ffn_dim, t2i.norm_eps) == (16, 120, 2048, 3584,
                                                                                                1e-5)
    assert config_from_args(LLAMAGEN_ARGS["t2i-xl-stage2-512"]).grid_width == 32
    assert config_from_args(LLAMAGEN_ARGS["c2i-l-384"]).image_tokens == 576
    assert config_from_args({"dim": 64, "n_layer": 1, "n_head": 2, "caption_dim": 7}).caption_dim == 0  # c2i
    for bad, words in [({"block_size": 250}, "not a square"), ({"model_type": "t2v"}, "model_type"),
                       ({"ffn_dim_multiplier": 1.3}, "ffn_dim_multiplier"), ({"n_kv_head": 1}, "n_kv_head"),
                       ({"class_dropout_prob": 0.0}, "unconditional row"), ({"dimm": 3}, "unknown")]:
        with pytest.raises(ValueError, match=words):
            config_from_args({"dim": 64, "n_layer": 1, "n_head": 2, **bad})
    with pytest.raises(ValueError, match="lacks n_head"):
        config_from_args({"dim": 64, "n_layer": 1})


def official_count(dim: int, n_layer: int, vocab: int, condition: int) -> int:
    """LlamaGen's GPT parameter count from its architecture: per layer wqkv (3 dim^2), wo (dim^2), SwiGLU
    (3 dim h, h = find_multiple(int(8 dim / 3), 256)) and two norms; token table, output head, final norm; plus
    the condition's tensors (``condition``)."""
    hidden = int(2 * 4 * dim / 3)
    hidden = hidden if hidden % 256 == 0 else hidden + 256 - hidden % 256
    return n_layer * (4 * dim * dim + 3 * dim * hidden + 2 * dim) + 2 * vocab * dim + dim + condition


# Exact counts. The rule: every tensor of the checkpoint's state dict, i.e. the parameters plus the one persistent
# buffer a LlamaGen GPT has, the text model's ``cls_embedding.uncond_embedding`` [120, 2048] (245,760 values;
# LlamaGen registers it with register_buffer, so its own ``model.parameters()`` log leaves it out: 777,678,080).
# Class models: the class table holds 1001 rows (1000 classes + the unconditional row).
COUNTS = {
    "t2i-xl-stage1-256": 777_923_840, "t2i-xl-stage2-512": 777_923_840,
    "c2i-b-256": 110_888_448, "c2i-b-384": 110_888_448,  # README: 111M
    "c2i-l-256": 342_910_976, "c2i-l-384": 342_910_976,  # README: 343M
    "c2i-xl-256": 774_699_520, "c2i-xl-384": 774_699_520,  # README: 775M
}


@pytest.mark.parametrize("name", sorted(LLAMAGEN_ARGS))
def test_full_size_parameter_counts(name):
    args = LLAMAGEN_ARGS[name]
    with torch.device("meta"):
        model = Transformer(config_from_args(args))
    state_count = sum(t.numel() for t in model.state_dict().values())
    assert state_count == COUNTS[name]
    if args["model_type"] == "t2i":
        condition = 2048 * 1280 + 1280 * 1280 + 120 * 2048
        assert parameter_count(model) == COUNTS[name] - 120 * 2048 == 777_678_080
        assert model.cls_embedding.uncond_embedding.shape == (120, 2048)
    else:
        condition = 1001 * args["dim"]
        assert parameter_count(model) == COUNTS[name]
    assert official_count(args["dim"], args["n_layer"], 16384, condition) == COUNTS[name]
    assert round(COUNTS[name] / 1e6) in (111, 343, 775, 778)


# ---------------------------------------------------------------------------------------------------------------
# An independent forward of LlamaGen's GPT, written from the spec (section 7)

def ref_rmsnorm(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def ref_rope_table(head_dim: int, side: int, base: float, zero_rows: int):
    """cos, sin (positions, head_dim / 2): ``zero_rows`` rows of zeros, then grid cells in raster order; pair j < D/4
    turns by row * f_j, pair D/4 + j by col * f_j, with f_j = base^(-2j / (D/2))."""
    quarter = head_dim // 4
    cos, sin = torch.zeros(zero_rows + side * side, 2 * quarter), torch.zeros(zero_rows + side * side, 2 * quarter)
    for r in range(side):
        for c in range(side):
            for j in range(quarter):
                f = base ** (-2 * j / (head_dim / 2))
                for slot, coord in ((j, r), (quarter + j, c)):
                    cos[zero_rows + r * side + c, slot] = math.cos(coord * f)
                    sin[zero_rows + r * side + c, slot] = math.sin(coord * f)
    return cos, sin


def ref_rotate(x, cos, sin):
    """Rotate the interleaved pairs (2j, 2j+1) of x (B, T, H, D)."""
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    cos, sin = cos[None, :, None], sin[None, :, None]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).type_as(x)


def ref_forward(state: dict, args: dict, prefix_inputs, tokens, key_valid=None):
    """LlamaGen's forward over [prefix; tokens]: logits (B, T, V) in float32. ``key_valid`` (B, P): the caption
    padding mask, applied to keys as LlamaGen's generate does (the diagonal always kept)."""
    cfg = config_from_args(args)
    dim, heads, head_dim, eps = cfg.dim, cfg.n_head, cfg.head_dim, cfg.norm_eps
    if args["model_type"] == "t2i":
        hidden = F.gelu(prefix_inputs @ state["cls_embedding.cap_proj.fc1.weight"].T, approximate="tanh")
        prefix = hidden @ state["cls_embedding.cap_proj.fc2.weight"].T
    else:
        prefix = state["cls_embedding.embedding_table.weight"][prefix_inputs][:, None]
    h = torch.cat([prefix, state["tok_embeddings.weight"][tokens]], dim=1)
    batch, length, _ = h.shape
    side = math.isqrt(args["block_size"])
    cos, sin = ref_rope_table(head_dim, side, cfg.rope_base, cfg.cls_token_num)
    cos, sin = cos[:length], sin[:length]
    allowed = torch.ones(length, length).tril().bool().expand(batch, length, length).clone()
    if key_valid is not None:
        allowed[:, :, :key_valid.shape[1]] &= key_valid[:, None, :]
        allowed |= torch.eye(length, dtype=torch.bool)
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        x = ref_rmsnorm(h, state[p + "attention_norm.weight"], eps)
        qkv = x @ state[p + "attention.wqkv.weight"].T
        q, k, v = (t.reshape(batch, length, heads, head_dim) for t in qkv.split(dim, dim=-1))
        q, k = ref_rotate(q, cos, sin), ref_rotate(k, cos, sin)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        attended = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(batch, length, dim)
        h = h + attended @ state[p + "attention.wo.weight"].T
        x = ref_rmsnorm(h, state[p + "ffn_norm.weight"], eps)
        gate = F.silu(x @ state[p + "feed_forward.w1.weight"].T) * (x @ state[p + "feed_forward.w3.weight"].T)
        h = h + gate @ state[p + "feed_forward.w2.weight"].T
    return (ref_rmsnorm(h, state["norm.weight"], eps) @ state["output.weight"].T).float()


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_forward_matches_an_independent_llamagen_forward(kind):
    args = TINY[kind]
    model = random_model(args, seed=3)
    with torch.no_grad():  # moderate weights: deep enough into the nonlinearities, logits of order 1-10
        for tensor in model.parameters():
            tensor.mul_(0.6)
    state = model.state_dict()
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, args["vocab_size"], (2, args["block_size"] - 1), generator=generator)
    if kind == "t2i":
        condition = torch.randn(2, args["cls_token_num"], args["caption_dim"], generator=generator)
        prefix = model.cls_embedding(condition)
    else:
        condition = torch.tensor([2, args["num_classes"]])
        prefix = model.cls_embedding(condition)[:, None]
    with torch.no_grad():
        x = torch.cat([prefix, model.tok_embeddings(tokens)], dim=1)
        ours = model.logits(model(x, torch.arange(x.shape[1]))).float()
        expected = ref_forward(state, args, condition, tokens)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        assert expected.abs().max() > 1
        if kind == "t2i":  # padding first, as LlamaGen lays captions out: 2 and 4 padded slots
            valid = torch.ones(2, args["cls_token_num"], dtype=torch.bool)
            valid[0, :2] = valid[1, :4] = False
            ours = model.logits(model(x, torch.arange(x.shape[1]), valid=torch.cat(
                [valid, torch.ones(2, tokens.shape[1], dtype=torch.bool)], dim=1))).float()
            torch.testing.assert_close(ours, ref_forward(state, args, condition, tokens, valid), atol=1e-5, rtol=1e-5)
