"""FID from feature rows (coolsd.core.stats.frechet_distance, numpy) against torchmetrics' independent
implementation, and the judge's per-image outputs against its batch metrics (what the benchmark's paired
bootstrap of FID and class consistency resamples)."""

import numpy as np
import pytest
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from coolsd.core.stats import frechet_distance, symmetric_sqrt
from coolsd.toy.judge import Judge, JudgeQuality, reference_moments, reference_statistics


class Identity(nn.Module):
    """torchmetrics' feature extractor that hands the features through unchanged."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, features):
        return features


def torchmetrics_fid(generated: np.ndarray, real: np.ndarray) -> float:
    fid = FrechetInceptionDistance(feature=Identity(real.shape[1]))
    fid.update(torch.from_numpy(real).double(), real=True)
    fid.update(torch.from_numpy(generated).double(), real=False)
    return float(fid.compute())


def relu_features(rng, n: int, mixing: np.ndarray, shift: float) -> np.ndarray:
    """Correlated, partly dead (ReLU) feature rows like a classifier's penultimate layer."""
    return np.maximum(rng.normal(shift, 1, (n, mixing.shape[0])) @ mixing, 0).astype(np.float32)


@pytest.mark.parametrize("dims, n", [(16, 300), (128, 400), (128, 60)])  # the last: singular sample covariance
def test_frechet_distance_matches_torchmetrics(dims, n):
    rng = np.random.default_rng(dims + n)
    real = relu_features(rng, 3000, rng.normal(0, 0.3, (dims, dims)), 0.0)
    generated = relu_features(rng, n, rng.normal(0, 0.3, (dims, dims)), 0.2)
    mean, cov = real.astype(np.float64).mean(0), np.cov(real.astype(np.float64), rowvar=False)
    ours = frechet_distance(generated, mean, cov, symmetric_sqrt(cov))
    assert ours == pytest.approx(torchmetrics_fid(generated, real), rel=1e-4)
    # every term counts: a mean shift alone, and a covariance change alone, both move it as torchmetrics says
    for moved in (generated + 0.5, generated * 1.5):
        assert frechet_distance(moved, mean, cov, symmetric_sqrt(cov)) == pytest.approx(
            torchmetrics_fid(moved, real), rel=1e-4)
    assert frechet_distance(real, mean, cov, symmetric_sqrt(cov)) == pytest.approx(0, abs=1e-6)


def test_symmetric_sqrt_squares_back():
    a = np.random.default_rng(0).normal(size=(20, 8))
    cov = a.T @ a
    root = symmetric_sqrt(cov)
    assert np.allclose(root @ root, cov) and np.allclose(root, root.T)


def test_judge_per_image_outputs_agree_with_its_batch_metrics():
    torch.manual_seed(0)
    judge = Judge().eval()
    rng = np.random.default_rng(1)
    real = torch.from_numpy(rng.integers(0, 256, (500, 28, 28), dtype=np.uint8))
    judge.reference = reference_statistics(judge, real)
    quality = JudgeQuality(judge)
    images = [rng.integers(0, 256, (28, 28, 3), dtype=np.uint8) for _ in range(200)]
    classes = [i % 10 for i in range(200)]
    batch = quality(images, classes)
    per_image = quality.per_image(images, classes)
    assert per_image["features"].shape == (200, 128) and per_image["features"].dtype == np.float32
    assert per_image["correct"].shape == (200,)
    assert per_image["correct"].mean() == pytest.approx(batch["judge_accuracy"], abs=1e-6)
    assert 0 < per_image["correct"].sum() < 200  # both outcomes occur, so the comparison means something
    assert quality.fid(per_image["features"]) == pytest.approx(batch["fid"], rel=1e-4)
    mean, _ = reference_moments(judge.reference)
    assert mean.shape == (128,)
    # one image at a time gives the same outputs as the batch (the benchmark judges image by image)
    single = quality.per_image(images[:1], classes[:1])
    assert np.allclose(single["features"][0], per_image["features"][0], atol=1e-5)
    assert single["correct"][0] == per_image["correct"][0]
