"""What both command lines share: the model and sampling options, their checks (before any model loads), and
loading the model. The one-line error convention (``OneLineParser``, ``run_command``) lives in
:mod:`coolsd.core.params`, which the training commands use too."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.params import PARAMS, Param, check, shorten
from ..core.sampling import SamplingConfig
from ..core.trees import default_draft, parse_draft, usable_depth
from ..models.bundle import (
    DEFAULT_MODEL,
    DRAFTER_NAMES,
    EAGLE3_FILE,
    Bundle,
    load_bundle,
    pick_device,
    random_bundle,
    set_threads,
)
from ..models.config import CONFIGS, RANDOM_INIT_SIZES, ModelConfig
from ..models.registry import class_names, model_file, preset_names, read_spec
from ..models.registry import model_config as registry_config
from ..models.steps import MODE_HELP, MODES, default_mode

SAMPLING_OPTIONS = {"cfg": "cfg_scale", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p"}


@dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the model, read without loading its weights."""

    config: ModelConfig
    class_names: list[str]
    drafters: tuple[str, ...] = ("eagle1",)  # the drafters the model carries, by name, the default first

    @property
    def has_drafter(self) -> bool:
        return bool(self.drafters)

    @property
    def draft(self) -> str:
        """The draft when --draft is not given: a coupled Jacobi window for a model without a drafter."""
        return default_draft(self.config.image_tokens, self.has_drafter)


def add_model_arguments(parser: argparse.ArgumentParser, several_drafters: bool = False) -> None:
    """Options shared with the benchmark: which model, where, its drafter (``several_drafters``: the benchmark
    takes a list, each drafting method running with each), and the sampling transform. Numbers are read as text
    and checked by :func:`check_model_args`, so every range error has coolsd.params' wording."""
    parser.add_argument("--model", default=None, help="a preset (" + ", ".join(preset_names()) + "), a directory "
                        "with model.json, or a bundle directory (default: the shipped model)")
    parser.add_argument("--random-init", choices=list(RANDOM_INIT_SIZES), default=None,
                        help="use a randomly initialised target/drafter pair instead of a trained model")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--steps", choices=list(MODES), default=None, help=MODE_HELP)
    parser.add_argument("--draft", default=None, help="chain:L, tree:<preset> (eagle25, wide57) or a Jacobi window, "
                        "jacobi:L[:independent|coupled|gumbel][:uniform|point], which needs no drafter (default: the "
                        "model's, else chain:5)")
    parser.add_argument("--drafter", nargs="+" if several_drafters else None, default=None, metavar="NAME",
                        help="the drafter a drafting method uses: eagle1 (Eagle-1) or eagle3 (EAGLE-3), where the "
                        "model carries it" + ("; several: each drafting method runs with each, in the same run"
                                              if several_drafters else "") + " (default: the model's first, eagle1)")
    parser.add_argument("--cfg", default=None, help=f"classifier-free guidance scale; {PARAMS['cfg_scale'].span()} "
                        "(default: the model's)")
    parser.add_argument("--temperature", default=None, help=f"{PARAMS['temperature'].span()} (default: the model's)")
    parser.add_argument("--top-k", default=None, help="0 = off; at most the vocabulary size")
    parser.add_argument("--top-p", default=None, help=f"{PARAMS['top_p'].span()}; 1 = off")
    parser.add_argument("--seed", default="0", help=f"{PARAMS['seed'].span()} (default 0)")
    parser.add_argument("--threads", default=None,
                        help="CPU threads for torch (default: $COOLSD_THREADS, else 1: the fastest for small models)")


def model_info(model: str | None, random_init: str | None) -> ModelInfo:
    """The model's shape and class names, read without its weights: from a preset or ``model.json``, from a
    bundle's config.json, or from the random-init shape."""
    if random_init:
        config = CONFIGS[random_init]
        return ModelInfo(config, [f"class {i}" for i in range(config.num_classes)])
    described = model_file(model) if model else None
    if described is not None:
        spec = read_spec(described)
        config = registry_config(spec, described.parent)
        return ModelInfo(config, class_names(spec, config), tuple(name for name, key in (("eagle1", "drafter"),
                                                                                         ("eagle3", "eagle3"))
                                                                  if spec.get(key)))
    path = Path(model) if model else DEFAULT_MODEL
    if not (path / "config.json").is_file():
        raise ValueError(f"no model bundle at {path} (expected config.json and *.safetensors)")
    try:
        meta = json.loads((path / "config.json").read_text())
        config = ModelConfig(**meta["model"])
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"unreadable model config {path / 'config.json'}: {shorten(str(error), 80)}") from None
    names = meta.get("class_names") or [f"class {i}" for i in range(config.num_classes)]
    files = (("eagle1", "drafter.safetensors"), ("eagle3", EAGLE3_FILE))
    return ModelInfo(config, names, tuple(name for name, file in files if (path / file).is_file()))


def check_device(device: str | None) -> None:
    """cpu, cuda or cuda:N, and CUDA only when this torch can reach a GPU."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {shorten(device)}")
    if parsed.type == "cuda":
        if torch.version.cuda is None:
            raise ValueError(f"device {device}: this torch ({torch.__version__}) is built without CUDA; "
                             "use --device cpu")
        if not torch.cuda.is_available():
            raise ValueError(f"device {device}: no CUDA GPU is visible to torch; use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device {device}: only {torch.cuda.device_count()} CUDA GPU(s) are visible")


def check_steps(steps: str | None, device: torch.device, many_images: bool = False) -> str:
    """``--steps``: the device's default when not given (for a run of ``many_images``, the benchmark, the
    compiled phases on a CPU: :func:`coolsd.models.steps.default_mode`); CUDA graphs only on CUDA."""
    steps = steps or default_mode(device, many_images)
    if steps == "graphs" and device.type != "cuda":
        raise ValueError(f"--steps graphs captures CUDA graphs and needs a CUDA device; on {device.type} use eager, "
                         "static or compiled")
    return steps


def check_output(path: Path | None, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """An output file we will be able to write, checked before any work so a typo costs nothing."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{option} {path} must end in one of {', '.join(suffixes)}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{option} {path}: not writable")


def check_threads(threads: str | None) -> int | None:
    """``--threads``: None (then ``set_threads`` reads $COOLSD_THREADS, else 1) or 1..the machine's CPUs."""
    if threads is None:
        return None
    return Param("threads", 1, os.cpu_count() or 1, 1, 1, "CPU threads", integer=True).check(threads)


def check_model_args(args: argparse.Namespace, many_images: bool = False) -> argparse.Namespace:
    """Check the options shared with the benchmark (``many_images``: its default steps); adds ``info``
    (ModelInfo), ``tree`` (DraftTree, at most as deep as the model can use) and ``overrides`` (checked sampling
    settings)."""
    check_device(args.device)
    args.steps = check_steps(args.steps, pick_device(args.device), many_images)
    args.threads = check_threads(args.threads)
    args.seed = check("seed", args.seed)
    args.info = model_info(args.model, args.random_init)
    args.drafter = check_drafters(args.drafter, args.info)
    args.draft = args.draft or args.info.draft
    args.tree = parse_draft(args.draft, usable_depth(args.info.config.image_tokens))
    vocab = args.info.config.vocab_size
    args.overrides = {name: check(name, getattr(args, option), vocab if name == "top_k" else None)
                      for option, name in SAMPLING_OPTIONS.items() if getattr(args, option) is not None}
    return args


def check_drafters(names: "str | list[str] | None", info: ModelInfo) -> "str | list[str] | None":
    """``--drafter``: names the model carries (one-line error otherwise), unrepeated."""
    for name in [names] if isinstance(names, str) else names or []:
        if name not in DRAFTER_NAMES:
            raise ValueError(f"--drafter must be one of {', '.join(DRAFTER_NAMES)}, got {shorten(name)}")
        if name not in info.drafters:
            raise ValueError(f"this model has no {name} drafter (it has: {', '.join(info.drafters) or 'none'})")
    if isinstance(names, list) and len(set(names)) < len(names):
        raise ValueError("--drafter lists a drafter twice")
    return names


def load_model(args: argparse.Namespace) -> Bundle:
    """Set torch's threads deliberately (``set_threads``: torch's default of one per core was many times
    slower on a busy machine), then load the bundle."""
    args.threads = set_threads(args.threads)
    if args.random_init:
        bundle = random_bundle(args.random_init, device=args.device)
    else:
        bundle = load_bundle(args.model, device=args.device)
    if isinstance(args.drafter, str):
        bundle = bundle.with_drafter(args.drafter)
    return bundle.with_steps(args.steps)


def sampling_from(overrides: dict, bundle: Bundle) -> SamplingConfig:
    """The bundle's recommended sampling settings, overridden by any option given."""
    return SamplingConfig(**{**bundle.sampling.to_dict(), **overrides})
