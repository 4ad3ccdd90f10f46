"""The benchmark's passes: generate every (configuration, image) once untimed for its sample record, and time
images 0..M-1 interleaved across configurations (the records they keep, the warm-up, the batches they run in).

Summaries of the records are in :mod:`coolsd.cli.summaries`; the run that chains the passes is
:func:`coolsd.cli.bench.run_benchmark`."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from ..core.decode import Generation, generate_batch
from ..core.likelihood import images_log_likelihoods
from ..core.rules import AcceptanceRule
from ..core.sampling import SamplingConfig
from ..models.bundle import Bundle
from ..models.registry import EXAMPLE_PROMPTS
from ..models.steps import unwrapped
from .study import Configuration, Records, Shard, Study

PHASES = ("drafting", "target_forward", "acceptance", "other")


class NotDeterministic(RuntimeError):
    """Repeats of one (image, method) gave different tokens, so their timings are not of the same work."""


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

    def model(self, configuration: Configuration) -> Bundle:
        """The bundle drafting with the configuration's drafter."""
        return self.bundle.with_drafter(configuration.drafter)


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
            runs.append(generate_batch(bench.model(configuration), conditions, rule, configuration.tree,
                                       bench.sampling, seeds))
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
                generate_batch(bench.model(configurations[k]), [bench.condition(i) for i in warm], bench.rules[k],
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
            generations = generate_batch(bench.model(configurations[k]), [bench.condition(i) for i in call],
                                         bench.rules[k], configurations[k].tree, bench.sampling,
                                         [bench.study.seed + i for i in call])
            for record in sample_records(bench, configurations[k], call, generations):
                bench.records.add(record)
            bar.update(len(call))
    bar.close()
    return [bench.records.get("sample", configurations[k].label, image) for k, image in items]


def timed_pass(work):
    """(wall seconds, result) of a pass (of what it had left to do: a resumed pass skips its recorded items)."""
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result
