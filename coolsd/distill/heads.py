"""Which drafter a target gets, and how the trained one is saved so that ``load_bundle(out)`` reads it back.

* A target from one of our bundle directories (``config.json``), or a ``--random-init`` one, gets our Eagle head
  (:class:`coolsd.models.eagle.Drafter`: ``fc``, ``layer.*``; token embeddings shared with the target). The out
  directory is a bundle directory: the target's files (copied), ``drafter.safetensors`` and a ``config.json``.
* A Chameleon ``model.json`` target gets LANTERN's Chameleon drafter (:class:`coolsd.models.chameleon_drafter.
  ChameleonDrafter`), written as ``drafter/config.json`` + ``pytorch_model.bin``.
* A LlamaGen ``model.json`` target gets LANTERN's drafter layout (:class:`coolsd.models.lantern.LanternDrafter`),
  the only drafter the ``model.json`` contract loads. Its own token table starts as the target's input table and
  stays frozen. The out directory holds ``drafter/`` (LANTERN's ``config.json`` + ``model.safetensors``) and a
  ``model.json`` that is the source's with its files re-pointed and ``"drafter": "drafter"``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..models.bundle import EXTRAS, Bundle, save_bundle
from ..models.chameleon_drafter import ChameleonDrafter, DrafterConfig, save_chameleon_drafter
from ..models.eagle import Drafter
from ..models.lantern import LanternConfig, LanternDrafter
from ..models.registry import HUB

EAGLE, LANTERN = "eagle", "lantern"


def chameleon(bundle: Bundle) -> bool:
    return bundle.info.get("family") == "chameleon"


def drafter_format(bundle: Bundle) -> str:
    """``lantern`` for a ``model.json`` model (its ``info`` is the parsed file), else ``eagle``."""
    return LANTERN if "family" in bundle.info else EAGLE


def new_drafter(bundle: Bundle, seed: int) -> nn.Module:
    """A freshly initialised drafter of the target's format, in float32 on the target's device, from ``seed``
    (the global RNG is left as it was)."""
    cfg = bundle.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if drafter_format(bundle) == LANTERN and chameleon(bundle):
            drafter = ChameleonDrafter(DrafterConfig.for_target(cfg), cfg)
            with torch.no_grad():  # as LANTERN's trainer (load_emb=True): the target's table, frozen
                drafter.embed_tokens.weight.copy_(bundle.target.embed(torch.arange(cfg.vocab_size,
                                                                                   device=bundle.device)).float())
            drafter.embed_tokens.requires_grad_(False)
        elif drafter_format(bundle) == LANTERN:
            drafter = LanternDrafter(LanternConfig.for_target(cfg), cfg)
            with torch.no_grad():
                drafter.embed_tokens.weight.copy_(bundle.target.tok_embeddings.weight.float())
            drafter.embed_tokens.requires_grad_(False)
        else:
            drafter = Drafter(cfg)
    drafter = drafter.to(bundle.device)
    return drafter.share_embedding(bundle.target)


def trainable(drafter: nn.Module) -> list[nn.Parameter]:
    return [p for p in drafter.parameters() if p.requires_grad]


def cpu_state(drafter: nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().float().cpu().contiguous() for key, value in drafter.state_dict().items()}


def save_drafter(bundle: Bundle, drafter: nn.Module, out: Path, record: dict) -> None:
    """Write ``out`` so that ``load_bundle(out)`` gives the target with this drafter; ``record`` (the training
    settings and results) goes into its config."""
    source = bundle.path.resolve() if bundle.path is not None else None
    if source is not None and out.resolve() == source:
        raise ValueError(f"--out {out} is the model's own directory; write the new drafter somewhere else")
    out.mkdir(parents=True, exist_ok=True)
    if drafter_format(bundle) == LANTERN:
        save_lantern(bundle, drafter, out, record)
    elif source is not None:
        save_next_to_copy(source, drafter, out, record)
    else:
        save_in_memory_bundle(bundle, drafter, out, record)


def save_next_to_copy(source: Path, drafter: nn.Module, out: Path, record: dict) -> None:
    """A bundle directory: the source's target, codebook and optional parts (tokenizer, judge), the new drafter."""
    names = ["target.safetensors", "codebook.safetensors"]
    for marker in EXTRAS:
        names += [path.name for path in source.glob(marker.split(".")[0] + "*")]
    for name in names:
        shutil.copyfile(source / name, out / name)
    meta = json.loads((source / "config.json").read_text())
    meta["drafter_training"] = record
    save_file(cpu_state(drafter), out / "drafter.safetensors")
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


def save_in_memory_bundle(bundle: Bundle, drafter: nn.Module, out: Path, record: dict) -> None:
    """A bundle directory for a target that has no files (``--random-init``)."""
    device = bundle.device
    copy = Bundle(bundle.target.to("cpu"), None, bundle.codebook.cpu(), name=bundle.name,
                  class_names=bundle.class_names, sampling=bundle.sampling)
    try:
        save_bundle(copy, out, extra={"drafter_training": record})
    finally:
        bundle.target.to(device)
    save_file(cpu_state(drafter), out / "drafter.safetensors")


def repoint(value: Any, base: Path) -> Any:
    """A ``model.json`` file entry valid from another directory: hub references and absolute paths as they are,
    a relative path made absolute (a bare ``owner/name`` T5 hub id that is no local path stays as it is)."""
    if not isinstance(value, str) or value.startswith(HUB) or Path(value).is_absolute():
        return value
    local = base / value
    return str(local.resolve()) if local.exists() else value


def save_lantern(bundle: Bundle, drafter: nn.Module, out: Path, record: dict) -> None:
    """LANTERN's drafter directory in ``out/drafter`` and a ``model.json`` that uses it."""
    folder = out / "drafter"
    folder.mkdir(parents=True, exist_ok=True)
    if chameleon(bundle):  # LANTERN's Chameleon drafter directory: config.json + pytorch_model.bin
        save_chameleon_drafter(drafter, folder)
    else:
        config = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", **asdict(drafter.config)}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(cpu_state(drafter), folder / "model.safetensors")
    spec = dict(bundle.info)
    for key in ("gpt", "vq", "t5", "model", "vqgan", "vqgan_config"):
        if key in spec:
            spec[key] = repoint(spec[key], bundle.path)
    spec.update(drafter="drafter", drafter_training=record)
    (out / "model.json").write_text(json.dumps(spec, indent=2) + "\n")
