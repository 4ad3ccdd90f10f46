"""LANTERN's published LlamaGen text-to-image drafter (``coolsd.models.lantern``), offline, on tiny models.

The published directory's layout is written here by hand (``write_lantern_dir``: LANTERN's ``config.json``
field names, the state dict key names of its ``cnets_llamagen.Model``), not by an inverse of our loader, and the
drafter's numerics are checked against ``reference_forward``, written here from the facts of spec section 7
(fc of [token embedding, feature]; one Llama layer without input norm; RoPE rows: P - 1 zero rows, then the
grid, then zero rows; no padding mask), not from our model code.

1. A tiny LANTERN directory loads strictly; a renamed, a reshaped and an extra tensor are refused by name.
2. The full-size drafter (LlamaGen-XL text width) has LANTERN's 44,567,040 parameters and its key names.
3. Its forward equals the reference, uncached and through our KV cache with a tree-shaped pending area;
   ``lead_inputs`` is token id 0's embedding at the caption slots, as LANTERN feeds them.
4. It runs inside the engine: greedy Eagle-1 with it equals greedy AR on a text-conditioned target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from coolsd.core.decode import generate
from coolsd.core.rules import AR, Eagle
from coolsd.core.sampling import SamplingConfig
from coolsd.core.stats import DRAFT
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import Bundle
from coolsd.models.config import ModelConfig
from coolsd.models.gpt import Caption, Transformer
from coolsd.models.lantern import LanternConfig, LanternDrafter, load_lantern_drafter

P, CAPTION_DIM = 8, 12
TINY = ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, grid_height=4, grid_width=4, multiple_of=16,
                   cls_token_num=P, caption_dim=CAPTION_DIM)
TINY_FFN = 48  # any width: the drafter's MLP size comes from its config.json
# LlamaGen's text-to-image target (GPT-XL: 1280 wide, 20 heads, 16x16 codes of 16384, 120 caption slots).
LLAMAGEN_T2I = ModelConfig(vocab_size=16384, dim=1280, n_layer=36, n_head=20, grid_height=16, grid_width=16,
                           cls_token_num=120, caption_dim=2048)


def published_config(dim: int, heads: int, ffn: int, vocab: int) -> dict:
    """LANTERN's ``data/configs/llamagen_t2i_config.json``, field for field, with the shape values replaced."""
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": dim, "caption_dim": 2048, "class_dropout_p": 0.0, "initializer_range": 0.02,
            "intermediate_size": ffn, "max_position_embeddings": 2048, "model_type": "llama",
            "num_attention_heads": heads, "num_hidden_layers": 1, "num_key_value_heads": heads, "pretraining_tp": 1,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
            "transformers_version": "4.32.0.dev0", "use_cache": True, "vocab_size": vocab, "input_type": "t2i"}


def published_shapes(dim: int, ffn: int, vocab: int) -> dict[str, tuple[int, ...]]:
    """The state dict of LANTERN's one-layer ``Model`` (fc with bias, no q/k/v biases, no input norm in layer
    0, no final norm), in its module order."""
    return {"embed_tokens.weight": (vocab, dim),
            "layers.0.self_attn.q_proj.weight": (dim, dim), "layers.0.self_attn.k_proj.weight": (dim, dim),
            "layers.0.self_attn.v_proj.weight": (dim, dim), "layers.0.self_attn.o_proj.weight": (dim, dim),
            "layers.0.mlp.gate_proj.weight": (ffn, dim), "layers.0.mlp.up_proj.weight": (ffn, dim),
            "layers.0.mlp.down_proj.weight": (dim, ffn), "layers.0.post_attention_layernorm.weight": (dim,),
            "fc.weight": (dim, 2 * dim), "fc.bias": (dim,)}


def random_weights(seed: int = 0, std: float = 0.15) -> dict[str, torch.Tensor]:
    """Tiny drafter weights with large entries (outputs far from zero); norms around 1."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for key, shape in published_shapes(TINY.dim, TINY_FFN, TINY.vocab_size).items():
        if "norm" in key:
            weights[key] = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:
            weights[key] = std * torch.randn(shape, generator=gen)
    return weights


def write_lantern_dir(path: Path, weights: dict, config: dict | None = None, safetensors: bool = False) -> Path:
    """A directory as LANTERN publishes it: ``config.json`` and ``pytorch_model.bin`` (fp16, as released) or
    ``model.safetensors``."""
    path.mkdir(parents=True, exist_ok=True)
    config = config or published_config(TINY.dim, TINY.n_head, TINY_FFN, TINY.vocab_size)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if safetensors:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in weights.items()}, path / "model.safetensors")
    else:
        torch.save({k: v.half() for k, v in weights.items()}, path / "pytorch_model.bin")
    return path


# ---------------------------------------------------------------- the reference, from the spec's facts alone

def reference_rope(head_dim: int, grid_h: int, grid_w: int, zero_rows: int, tail: int = 20) -> torch.Tensor:
    """(rows, head_dim/2, 2) cos/sin per drafter slot: ``zero_rows`` zero rows, the grid row-major (first
    head_dim/4 pairs rotate by row * f_k, the rest by col * f_k, f_k = 10000^(-2k/(head_dim/2))), ``tail``
    zero rows."""
    quarter = head_dim // 4
    freqs = 10000.0 ** (-2 * torch.arange(quarter, dtype=torch.float64) / (head_dim // 2))
    cells = []
    for r in range(grid_h):
        for c in range(grid_w):
            cells.append(torch.cat([r * freqs, c * freqs]))
    angles = torch.stack(cells)
    grid = torch.stack([angles.cos(), angles.sin()], dim=-1)
    zeros = torch.zeros(zero_rows, head_dim // 2, 2, dtype=torch.float64)
    return torch.cat([zeros, grid, torch.zeros(tail, head_dim // 2, 2, dtype=torch.float64)])


def rotate(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x (rows, T, H, D), pairs (2j, 2j+1) rotated by cos_sin (T, D/2, 2)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    cos, sin = cos_sin[None, :, None, :, 0], cos_sin[None, :, None, :, 1]
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def reference_forward(w: dict, ids: list[int], features: torch.Tensor, positions: list[int],
                      heads: int = TINY.n_head, eps: float = 1e-6) -> torch.Tensor:
    """LANTERN's drafter over one causal sequence in float64: slot t gets fc([embed_tokens[ids[t]],
    features[:, t]]) and the RoPE row ``positions[t]``; every slot sees every earlier one (no padding mask)."""
    w = {k: v.double() for k, v in w.items()}
    rows, length, dim = features.shape
    head_dim = dim // heads
    emb = w["embed_tokens.weight"][torch.tensor(ids)][None].expand(rows, -1, -1)
    x = torch.cat([emb, features.double()], dim=-1) @ w["fc.weight"].T + w["fc.bias"]
    table = reference_rope(head_dim, TINY.grid_height, TINY.grid_width, P - 1)[torch.tensor(positions)]
    q, k, v = (x @ w[f"layers.0.self_attn.{n}_proj.weight"].T for n in "qkv")
    q, k, v = (t.view(rows, length, heads, head_dim) for t in (q, k, v))
    q, k = rotate(q, table), rotate(k, table)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / head_dim ** 0.5
    scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    attended = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(rows, length, dim)
    h = x + attended @ w["layers.0.self_attn.o_proj.weight"].T
    n = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w["layers.0.post_attention_layernorm.weight"]
    gate, up = n @ w["layers.0.mlp.gate_proj.weight"].T, n @ w["layers.0.mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T


# ---------------------------------------------------------------- 1. loading

@pytest.fixture
def tiny_dir(tmp_path) -> tuple[Path, dict]:
    weights = random_weights()
    return write_lantern_dir(tmp_path / "llamagen_drafter", weights), weights


def test_published_directory_loads_strictly(tiny_dir, tmp_path):
    path, weights = tiny_dir
    drafter = load_lantern_drafter(path, TINY)
    assert isinstance(drafter, LanternDrafter) and not drafter.training
    state = drafter.state_dict()
    assert list(state) == list(published_shapes(TINY.dim, TINY_FFN, TINY.vocab_size))
    for key, value in weights.items():
        assert state[key].dtype == torch.float32
        torch.testing.assert_close(state[key], value.half().float(), rtol=0, atol=0)
    assert drafter.config.rms_norm_eps == 1e-6 and drafter.config.intermediate_size == TINY_FFN
    # model.safetensors, when there is no pytorch_model.bin; dtype=None keeps the file's dtype
    other = load_lantern_drafter(write_lantern_dir(tmp_path / "st", weights, safetensors=True), TINY, dtype=None)
    torch.testing.assert_close(other.fc.weight, weights["fc.weight"], rtol=0, atol=0)


def test_renamed_reshaped_or_extra_tensors_are_refused(tmp_path):
    weights = random_weights()
    renamed = dict(weights)
    renamed["layers.0.mlp.up.weight"] = renamed.pop("layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"missing layers\.0\.mlp\.up_proj\.weight \(expected shape \[48, 32\]\)"):
        load_lantern_drafter(write_lantern_dir(tmp_path / "renamed", renamed), TINY)
    with pytest.raises(ValueError, match=r"unexpected layers\.0\.mlp\.up\.weight \(shape \[48, 32\]\)"):
        load_lantern_drafter(write_lantern_dir(tmp_path / "renamed", renamed), TINY)
    reshaped = dict(weights, **{"fc.weight": torch.zeros(TINY.dim, 2 * TINY.dim - 1)})
    with pytest.raises(ValueError, match=r"fc\.weight has shape \[32, 63\], expected \[32, 64\]"):
        load_lantern_drafter(write_lantern_dir(tmp_path / "reshaped", reshaped), TINY)
    extra = dict(weights, **{"norm.weight": torch.ones(TINY.dim)})  # a final norm LANTERN's drafter lacks
    with pytest.raises(ValueError, match=r"unexpected norm\.weight \(shape \[32\]\)"):
        load_lantern_drafter(write_lantern_dir(tmp_path / "extra", extra), TINY)
    with pytest.raises(FileNotFoundError):
        load_lantern_drafter(tmp_path / "nowhere", TINY)


def test_config_it_cannot_reproduce_is_refused(tmp_path):
    weights = random_weights()
    base = published_config(TINY.dim, TINY.n_head, TINY_FFN, TINY.vocab_size)
    for change, message in (({"num_key_value_heads": 1}, "grouped-query"), ({"hidden_act": "gelu"}, "silu"),
                            ({"hidden_size": 64}, "width"), ({"vocab_size": 32}, "vocabulary"),
                            ({"input_type": "c2i"}, "text-conditioned")):
        with pytest.raises(ValueError, match=message):
            load_lantern_drafter(write_lantern_dir(tmp_path / message, weights, {**base, **change}), TINY)


# ---------------------------------------------------------------- 2. the published size

def test_full_size_drafter_has_the_published_parameters():
    config = LanternConfig.from_json(published_config(1280, 20, LLAMAGEN_T2I.ffn_dim, 16384))
    assert config == LanternConfig() == LanternConfig.for_target(LLAMAGEN_T2I)
    assert LLAMAGEN_T2I.ffn_dim == 3584
    with torch.device("meta"):
        drafter = LanternDrafter(config, LLAMAGEN_T2I)
    assert sum(p.numel() for p in drafter.parameters()) == 44_567_040
    assert {k: tuple(v.shape) for k, v in drafter.state_dict().items()} == published_shapes(1280, 3584, 16384)
    table = drafter.rope.table  # built on the CPU even under the meta device
    assert table.device.type == "cpu" and table.shape == (119 + 256 + 20, 32, 2)  # (cos, sin) per pair
    assert table[:119].abs().max() == 0 and table[375:].abs().max() == 0
    torch.testing.assert_close(table[119], torch.tensor([1.0, 0.0]).expand(32, 2))  # grid cell 0: no rotation
    want = reference_rope(64, 16, 16, 119)
    torch.testing.assert_close(table.double(), want, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- 3. numerics

def test_lead_inputs_are_token_zero_at_the_caption_slots(tiny_dir):
    drafter = load_lantern_drafter(tiny_dir[0], TINY)
    prefix = torch.randn(2, P, TINY.dim)
    lead = drafter.lead_inputs(prefix)
    assert lead.shape == (2, P - 1, TINY.dim)
    torch.testing.assert_close(lead, drafter.embed_tokens.weight[0].expand(2, P - 1, -1), rtol=0, atol=0)


@torch.no_grad()
def test_forward_matches_the_reference_cached_and_uncached(tiny_dir):
    path, weights = tiny_dir
    drafter = load_lantern_drafter(path, TINY)
    w = {k: v.half().float() for k, v in weights.items()}  # what the fp16 file holds
    gen = torch.Generator().manual_seed(3)
    rows = 2
    first, chunk = 5, [7, 2]  # the first image token; then a round's emitted tokens
    ids = [0] * (P - 1) + [first] + chunk + [11]  # slot s pairs feature s with the token of position s + 1
    length = len(ids)
    features = torch.randn(rows, length, TINY.dim, generator=gen)
    want = reference_forward(w, ids, features, list(range(length)))

    inputs = torch.cat([drafter.lead_inputs(torch.zeros(rows, P, TINY.dim)),
                        drafter.embed(torch.tensor(ids[P - 1:]))[None].expand(rows, -1, -1)], 1)
    got = drafter(inputs, features, torch.arange(length))  # uncached: causal
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    assert want[:, P - 1:].abs().max() > 0.5  # non-trivial outputs

    # cached: the prefill's P slots, then a round's pending chain, then a tree drafted level by level
    cache = drafter.new_cache(rows, 64)
    causal = lambda n: torch.ones(n, n, dtype=torch.bool).tril()
    out = drafter(inputs[:, :P], features[:, :P], torch.arange(P), cache, 0, causal(P))
    cache.commit(list(range(P)))
    torch.testing.assert_close(out.double(), want[:, :P], rtol=0, atol=1e-5)
    out = drafter(inputs[:, P:P + 2], features[:, P:P + 2], torch.arange(P, P + 2), cache, 0, causal(2))
    cache.commit([0, 1])
    torch.testing.assert_close(out.double(), want[:, P:P + 2], rtol=0, atol=1e-5)
    committed = P + 2
    # tree: nodes 1, 2 at depth 1 (parent: the root), nodes 3, 4 children of 1 and node 5 child of 2, depth 2
    tokens = {1: 3, 2: 9, 3: 4, 4: 15, 5: 1}
    parents = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
    node_features = {n: torch.randn(rows, TINY.dim, generator=gen) for n in tokens}
    ancestor = torch.zeros(6, 6, dtype=torch.bool)
    for n in range(6):
        m = n
        while True:
            ancestor[n, m] = True
            if m == 0:
                break
            m = parents[m]
    outs = {}
    for level, offset in (([1, 2], 0), ([3, 4, 5], 2)):
        depth = 1 if offset == 0 else 2
        mask = ancestor[level[0]:level[-1] + 1, 1:level[-1] + 1]
        level_out = drafter(drafter.embed(torch.tensor([tokens[n] for n in level]))[None].expand(rows, -1, -1),
                            torch.stack([node_features[n] for n in level], 1),
                            torch.full((len(level),), committed + depth - 1), cache, offset, mask)
        outs.update({n: level_out[:, i] for i, n in enumerate(level)})
    for n in tokens:
        path = [m for m in range(1, 6) if ancestor[n, m]]
        seq_ids = ids[:committed] + [tokens[m] for m in path]
        seq_features = torch.cat([features[:, :committed], torch.stack([node_features[m] for m in path], 1)], 1)
        positions = list(range(committed)) + [committed + d for d in range(len(path))]
        want_node = reference_forward(w, seq_ids, seq_features, positions)[:, -1]
        torch.testing.assert_close(outs[n].double(), want_node, rtol=0, atol=1e-5)
    assert cache.length == committed and cache.valid is None  # the tree was never committed; no padding mask


def test_the_padding_mask_does_not_reach_the_drafter(tiny_dir):
    """Changing an early caption slot's feature changes the drafter's output at the first image slot: LANTERN's
    drafter sees every caption slot, padded or not (it is never given the mask)."""
    drafter = load_lantern_drafter(tiny_dir[0], TINY)
    features = torch.randn(2, P, TINY.dim)
    inputs = torch.cat([drafter.lead_inputs(features), drafter.embed(torch.tensor([5]))[None].expand(2, -1, -1)], 1)
    base = drafter(inputs, features, torch.arange(P))[:, -1]
    features[:, 0] += 1
    assert (drafter(inputs, features, torch.arange(P))[:, -1] - base).abs().max() > 1e-3


# ---------------------------------------------------------------- 4. inside the engine

def text_bundle(drafter: nn.Module, seed: int = 0) -> Bundle:
    torch.manual_seed(seed)
    target = Transformer(TINY).eval()
    with torch.no_grad():
        for name, param in target.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.5)
    target.requires_grad_(False), drafter.requires_grad_(False)
    codebook = nn.functional.normalize(torch.randn(TINY.vocab_size, 4), dim=-1)
    return Bundle(target, drafter, codebook, name="lantern-tiny")


@pytest.mark.parametrize("steps", ["eager", "static"])  # static: the CUDA path's fixed-shape caches
def test_greedy_eagle_with_the_lantern_drafter_equals_greedy_ar(tiny_dir, steps):
    drafter = load_lantern_drafter(tiny_dir[0], TINY)
    bundle = text_bundle(drafter)
    assert bundle.drafter is drafter  # share_embedding is a no-op: the drafter keeps its own table
    bundle = bundle.with_steps(steps)
    greedy = SamplingConfig(cfg_scale=2, top_k=1)
    drafted = 0
    for seed in range(3):
        features = torch.randn(P, CAPTION_DIM, generator=torch.Generator().manual_seed(seed))
        caption = Caption(features, torch.arange(P) >= 3, f"caption {seed}")
        ar = generate(bundle, caption, AR(), None, greedy, seed)
        eagle = generate(bundle, caption, Eagle(), parse_draft("tree:eagle25"), greedy, seed)
        assert eagle.tokens == ar.tokens and len(ar.tokens) == TINY.image_tokens
        assert len(eagle.stats.rounds) > 1
        drafted += eagle.stats.token_origin.count(DRAFT)
    assert drafted > 0  # some drafts were accepted, so the drafter's tokens reached the image


def test_engine_feeds_lanterns_caption_inputs(tiny_dir):
    drafter = load_lantern_drafter(tiny_dir[0], TINY)
    bundle = text_bundle(drafter)
    calls = []
    hook = drafter.register_forward_hook(lambda module, args, out: calls.append(args[0].clone()))
    try:
        caption = Caption(torch.randn(P, CAPTION_DIM), torch.arange(P) >= 3)
        result = generate(bundle, caption, Eagle(), parse_draft("chain:2"), SamplingConfig(cfg_scale=2, top_k=1), 0)
    finally:
        hook.remove()
    lead, catch_up = calls[0], calls[1]  # the prefill's caption slots, then the first round's catch-up
    assert lead.shape[1] == P - 1
    torch.testing.assert_close(lead, drafter.embed_tokens.weight[0].expand(2, P - 1, -1))
    torch.testing.assert_close(catch_up[:, 0], drafter.embed_tokens.weight[result.tokens[0]].expand(2, -1))
