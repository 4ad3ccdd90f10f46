"""A study's result from its records: each configuration's summary (quality from every image, speed from the
timed ones), the paired differences with their bootstrap intervals, the batch table and the warnings."""

from __future__ import annotations

import math
import platform
import statistics

import numpy as np
import torch

from ..core.rules import AcceptanceRule, rule_spec
from ..core.stats import bootstrap_interval, speedup_over_ar
from ..models.bundle import Bundle
from .passes import PHASES, Bench, chunks
from .study import Configuration, Study

# Sample sizes below which a quality metric means little (see ``sample_warnings``).
FID_MIN_IMAGES = 200  # the project's measurement: FID moves by about +-1 between two lossless runs of 200 images
CONSISTENCY_MIN_IMAGES = 100  # binomial standard error <= 0.5 / sqrt(100) = 5 percentage points, whatever the rate
# FID's bootstrap computes two FIDs per resample (about 1.4 ms each at 1,000 images x 128 features on one busy
# CPU core): 1,000 resamples cost about 3 s per configuration; the other statistics take the default 2,000.
FID_RESAMPLES = 1000


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


def column(records: list[dict], key: str) -> np.ndarray:
    return np.array([record[key] for record in records])


def judge_features(samples: list[dict]) -> np.ndarray:
    return np.array([sample["judge_features"] for sample in samples], dtype=np.float32)


def eagle_baseline(configurations: tuple[Configuration, ...], k: int) -> int | None:
    """Eagle-1's rule on configuration k's draft with its drafter, else on its draft, else the first Eagle-1
    (for AR, or a draft without one)."""
    eagles = [e for e, c in enumerate(configurations) if c.name == "eagle"]
    same_draft = [e for e in eagles if configurations[e].draft == configurations[k].draft]
    same_drafter = [e for e in same_draft if configurations[e].drafter == configurations[k].drafter]
    return (same_drafter or same_draft or eagles or [None])[0]


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
            "steps": bundle.steps, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
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
    the speed-up over AR at the same batch size (:func:`coolsd.core.stats.speedup_over_ar` over the same calls:
    AR's median call latency / the configuration's, bracketed by the lowest and highest ratio of the same
    call's), and the lockstep cost: the rounds a call ran (its slowest image's)
    over its images' mean own rounds."""
    study, configurations = bench.study, bench.study.configurations
    ar = next(k for k, c in enumerate(configurations) if c.name == "ar")
    rows = []
    for size in study.latency_batches:
        calls = chunks(study.timed_images, size)
        timings = [[[bench.records.get("timing", c.label, i, size) for i in images] for images in calls]
                   for c in configurations]
        call_seconds = [[call[0]["latency_s"] for call in per_call] for per_call in timings]
        for k, configuration in enumerate(configurations):
            rounds = [[record["target_forwards"] for record in call] for call in timings[k]]
            speedup = speedup_over_ar(call_seconds[ar], call_seconds[k])
            rows.append({"batch": size, "label": configuration.label, "calls": len(calls),
                         "images_per_s": study.timed_images / sum(call_seconds[k]),
                         "call_latency_median_s": statistics.median(call_seconds[k]),
                         "speedup_vs_ar": speedup[0], "speedup_vs_ar_range": list(speedup[1:]),
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
    speedup = speedup_over_ar(ar_latency, latency)
    rounds = sum(t["target_forwards"] for t in timings)
    phase = {k: sum(t["seconds"][k] for t in timings) for k in PHASES}
    record = {
        # params as given (they name the configuration); rule_params: all that it ran with, defaults included
        "method": configuration.name, "params": configuration.params, "rule_params": rule.params(),
        "label": configuration.label,
        "draft": configuration.draft,
        "drafter": configuration.drafter or (bundle.drafter_name if configuration.tree.size
                                             and configuration.tree.needs_drafter else None),
        "tau": float(np.mean(column(samples, "tau"))),
        "target_forwards_per_image": float(np.mean(column(samples, "target_forwards"))),
        "drafter_forwards_per_image": float(np.mean(column(samples, "drafter_forwards"))),
        "latency_median_s": statistics.median(latency), "latency_mean_s": float(np.mean(latency)),
        "latency_iqr_s": quartiles(latency),
        # AR's median latency / this one's, bracketed by the lowest and highest paired per-image ratio (same class
        # and seed, measured moments apart): coolsd.core.stats.speedup_over_ar, the app's definition too
        "speedup_vs_ar": speedup[0], "speedup_vs_ar_range": list(speedup[1:]),
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
