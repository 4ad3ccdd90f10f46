"""Benchmark: speed and quality of configurations (a method on a draft) on the same classes and seeds.

    python -m coolsd.bench --methods ar eagle cool:delta=2 uniform:delta=2 \\
        lantern:k=10,lambda=5,residual=gstar --images 20 --out results.json
    python -m coolsd.bench --preset paper --images 1000 --work runs/paper --out r.json --csv r.csv
    torchrun --nproc_per_node 4 -m coolsd.bench --preset paper --images 1000 --latency-images 200 --work runs/paper
    python -m coolsd.bench --methods ar eagle cool:delta=2 --images 64 --latency-batch 1 4 16 64 --repeats 3

Image i is class i mod C with seed ``seed + i`` for every configuration. Each (configuration, image) gives a
sample record: tokens, tau, the target's log-likelihood, the relaxation cost and, with a judge that scores single
images, its features and verdict. Speed comes from timing images 0..M-1 (``--latency-images``, default all):
each configuration first makes ``--warmup`` untimed calls, then the calls are interleaved across configurations
so that all see the same machine conditions, ``--repeats R`` times each (the median counts); AR is always
measured in the same run. A speed-up is AR's median latency / the method's (``speedup_over_ar``), bracketed by
the lowest and highest per-image ratio AR latency / method latency, and every difference from Eagle-1 (on the same draft) with a paired 95% bootstrap interval over
images.

Batches (spec section 9): ``--batch B`` decodes B images of a configuration together in the untimed pass (the
same tokens as one at a time, up to rounding: see :func:`coolsd.cli.passes.keep_samples`); ``--latency-batch`` the
batch sizes the timed images are decoded in, each with its images per second and speed-up over AR at the same size
(a call's latency is each of its images' latency).

One process makes one pass: a timed image's median-latency generation is also its sample (decoding is
deterministic for a seed, so an untimed generation would give the same record), the other images are
generated once. Under torchrun the (configuration, image) items are split over the processes and generated
untimed; rank 0 gathers the samples, the others exit, and rank 0 then times images 0..M-1 alone, so that no
timing shares the machine with another process's work. With M left at every image that pass costs as much as
a one-process run: give a smaller ``--latency-images`` to gain from the processes, or ``--shared-timing``: every
process then times its share of the images (image i on rank i mod N, each configuration against AR moments apart
on the same process), which divides the pass by N at the price of timing next to the others' timing. With ``--work DIR`` every
record is appended to DIR as soon as it is done, and a rerun with the same arguments continues from there.

This module is the command line and the run's outline (:func:`run_benchmark`): the passes are in
:mod:`coolsd.cli.passes`, the summaries and paired statistics in :mod:`coolsd.cli.summaries`, and the CSV,
table and figures in :mod:`coolsd.cli.output`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..app.claims import summary
from ..core.decode import check_batch_memory
from ..core.memory import gigabytes
from ..core.params import OneLineParser, Param, program, run_command
from ..core.rules import build_rule
from ..core.sampling import SamplingConfig
from ..core.trees import usable_depth
from ..models.bundle import DRAFTER_NAMES, EAGLE3_FILE, Bundle, pick_device
from .common import (
    add_model_arguments,
    check_device,
    check_model_args,
    check_output,
    load_model,
    sampling_from,
)
from .methods import PRESETS
from .output import format_table, write_csv, write_figures
from .passes import Bench, NotDeterministic, benchmark_conditions, sample_pass, timed_pass, timing_pass
from .study import (
    Records,
    Shard,
    Study,
    check_work,
    gather,
    join,
    merge,
    open_work,
    plan,
    shard_device,
    shard_from_environment,
)
from .summaries import summarise_study

IMAGES = Param("images", 1, 100_000, 20, 1, "images per method", integer=True)
WARMUP = Param("warmup", 0, 100, 2, 1, "untimed images per method", integer=True)
REPEATS = Param("repeats", 1, 100, 1, 1, "timings per image and method", integer=True)
BATCH = Param("batch", 1, 4096, 1, 1, "images decoded together", integer=True)
PROFILE_IMAGES = Param("images", 0, 100_000, 20, 1, "whole images per method (0: parts only)", integer=True)
DEFAULT_METHODS = ["ar", "eagle", "cool:delta=2"]


def run_benchmark(bundle: Bundle, study: Study, sampling: SamplingConfig, records: Records | None = None,
                  shard: Shard | None = None, progress: bool = True, keep_images: bool = False,
                  shared_timing: bool = False) -> dict | None:
    """Measure the study (one pass on one process; under torchrun a sharded untimed pass, then the timing pass
    on rank 0, or on every process with ``shared_timing``: see the module's docstring) and summarise it: the
    result on rank 0, None on the others."""
    shard = shard or Shard()
    rules = [build_rule(c.name, c.params, c.tree.depth, bundle) for c in study.configurations]
    bench = Bench(bundle, study, rules, benchmark_conditions(bundle), sampling, records or Records())
    passes = {}
    if shard.world == 1:
        passes["timing_s"], _ = timed_pass(lambda: timing_pass(bench, progress))
        passes["sample_s"], _ = timed_pass(lambda: sample_pass(bench, study.items(), progress))
    else:
        passes["sample_s"], samples = timed_pass(lambda: gather(sample_pass(bench, shard.share(study.items()), progress),
                                                                shard, everyone=shared_timing, last=not shared_timing))
        if samples is None:
            return None
        for record in merge(samples, study):
            bench.records.add(record, save=False)  # saved by the process that made it
        if shared_timing:  # each process times its share (and checks its tokens against every sample)
            passes["timing_s"], timed = timed_pass(lambda: gather(timing_pass(bench, progress, shard), shard))
            if timed is None:
                return None
            for record in timed:
                bench.records.add(record, save=False)
        else:
            passes["timing_s"], _ = timed_pass(lambda: timing_pass(bench, progress))
    if progress:  # what each pass took (of what it had left to do): not in the result, which a rerun reproduces
        print(f"passes: timing {passes['timing_s']:.1f} s, samples {passes['sample_s']:.1f} s", file=sys.stderr)
    return {**summarise_study(bench, keep_images), "processes": shard.world,
            "timing_processes": shard.world if shared_timing else 1}


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``bench``, before the model loads: the output files, the work folder, the counts, the
    model options and every configuration (each one's rule is built once). Adds ``shard`` (this process under
    torchrun) and ``study`` (the configurations to run, and what a preset offered that the rule refuses)."""
    check_output(args.out, "--out")
    check_output(args.csv, "--csv", (".csv",))
    check_work(args.work)
    args.images = (PROFILE_IMAGES if args.profile else IMAGES).check(args.images)
    if args.latency_images is not None and not args.profile:
        args.latency_images = Param("latency_images", 1, args.images, args.images, 1, "timed images per configuration",
                                    integer=True).check(args.latency_images)
    args.warmup = WARMUP.check(args.warmup)
    args.repeats = REPEATS.check(args.repeats)
    args.batch = BATCH.check(args.batch)
    sizes = args.latency_batch or [args.batch if args.latency_images is None or args.profile else 1]
    args.latency_batches = tuple(dict.fromkeys(BATCH.check(size) for size in sizes))
    timed = args.images if args.latency_images is None else args.latency_images
    if not args.profile and max(args.latency_batches) > timed:
        raise ValueError(f"--latency-batch {max(args.latency_batches)} is more than the {timed} timed images: time "
                         "at least as many images as the largest batch")
    args.shard = shard_from_environment()
    if args.profile and args.shard.world > 1:
        raise ValueError("--profile times the parts of a round in one process; run it without torchrun")
    check_model_args(args, many_images=True)
    args.device = shard_device(args.device, args.shard)
    check_device(args.device)
    methods = args.methods if args.methods is not None else ([] if args.preset else DEFAULT_METHODS)
    configurations, skipped = plan(methods, args.preset, args.draft, usable_depth(args.info.config.image_tokens),
                                   args.info.config.vocab_size, args.drafter)
    args.study = Study(tuple(configurations), args.images, args.seed, args.latency_images, args.repeats, args.warmup,
                       tuple(skipped), args.batch, args.latency_batches)
    return args


def work_arguments(args: argparse.Namespace, bundle: Bundle) -> dict:
    """What the records in a ``--work`` folder depend on, the weights' digests included (a retrained model at the
    same path is another study). Not the outputs, the progress bar, the warm-up, the threads, the number of
    processes or the untimed pass's batch: the samples are the same whatever those are (a timed image whose tokens
    differ from its recorded sample is refused as not deterministic)."""
    return {"model": args.model, "target_sha256": bundle.weights_digest(),
            "drafter_sha256": bundle.weights_digest("drafter.safetensors"),
            **({"eagle3_sha256": bundle.weights_digest(EAGLE3_FILE)} if "eagle3" in bundle.drafters else {}),
            "random_init": args.random_init, "device": pick_device(args.device).type,
            "steps": args.steps, "sampling": args.overrides, "seed": args.seed, "images": args.images,
            "latency_images": args.study.timed_images, "latency_batches": list(args.latency_batches),
            "repeats": args.repeats,
            "configurations": [[c.label, c.draft] for c in args.study.configurations]}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=program("coolsd.bench"), description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=None,
                        help=f"method specs on --draft (default without --preset: {' '.join(DEFAULT_METHODS)})")
    parser.add_argument("--preset", action="append", choices=PRESETS, default=[],
                        help="a named sweep (repeatable, and combinable with --methods; grids in coolsd.cli.methods."
                             "SWEEPS): cool, uniform and lantern run on --draft (add --methods eagle for the "
                             "differences from Eagle-1); paper runs Eagle-1 and all three on chain:5 and tree:eagle25; "
                             "jacobi runs the drafter-free methods (SJD, SCD, Gumbel coupling, GSD, COOL-SD on "
                             "coupled drafts) on jacobi:8 and jacobi:16")
    parser.add_argument("--images", default=str(IMAGES.default), metavar="N",
                        help=f"images per configuration: image i is class i mod C with seed --seed + i; "
                             f"{IMAGES.span()}, default {IMAGES.default} (with --profile: whole images per method "
                             f"after the parts, 0 for the parts only)")
    parser.add_argument("--latency-images", default=None, metavar="M",
                        help="time images 0..M-1 only (default: every image); under torchrun rank 0 times them alone "
                             "after the sharded pass (see --shared-timing)")
    parser.add_argument("--shared-timing", action="store_true",
                        help="under torchrun, every process times its share of the timed images (image i on rank i "
                             "mod N) instead of rank 0 alone: N times sooner, each timing beside another's")
    parser.add_argument("--batch", default=str(BATCH.default), metavar="B",
                        help="images of one configuration decoded together in lockstep rounds in the untimed pass "
                             "(the same tokens as one at a time up to rounding, so the same results, sooner)")
    parser.add_argument("--latency-batch", nargs="+", default=None, metavar="B",
                        help="batch sizes the timed images are decoded in, each timed (interleaved) with images/s, "
                             "call latency and speed-up over AR at the same size; the main table uses the first. "
                             "Default: --batch when every image is timed, else 1 (a separate latency pass, as the "
                             "study's, stays at batch 1 unless asked). With --profile: the batch sizes whose rounds "
                             "are timed")
    parser.add_argument("--warmup", default=str(WARMUP.default),
                        help=f"untimed calls per configuration and batch size before the timed ones; "
                             f"{WARMUP.span()}, default {WARMUP.default}")
    parser.add_argument("--repeats", default=str(REPEATS.default),
                        help="timings per (image, configuration), interleaved across configurations; the median counts")
    parser.add_argument("--work", type=Path, default=None, metavar="DIR",
                        help="folder for the records: each (configuration, image) is appended as soon as it is done, "
                             "and a rerun with the same arguments continues from them")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE", help="JSON file for the results")
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE",
                        help="CSV file: one row per configuration, with its differences from Eagle-1 and their "
                             "intervals")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the figures (PNG): quality minus Eagle-1's against tau with paired "
                             "intervals, speed-up against tau, acceptance per draft position")
    parser.add_argument("--summary", type=Path, default=None, metavar="FILE",
                        help="Markdown file: the noise floor (AR minus Eagle-1), the smallest COOL-SD delta whose "
                             "quality is told apart from Eagle-1's, and the paired comparisons behind the claims")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars and no time per pass on stderr (for logs and scripts)")
    parser.add_argument("--profile", action="store_true",
                        help="time the parts of a round (AR step, verification of chain:5, tree:eagle25, tree:wide57, "
                             "a drafter level, host-side acceptance, image decoding) and the speed-ups they imply")
    parser.add_argument("--compare-steps", action="store_true",
                        help="with --profile: also time the AR step under every other --steps mode this device runs "
                             "(eager, static, graphs on CUDA, compiled)")
    add_model_arguments(parser, several_drafters=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return run_command(lambda: benchmark(argv))
    except NotDeterministic as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def profile_parts(args: argparse.Namespace, bundle: Bundle) -> int:
    """``--profile``: each part of a round timed (``--repeats``, default 20), the speed-ups they imply, and
    ``--images`` whole images per method."""
    from .profile import format_profile, profile
    names = args.drafter or [bundle.drafter_name]
    results = {}
    for name in names:  # each drafter's round (the AR step timed again beside it)
        results[name] = profile(bundle.with_drafter(name), sampling_from(args.overrides, bundle),
                                repeats=args.repeats if args.repeats > 1 else 20, images=args.images, seed=args.seed,
                                compare_steps=args.compare_steps, batches=args.latency_batches)
        if len(names) > 1:
            print(f"## Drafter: {DRAFTER_NAMES[name]}")
        print(format_profile(results[name]))
    if args.out:
        result = results[names[0]] if len(names) == 1 else {"drafters": results}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def report(result: dict, args: argparse.Namespace) -> None:
    """Write the JSON and CSV, and print what a preset skipped, the warnings and the table."""
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.csv:
        write_csv(result, args.csv)
    if args.plots:
        write_figures(result, args.plots)
    if args.summary:
        args.summary.write_text(summary(result))
    for skipped in result["skipped"]:
        print(f"skipped {skipped['label']} on {skipped['draft']}: {skipped['reason']}", file=sys.stderr)
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_table(result))


def say_batch_memory(bundle: Bundle, study: Study, sampling: SamplingConfig) -> None:
    """Before a batched run: what the largest batch holds on the device, on the largest draft (one line on
    stderr); a ValueError when it does not fit."""
    largest = max(study.batch, *study.latency_batches)
    if largest == 1:
        return
    tree = max((c.tree for c in study.configurations), key=lambda tree: tree.size)
    need = check_batch_memory(bundle.target, bundle.drafter, tree, sampling, largest)
    print(f"memory: a batch of {largest} images{f' on {tree.name}' if tree.size else ''} holds about "
          f"{gigabytes(need['total'])} ({gigabytes(need['caches'])} of KV caches) on {bundle.device}; "
          f"{gigabytes(need['available'])} free", file=sys.stderr)


def benchmark(argv: list[str] | None) -> int:
    """Check every option and configuration, open the work folder, load the model, run (on this process's share
    under torchrun), and on rank 0 write the outputs and print the table."""
    args = check_args(build_parser().parse_args(argv))
    shard, study = args.shard, args.study
    bundle = load_model(args)
    open_work(args.work, work_arguments(args, bundle), shard.rank)
    if args.profile:
        return profile_parts(args, bundle)
    say_batch_memory(bundle, study, sampling_from(args.overrides, bundle))
    join(shard, bundle.device)
    if shard.world > 1 and shard.rank == 0 and study.timed_images == study.images and not args.shared_timing:
        print(f"note: rank 0 times all {study.images} images alone after the sharded pass; --latency-images "
              "below --images shortens that pass", file=sys.stderr)
    result = run_benchmark(bundle, study, sampling_from(args.overrides, bundle), Records(args.work, shard.rank),
                           shard, progress=not args.no_progress and shard.rank == 0, shared_timing=args.shared_timing)
    if result is not None:
        report(result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
