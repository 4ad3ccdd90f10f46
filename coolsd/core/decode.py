"""The decoding loop: one engine for vanilla AR (the empty draft), chain and static-tree speculative decoding.

A round (spec section 1): ``draft`` (the drafter proposes a tree), ``score`` (the target scores root + tree in
one forward), ``verify`` (walk the tree with the acceptance rule), ``commit`` (the caches keep the accepted
path). Models are used only through :mod:`coolsd.core.interface`; positions follow from the prefix length P.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .interface import Drafter, Target
from .params import check
from .rules import AcceptanceRule
from .sampling import SamplingConfig, draw_without_replacement, probabilities, sample
from .stats import DRAFT, FIRST, GenerationStats, Round, Timer
from .transfer import index_tensor
from .trees import DraftTree
from .verify import verify

EMPTY = DraftTree((), "none")


@dataclass
class Generation:
    tokens: list[int]
    stats: GenerationStats


@dataclass
class State:
    """What one round hands to the next: the image so far, and the (input, feature) pairs the drafter has not
    seen yet: the target's features at those slots, the tokens that follow them and, after the prefill, the
    prefix inputs that precede the first token (``lead``, none when P is 1)."""

    tokens: list[int]
    pending_tokens: list[int]
    pending_features: Tensor
    lead: Tensor | None = None


def causal(length: int, device: torch.device) -> Tensor | None:
    """The pending-area mask of ``length`` positions in a row (None for one: it sees everything)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril() if length > 1 else None


def token_inputs(drafter: Drafter, tokens: list[int], rows: int, device: torch.device) -> Tensor:
    """The drafter's next-input embeddings of committed tokens, the same for every row."""
    return drafter.embed(index_tensor(tokens, device))[None].expand(rows, -1, -1)


def draft(drafter: Drafter, target: Target, cache, tree: DraftTree, state: State, sampling: SamplingConfig,
          generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Catch the drafter up on the pending (input, target feature) pairs, then draft the tree depth by depth
    from its own predicted features. Returns, per node 0..M (0 = root): tokens, validity, the draft
    distribution its children were drawn from (M+1, V; unset at leaves) and its predicted feature (left unset
    at the deepest level, which is never fed back)."""
    pending = state.pending_features
    device, rows = pending.device, pending.shape[0]
    inputs = token_inputs(drafter, state.pending_tokens, rows, device)
    if state.lead is not None:
        inputs = torch.cat([state.lead, inputs], dim=1)
    index = tree.tensors(device)
    start, count = cache.length, inputs.shape[1]
    out = drafter(inputs, pending, torch.arange(start, start + count, device=device), cache, 0,
                  causal(count, device))
    cache.commit(list(range(count)))

    features = out.new_empty(rows, tree.size + 1, out.shape[-1])
    features[:, 0] = out[:, -1]
    tokens = torch.zeros(tree.size + 1, dtype=torch.long, device=device)
    valid = torch.ones(tree.size + 1, dtype=torch.bool, device=device)
    q = torch.empty(tree.size + 1, target.vocab_size, device=device)  # only inner rows are written and read
    for depth, level in enumerate(index["levels"], start=1):
        nodes = tree.levels[depth]
        q_level = probabilities(target.logits(features[:, level["distinct"]]), sampling)
        q[level["distinct"]] = q_level
        drawn, drawn_valid = draw_without_replacement(q_level, level["width"], generator)
        tokens[nodes.start:nodes.stop] = drawn.flatten()[level["drawn"]]
        valid[nodes.start:nodes.stop] = drawn_valid.flatten()[level["drawn"]] & valid[level["parents"]]
        if depth < tree.depth:
            embeds = drafter.embed(tokens[nodes.start:nodes.stop])[None].expand(rows, -1, -1)
            positions = torch.full((len(nodes),), start + count + depth - 1, device=device)
            mask = None if level["sees_all"] else index["mask"][nodes.start:nodes.stop, 1:nodes.stop]
            features[:, nodes.start:nodes.stop] = drafter(embeds, features[:, level["parents"]], positions, cache,
                                                          nodes.start - 1, mask)
    return tokens, valid, q, features


def to_numpy(probs: Tensor) -> np.ndarray:
    """float64 rows, renormalised, for the exact acceptance arithmetic."""
    rows = probs.double().cpu().numpy()
    totals = rows.sum(axis=-1, keepdims=True)
    return np.divide(rows, totals, out=rows, where=totals > 0)  # rows never filled (leaves) stay zero


class HostRows:
    """Distribution rows copied to the host in float32, each turned into renormalised float64 (as
    :func:`to_numpy`) only when the acceptance walk first reads it: a round reads few of a tree's rows."""

    def __init__(self, rows: np.ndarray, nodes: list[int]) -> None:
        self.rows, self.where, self.ready = rows, {node: i for i, node in enumerate(nodes)}, {}

    def __getitem__(self, node: int) -> np.ndarray:
        if node not in self.ready:
            row = self.rows[self.where[node]].astype(np.float64)
            total = row.sum()
            self.ready[node] = row / total if total > 0 else row
        return self.ready[node]


def to_host(p: Tensor, q: Tensor | None, tokens: Tensor, valid: Tensor, tree: DraftTree
            ) -> tuple[HostRows, HostRows | None, list[int], list[bool]]:
    """Everything the acceptance walk needs, in ONE device-to-host copy per round: the target rows of the root
    and every node, the draft rows of the nodes that have children, and the drafted tokens and their validity
    (token ids are exact in float32 below 2**24)."""
    if p.shape[-1] > 2**24:
        raise ValueError(f"a vocabulary of {p.shape[-1]} tokens does not fit the float32 copy of drafted tokens")
    inner = tree.inner_nodes
    parts = [p.flatten(), tokens.float(), valid.float()]
    if q is not None:
        parts.insert(1, q[tree.tensors(q.device)["inner"]].flatten())
    packed = torch.cat(parts).cpu().numpy()
    vocab, nodes = p.shape[-1], tree.size + 1
    p_end = nodes * vocab
    q_end = p_end + len(inner) * vocab if q is not None else p_end
    p_rows = HostRows(packed[:p_end].reshape(nodes, vocab), list(range(nodes)))
    q_rows = HostRows(packed[p_end:q_end].reshape(len(inner), vocab), inner) if q is not None else None
    drafted = packed[q_end:q_end + nodes].astype(np.int64).tolist()
    return p_rows, q_rows, drafted, (packed[q_end + nodes:] > 0).tolist()


@dataclass
class Run:
    """Everything one generation's steps share."""

    target: Target
    drafter: Drafter | None
    rule: AcceptanceRule
    tree: DraftTree
    sampling: SamplingConfig
    rng: np.random.Generator
    generator: torch.Generator
    timer: Timer
    stats: GenerationStats
    target_cache: Any
    drafter_cache: Any
    capture: list | None


def prefill(run: Run, condition: Any) -> State:
    """Score the condition's P prefix positions and sample the first image token from the last one. The
    drafter's first pairs are the prefix slots: slot s pairs the target's feature at s with the next input (the
    prefix's embedding at s + 1, and the first token's after the last slot)."""
    target, device, rows = run.target, run.generator.device, run.sampling.rows
    with run.timer.phase("target_forward"):
        prefix = target.prefix(condition, rows)
        length = prefix.length
        hidden = target(prefix.embeds, torch.arange(length, device=device), run.target_cache, 0,
                        causal(length, device), prefix.valid)
        run.target_cache.commit(list(range(length)))
        logits = target.logits(hidden[:, -1:])
    with run.timer.phase("acceptance"):
        token = sample(to_numpy(probabilities(logits, run.sampling))[0], run.rng)
    run.stats.rounds.append(Round(0, [], [], [], {}, [token], FIRST))
    run.stats.emit(FIRST)
    lead = run.drafter.lead_inputs(prefix.embeds) if run.tree.size and length > 1 else None
    return State([token], [token], hidden, lead)  # the image so far: extended in place by each round


def decode_round(run: Run, state: State) -> State:
    """One round: draft, score root + tree in one target forward, verify, commit the accepted path."""
    target, device, rows = run.target, run.generator.device, run.sampling.rows
    n = len(state.tokens)
    tree = run.tree.truncated(target.image_tokens - n - 1)
    index = tree.tensors(device)
    root = index_tensor([state.tokens[-1]], device)
    node_tokens, node_valid, q = root, torch.ones(1, dtype=torch.bool, device=device), None
    if tree.size:
        with run.timer.phase("drafting"):
            node_tokens, node_valid, q, _ = draft(run.drafter, target, run.drafter_cache, tree, state, run.sampling,
                                                  run.generator)
            node_tokens[:1] = root  # a device-to-device copy: setting a Python int would wait for the GPU
        run.stats.drafter_forwards += tree.depth
    with run.timer.phase("target_forward"):  # score: the root is image token n-1, at position P + n - 1
        embeds = target.embed(node_tokens)[None].expand(rows, -1, -1)
        positions = target.prefix_length - 1 + n + index["depths"]
        hidden = target(embeds, positions, run.target_cache, 0, index["mask"] if tree.size else None)
        logits = target.logits(hidden)
    with run.timer.phase("acceptance"):
        p = probabilities(logits, run.sampling)
        p_rows, q_rows, drafted, valid = to_host(p, q, node_tokens, node_valid, tree)
        path, token, origin, tested, level_prob = verify(tree, drafted, valid, p_rows, q_rows, run.rule, run.rng,
                                                         run.capture)
    keep = [0] + path
    run.target_cache.commit(keep)
    # a chain (and a tree along first children) keeps a prefix of the pending area: a slice, no index to copy
    keep_index = slice(0, len(keep)) if keep == list(range(len(keep))) else index_tensor(keep, device)
    emitted = [drafted[i] for i in path] + [token]
    record(run.stats, tree, drafted, valid, path, emitted, origin, tested, level_prob, n)
    state.tokens.extend(emitted)
    return State(state.tokens, emitted, hidden[:, keep_index])


def record(stats: GenerationStats, tree: DraftTree, drafted: list[int], valid: list[bool], path: list[int],
           emitted: list[int], origin: str, tested: list, level_prob: dict, start: int) -> None:
    """Bookkeeping of one round: each emitted token's origin, depth and acceptance probability, and the round."""
    probs_by_node = {c.node: c.accept_prob for c in tested}
    for i in path:
        stats.emit(DRAFT, tree.depths[i], probs_by_node[i])
    stats.emit(origin)
    stats.rounds.append(Round(start, drafted[1:], valid[1:], tested, level_prob, emitted, origin))


def describe(condition: Any) -> dict:
    """The condition as the statistics record it (a bare class id counts as a class label)."""
    return condition.describe() if hasattr(condition, "describe") else {"class_id": condition}


@torch.inference_mode()
def decode(target: Target, drafter: Drafter | None, condition: Any, rule: AcceptanceRule, tree: DraftTree,
           sampling: SamplingConfig, seed: int, capture: bool = False) -> Generation:
    """Generate one image's tokens. ``tree`` empty (or a rule that does not draft, AR) = vanilla AR: one
    token per target forward."""
    tree = tree if rule.drafts else EMPTY
    if tree.size and drafter is None:
        raise ValueError("this model has no drafter: only method 'ar' is available")
    device = target.device
    condition_info = describe(condition)
    stats = GenerationStats(method=rule.name, params=rule.params(), draft=tree.name, tree_depth=tree.depth,
                            class_id=condition_info.get("class_id"), seed=seed, sampling=sampling.to_dict(),
                            omegas=[rule.omega(d) for d in range(1, tree.depth + 1)], condition=condition_info)
    max_len = target.prefix_length + target.image_tokens + tree.size
    run = Run(target, drafter, rule, tree, sampling, np.random.default_rng(seed),
              torch.Generator(device=device).manual_seed(seed),
              Timer(events=device.type == "cuda"), stats,
              target.new_cache(sampling.rows, max_len),
              drafter.new_cache(sampling.rows, max_len) if tree.size else None,
              stats.captured if capture else None)
    began = time.perf_counter()
    state = prefill(run, condition)
    while len(state.tokens) < target.image_tokens:
        state = decode_round(run, state)
    phases = run.timer.finish()  # on CUDA: the one wait for the device, after the last round
    stats.seconds = dict(phases, total=time.perf_counter() - began)
    stats.seconds["other"] = stats.seconds["total"] - sum(run.timer.seconds.values())
    return Generation(state.tokens, stats)


def generate(bundle, condition: Any, rule: AcceptanceRule, draft: DraftTree | None = None,
             sampling: SamplingConfig | None = None, seed: int = 0, capture: bool = False) -> Generation:
    """One image's tokens and statistics from a model bundle (anything with ``target``, ``drafter`` and a
    default ``sampling``): ``condition`` (a class id, or a model's condition object), an acceptance ``rule``
    object, a ``draft`` tree (ignored by rules that do not draft), ``sampling`` (default: the bundle's)."""
    seed = check("seed", seed, high=2**63 - 1)
    return decode(bundle.target, bundle.drafter, condition, rule, draft or EMPTY, sampling or bundle.sampling, seed,
                  capture=capture)


__all__ = ["EMPTY", "Generation", "decode", "draft", "generate", "prefill", "decode_round", "verify"]
