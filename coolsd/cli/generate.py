"""Command line: generate one image with a chosen method and write its picture and statistics.

    python -m coolsd.generate --method cool --delta 2 --nu 0.7 --mu auto --class 3 --seed 0 \\
        --out img.png --stats stats.json

Every option is checked (``check_args``) before the model loads or anything is generated; a bad one ends the
command with a one-line ``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..core.decode import EMPTY, generate
from ..core.params import (
    PROMPT_CHARS,
    Choice,
    OneLineParser,
    Param,
    check_prompt,
    program,
    run_command,
    shorten,
    show_number,
)
from ..core.rules import RULES, build_rule
from .common import (
    add_model_arguments,
    check_model_args,
    check_output,
    load_model,
    sampling_from,
)
from .methods import check_param, check_rule, parse_value

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
# Command-line-only ranges, in the same form (and error messages) as coolsd.params. A PNG enlarged 64x is
# already 1,792 px wide for the shipped 28 px images; more would only cost memory.
SCALE = Param("scale", 1, 64, 8, 1, "PNG enlargement", integer=True)


def condition_of(args: argparse.Namespace) -> int | str:
    """``--class`` for a class model (a class index), ``--prompt`` for a text model (encoded once it loads)."""
    if args.info.config.text_conditioned:
        if args.class_label is not None:
            raise ValueError("this is a text-to-image model: give --prompt, not --class")
        if not (args.prompt or "").strip():
            raise ValueError("this is a text-to-image model: give --prompt \"a description of the image\"")
        return check_prompt(args.prompt)
    if args.prompt is not None:
        raise ValueError("this is a class-to-image model: give --class, not --prompt")
    return class_index(args.info.class_names, args.class_label if args.class_label is not None else "0")


def encode(bundle, condition: int | str):
    """The generation's condition: a class index as it is, a prompt through the model's text encoder."""
    if not isinstance(condition, str):
        return condition
    if bundle.text_encoder is None:
        raise ValueError("this text-to-image model has no text encoder (model.json names no t5)")
    return bundle.text_encoder([condition])[0]


def scale_for(pixels: np.ndarray, scale: int | None) -> int:
    """The given enlargement, else 8 for small images and 1 from 128 px up."""
    return scale if scale is not None else (1 if max(pixels.shape[:2]) >= 128 else SCALE.default)


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


def method_options() -> dict[str, dict[Param | Choice, list[str]]]:
    """Every parameter some registered method takes, by name, each distinct schema with the methods that take it:
    two methods may give one name different schemas (``--residual`` is gstar or lantern for LANTERN++, gsd or
    gstar for GSD), and the help and the checks must give each method its own list."""
    options: dict[str, dict[Param | Choice, list[str]]] = {}
    for spec in RULES.values():
        for param in spec.params:
            options.setdefault(param.name, {}).setdefault(param, []).append(spec.name)
    return options


def option_help(schemas: dict[Param | Choice, list[str]]) -> str:
    """An option's help, one part per schema: the methods that take it, what it does, its values, its default."""
    parts = []
    for param, takers in schemas.items():
        values = " or ".join(param.choices) if isinstance(param, Choice) else param.span()
        parts.append(f"({', '.join(takers)}) {param.help}; {values}, default {shown(param.default)}")
    return " | ".join(parts)


def method_params(args: argparse.Namespace) -> dict:
    """The method options given, each checked against the chosen method's schema."""
    given = {name: getattr(args, f"param_{name}") for name in method_options()}
    return {name: check_param(args.method, name, value) for name, value in given.items() if value is not None}


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``generate``, before the model loads; adds ``class_id`` and ``params``."""
    check_output(args.out, "--out", IMAGE_SUFFIXES)
    check_output(args.stats, "--stats")
    args.scale = SCALE.check(args.scale) if args.scale is not None else None
    check_model_args(args)
    args.condition = condition_of(args)
    args.params = method_params(args)
    tree = args.tree if RULES[args.method].drafts else EMPTY
    check_rule(args.method, args.params, tree.depth, args.info.config.vocab_size)
    return args


def save_image(pixels: np.ndarray, path: Path, scale: int = 8) -> None:
    """Write a uint8 picture, enlarged without blur."""
    image = Image.fromarray(pixels)
    image.resize((image.width * scale, image.height * scale), Image.NEAREST).save(path)


def shown(default: float | str) -> str:
    """A default as the help gives it: ``2``, ``0.7``, ``auto``."""
    return default if isinstance(default, str) else show_number(default)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=program("coolsd.generate"), description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=list(RULES), default="cool",
                        help="; ".join(f"{spec.name}: {spec.label}" for spec in RULES.values()))
    for name, schemas in method_options().items():  # from the rule registry
        only = next(iter(schemas)) if len(schemas) == 1 else None
        if isinstance(only, Choice):  # one list for every taker: argparse may check it
            parser.add_argument(f"--{name}", choices=only.choices, default=None, dest=f"param_{name}",
                                help=option_help(schemas))
        else:  # numbers, or values that differ by method: the chosen method's schema checks them (check_args)
            parser.add_argument(f"--{name}", default=None, dest=f"param_{name}", metavar=name.upper(),
                                help=option_help(schemas))
    parser.add_argument("--class", dest="class_label", default=None, help="class index or name (class models; "
                        "default 0)")
    parser.add_argument("--prompt", default=None,
                        help=f"the caption (text-to-image models; at most {PROMPT_CHARS} characters)")
    parser.add_argument("--out", type=Path, default=None, help="image file (PNG, or another common format)")
    parser.add_argument("--scale", default=None, help="enlargement of the image (nearest neighbour; default 8, "
                        "or 1 for images of 128 px or more)")
    parser.add_argument("--stats", type=Path, default=None, help="JSON file for the statistics")
    add_model_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(lambda: generate_image(argv))


def generate_image(argv: list[str] | None) -> int:
    """Check every option, load the model, build the rule once, generate, write the outputs, print a summary."""
    args = check_args(build_parser().parse_args(argv))
    bundle = load_model(args)
    rule = build_rule(args.method, args.params, args.tree.depth, bundle)
    result = generate(bundle, encode(bundle, args.condition), rule, args.tree, sampling_from(args.overrides, bundle),
                      args.seed)
    if args.out:
        pixels = bundle.image(result.tokens)
        save_image(pixels, args.out, scale_for(pixels, args.scale))
    if args.stats:  # the generated tokens too, structural ones included, in generation order
        record = {**result.stats.to_dict(), "image_tokens": [int(t) for t in result.tokens],
                  "drafter": bundle.drafter_name if args.tree.size and args.tree.needs_drafter else None}
        args.stats.write_text(json.dumps(record, indent=1) + "\n")
    stats = result.stats
    drafter = f" drafter={bundle.drafter_name}" if args.tree.size and args.tree.needs_drafter else ""
    print(f"{stats.method} {stats.params} draft={stats.draft}{drafter}: tau={stats.tau:.3f} "
          f"target_forwards={stats.target_forwards} drafter_forwards={stats.drafter_forwards} "
          f"relaxation_cost={stats.relaxation_cost:.4f} time={stats.seconds['total']:.3f}s")
    if not args.out:  # a stats-only run is legitimate, so nothing is written unasked; but say so
        print("no --out given: the image was not written (add --out img.png to write it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
