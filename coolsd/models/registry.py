"""Models by name: a model is a directory with ``model.json`` (or one of our own bundles, ``config.json``), and
a preset is such a file shipped in ``assets/models/`` whose files are hub references. This module reads and
resolves them; :func:`coolsd.models.bundle.load_bundle` turns any of them into a Bundle (it imports this module,
never the other way round).

``model.json`` (the contract outside tools rely on)::

    {"family": "llamagen",
     "gpt": "<file>", "vq": "<file>", "drafter": "<dir>", "t5": "<dir or hub id>",   (drafter and t5 optional)
     "model_args": {LlamaGen ModelArgs: "dim", "n_layer", "n_head", "vocab_size", "num_classes",
                    "cls_token_num", "caption_dim", "model_type": "c2i"|"t2i", "block_size"},
     "vq_args": {"codebook_size", "codebook_embed_dim", "encoder_ch_mult", "decoder_ch_mult", "z_channels"},
     "class_names": [...] or "imagenet", "sampling": {"cfg_scale", "temperature", "top_k", "top_p"}}

    {"family": "chameleon",
     "model": "<HF model directory or hf:// id>",     (config.json + safetensors shards, as published)
     "vqgan": "<vqgan.ckpt>", "vqgan_config": "<vqgan.yaml>",
     "drafter": "<LANTERN drafter directory>",          (optional)
     "image_size": 768, "prompt_template": "<text with {prompt}>",
     "sampling": {"cfg_scale", "temperature", "top_k", "top_p"},
     "layout": "lumina" | "anole", "prefix_slots": 256,                         (optional; these defaults)
     "model_config": {the config.json fields that shape the decoder}}           (optional: read without files)

A file is a path relative to the ``model.json`` (or absolute), or ``hf://owner/repo/path/in/repo`` (a directory:
``hf://owner/repo``), fetched with ``huggingface_hub`` into its cache; ``HF_HUB_OFFLINE=1`` is honoured.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import ModelConfig


def assets_dir() -> Path:
    """The shipped model and presets: inside the package when installed (``pip install .`` puts them in
    ``coolsd/assets``), else the clone's ``assets`` folder beside the package."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "assets"
    return installed if (installed / "fashion").is_dir() else package.parent / "assets"


PRESETS = assets_dir() / "models"
HUB = "hf://"
FAMILIES = ("llamagen", "chameleon")
REQUIRED = {"llamagen": ("gpt", "vq", "model_args", "vq_args"), "chameleon": ("model", "vqgan", "vqgan_config")}
OBJECT_FIELDS = ("model_args", "vq_args", "model_config", "sampling")  # fields that hold a JSON object
# the files of each family: (field, is a directory)
FILES = {"llamagen": (("gpt", False), ("vq", False), ("drafter", True), ("t5", True)),
         "chameleon": (("model", True), ("vqgan", False), ("vqgan_config", False), ("drafter", True))}
EXAMPLE_PROMPTS = (  # for text models: the app's examples and the benchmark's conditions, in turn
    "A photo of a red fox sitting in fresh snow.",
    "A bowl of ramen with a soft-boiled egg, top view.",
    "An old lighthouse on a rocky coast at sunset.",
    "A watercolor painting of a hot air balloon over green hills.",
    "A close-up of a hummingbird drinking from a purple flower.",
    "A cozy reading corner with a yellow armchair and a tall bookshelf.",
)


def preset_names() -> list[str]:
    """The shipped presets (``assets/models/<name>.json``)."""
    return sorted(path.stem for path in PRESETS.glob("*.json") if path.stem != "imagenet_classes")


def model_file(spec: str | Path) -> Path | None:
    """The ``model.json`` a ``--model`` value names (a preset name, a directory, or the file), or None when it
    names one of our own bundles (a directory with ``config.json``) instead."""
    text = str(spec)
    if (PRESETS / f"{text}.json").is_file() and not Path(text).exists():
        return PRESETS / f"{text}.json"
    path = Path(text)
    if path.is_file() and path.suffix == ".json":
        return path
    if (path / "model.json").is_file():
        return path / "model.json"
    if (path / "config.json").is_file():
        return None
    presets = ", ".join(preset_names()) or "none"
    raise ValueError(f"no model at {text}: expected a preset name ({presets}), a directory with model.json, "
                     "or a bundle directory with config.json")


def read_spec(path: Path) -> dict:
    """The parsed ``model.json``, with its required fields checked."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"unreadable model file {path}: {error}") from None
    if not isinstance(spec, dict):
        kind = type(spec).__name__  # a ValueError, as for any unreadable model file: one line, never a crash
        raise ValueError(f"{path}: a model file holds a JSON object of fields, got {kind}")  # noqa: TRY004
    if spec.get("family") not in FAMILIES:
        raise ValueError(f"{path}: family must be one of {', '.join(FAMILIES)}, got {spec.get('family')!r}")
    for key in REQUIRED[spec["family"]]:
        if key not in spec:
            raise ValueError(f"{path}: missing field {key!r}")
    for key in OBJECT_FIELDS:
        if key in spec and not isinstance(spec[key], dict):
            raise ValueError(f"{path}: field {key!r} must be a JSON object, got {type(spec[key]).__name__}")
    return spec


def model_config(spec: dict, base: Path | None = None):
    """Our config of the target a ``model.json`` describes (read without any weights): LlamaGen's from its
    ``model_args``; a Chameleon model's from ``model_config``, else its directory's ``config.json`` (``base``:
    the directory of the ``model.json``)."""
    if spec["family"] == "chameleon":
        from .chameleon import config_from_hf
        meta = spec.get("model_config")
        if meta is None:
            meta = json.loads(resolve(spec["model"].rstrip("/") + "/config.json", base or Path(".")).read_text())
        return config_from_hf(meta, int(spec.get("image_size", 768)), spec.get("layout", "lumina"),
                              int(spec.get("prefix_slots", 256)))
    from .llamagen import config_from_args
    return config_from_args(spec["model_args"])


def class_names(spec: dict, config: ModelConfig) -> list[str]:
    """The class names a ``model.json`` gives: a list, or ``"imagenet"`` (shipped with the presets)."""
    names = spec.get("class_names", [])
    if names == "imagenet":
        names = json.loads((PRESETS / "imagenet_classes.json").read_text())
    if config.text_conditioned:
        return []
    return list(names) or [f"class {i}" for i in range(config.num_classes)]


def resolve(value: str, base: Path, directory: bool = False) -> Path:
    """A file (or directory) of a ``model.json``: local, or fetched from the hub into its cache."""
    if not value.startswith(HUB):
        path = (base / value) if not Path(value).is_absolute() else Path(value)
        if not path.exists():
            raise FileNotFoundError(f"{path} (named in {base / 'model.json'}) does not exist")
        return path
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    owner, repo, *rest = value[len(HUB):].split("/")
    try:
        if directory or not rest:
            return Path(snapshot_download(f"{owner}/{repo}"))
        return Path(hf_hub_download(f"{owner}/{repo}", "/".join(rest)))
    except LocalEntryNotFoundError:
        raise FileNotFoundError(f"{value} is not in the local Hugging Face cache and cannot be downloaded "
                                "(offline: HF_HUB_OFFLINE is set, or no network); download it where there is a "
                                "network, or point model.json at a local copy") from None


def hub_references(spec: dict) -> list[tuple[str, bool]]:
    """A ``model.json``'s hub references as (value, is a directory): files and directories given as ``hf://``,
    and a T5 given as a bare hub id (``owner/name``)."""
    refs = []
    for key, directory in FILES[spec.get("family", "llamagen")]:
        value = spec.get(key)
        if isinstance(value, str) and value.startswith(HUB):
            refs.append((value, directory))
        elif key == "t5" and isinstance(value, str) and not Path(value).is_absolute() and value.count("/") == 1:
            refs.append((value, True))
    return refs


def hub_cached(value: str, directory: bool = False, cache_dir: str | None = None) -> bool:
    """Whether a hub reference (``hf://owner/repo/file``, ``hf://owner/repo``, or a bare ``owner/repo`` for a
    directory) is in the local Hugging Face cache. Never downloads, never raises."""
    try:
        from huggingface_hub import snapshot_download, try_to_load_from_cache
        owner, repo, *rest = value.removeprefix(HUB).split("/")
        if rest and not directory:
            return isinstance(try_to_load_from_cache(f"{owner}/{repo}", "/".join(rest), cache_dir=cache_dir), str)
        return Path(snapshot_download(f"{owner}/{repo}", local_files_only=True, cache_dir=cache_dir)).is_dir()
    except Exception:  # not cached, or an unreadable cache: not available offline
        return False
