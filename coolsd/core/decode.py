"""The decoding loop: one engine for vanilla AR (the empty draft), chain and static-tree speculative decoding.

A round (spec section 1) has two phases. ``draft_phase``: the drafter catches up on the pairs the last round
kept, then drafts the tree level by level. ``verify_phase``: the target scores root + tree in one forward, the
acceptance walk keeps a path (:func:`coolsd.core.verify.walk`), and the caches commit it. Both read and write
the fixed buffers of a :class:`Workspace` on the device and read nothing back to the host, so a phase can be
captured once as a CUDA graph and replayed (:mod:`coolsd.core.graphs`). The host enqueues the rounds it knows
the image needs (each emits at most depth + 1 tokens), then reads how far the image got; the tokens and every
round's statistics come back in one copy at the end. Models are used only through :mod:`coolsd.core.interface`.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .graphs import EAGER, PhaseRunner
from .interface import Drafter, Target
from .params import check
from .rules import AcceptanceRule
from .sampling import SamplingConfig, draw_without_replacement, probabilities, sample
from .stats import FIRST, RECORD_GROUPS, GenerationStats, Round, Timer, add_rounds, record_widths
from .trees import DraftTree
from .verify import TARGET_CODE, Verdict, distributions, walk

EMPTY = DraftTree((), "none")


@dataclass
class Generation:
    tokens: list[int]
    stats: GenerationStats


def acceptance_dtype(device: torch.device) -> torch.dtype:
    """float64 on a CPU (the exactness tests hold to rounding); float32 on CUDA, where float64 is slow."""
    return torch.float64 if device.type == "cpu" else torch.float32


def causal(length: int, device: torch.device) -> Tensor | None:
    """The pending-area mask of ``length`` positions in a row (None for one: it sees everything)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril() if length > 1 else None


class Workspace:
    """The fixed buffers one kind of generation (models, rule, draft tree, sampling) reads and writes on the
    device. A phase only writes into them in place, so a captured graph of it stays valid for every image."""

    def __init__(self, target: Target, drafter: Drafter | None, rule: AcceptanceRule, tree: DraftTree,
                 sampling: SamplingConfig, capture: bool = False) -> None:
        self.target, self.drafter, self.rule, self.tree, self.sampling = target, drafter, rule, tree, sampling
        device, rows, self.rows = target.device, sampling.rows, sampling.rows
        nodes, window, images = tree.size + 1, tree.depth + 1, target.image_tokens
        self.device, self.dtype = device, acceptance_dtype(device)
        self.index = tree.tensors(device, self.dtype)
        rules = getattr(target, "position_rules", None)  # constrained positions (spec section 8), or None
        self.rules = rules.padded(window + 1, device) if rules is not None else None
        self.last_position = target.prefix_length + images - 1  # positions past the image are clamped (unused)
        max_len = target.prefix_length + images + tree.size
        self.target_cache = target.new_cache(rows, max_len)
        self.drafter_cache = drafter.new_cache(rows, max_len) if tree.size else None
        self.generator = torch.Generator(device=device)
        self.timer = Timer(events=device.type == "cuda")
        self.tokens = torch.zeros(images + window, dtype=torch.long, device=device)  # the image, then scratch
        self.n = torch.zeros((), dtype=torch.long, device=device)  # tokens emitted so far
        self.rounds = torch.zeros((), dtype=torch.long, device=device)
        self.round_index = self.rounds.view(1)  # the records' row of this round
        # the drafted tree, with the walk's leading batch dimension: tokens, validity, draft distributions
        self.node_tokens = torch.zeros(1, nodes, dtype=torch.long, device=device)
        self.node_valid = torch.ones(1, nodes, dtype=torch.bool, device=device)
        # one per inner node, in the acceptance dtype (drafting's float32 rows are converted as they are stored)
        self.q = torch.zeros(1, len(tree.inner_nodes), target.vocab_size, dtype=self.dtype, device=device)
        # the (input, feature) pairs the drafter has not seen: the last round's kept nodes and emitted tokens
        self.pending_count = torch.zeros((), dtype=torch.long, device=device)
        self.pending_tokens = torch.zeros(window, dtype=torch.long, device=device)
        self.pending_features: Tensor | None = None  # (rows, window, dim), made by the first prefill
        self.node_features: Tensor | None = None  # (rows, nodes, dim): the drafter's predicted feature per node
        self.hidden = self.logits = None  # the last verification forward's features and logits
        widths = record_widths(nodes, len(tree.inner_nodes), tree.depth)
        self.records = torch.zeros(images, sum(widths.values()), dtype=torch.float64, device=device)
        self.row = torch.zeros(1, self.records.shape[1], dtype=torch.float64, device=device)  # this round's record
        bounds = dict(zip(widths, np.cumsum([0, *widths.values()])))
        self.groups = [record_view(self.row, bounds[group[0]], len(group), widths[group[0]])
                       for group in RECORD_GROUPS]  # each group's fields, shaped as the round writes them
        if not tree.size:  # an AR step's record: one kept root, its token drawn from the target
            for name, value in (("count", 1), ("origin", TARGET_CODE), ("valid", 1), ("on_path", 1)):
                self.row[:, bounds[name]].fill_(value)
        self.n_view = self.n.view(1)
        shape = (images, window, target.vocab_size)
        self.captured = (torch.zeros(shape, device=device), torch.zeros(shape, device=device)) if capture else None
        self.window_mask = causal(window, device)
        self.window_range = torch.arange(window, device=device)

    def reset(self, seed: int) -> None:
        """A new image: empty caches, the generator seeded, counters at zero (buffers kept, in place)."""
        for cache in (self.target_cache, self.drafter_cache):
            if cache is not None:
                cache.reset()
        self.generator.manual_seed(seed)
        self.n.zero_()
        self.rounds.zero_()

    def feature_buffers(self, like: Tensor) -> None:
        """The feature buffers, made once from a first hidden state (rows, T, dim) of the target's dtype."""
        if self.pending_features is None:
            self.pending_features = like.new_zeros(self.rows, self.tree.depth + 1, like.shape[-1])
            self.node_features = like.new_zeros(self.rows, self.tree.size + 1, like.shape[-1])

    def uniforms(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self.generator, dtype=self.dtype, device=self.device)

    def allowed(self, offsets: Tensor) -> Tensor | None:
        """(T, V): what generated positions ``n + offsets`` allow, for a constrained model; else None."""
        return self.rules.allowed_at(self.n + offsets) if self.rules is not None else None


def prefill(ws: Workspace, condition: Any) -> None:
    """Score the condition's P prefix positions and draw the first image token from the last one. The drafter
    sees the prefix pairs but the last: slot s pairs the target's feature at s with the next input (the prefix's
    embedding at s + 1); slot P - 1 pairs with the first token and is the first round's catch-up."""
    target, device, rows = ws.target, ws.device, ws.rows
    with ws.timer.phase("target_forward"):
        prefix = target.prefix(condition, rows)
        length = prefix.length
        hidden = target(prefix.embeds, torch.arange(length, device=device), ws.target_cache, 0,
                        causal(length, device), prefix.valid)
        ws.target_cache.commit(None, length)
        logits = target.logits(hidden[:, -1:])
    with ws.timer.phase("acceptance"):
        first_probs = probabilities(logits, ws.sampling, ws.allowed(ws.window_range[:1]))  # n is 0
        first = sample(distributions(first_probs.to(ws.dtype)), ws.uniforms(1))
        ws.tokens[:1] = first
        ws.n.fill_(1)
    if ws.drafter_cache is None:
        return
    with ws.timer.phase("drafting"):
        if length > 1:
            lead = ws.drafter.lead_inputs(prefix.embeds)
            ws.drafter(lead, hidden[:, :-1], torch.arange(length - 1, device=device), ws.drafter_cache, 0,
                       causal(length - 1, device))
            ws.drafter_cache.commit(None, length - 1)
        ws.feature_buffers(hidden)
        ws.pending_features[:, :1] = hidden[:, -1:]
        ws.pending_tokens[:1] = first
        ws.pending_count.fill_(1)


def draft_phase(ws: Workspace, levels: int | None = None) -> None:
    """Catch the drafter up on the pending (input, target feature) pairs (a fixed window, the first
    ``pending_count`` real), then draft the tree depth by depth from its own predicted features: per node the
    token, its validity and (at inner nodes) the draft distribution its children are drawn from. ``levels``
    (default: every one) stops early where the image surely ends sooner; the deeper nodes are then invalid."""
    with ws.timer.phase("drafting"):
        draft_tree(ws, ws.tree.depth if levels is None else levels)


def draft_tree(ws: Workspace, levels: int) -> None:
    drafter, target, tree, index, rows = ws.drafter, ws.target, ws.tree, ws.index, ws.rows
    cache, count = ws.drafter_cache, ws.pending_count
    root_position = ws.n + (target.prefix_length - 1)  # the root: the last emitted token, not yet in any cache
    inputs = drafter.embed(ws.pending_tokens)[None].expand(rows, -1, -1)
    positions = (root_position - count + ws.window_range).clamp_max(ws.last_position)
    out = drafter(inputs, ws.pending_features, positions, cache, 0, ws.window_mask)
    cache.commit(None, count)

    features = ws.node_features
    features[:, :1] = out.index_select(1, (count - 1).reshape(1))
    level_positions = (root_position + ws.window_range[:levels]).clamp_max(ws.last_position)  # depth d: root + d - 1
    level_allowed = ws.allowed(ws.window_range[:levels])  # depth d's tokens: generated position n + d - 1
    tokens, valid = ws.node_tokens[0], ws.node_valid[0]
    for depth, level in enumerate(index["levels"][:levels], start=1):
        nodes = tree.levels[depth]
        allowed = level_allowed[depth - 1:depth] if level_allowed is not None else None
        q_level = probabilities(target.logits(features[:, level["distinct"]]), ws.sampling, allowed)
        ws.q[0, level["distinct_inner"]] = q_level
        drawn, drawn_valid = draw_without_replacement(q_level, level["width"], ws.generator)
        tokens[nodes.start:nodes.stop] = drawn.flatten()[level["drawn"]]
        valid[nodes.start:nodes.stop] = drawn_valid.flatten()[level["drawn"]] & valid[level["parents"]]
        if depth < levels:
            embeds = drafter.embed(tokens[nodes.start:nodes.stop])[None].expand(rows, -1, -1)
            positions = level_positions[depth - 1:depth].expand(len(nodes))
            mask = None if level["sees_all"] else index["mask"][nodes.start:nodes.stop, 1:nodes.stop]
            features[:, nodes.start:nodes.stop] = drafter(embeds, features[:, level["parents"]], positions, cache,
                                                          nodes.start - 1, mask)
    if levels < tree.depth:
        valid[tree.levels[levels + 1].start:] = False


def verify_phase(ws: Workspace) -> None:
    """Score root + tree in one target forward, then walk it with the rule and commit what it kept."""
    score(ws)
    accept(ws)


def score(ws: Workspace) -> None:
    """The target's forward over root + tree (the root: image token n - 1, at position P + n - 1): its
    features and logits, kept in the workspace for :func:`accept`."""
    target, tree, index = ws.target, ws.tree, ws.index
    with ws.timer.phase("target_forward"):
        ws.node_tokens[:, :1].copy_(ws.tokens.index_select(0, ws.n_view - 1))  # the root: the last emitted token
        embeds = target.embed(ws.node_tokens).expand(ws.rows, -1, -1)
        positions = (ws.n + target.prefix_length - 1 + index["depths"]).clamp_max(ws.last_position)
        ws.hidden = target(embeds, positions, ws.target_cache, 0, index["mask"] if tree.size else None)
        ws.logits = target.logits(ws.hidden)


def accept(ws: Workspace) -> None:
    """Walk the scored tree with the rule, then commit: the kept path's keys in the target cache, the emitted
    tokens, the next catch-up's pairs, and the round's record."""
    tree, index = ws.tree, ws.index
    with ws.timer.phase("acceptance"):
        p = probabilities(ws.logits, ws.sampling, ws.allowed(index["depths"]))[None].to(ws.dtype)
        valid = ws.node_valid & (index["depths"] < ws.target.image_tokens - ws.n)  # nothing past the image's end
        if tree.size:
            p, q = distributions(p), distributions(ws.q)
        verdict = walk(index, ws.node_tokens, valid, p, q if tree.size else p, ws.rule,
                       ws.uniforms(1, tree.size + 2))
        keep, count = verdict.keep[0], verdict.count[0]
        ws.target_cache.commit(None if tree.is_chain else keep, count)
        record(ws, verdict, valid)
        if ws.captured is not None:  # the (p, q) rows at each kept node (q: its row among the inner nodes)
            for buffer, rows in zip(ws.captured, (p[:, keep], q[:, index["inner_row"][keep]])):
                buffer.index_copy_(0, ws.round_index, rows.float())
        ws.tokens.index_copy_(0, ws.n + ws.window_range, verdict.emitted[0])
        if ws.drafter_cache is not None:
            hidden = ws.hidden
            ws.pending_features.copy_(hidden[:, :tree.depth + 1] if tree.is_chain else hidden.index_select(1, keep))
            ws.pending_tokens.copy_(verdict.emitted[0])
            ws.pending_count.copy_(count)
        ws.n.add_(count)
        ws.rounds.add_(1)


def record_view(row: Tensor, start: int, fields: int, width: int) -> Tensor:
    """The part of the record row (1, W) where ``fields`` fields of ``width`` start at ``start``: (1, width) for
    one field, (1, fields) for several scalars, else (1, fields, width)."""
    part = row[:, start:start + fields * width]
    return part if fields == 1 or width == 1 else part.view(1, fields, width)


def record(ws: Workspace, verdict: Verdict, valid: Tensor) -> None:
    """This round's record into its row of ``ws.records``, group by group (RECORD_GROUPS); an AR step writes its
    start and token (its other fields are constants, set once)."""
    if ws.tree.size:
        groups = (torch.stack([ws.n_view, verdict.count, verdict.origin], 1), verdict.emitted, ws.node_tokens,
                  torch.stack([valid, verdict.accepted, verdict.tested, verdict.on_path], 1),
                  torch.stack([verdict.accept_prob, verdict.cost], 1), verdict.level_prob)
        for view, value in zip(ws.groups, groups):
            view.copy_(value)
    else:
        ws.groups[0][:, :1].copy_(ws.n_view)
        ws.groups[1].copy_(verdict.emitted)
    ws.records.index_copy_(0, ws.round_index, ws.row)


def rounds_needed(remaining: int, depth: int) -> int:
    """Rounds the image surely still needs: each emits at most ``depth + 1`` tokens (fewer near the end)."""
    return math.ceil(remaining / (depth + 1))


def run_rounds(ws: Workspace, runner: PhaseRunner) -> tuple[int, int]:
    """Enqueue rounds until the image is done, reading its length only once the known-needed rounds are queued
    (the one host read between rounds; on CUDA it waits for them). Each round emits at least one token, so the
    host knows a lower bound on the length, and drafts no deeper than the image can still use (a captured
    drafting phase per depth). Returns the rounds and the drafter levels run."""
    images, depth = ws.target.image_tokens, ws.tree.depth
    done, levels_run, emitted = 0, 0, 1
    while emitted < images:
        batch = rounds_needed(images - emitted, depth)
        for at_least in range(emitted, emitted + batch):
            levels = min(depth, images - at_least - 1)
            if levels > 0:
                runner.run(ws, f"drafting:{levels}", functools.partial(draft_phase, levels=levels))
                levels_run += levels
            runner.run(ws, "verification", verify_phase)
        done += batch
        emitted = int(ws.n)
    return done, levels_run


def read_back(ws: Workspace, stats: GenerationStats, rounds: int, levels: int) -> list[int]:
    """The image's tokens and every round's statistics, copied from the device once."""
    records = ws.records[:rounds].cpu().numpy()
    tokens = ws.tokens[:ws.target.image_tokens].tolist()
    captured = tuple(buffer[:rounds].cpu().numpy() for buffer in ws.captured) if ws.captured is not None else None
    stats.rounds.append(Round(0, [], [], [], {}, tokens[:1], FIRST))
    stats.emit(FIRST)
    add_rounds(stats, records, ws.tree, captured)
    stats.drafter_forwards = levels
    return tokens


def describe(condition: Any) -> dict:
    """The condition as the statistics record it (a bare class id counts as a class label)."""
    return condition.describe() if hasattr(condition, "describe") else {"class_id": condition}


@torch.inference_mode()
def decode(target: Target, drafter: Drafter | None, condition: Any, rule: AcceptanceRule, tree: DraftTree,
           sampling: SamplingConfig, seed: int, capture: bool = False, runner: PhaseRunner = EAGER) -> Generation:
    """Generate one image's tokens. ``tree`` empty (or a rule that does not draft, AR) = vanilla AR: one
    token per target forward. ``runner`` runs the round's phases (eagerly, or as CUDA graphs)."""
    tree = tree if rule.drafts else EMPTY
    if tree.size and drafter is None:
        raise ValueError("this model has no drafter: only method 'ar' is available")
    condition_info = describe(condition)
    stats = GenerationStats(method=rule.name, params=rule.params(), draft=tree.name, tree_depth=tree.depth,
                            class_id=condition_info.get("class_id"), seed=seed, sampling=sampling.to_dict(),
                            omegas=[rule.omega(d) for d in range(1, tree.depth + 1)], condition=condition_info)
    with runner.generation():  # a runner that keeps workspaces shares its models' caches: one image at a time
        ws = runner.workspace((id(target), id(drafter), repr(rule), tree, sampling, capture),
                              lambda: Workspace(target, drafter, rule, tree, sampling, capture))
        began = time.perf_counter()
        ws.reset(seed)
        ws.timer = Timer(events=ws.device.type == "cuda")
        prefill(ws, condition)
        rounds, levels = run_rounds(ws, runner)
        phases = ws.timer.finish()  # on CUDA: the one wait for the device's timing events
        tokens = read_back(ws, stats, rounds, levels)
    stats.seconds = dict(phases, total=time.perf_counter() - began)
    stats.seconds["other"] = stats.seconds["total"] - sum(phases.values())
    return Generation(tokens, stats)


def generate(bundle, condition: Any, rule: AcceptanceRule, draft: DraftTree | None = None,
             sampling: SamplingConfig | None = None, seed: int = 0, capture: bool = False) -> Generation:
    """One image's tokens and statistics from a model bundle (anything with ``target``, ``drafter``, a default
    ``sampling`` and a phase ``runner``): ``condition`` (a class id, or a model's condition object), an
    acceptance ``rule`` object, a ``draft`` tree (ignored by rules that do not draft), ``sampling`` (default:
    the bundle's)."""
    seed = check("seed", seed, high=2**63 - 1)
    return decode(bundle.target, bundle.drafter, condition, rule, draft or EMPTY, sampling or bundle.sampling, seed,
                  capture=capture, runner=getattr(bundle, "runner", EAGER))


__all__ = ["EMPTY", "Generation", "Workspace", "accept", "decode", "draft_phase", "generate", "prefill", "score",
           "verify_phase", "walk"]
