"""A model bundle: target, drafter, the code vectors of the tokenizer, an image decoder and (optionally) quality
metrics. One call loads it on CPU or CUDA; weights are safetensors."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from threadpoolctl import threadpool_limits
from torch import Tensor, nn

from ..core.graphs import EAGER, PhaseRunner
from ..core.interface import ImageDecoder
from ..core.params import number
from ..core.rules import nearest_codes
from ..core.sampling import SamplingConfig
from .config import CONFIGS, RANDOM_INIT_SIZES, ModelConfig
from .decoders import CodebookShade
from .eagle import Drafter, Eagle3Drafter
from .gpt import Transformer
from .registry import HUB, assets_dir, class_names, model_config, model_file, read_spec, resolve
from .steps import unwrapped, with_steps

ASSETS = assets_dir()
DEFAULT_MODEL = ASSETS / "fashion"


def set_threads(threads: int | None = None) -> int:
    """Set torch's CPU threads, and numpy's BLAS threads to match: ``threads``, else ``COOLSD_THREADS``, else 1.
    One thread is the measured fastest for our small models (torch's default, one per core, was up to 10x slower
    on a busy 2-core machine; numpy's BLAS, which the study's FID bootstrap uses, likewise), and it lets
    concurrent requests use one core each."""
    if threads is None:
        text = os.environ.get("COOLSD_THREADS", "").strip()
        try:
            threads = int(text) if text else 1
        except ValueError:
            raise ValueError(f"COOLSD_THREADS must be a whole number >= 1, got {text[:40]!r}") from None
    threads = number("threads", threads, 1, integer=True)
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")
    return threads


CUDA_ASKED = False  # whether this process has asked torch for CUDA (ZeroGPU's `spaces` must come before: app.py)


def pick_device(device: str | None = None) -> torch.device:
    """The requested device, else CUDA when present, else CPU."""
    global CUDA_ASKED
    if device:
        return torch.device(device)
    CUDA_ASKED = True
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


NEIGHBOURS_KEPT = 64  # columns of the neighbour table worth keeping: LANTERN++'s k is at most 50 (+1 for its residual)
DISK_CACHE_CODES = 4096  # codebooks at least this large keep their table on disk (16384 codes: a few seconds)


def cache_dir() -> Path:
    """Where computed tables are kept: ``COOLSD_CACHE``, else ``~/.cache/coolsd``."""
    return Path(os.environ.get("COOLSD_CACHE") or Path.home() / ".cache" / "coolsd")


def device_name(device: torch.device) -> str:
    """``cuda (NVIDIA H200)`` or ``cpu``: what timing tables say they ran on."""
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def neighbour_table(codebook: Tensor, count: int) -> np.ndarray:
    """``nearest_codes`` for the first ``count`` columns only (the full table of a 16384-code book would be
    16384 x 16383 x 2 B = 512 MB), read from or written to the disk cache for a large codebook, keyed by the
    codebook's bytes."""
    if codebook.shape[0] < DISK_CACHE_CODES:
        return nearest_codes(codebook, count)
    import hashlib
    key = hashlib.sha256(codebook.float().cpu().numpy().tobytes()).hexdigest()[:16]
    path = cache_dir() / "neighbours" / f"{key}-{count}.npy"
    if path.exists():
        return np.load(path).astype(np.int64)
    table = nearest_codes(codebook, count)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path.with_suffix(".tmp.npy"), table.astype(np.int16 if codebook.shape[0] <= 32768 else np.int32))
    path.with_suffix(".tmp.npy").replace(path)
    return table


@functools.cache
def file_digest(path: Path, size: int, modified_ns: int) -> str:
    """A file's sha256, computed once per (path, size, modification time)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Bundle:
    """Everything a generation needs. ``decoder`` turns tokens into an RGB picture (default: each token's code
    vector shown as a grey level); ``quality`` (optional) scores generated pictures against their conditions,
    e.g. the shipped model's judge: ``quality(images, class_ids) -> {"judge_accuracy": ..., "fid": ...}``."""

    target: Transformer
    drafter: Drafter | None
    codebook: Tensor  # (V, code_dim): the code vectors the decoder uses; they define LANTERN++ neighbourhoods
    name: str = "random"
    class_names: list[str] = field(default_factory=list)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    decoder: ImageDecoder | None = None
    quality: Callable[[list[np.ndarray], list[int]], dict] | None = None
    info: dict = field(default_factory=dict)
    text_encoder: Callable[[list[str]], list] | None = None  # prompts -> Caption conditions (text models)
    path: Path | None = None  # the directory it was loaded from (None: built in memory)
    steps: str = "eager"  # how target and drafter steps run (coolsd.models.steps.MODES)
    # every drafter the model carries, by name (DRAFTER_NAMES); ``drafter`` is the one decoding uses
    drafters: dict[str, Drafter] = field(default_factory=dict)
    _neighbours: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.class_names:
            self.class_names = [f"class {i}" for i in range(self.target.config.num_classes)]
        if self.drafter is not None and not self.drafters:
            self.drafters = {drafter_name(self.drafter): self.drafter}
        for drafter in self.drafters.values():
            drafter.share_embedding(self.target)
        if self.decoder is None:
            self.decoder = CodebookShade(self.codebook, self.config.grid_height, self.config.grid_width)

    @property
    def config(self) -> ModelConfig:
        return self.target.config

    @property
    def device(self) -> torch.device:
        return self.target.device

    def neighbours(self, count: int) -> np.ndarray:
        """Each code's ``count`` nearest other codes (LANTERN++), computed once per bundle; for a large codebook
        also kept on disk (:func:`neighbour_table`)."""
        cached = self._neighbours.get("table")
        if cached is None or cached.shape[1] < min(count, self.codebook.shape[0] - 1):
            cached = neighbour_table(self.codebook, max(count, NEIGHBOURS_KEPT))
            self._neighbours["table"] = cached
        return cached[:, :count]

    def weights_digest(self, file: str = "target.safetensors") -> str | None:
        """The sha256 of a weights file in the bundle's directory (the target's by default; None for one built in
        memory or loaded from elsewhere): what a shipped study records, so that a retrained model of the same name
        does not pass for the one it measured."""
        weights = self.path / file if self.path is not None else None
        if weights is None or not weights.exists():
            return None
        stat = weights.stat()
        return file_digest(weights.resolve(), stat.st_size, stat.st_mtime_ns)

    @torch.inference_mode()
    def embeddings(self) -> Tensor:
        """The target's input embedding table (V, dim) (GSD's groups compare its rows)."""
        target = unwrapped(self.target)
        return target.embed(torch.arange(target.vocab_size, device=self.device)).float()

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "Bundle":
        """Move the models (``dtype`` applies to target and drafter, e.g. bf16 on CUDA) and the decoder; on a
        CPU their weight matrices take the layout its matrix multiplies read fastest (:func:`cpu_layout`)."""
        for module in (self.target, self.drafter, *self.drafters.values()):
            if module is not None:
                module.to(device=device, dtype=dtype)
                if torch.device(device).type == "cpu":
                    cpu_layout(module)
        for extra in (self.decoder, self.quality):
            if hasattr(extra, "to"):
                extra.to(device)
        return self

    @property
    def runner(self) -> PhaseRunner:
        """How the decoding round's phases run for these steps (CUDA graphs, or eagerly)."""
        return getattr(self.target, "runner", EAGER)

    def with_steps(self, mode: str) -> "Bundle":
        """The same models run as ``mode`` says (static caches, CUDA graphs, compiled); the weights are shared."""
        if mode == self.steps:
            return self
        names = list(self.drafters)
        target, drafters = with_steps(unwrapped(self.target), [unwrapped(self.drafters[n]) for n in names], mode)
        drafters = dict(zip(names, drafters))
        active = drafters.get(self.drafter_name) if self.drafter is not None else None
        return replace(self, target=target, drafter=active, drafters=drafters, steps=mode)

    @property
    def drafter_name(self) -> str | None:
        """The name of the drafter decoding uses (None without one)."""
        return next((name for name, d in self.drafters.items() if d is self.drafter), None)

    def with_drafter(self, name: str | None) -> "Bundle":
        """The same model drafting with its drafter ``name`` (None: as it is); a one-line error for one it lacks."""
        if name is None or name == self.drafter_name:
            return self
        if name not in self.drafters:
            have = ", ".join(self.drafters) or "none"
            raise ValueError(f"this model has no {name} drafter (it has: {have})")
        return replace(self, drafter=self.drafters[name])

    @property
    def dtype(self) -> torch.dtype:
        return next(self.target.parameters()).dtype

    def image(self, tokens: list[int]) -> np.ndarray:
        """Image tokens -> uint8 RGB picture (H, W, 3)."""
        return self.decoder(tokens)


def cpu_layout(model: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` weight (out, in) stored column-major: ``F.linear`` then multiplies by a contiguous
    (in, out) matrix, which the CPU's GEMM reads about 30% faster for the few rows of a verification (measured
    with ``python -m coolsd.bench --profile``). The values, shapes and names are unchanged; only the strides."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.stride(0) != 1:
            module.weight.data = module.weight.data.t().contiguous().t()
    return model


def random_bundle(size: str = "tiny", seed: int = 0, device: str | None = None) -> Bundle:
    """Randomly initialised target + drafter of a named shape (``tiny`` for tests, ``small`` ~10M parameters)."""
    if size not in RANDOM_INIT_SIZES:
        raise ValueError(f"random-init size must be one of {', '.join(RANDOM_INIT_SIZES)}, got {size!r}")
    cfg = CONFIGS[size]
    torch.manual_seed(seed)
    target, drafter = Transformer(cfg).eval(), Drafter(cfg).eval()
    decoder = None
    if size.startswith("llamagen"):  # LlamaGen's own VQ-16 decoder, random too, so that profiles time it
        from .vq16 import VQ16Decoder, VQ16Image
        decoder = VQ16Image(VQ16Decoder(), (cfg.grid_height, cfg.grid_width))
        codebook = decoder.codebook
    else:
        codebook = nn.functional.normalize(torch.randn(cfg.vocab_size, 8), dim=-1)
    bundle = Bundle(target, drafter, codebook, name=f"random-{size}", decoder=decoder)
    device = pick_device(device)
    return bundle.to(device, torch.bfloat16 if device.type == "cuda" else None)


def save_bundle(bundle: Bundle, path: Path, extra: dict | None = None) -> None:
    """Write ``config.json`` and one safetensors file per model."""
    path.mkdir(parents=True, exist_ok=True)
    save_model(bundle.target, path / "target.safetensors", force_contiguous=True)  # a CPU bundle's are not
    if bundle.drafter is not None:
        save_model(bundle.drafter, path / "drafter.safetensors", force_contiguous=True)
    save_file({"codebook": bundle.codebook.contiguous()}, path / "codebook.safetensors")
    meta = {"name": bundle.name, "model": bundle.config.to_dict(), "class_names": bundle.class_names,
            "sampling": bundle.sampling.to_dict(), **(extra or {})}
    (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


# Optional parts a bundle directory may carry, by the file that marks them: (module, loader). Loaders are
# imported only when the file is there; the shipped model's tokenizer and judge live in coolsd.toy.
EXTRAS: dict[str, tuple[str, str, str]] = {
    "tokenizer.safetensors": ("decoder", "coolsd.toy.vq", "load_decoder"),
    "judge.safetensors": ("quality", "coolsd.toy.judge", "load_quality"),
}


def load_extras(path: Path, config: ModelConfig) -> dict[str, Any]:
    """The optional parts present in ``path``: {"decoder": ..., "quality": ...}."""
    import importlib
    found = {}
    for marker, (part, module, loader) in EXTRAS.items():
        if (path / marker).exists():
            found[part] = getattr(importlib.import_module(module), loader)(path, config)
    return found


LUMINA_TEMPLATE = "Generate an image of {size}x{size} according to the following prompt:\n{prompt}<reserved08706>"
DEFAULT_TEMPLATES = {"lumina": LUMINA_TEMPLATE, "anole": "{prompt}"}  # Lumina-mGPT's README; LANTERN's Anole


def load_chameleon_json(spec: dict, path: Path, device: str | None = None, dtype: torch.dtype | None = None) -> Bundle:
    """A Chameleon-family model (target from its Hugging Face directory, VQGAN decoder, optional LANTERN
    drafter, the directory's tokenizer) as a Bundle; the target is read straight onto the device."""
    from .chameleon import PromptEncoder, image_ids, load_chameleon, load_tokenizer, read_vocabulary
    from .chameleon_drafter import load_chameleon_drafter
    from .chameleon_vq import ChameleonImage, load_vqgan

    base, device = path.parent, pick_device(device)
    model_dir = resolve(spec["model"], base, True)
    target = load_chameleon(model_dir, int(spec.get("image_size", 768)), spec.get("layout", "lumina"),
                            int(spec.get("prefix_slots", 256)), device, dtype)
    config = target.config
    drafters = {"eagle1": load_chameleon_drafter(resolve(spec["drafter"], base, True), config,
                                                 target.lm_head.weight.dtype)} if spec.get("drafter") else {}
    if spec.get("eagle3"):
        drafters["eagle3"] = load_eagle3_folder(resolve(spec["eagle3"], base, True), config)
    drafter = next(iter(drafters.values()), None)
    vocabulary = read_vocabulary(model_dir, json.loads((model_dir / "config.json").read_text()))
    image = ChameleonImage(load_vqgan(resolve(spec["vqgan"], base), resolve(spec["vqgan_config"], base)), config,
                           image_ids(vocabulary))
    template = spec.get("prompt_template") or DEFAULT_TEMPLATES[config.layout].replace("{size}",
                                                                                      str(config.image_size))
    bundle = Bundle(target, drafter, image.codebook, name=spec.get("name", base.name), class_names=[],
                    sampling=SamplingConfig(**spec.get("sampling", {})), decoder=image, info=spec, path=base,
                    text_encoder=PromptEncoder(load_tokenizer(model_dir), config, template), drafters=drafters)
    return bundle.to(device)


def load_model_json(path: Path, device: str | None = None, dtype: torch.dtype | None = None) -> Bundle:
    """A model.json model as a Bundle: LlamaGen-family (target, optional drafter, VQ-16 decoder, optional T5),
    or Chameleon-family (:func:`load_chameleon_json`)."""
    if read_spec(path)["family"] == "chameleon":
        return load_chameleon_json(read_spec(path), path, device, dtype)
    from .lantern import load_lantern_drafter
    from .llamagen import load_llamagen_gpt
    from .vq16 import load_vq16

    spec, base = read_spec(path), path.parent
    config = model_config(spec)
    target = load_llamagen_gpt(resolve(spec["gpt"], base), spec["model_args"])
    drafters = {"eagle1": load_lantern_drafter(resolve(spec["drafter"], base, True), config)} \
        if spec.get("drafter") else {}
    if spec.get("eagle3"):
        drafters["eagle3"] = load_eagle3_folder(resolve(spec["eagle3"], base, True), config)
    drafter = next(iter(drafters.values()), None)
    image = load_vq16(resolve(spec["vq"], base), spec["vq_args"], (config.grid_height, config.grid_width))
    text_encoder = None
    if config.text_conditioned and spec.get("t5"):
        from .text import CaptionEncoder
        t5 = spec["t5"]
        text_encoder = CaptionEncoder(str(resolve(t5, base, True)) if t5.startswith(HUB) or (base / t5).exists()
                                      else t5, slots=config.cls_token_num)
    bundle = Bundle(target, drafter, image.codebook, name=spec.get("name", path.parent.name if path.name ==
                                                                   "model.json" else path.stem),
                    class_names=class_names(spec, config), sampling=SamplingConfig(**spec.get("sampling", {})),
                    decoder=image, info=spec, path=path.parent, text_encoder=text_encoder, drafters=drafters)
    return bundle.to(pick_device(device))


def load_eagle3_folder(folder: Path, config: Any) -> nn.Module:
    """An EAGLE-3 drafter directory as the trainer writes it: ``config.json`` (its taps), ``model.safetensors``;
    the Chameleon variant for a Chameleon target's config."""
    from .chameleon import ChameleonConfig
    from .chameleon_drafter import ChameleonEagle3Drafter
    meta = json.loads((folder / "config.json").read_text())
    kind = ChameleonEagle3Drafter if isinstance(config, ChameleonConfig) else Eagle3Drafter
    drafter = kind(config, meta.get("taps"))
    load_model(drafter, folder / "model.safetensors")
    return drafter.eval()


EAGLE3_FILE = "eagle3.safetensors"  # a bundle directory's EAGLE-3 drafter; config.json "eagle3" has its taps
DRAFTER_NAMES = {"eagle1": "Eagle-1", "eagle3": "EAGLE-3"}  # a drafter's name -> how the app and tables say it


def drafter_name(drafter: Drafter) -> str:
    """``eagle3`` for a drafter that reads target layers, else ``eagle1``."""
    return "eagle3" if getattr(drafter, "target_layers", ()) else "eagle1"


def load_bundle(path: str | Path | None = None, device: str | None = None, dtype: torch.dtype | None = None) -> Bundle:
    """Load a model onto ``device`` (default: CUDA if present, in bf16 there): the shipped model by default, one
    of our bundle directories, or a ``model.json`` model or preset (:mod:`coolsd.models.registry`)."""
    described = model_file(path) if path else None
    if described is not None:
        bundle = load_model_json(described, device, dtype)
        return bundle.to(bundle.device, dtype or (torch.bfloat16 if bundle.device.type == "cuda" else None))
    path = Path(path) if path else DEFAULT_MODEL
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model bundle at {path} (expected config.json and *.safetensors)")
    meta = json.loads((path / "config.json").read_text())
    cfg = ModelConfig(**meta["model"])
    target = Transformer(cfg)
    load_model(target, path / "target.safetensors")
    drafters = {}
    if (path / "drafter.safetensors").exists():
        drafters["eagle1"] = Drafter(cfg)
        load_model(drafters["eagle1"], path / "drafter.safetensors")
    if (path / EAGLE3_FILE).exists():
        drafters["eagle3"] = Eagle3Drafter(cfg, meta.get("eagle3", {}).get("taps"))
        load_model(drafters["eagle3"], path / EAGLE3_FILE)
    codebook = load_file(path / "codebook.safetensors")["codebook"]
    drafters = {name: drafter.eval() for name, drafter in drafters.items()}
    bundle = Bundle(target.eval(), next(iter(drafters.values()), None), codebook, name=meta.get("name", path.name),
                    class_names=meta.get("class_names", []), sampling=SamplingConfig(**meta.get("sampling", {})),
                    info=meta, path=path, drafters=drafters, **load_extras(path, cfg))
    device = pick_device(device)
    if dtype is None and device.type == "cuda":
        dtype = torch.bfloat16
    return bundle.to(device, dtype)
