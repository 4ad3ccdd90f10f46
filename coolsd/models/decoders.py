"""Image decoders: a row-major token grid -> uint8 RGB picture (:class:`coolsd.core.interface.ImageDecoder`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class CodebookShade:
    """For models without a trained pixel decoder (random-init ones): each token shown as one grey cell, its
    code vector's first coordinate scaled to 0..255."""

    def __init__(self, codebook: Tensor, grid_height: int, grid_width: int) -> None:
        shade = codebook[:, 0].float().cpu()
        self.levels = ((shade - shade.min()) / (shade.max() - shade.min() + 1e-12) * 255).round().to(torch.uint8)
        self.grid = (grid_height, grid_width)

    def __call__(self, tokens: list[int]) -> np.ndarray:
        grey = self.levels[torch.tensor(tokens, dtype=torch.long).view(self.grid)].numpy()
        return np.repeat(grey[..., None], 3, axis=-1)
