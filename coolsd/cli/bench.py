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
measured in the same run. Speed-ups come with their spread (the quartiles of the per-image ratio AR latency /
method latency) and every difference from Eagle-1 (on the same draft) with a paired 95% bootstrap interval over
images.

Batches (spec section 9): ``--batch B`` decodes B images of a configuration together in the untimed pass (the
same tokens as one at a time, up to rounding: see :func:`keep_samples`); ``--latency-batch`` the batch sizes the timed images are decoded in, each with
its images per second and speed-up over AR at the same size (a call's latency is each of its images' latency).

One process makes one pass: a timed image's median-latency generation is also its sample (decoding is
deterministic for a seed, so an untimed generation would give the same record), the other images are
generated once. Under torchrun the (configuration, image) items are split over the processes and generated
untimed; rank 0 gathers the samples, the others exit, and rank 0 then times images 0..M-1 alone, so that no
timing shares the machine with another process's work. With M left at every image that pass costs as much as
a one-process run: give a smaller ``--latency-images`` to gain from the processes, or ``--shared-timing``: every
process then times its share of the images (image i on rank i mod N, each configuration against AR moments apart
on the same process), which divides the pass by N at the price of timing next to the others' timing. With ``--work DIR`` every
record is appended to DIR as soon as it is done, and a rerun with the same arguments continues from there.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..core.decode import Generation, check_batch_memory, generate_batch
from ..core.likelihood import images_log_likelihoods
from ..core.memory import gigabytes
from ..core.params import OneLineParser, Param, run_command
from ..core.rules import AcceptanceRule, build_rule, rule_spec
from ..core.sampling import SamplingConfig
from ..core.stats import bootstrap_interval
from ..core.trees import usable_depth
from ..models.bundle import Bundle, pick_device
from ..models.registry import EXAMPLE_PROMPTS
from ..models.steps import unwrapped
from ..app.claims import summary
from .common import (
    add_model_arguments,
    check_device,
    check_model_args,
    check_output,
    load_model,
    sampling_from,
)
from .methods import PRESETS
from .study import (
    Configuration,
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

IMAGES = Param("images", 1, 100_000, 20, 1, "images per method", integer=True)
WARMUP = Param("warmup", 0, 100, 2, 1, "untimed images per method", integer=True)
REPEATS = Param("repeats", 1, 100, 1, 1, "timings per image and method", integer=True)
BATCH = Param("batch", 1, 4096, 1, 1, "images decoded together", integer=True)

# Sample sizes below which a quality metric means little (see ``sample_warnings``).
PROFILE_IMAGES = Param("images", 0, 100_000, 20, 1, "whole images per method (0: parts only)", integer=True)
FID_MIN_IMAGES = 200  # the project's measurement: FID moves by about +-1 between two lossless runs of 200 images
CONSISTENCY_MIN_IMAGES = 100  # binomial standard error <= 0.5 / sqrt(100) = 5 percentage points, whatever the rate
# FID's bootstrap computes two FIDs per resample (about 1.4 ms each at 1,000 images x 128 features on one busy
# CPU core): 1,000 resamples cost about 3 s per configuration; the other statistics take the default 2,000.
FID_RESAMPLES = 1000
DEFAULT_METHODS = ["ar", "eagle", "cool:delta=2"]
PHASES = ("drafting", "target_forward", "acceptance", "other")


class NotDeterministic(RuntimeError):
    """Repeats of one (image, method) gave different tokens, so their timings are not of the same work."""


def sample_warnings(images: int, judge_features: int | None) -> list[str]:
    """Why this many images cannot support the quality metrics (none without a judge).

    FID fits a Gaussian to the judge's ``judge_features``-d features: with no more images than dimensions the
    covariance is singular and the number is meaningless (2 images gave 515 and 597); at 200 images it still
    moves by about +-1 between two runs of the same lossless distribution (docs/cli.md), so fewer cannot rank
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


@dataclass
class Bench:
    """What every pass needs: the model, the study, each configuration's rule (built once), the conditions,
    the sampling transform and the finished records."""

    bundle: Bundle
    study: Study
    rules: list[AcceptanceRule]
    conditions: list
    sampling: SamplingConfig
    records: Records

    def condition(self, image: int):
        return self.conditions[image % len(self.conditions)]


def chunks(count: int, size: int) -> list[range]:
    """Images 0..count-1 in consecutive batches of ``size`` (the last one shorter where ``size`` does not divide
    ``count``)."""
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def time_batch(bench: Bench, configurations: list[Configuration], rules: list[AcceptanceRule], images: range,
               repeats: int) -> list[tuple[list[Generation], float]]:
    """One batch of images (their conditions and seeds) for every configuration, ``repeats`` times, interleaved
    across configurations so that a change in machine load hits all of them alike. Per configuration: the
    generations of the call of median latency (median-low for an even ``repeats``; its phase timings go in the
    summary) and every repeat's call latency, in order. Decoding is deterministic for given seeds, so every
    repeat must give the same tokens; if not, the repeats would time different work."""
    conditions, seeds = [bench.condition(i) for i in images], [bench.study.seed + i for i in images]
    calls: list[list[list[Generation]]] = [[] for _ in configurations]
    for _ in range(repeats):
        for runs, rule, configuration in zip(calls, rules, configurations):
            runs.append(generate_batch(bench.bundle, conditions, rule, configuration.tree, bench.sampling, seeds))
    out = []
    for runs, configuration in zip(calls, configurations):
        if any([g.tokens for g in run] != [g.tokens for g in runs[0]] for run in runs):
            raise NotDeterministic(f"{configuration.label} gave different tokens for images {images.start}.."
                                   f"{images.stop - 1} across repeats: decoding is not deterministic, repeated "
                                   "timings are invalid")
        by_time = sorted(runs, key=lambda run: run[0].stats.seconds["total"])
        out.append((by_time[(len(by_time) - 1) // 2], [run[0].stats.seconds["total"] for run in runs]))
    return out


def sample_records(bench: Bench, configuration: Configuration, images: list[int],
                   generations: list[Generation]) -> list[dict]:
    """What (configuration, image) pairs give on any machine: tokens, tau, forwards, relaxation cost, the
    target's log-likelihood per token (one teacher-forced forward for all the images: the same numbers as one at
    a time) and, when the bundle's quality judges single images (``per_image``), the judge's features and
    verdict. JSON values only, so a record read back or received from another process is equal."""
    # the plain model: the teacher-forced forward needs no step wrapper (static caches, CUDA graphs)
    likelihoods = images_log_likelihoods(unwrapped(bench.bundle.target), [bench.condition(i) for i in images],
                                         [g.tokens for g in generations], bench.sampling).mean(-1)
    records = []
    for image, generation, likelihood in zip(images, generations, likelihoods):
        stats = generation.stats
        reached, accept_sum = stats.level_totals()
        records.append({"kind": "sample", "configuration": configuration.label, "image": image, "seed": stats.seed,
                        "class_id": stats.class_id, "tokens": [int(t) for t in generation.tokens], "tau": stats.tau,
                        "target_forwards": stats.target_forwards, "drafter_forwards": stats.drafter_forwards,
                        "relaxation_cost": stats.relaxation_cost,
                        # per draft depth: rounds that reached it and their summed acceptance probabilities
                        "reached_per_depth": reached.astype(int).tolist(),
                        "accept_prob_sum_per_depth": accept_sum.tolist(),
                        "log_likelihood_per_token": float(likelihood)})
    per_image = getattr(bench.bundle.quality, "per_image", None)
    for record, generation in zip(records, generations) if per_image is not None else ():
        # one image per call: the judge's convolutions over several differ in the last bits (3e-6), and a
        # sample's features must not depend on its batch (a call costs under a millisecond)
        judged = per_image([bench.bundle.image(generation.tokens)], [generation.stats.class_id])
        # float32's shortest decimals: a third of a double's digits, and they read back to the same float32
        record["judge_features"] = [float(str(value)) for value in judged["features"][0]]
        record["judge_correct"] = bool(judged["correct"][0])
    return records


def timing_record(configuration: Configuration, image: int, generation: Generation, seconds: list[float],
                  batch: int, same_tokens: bool = True) -> dict:
    """A timed image: the median latency of the call that decoded it (with ``batch`` - 1 others: each waits for
    the whole call) and every repeat's, and the phases of that call and the image's own rounds, from the call of
    median latency; ``same_tokens`` False when its tokens are not its sample's (made at another batch size)."""
    return {"kind": "timing", "configuration": configuration.label, "image": image, "batch": batch,
            "latency_s": statistics.median(seconds), "repeats_s": seconds,
            "seconds": {phase: generation.stats.seconds[phase] for phase in PHASES},
            "target_forwards": generation.stats.target_forwards, "same_tokens": same_tokens}


def keep_samples(bench: Bench, configuration: Configuration, images: range, generations: list[Generation],
                 size: int) -> list[bool]:
    """Timed generations are their images' samples where there are none yet, and must repeat those there are;
    returns, per image, whether it did. A sample made at another batch size (``--batch``) may differ: a batched
    matrix product rounds differently from a single one, and a near-tie in an acceptance test can then flip; such
    an image's timing is kept (same configuration and seed) and the result counts them. At the same batch size a
    difference is an error (another device, torch or thread count)."""
    stored = [bench.records.get("sample", configuration.label, image) for image in images]
    same = [record is None or record["tokens"] == generation.tokens for generation, record in zip(generations, stored)]
    if not all(same) and size == bench.study.batch:
        image = images[same.index(False)]
        raise NotDeterministic(f"{configuration.label} gave other tokens for image {image} than its recorded "
                               "sample (another device, torch or thread count?): its timing would not be of the "
                               "same work")
    new = [(image, generation) for image, generation, record in zip(images, generations, stored) if record is None]
    if new:
        for record in sample_records(bench, configuration, [i for i, _ in new], [g for _, g in new]):
            bench.records.add(record)
    return same


def progress_bar(total: int, desc: str, progress: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="item", disable=not progress or not total, file=sys.stderr)


def timing_jobs(study: Study) -> list[tuple[int, range]]:
    """The timed images as (batch size, images) calls for every latency batch size, ordered so that each size's
    calls spread evenly over the pass (by the share of its calls done), so that machine drift hits every size
    alike."""
    jobs = [(size, images, (index + 0.5) / len(calls)) for size in study.latency_batches
            for calls in [chunks(study.timed_images, size)] for index, images in enumerate(calls)]
    return [(size, images) for size, images, _ in sorted(jobs, key=lambda job: (job[2], job[0]))]


def timing_pass(bench: Bench, progress: bool, shard: Shard | None = None) -> list[dict]:
    """Time images 0..M-1 (``shard``: this process's share of the calls) of each configuration not timed yet,
    at every latency batch size: warm-up calls first, then call by call across configurations
    (:func:`time_batch`); each image's record is kept as soon as its call is done, and a timed image's tokens
    must be its sample's (whatever the batch: spec section 9). Returns the share's timing records."""
    study, configurations = bench.study, bench.study.configurations
    jobs = (shard or Shard()).share(timing_jobs(study))
    todo = [(size, images, [k for k, c in enumerate(configurations)
                            if any(bench.records.get("timing", c.label, i, size) is None for i in images)])
            for size, images in jobs]
    todo = [(size, images, pending) for size, images, pending in todo if pending]
    for size in dict.fromkeys(size for size, _, _ in todo):
        for k in sorted({k for batch, _, pending in todo if batch == size for k in pending}):
            for call in range(study.warmup):
                warm = range(call * size, (call + 1) * size)
                generate_batch(bench.bundle, [bench.condition(i) for i in warm], bench.rules[k],
                               configurations[k].tree, bench.sampling, [10**9 + i for i in warm])
    bar = progress_bar(sum(len(images) * len(pending) for _, images, pending in todo), "time", progress)
    for size, images, pending in todo:
        timed = time_batch(bench, [configurations[k] for k in pending], [bench.rules[k] for k in pending], images,
                           study.repeats)
        for k, (generations, seconds) in zip(pending, timed):  # seconds: every repeat's
            same = keep_samples(bench, configurations[k], images, generations, size)
            for image, generation, kept in zip(images, generations, same):
                bench.records.add(timing_record(configurations[k], image, generation, seconds, size, kept))
        bar.update(len(images) * len(pending))
    bar.close()
    return [bench.records.get("timing", c.label, i, size) for size, images in jobs for c in configurations
            for i in images]


def sample_pass(bench: Bench, items: list[tuple[int, int]], progress: bool) -> list[dict]:
    """Generate each (configuration, image) once, untimed, unless its sample is recorded, in calls of up to
    ``study.batch`` images of one configuration; the items' samples."""
    configurations, batch = bench.study.configurations, bench.study.batch
    todo = [(k, image) for k, image in items if bench.records.get("sample", configurations[k].label, image) is None]
    by_configuration: dict[int, list[int]] = {}
    for k, image in todo:
        by_configuration.setdefault(k, []).append(image)
    bar = progress_bar(len(todo), "generate", progress)
    for k, images in by_configuration.items():
        for start in range(0, len(images), batch):
            call = images[start:start + batch]
            generations = generate_batch(bench.bundle, [bench.condition(i) for i in call], bench.rules[k],
                                         configurations[k].tree, bench.sampling, [bench.study.seed + i for i in call])
            for record in sample_records(bench, configurations[k], call, generations):
                bench.records.add(record)
            bar.update(len(call))
    bar.close()
    return [bench.records.get("sample", configurations[k].label, image) for k, image in items]


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


def timed_pass(work):
    """(wall seconds, result) of a pass (of what it had left to do: a resumed pass skips its recorded items)."""
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result


def column(records: list[dict], key: str) -> np.ndarray:
    return np.array([record[key] for record in records])


def judge_features(samples: list[dict]) -> np.ndarray:
    return np.array([sample["judge_features"] for sample in samples], dtype=np.float32)


def eagle_baseline(configurations: tuple[Configuration, ...], k: int) -> int | None:
    """Eagle-1 on configuration k's draft, else the first Eagle-1 (for AR, or a draft without one)."""
    eagles = [e for e, c in enumerate(configurations) if c.name == "eagle"]
    same_draft = [e for e in eagles if configurations[e].draft == configurations[k].draft]
    return (same_draft or eagles or [None])[0]


def summarise_study(bench: Bench, keep_images: bool) -> dict:
    """Every configuration's record from its samples (all images) and timings (images 0..M-1), and its
    differences from Eagle-1 on the same images."""
    study, bundle = bench.study, bench.bundle
    configurations = study.configurations
    samples = [[bench.records.get("sample", c.label, i) for i in range(study.images)] for c in configurations]
    main_batch = study.latency_batches[0]  # the speed columns are at the first latency batch size
    timings = [[bench.records.get("timing", c.label, i, main_batch) for i in range(study.timed_images)]
               for c in configurations]
    ar = next(k for k, c in enumerate(configurations) if c.name == "ar")
    runs = [summarise(c, bench.rules[k], samples[k], timings[k], timings[ar], bundle, keep_images)
            for k, c in enumerate(configurations)]
    for k, run in enumerate(runs):
        eagle = eagle_baseline(configurations, k)
        if eagle is not None:
            run["vs_eagle"] = paired_differences(samples[k], samples[eagle], timings[k], timings[eagle], timings[ar],
                                                 bundle.quality, study.seed)
            run["eagle_baseline"] = configurations[eagle].label
        if configurations[k].tree.source == "jacobi":  # a drafter-free method: also against AR, its own reference
            run["vs_ar"] = paired_differences(samples[k], samples[ar], timings[k], timings[ar], timings[ar],
                                              bundle.quality, study.seed)
    comparisons = [{"a": configurations[a].label, "b": configurations[b].label, "draft": configurations[a].draft,
                    "b_draft": configurations[b].draft, "differs_in": aspect,
                    "a_minus_b": {**paired_differences(samples[a], samples[b], timings[a], timings[b], timings[ar],
                                                       bundle.quality, study.seed),
                                  "log_likelihood_gap": log_likelihood_gap(samples[a], samples[b],
                                                                           samples[eagle_baseline(configurations, a)],
                                                                           study.seed)}}
                   for a, b, aspect in paired_configurations(configurations)]
    judge_size = getattr(bundle.quality, "num_features", None)
    return {"model": bundle.name, "model_shape": bundle.config.to_dict(), "target_sha256": bundle.weights_digest(),
            "device": str(bundle.device), "dtype": str(next(bundle.target.parameters()).dtype),
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "images": study.images, "latency_images": study.timed_images, "repeats": study.repeats,
            "batch": study.batch, "latency_batch": main_batch, "batches": batch_table(bench),
            "draft": ", ".join(study.drafts) or "none", "drafts": study.drafts,
            "sampling": bench.sampling.to_dict(), "seed": study.seed,
            "warnings": sample_warnings(study.images, judge_size) + batch_warnings(timings, study),
            "skipped": list(study.skipped), "runs": runs,
            "comparisons": comparisons}


def batch_warnings(timings: list[list[dict]], study: Study) -> list[str]:
    """How many timed generations gave other tokens than their samples (made at ``--batch``), and where."""
    differ = [(t["configuration"], t["image"]) for per_configuration in timings for t in per_configuration
              if not t.get("same_tokens", True)]
    if not differ:
        return []
    labels = list(dict.fromkeys(label for label, _ in differ))
    return [f"{len(differ)} of {sum(map(len, timings))} timed generations (batch {study.latency_batches[0]}) gave "
            f"other tokens than their samples (batch {study.batch}): rounding differs between batch sizes and a "
            f"near-tie in an acceptance test flipped; their latency counts, their samples give the quality "
            f"({len(labels)} configuration(s), first {labels[0]})"]


def batch_table(bench: Bench) -> list[dict]:
    """Speed at every latency batch size, from the timed images' records: per configuration, images per second
    (timed images / the seconds of their calls), the latency of a call (each of its images waits for all of it),
    the speed-up over AR at the same batch size (AR's seconds / the configuration's, over the same calls; its
    spread: the quartiles of the ratios of the same call's same repeat, which ran moments apart), and the
    lockstep cost: the rounds a call ran (its slowest image's) over its images' mean own rounds."""
    study, configurations = bench.study, bench.study.configurations
    ar = next(k for k, c in enumerate(configurations) if c.name == "ar")
    rows = []
    for size in study.latency_batches:
        calls = chunks(study.timed_images, size)
        timings = [[[bench.records.get("timing", c.label, i, size) for i in images] for images in calls]
                   for c in configurations]
        call_seconds = [[call[0]["latency_s"] for call in per_call] for per_call in timings]
        repeat_seconds = [[call[0].get("repeats_s", [call[0]["latency_s"]]) for call in per_call]
                          for per_call in timings]
        for k, configuration in enumerate(configurations):
            rounds = [[record["target_forwards"] for record in call] for call in timings[k]]
            ratios = [a / m for ar_call, call in zip(repeat_seconds[ar], repeat_seconds[k])
                      for a, m in zip(ar_call, call)]
            rows.append({"batch": size, "label": configuration.label, "calls": len(calls),
                         "images_per_s": study.timed_images / sum(call_seconds[k]),
                         "call_latency_median_s": statistics.median(call_seconds[k]),
                         "speedup_vs_ar": sum(call_seconds[ar]) / sum(call_seconds[k]),
                         "speedup_vs_ar_iqr": quartiles(ratios),
                         "lockstep_rounds_over_own": float(np.mean([max(r) / np.mean(r) for r in rounds]))})
    return rows


# The paper's claims compare configurations that differ in one respect, on the same draft and images
COMPARED_PARAMETERS = ("residual", "schedule")  # G* against the heuristic residual; exponential against linear


def paired_configurations(configurations: tuple[Configuration, ...]) -> list[tuple[int, int, str]]:
    """(a, b, aspect) for the configurations on one draft that differ in one respect: the same method whose
    parameters differ only in one of COMPARED_PARAMETERS (a = the first value of the pair seen), and COOL-SD
    (annealed) against UniformRSD at the same total relaxation ``delta``; then the pairs across drafts
    (:func:`draft_pairs`)."""
    pairs = []
    for a, first in enumerate(configurations):
        for b, second in enumerate(configurations):
            if a == b or first.draft != second.draft:
                continue
            if first.name == second.name and a < b and first.params.keys() == second.params.keys():
                differing = [key for key in first.params if first.params[key] != second.params[key]]
                if len(differing) == 1 and differing[0] in COMPARED_PARAMETERS:
                    pairs.append((a, b, differing[0]))
            elif (first.name, second.name) == ("cool", "uniform") and \
                    first.params.get("delta") == second.params.get("delta"):
                pairs.append((a, b, "annealing"))
    return pairs + draft_pairs(configurations)


def draft_pairs(configurations: tuple[Configuration, ...]) -> list[tuple[int, int, str]]:
    """(a, b, aspect) for the same method and parameters on two drafts: ``refresh``, Eagle-1 on a Jacobi window
    refreshed by a coupling (maximal or Gumbel) against the same window refreshed independently (SCD against
    SJD); ``lossless_source``, Eagle-1 on a Jacobi window against Eagle-1 on each draft model's draft;
    ``relaxed_source``, COOL-SD on a coupled Jacobi window against the same COOL-SD setting (defaults filled in)
    on each draft model's draft."""
    def setting(configuration: Configuration) -> dict:
        return {**rule_spec(configuration.name).defaults(), **configuration.params}

    pairs = []
    for a, first in enumerate(configurations):
        if first.tree.source != "jacobi":
            continue
        for b, second in enumerate(configurations):
            if a == b or first.name != second.name or setting(first) != setting(second):
                continue
            if second.tree.source == "jacobi":
                if (first.name == "eagle" and (first.tree.depth, first.tree.fresh) == (second.tree.depth,
                                                                                      second.tree.fresh)
                        and first.tree.refresh != "independent" and second.tree.refresh == "independent"):
                    pairs.append((a, b, "refresh"))
            elif second.tree.size and first.name == "eagle":
                pairs.append((a, b, "lossless_source"))
            elif second.tree.size and first.name == "cool" and first.tree.refresh == "coupled":
                pairs.append((a, b, "relaxed_source"))
    return pairs


def paired_differences(samples: list[dict], eagle: list[dict], timings: list[dict], eagle_timings: list[dict],
                       ar_timings: list[dict], quality, seed: int) -> dict:
    """This configuration minus Eagle-1 on the same images (same classes and seeds), with paired 95% bootstrap
    intervals: tau, speed-up over AR (ratio of medians, on the timed images), the target's log-likelihood per
    token and, with per-image judge outputs, class consistency and FID."""
    tau, eagle_tau = column(samples, "tau"), column(eagle, "tau")
    lat, eagle_lat, ar = (column(t, "latency_s") for t in (timings, eagle_timings, ar_timings))
    ll, eagle_ll = column(samples, "log_likelihood_per_token"), column(eagle, "log_likelihood_per_token")
    out = {
        "tau": bootstrap_interval(len(tau), lambda i: tau[i].mean() - eagle_tau[i].mean(), seed=seed),
        "speedup_vs_ar": bootstrap_interval(len(lat), lambda i: np.median(ar[i]) / np.median(lat[i])
                                            - np.median(ar[i]) / np.median(eagle_lat[i]), seed=seed),
        "log_likelihood_per_token": bootstrap_interval(len(ll), lambda i: ll[i].mean() - eagle_ll[i].mean(),
                                                       seed=seed),
    }
    if "judge_correct" in samples[0] and "judge_correct" in eagle[0]:
        out.update(judge_differences(samples, eagle, quality, seed))
    return out


def log_likelihood_gap(a: list[dict], b: list[dict], eagle: list[dict], seed: int) -> dict:
    """How much farther a's mean log-likelihood per token lies from Eagle-1's than b's, either side, with a
    paired interval. A lossless method has Eagle-1's value; a relaxed one can move it down (less likely tokens)
    or up (mode seeking), and both are departures from the target, so the signed difference cannot rank a and b."""
    a_ll, b_ll, eagle_ll = (column(s, "log_likelihood_per_token") for s in (a, b, eagle))
    return bootstrap_interval(len(a_ll), lambda i: abs(a_ll[i].mean() - eagle_ll[i].mean())
                              - abs(b_ll[i].mean() - eagle_ll[i].mean()), seed=seed)


def judge_differences(samples: list[dict], eagle: list[dict], quality, seed: int) -> dict:
    """Class consistency and FID minus Eagle-1's, each resample drawing the same image indices for both."""
    correct, eagle_correct = (column(s, "judge_correct").astype(float) for s in (samples, eagle))
    out = {"judge_accuracy": bootstrap_interval(len(correct), lambda i: correct[i].mean() - eagle_correct[i].mean(),
                                                seed=seed)}
    if len(samples) >= 2:
        features, eagle_features = judge_features(samples), judge_features(eagle)
        out["fid"] = bootstrap_interval(len(features), lambda i: quality.fid(features[i])
                                        - quality.fid(eagle_features[i]), resamples=FID_RESAMPLES, seed=seed)
    return out


def quality_summary(samples: list[dict], bundle: Bundle) -> dict:
    """Class consistency and FID of all the images: from the judge's per-image outputs when recorded (the same
    numbers the intervals start from), else from ``bundle.quality`` on the decoded images."""
    if "judge_features" in samples[0]:
        out = {"judge_accuracy": float(np.mean(column(samples, "judge_correct"))), "fid_images": len(samples)}
        if len(samples) >= 2:
            out["fid"] = bundle.quality.fid(judge_features(samples))
        return out
    if bundle.quality is None:
        return {}
    return bundle.quality([bundle.image(s["tokens"]) for s in samples], [s["class_id"] for s in samples])


def pooled_depths(samples: list[dict]) -> dict:
    """Acceptance per draft position over all images: P(accept at depth d | depth d reached), pooled over every
    round of every image that reached d (a round that stopped earlier says nothing about d)."""
    reached = np.sum([s["reached_per_depth"] for s in samples], axis=0) if samples else np.zeros(0)
    accept_sum = np.sum([s["accept_prob_sum_per_depth"] for s in samples], axis=0) if samples else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        accept_prob = [float(p) if n else None for p, n in zip(accept_sum / reached, reached)]
    return {"depth": list(range(1, len(reached) + 1)), "reached": reached.astype(int).tolist(),
            "accept_prob": accept_prob}


def summarise(configuration: Configuration, rule: AcceptanceRule, samples: list[dict], timings: list[dict],
              ar_timings: list[dict], bundle: Bundle, keep_images: bool) -> dict:
    """One configuration's record: quality from its samples (every image), speed from its timings (the timed
    images, paired with AR's on the same images)."""
    latency, ar_latency = list(column(timings, "latency_s")), list(column(ar_timings, "latency_s"))
    rounds = sum(t["target_forwards"] for t in timings)
    phase = {k: sum(t["seconds"][k] for t in timings) for k in PHASES}
    record = {
        # params as given (they name the configuration); rule_params: all that it ran with, defaults included
        "method": configuration.name, "params": configuration.params, "rule_params": rule.params(),
        "label": configuration.label,
        "draft": configuration.draft,
        "tau": float(np.mean(column(samples, "tau"))),
        "target_forwards_per_image": float(np.mean(column(samples, "target_forwards"))),
        "drafter_forwards_per_image": float(np.mean(column(samples, "drafter_forwards"))),
        "latency_median_s": statistics.median(latency), "latency_mean_s": float(np.mean(latency)),
        "latency_iqr_s": quartiles(latency),
        "speedup_vs_ar": statistics.median(ar_latency) / statistics.median(latency),
        # the spread of the paired per-image ratios (same class and seed, measured moments apart)
        "speedup_vs_ar_iqr": quartiles([a / m for a, m in zip(ar_latency, latency)]),
        "relaxation_cost_mean": float(np.mean(column(samples, "relaxation_cost"))),
        # the target's own log-likelihood of the images, nats per token (coolsd.core.likelihood): lossless
        # methods estimate the target's negative entropy rate; relaxation moves it
        "log_likelihood_per_token": float(np.mean(column(samples, "log_likelihood_per_token"))),
        "per_depth": pooled_depths(samples),
        "seconds_per_image": {k: v / len(timings) for k, v in phase.items()},
        # the verification logic (sampling transform + acceptance walk) per round, relative to a target forward
        "acceptance_vs_target_forward": phase["acceptance"] / phase["target_forward"],
        "acceptance_ms_per_round": 1000 * phase["acceptance"] / rounds,
        "target_forward_ms_per_round": 1000 * phase["target_forward"] / rounds,
        "images": len(samples), "latency_images": len(timings),
    }
    record.update(quality_summary(samples, bundle))
    if keep_images:
        record["tokens"] = [s["tokens"] for s in samples]
    return record


CSV_COLUMNS = ("label", "method", "params", "draft", "images", "latency_images", "tau", "speedup_vs_ar",
               "log_likelihood_per_token", "fid", "judge_accuracy")
DIFFERENCES = ("tau", "speedup_vs_ar", "log_likelihood_per_token", "fid", "judge_accuracy")


def csv_rows(result: dict) -> list[dict]:
    """One row per configuration: its numbers, then each difference from Eagle-1 with its interval (blank where
    not measured: no judge, no Eagle-1)."""
    rows = []
    for run in result["runs"]:
        row = {key: run.get(key, "") for key in CSV_COLUMNS}
        row["params"] = ",".join(f"{key}={value}" for key, value in run["params"].items())
        for key in DIFFERENCES:
            difference = run.get("vs_eagle", {}).get(key, {})
            row.update({f"vs_eagle_{key}": difference.get("value", ""),
                        f"vs_eagle_{key}_low": difference.get("low", ""),
                        f"vs_eagle_{key}_high": difference.get("high", "")})
        rows.append(row)
    return rows


def write_csv(result: dict, path: Path) -> None:
    rows = csv_rows(result)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


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
    check_model_args(args)
    args.device = shard_device(args.device, args.shard)
    check_device(args.device)
    methods = args.methods if args.methods is not None else ([] if args.preset else DEFAULT_METHODS)
    configurations, skipped = plan(methods, args.preset, args.draft, usable_depth(args.info.config.image_tokens),
                                   args.info.config.vocab_size)
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
            "random_init": args.random_init, "device": pick_device(args.device).type,
            "steps": args.steps, "sampling": args.overrides, "seed": args.seed, "images": args.images,
            "latency_images": args.study.timed_images, "latency_batches": list(args.latency_batches),
            "repeats": args.repeats,
            "configurations": [[c.label, c.draft] for c in args.study.configurations]}


def format_table(result: dict) -> str:
    """A header line (model, device, threads, sample sizes) and one row per configuration."""
    threads = result["threads"]
    timed = result.get("latency_images", result["images"])
    timed_note = f" ({timed} timed)" if timed != result["images"] else ""
    lines = [(f"{result['model']} on {result['device']} ({result['dtype']}), {threads} torch thread"
              f"{'s' if threads != 1 else ''}, {result['images']} images x {len(result['runs'])} configurations"
              f"{timed_note}, {result['repeats']} timing(s) each, draft {result['draft']}")]
    header = ["label", "tau", "fwd/img", "latency ms", "latency IQR ms", "speed-up", "speed-up IQR",
              "accept/fwd", "loglik/token", "judge acc", "fid"]
    rows = [header]
    for run in result["runs"]:
        low, high = run["latency_iqr_s"]
        speed_low, speed_high = run["speedup_vs_ar_iqr"]
        rows.append([run["label"][:60], f"{run['tau']:.3f}", f"{run['target_forwards_per_image']:.1f}",
                     f"{1000 * run['latency_median_s']:.1f}", f"{1000 * low:.1f}-{1000 * high:.1f}",
                     f"{run['speedup_vs_ar']:.2f}x", f"{speed_low:.2f}-{speed_high:.2f}x",
                     f"{run['acceptance_vs_target_forward']:.3f}", f"{run['log_likelihood_per_token']:.4f}",
                     f"{run['judge_accuracy']:.3f}" if "judge_accuracy" in run else "",
                     f"{run['fid']:.2f}" if "fid" in run else ""])
    shown = [c for c in range(len(header)) if any(row[c] for row in rows[1:])]  # no judge: no quality columns
    widths = {c: max(len(row[c]) for row in rows) for c in shown}
    lines += ["  ".join(row[c].rjust(widths[c]) for c in shown) for row in rows]
    if any(row["batch"] != 1 for row in result.get("batches", [])):
        lines += ["", format_batches(result["batches"])]
    return "\n".join(lines)


def format_batches(rows: list[dict]) -> str:
    """The speed at each latency batch size, one row per (batch size, configuration)."""
    table = [["batch", "label", "images/s", "call ms", "speed-up vs AR", "speed-up IQR", "lockstep rounds"]]
    for row in rows:
        low, high = row["speedup_vs_ar_iqr"]
        table.append([str(row["batch"]), row["label"][:60], f"{row['images_per_s']:.2f}",
                      f"{1000 * row['call_latency_median_s']:.1f}", f"{row['speedup_vs_ar']:.2f}x",
                      f"{low:.2f}-{high:.2f}x", f"{row['lockstep_rounds_over_own']:.2f}x"])
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in table)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m coolsd.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=None,
                        help=f"method specs on --draft (default without --preset: {' '.join(DEFAULT_METHODS)})")
    parser.add_argument("--preset", action="append", choices=PRESETS, default=[],
                        help="a named sweep (repeatable, and combinable with --methods; grids in coolsd.cli.methods."
                             "SWEEPS): cool, uniform and lantern run on --draft (add --methods eagle for the "
                             "differences from Eagle-1); paper runs Eagle-1 and all three on chain:5 and tree:eagle25; "
                             "jacobi runs the drafter-free methods (SJD, SCD, Gumbel coupling, GSD, COOL-SD on "
                             "coupled drafts) on jacobi:8 and jacobi:16")
    parser.add_argument("--images", default=str(IMAGES.default))
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
    parser.add_argument("--warmup", default=str(WARMUP.default), help="untimed calls per configuration and batch size")
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
                     images=args.images, seed=args.seed, compare_steps=args.compare_steps,
                     batches=args.latency_batches)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(format_profile(result))
    return 0


def write_figures(result: dict, folder: Path) -> list[Path]:
    """The study's figures as PNG files in ``folder`` (matplotlib, imported only when asked for)."""
    from ..app.plots import study_figures
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, figure in study_figures(result).items():
        paths.append(folder / f"{stem}.png")
        figure.savefig(paths[-1], dpi=100)
    return paths


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
