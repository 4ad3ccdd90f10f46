"""The Chameleon family (spec section 10) on tiny random weights in the official formats: the target against
transformers' Chameleon forward, strict loading, the constrained layout, the VQGAN decoder against the official
formulas, LANTERN's drafter formats, the full-size parameter counts, and the memory check."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from chameleon_fixture import (
    IMAGE_SIZE,
    VOCAB_SIZE,
    build_model_dir,
    hf_config,
    image_code,
    vocabulary,
    vq_state,
    write_drafter,
    write_model,
    write_vqgan,
)

from coolsd.models import chameleon, chameleon_vq
from coolsd.models.chameleon import (
    CHAMELEON_7B,
    ChameleonPrompt,
    config_from_hf,
    load_chameleon,
    meta_target,
    parameter_count,
    position_rules,
)
from coolsd.models.chameleon_drafter import DrafterConfig, load_chameleon_drafter
from coolsd.models.chameleon_vq import ChameleonImage, load_vqgan

PROMPT = (0, 8832, 8833, 8834, 8835, 8844, 8845, 8846, 8710, 8197, 8806, 8806)  # BOS, words, sep, image start
UNCOND = (8197, 8806, 8806)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("chameleon") / "model")


def reference_logits(model, tokens: list[int]) -> torch.Tensor:
    """transformers' forward (positions from 0), our LM head on its final hidden states: (T, V)."""
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]
        return model.lm_head(hidden)


def our_rows(target, generated: list[int], cached: bool) -> torch.Tensor:
    """Our logits for both guidance rows over the prefix and ``generated`` tokens: (2, P + G, V)."""
    prefix = target.prefix(ChameleonPrompt(PROMPT), 2)
    p, g = prefix.length, len(generated)
    tokens = torch.tensor(generated)
    with torch.no_grad():
        if not cached:
            x = torch.cat([prefix.embeds, target.embed(tokens)[None].expand(2, -1, -1)], 1)
            valid = torch.cat([prefix.valid, torch.ones(2, g, dtype=torch.bool)], 1)
            return target.logits(target(x, torch.arange(p + g), valid=valid))
        cache = target.new_cache(2, p + g)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        out = [target(prefix.embeds, torch.arange(p), cache, 0, causal, prefix.valid)]
        cache.commit(None, p)
        for i, token in enumerate(generated):
            out.append(target(target.embed(tokens[i:i + 1])[None].expand(2, -1, -1), torch.tensor([p + i]), cache))
            cache.commit(None, 1)
        return target.logits(torch.cat(out, 1))


@pytest.mark.parametrize("one_row", [False, True], ids=["per-head-norms", "one-row-norms"])
@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
def test_logits_equal_transformers_for_both_guidance_rows(tmp_path, cached, one_row):
    reference = write_model(tmp_path, seed=3, one_row=one_row)
    target = load_chameleon(tmp_path, IMAGE_SIZE, "lumina", prefix_slots=20, progress=False)
    generated = [9, 4000, 8803, 17]
    ours = our_rows(target, generated, cached)
    p = target.prefix_length
    for row, context in ((0, PROMPT), (1, UNCOND)):
        expected = reference_logits(reference, [*context, *generated])
        got = torch.cat([ours[row, p - len(context):p], ours[row, p:]])
        assert torch.allclose(got, expected, atol=1e-5, rtol=0), (row, (got - expected).abs().max())
    padding = ours[1, :p - len(UNCOND)]
    assert torch.equal(target(target.prefix(ChameleonPrompt(PROMPT), 2).embeds, torch.arange(p),
                              valid=target.prefix(ChameleonPrompt(PROMPT), 2).valid)[1, :p - 3],
                       torch.zeros_like(padding[..., :target.config.dim]))


def test_visible_padding_is_caught(tmp_path, monkeypatch):
    """Negative control: with the padding slots visible the unconditional row no longer matches. (The per-row
    RoPE shift, by contrast, changes rounding only: RoPE attention depends on relative positions.)"""
    reference = write_model(tmp_path, seed=3)
    target = load_chameleon(tmp_path, IMAGE_SIZE, "lumina", prefix_slots=20, progress=False)
    monkeypatch.setattr(chameleon, "attention_mask", lambda cache, mask, length, valid=None, offset=0: None)
    ours = our_rows(target, [9], cached=False)
    expected = reference_logits(reference, [*UNCOND, 9])
    assert not torch.allclose(ours[1, -4:], expected, atol=1e-3)


def test_strict_load_names_the_key_and_the_shapes(tmp_path):
    write_model(tmp_path, seed=1)
    from safetensors.torch import load_file, save_file
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    shard = tmp_path / index["weight_map"][key]
    original = load_file(str(shard))
    renamed = {("model.layers.1.mlp.upper.weight" if k == key else k): v for k, v in original.items()}
    save_file(renamed, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing key model\.layers\.1\.mlp\.up_proj\.weight.*unexpected key "
                                         r"model\.layers\.1\.mlp\.upper\.weight"):
        load_chameleon(tmp_path, IMAGE_SIZE, progress=False)
    reshaped = {k: (v[:-1] if k == key else v) for k, v in original.items()}
    save_file(reshaped, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"up_proj\.weight: file has \[63, 32\], model expects \[64, 32\]"):
        load_chameleon(tmp_path, IMAGE_SIZE, progress=False)


def test_config_refuses_what_the_forward_cannot_reproduce():
    meta = hf_config().to_dict()
    for key, value in (("swin_norm", True), ("num_key_value_heads", 2), ("attention_bias", True)):
        with pytest.raises(ValueError, match=key.split("_")[0]):
            config_from_hf({**meta, key: value})


def official_kinds(side: int) -> list[str]:
    """Lumina-mGPT's MultiModalLogitsProcessor, written out: the kind of the token drawn after ``t`` image-area
    tokens, for the whole image."""
    kinds = []
    for t in range(side * (side + 1) + 1):
        if (t + 1) % (side + 1) == 0:
            kinds.append("newline")
        elif t + 1 == (side + 1) * side + 1:
            kinds.append("end")
        else:
            kinds.append("image")
    return kinds


@pytest.mark.parametrize("size", [768, 64])
def test_layout_forces_newlines_and_end_where_the_official_sampler_does(size):
    cfg = ChameleonConfig_(image_size=size)
    rules = position_rules(cfg, list(range(4, 8196)))
    side = size // 16
    assert cfg.image_tokens == len(rules.kinds) == side * (side + 1) + 1
    if size == 768:
        assert cfg.image_tokens == 48 * 49 + 1 == 2353
    names = {0: "image", 1: "newline", 2: "end"}
    assert [names[k] for k in rules.kinds.tolist()] == official_kinds(side)
    assert rules.allowed[1].nonzero().flatten().tolist() == [8803]
    assert rules.allowed[2].nonzero().flatten().tolist() == [8196]
    assert rules.allowed[0].nonzero().flatten().tolist() == list(range(4, 8196))
    assert cfg.image_start() == [8197, 8804 + size // 32, 8804 + size // 32]


def ChameleonConfig_(**kw):
    return chameleon.ChameleonConfig(**{"vocab_size": 65536, **kw})


def test_anole_layout_is_the_bare_grid_with_bos_and_image_start_as_its_unconditional_context():
    cfg = ChameleonConfig_(image_size=512, layout="anole")
    rules = position_rules(cfg, list(range(4, 8196)))
    assert cfg.image_tokens == 1024 and set(rules.kinds.tolist()) == {0}
    assert cfg.image_start() == [8710, 8197] and cfg.unconditional() == [0, 8197]


def test_image_ids_come_from_the_vocabulary_names():
    table = chameleon.image_ids(vocabulary())
    assert sorted(table) == list(range(4, 8196))
    assert all(table[t] == image_code(t) for t in (4, 5, 1000, 8195))
    assert table[5] != 5 - 4  # not an offset


# --- the VQGAN ------------------------------------------------------------------------------------------------

def reference_decode(state: dict, codes: torch.Tensor, ddconfig: dict) -> torch.Tensor:
    """taming's decoder from the official formulas, on the state dict's tensors (independent of our modules)."""
    w = lambda name: state[name].float()  # noqa: E731

    def conv(x, name, pad=1):
        return F.conv2d(x, w(f"{name}.weight"), w(f"{name}.bias"), padding=pad)

    def norm(x, name):
        return F.group_norm(x, 32, w(f"{name}.weight"), w(f"{name}.bias"), eps=1e-6)

    def swish(x):
        return x * torch.sigmoid(x)

    def resnet(x, name):
        h = conv(swish(norm(x, f"{name}.norm1")), f"{name}.conv1")
        h = conv(swish(norm(h, f"{name}.norm2")), f"{name}.conv2")
        skip = conv(x, f"{name}.nin_shortcut", 0) if f"{name}.nin_shortcut.weight" in state else x
        return skip + h

    def attention(x, name):
        b, c, hh, ww = x.shape
        n = norm(x, f"{name}.norm")
        q, k, v = (conv(n, f"{name}.{p}", 0).reshape(b, c, hh * ww) for p in "qkv")
        weights = torch.softmax(torch.bmm(q.permute(0, 2, 1), k) * c ** -0.5, dim=2)
        out = torch.bmm(v, weights.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + conv(out, f"{name}.proj_out", 0)

    z = w("quantize.embedding.weight")[codes][None].permute(0, 3, 1, 2).contiguous()  # as the official lookup
    h = conv(conv(z, "post_quant_conv", 0), "decoder.conv_in")
    h = resnet(attention(resnet(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    for level in reversed(range(len(ddconfig["ch_mult"]))):
        for i in range(ddconfig["num_res_blocks"] + 1):
            h = resnet(h, f"decoder.up.{level}.block.{i}")
        if level:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{level}.upsample.conv")
    return conv(swish(norm(h, "decoder.norm_out")), "decoder.conv_out")[0]


def official_pixels(image: torch.Tensor) -> np.ndarray:
    """``ImageTokenizer._pil_from_chw_tensor``: clamp, (x + 1) / 2, x 255, truncated to uint8."""
    unit = (torch.clamp(image, -1.0, 1.0) + 1.0) / 2.0
    return (unit.permute(1, 2, 0).numpy() * 255).astype(np.uint8)


def generated_grid(seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """A generated Lumina-mGPT sequence for 64 px (4 rows of 4 image tokens + newline, end-of-image) and its
    codes by the vocabulary's names."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 8196, (4, 4), generator=g)
    tokens = torch.cat([ids, torch.full((4, 1), 8803)], 1).flatten().tolist() + [8196]
    codes = ids.clone().apply_(image_code)
    return tokens, codes


def decoded_matches(tmp_path, image_cls=ChameleonImage) -> bool:
    from chameleon_fixture import VQ_DDCONFIG
    ckpt, yaml_path = write_vqgan(tmp_path)
    image = image_cls(load_vqgan(ckpt, yaml_path), ChameleonConfig_(vocab_size=VOCAB_SIZE, image_size=IMAGE_SIZE),
                      chameleon.image_ids(vocabulary()))
    tokens, codes = generated_grid()
    expected = official_pixels(reference_decode(vq_state(), codes, VQ_DDCONFIG).detach())
    got = image(tokens)
    return got.shape == (64, 64, 3) and got.dtype == np.uint8 and np.array_equal(got, expected)


def test_vqgan_decoder_gives_the_official_pixels(tmp_path):
    assert decoded_matches(tmp_path)


def test_vqgan_decoder_is_bit_for_bit_the_reference_decoding_at_128_px(tmp_path):
    """The decoder's float output equals the independent decoding above exactly (8 x 8 codes, 128 px). A
    channels-last codebook lookup (the official one is made contiguous) rounds differently: it once moved a few
    pixels by 1 and the image test, at 64 px, did not see it."""
    from chameleon_fixture import VQ_DDCONFIG
    ckpt, yaml_path = write_vqgan(tmp_path)
    codes = torch.randint(0, 8192, (8, 8), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        ours = load_vqgan(ckpt, yaml_path)(codes)[0]
    assert torch.equal(ours, reference_decode(vq_state(), codes, VQ_DDCONFIG).detach())


def test_planted_fault_in_the_code_mapping_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(chameleon, "image_ids", lambda vocab: {t: t - 4 for t in range(4, 8196)})
    offset = lambda vq, cfg, table: ChameleonImage(vq, cfg, chameleon.image_ids(vocabulary()))  # noqa: E731
    assert not decoded_matches(tmp_path, offset)


@pytest.mark.parametrize("fault", ["rounded", "no-clamp"])
def test_planted_fault_in_the_pixel_conversion_is_caught(tmp_path, monkeypatch, fault):
    def rounded(image):
        unit = (image.detach().float().cpu().clamp(-1, 1) + 1) / 2
        return np.round(unit.permute(1, 2, 0).numpy() * 255).astype(np.uint8)

    def unclamped(image):
        unit = (image.detach().float().cpu() + 1) / 2
        return (unit.permute(1, 2, 0).numpy() * 255).astype(np.uint8)

    monkeypatch.setattr(chameleon_vq, "to_pixels", rounded if fault == "rounded" else unclamped)
    assert not decoded_matches(tmp_path)


def test_vqgan_loader_reads_only_tensors_and_is_strict(tmp_path):
    ckpt, yaml_path = write_vqgan(tmp_path)
    with pytest.raises(Exception):
        torch.load(ckpt, weights_only=True)  # the training leftover: the plain safe loader refuses the file
    assert load_vqgan(ckpt, yaml_path) is not None
    state = torch.load(ckpt, weights_only=False)
    state["state_dict"]["decoder.conv_out.weight"] = state["state_dict"]["decoder.conv_out.weight"][:, :-1]
    torch.save(state, ckpt)
    with pytest.raises(ValueError, match=r"decoder\.conv_out\.weight: file has \[3, 31, 3, 3\], model expects "
                                         r"\[3, 32, 3, 3\]"):
        load_vqgan(ckpt, yaml_path)
    del state["state_dict"]["decoder.conv_out.weight"]
    state["state_dict"]["decoder.extra.weight"] = torch.zeros(1)
    torch.save(state, ckpt)
    with pytest.raises(ValueError, match=r"missing key decoder\.conv_out\.weight; unexpected key decoder\.extra"):
        load_vqgan(ckpt, yaml_path)


# --- drafters -------------------------------------------------------------------------------------------------

def reference_drafter(state: dict, hf, inputs: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                      valid: torch.Tensor) -> torch.Tensor:
    """LANTERN's drafter with transformers' decoder layer: fc(cat(embedding, feature)), one layer, no norm."""
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer, ChameleonRotaryEmbedding
    config = hf_config(layers=1)
    config._attn_implementation = "eager"
    layer = ChameleonDecoderLayer(config, 0).eval()
    heads = config.num_attention_heads
    own = {k.removeprefix("layers.0."): v.float() for k, v in state.items() if k.startswith("layers.0.")}
    for part in ("q_norm", "k_norm"):
        for kind in ("weight", "bias"):
            rows = own[f"self_attn.{part}.{kind}"]
            own[f"self_attn.{part}.{kind}"] = rows.repeat_interleave(heads // rows.shape[0], 0)
    layer.load_state_dict(own)
    x = F.linear(torch.cat([inputs, features], -1), state["fc.weight"].float(), state["fc.bias"].float())
    rotary = ChameleonRotaryEmbedding(config)
    pos = (valid.long().cumsum(-1) - 1).clamp_min(0)
    length = x.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool).tril()[None] & valid[:, None, :]
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]
    with torch.no_grad():
        return layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, pos))[0]


@pytest.mark.parametrize("rows", [1, 4], ids=["lumina-one-row", "anole-per-head"])
def test_drafter_formats_load_strictly_and_match_lantern(tmp_path, rows):
    state = write_drafter(tmp_path, rows=rows, seed=5)
    target_cfg = ChameleonConfig_(vocab_size=VOCAB_SIZE, dim=32, n_layer=2, n_head=4, ffn_dim=64, image_size=64,
                                  prefix_slots=6, qk_norm_rows=4)
    drafter = load_chameleon_drafter(tmp_path, target_cfg)
    assert drafter.layers[0].self_attn.q_norm.weight.shape == (rows, 8)
    state = {k: v.float() for k, v in torch.load(tmp_path / "pytorch_model.bin").items()}
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 9, 32, generator=g)
    features[1, :3] = 0  # the unconditional row's padding slots: zero features
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, :3] = False
    inputs = torch.randn(2, 9, 32, generator=g)
    with torch.no_grad():
        ours = drafter(inputs, features, torch.arange(9))
    expected = reference_drafter(state, None, inputs, features, torch.arange(9), valid)
    assert torch.allclose(ours[0], expected[0], atol=1e-5)
    assert torch.allclose(ours[1, 3:], expected[1, 3:], atol=1e-5)
    cache = drafter.new_cache(2, 16)
    with torch.no_grad():
        first = drafter(inputs[:, :6], features[:, :6], torch.arange(6), cache, 0,
                        torch.ones(6, 6, dtype=torch.bool).tril())
        cache.commit(None, 6)
        rest = []
        for i in range(6, 9):
            rest.append(drafter(inputs[:, i:i + 1], features[:, i:i + 1], torch.tensor([i]), cache))
            cache.commit(None, 1)
        rest = torch.cat(rest, 1)
    assert torch.allclose(first[1, 3:], expected[1, 3:6], atol=1e-5)
    assert torch.allclose(rest, expected[:, 6:], atol=1e-5)
    saved = torch.load(tmp_path / "pytorch_model.bin")
    renamed = {("fc.weights" if k == "fc.weight" else k): v for k, v in saved.items()}
    torch.save(renamed, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing fc\.weight \(expected shape \[32, 64\]\)"):
        load_chameleon_drafter(tmp_path, target_cfg)


def test_drafter_config_refuses_grouped_queries():
    with pytest.raises(ValueError, match="grouped-query"):
        DrafterConfig.from_json({"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "vocab_size": 10})


# --- full size, memory ----------------------------------------------------------------------------------------

def transformers_7b_count() -> int:
    """transformers' Chameleon-7B (facebook/chameleon-7b's config), built on the meta device, without the VQ
    encoder it carries."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    with torch.device("meta"):
        model = ChameleonForConditionalGeneration(ChameleonConfig(vocabulary_map={"<image>": 8711}))
    return sum(p.numel() for name, p in model.named_parameters() if ".vqmodel." not in name)


def test_full_size_parameter_counts_match_the_official_model():
    ours = parameter_count(meta_target(CHAMELEON_7B))
    assert ours == transformers_7b_count() == 7_013_666_816
    lumina_rows = parameter_count(meta_target(chameleon.ChameleonConfig(qk_norm_rows=1)))
    assert ours - lumina_rows == 32 * 2 * 2 * (32 - 1) * 128  # q/k norm weights and biases stored once per layer
    need = chameleon.memory_needed(CHAMELEON_7B, torch.bfloat16)
    assert need["weights"] == 2 * ours


def test_a_device_too_small_is_refused_in_one_line(tiny, monkeypatch):
    monkeypatch.setattr(chameleon, "available_memory", lambda device: 10_000)
    with pytest.raises(MemoryError) as error:
        load_chameleon(tiny / "hf", IMAGE_SIZE, prefix_slots=40, progress=False)
    message = str(error.value)
    assert "\n" not in message and "needs about" in message and "only 0.0 GB is available" in message


def test_prompts_longer_than_the_prefix_are_refused(tiny):
    target = load_chameleon(tiny / "hf", IMAGE_SIZE, prefix_slots=8, progress=False)
    with pytest.raises(ValueError, match="prompt has 12 tokens with its template, at most 8 fit"):
        target.prefix(ChameleonPrompt(PROMPT), 2)


def test_tiny_directory_copies_keep_loading(tiny, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    from coolsd.models.bundle import load_bundle
    bundle = load_bundle(copy, device="cpu")
    prompt = bundle.text_encoder(["a red fox"])[0]
    assert prompt.tokens[0] == 0 and prompt.tokens[-4:] == (8710, 8197, 8806, 8806)
    assert bundle.target.position_rules is not None and bundle.config.image_tokens == 21
