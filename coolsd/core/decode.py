"""The decoding loop: one engine for vanilla AR (the empty draft), chain and static-tree speculative decoding, for
one image or a batch of images in lockstep rounds.

A round (spec section 1) has two phases. ``draft_phase``: the draft source fills the tree (the Eagle-1 head catches
up on the pairs the last round kept, then drafts level by level; :mod:`coolsd.core.sources`). ``verify_phase``: the
target scores root + tree in one forward, the acceptance walk keeps a path (:func:`coolsd.core.verify.walk`), the
caches commit it, and the source observes the outcome (a Jacobi window, :mod:`coolsd.core.jacobi`, refreshes its
drafts from this forward's rows there, so its rounds have no drafting phase). Both read and write
the fixed buffers of a :class:`Workspace` on the device and read nothing back to the host, so a phase can be
captured once as a CUDA graph and replayed (:mod:`coolsd.core.graphs`). The host enqueues the rounds it knows
the images need (each emits at most depth + 1 tokens), then reads how far the least advanced image got; the
tokens and every round's statistics come back in one copy at the end. Models are used only through
:mod:`coolsd.core.interface`.

A batch (spec section 9) carries every per-image quantity with a leading dimension of ``B`` images: its length
``n``, tokens, drafted tree, records, and a random generator of its own, drawn in the same order whatever the
batch, so that image ``b``'s numbers, hence its tokens, are those it gets decoded alone. Model rows are
``g * B`` (``g`` guidance rows per image, conditional rows first). An image that has finished keeps its rows in
the lockstep forwards (the shapes stay fixed) but commits and records nothing.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .graphs import EAGER, DrawnPhase, PhaseRunner
from .interface import Drafter, Target, stack_rows
from .jacobi import JacobiSource
from .memory import available_memory, gigabytes
from .params import check
from .rules import AcceptanceRule
from .sampling import SamplingConfig, probabilities, sample
from .sources import DrafterSource, DraftSource, gather_rows
from .sources import causal_mask as causal
from .stats import FIRST, GenerationStats, Round, Timer, add_rounds, record_widths
from .trees import DraftTree
from .verify import TARGET_CODE, Verdict, distributions, walk

EMPTY = DraftTree((), "none")
SOURCES: dict[str, type[DraftSource]] = {"drafter": DrafterSource, "jacobi": JacobiSource}  # by ``DraftTree.source``


@dataclass
class Generation:
    tokens: list[int]
    stats: GenerationStats


def acceptance_dtype(device: torch.device) -> torch.dtype:
    """float64 on a CPU (the exactness tests hold to rounding); float32 on CUDA, where float64 is slow."""
    return torch.float64 if device.type == "cpu" else torch.float32


class Workspace:
    """The fixed buffers one kind of generation (models, rule, draft tree, sampling, batch size) reads and writes
    on the device. A phase only writes into them in place, so a captured graph of it stays valid for every
    batch of images."""

    def __init__(self, target: Target, drafter: Drafter | None, rule: AcceptanceRule, tree: DraftTree,
                 sampling: SamplingConfig, capture: bool = False, batch: int = 1) -> None:
        self.target, self.drafter, self.rule, self.tree, self.sampling = target, drafter, rule, tree, sampling
        device, self.batch, self.guidance_rows = target.device, batch, sampling.rows
        self.rows = rows = sampling.rows * batch
        nodes, window, images = tree.size + 1, tree.depth + 1, target.image_tokens
        self.device, self.dtype = device, acceptance_dtype(device)
        self.index = tree.tensors(device, self.dtype)
        rules = getattr(target, "position_rules", None)  # constrained positions (spec section 8), or None
        self.rules = rules.padded(window + 1, device) if rules is not None else None
        self.last_position = target.prefix_length + images - 1  # positions past the image are clamped (unused)
        self.max_len = target.prefix_length + images + tree.size
        self.target_cache = target.new_cache(rows, self.max_len, batch)
        self.generators = [torch.Generator(device=device) for _ in range(batch)]  # one random stream per image
        self.timer = Timer(events=device.type == "cuda")
        self.tokens = torch.zeros(batch, images + window, dtype=torch.long, device=device)  # images, then scratch
        self.n = torch.zeros(batch, dtype=torch.long, device=device)  # tokens emitted so far, per image
        self.rounds = torch.zeros(batch, dtype=torch.long, device=device)  # rounds each image took part in
        self.image_range = torch.arange(batch, device=device)
        # the drafted trees: tokens, validity, draft distributions
        self.node_tokens = torch.zeros(batch, nodes, dtype=torch.long, device=device)
        self.node_valid = torch.ones(batch, nodes, dtype=torch.bool, device=device)
        self.node_origin = torch.zeros(batch, nodes, dtype=torch.long, device=device)  # sources.DRAFT_ORIGINS codes
        # one per inner node, in the acceptance dtype (drafting's float32 rows are converted as they are stored)
        self.q = torch.zeros(batch, len(tree.inner_nodes), target.vocab_size, dtype=self.dtype, device=device)
        # random numbers, drawn per image before they are needed: the walk's uniforms, the first token's uniform
        # (then the draft source's, see draw_randoms)
        self.walk_uniforms = torch.zeros(batch, tree.size + 2, dtype=self.dtype, device=device)
        self.first_uniforms = torch.zeros(batch, 1, dtype=self.dtype, device=device)
        self.window_mask = causal(window, device)
        self.window_range = torch.arange(window, device=device)
        self.source = SOURCES[tree.source](self, drafter) if tree.size else DraftSource(self)
        # the target layers the drafter reads (EAGLE-3); none for every other draft (no cost to the target)
        self.taps = tuple(drafter.target_layers) if tree.size and tree.source == "drafter" else ()
        # the last target forward's features, the draft source's features (the taps, else the same) and logits
        self.hidden = self.source_hidden = self.logits = None
        widths = record_widths(nodes, len(tree.inner_nodes), tree.depth)
        self.records = torch.zeros(batch, images, sum(widths.values()), dtype=torch.float64, device=device)
        # a round's record before it goes into records: an AR step writes its start and token (per round) beside
        # constants (one kept root, its token drawn from the target); a speculative round fills the whole row
        self.row = torch.zeros(batch, self.records.shape[2], dtype=torch.float64, device=device)
        bounds = dict(zip(widths, np.cumsum([0, *widths.values()]).tolist()))
        # an AR step's columns, by index (not as views of the row: a compiled phase must not see aliased inputs)
        self.emitted_column = bounds["emitted"]
        for name, value in (("count", 1), ("origin", TARGET_CODE), ("valid", 1), ("on_path", 1)):
            self.row[:, bounds[name]].fill_(value)
        shape = (batch, images, window, target.vocab_size)
        self.captured = (torch.zeros(shape, device=device), torch.zeros(shape, device=device)) if capture else None

    def reset(self, seeds: Sequence[int]) -> None:
        """New images: empty caches, each image's generator seeded, counters at zero (buffers kept, in place)."""
        self.target_cache.reset()
        self.source.reset()
        for generator, seed in zip(self.generators, seeds, strict=True):
            generator.manual_seed(seed)
        self.n.zero_()
        self.rounds.zero_()

    def draw_randoms(self, uniforms: Tensor) -> None:
        """From each image's own generator: ``uniforms`` (this round's, or the first token's), then every random
        buffer of the draft source (the drafter's next races for every level, however deep that round drafts; a
        Jacobi window's refresh draws). So an image consumes its stream in the same order alone or in any batch
        (spec section 9). Never compiled (:class:`coolsd.core.graphs.DrawnPhase`): compiled and eager rounds draw
        the same numbers."""
        for image, generator in enumerate(self.generators):
            uniforms[image].uniform_(generator=generator)
            for buffer, law in self.source.randoms:
                getattr(buffer[image], f"{law}_")(generator=generator)

    def allowed(self, offsets: Tensor) -> Tensor | None:
        """(B, T, V): what generated positions ``n + offsets`` allow, for a constrained model; else None."""
        return self.rules.allowed_at(self.n[:, None] + offsets) if self.rules is not None else None

    def per_row(self, per_image: Tensor) -> Tensor:
        """A per-image tensor (B, ...) for every model row (g * B, ...), conditional rows first."""
        if self.batch == 1:
            return per_image.expand(self.rows, *per_image.shape[1:])
        return torch.cat([per_image] * self.guidance_rows) if self.guidance_rows > 1 else per_image

    def row_positions(self, positions: Tensor) -> Tensor:
        """Per-image positions (B, T) as a model takes them: (T,) shared by the rows of one image, else per row."""
        return positions[0] if self.batch == 1 else self.per_row(positions)

    def guided(self, logits: Tensor, allowed: Tensor | None) -> Tensor:
        """Model rows' logits (g * B, T, V) -> each image's guided, filtered distributions (B, T, V)."""
        return probabilities(logits.unflatten(0, (self.guidance_rows, self.batch)), self.sampling, allowed)


def prefill(ws: Workspace, conditions: Sequence[Any]) -> None:
    """Score each condition's P prefix positions, draw each image's first token from the last one, and start the
    draft source (the drafter sees the prefix; a Jacobi window is drafted fresh)."""
    target, device = ws.target, ws.device
    with ws.timer.phase("target_forward"):
        prefixes = [target.prefix(condition, ws.guidance_rows) for condition in conditions]
        embeds = stack_rows([prefix.embeds for prefix in prefixes])
        valid = stack_rows([prefix.valid for prefix in prefixes]) if prefixes[0].valid is not None else None
        length = embeds.shape[1]
        target_forward(ws, embeds, torch.arange(length, device=device), ws.target_cache, 0, causal(length, device),
                       valid)
        ws.target_cache.commit(None, length)
        logits = target.logits(ws.hidden[:, -1:])
    with ws.timer.phase("acceptance"):
        ws.draw_randoms(ws.first_uniforms)
        first_probs = ws.guided(logits, ws.allowed(ws.window_range[:1]))[:, 0]  # n is 0
        first = sample(distributions(first_probs.to(ws.dtype)), ws.first_uniforms[:, 0])
        ws.tokens[:, 0] = first
        ws.n.fill_(1)
    with ws.timer.phase("drafting"):
        ws.source.start(ws, embeds, ws.source_hidden)


def target_forward(ws: Workspace, *args: Any) -> None:
    """A target forward (the interface's arguments): its features into ``ws.hidden`` and the draft source's into
    ``ws.source_hidden``, the inputs of the layers an EAGLE-3 drafter reads, asked for only then."""
    if ws.taps:
        ws.hidden, ws.source_hidden = ws.target(*args, taps=ws.taps)
    else:
        ws.hidden = ws.source_hidden = ws.target(*args)


def draft_phase(ws: Workspace, levels: int | None = None) -> None:
    """The draft source fills the tree. ``levels`` (default: every one) stops early where every image surely
    ends sooner; the deeper nodes are then invalid."""
    with ws.timer.phase("drafting"):
        ws.source.draft(ws, ws.tree.depth if levels is None else levels)


def draw(ws: Workspace) -> None:
    """The round's random numbers from each image's stream: the walk's uniforms, then the draft source's (they
    come first in a verification: nothing in them depends on its forward)."""
    with ws.timer.phase("acceptance"):
        ws.draw_randoms(ws.walk_uniforms)


def score_and_accept(ws: Workspace) -> None:
    """Score root + tree in one target forward, then walk it with the rule and commit what it kept."""
    score(ws)
    accept(ws)


# A verification: the round's draws, then the forward, the walk and the commit (compiled as one region).
verify_phase = DrawnPhase(draw, score_and_accept)


def score(ws: Workspace) -> None:
    """The target's forward over root + tree (the root: image token n - 1, at position P + n - 1): its
    features and logits, kept in the workspace for :func:`accept`."""
    target, tree, index = ws.target, ws.tree, ws.index
    with ws.timer.phase("target_forward"):
        ws.node_tokens[:, :1] = ws.tokens.gather(1, (ws.n - 1)[:, None])  # the root: the last emitted token
        embeds = ws.per_row(target.embed(ws.node_tokens))
        positions = (ws.n[:, None] + (target.prefix_length - 1) + index["depths"]).clamp_max(ws.last_position)
        target_forward(ws, embeds, ws.row_positions(positions), ws.target_cache, 0,
                       index["mask"] if tree.size else None)
        ws.logits = target.logits(ws.hidden)


def accept(ws: Workspace) -> None:
    """Walk each image's scored tree with the rule, then commit: the kept path's keys in the target cache, the
    emitted tokens and the round's record; then the draft source observes the outcome (the drafter's next
    catch-up pairs, a Jacobi window's refresh); its random numbers were drawn by :func:`draw`. A finished image
    commits nothing."""
    tree, index, images = ws.tree, ws.index, ws.target.image_tokens
    with ws.timer.phase("acceptance"):
        p = ws.guided(ws.logits, ws.allowed(index["depths"])).to(ws.dtype)
        valid = ws.node_valid & (index["depths"] < (images - ws.n)[:, None])  # nothing past the image's end
        if tree.size:
            p, q = distributions(p), distributions(ws.q)
        verdict = walk(index, ws.node_tokens, valid, p, q if tree.size else p, ws.rule, ws.walk_uniforms)
        active = ws.n < images
        count = verdict.count * active
        ws.target_cache.commit(None if tree.is_chain else verdict.keep, count)
        record(ws, verdict, valid, count)
        if ws.captured is not None:  # the (p, q) rows at each kept node (q: its row among the inner nodes)
            kept_rows = (verdict.keep, index["inner_row"][verdict.keep])
            for buffer, dist, at in zip(ws.captured, (p, q), kept_rows):
                buffer.index_put_((ws.image_range, ws.rounds), gather_rows(dist, at).float())
        ws.tokens.scatter_(1, ws.n[:, None] + ws.window_range, verdict.emitted)
        ws.n.add_(count)
        ws.rounds.add_(active)
    with ws.timer.phase("drafting"):
        ws.source.observe(ws, verdict, p, count)


def record(ws: Workspace, verdict: Verdict, valid: Tensor, count: Tensor) -> None:
    """This round's record into each image's next row of ``ws.records``: a speculative round's fields in
    RECORD_FIELDS' order, concatenated in one operation into the workspace's float64 row (which holds token ids
    exactly, and takes float32 probabilities where the acceptance runs in float32, as on CUDA); an
    AR step writes its start and token (its other fields are constants, set once). A finished image's row lands
    past its last round, where nothing reads it."""
    if ws.tree.size:
        torch.cat([ws.n[:, None], count[:, None], verdict.origin[:, None], verdict.emitted, ws.node_tokens,
                   ws.node_origin, valid, verdict.accepted, verdict.tested, verdict.on_path, verdict.accept_prob,
                   verdict.cost, verdict.level_prob], 1, out=ws.row)
    else:
        ws.row[:, 0] = ws.n
        ws.row[:, ws.emitted_column] = verdict.emitted[:, 0]
    ws.records.index_put_((ws.image_range, ws.rounds), ws.row)


def rounds_needed(remaining: int, depth: int) -> int:
    """Rounds an image surely still needs: each emits at most ``depth + 1`` tokens (fewer near the end)."""
    return math.ceil(remaining / (depth + 1))


def run_rounds(ws: Workspace, runner: PhaseRunner, peek: Callable[[list[int]], None] | None = None) -> list[int]:
    """Enqueue rounds until every image is done, reading the least advanced image's length only once the rounds
    it surely needs are queued (the one host read between rounds; on CUDA it waits for them). Each round emits
    at least one token per unfinished image, so the host knows a lower bound on every length, and drafts no
    deeper than the least advanced image can still use (a captured drafting phase per depth). ``peek`` (a live
    view) is called after every round with the drafter levels run so far. Returns the drafter levels each
    round ran."""
    images, depth = ws.target.image_tokens, ws.tree.depth
    levels_run, emitted = [], 1
    while emitted < images:
        for at_least in range(emitted, emitted + rounds_needed(images - emitted, depth)):
            levels = min(depth, images - at_least - 1)
            if levels > 0 and ws.source.drafting_phase:
                runner.run(ws, f"drafting:{levels}", functools.partial(draft_phase, levels=levels))
            runner.run(ws, "verification", verify_phase)
            ws.timer.tick()
            levels_run.append(max(levels, 0) if ws.source.drafting_phase else 0)
            if peek is not None:
                peek(levels_run)
        emitted = int(ws.n.min())
    return levels_run


@dataclass
class Watch:
    """A live view of a generation: between two rounds, at most every ``interval`` seconds, the images so far
    (their tokens and finished rounds, read back from the device: one host read, which a CUDA round otherwise
    avoids) go to ``show``. Its time is left out of the generation's timings."""

    show: Callable[[list[Generation]], None]
    interval: float = 0.1
    last: float = -math.inf

    def due(self) -> bool:
        return time.perf_counter() - self.last >= self.interval


def snapshot(ws: Workspace, stats: list[GenerationStats], levels_run: list[int]) -> list[Generation]:
    """The images so far: each one's emitted tokens and its finished rounds (``stats``: fresh records)."""
    tokens = read_back(ws, stats, levels_run)
    return [Generation(image_tokens[:image_stats.tokens], image_stats)
            for image_tokens, image_stats in zip(tokens, stats)]


def read_back(ws: Workspace, stats: list[GenerationStats], levels_run: list[int]) -> list[list[int]]:
    """Each image's tokens and every round's statistics, copied from the device once."""
    read = torch.cat([ws.rounds[:, None], ws.tokens[:, :ws.target.image_tokens]], 1).tolist()  # rounds, tokens
    rounds, tokens = [row[0] for row in read], [row[1:] for row in read]
    records = ws.records[:, :max(rounds)].cpu().numpy()
    captured = tuple(buffer[:, :max(rounds)].cpu().numpy() for buffer in ws.captured) \
        if ws.captured is not None else None
    for image, (image_stats, image_tokens, image_rounds) in enumerate(zip(stats, tokens, rounds)):
        image_stats.rounds.append(Round(0, [], [], [], {}, image_tokens[:1], FIRST))
        image_stats.emit(FIRST)
        add_rounds(image_stats, records[image, :image_rounds], ws.tree,
                   tuple(c[image] for c in captured) if captured is not None else None)
        image_stats.drafter_forwards = sum(levels_run[:image_rounds])  # the rounds it took part in
    return tokens


def describe(condition: Any) -> dict:
    """The condition as the statistics record it (a bare class id counts as a class label)."""
    return condition.describe() if hasattr(condition, "describe") else {"class_id": condition}


def check_batch(conditions: Sequence[Any], seeds: Sequence[int]) -> int:
    """The batch size: as many seeds as conditions, at least one image (one-line errors otherwise)."""
    if isinstance(conditions, (str, bytes)) or not isinstance(conditions, Sequence) or \
            isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise ValueError("a batch takes a list of conditions and a list of seeds, one per image")  # noqa: TRY004
    if len(conditions) != len(seeds):
        raise ValueError(f"a batch needs one seed per image: got {len(conditions)} conditions and {len(seeds)} seeds")
    if not conditions:
        raise ValueError("a batch needs at least one image: got no conditions and no seeds")
    return len(seeds)


def cache_bytes_per_slot(model: Any) -> int:
    """Bytes of keys and values one model row keeps per cached position (read off a one-slot cache)."""
    cache = model.new_cache(1, 1)
    return 2 * cache.keys.numel() * cache.keys.element_size()


def batch_memory(target: Target, drafter: Drafter | None, tree: DraftTree, sampling: SamplingConfig,
                 batch: int, capture: bool = False) -> dict[str, int]:
    """Bytes a batch of ``batch`` images holds for its whole decoding, computed from shapes (an estimate, not a
    measurement): both KV caches, and the workspace's per-image buffers (logits of a verification, draft
    distributions and races, records, attention masks of the per-image caches, captured rows)."""
    rows, images, vocab = sampling.rows * batch, target.image_tokens, target.vocab_size
    slots = target.prefix_length + images + tree.size
    nodes, window = tree.size + 1, tree.depth + 1
    wide = acceptance_dtype(target.device).itemsize
    caches = cache_bytes_per_slot(target) * rows * slots
    if tree.size and tree.needs_drafter and drafter is not None:
        caches += cache_bytes_per_slot(drafter) * rows * slots
    per_image = (sampling.rows * nodes * vocab * 4  # logits
                 + nodes * vocab * (wide * 3 + 4)  # p, its residuals, q
                 + (sum(len(level["distinct"]) for level in tree.level_draws) * vocab * 4)  # races
                 + images * 8 * (4 * nodes + 3 * window + 8)  # records (about)
                 + sampling.rows * nodes * slots * 5  # a forward's attention mask (bool, then additive)
                 + (2 * images * window * vocab * 4 if capture else 0))
    return {"caches": caches, "buffers": per_image * batch, "total": caches + per_image * batch}


def check_batch_memory(target: Target, drafter: Drafter | None, tree: DraftTree, sampling: SamplingConfig,
                       batch: int, capture: bool = False) -> dict[str, int]:
    """:func:`batch_memory`, refused in one line when it exceeds what the device has free (with the largest
    batch that would fit); else the estimate and what is available."""
    need = batch_memory(target, drafter, tree, sampling, batch, capture)
    free = available_memory(target.device)
    if need["total"] > free:
        fits = int(batch * free / need["total"])
        raise ValueError(f"a batch of {batch} images needs about {gigabytes(need['total'])} on {target.device} "
                         f"({gigabytes(need['caches'])} of KV caches), only {gigabytes(free)} is free"
                         + (f": use a batch of at most {fits}" if fits else ""))
    return {**need, "available": free}


def new_stats(rule: AcceptanceRule, tree: DraftTree, sampling: SamplingConfig, condition: Any, seed: int,
              batch: int) -> GenerationStats:
    info = describe(condition)
    return GenerationStats(method=rule.name, params=rule.params(), draft=tree.name, tree_depth=tree.depth,
                           class_id=info.get("class_id"), seed=seed, sampling=sampling.to_dict(),
                           omegas=[rule.omega(d) for d in range(1, tree.depth + 1)], condition=info, batch=batch)


@torch.inference_mode()
def decode_batch(target: Target, drafter: Drafter | None, conditions: Sequence[Any], rule: AcceptanceRule,
                 tree: DraftTree, sampling: SamplingConfig, seeds: Sequence[int], capture: bool = False,
                 runner: PhaseRunner = EAGER, watch: Watch | None = None) -> list[Generation]:
    """Generate one image per (condition, seed), all in lockstep rounds (spec section 9): image ``b``'s tokens
    are those of decoding it alone with ``seeds[b]``. ``tree`` empty (or a rule that does not draft, AR) =
    vanilla AR: one token per target forward. ``runner`` runs the round's phases (eagerly, or as CUDA graphs).
    ``watch``: a live view, shown the images so far between rounds. Every image's statistics carry the batch's
    timings, and the end of each of its rounds."""
    tree = tree if rule.drafts else EMPTY
    if tree.size and tree.needs_drafter and drafter is None:
        raise ValueError("this model has no drafter: only method 'ar' or a Jacobi draft (e.g. jacobi:16) is available")
    batch = check_batch(conditions, seeds)
    if batch > 1:  # before anything else: a batch far too large is refused at once
        check_batch_memory(target, drafter, tree, sampling, batch, capture)
    seeds = [check("seed", seed, high=2**63 - 1) for seed in seeds]
    stats = [new_stats(rule, tree, sampling, c, s, batch) for c, s in zip(conditions, seeds)]
    with runner.generation():  # a runner that keeps workspaces shares its models' caches: one batch at a time
        ws = runner.workspace((id(target), id(drafter), repr(rule), tree, sampling, capture, batch),
                              lambda: Workspace(target, drafter, rule, tree, sampling, capture, batch))
        began = time.perf_counter()
        ws.reset(seeds)
        ws.timer = Timer(events=ws.device.type == "cuda")
        prefill(ws, conditions)
        ws.timer.tick()  # the prefill's first token is round 0

        def peek(levels_run: list[int]) -> None:
            if watch.due():
                shown = time.perf_counter()
                watch.show(snapshot(ws, [new_stats(rule, tree, sampling, c, s, batch) for c, s in zip(conditions, seeds)],
                                    levels_run))
                watch.last = time.perf_counter()
                ws.timer.excluded += watch.last - shown

        levels_run = run_rounds(ws, runner, peek if watch is not None else None)
        phases = ws.timer.finish()  # on CUDA: the one wait for the device's timing events
        tokens = read_back(ws, stats, levels_run)
    seconds = dict(phases, total=time.perf_counter() - began - ws.timer.excluded)
    seconds["other"] = seconds["total"] - sum(phases.values())
    for image_stats in stats:
        image_stats.seconds = dict(seconds)
        image_stats.round_ends = ws.timer.round_ends[:image_stats.target_forwards]
    return [Generation(image_tokens, image_stats) for image_tokens, image_stats in zip(tokens, stats)]


def decode(target: Target, drafter: Drafter | None, condition: Any, rule: AcceptanceRule, tree: DraftTree,
           sampling: SamplingConfig, seed: int, capture: bool = False, runner: PhaseRunner = EAGER,
           watch: Watch | None = None) -> Generation:
    """Generate one image's tokens: :func:`decode_batch` of one."""
    return decode_batch(target, drafter, [condition], rule, tree, sampling, [seed], capture, runner, watch)[0]


def generate_batch(bundle, conditions: Sequence[Any], rule: AcceptanceRule, draft: DraftTree | None = None,
                   sampling: SamplingConfig | None = None, seeds: Sequence[int] = (0,),
                   capture: bool = False, watch: Watch | None = None) -> list[Generation]:
    """Images' tokens and statistics from a model bundle (anything with ``target``, ``drafter``, a default
    ``sampling`` and a phase ``runner``): one per (condition, seed) pair, decoded together in lockstep rounds
    (``conditions``: class ids, or a model's condition objects), with an acceptance ``rule`` object, a ``draft``
    tree (ignored by rules that do not draft) and ``sampling`` (default: the bundle's)."""
    return decode_batch(bundle.target, bundle.drafter, conditions, rule, draft or EMPTY, sampling or bundle.sampling,
                        seeds, capture=capture, runner=getattr(bundle, "runner", EAGER), watch=watch)


def generate(bundle, condition: Any, rule: AcceptanceRule, draft: DraftTree | None = None,
             sampling: SamplingConfig | None = None, seed: int = 0, capture: bool = False,
             watch: Watch | None = None) -> Generation:
    """One image's tokens and statistics from a model bundle: :func:`generate_batch` of one."""
    return generate_batch(bundle, [condition], rule, draft, sampling, [seed], capture, watch)[0]


__all__ = ["EMPTY", "Generation", "Watch", "Workspace", "accept", "batch_memory", "check_batch_memory", "decode",
           "decode_batch", "draft_phase", "draw", "generate", "generate_batch", "prefill", "score", "verify_phase",
           "walk"]
