"""LlamaGen's VQ image tokenizer, decoder side only (spec section 7): image tokens -> RGB picture.

The structure follows LlamaGen's ``tokenizer/tokenizer_image/vq_model.py`` (VQ-16: downsampling factor 16,
16384 codes of dimension 8), written anew here; parameter names are those of the official checkpoints
(``quantize.embedding.weight``, ``post_quant_conv.*``, ``decoder.*``) so their state dicts load by name.

Decoding a (h, w) grid of tokens:

1. look up each token's code vector, the codebook rows L2-normalised first (``codebook_l2_norm``);
2. lay the vectors out as a (B, codebook_embed_dim, h, w) map (row-major tokens);
3. ``post_quant_conv`` (1x1, codebook_embed_dim -> z_channels);
4. the decoder: ``conv_in`` 3x3 to ``ch * ch_mult[-1]`` channels; the middle (ResnetBlock, AttnBlock,
   ResnetBlock); then one level per ``ch_mult`` entry, coarsest first, each ``num_res_blocks + 1`` ResnetBlocks
   (followed by an AttnBlock each at the coarsest level only) and, except at the last level, a 2x nearest
   upsampling followed by a 3x3 conv; finally GroupNorm, swish, ``conv_out`` 3x3 to RGB in about [-1, 1].
   Every norm is GroupNorm with 32 groups and eps 1e-6;
5. pixels ``clamp(127.5 x + 128, 0, 255)`` cast to uint8 (the cast truncates; the +128 instead of +127.5 makes
   that a round-half-up of ``127.5 (x + 1)``, exactly as LlamaGen's sampling scripts do).

Checkpoints: :func:`load_vq16` reads an official ``{"model": state_dict}`` file (or a bare state dict), keeps
the decoder-side tensors and ignores the encoder side (``encoder.*``, ``quant_conv.*``, the
``quantize.codebook_used`` training buffer).
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.params import number, shorten

# LlamaGen ModelArgs fields that only the encoder or training use: accepted in a configuration and ignored.
ENCODER_SIDE_FIELDS = ("codebook_show_usage", "commit_loss_beta", "entropy_loss_ratio", "encoder_ch_mult")
# State-dict prefixes this module owns; everything else in a checkpoint belongs to the encoder side.
DECODER_PREFIXES = ("quantize.embedding.", "post_quant_conv.", "decoder.")
GROUPS = 32  # LlamaGen's Normalize: GroupNorm(32 groups, eps 1e-6, affine)


@dataclass(frozen=True)
class VQArgs:
    """The decoder side of LlamaGen's VQ ``ModelArgs`` (same field names and defaults, VQ-16's ``ch_mult``),
    plus two ``Decoder`` constructor arguments that ModelArgs does not carry (``ch``, ``num_res_blocks``;
    LlamaGen always uses 128 and 2). ``dropout_p`` is accepted for completeness; decoding never drops."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128
    num_res_blocks: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoder_ch_mult", tuple(self.decoder_ch_mult))
        for name in ("codebook_size", "codebook_embed_dim", "z_channels", "ch"):
            number(name, getattr(self, name), 1, integer=True)
        number("num_res_blocks", self.num_res_blocks, 0, integer=True)
        if not self.decoder_ch_mult:
            raise ValueError("decoder_ch_mult must list at least one level")
        for mult in self.decoder_ch_mult:
            number("decoder_ch_mult entry", mult, 1, integer=True)
        for channels in {self.ch * mult for mult in self.decoder_ch_mult}:
            if channels % GROUPS:
                raise ValueError(f"decoder channels ch * mult = {channels} must be a multiple of {GROUPS} "
                                 f"(GroupNorm with {GROUPS} groups)")

    @property
    def downsample(self) -> int:
        """Pixels per token along each side: 2 ** (levels - 1) (16 for VQ-16)."""
        return 2 ** (len(self.decoder_ch_mult) - 1)

    @classmethod
    def of(cls, args: Any = None) -> VQArgs:
        """``args`` as VQArgs: a VQArgs, None (VQ-16's defaults), a mapping of ModelArgs fields, or any object
        with those attributes (LlamaGen's own ``ModelArgs``, a namespace). Encoder-side fields are ignored; an
        unknown field is a ValueError."""
        if args is None:
            return cls()
        if isinstance(args, cls):
            return args
        if isinstance(args, Mapping):
            fields = dict(args)
        elif dataclasses.is_dataclass(args):
            fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
        elif hasattr(args, "__dict__"):
            fields = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        else:
            raise ValueError(f"VQ arguments must be a mapping or an object of ModelArgs fields, got {shorten(args)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known - set(ENCODER_SIDE_FIELDS))
        if unknown:
            raise ValueError(f"unknown VQ argument(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**{k: v for k, v in fields.items() if k in known})


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6, affine=True)


def swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    """norm1, swish, conv1 (3x3), norm2, swish, (dropout), conv2 (3x3), plus the input, through a 1x1
    ``nin_shortcut`` when the channel count changes."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = group_norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all positions of the map: 1x1 ``q``, ``k``, ``v`` of the group-normed
    input, softmax(q k / sqrt(C)), 1x1 ``proj_out``, residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = group_norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, height, width = x.shape
        normed = self.norm(x)
        queries = self.q(normed).reshape(b, c, height * width).transpose(1, 2)  # (b, n, c)
        keys = self.k(normed).reshape(b, c, height * width)  # (b, c, n)
        values = self.v(normed).reshape(b, c, height * width)  # (b, c, n)
        weights = torch.softmax(torch.bmm(queries, keys) * (c ** -0.5), dim=2)  # (b, query, key)
        attended = torch.bmm(values, weights.transpose(1, 2)).reshape(b, c, height, width)
        return x + self.proj_out(attended)


class Upsample(nn.Module):
    """2x nearest-neighbour upsampling, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution of the decoder: ``res`` blocks, ``attn`` blocks (coarsest level only), ``upsample``."""

    def __init__(self, in_channels: int, out_channels: int, blocks: int, attention: bool, upsample: bool,
                 dropout: float) -> None:
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(in_channels if i == 0 else out_channels, out_channels, dropout)
                                 for i in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(out_channels) for _ in range(blocks if attention else 0))
        self.upsample = Upsample(out_channels) if upsample else None

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        return h if self.upsample is None else self.upsample(h)


class Decoder(nn.Module):
    """z map (B, z_channels, h, w) -> RGB (B, 3, h * 2^(levels-1), w * 2^(levels-1)), about [-1, 1]."""

    def __init__(self, args: VQArgs) -> None:
        super().__init__()
        mults, ch = args.decoder_ch_mult, args.ch
        channels = ch * mults[-1]
        self.conv_in = nn.Conv2d(args.z_channels, channels, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(channels, channels, args.dropout_p), AttnBlock(channels),
                                  ResnetBlock(channels, channels, args.dropout_p)])
        levels = []
        for index in reversed(range(len(mults))):  # coarsest first; conv_blocks.0 is the coarsest level
            levels.append(Level(channels, ch * mults[index], args.num_res_blocks + 1,
                                attention=index == len(mults) - 1, upsample=index != 0, dropout=args.dropout_p))
            channels = ch * mults[index]
        self.conv_blocks = nn.ModuleList(levels)
        self.norm_out = group_norm(channels)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantize(nn.Module):
    """Holds the codebook under LlamaGen's name (``quantize.embedding.weight``)."""

    def __init__(self, args: VQArgs) -> None:
        super().__init__()
        self.embedding = nn.Embedding(args.codebook_size, args.codebook_embed_dim)


class VQ16Decoder(nn.Module):
    """LlamaGen's VQ decoder side: tokens -> RGB in about [-1, 1]. Parameter names match the official
    checkpoints' decoder-side keys."""

    def __init__(self, args: Any = None) -> None:
        super().__init__()
        self.args = VQArgs.of(args)
        self.quantize = Quantize(self.args)
        self.post_quant_conv = nn.Conv2d(self.args.codebook_embed_dim, self.args.z_channels, 1)
        self.decoder = Decoder(self.args)

    def code_vectors(self) -> Tensor:
        """(codebook_size, codebook_embed_dim): the vectors tokens map to (rows L2-normalised if configured)."""
        weight = self.quantize.embedding.weight
        return F.normalize(weight, p=2, dim=-1) if self.args.codebook_l2_norm else weight

    def latents(self, tokens: Tensor) -> Tensor:
        """(B, h, w) token ids -> (B, codebook_embed_dim, h, w) code map (LlamaGen's get_codebook_entry)."""
        return self.code_vectors()[tokens].permute(0, 3, 1, 2).contiguous()

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, h, w) token ids -> (B, 3, H, W) float pixels in about [-1, 1] (LlamaGen's decode_code)."""
        return self.decoder(self.post_quant_conv(self.latents(tokens)))


def to_pixels(x: Tensor) -> Tensor:
    """Decoder output in about [-1, 1] -> uint8, as LlamaGen's sampling scripts: ``clamp(127.5 x + 128, 0,
    255)`` then a truncating cast."""
    return torch.clamp(127.5 * x + 128.0, 0, 255).to(torch.uint8)


class VQ16Image:
    """:class:`coolsd.core.interface.ImageDecoder` for a fixed token grid: a row-major list of ``h * w``
    tokens -> uint8 RGB (h * 16, w * 16, 3) for VQ-16. Runs in float32 on its module's device."""

    def __init__(self, model: VQ16Decoder, grid: int | tuple[int, int]) -> None:
        height, width = (grid, grid) if isinstance(grid, int) else tuple(grid)
        self.grid = (number("grid height", height, 1, integer=True), number("grid width", width, 1, integer=True))
        self.model = model.eval()

    @property
    def device(self) -> torch.device:
        return self.model.quantize.embedding.weight.device

    @property
    def shape(self) -> tuple[int, int, int]:
        """The picture's (H, W, 3)."""
        scale = self.model.args.downsample
        return self.grid[0] * scale, self.grid[1] * scale, 3

    @property
    def codebook(self) -> Tensor:
        """The code vectors the decoder looks up (L2-normalised rows), float32 on CPU: what LANTERN++
        neighbourhoods are measured in."""
        with torch.no_grad():
            return self.model.code_vectors().detach().float().cpu().clone()

    def to(self, device: torch.device | str) -> VQ16Image:
        self.model.to(device=device, dtype=torch.float32)
        return self

    def __call__(self, tokens: list[int]) -> np.ndarray:
        count, size = self.grid[0] * self.grid[1], self.model.args.codebook_size
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64).reshape(-1))
        if ids.numel() != count:
            raise ValueError(f"a {self.grid[0]}x{self.grid[1]} grid needs {count} tokens, got {ids.numel()}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise ValueError(f"tokens must be in [0, {size - 1}], got {int(ids.min())}..{int(ids.max())}")
        with torch.inference_mode():
            x = self.model(ids.view(1, *self.grid).to(self.device))
            return to_pixels(x)[0].permute(1, 2, 0).cpu().numpy()


def decoder_side(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The entries of a full VQ state dict that :class:`VQ16Decoder` owns."""
    return {key: value for key, value in state.items() if key.startswith(DECODER_PREFIXES)}


def load_vq16(path: str | Path, vq_args: Any = None, grid: int | tuple[int, int] = 16) -> VQ16Image:
    """An official LlamaGen VQ checkpoint (``{"model": state_dict}``, or a bare state dict) -> a
    :class:`VQ16Image` on CPU for ``grid``. Encoder-side entries are skipped; every decoder-side parameter
    must be present with its shape, and no unexpected decoder-side key may appear (else ValueError naming the
    first such key and the shapes)."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):  # LlamaGen saves its training args too
            loaded = torch.load(Path(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # e.g. a training checkpoint that pickles its argparse args
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else "")
        raise ValueError(f"{path}: not a plain tensor checkpoint; torch.load(weights_only=True) refused it "
                         f"({shorten(reason, 160)}). Re-save just its 'model' state dict.") from None
    state = loaded.get("model", loaded) if isinstance(loaded, Mapping) else None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict or {{'model': state_dict}}, got {shorten(type(loaded))}")
    model = VQ16Decoder(vq_args)
    expected = model.state_dict()
    found = decoder_side(state)
    for key, tensor in expected.items():
        if key not in found:
            raise ValueError(f"{path}: decoder key {key} is missing (expected shape {tuple(tensor.shape)}, "
                             f"found none)")
        if found[key].shape != tensor.shape:
            raise ValueError(f"{path}: decoder key {key} has shape {tuple(found[key].shape)}, expected "
                             f"{tuple(tensor.shape)}")
    for key in found:
        if key not in expected:
            raise ValueError(f"{path}: unexpected decoder key {key} (shape {tuple(found[key].shape)}; expected "
                             f"shape none: this architecture has no such parameter)")
    model.load_state_dict({key: value.float() for key, value in found.items()}, strict=True)
    return VQ16Image(model.eval(), grid)
