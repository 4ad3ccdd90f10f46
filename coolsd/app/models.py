"""The explorer's model selector, independent of Gradio: which models can be chosen (the shipped default, the
local directories named in ``COOLSD_MODELS``, and the presets whose files are cached or can be downloaded),
and a small store that loads each on first use and keeps it."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.params import shorten
from ..models import registry
from ..models.bundle import Bundle, load_bundle
from ..models.registry import PRESETS, model_file, preset_names, read_spec

DEFAULT = "default"  # the shipped model's key (the API's empty ``model`` too)
ENV = "COOLSD_MODELS"  # os.pathsep-separated model.json directories or bundle directories
HUB_CACHE_DIR: str | None = None  # the Hugging Face cache to look in (None: huggingface_hub's own)
HUB = "https://huggingface.co"  # huggingface_hub's endpoint unless HF_ENDPOINT names another
PROBE_SECONDS = 2.5  # one request to the hub before a download: no answer by then means unreachable
FAILURE_SECONDS = 300.0  # a model whose download failed is refused at once for this long, without a new try
log = logging.getLogger("coolsd.app")
WARNED: dict[str, str] = {}  # broken settings already warned about, and what was said (the listing is read often)


def warn_once(key: str, message: str) -> None:
    """One log line per broken setting (a ``COOLSD_MODELS`` entry...), the first time the listing meets it; the
    page shows them all (:func:`warnings`)."""
    if key not in WARNED:
        WARNED[key] = message
        log.warning("%s", message)


def warnings() -> list[str]:
    """Every broken setting met so far, as warned in the log."""
    return list(WARNED.values())


def warn_entry(entry: str, why: str) -> None:
    warn_once(entry, f"{ENV} entry {entry}: {why}")


@dataclass(frozen=True)
class ModelChoice:
    """One entry of the selector: its key (what the dropdown and the API send), label, and what to load."""

    key: str
    label: str
    source: str | None  # a directory or a preset name; None for the default (already loaded)


ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # how an environment switch is written


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it, read now."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ON


def local_dirs() -> list[str]:
    """The directories ``COOLSD_MODELS`` names that hold a model (``model.json`` or ``config.json``), in order."""
    found = []
    for entry in os.environ.get(ENV, "").split(os.pathsep):
        entry = entry.strip()
        if not entry or entry in found:
            continue
        if any((Path(entry) / name).is_file() for name in ("model.json", "config.json")):
            found.append(entry)
        else:
            warn_entry(entry, "left out: " + ("no model.json or config.json in it" if Path(entry).is_dir() else
                                              "no such directory"))
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


def hub_endpoint() -> str:
    """The hub huggingface_hub downloads from: ``HF_ENDPOINT``, read now, else the public hub."""
    return (os.environ.get("HF_ENDPOINT", "").strip() or HUB).rstrip("/")


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether the hub answers one HEAD request within ``timeout`` seconds (any HTTP status counts: it is there).
    Name lookup included: the request runs in a thread, since ``socket`` cannot bound a lookup. huggingface_hub
    itself retries an unreachable hub for half a minute."""
    answer: list[bool] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=timeout).close()
            answer.append(True)
        except urllib.error.HTTPError:
            answer.append(True)
        except (OSError, ValueError):  # no name, no route, refused, timed out, a broken TLS or URL
            answer.append(False)

    probe = threading.Thread(target=ask, daemon=True, name="hub-probe")
    probe.start()
    probe.join(timeout)
    return bool(answer and answer[0])


def needs_download(source: str) -> bool:
    """Whether loading ``source`` (a preset or a directory) must download files: some hub reference of its
    ``model.json`` is not cached, and huggingface_hub may go online (``HF_HUB_OFFLINE`` unset)."""
    try:
        path = model_file(source)
        references = registry.hub_references(read_spec(path)) if path is not None else []
    except ValueError:
        return False  # the loader says what is wrong with it
    return not offline() and not all(hub_cached(value, directory) for value, directory in references)


def unreachable(key: str) -> str:
    return (f"could not load model {key}: its files are not in the local Hugging Face cache and the hub "
            f"({hub_endpoint()}) cannot be reached from this machine; download them where there is a network "
            "(huggingface-cli download, into the same cache), or set HF_HUB_OFFLINE=1 to list only the models "
            "whose files are cached")


PRESETS_ENV = "COOLSD_PRESETS"  # on / off: whether the presets (real models, gigabytes each) may be chosen at all


def presets_allowed(environ=os.environ) -> bool:
    """Whether visitors may choose (and so start loading) a preset: ``COOLSD_PRESETS`` on or off; unset, on
    except on a Hugging Face Space (``SPACE_ID`` set), where any visitor could start a 7B load."""
    value = environ.get(PRESETS_ENV, "").strip().lower()
    if value in ON or value in OFF:
        return value in ON
    if value:
        warn_once(PRESETS_ENV, f"{PRESETS_ENV}={shorten(value, 40)} is neither on nor off: taken as unset")
    return not environ.get("SPACE_ID")


def listing(default_name: str) -> list[ModelChoice]:
    """The selector's entries: the default (shipped) model first, then ``COOLSD_MODELS``'s directories, then the
    available presets (read now: a newly cached preset is listed)."""
    choices = [ModelChoice(DEFAULT, f"{default_name} (default)", None)]
    for path in local_dirs():
        try:
            spec = read_spec(Path(path) / "model.json") if (Path(path) / "model.json").is_file() else {}
        except ValueError as error:  # listed by its folder's name; choosing it says why it cannot load
            warn_entry(path, f"listed, but it cannot load: {error}")
            spec = {}
        choices.append(ModelChoice(path, f"{spec.get('name') or Path(path).name} ({path})", path))
    for name in preset_names() if presets_allowed() else []:
        status = preset_status(name)
        if status is not None:
            choices.append(ModelChoice(name, f"{name} {status}".strip(), name))
    return choices


class Models:
    """The models chosen so far, each loaded once, on first use (one load at a time), and kept. A model whose
    files had to be downloaded and could not be is refused at once for ``FAILURE_SECONDS``."""

    def __init__(self, default: Bundle, loader: Callable[[str], Bundle] = load_bundle) -> None:
        self.default, self.loader = default, loader
        self.loaded: dict[str, Bundle] = {DEFAULT: default}
        self.failed: dict[str, tuple[float, str]] = {}  # key -> (when, why), for downloads that failed
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

    def get(self, value, progress=None, load: bool = True) -> Bundle:
        """The bundle of a key, loaded now if it is the first use (a readable ValueError when it cannot be, or
        when ``load`` is False and it is not loaded yet). A download is tried only after one short probe of the
        hub, and a failed one is remembered (:meth:`remembered`)."""
        key = self.key(value)
        if key in self.loaded:
            return self.loaded[key]
        if not load:
            raise ValueError(f"model {key} is not loaded yet: it loads when chosen in the Model selector; "
                             "generate once it is ready")
        self.remembered(key)
        download = needs_download(key)
        if download and not hub_reachable():
            self.failed[key] = (time.monotonic(), unreachable(key))
            raise ValueError(self.failed[key][1])
        with self.lock:
            if key not in self.loaded:
                self.load(key, download, progress)
        return self.loaded[key]

    def remembered(self, key: str) -> None:
        """A ValueError with the reason of a failed download of ``key`` less than ``FAILURE_SECONDS`` ago."""
        when, why = self.failed.get(key, (None, ""))
        age = time.monotonic() - when if when is not None else FAILURE_SECONDS
        if age < FAILURE_SECONDS:
            raise ValueError(f"{why} (remembered from a try {age:.0f} s ago; the next try can be made in "
                             f"{FAILURE_SECONDS - age:.0f} s)")

    def load(self, key: str, download: bool, progress=None) -> None:
        """Load ``key`` now (under the lock); a failed download is remembered, a local failure is not (its files
        may be fixed at once)."""
        if progress is not None:
            progress(0.05, desc=f"Loading model {key} (first use{'; downloading' * download}; may take a while)")
        try:
            self.loaded[key] = self.loader(key)
        except Exception as error:  # any loading failure is a readable message, never a crash
            text = str(error).split("\n")[0] or type(error).__name__
            if download:
                self.failed[key] = (time.monotonic(), f"could not load model {key}: {text[:300]}")
            raise ValueError(f"could not load model {key}: {text[:300]}") from None
        self.failed.pop(key, None)
