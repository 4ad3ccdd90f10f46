"""The shipped default model: it loads in one call, every method makes a proper image, and it fits in assets/."""

import json

import numpy as np
import pytest
import torch
from helpers import named

from coolsd.core.rules import METHODS
from coolsd.models.bundle import ASSETS, DEFAULT_MODEL, load_bundle
from coolsd.toy.judge import judge_metrics
from coolsd.toy.vq import VQDecoder


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(device="cpu")


def test_bundle_loads_with_every_part(bundle):
    assert bundle.name == "fashion"
    judge = bundle.quality.judge
    assert bundle.drafter is not None and isinstance(bundle.decoder, VQDecoder) and judge is not None
    assert judge.reference is not None and int(judge.reference["real_features_num_samples"]) == 10_000
    cfg = bundle.config
    assert cfg.n_layer >= 8 and cfg.image_tokens >= 49 and cfg.class_dropout == 0.1
    assert 512 <= cfg.vocab_size <= 1024
    norms = bundle.codebook.norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)  # L2-normalised codebook
    assert len(bundle.class_names) == cfg.num_classes == 10


@pytest.mark.parametrize("method, params", [("ar", {}), ("eagle", {}), ("uniform", {"delta": 2.0}),
                                            ("cool", {"delta": 2.0}), ("lantern", {"k": 10, "lambda": 5.0}),
                                            ("lantern", {"k": 5, "lambda": 2.0, "residual": "lantern"})])
def test_one_image_per_method(bundle, method, params):
    assert method in METHODS
    result = named(bundle, 3, method, params, "tree:eagle25", bundle.sampling, seed=1)
    pixels = bundle.image(result.tokens)
    assert pixels.shape == (28, 28, 3) and pixels.dtype == np.uint8
    assert (pixels == pixels[..., :1]).all()  # grey: the three channels agree
    assert pixels.max() > 100  # not a blank picture
    assert len(result.tokens) == bundle.config.image_tokens
    assert all(0 <= t < bundle.config.vocab_size for t in result.tokens)


def test_generated_garment_is_recognised(bundle):
    """A handful of AR samples per class: the judge recognises most of them."""
    images, classes = [], []
    for cls in range(10):
        for seed in range(3):
            images.append(bundle.image(named(bundle, cls, "ar", {}, "chain:5", bundle.sampling, seed).tokens))
            classes.append(cls)
    assert judge_metrics(bundle.quality.judge, images, classes)["judge_accuracy"] >= 0.6


def test_assets_fit_and_are_documented():
    total = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert total < 60 * 2**20
    card = (DEFAULT_MODEL / "README.md").read_text()
    assert "MIT" in card and "python -m coolsd.train" in card
    for name in ("samples.png", "metrics.json", "bench_results.json", "config.json"):
        assert (DEFAULT_MODEL / name).exists(), name
    runs = json.loads((DEFAULT_MODEL / "bench_results.json").read_text())["runs"]
    assert all("judge_accuracy" in r and "fid" in r for r in runs)
    assert not list(ASSETS.rglob("*.pt")) and not list(ASSETS.rglob("*.ckpt"))  # safetensors only


def test_large_codebook_neighbours_are_cached_on_disk(tmp_path, monkeypatch):
    """A 16384-code book keeps only the first columns of its neighbour table, on disk, and reads them back
    equal to a fresh computation."""
    from coolsd.models import bundle as bundle_module
    monkeypatch.setenv("COOLSD_CACHE", str(tmp_path))
    codebook = torch.nn.functional.normalize(torch.randn(bundle_module.DISK_CACHE_CODES, 8,
                                                         generator=torch.Generator().manual_seed(0)), dim=-1)
    first = bundle_module.neighbour_table(codebook, 11)
    files = list((tmp_path / "neighbours").glob("*.npy"))
    assert len(files) == 1 and np.load(files[0]).shape == (len(codebook), 11) and np.load(files[0]).dtype == np.int16
    again = bundle_module.neighbour_table(codebook, 11)
    assert np.array_equal(first, again)
    rows = torch.arange(50)
    distances = torch.cdist(codebook[rows], codebook)
    distances[rows, rows] = float("inf")
    assert np.array_equal(first[:50], torch.topk(distances, 11, largest=False).indices.numpy())


def test_a_cpu_bundle_keeps_its_weights_column_major_with_the_same_values_and_saves_them(bundle, tmp_path):
    """On a CPU every linear weight is stored column-major (the layout the CPU's matrix multiply reads fastest):
    the same values as the file's, a forward equal to the row-major one to float32 rounding, and a bundle that
    saves and loads back unchanged."""
    from safetensors.torch import load_file

    from coolsd.models.bundle import save_bundle
    stored = load_file(DEFAULT_MODEL / "target.safetensors")
    linears = [(name, m) for name, m in bundle.target.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 5 * bundle.config.n_layer + 1
    for name, module in linears:
        assert module.weight.stride() == (1, module.weight.shape[0]), name
        assert torch.equal(module.weight, stored[name + ".weight"]), name
    x = torch.randn(2, 6, bundle.config.dim)
    layer = bundle.target.layers[0].feed_forward.w1
    row_major = layer.weight.contiguous()
    assert row_major.stride(1) == 1
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, row_major), rtol=1e-5, atol=1e-6)
    save_bundle(bundle, tmp_path)
    again = load_file(tmp_path / "target.safetensors")
    assert all(torch.equal(again[key], stored[key]) for key in stored)
