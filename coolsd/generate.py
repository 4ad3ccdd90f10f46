"""Command line: generate one image with a chosen method and write its picture and statistics.

    python -m coolsd.generate --method cool --delta 2 --nu 0.7 --mu auto --class 3 --seed 0 \\
        --out img.png --stats stats.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .bundle import Bundle, load_bundle, random_bundle
from .decode import METHODS, generate
from .methods import parse_value
from .sampling import SamplingConfig

METHOD_OPTIONS = {"delta": float, "nu": float, "mu": parse_value, "schedule": str, "k": int, "lambda": float,
                  "residual": str}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with the benchmark: which model, where, and the sampling transform."""
    parser.add_argument("--model", default=None, help="model bundle directory (default: the shipped model)")
    parser.add_argument("--random-init", choices=["tiny", "small"], default=None,
                        help="use a randomly initialised target/drafter pair instead of a trained model")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--draft", default="chain:5", help="chain:L or tree:<preset> (eagle25, wide57)")
    parser.add_argument("--cfg", type=float, default=None, help="classifier-free guidance scale")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")


def load_model(args: argparse.Namespace) -> Bundle:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random_init:
        return random_bundle(args.random_init, device=args.device)
    return load_bundle(args.model, device=args.device)


def sampling_from(args: argparse.Namespace, bundle: Bundle) -> SamplingConfig:
    """The bundle's recommended sampling settings, overridden by any option given."""
    base = bundle.sampling.to_dict()
    given = {"cfg_scale": args.cfg, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    return SamplingConfig(**{**base, **{k: v for k, v in given.items() if v is not None}})


def class_index(bundle: Bundle, label: str) -> int:
    """A class by index or by (case-insensitive) name."""
    names = [n.lower() for n in bundle.class_names]
    if label.lower() in names:
        return names.index(label.lower())
    try:
        return int(label)
    except ValueError:
        raise ValueError(f"class must be an index or one of: {', '.join(bundle.class_names)}; got {label!r}") from None


def save_image(pixels: np.ndarray, path: Path, scale: int = 8) -> None:
    """Write a uint8 picture, enlarged without blur."""
    image = Image.fromarray(pixels)
    image.resize((image.width * scale, image.height * scale), Image.NEAREST).save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coolsd.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=METHODS, default="cool")
    for name, kind in METHOD_OPTIONS.items():
        parser.add_argument(f"--{name}", type=kind, default=None, dest=name.replace("lambda", "lam"))
    parser.add_argument("--class", dest="class_label", default="0", help="class index or name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="PNG file for the image")
    parser.add_argument("--scale", type=int, default=8, help="enlargement of the PNG (nearest neighbour)")
    parser.add_argument("--stats", type=Path, default=None, help="JSON file for the statistics")
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    try:
        bundle = load_model(args)
        params = {name: getattr(args, name.replace("lambda", "lam")) for name in METHOD_OPTIONS}
        params = {k: v for k, v in params.items() if v is not None}
        result = generate(bundle, class_index(bundle, args.class_label), args.method, params, args.draft,
                          sampling_from(args, bundle), args.seed)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = result.stats
    if args.out:
        save_image(bundle.image(result.tokens), args.out, args.scale)
    if args.stats:
        args.stats.write_text(json.dumps(stats.to_dict(), indent=1) + "\n")
    print(f"{stats.method} {stats.params} draft={stats.draft}: tau={stats.tau:.3f} "
          f"target_forwards={stats.target_forwards} drafter_forwards={stats.drafter_forwards} "
          f"relaxation_cost={stats.relaxation_cost:.4f} time={stats.seconds['total']:.3f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
