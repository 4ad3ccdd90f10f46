"""Benchmark: speed (and, with a judge, quality) of several methods on the same classes and seeds.

    python -m coolsd.bench --methods ar eagle cool:delta=2 uniform:delta=2 \\
        lantern:k=10,lambda=5,residual=gstar --images 20 --out results.json

Batch 1; each method first generates ``--warmup`` untimed images; images are interleaved across methods so
that all of them see the same machine conditions; AR is always measured in the same run. With ``--repeats R``
each (image, method) pair is generated R times, interleaved across methods, and its latency is the median.
Speed-ups come with their spread: the quartiles of the per-image ratio AR latency / method latency (same
class and seed, measured moments apart).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..core.decode import EMPTY, Generation, generate
from ..core.likelihood import mean_log_likelihood
from ..core.params import Param
from ..core.rules import RULES, AcceptanceRule, build_rule
from ..core.sampling import SamplingConfig
from ..core.stats import bootstrap_interval
from ..core.trees import DraftTree, parse_draft, usable_depth
from ..models.bundle import Bundle
from ..models.registry import EXAMPLE_PROMPTS
from .common import (
    OneLineParser,
    add_model_arguments,
    check_model_args,
    check_output,
    load_model,
    run_command,
    sampling_from,
)
from .methods import check_rule, method_label, parse_method

IMAGES = Param("images", 1, 100_000, 20, 1, "images per method", integer=True)
WARMUP = Param("warmup", 0, 100, 2, 1, "untimed images per method", integer=True)
REPEATS = Param("repeats", 1, 100, 1, 1, "timings per image and method", integer=True)

# Sample sizes below which a quality metric means little (see ``sample_warnings``).
PROFILE_IMAGES = Param("images", 0, 100_000, 20, 1, "whole images per method (0: parts only)", integer=True)
FID_MIN_IMAGES = 200  # the project's measurement: FID moves by about +-1 between two lossless runs of 200 images
CONSISTENCY_MIN_IMAGES = 100  # binomial standard error <= 0.5 / sqrt(100) = 5 percentage points, whatever the rate


class NotDeterministic(RuntimeError):
    """Repeats of one (image, method) gave different tokens, so their timings are not of the same work."""


def sample_warnings(images: int, judge_features: int | None) -> list[str]:
    """Why this many images cannot support the quality metrics (none without a judge).

    FID fits a Gaussian to the judge's ``judge_features``-d features: with no more images than dimensions the
    covariance is singular and the number is meaningless (2 images gave 515 and 597); at 200 images it still
    moves by about +-1 between two runs of the same lossless distribution (README), so fewer cannot rank
    methods. Class consistency is a binomial proportion: its standard error is at most 0.5 / sqrt(n)."""
    if judge_features is None:
        return []
    warnings = []
    if images <= judge_features:
        warnings.append(f"fid on {images} images is meaningless: the covariance of the judge's {judge_features}-d "
                        f"features needs more than {judge_features} images; use --images {FID_MIN_IMAGES} or more")
    elif images < FID_MIN_IMAGES:
        warnings.append(f"fid on {images} images cannot rank methods: even at {FID_MIN_IMAGES} images it moves by "
                        f"about +-1 between two runs of the same distribution; use --images {FID_MIN_IMAGES} or more")
    if images < CONSISTENCY_MIN_IMAGES:
        warnings.append(f"judge_accuracy on {images} images has a standard error of up to "
                        f"{50 / math.sqrt(images):.0f} percentage points (binomial, 0.5/sqrt(n)); use --images "
                        f"{CONSISTENCY_MIN_IMAGES} or more for at most 5")
    return warnings


def quartiles(values: list[float]) -> list[float]:
    """[25th, 75th] percentile (linear interpolation)."""
    return [float(np.percentile(values, 25)), float(np.percentile(values, 75))]


def benchmark_conditions(bundle: Bundle) -> list:
    """Image i's condition: class i mod C, or for a text model the example prompts in turn (encoded once)."""
    if bundle.config.text_conditioned:
        if bundle.text_encoder is None:
            raise ValueError("this text-to-image model has no text encoder (model.json names no t5)")
        return bundle.text_encoder(list(EXAMPLE_PROMPTS))
    return list(range(bundle.config.num_classes))


def time_image(bundle: Bundle, methods: list[tuple[str, dict]], rules: list[AcceptanceRule], condition,
               seed: int, draft: DraftTree, sampling: SamplingConfig, repeats: int) -> list[tuple[Generation, float]]:
    """One (class, seed) for every method, ``repeats`` times, interleaved across methods so that a change in
    machine load hits all of them alike. Per method: the generation of median latency (median-low for an even
    ``repeats``; its phase timings go in the summary) and the median latency. Decoding is deterministic for a
    given seed, so every repeat must give the same tokens; if not, the repeats would time different work."""
    gens: list[list[Generation]] = [[] for _ in methods]
    for _ in range(repeats):
        for runs, rule in zip(gens, rules):
            runs.append(generate(bundle, condition, rule, draft, sampling, seed=seed))
    out = []
    for runs, (name, params) in zip(gens, methods):
        if any(g.tokens != runs[0].tokens for g in runs):
            raise NotDeterministic(f"{method_label(name, params)} gave different tokens for {condition!r}, seed "
                               f"{seed} across repeats: decoding is not deterministic, repeated timings are invalid")
        by_time = sorted(runs, key=lambda g: g.stats.seconds["total"])
        out.append((by_time[(len(by_time) - 1) // 2], statistics.median(g.stats.seconds["total"] for g in runs)))
    return out


def run_benchmark(bundle: Bundle, specs: list[str], images: int, draft: "str | DraftTree", sampling: SamplingConfig,
                  seed: int = 0, warmup: int = 2, progress: bool = True, keep_images: bool = False,
                  repeats: int = 1) -> dict:
    """Generate ``images`` images per method (image i: class i mod C, seed ``seed + i``) and summarise."""
    methods = [parse_method(s) for s in specs]
    if not any(name == "ar" for name, _ in methods):
        methods.insert(0, ("ar", {}))
    tree = parse_draft(draft, usable_depth(bundle.config.image_tokens))
    conditions = benchmark_conditions(bundle)
    rules = [build_rule(name, params, tree.depth, bundle.neighbours) for name, params in methods]  # once per method
    for rule in rules:  # warm up
        for i in range(warmup):
            generate(bundle, conditions[i % len(conditions)], rule, tree, sampling, seed=10**9 + i)
    gens: list[list[Generation]] = [[] for _ in methods]
    latency: list[list[float]] = [[] for _ in methods]
    bar = tqdm(total=images * len(methods) * repeats, desc="bench", disable=not progress, file=sys.stderr)
    for i in range(images):
        timed = time_image(bundle, methods, rules, conditions[i % len(conditions)], seed + i, tree, sampling, repeats)
        for m, (generation, seconds) in enumerate(timed):
            gens[m].append(generation)
            latency[m].append(seconds)
        bar.update(len(methods) * repeats)
    bar.close()
    ar_latency = latency[[name for name, _ in methods].index("ar")]
    loglik = [[mean_log_likelihood(bundle.target, conditions[i % len(conditions)], g.tokens, sampling)
               for i, g in enumerate(runs)] for runs in gens]  # the target's nats per token, image by image
    runs = [summarise(name, params, gens[m], latency[m], ar_latency, tree.name, bundle, keep_images, loglik[m])
            for m, (name, params) in enumerate(methods)]
    names = [name for name, _ in methods]
    if "eagle" in names:
        eagle = names.index("eagle")
        for m, run in enumerate(runs):
            run["vs_eagle"] = paired_differences(gens[m], gens[eagle], latency[m], latency[eagle], ar_latency,
                                                 loglik[m], loglik[eagle], seed)
    judge_features = getattr(bundle.quality, "num_features", None)
    return {"model": bundle.name, "device": str(bundle.device), "dtype": str(next(bundle.target.parameters()).dtype),
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "images": images, "repeats": repeats, "draft": tree.name, "sampling": sampling.to_dict(), "seed": seed,
            "warnings": sample_warnings(images, judge_features), "runs": runs}


def paired_differences(gens: list[Generation], eagle: list[Generation], latency: list[float],
                       eagle_latency: list[float], ar_latency: list[float], loglik: list[float],
                       eagle_loglik: list[float], seed: int) -> dict:
    """This method minus Eagle-1 on the same images (same classes and seeds), with paired 95% bootstrap
    intervals: tau, speed-up over AR (ratio of medians) and the target's log-likelihood per token."""
    tau, eagle_tau = np.array([g.stats.tau for g in gens]), np.array([g.stats.tau for g in eagle])
    lat, eagle_lat, ar = np.array(latency), np.array(eagle_latency), np.array(ar_latency)
    ll, eagle_ll = np.array(loglik), np.array(eagle_loglik)
    return {
        "tau": bootstrap_interval(len(tau), lambda i: tau[i].mean() - eagle_tau[i].mean(), seed=seed),
        "speedup_vs_ar": bootstrap_interval(len(lat), lambda i: np.median(ar[i]) / np.median(lat[i])
                                            - np.median(ar[i]) / np.median(eagle_lat[i]), seed=seed),
        "log_likelihood_per_token": bootstrap_interval(len(ll), lambda i: ll[i].mean() - eagle_ll[i].mean(),
                                                       seed=seed),
    }


def summarise(name: str, params: dict, gens: list[Generation], latency: list[float], ar_latency: list[float],
              draft: str, bundle: Bundle, keep_images: bool, loglik: list[float]) -> dict:
    """One method's record. ``latency[i]``, ``ar_latency[i]`` and ``loglik[i]`` are image i's (median)
    latencies and the target's log-likelihood per token of its tokens."""
    stats = [g.stats for g in gens]
    rounds = sum(s.target_forwards for s in stats)
    phase = {k: sum(s.seconds[k] for s in stats) for k in ("drafting", "target_forward", "acceptance", "other")}
    record = {
        "method": name, "params": params, "label": method_label(name, params),
        "draft": draft if RULES[name].drafts else "none",
        "tau": float(np.mean([s.tau for s in stats])),
        "target_forwards_per_image": float(np.mean([s.target_forwards for s in stats])),
        "drafter_forwards_per_image": float(np.mean([s.drafter_forwards for s in stats])),
        "latency_median_s": statistics.median(latency), "latency_mean_s": float(np.mean(latency)),
        "latency_iqr_s": quartiles(latency),
        "speedup_vs_ar": statistics.median(ar_latency) / statistics.median(latency),
        # the spread of the paired per-image ratios (same class and seed, measured moments apart)
        "speedup_vs_ar_iqr": quartiles([a / m for a, m in zip(ar_latency, latency)]),
        "relaxation_cost_mean": float(np.mean([s.relaxation_cost for s in stats])),
        # the target's own log-likelihood of the images, nats per token (coolsd.core.likelihood): lossless
        # methods estimate the target's negative entropy rate; relaxation moves it
        "log_likelihood_per_token": float(np.mean(loglik)),
        "seconds_per_image": {k: v / len(stats) for k, v in phase.items()},
        # the verification logic (sampling transform + acceptance walk) per round, relative to a target forward
        "acceptance_vs_target_forward": phase["acceptance"] / phase["target_forward"],
        "acceptance_ms_per_round": 1000 * phase["acceptance"] / rounds,
        "target_forward_ms_per_round": 1000 * phase["target_forward"] / rounds,
    }
    if bundle.quality is not None:
        record.update(bundle.quality([bundle.image(g.tokens) for g in gens], [s.class_id for s in stats]))
    if keep_images:
        record["tokens"] = [g.tokens for g in gens]
    return record


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every option of ``bench``, before the model loads: the output file, the counts, the model options and
    every method spec (each one's rule is built once); ``methods`` becomes the list of specs to run."""
    check_output(args.out, "--out")
    args.images = (PROFILE_IMAGES if args.profile else IMAGES).check(args.images)
    args.warmup = WARMUP.check(args.warmup)
    args.repeats = REPEATS.check(args.repeats)
    check_model_args(args)
    labels = []
    for spec in args.methods:
        name, params = parse_method(spec)
        check_rule(name, params, (args.tree if RULES[name].drafts else EMPTY).depth, args.info.config.vocab_size)
        if method_label(name, params) in labels:
            raise ValueError(f"method {method_label(name, params)} is listed twice")
        labels.append(method_label(name, params))
    return args


def format_table(result: dict) -> str:
    """A header line (model, device, threads, sample sizes) and one row per method."""
    threads = result["threads"]
    lines = [f"{result['model']} on {result['device']} ({result['dtype']}), {threads} torch thread"
             f"{'s' if threads != 1 else ''}, {result['images']} images x {len(result['runs'])} methods, "
             f"{result['repeats']} timing(s) each, draft {result['draft']}"]
    header = ["label", "tau", "fwd/img", "latency ms", "latency IQR ms", "speed-up", "speed-up IQR",
              "accept/fwd", "loglik/token", "judge acc", "fid"]
    rows = [header]
    for run in result["runs"]:
        low, high = run["latency_iqr_s"]
        speed_low, speed_high = run["speedup_vs_ar_iqr"]
        rows.append([run["label"][:40], f"{run['tau']:.3f}", f"{run['target_forwards_per_image']:.1f}",
                     f"{1000 * run['latency_median_s']:.1f}", f"{1000 * low:.1f}-{1000 * high:.1f}",
                     f"{run['speedup_vs_ar']:.2f}x", f"{speed_low:.2f}-{speed_high:.2f}x",
                     f"{run['acceptance_vs_target_forward']:.3f}", f"{run['log_likelihood_per_token']:.4f}",
                     f"{run['judge_accuracy']:.3f}" if "judge_accuracy" in run else "",
                     f"{run['fid']:.2f}" if "fid" in run else ""])
    shown = [c for c in range(len(header)) if any(row[c] for row in rows[1:])]  # no judge: no quality columns
    widths = {c: max(len(row[c]) for row in rows) for c in shown}
    lines += ["  ".join(row[c].rjust(widths[c]) for c in shown) for row in rows]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m coolsd.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["ar", "eagle", "cool:delta=2"])
    parser.add_argument("--images", default=str(IMAGES.default))
    parser.add_argument("--warmup", default=str(WARMUP.default))
    parser.add_argument("--repeats", default=str(REPEATS.default),
                        help="timings per (image, method), interleaved across methods; the median counts")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="time the parts of a round (AR step, verification of chain:5, tree:eagle25, tree:wide57, "
                             "a drafter level, host-side acceptance, image decoding) and the speed-ups they imply")
    parser.add_argument("--compare-steps", action="store_true",
                        help="with --profile: also time the AR step under every other --steps mode this device runs "
                             "(eager, static, graphs on CUDA, compiled)")
    add_model_arguments(parser)
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
    result = profile(bundle, sampling_from(args.overrides, bundle), repeats=args.repeats if args.repeats > 1 else 20,
                     images=args.images, seed=args.seed, compare_steps=args.compare_steps)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(format_profile(result))
    return 0


def benchmark(argv: list[str] | None) -> int:
    """Check every option and method spec, load the model, run, write the JSON, print warnings and the table."""
    args = check_args(build_parser().parse_args(argv))
    bundle = load_model(args)
    if args.profile:
        return profile_parts(args, bundle)
    result = run_benchmark(bundle, args.methods, args.images, args.tree, sampling_from(args.overrides, bundle),
                           args.seed, args.warmup, not args.no_progress, repeats=args.repeats)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
