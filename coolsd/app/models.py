"""The explorer's model selector, independent of Gradio: which models can be chosen (the shipped default, the
local directories named in ``COOLSD_MODELS``, and the presets whose files are cached or can be downloaded),
and a small store that loads each on first use and keeps it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.params import shorten
from ..models import registry
from ..models.bundle import Bundle, load_bundle
from ..models.registry import PRESETS, preset_names, read_spec

DEFAULT = "default"  # the shipped model's key (the API's empty ``model`` too)
ENV = "COOLSD_MODELS"  # os.pathsep-separated model.json directories or bundle directories
HUB_CACHE_DIR: str | None = None  # the Hugging Face cache to look in (None: huggingface_hub's own)


@dataclass(frozen=True)
class ModelChoice:
    """One entry of the selector: its key (what the dropdown and the API send), label, and what to load."""

    key: str
    label: str
    source: str | None  # a directory or a preset name; None for the default (already loaded)


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it, read now."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def local_dirs() -> list[str]:
    """The directories ``COOLSD_MODELS`` names that hold a model (``model.json`` or ``config.json``), in order."""
    found = []
    for entry in os.environ.get(ENV, "").split(os.pathsep):
        entry = entry.strip()
        if entry and entry not in found and any((Path(entry) / name).is_file() for name in ("model.json",
                                                                                            "config.json")):
            found.append(entry)
    return found


def hub_cached(value: str, directory: bool = False) -> bool:
    """Whether a hub reference is in the local Hugging Face cache (:func:`coolsd.models.registry.hub_cached`)."""
    return registry.hub_cached(value, directory, HUB_CACHE_DIR)


def preset_status(name: str) -> str | None:
    """A preset's label suffix: "" when every file is cached, "(downloads on first use)" when some must be
    downloaded and the hub may be reached, None when it is not available (offline, not cached)."""
    try:
        spec = read_spec(PRESETS / f"{name}.json")
    except ValueError:
        return None
    if all(hub_cached(value, directory) for value, directory in registry.hub_references(spec)):
        return ""
    return None if offline() else "(downloads on first use)"


def listing(default_name: str) -> list[ModelChoice]:
    """The selector's entries: the default (shipped) model first, then ``COOLSD_MODELS``'s directories, then the
    available presets (read now: a newly cached preset is listed)."""
    choices = [ModelChoice(DEFAULT, f"{default_name} (default)", None)]
    for path in local_dirs():
        try:
            spec = read_spec(Path(path) / "model.json") if (Path(path) / "model.json").is_file() else {}
        except ValueError:
            spec = {}
        choices.append(ModelChoice(path, f"{spec.get('name') or Path(path).name} ({path})", path))
    for name in preset_names():
        status = preset_status(name)
        if status is not None:
            choices.append(ModelChoice(name, f"{name} {status}".strip(), name))
    return choices


class Models:
    """The models chosen so far, each loaded once, on first use (one load at a time), and kept."""

    def __init__(self, default: Bundle, loader: Callable[[str], Bundle] = load_bundle) -> None:
        self.default, self.loader = default, loader
        self.loaded: dict[str, Bundle] = {DEFAULT: default}
        self.lock = threading.Lock()

    def choices(self) -> list[ModelChoice]:
        return listing(self.default.name)

    def key(self, value) -> str:
        """The key a UI or API value names ("" is the default), or a readable ValueError."""
        if value in (None, ""):
            return DEFAULT
        if not isinstance(value, str):
            raise ValueError(f"model must be a string, got {type(value).__name__}")
        if value in self.loaded:
            return value
        keys = [choice.key for choice in self.choices()]
        if value not in keys:
            raise ValueError(f"model must be one of: {', '.join(keys)}; got {shorten(value, 80)}")
        return value

    def peek(self, value) -> Bundle | None:
        """The bundle of a key if it is loaded already (never loads, never raises)."""
        return self.loaded.get(DEFAULT if value in (None, "") else value) if isinstance(value, (str, type(None))) \
            else None

    def get(self, value, progress=None) -> Bundle:
        """The bundle of a key, loaded now if it is the first use (a readable ValueError when it cannot be)."""
        key = self.key(value)
        if key in self.loaded:
            return self.loaded[key]
        with self.lock:
            if key not in self.loaded:
                if progress is not None:
                    progress(0.05, desc=f"Loading model {key} (first use; may take a while)")
                try:
                    self.loaded[key] = self.loader(key)
                except Exception as error:  # any loading failure is a readable message, never a crash
                    text = str(error).split("\n")[0] or type(error).__name__
                    raise ValueError(f"could not load model {key}: {text[:300]}") from None
        return self.loaded[key]
