"""What one generation reports: counts, per-depth acceptance, per-token origins, rounds, timings."""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

# Where a drafted token came from (coolsd.core.sources' codes, in order): the draft model, a fresh uniform draw, a
# draw from the target's last rows (a Jacobi refresh), or the old draft kept by the coupling.
DRAFT_ORIGINS = ("drafter", "fresh", "refreshed", "kept")
# Where an image token came from.
FIRST, DRAFT, RESAMPLED, BONUS, TARGET = "first", "draft", "resampled", "bonus", "target"
ORIGINS = (RESAMPLED, BONUS, TARGET)  # a round's last token, by the walk's origin code (coolsd.core.verify)


@dataclass
class Candidate:
    """One tested draft candidate: tree node, depth, acceptance probability ``f``, whether it was accepted,
    and its one-step total-variation cost ``e = sum [q f - p]_+`` (spec section 4)."""

    node: int
    depth: int
    accept_prob: float
    accepted: bool
    cost: float


@dataclass
class Round:
    """One target forward: the drafted tree (tokens, validity) and what verification made of it."""

    start: int  # image index of the first token this round emits
    drafted: list[int]  # token per tree node 1..M
    valid: list[bool]
    tested: list[Candidate]
    level_accept_prob: dict[int, float]  # depth -> P(some candidate accepted | depth reached)
    emitted: list[int]
    next_origin: str
    sources: list[str] = field(default_factory=list)  # where each drafted token came from (DRAFT_ORIGINS)

    @property
    def accepted(self) -> int:
        return len(self.emitted) - 1

    def to_dict(self) -> dict:
        return {"start": self.start, "drafted": self.drafted, "valid": self.valid,
                "tested": [vars(c) for c in self.tested], "emitted": self.emitted, "next_origin": self.next_origin,
                "sources": self.sources,
                "level_accept_prob": {str(k): v for k, v in self.level_accept_prob.items()}}


# A round's record: what the device keeps of it until the image is done, one float64 row per round (token ids are
# exact in float64). The fields, with their lengths for N tree nodes (root included), I inner nodes and depth D.
RECORD_FIELDS = ("start", "count", "origin", "emitted", "drafted", "source", "valid", "accepted", "tested", "on_path",
                 "accept_prob", "cost", "level_prob")


def record_widths(nodes: int, inner: int, depth: int) -> dict[str, int]:
    """Each record field's length (``accept_prob`` and ``cost`` keep the walk's sink column)."""
    special = {"start": 1, "count": 1, "origin": 1, "emitted": depth + 1, "accept_prob": nodes + 1,
               "cost": nodes + 1, "level_prob": inner}
    return {name: special.get(name, nodes) for name in RECORD_FIELDS}


def unpack(rows: np.ndarray, widths: dict[str, int]) -> dict[str, np.ndarray]:
    """The fields of packed record rows (R, width), each (R, length)."""
    out, at = {}, 0
    for name, width in widths.items():
        out[name] = rows[:, at:at + width]
        at += width
    return out


def add_rounds(stats: "GenerationStats", rows: np.ndarray, tree, captured: tuple | None = None) -> None:
    """Rebuild the rounds of an image from its records (read from the device once): each round's drafted tree,
    tested candidates in walk order, per-depth acceptance and emitted tokens, and each token's origin.
    ``captured``: the (p, q) rows (R, D + 1, V) at each kept node, for the nodes whose children were tested."""
    fields = unpack(rows, record_widths(tree.size + 1, len(tree.inner_nodes), tree.depth))
    depths, parents, inner_row = tree.depths, tree.parent, {n: i for i, n in enumerate(tree.inner_nodes)}
    for r in range(len(rows)):
        f = {name: values[r] for name, values in fields.items()}
        count, tested_nodes = int(f["count"][0]), np.flatnonzero(f["tested"] > 0)
        tested = [Candidate(int(c), depths[c], float(f["accept_prob"][c]), bool(f["accepted"][c] > 0),
                            float(f["cost"][c])) for c in tested_nodes]
        kept = [int(n) for n in np.flatnonzero(f["on_path"] > 0)]  # root first, in depth order
        tried = {parents[c] for c in tested_nodes}
        level_prob = {depths[n] + 1: float(f["level_prob"][inner_row[n]]) for n in kept if n in tried}
        emitted = [int(t) for t in f["emitted"][:count]]
        origin = ORIGINS[int(f["origin"][0])]
        for node in kept[1:]:
            stats.emit(DRAFT, depths[node], float(f["accept_prob"][node]), DRAFT_ORIGINS[int(f["source"][node])])
        stats.emit(origin)
        stats.rounds.append(Round(int(f["start"][0]), [int(t) for t in f["drafted"][1:]],
                                  [bool(v > 0) for v in f["valid"][1:]], tested, level_prob, emitted, origin,
                                  [DRAFT_ORIGINS[int(c)] for c in f["source"][1:]]))
        if captured is not None:
            stats.captured += [{"depth": depths[n] + 1, "p": captured[0][r, depths[n]], "q": captured[1][r, depths[n]]}
                               for n in kept if n in tried]


@dataclass
class Timer:
    """Seconds per phase. With ``events`` (CUDA) each phase is bracketed by CUDA events that are read once, in
    :meth:`finish`: timing then adds no host synchronisation to a round, and a phase counts its GPU time."""

    events: bool = False
    seconds: dict[str, float] = field(default_factory=lambda: {"drafting": 0.0, "target_forward": 0.0,
                                                                "acceptance": 0.0})
    marks: list = field(default_factory=list)
    ticks: list = field(default_factory=list)  # one per round's end (a CUDA event, or the host clock on a CPU)
    round_ends: list[float] = field(default_factory=list)  # seconds from the start to each tick, after finish
    excluded: float = 0.0  # host seconds spent on something else (a live view's read-back), left out of the ticks

    def __post_init__(self) -> None:
        self.started = self.now()

    def now(self):
        """A point in time: a recorded CUDA event (no host synchronisation), or the host clock."""
        if not self.events:
            return time.perf_counter() - self.excluded
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def tick(self) -> None:
        """A round ended (the race view replays the rounds at these times)."""
        self.ticks.append(self.now())

    @contextmanager
    def phase(self, name: str):
        if self.events:
            began = torch.cuda.Event(enable_timing=True)
            began.record()
            try:
                yield
            finally:
                ended = torch.cuda.Event(enable_timing=True)
                ended.record()
                self.marks.append((name, began, ended))
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def finish(self) -> dict[str, float]:
        """Wait for the device once and add up the events' phases."""
        if self.events:
            torch.cuda.synchronize()
        for name, began, ended in self.marks:
            self.seconds[name] += began.elapsed_time(ended) / 1000
        self.marks.clear()
        self.round_ends = [self.started.elapsed_time(tick) / 1000 if self.events else tick - self.started
                           for tick in self.ticks]
        return self.seconds


def time_calls(work, repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``work`` after ``warmup`` untimed ones, the device's queue
    drained around each (for benchmarks, never inside a generation)."""
    return time_interleaved({"work": work}, repeats, warmup, device)["work"]


def time_interleaved(works: dict, repeats: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """:func:`time_calls` of several works, interleaved: each repeat calls every work once, in turn, so that all
    see the same machine conditions. Returns each work's seconds by its name."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for work in works.values():
        for _ in range(warmup):
            work()
    sync()
    seconds: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(repeats):
        for name, work in works.items():
            began = time.perf_counter()
            work()
            sync()
            seconds[name].append(time.perf_counter() - began)
    return seconds


@dataclass
class GenerationStats:
    method: str
    params: dict
    draft: str
    tree_depth: int
    class_id: int
    seed: int
    sampling: dict
    omegas: list[float]
    rounds: list[Round] = field(default_factory=list)
    token_origin: list[str] = field(default_factory=list)
    token_depth: list[int] = field(default_factory=list)
    token_accept_prob: list[float] = field(default_factory=list)
    token_source: list[str] = field(default_factory=list)  # an accepted draft's DRAFT_ORIGINS entry, else ""
    drafter_forwards: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    captured: list[dict] = field(default_factory=list)  # (depth, p, q) of first candidates, when asked
    condition: dict = field(default_factory=dict)  # {"class_id": 3}, or a caption's description
    batch: int = 1  # images decoded together in lockstep rounds; ``seconds`` are the whole batch's
    round_ends: list[float] = field(default_factory=list)  # seconds from the start to the end of each round

    def emit(self, token_origin: str, depth: int = 0, accept_prob: float = math.nan, source: str = "") -> None:
        self.token_origin.append(token_origin)
        self.token_depth.append(depth)
        self.token_accept_prob.append(accept_prob)
        self.token_source.append(source)

    # Derived summaries -------------------------------------------------------------------------------
    @property
    def target_forwards(self) -> int:
        return len(self.rounds)

    @property
    def tokens(self) -> int:
        return len(self.token_origin)

    @property
    def tau(self) -> float:
        """Mean tokens per target forward (accepted drafts + 1); vanilla AR gives exactly 1."""
        return self.tokens / max(1, self.target_forwards)

    @property
    def accepted_per_round(self) -> list[int]:
        return [r.accepted for r in self.rounds]

    @property
    def relaxation_cost(self) -> float:
        return float(sum(c.cost for r in self.rounds for c in r.tested))

    def level_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Per draft depth 1..D: rounds that reached it, and the sum of their P(accept at depth | reached): sums,
        so that many images pool into one acceptance curve (the study's per-position plot)."""
        reached, prob = np.zeros(self.tree_depth), np.zeros(self.tree_depth)
        for r in self.rounds:
            for d, level_prob in r.level_accept_prob.items():
                reached[d - 1] += 1
                prob[d - 1] += level_prob
        return reached, prob

    def per_depth(self) -> dict[str, list]:
        """Per draft depth 1..D: times reached, mean P(accept at depth | reached), empirical rate, omega,
        and the mean acceptance probability of single candidates."""
        depth = self.tree_depth
        (reached, prob), accepted = self.level_totals(), np.zeros(depth)
        cand_n, cand_f = np.zeros(depth), np.zeros(depth)
        for r in self.rounds:
            for c in r.tested:
                accepted[c.depth - 1] += c.accepted
                cand_n[c.depth - 1] += 1
                cand_f[c.depth - 1] += c.accept_prob
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"depth": list(range(1, depth + 1)), "reached": reached.astype(int).tolist(),
                    "accept_prob": _nan_to_none(prob / reached), "accept_rate": _nan_to_none(accepted / reached),
                    "candidates": cand_n.astype(int).tolist(), "candidate_accept_prob": _nan_to_none(cand_f / cand_n),
                    "omega": self.omegas}

    def summary(self) -> dict:
        total = self.seconds.get("total", 0.0)
        return {"method": self.method, "params": self.params, "draft": self.draft, "class_id": self.class_id,
                "condition": self.condition or {"class_id": self.class_id}, "seed": self.seed,
                "sampling": self.sampling, "batch": self.batch, "tokens": self.tokens,
                "target_forwards": self.target_forwards, "drafter_forwards": self.drafter_forwards,
                "tau": self.tau, "accepted_per_round": self.accepted_per_round,
                "relaxation_cost": self.relaxation_cost, "per_depth": self.per_depth(),
                "seconds": {**self.seconds, "total": total}}

    def to_dict(self, rounds: bool = True) -> dict:
        out = self.summary()
        out["tokens_detail"] = {"origin": self.token_origin, "depth": self.token_depth, "source": self.token_source,
                                "accept_prob": _nan_to_none(np.array(self.token_accept_prob))}
        if rounds:
            out["rounds"] = [r.to_dict() for r in self.rounds]
        return out


def _nan_to_none(values: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in values]


def speedup_over_ar(ar_seconds: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float]:
    """Speed-up over AR, defined once for the bench's table and JSON and the app's timing table: AR's median
    latency / the run's median latency over the same items (images, or interleaved repeats), and its bracket,
    the lowest and highest paired ratio ``ar_i / seconds_i``. The bracket always holds the speed-up: were every
    ``ar_i > s * seconds_i``, every order statistic of ``ar`` would exceed ``s`` times that of ``seconds``, the
    medians included, so ``s`` could not be their ratio (and likewise below)."""
    if len(ar_seconds) != len(seconds) or not seconds:
        raise ValueError(f"a speed-up pairs AR's latencies with the run's: got {len(ar_seconds)} and {len(seconds)}")
    ratios = [ar / other for ar, other in zip(ar_seconds, seconds)]
    return statistics.median(ar_seconds) / statistics.median(seconds), min(ratios), max(ratios)


def bootstrap_interval(items: int, statistic: Callable[[np.ndarray], float], resamples: int = 2000,
                       level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """The statistic on all ``items`` and its percentile bootstrap interval: ``statistic(index)`` is computed on
    ``resamples`` draws of item indices with replacement. Pass a difference of two methods computed on the SAME
    indices (image i of both: same class and seed) to get a paired interval, which removes the spread the two
    share."""
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, items, items)) for _ in range(resamples)])
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return {"value": float(statistic(np.arange(items))), "low": float(low), "high": float(high), "level": level,
            "resamples": resamples}


def symmetric_sqrt(matrix: np.ndarray) -> np.ndarray:
    """The positive semi-definite square root of a symmetric matrix (rounding's negative eigenvalues as 0)."""
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def frechet_distance(features: np.ndarray, mean: np.ndarray, cov: np.ndarray, cov_root: np.ndarray) -> float:
    """FID of feature rows against a reference Gaussian (``mean``, ``cov``, ``cov_root = sqrt(cov)``):
    ``|mu - mean|^2 + tr(S + cov - 2 sqrt(cov S))``, S the rows' unbiased covariance. ``tr sqrt(cov S)`` is the
    sum of the square roots of the eigenvalues of the symmetric ``cov_root S cov_root`` (a similar matrix), so
    with the reference's root computed once an FID costs one symmetric eigen-solve: cheap enough to bootstrap."""
    rows = np.asarray(features, dtype=np.float64)
    mu, sample_cov = rows.mean(axis=0), np.cov(rows, rowvar=False)
    product = np.linalg.eigvalsh(cov_root @ sample_cov @ cov_root)
    return float(np.sum((mu - mean) ** 2) + np.trace(sample_cov) + np.trace(cov)
                 - 2 * np.sqrt(np.clip(product, 0.0, None)).sum())
