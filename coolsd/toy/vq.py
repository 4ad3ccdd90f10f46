"""LlamaGen-style VQ autoencoder: 32x32 images -> 8x8 grid of codes from an L2-normalised codebook."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from .data import to_uint8


@dataclass(frozen=True)
class VQConfig:
    codebook_size: int = 512
    code_dim: int = 8
    channels: tuple[int, ...] = (16, 32, 64)  # per resolution 32, 16, 8
    commitment: float = 0.25


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.GroupNorm(8, channels), nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1),
                                   nn.GroupNorm(8, channels), nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class Quantizer(nn.Module):
    """Nearest code by cosine similarity; both the encoder output and the codebook are L2-normalised."""

    def __init__(self, size: int, dim: int, commitment: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(size, dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / size, 1.0 / size)
        self.commitment = commitment

    @property
    def codebook(self) -> Tensor:
        return F.normalize(self.embedding.weight, dim=-1)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """z (N, D, H, W) -> (quantised z with straight-through gradient, codes (N, H, W), VQ loss)."""
        z = F.normalize(z.permute(0, 2, 3, 1), dim=-1)
        codes = (z @ self.codebook.t()).argmax(-1)
        zq = self.codebook[codes]
        loss = F.mse_loss(zq, z.detach()) + self.commitment * F.mse_loss(z, zq.detach())
        zq = z + (zq - z).detach()
        return zq.permute(0, 3, 1, 2), codes, loss

    def lookup(self, codes: Tensor) -> Tensor:
        return self.codebook[codes].permute(0, 3, 1, 2)


class VQModel(nn.Module):
    def __init__(self, cfg: VQConfig = VQConfig()) -> None:
        super().__init__()
        self.config = cfg
        c1, c2, c3 = cfg.channels
        self.encoder = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), ResBlock(c1),
            nn.Conv2d(c1, c2, 4, stride=2, padding=1), ResBlock(c2),
            nn.Conv2d(c2, c3, 4, stride=2, padding=1), ResBlock(c3),
            nn.GroupNorm(8, c3), nn.SiLU(), nn.Conv2d(c3, cfg.code_dim, 1))
        self.quantize = Quantizer(cfg.codebook_size, cfg.code_dim, cfg.commitment)
        self.decoder = nn.Sequential(
            nn.Conv2d(cfg.code_dim, c3, 3, padding=1), ResBlock(c3),
            nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c3, c2, 3, padding=1), ResBlock(c2),
            nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c2, c1, 3, padding=1), ResBlock(c1),
            nn.GroupNorm(8, c1), nn.SiLU(), nn.Conv2d(c1, 1, 3, padding=1))

    @property
    def device(self) -> torch.device:
        return self.quantize.embedding.weight.device

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Images in [-1, 1] (N, 1, 32, 32) -> (reconstruction, codes, VQ loss)."""
        zq, codes, loss = self.quantize(self.encoder(x))
        return self.decoder(zq), codes, loss

    @torch.no_grad()
    def encode(self, x: Tensor) -> Tensor:
        return self.quantize(self.encoder(x.to(self.device)))[1]

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        return self.decoder(self.quantize.lookup(codes.to(self.device)))

    def decode_to_uint8(self, codes: Tensor) -> np.ndarray:
        """Codes (N, 8, 8) -> uint8 pictures (N, 28, 28)."""
        return to_uint8(self.decode(codes).float().cpu()).numpy()


def save_tokenizer(model: VQModel, path: Path) -> None:
    save_model(model, path / "tokenizer.safetensors")
    (path / "tokenizer.json").write_text(json.dumps(asdict(model.config), indent=2) + "\n")


def load_tokenizer(path: Path) -> VQModel:
    cfg = json.loads((path / "tokenizer.json").read_text())
    model = VQModel(VQConfig(**{**cfg, "channels": tuple(cfg["channels"])}))
    load_model(model, path / "tokenizer.safetensors")
    return model.eval()


class VQDecoder:
    """The shipped tokenizer's decoder as the bundle's image decoder: tokens -> uint8 RGB (grey) picture."""

    def __init__(self, model: VQModel, grid_height: int, grid_width: int) -> None:
        self.model, self.grid = model, (grid_height, grid_width)

    def to(self, device) -> "VQDecoder":
        self.model.to(device)
        return self

    def __call__(self, tokens: list[int]) -> np.ndarray:
        grid = torch.tensor(tokens, dtype=torch.long).view(1, *self.grid)
        grey = self.model.decode_to_uint8(grid)[0]
        return np.repeat(grey[..., None], 3, axis=-1)


def load_decoder(path: Path, config) -> VQDecoder:
    """The bundle loader's hook (``coolsd.models.bundle.EXTRAS``)."""
    return VQDecoder(load_tokenizer(path), config.grid_height, config.grid_width)
