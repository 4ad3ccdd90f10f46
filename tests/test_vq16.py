"""LlamaGen's VQ-16 decoder side (coolsd/models/vq16.py): official checkpoint names load, mismatches are refused
with the key and shapes, the first layers and the pixel mapping equal computations written here from the spec
(section 7), and the full-size decoder has LlamaGen's parameter count and output size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coolsd.core.interface import ImageDecoder
from coolsd.models.vq16 import VQ16Decoder, VQ16Image, VQArgs, load_vq16, to_pixels

TINY = {"codebook_size": 32, "codebook_embed_dim": 8, "decoder_ch_mult": (1, 2), "z_channels": 32, "ch": 32}
GRID = (3, 4)  # tokens: 3 rows x 4 columns -> 6 x 8 pixels with two levels (one 2x upsampling)


def tiny_model(seed: int = 0, **overrides) -> VQ16Decoder:
    torch.manual_seed(seed)
    model = VQ16Decoder({**TINY, **overrides}).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():  # far from init; GroupNorm affine not the identity
            if param.dim() == 4:  # convolutions: outputs of order one, some beyond [-1, 1] at the end
                param.normal_(0.0, 1.5 / param[0].numel() ** 0.5)
            else:
                param.normal_(1.0 if name.endswith("weight") and "norm" in name else 0.0, 0.3)
    return model


def official_file(tmp_path, model: VQ16Decoder, wrap: bool = True, edit=None):
    """``model``'s weights as LlamaGen saves them: with encoder-side entries and (``wrap``) under "model"."""
    state = {key: value.clone() for key, value in model.state_dict().items()}
    state.update({"encoder.conv_in.weight": torch.randn(32, 3, 3, 3), "encoder.conv_in.bias": torch.randn(32),
                  "quant_conv.weight": torch.randn(8, 32, 1, 1), "quant_conv.bias": torch.randn(8),
                  "quantize.codebook_used": torch.zeros(65536)})
    if edit is not None:
        edit(state)
    path = tmp_path / "vq.pt"
    torch.save({"model": state} if wrap else state, path)
    return path


def tokens_for(grid=GRID, seed: int = 1, size: int = 32) -> list[int]:
    return torch.randint(0, size, (grid[0] * grid[1],), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("wrap", [True, False])
def test_an_official_state_dict_loads_by_name_skipping_the_encoder_side(tmp_path, wrap):
    model = tiny_model()
    image = load_vq16(official_file(tmp_path, model, wrap), TINY, GRID)
    assert isinstance(image, ImageDecoder) and image.to("cpu") is image
    loaded = image.model.state_dict()
    assert set(loaded) == set(model.state_dict())
    assert all(torch.equal(loaded[key], value) for key, value in model.state_dict().items())
    tokens = tokens_for()
    pixels = image(tokens)
    assert pixels.shape == (6, 8, 3) and pixels.dtype == np.uint8 and image.shape == (6, 8, 3)
    assert np.array_equal(pixels, VQ16Image(model, GRID)(tokens))
    assert len(set(pixels.reshape(-1).tolist())) > 10  # a real picture, not a constant


def test_a_renamed_decoder_tensor_is_refused_naming_it(tmp_path):
    def rename(state):
        state["decoder.mid.1.query.weight"] = state.pop("decoder.mid.1.q.weight")
    with pytest.raises(ValueError, match=r"decoder key decoder\.mid\.1\.q\.weight is missing \(expected shape "
                                         r"\(64, 64, 1, 1\), found none\)"):
        load_vq16(official_file(tmp_path, tiny_model(), edit=rename), TINY, GRID)


def test_a_reshaped_decoder_tensor_is_refused_with_both_shapes(tmp_path):
    def reshape(state):
        state["decoder.conv_out.weight"] = torch.zeros(3, 16, 3, 3)
    with pytest.raises(ValueError, match=r"decoder key decoder\.conv_out\.weight has shape \(3, 16, 3, 3\), "
                                         r"expected \(3, 32, 3, 3\)"):
        load_vq16(official_file(tmp_path, tiny_model(), edit=reshape), TINY, GRID)
    # the codebook too: a 16-code file for a 32-code configuration
    def fewer_codes(state):
        state["quantize.embedding.weight"] = torch.randn(16, 8)
    with pytest.raises(ValueError, match=r"quantize\.embedding\.weight has shape \(16, 8\), expected \(32, 8\)"):
        load_vq16(official_file(tmp_path, tiny_model(), edit=fewer_codes), TINY, GRID)


def test_an_unexpected_decoder_key_is_refused(tmp_path):
    def extra(state):
        state["decoder.conv_blocks.0.attn.9.q.weight"] = torch.zeros(64, 64, 1, 1)
    with pytest.raises(ValueError, match=r"unexpected decoder key decoder\.conv_blocks\.0\.attn\.9\.q\.weight"):
        load_vq16(official_file(tmp_path, tiny_model(), edit=extra), TINY, GRID)


def captured(model: VQ16Decoder, module: torch.nn.Module, tokens: list[int]):
    """Run the picture decoder on ``tokens``; return (pixels, ``module``'s input, ``module``'s output)."""
    seen = {}
    hook = module.register_forward_hook(lambda _, inputs, output: seen.update(x=inputs[0], y=output))
    try:
        pixels = VQ16Image(model, GRID)(tokens)
    finally:
        hook.remove()
    return pixels, seen["x"].double().numpy(), seen["y"].double().numpy()


def test_lookup_normalisation_and_post_quant_conv_match_the_spec():
    """Spec: codebook rows L2-normalised, looked up, laid out (B, 8, h, w) row-major; then the 1x1 conv."""
    model, tokens = tiny_model(), tokens_for()
    _, decoder_input, _ = captured(model, model.decoder, tokens)
    codebook = model.quantize.embedding.weight.detach().double().numpy()
    unit = codebook / np.sqrt((codebook ** 2).sum(axis=1, keepdims=True))
    grid = unit[tokens].reshape(GRID[0], GRID[1], 8)  # token r * w + c at cell (r, c)
    weight = model.post_quant_conv.weight.detach().double().numpy()[:, :, 0, 0]  # (32, 8)
    bias = model.post_quant_conv.bias.detach().double().numpy()
    expected = np.einsum("oc,rwc->orw", weight, grid) + bias[:, None, None]
    assert decoder_input.shape == (1, 32, *GRID)
    np.testing.assert_allclose(decoder_input[0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(VQ16Image(model, GRID).codebook.double().numpy(), unit, atol=1e-6)


def group_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, groups: int = 32, eps: float = 1e-6):
    c, h, w = x.shape
    g = x.reshape(groups, -1)
    normed = ((g - g.mean(axis=1, keepdims=True)) / np.sqrt(g.var(axis=1, keepdims=True) + eps)).reshape(c, h, w)
    return normed * weight[:, None, None] + bias[:, None, None]


def test_the_middle_attention_block_matches_the_spec():
    """Single-head attention over the h*w positions: softmax_j(q_i . k_j / sqrt(C)), output sum_j a_ij v_j,
    through proj_out, plus the input."""
    model = tiny_model()
    block = model.decoder.mid[1]
    _, x, y = captured(model, block, tokens_for())
    p = {name: value.detach().double().numpy() for name, value in block.named_parameters()}
    x = x[0]
    c = x.shape[0]
    normed = group_norm(x, p["norm.weight"], p["norm.bias"]).reshape(c, -1)  # (C, N)
    q, k, v = ((p[f"{n}.weight"][:, :, 0, 0] @ normed) + p[f"{n}.bias"][:, None] for n in "qkv")
    scores = q.T @ k / np.sqrt(c)  # (query, key)
    attention = np.exp(scores - scores.max(axis=1, keepdims=True))
    attention /= attention.sum(axis=1, keepdims=True)
    out = p["proj_out.weight"][:, :, 0, 0] @ (v @ attention.T) + p["proj_out.bias"][:, None]
    np.testing.assert_allclose(y[0], x + out.reshape(x.shape), rtol=1e-4, atol=1e-4)


def test_pixels_are_clamp_127_5x_plus_128_truncated_as_llamagen_casts():
    """LlamaGen's sampling scripts: ``torch.clamp(127.5 * x + 128.0, 0, 255).to(torch.uint8)`` (a truncating
    cast; sample_t2i.py's save_image(normalize, value_range=(-1, 1)) computes the same (x+1)/2*255 + 0.5)."""
    x = torch.tensor([-2.0, -1.0, -0.999, -0.99, 0.0, 0.5, 10.99 / 127.5 - 128 / 127.5, 0.996, 0.997, 1.0, 3.0])
    # 127.5 x + 128:  -127, 0.5, 0.63, 1.78, 128, 191.75, 10.99, 254.99, 255.12, 255.5, 510.5
    assert to_pixels(x).tolist() == [0, 0, 0, 1, 128, 191, 10, 254, 255, 255, 255]
    model, tokens = tiny_model(seed=3), tokens_for(seed=4)
    pixels, _, final = captured(model, model.decoder.conv_out, tokens)
    final = final.astype(np.float32)[0]  # (3, H, W), the decoder's last layer
    assert (final < -1).any() and (final > 1).any()  # the clamp is exercised
    expected = np.clip(np.float32(127.5) * final + np.float32(128.0), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    assert np.array_equal(pixels, expected)
    assert np.abs(pixels.astype(int) - np.floor(np.clip(127.5 * (final.astype(np.float64) + 1) + 0.5, 0, 255))
                  .transpose(1, 2, 0)).max() <= 1  # i.e. round-half-up of 127.5 (x + 1), up to float error


def test_a_16_by_16_grid_makes_a_256_pixel_picture():
    """Five levels upsample 16x: 16 x 16 tokens -> 256 x 256 x 3 (a narrow model keeps this fast)."""
    model = tiny_model(decoder_ch_mult=(1, 1, 1, 1, 1), num_res_blocks=0)
    image = VQ16Image(model, 16)
    assert image.shape == (256, 256, 3)
    pixels = image(tokens_for((16, 16)))
    assert pixels.shape == (256, 256, 3) and pixels.dtype == np.uint8
    with pytest.raises(ValueError, match="needs 256 tokens, got 255"):
        image(tokens_for((16, 16))[:-1])
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 31\]"):
        image([32] * 256)


def test_full_size_vq16_decoder_has_llamagen_parameter_count_and_shapes():
    """ch 128, ch_mult [1,1,2,2,4], z 256, codebook 16384 x 8, 2 res blocks, GroupNorm(32). Counted by hand
    (conv: in*out*k*k + out; GroupNorm: 2C; ResnetBlock R(i,o) = 2i + 9io + o + 2o + 9o^2 + o [+ io + o if i != o];
    AttnBlock A(C) = 4C^2 + 6C; Upsample U(C) = 9C^2 + C):
      codebook 16384*8 = 131,072; post_quant_conv 8*256 + 256 = 2,304;
      decoder: conv_in 9*256*512 + 512 = 1,180,160; mid 2 R(512,512) + A(512) = 10,494,976;
      level ch 512: 3 R(512,512) + 3 A(512) + U(512) = 19,679,744;
      level 256: R(512,256) + 2 R(256,256) + U(256) = 4,855,296; level 256: 3 R(256,256) + U(256) = 4,133,632;
      level 128: R(256,128) + 2 R(128,128) + U(128) = 1,215,232; level 128: 3 R(128,128) = 887,040;
      norm_out 256; conv_out 9*128*3 + 3 = 3,459  ->  decoder 42,449,795; decoder side 42,583,171.
    (LlamaGen's own VQ_16() on the meta device gives the same decoder-side total, 71,883,403 with the encoder.)"""
    with torch.device("meta"):
        model = VQ16Decoder(VQArgs())
        out = model(torch.zeros(1, 16, 16, dtype=torch.long))
    assert sum(p.numel() for p in model.decoder.parameters()) == 42_449_795
    assert sum(p.numel() for p in model.parameters()) == 42_583_171
    assert len(model.state_dict()) == 197
    assert tuple(out.shape) == (1, 3, 256, 256)
    assert model.args.downsample == 16
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    assert shapes["quantize.embedding.weight"] == (16384, 8)
    assert shapes["post_quant_conv.weight"] == (256, 8, 1, 1)
    assert shapes["decoder.conv_in.weight"] == (512, 256, 3, 3)
    assert shapes["decoder.conv_blocks.0.attn.2.proj_out.weight"] == (512, 512, 1, 1)
    assert shapes["decoder.conv_blocks.1.res.0.nin_shortcut.weight"] == (256, 512, 1, 1)
    assert shapes["decoder.conv_blocks.3.upsample.conv.weight"] == (128, 128, 3, 3)
    assert "decoder.conv_blocks.4.upsample.conv.weight" not in shapes
    assert shapes["decoder.conv_out.weight"] == (3, 128, 3, 3)


def test_llamagen_model_args_configure_it():
    """LlamaGen's ModelArgs fields (encoder-side ones ignored); an unknown field or a channel count GroupNorm's
    32 groups cannot split is refused."""
    fields = {"codebook_size": 16384, "codebook_embed_dim": 8, "codebook_l2_norm": True,
              "codebook_show_usage": True, "commit_loss_beta": 0.25, "entropy_loss_ratio": 0.0,
              "encoder_ch_mult": [1, 1, 2, 2, 4], "decoder_ch_mult": [1, 1, 2, 2, 4], "z_channels": 256,
              "dropout_p": 0.0}
    assert VQArgs.of(fields) == VQArgs()
    with pytest.raises(ValueError, match="unknown VQ argument.*codebook_dim"):
        VQArgs.of({"codebook_dim": 8})
    with pytest.raises(ValueError, match="multiple of 32"):
        VQArgs(ch=16)
