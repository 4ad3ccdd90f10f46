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

from ..models.bundle import EAGLE3_FILE, EXTRAS, Bundle, save_bundle
from ..models.chameleon_drafter import (
    ChameleonDrafter,
    ChameleonEagle3Drafter,
    DrafterConfig,
    save_chameleon_drafter,
)
from ..models.eagle import Drafter, Eagle3Drafter
from ..models.lantern import LanternConfig, LanternDrafter
from ..models.registry import HUB

EAGLE, LANTERN = "eagle", "lantern"
KINDS = ("eagle1", "eagle3")  # the drafter kinds the trainer makes (--kind)


def chameleon(bundle: Bundle) -> bool:
    return bundle.info.get("family") == "chameleon"


def drafter_format(bundle: Bundle, kind: str = "eagle1") -> str:
    """``eagle3`` for an EAGLE-3 drafter; else ``lantern`` for a ``model.json`` model (its ``info`` is the
    parsed file), ``eagle`` for ours."""
    if kind == "eagle3":
        return "eagle3"
    return LANTERN if "family" in bundle.info else EAGLE


def new_drafter(bundle: Bundle, seed: int, kind: str = "eagle1", taps: tuple[int, ...] = ()) -> nn.Module:
    """A freshly initialised drafter, in float32 on the target's device, from ``seed`` (the global RNG is left as
    it was): for ``eagle1`` the target's format; for ``eagle3`` our EAGLE-3 head reading target layers ``taps``
    (default: EAGLE-3's choice; for a Chameleon target its Chameleon variant)."""
    if kind not in KINDS:
        raise ValueError(f"drafter kind must be one of {', '.join(KINDS)}, got {kind!r}")
    cfg = bundle.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "eagle3" and chameleon(bundle):
            drafter = ChameleonEagle3Drafter(cfg, taps or None)
            with torch.no_grad():  # as LANTERN's Chameleon drafters: the target's table, frozen
                drafter.embed_tokens.weight.copy_(bundle.target.embed(torch.arange(cfg.vocab_size,
                                                                                   device=bundle.device)).float())
            drafter.embed_tokens.requires_grad_(False)
        elif kind == "eagle3":
            drafter = Eagle3Drafter(cfg, taps or None)
        elif drafter_format(bundle) == LANTERN and chameleon(bundle):
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
    if "family" in bundle.info:
        save_lantern(bundle, drafter, out, record)
    elif source is not None:
        save_next_to_copy(source, drafter, out, record)
    else:
        save_in_memory_bundle(bundle, drafter, out, record)


def eagle3_entry(drafter: nn.Module, record: dict) -> dict:
    """What a model's config records of its EAGLE-3 drafter: the target layers it reads, and its training."""
    return {"taps": list(drafter.target_layers), "training": record}


def save_next_to_copy(source: Path, drafter: nn.Module, out: Path, record: dict) -> None:
    """A bundle directory: the source's target, codebook and optional parts (tokenizer, judge), the new drafter."""
    eagle3 = bool(drafter.target_layers)
    names = ["target.safetensors", "codebook.safetensors"]
    for marker in EXTRAS:
        names += [path.name for path in source.glob(marker.split(".")[0] + "*")]
    names += [name for name in ("drafter.safetensors", EAGLE3_FILE)  # the model's other drafter stays
              if (source / name).exists() and name != (EAGLE3_FILE if eagle3 else "drafter.safetensors")]
    for name in names:
        shutil.copyfile(source / name, out / name)
    meta = json.loads((source / "config.json").read_text())
    if eagle3:
        meta["eagle3"] = eagle3_entry(drafter, record)
    else:
        meta["drafter_training"] = record
    save_file(cpu_state(drafter), out / (EAGLE3_FILE if eagle3 else "drafter.safetensors"))
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


def save_in_memory_bundle(bundle: Bundle, drafter: nn.Module, out: Path, record: dict) -> None:
    """A bundle directory for a target that has no files (``--random-init``)."""
    device = bundle.device
    other = bundle.drafters.get("eagle1") if drafter.target_layers else None  # an EAGLE-3's model keeps Eagle-1
    copy = Bundle(bundle.target.to("cpu"), other.to("cpu") if other is not None else None, bundle.codebook.cpu(),
                  name=bundle.name, class_names=bundle.class_names, sampling=bundle.sampling)
    eagle3 = bool(drafter.target_layers)
    try:
        save_bundle(copy, out, extra={"eagle3": eagle3_entry(drafter, record)} if eagle3 else
                    {"drafter_training": record})
    finally:
        for module in (bundle.target, other):
            if module is not None:
                module.to(device)
    save_file(cpu_state(drafter), out / (EAGLE3_FILE if eagle3 else "drafter.safetensors"))


def repoint(value: Any, base: Path) -> Any:
    """A ``model.json`` file entry valid from another directory: hub references and absolute paths as they are,
    a relative path made absolute (a bare ``owner/name`` T5 hub id that is no local path stays as it is)."""
    if not isinstance(value, str) or value.startswith(HUB) or Path(value).is_absolute():
        return value
    local = base / value
    return str(local.resolve()) if local.exists() else value


def save_lantern(bundle: Bundle, drafter: nn.Module, out: Path, record: dict) -> None:
    """LANTERN's drafter directory in ``out/drafter`` and a ``model.json`` that uses it; an EAGLE-3 drafter goes
    to ``out/eagle3`` (``config.json`` with its taps, ``model.safetensors``) beside the model's own drafter."""
    eagle3 = bool(drafter.target_layers)
    folder = out / ("eagle3" if eagle3 else "drafter")
    folder.mkdir(parents=True, exist_ok=True)
    if eagle3:
        (folder / "config.json").write_text(json.dumps({"kind": "eagle3", "taps": list(drafter.target_layers)},
                                                       indent=2) + "\n")
        save_file(cpu_state(drafter), folder / "model.safetensors")
    elif chameleon(bundle):  # LANTERN's Chameleon drafter directory: config.json + pytorch_model.bin
        save_chameleon_drafter(drafter, folder)
    else:
        config = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", **asdict(drafter.config)}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(cpu_state(drafter), folder / "model.safetensors")
    spec = dict(bundle.info)
    for key in ("gpt", "vq", "t5", "model", "vqgan", "vqgan_config", "drafter", "eagle3"):
        if key in spec:
            spec[key] = repoint(spec[key], bundle.path)
    if eagle3:
        spec.update(eagle3="eagle3", eagle3_training=record)
    else:
        spec.update(drafter="drafter", drafter_training=record)
    (out / "model.json").write_text(json.dumps(spec, indent=2) + "\n")
