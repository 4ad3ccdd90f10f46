"""Command line: generate one image with a chosen method and write its picture and statistics.

    python -m coolsd.generate --method cool --delta 2 --nu 0.7 --mu auto --class 3 --seed 0 \\
        --out img.png --stats stats.json

Every option is checked (``check_args``) before the model loads or anything is generated; a bad one ends the
command with a one-line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..core.decode import EMPTY, generate
from ..core.params import Choice, Param, check, shorten
from ..core.rules import RULES, build_rule
from ..core.sampling import SamplingConfig
from ..core.trees import parse_draft, usable_depth
from ..models.bundle import (
    DEFAULT_MODEL,
    Bundle,
    load_bundle,
    random_bundle,
    set_threads,
)
from ..models.config import CONFIGS, ModelConfig
from .methods import check_param, check_rule, parse_value

SAMPLING_OPTIONS = {"cfg": "cfg_scale", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
# Command-line-only ranges, in the same form (and error messages) as coolsd.params. A PNG enlarged 64x is
# already 1,792 px wide for the shipped 28 px images; more would only cost memory.
SCALE = Param("scale", 1, 64, 8, 1, "PNG enlargement", integer=True)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error raises ValueError, so ``main`` prints it as one ``error:`` line."""

    def error(self, message: str):
        raise ValueError(f"{message} (see --help)")


@dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the model, read without loading its weights."""

    config: ModelConfig
    class_names: list[str]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with the benchmark: which model, where, and the sampling transform. Numbers are read
    as text and checked by :func:`check_model_args`, so every range error has coolsd.params' wording."""
    parser.add_argument("--model", default=None, help="model bundle directory (default: the shipped model)")
    parser.add_argument("--random-init", choices=["tiny", "small"], default=None,
                        help="use a randomly initialised target/drafter pair instead of a trained model")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--draft", default="chain:5", help="chain:L or tree:<preset> (eagle25, wide57)")
    parser.add_argument("--cfg", default=None, help="classifier-free guidance scale (default: the model's)")
    parser.add_argument("--temperature", default=None)
    parser.add_argument("--top-k", default=None, help="0 = off; at most the vocabulary size")
    parser.add_argument("--top-p", default=None, help="1 = off")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--threads", default=None,
                        help="CPU threads for torch (default: $COOLSD_THREADS, else 1: the fastest for small models)")


def model_info(model: str | None, random_init: str | None) -> ModelInfo:
    """The model's shape and class names, from its config.json (or the random-init preset)."""
    if random_init:
        config = CONFIGS[random_init]
        return ModelInfo(config, [f"class {i}" for i in range(config.num_classes)])
    path = Path(model) if model else DEFAULT_MODEL
    if not (path / "config.json").is_file():
        raise ValueError(f"no model bundle at {path} (expected config.json and *.safetensors)")
    try:
        meta = json.loads((path / "config.json").read_text())
        config = ModelConfig(**meta["model"])
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"unreadable model config {path / 'config.json'}: {shorten(str(error), 80)}") from None
    names = meta.get("class_names") or [f"class {i}" for i in range(config.num_classes)]
    return ModelInfo(config, names)


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


def check_model_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the options shared with the benchmark; adds ``info`` (ModelInfo), ``tree`` (DraftTree, at most
    as deep as the model can use) and ``overrides`` (checked sampling settings)."""
    check_device(args.device)
    args.threads = check_threads(args.threads)
    args.seed = check("seed", args.seed)
    args.info = model_info(args.model, args.random_init)
    args.tree = parse_draft(args.draft, usable_depth(args.info.config.image_tokens))
    vocab = args.info.config.vocab_size
    args.overrides = {name: check(name, getattr(args, option), vocab if name == "top_k" else None)
                      for option, name in SAMPLING_OPTIONS.items() if getattr(args, option) is not None}
    return args


def load_model(args: argparse.Namespace) -> Bundle:
    """Set torch's threads deliberately (``set_threads``: torch's default of one per core was many times
    slower on a busy machine), then load the bundle."""
    args.threads = set_threads(args.threads)
    if args.random_init:
        return random_bundle(args.random_init, device=args.device)
    return load_bundle(args.model, device=args.device)


def sampling_from(overrides: dict, bundle: Bundle) -> SamplingConfig:
    """The bundle's recommended sampling settings, overridden by any option given."""
    return SamplingConfig(**{**bundle.sampling.to_dict(), **overrides})


def class_index(class_names: list[str], label: str) -> int:
    """A class by index or by (case-insensitive) name."""
    names = [n.lower() for n in class_names]
    if label.strip().lower() in names:
        return names.index(label.strip().lower())
    index = parse_value(label.strip())
    if isinstance(index, int) and 0 <= index < len(names):
        return index
    raise ValueError(f"class must be an index 0 to {len(names) - 1} or one of: {', '.join(class_names)}; "
                     f"got {shorten(label)}")


def method_options() -> dict:
    """Every parameter some registered method takes, by name (the first method's schema wins for a shared name)."""
    options: dict = {}
    for spec in RULES.values():
        for param in spec.params:
            options.setdefault(param.name, param)
    return options


def method_params(args: argparse.Namespace) -> dict:
    """The method options given, each checked against the chosen method's schema."""
    given = {name: getattr(args, f"param_{name}") for name in method_options()}
    return {name: check_param(args.method, name, value) for name, value in given.items() if value is not None}


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``generate``, before the model loads; adds ``class_id`` and ``params``."""
    check_output(args.out, "--out", IMAGE_SUFFIXES)
    check_output(args.stats, "--stats")
    args.scale = SCALE.check(args.scale)
    check_model_args(args)
    args.class_id = class_index(args.info.class_names, args.class_label)
    args.params = method_params(args)
    tree = args.tree if RULES[args.method].drafts else EMPTY
    check_rule(args.method, args.params, tree.depth, args.info.config.vocab_size)
    return args


def save_image(pixels: np.ndarray, path: Path, scale: int = 8) -> None:
    """Write a uint8 picture, enlarged without blur."""
    image = Image.fromarray(pixels)
    image.resize((image.width * scale, image.height * scale), Image.NEAREST).save(path)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m coolsd.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=list(RULES), default="cool",
                        help="; ".join(f"{spec.name}: {spec.label}" for spec in RULES.values()))
    for name, param in method_options().items():  # from the rule registry
        takers = ", ".join(spec.name for spec in RULES.values() if any(p.name == name for p in spec.params))
        text = f"({takers}) {param.help}".strip()
        if isinstance(param, Choice):
            parser.add_argument(f"--{name}", choices=param.choices, default=None, dest=f"param_{name}", help=text)
        else:
            parser.add_argument(f"--{name}", default=None, dest=f"param_{name}", help=text)
    parser.add_argument("--class", dest="class_label", default="0", help="class index or name")
    parser.add_argument("--out", type=Path, default=None, help="image file (PNG, or another common format)")
    parser.add_argument("--scale", default=str(SCALE.default), help="enlargement of the image (nearest neighbour)")
    parser.add_argument("--stats", type=Path, default=None, help="JSON file for the statistics")
    add_model_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = check_args(build_parser().parse_args(argv))
        bundle = load_model(args)
        rule = build_rule(args.method, args.params, args.tree.depth, bundle.neighbours)
        result = generate(bundle, args.class_id, rule, args.tree, sampling_from(args.overrides, bundle), args.seed)
        if args.out:
            save_image(bundle.image(result.tokens), args.out, args.scale)
        if args.stats:
            args.stats.write_text(json.dumps(result.stats.to_dict(), indent=1) + "\n")
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = result.stats
    print(f"{stats.method} {stats.params} draft={stats.draft}: tau={stats.tau:.3f} "
          f"target_forwards={stats.target_forwards} drafter_forwards={stats.drafter_forwards} "
          f"relaxation_cost={stats.relaxation_cost:.4f} time={stats.seconds['total']:.3f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
