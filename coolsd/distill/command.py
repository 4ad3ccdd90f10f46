"""Train an Eagle-1 drafter for any target coolsd loads, by self-distillation. The target (a preset, a directory
with model.json, a bundle directory, or a random-init shape) generates the training images; the drafter learns to
predict its features.

    python -m coolsd.train drafter --model assets/fashion --out runs/fashion-drafter --images 4000 --epochs 3
    python -m coolsd.train drafter --random-init tiny --out runs/tiny-drafter --images 256
    python -m coolsd.train drafter --model llamagen-c2i-b --out runs/b-drafter --estimate-only

It prints a cost estimate measured on this device first and refuses a run over --max-hours (unless --force).
Checkpoints go to --work (default OUT/work); the same command resumes an interrupted run. The out directory
loads with load_bundle(out) or --model OUT and has a README.md with the measured quality.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..core.params import OneLineParser, number, program, run_command, show_number
from ..models.bundle import Bundle, load_bundle, random_bundle, set_threads
from ..models.config import RANDOM_INIT_SIZES
from ..models.registry import EXAMPLE_PROMPTS
from .cost import calibrate, check_budget, estimate
from .data import generate_shard, shard_seed, shard_sizes
from .heads import KINDS, drafter_format, save_drafter
from .report import REPORT_DRAFTS, model_card, quality, report_conditions
from .trainer import TrainConfig, TrainResult, train_drafter

NUMBERS = {  # option: (low, high, whole number)
    "images": (1, 10**8, True), "epochs": (1, 10**4, True), "batch": (1, 10**5, True), "lr": (0, 1, False),
    "warmup": (0, 1, False), "weight_decay": (0, 10, False), "grad_clip": (0, 10**6, False),
    "noise": (0, 10, False), "unconditional": (0, 1, False), "ce_weight": (0, 100, False),
    "seed": (0, 2**31 - 1, True), "gen_batch": (1, 10**5, True), "memory_gb": (0, 10**6, False),
    "checkpoint_every": (1, 10**9, True), "ttt_steps": (1, 16, True),
}


# The shipped default model's own drafter stage shares the command's name: how to reach it, for the help.
DEFAULT_MODEL_STAGE = ("The shipped default model's own drafter stage (trained on its real training images, after\n"
                       "its target stage) runs without --model or --random-init:\n"
                       "    python -m coolsd.train drafter --work runs/fashion [--steps N]\n"
                       "python -m coolsd.train --help lists every stage.")


def build_parser() -> argparse.ArgumentParser:
    """Every option with its help and its default in words (none reads "None")."""
    defaults = TrainConfig()
    parser = OneLineParser(prog=f"{program('coolsd.train')} drafter", description=__doc__, epilog=DEFAULT_MODEL_STAGE,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a preset, a directory with model.json, or a bundle directory")
    which.add_argument("--random-init", choices=list(RANDOM_INIT_SIZES), help="a randomly initialised target")
    parser.add_argument("--out", type=Path, required=True, help="where the trained drafter (and its model) go")
    parser.add_argument("--work", type=Path, default=None, help="checkpoints and data shards (default: OUT/work)")
    parser.add_argument("--prompts", type=Path, default=None, help="a file of prompts, one a line (text models "
                        "need it)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="the target's weights while generating "
                        "and training (default: bfloat16 on CUDA, else float32); float32 on a GPU trains for a "
                        "target that will run in float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: $COOLSD_THREADS, "
                        "else 1)")
    parser.add_argument("--kind", choices=list(KINDS), default=defaults.kind, help="eagle1 (the target's final "
                        "features, Eagle's objective) or eagle3 (fused target layers, training-time test); an "
                        "eagle3 drafter is saved beside the model's Eagle-1 drafter (default eagle1)")
    parser.add_argument("--taps", default="", help="EAGLE-3's target layers, comma-separated (default: 2, n // 2 "
                        "and n - 3 of an n-layer target)")
    for name in NUMBERS:
        parser.add_argument("--" + name.replace("_", "-"), default=getattr(defaults, name),
                            help=f"{OPTION_HELP[name]} (default {show_number(getattr(defaults, name))})")
    parser.add_argument("--eval-images", type=int, default=20, help="held-out images for the quality report "
                        "(default 20)")
    parser.add_argument("--no-compare", action="store_true", help="do not measure the model's existing drafter")
    parser.add_argument("--max-hours", type=float, default=12.0, help="refuse a run estimated to take longer "
                        "(default 12)")
    parser.add_argument("--force", action="store_true", help="run even when the estimate exceeds --max-hours")
    parser.add_argument("--estimate-only", action="store_true", help="print the cost estimate and stop")
    parser.add_argument("--stop-after", type=int, default=None, help="checkpoint and stop after this many steps "
                        "(default: run to the end)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data shards on disk after the run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each number checked against its range."""
    args = build_parser().parse_args(argv)
    for name, (low, high, whole) in NUMBERS.items():
        setattr(args, name, number(name.replace("_", "-"), getattr(args, name), low, high, integer=whole))
    number("eval-images", args.eval_images, 1, 10**6, integer=True)
    try:
        args.taps = tuple(int(t) for t in args.taps.split(",")) if args.taps.strip() else ()
    except ValueError:
        raise ValueError(f"--taps takes layer numbers separated by commas, e.g. 2,16,29; got {args.taps!r}") from None
    if args.taps and args.kind != "eagle3":
        raise ValueError("--taps chooses an EAGLE-3 drafter's target layers: add --kind eagle3")
    number("max-hours", args.max_hours, above=0)
    return args


OPTION_HELP = {
    "images": "self-distilled images to generate", "epochs": "passes over them", "batch": "images per step",
    "lr": "AdamW peak learning rate", "warmup": "fraction of the steps spent warming up (then cosine decay)",
    "weight_decay": "AdamW weight decay", "grad_clip": "gradient norm clipped to this",
    "noise": "uniform noise U(-noise, noise) on the input features", "unconditional": "fraction of CFG-null rows",
    "ce_weight": "weight of the soft cross-entropy next to SmoothL1", "seed": "seed of the data and the training",
    "gen_batch": "images generated per batch",
    "memory_gb": "data up to this size (GB) stays in memory, larger goes to disk in shards",
    "checkpoint_every": "steps between checkpoints",
    "ttt_steps": "EAGLE-3's training-time test steps K (--kind eagle3)",
}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_target(args: argparse.Namespace) -> Bundle:
    set_threads(args.threads)
    dtype = DTYPES[args.dtype] if args.dtype else None
    if args.random_init:
        bundle = random_bundle(args.random_init, device=args.device)
        return bundle.to(bundle.device, dtype) if dtype else bundle
    return load_bundle(args.model, device=args.device, dtype=dtype)


def read_prompts(bundle: Bundle, path: Path | None) -> list[str] | None:
    """A text model's training prompts (the example prompts, kept for the report, are left out)."""
    if not bundle.config.text_conditioned:
        return None
    if path is None:
        raise ValueError("a text-to-image model needs --prompts FILE (one prompt a line) to self-distil from")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    prompts = [p for p in prompts if p not in EXAMPLE_PROMPTS]
    if not prompts:
        raise ValueError(f"--prompts {path} has no prompts besides the held-out example prompts")
    return prompts


def measure_quality(bundle: Bundle, result: TrainResult, config: TrainConfig, eval_images: int,
                    compare: bool) -> dict:
    """The quality report of the new drafter (and of the model's own, if it has one) on held-out conditions."""
    target = bundle.target
    conditions = report_conditions(bundle, eval_images)
    shards = []
    for index, size in enumerate(shard_sizes(eval_images, config.gen_batch)):
        generator = torch.Generator(bundle.device).manual_seed(shard_seed(config.seed + 1, -1 - index))
        start = index * config.gen_batch
        shards.append(generate_shard(target, result.drafter, conditions[start:start + size], bundle.sampling,
                                     generator))
    drafter = result.drafter.to(target.output.weight.dtype)  # as load_bundle will cast it (bf16 on CUDA)
    report = {"images": eval_images, "sampling": bundle.sampling.to_dict(),
              "new": quality(target, drafter, conditions, shards, bundle.sampling)}
    if compare and bundle.drafter is not None:
        report["existing"] = quality(target, bundle.drafter, conditions, shards, bundle.sampling)
    return report


def run(args: argparse.Namespace, argv: list[str]) -> int:
    bundle = load_target(args)
    prompts = read_prompts(bundle, args.prompts)
    config = TrainConfig(**{name: getattr(args, name) for name in NUMBERS}, kind=args.kind, taps=args.taps)
    work = args.work or args.out / "work"
    compare = not args.no_compare and bundle.drafter is not None
    cost = estimate(bundle, config, calibrate(bundle, config), args.eval_images, 2 if compare else 1)
    print(cost.describe(config, bundle.config.image_tokens, str(bundle.device)), flush=True)
    check_budget(cost, args.max_hours, args.force or args.estimate_only)
    if args.estimate_only:
        return 0
    started = time.perf_counter()
    result = train_drafter(bundle, config, work, prompts, not args.no_progress, args.stop_after)
    if not result.finished:
        print(f"stopped after {len(result.losses)} of {config.steps} steps; the checkpoint is in {work}: run the "
              "same command again to resume")
        return 0
    report = measure_quality(bundle, result, config, args.eval_images, compare)
    seconds = {**result.seconds, "report": time.perf_counter() - started - sum(result.seconds.values())}
    record = {"command": "python -m coolsd.train drafter " + " ".join(argv),
              "format": drafter_format(bundle, config.kind), "taps": list(result.drafter.target_layers),
              "target": bundle.name, "settings": asdict(config), "steps": len(result.losses),
              "loss_first_50": mean(result.losses[:50]), "loss_last_50": mean(result.losses[-50:]),
              "data_in_memory": result.in_memory, "seconds_this_process": seconds,
              "estimated_seconds": {"generation": cost.generation, "training": cost.training,
                                    "report": cost.report}, "device": str(bundle.device),
              "machine": f"{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)",
              "quality": report}
    save_drafter(bundle, result.drafter.float(), args.out, record)
    (args.out / "training_log.json").write_text(json.dumps({"losses": result.losses}) + "\n")
    (args.out / "README.md").write_text(model_card(record))
    if not args.keep_data and (work / "shards").exists():
        shutil.rmtree(work / "shards")
    summarise(record, args.out)
    return 0


def mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def summarise(record: dict, out: Path) -> None:
    new = record["quality"]["new"]
    taus = ", ".join(f"{d} {new['tau'][d]:.3f}" for d in REPORT_DRAFTS)
    print(f"loss {record['loss_first_50']:.4f} (first 50 steps) -> {record['loss_last_50']:.4f} (last 50); "
          f"Eagle-1 tau: {taus}")
    if "existing" in record["quality"]:
        old = record["quality"]["existing"]
        print("the model's own drafter: " + ", ".join(f"{d} {old['tau'][d]:.3f}" for d in REPORT_DRAFTS))
    print(f"written to {out} (load it with --model {out})")


def main(argv: list[str] | None = None) -> int:
    """The command; a bad or missing option ends it with one ``error:`` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: run(parse_args(argv), argv))
