"""The quality judge: a small Fashion-MNIST classifier whose penultimate features also drive an FID.

Class consistency = share of samples the judge puts in the class they were generated for. FID is
torchmetrics' Frechet distance in the judge's 128-d feature space against the shipped test-set statistics.
Per image, the judge gives its features and whether it agrees with the requested class; the benchmark
resamples those for paired bootstrap intervals, with :func:`coolsd.core.stats.frechet_distance` as the FID.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance

from ..core.stats import frechet_distance, symmetric_sqrt

REFERENCE_KEYS = ("real_features_sum", "real_features_cov_sum", "real_features_num_samples")


class Judge(nn.Module):
    num_features = 128

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, self.num_features), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.25), nn.Linear(self.num_features, 10))
        self.reference: dict[str, Tensor] | None = None  # test-set feature statistics for the FID

    @property
    def device(self) -> torch.device:
        return self.head[1].weight.device

    def features(self, images: Tensor) -> Tensor:
        """uint8 images (N, 28, 28) or float images in [0, 1] (N, 1, 28, 28) -> (N, 128)."""
        x = images.to(self.device)
        if x.dtype == torch.uint8:
            x = x.float().div(255.0)
        return self.body(x if x.dim() == 4 else x[:, None])

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


class JudgeFeatures(nn.Module):
    """The judge's feature map in the form torchmetrics expects of a custom FID extractor."""

    def __init__(self, judge: Judge) -> None:
        super().__init__()
        self.judge = judge
        self.num_features = judge.num_features

    def forward(self, images: Tensor) -> Tensor:
        return self.judge.features(images)


def new_fid(judge: Judge, reference: dict[str, Tensor] | None = None) -> FrechetInceptionDistance:
    """An FID metric on the judge's features, with the real-image statistics preloaded when given."""
    fid = FrechetInceptionDistance(feature=JudgeFeatures(judge).eval(), reset_real_features=reference is None)
    if reference is not None:
        for key in REFERENCE_KEYS:
            setattr(fid, key, reference[key].to(getattr(fid, key).dtype))
    return fid


@torch.no_grad()
def reference_statistics(judge: Judge, images: Tensor, batch: int = 1000) -> dict[str, Tensor]:
    """Sums of the judge features and their outer products over real images (what the FID needs of them)."""
    fid = new_fid(judge.eval())
    for start in range(0, len(images), batch):
        fid.update(images[start:start + batch], real=True)
    return {key: getattr(fid, key).cpu() for key in REFERENCE_KEYS}


@torch.no_grad()
def predict(judge: Judge, images: Tensor, batch: int = 2000) -> Tensor:
    """The judge's class for each uint8 image (N, 28, 28), on the CPU."""
    judge.eval()
    return torch.cat([judge(images[i:i + batch]).argmax(-1).cpu() for i in range(0, len(images), batch)])


@torch.no_grad()
def fid_to_reference(judge: Judge, images: Tensor) -> float:
    """Judge-FID of uint8 images (N, 28, 28) against the shipped test-set statistics."""
    fid = new_fid(judge.eval(), judge.reference)
    fid.update(images, real=False)
    return float(fid.compute())


def reference_moments(reference: dict[str, Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance of the real images' features from the stored sums (torchmetrics' formulas)."""
    count = float(reference["real_features_num_samples"])
    mean = reference["real_features_sum"].double().numpy() / count
    scatter = reference["real_features_cov_sum"].double().numpy() - count * np.outer(mean, mean)
    return mean, scatter / (count - 1)


def grey(images: list[np.ndarray]) -> Tensor:
    """Decoded pictures (H, W, 3) or (H, W) -> a uint8 batch (N, H, W) of the grey images the judge reads."""
    return torch.from_numpy(np.stack([image[..., 0] if image.ndim == 3 else image for image in images]))


def judge_metrics(judge: Judge, images: list[np.ndarray], classes: list[int]) -> dict:
    """``judge_accuracy`` (class consistency) and ``fid`` of generated uint8 images against the test set."""
    batch = grey(images)
    accuracy = float((predict(judge, batch) == torch.tensor(classes)).float().mean())
    out = {"judge_accuracy": accuracy, "fid_images": len(images)}
    if len(images) >= 2:
        out["fid"] = fid_to_reference(judge, batch)
    return out


class JudgeQuality:
    """The bundle's optional quality metrics for the shipped model: the judge's class consistency and FID."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.num_features = judge.num_features

    def __call__(self, images: list[np.ndarray], classes: list[int]) -> dict:
        return judge_metrics(self.judge, images, classes)

    @torch.no_grad()
    def per_image(self, images: list[np.ndarray], classes: list[int]) -> dict[str, np.ndarray]:
        """Each image's judge features (N, 128) float32 and whether the judge's class is the requested one (N,):
        what a paired bootstrap of FID and class consistency resamples."""
        features = self.judge.eval().features(grey(images))
        predicted = self.judge.head(features).argmax(-1).cpu()
        return {"features": features.cpu().numpy(), "correct": (predicted == torch.tensor(classes)).numpy()}

    @cached_property
    def _reference(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mean, cov = reference_moments(self.judge.reference)
        return mean, cov, symmetric_sqrt(cov)

    def fid(self, features: np.ndarray) -> float:
        """FID of feature rows (from :meth:`per_image`) against the shipped test-set statistics."""
        return frechet_distance(features, *self._reference)


def save_judge(judge: Judge, reference: dict[str, Tensor], path: Path) -> None:
    save_model(judge, path / "judge.safetensors")
    save_file({k: v.contiguous() for k, v in reference.items()}, path / "judge_reference.safetensors")


def load_judge(path: Path) -> Judge:
    judge = Judge()
    load_model(judge, path / "judge.safetensors")
    judge.reference = load_file(path / "judge_reference.safetensors")
    return judge.eval()


def load_quality(path: Path, config=None) -> JudgeQuality:
    """The bundle loader's hook (``coolsd.models.bundle.EXTRAS``)."""
    return JudgeQuality(load_judge(path))
