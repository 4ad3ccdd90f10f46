"""Benchmark: speed (and, with a judge, quality) of several methods on the same classes and seeds.

    python -m coolsd.bench --methods ar eagle cool:delta=2 uniform:delta=2 \\
        lantern:k=10,lambda=5,residual=gstar --images 20 --out results.json

Batch 1; each method first generates ``--warmup`` untimed images; images are interleaved across methods so
that all of them see the same machine conditions; AR is always measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .bundle import Bundle
from .decode import generate
from .generate import add_model_arguments, load_model, sampling_from
from .methods import method_label, parse_method
from .sampling import SamplingConfig


def run_benchmark(bundle: Bundle, specs: list[str], images: int, draft: str, sampling: SamplingConfig,
                  seed: int = 0, warmup: int = 2, progress: bool = True, keep_images: bool = False) -> dict:
    """Generate ``images`` images per method (image i: class i mod C, seed ``seed + i``) and summarise."""
    methods = [parse_method(s) for s in specs]
    if not any(name == "ar" for name, _ in methods):
        methods.insert(0, ("ar", {}))
    classes = bundle.config.num_classes
    for name, params in methods:  # fail fast on bad parameters, and warm up
        for i in range(warmup):
            generate(bundle, i % classes, name, params, draft, sampling, seed=10**9 + i)
    records = {method_label(n, p): {"gens": []} for n, p in methods}
    bar = tqdm(total=images * len(methods), desc="bench", disable=not progress, file=sys.stderr)
    for i in range(images):
        for name, params in methods:
            result = generate(bundle, i % classes, name, params, draft, sampling, seed=seed + i)
            records[method_label(name, params)]["gens"].append(result)
            bar.update()
    bar.close()
    ar_latency = statistics.median(g.stats.seconds["total"] for g in records["ar"]["gens"])
    runs = [summarise(name, params, records[method_label(name, params)]["gens"], ar_latency, draft, bundle,
                      keep_images) for name, params in methods]
    return {"model": bundle.name, "device": str(bundle.device), "dtype": str(bundle.target.output.weight.dtype),
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "images": images, "draft": draft, "sampling": sampling.to_dict(), "seed": seed, "runs": runs}


def summarise(name: str, params: dict, gens: list, ar_latency: float, draft: str, bundle: Bundle,
              keep_images: bool) -> dict:
    stats = [g.stats for g in gens]
    latency = [s.seconds["total"] for s in stats]
    rounds = sum(s.target_forwards for s in stats)
    phase = {k: sum(s.seconds[k] for s in stats) for k in ("drafting", "target_forward", "acceptance", "other")}
    record = {
        "method": name, "params": params, "label": method_label(name, params),
        "draft": "none" if name == "ar" else draft,
        "tau": float(np.mean([s.tau for s in stats])),
        "target_forwards_per_image": float(np.mean([s.target_forwards for s in stats])),
        "drafter_forwards_per_image": float(np.mean([s.drafter_forwards for s in stats])),
        "latency_median_s": statistics.median(latency), "latency_mean_s": float(np.mean(latency)),
        "speedup_vs_ar": ar_latency / statistics.median(latency),
        "relaxation_cost_mean": float(np.mean([s.relaxation_cost for s in stats])),
        "seconds_per_image": {k: v / len(stats) for k, v in phase.items()},
        # the verification logic (sampling transform + acceptance walk) per round, relative to a target forward
        "acceptance_vs_target_forward": phase["acceptance"] / phase["target_forward"],
        "acceptance_ms_per_round": 1000 * phase["acceptance"] / rounds,
        "target_forward_ms_per_round": 1000 * phase["target_forward"] / rounds,
    }
    if bundle.judge is not None:
        from .judge import judge_metrics
        record.update(judge_metrics(bundle, [bundle.image(g.tokens) for g in gens], [s.class_id for s in stats]))
    if keep_images:
        record["tokens"] = [g.tokens for g in gens]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coolsd.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["ar", "eagle", "cool:delta=2"])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-progress", action="store_true")
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error("--images must be at least 1")
    try:
        bundle = load_model(args)
        result = run_benchmark(bundle, args.methods, args.images, args.draft, sampling_from(args, bundle),
                               args.seed, args.warmup, not args.no_progress)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    columns = ["label", "tau", "target_forwards_per_image", "latency_median_s", "speedup_vs_ar",
               "acceptance_vs_target_forward", "judge_accuracy", "fid"]
    print("  ".join(f"{c[:24]:>24}" for c in columns))
    for run in result["runs"]:
        cells = [run.get(c, "") for c in columns]
        print("  ".join(f"{c:>24.4f}" if isinstance(c, float) else f"{str(c)[:24]:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
