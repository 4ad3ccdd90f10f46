"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (IDX files, MIT licence)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

FASHION_DIR = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot"]
MISSING = ("Fashion-MNIST not found in {dir}. Install it with:\n"
           "    apt-get install -y dataset-fashion-mnist\n"
           "or point FASHION_MNIST_DIR at a folder holding the four IDX .gz files.")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped) -> array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_split(split: str, directory: Path = FASHION_DIR) -> tuple[torch.Tensor, torch.Tensor]:
    """``train`` or ``test`` -> (images uint8 (N, 28, 28), labels int64 (N,))."""
    prefix = {"train": "train", "test": "t10k"}[split]
    images, labels = (directory / f"{prefix}-images-idx3-ubyte.gz", directory / f"{prefix}-labels-idx1-ubyte.gz")
    if not images.exists() or not labels.exists():
        raise FileNotFoundError(MISSING.format(dir=directory))
    return torch.from_numpy(read_idx(images).copy()), torch.from_numpy(read_idx(labels).astype(np.int64))


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 28, 28) -> float (N, 1, 32, 32) in [-1, 1], padded by 2 pixels of background."""
    x = images.float().div(127.5).sub(1.0)[:, None]
    return torch.nn.functional.pad(x, (2, 2, 2, 2), value=-1.0)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """float (N, 1, 32, 32) in [-1, 1] -> uint8 (N, 28, 28), the padding cropped away."""
    return x[:, 0, 2:30, 2:30].clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
