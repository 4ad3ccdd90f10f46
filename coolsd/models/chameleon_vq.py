"""The Chameleon VQGAN's decoder side and the token-id -> code table: generated tokens to pixels (spec
section 10); implements :class:`coolsd.core.interface.ImageDecoder`.

Facts read from Lumina-mGPT's ``model/chameleon_vae_ori/vqgan.py`` (taming-transformers' VQModel) and
``image_tokenizer.py``, and from ``item_processor.decode_image``:

* ``vqgan.yaml``: ``model.params`` holds ``n_embed`` (8192), ``embed_dim`` (256) and ``ddconfig`` (``ch`` 128,
  ``ch_mult`` 1,1,2,2,4, ``num_res_blocks`` 2, ``attn_resolutions`` empty, ``z_channels``, ``resolution``,
  ``out_ch``); ``vqgan.ckpt`` holds the weights under ``state_dict`` (the official loader reads it non-strictly;
  the encoder side and training leftovers are not needed to decode).
* Decoding: ``quantize.embedding`` rows (h, w, embed_dim) -> ``post_quant_conv`` (1x1) -> decoder: ``conv_in``,
  mid (ResNet block, attention block, ResNet block), up levels from the coarsest (``num_res_blocks + 1`` ResNet
  blocks, attention where the resolution is listed, nearest x2 upsampling and a 3x3 conv but at level 0),
  GroupNorm(32, eps 1e-6), swish, ``conv_out``. ResNet block: norm, swish, conv, norm, swish, conv, plus the
  input (through a 1x1 ``nin_shortcut`` when the width changes).
* Pixels: ``clamp(-1, 1)``, ``(x + 1) / 2``, ``* 255``, truncated to uint8.
* Tokens: newline columns (the last of each row of ``w + 1``) and end-of-image are dropped, then each token
  id maps to its code through the vocabulary's image-token names.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .chameleon import ChameleonConfig
from .vq16 import AttnBlock, ResnetBlock, Upsample, group_norm, swish  # taming's blocks, the same names

DECODER_PREFIXES = ("decoder.", "post_quant_conv.", "quantize.embedding.")
UNUSED_PREFIXES = ("encoder.", "quant_conv.", "loss.")  # the encoder side and the training losses


class Decoder(nn.Module):
    """taming's Decoder (``decoder.*`` names), without timestep embeddings."""

    def __init__(self, ch: int, out_ch: int, ch_mult: list[int], num_res_blocks: int, attn_resolutions: list[int],
                 resolution: int, z_channels: int, **_: object) -> None:
        super().__init__()
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        size = resolution // 2 ** (levels - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = (ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                                               ResnetBlock(block_in, block_in))
        ups = []
        for level in reversed(range(levels)):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, ch * ch_mult[level]))
                block_in = ch * ch_mult[level]
                if size in attn_resolutions:
                    up.attn.append(AttnBlock(block_in))
            if level:
                up.upsample = Upsample(block_in)
                size *= 2
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for i, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[i](h)
            if level:
                h = up.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class VQGANDecoder(nn.Module):
    """Codes (h, w) -> image in [-1, 1]: the codebook, ``post_quant_conv``, the decoder."""

    def __init__(self, n_embed: int, embed_dim: int, ddconfig: dict) -> None:
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)
        self.decoder = Decoder(**ddconfig)

    def forward(self, codes: Tensor) -> Tensor:
        """(h, w) long -> (1, 3, 16 h, 16 w)."""
        z = self.quantize.embedding(codes)[None].permute(0, 3, 1, 2).contiguous()  # the official layout: the
        # convolutions then run channels-first, as the official decoder's do (channels-last kernels round otherwise)
        return self.decoder(self.post_quant_conv(z))


def to_pixels(image: Tensor) -> np.ndarray:
    """(3, H, W) in [-1, 1] -> uint8 (H, W, 3), as ``ImageTokenizer._pil_from_chw_tensor``."""
    unit = (image.detach().float().cpu().clamp(-1.0, 1.0) + 1.0) / 2.0
    return (unit.permute(1, 2, 0).numpy() * 255).astype(np.uint8)


class ChameleonImage:
    """Generated tokens -> picture: structural tokens dropped, ids mapped to codes, decoded."""

    def __init__(self, vq: VQGANDecoder, config: ChameleonConfig, code_of: dict[int, int]) -> None:
        self.vq, self.config = vq.eval(), config
        self.table = torch.full((config.vocab_size,), -1, dtype=torch.long)
        for token, code in code_of.items():
            self.table[token] = code

    def grid(self, tokens: list[int]) -> Tensor:
        """The (h, w) code grid of a generated sequence (row ends and end-of-image removed)."""
        side = self.config.grid_height
        if len(tokens) != self.config.image_tokens:
            raise ValueError(f"expected {self.config.image_tokens} generated tokens, got {len(tokens)}")
        ids = torch.tensor(tokens, dtype=torch.long)
        if self.config.layout == "lumina":
            ids = ids[:-1].view(side, side + 1)[:, :-1]
        codes = self.table[ids.reshape(side, side)]
        if (codes < 0).any():
            bad = ids.reshape(side, side)[codes < 0][0].item()
            raise ValueError(f"token {bad} at an image position is not an image token")
        return codes

    def to(self, device: torch.device | str) -> "ChameleonImage":
        self.vq.to(device)
        return self

    @property
    def codebook(self) -> Tensor:
        """(V, embed_dim): each image token's code vector (LANTERN++ neighbourhoods); other tokens far away."""
        weight = self.vq.quantize.embedding.weight.detach().float().cpu()
        book = torch.full((self.config.vocab_size, weight.shape[1]), 1e4)
        known = self.table >= 0
        book[known] = weight[self.table[known]]
        return book

    @torch.inference_mode()
    def __call__(self, tokens: list[int]) -> np.ndarray:
        device = self.vq.post_quant_conv.weight.device
        return to_pixels(self.vq(self.grid(tokens).to(device))[0])


# ---------------------------------------------------------------------------------------------------------------
# Reading the official files

class Opaque:
    """Stands in for any non-tensor object of a checkpoint: built from whatever the pickle gives, never run."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass


ALLOWED_GLOBALS = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                   ("torch._utils", "_rebuild_parameter"), ("torch", "Size")}


class TensorsOnly(pickle.Unpickler):
    """An unpickler that rebuilds tensors and containers and turns every other global into :class:`Opaque`, so
    a checkpoint's training leftovers (callbacks, hyper-parameter objects) load without running their code."""

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_GLOBALS or (module == "torch" and name.endswith("Storage")):
            return super().find_class(module, name)
        return Opaque


class TensorsOnlyModule:
    """What ``torch.load(pickle_module=...)`` needs."""

    Unpickler = TensorsOnly
    load = staticmethod(pickle.load)


def read_checkpoint(path: Path) -> dict:
    """``vqgan.ckpt``'s tensors: ``torch.load(weights_only=True)``, or, when the file holds objects that loader
    refuses, a load that keeps tensors and replaces everything else by inert stand-ins."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        state = torch.load(path, map_location="cpu", weights_only=False, pickle_module=TensorsOnlyModule)
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise ValueError(f"{path}: not a VQGAN checkpoint (expected its weights under 'state_dict')")
    return state["state_dict"]


def read_yaml(path: Path) -> dict:
    """``model.params`` of ``vqgan.yaml``."""
    import yaml
    config = yaml.safe_load(Path(path).read_text())
    try:
        params = config["model"]["params"]
        return {"n_embed": int(params["n_embed"]), "embed_dim": int(params["embed_dim"]),
                "ddconfig": dict(params["ddconfig"])}
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a VQGAN config (model.params.n_embed, embed_dim, ddconfig): {error}") from None


def load_vqgan(ckpt: str | Path, yaml_path: str | Path) -> VQGANDecoder:
    """The decoder side of the official checkpoint, strictly: every decoder tensor present with its shape; a
    key that belongs to neither side is refused, naming it."""
    params = read_yaml(Path(yaml_path))
    state = read_checkpoint(Path(ckpt))
    with torch.device("meta"):
        model = VQGANDecoder(**params)
    expected = model.state_dict()
    needed = {key: value for key, value in state.items() if key.startswith(DECODER_PREFIXES)}
    strange = [key for key in state if not key.startswith(DECODER_PREFIXES + UNUSED_PREFIXES)]
    missing = [key for key in expected if key not in needed]
    unexpected = [key for key in needed if key not in expected] + strange
    if missing or unexpected:
        parts = ([f"missing key {missing[0]}"] if missing else []) + \
                ([f"unexpected key {unexpected[0]}"] if unexpected else [])
        raise ValueError(f"VQGAN checkpoint {ckpt} does not match its config: {'; '.join(parts)}")
    for key, tensor in expected.items():
        if needed[key].shape != tensor.shape:
            raise ValueError(f"{key}: file has {list(needed[key].shape)}, model expects {list(tensor.shape)}")
    model.load_state_dict({k: v.float() for k, v in needed.items()}, strict=True, assign=True)
    return model.eval()


__all__ = ["ChameleonImage", "VQGANDecoder", "load_vqgan", "to_pixels"]
