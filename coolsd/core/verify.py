"""Verification of one round (spec section 3): walk the drafted tree with an acceptance rule, on the device.

Siblings are tried in draw order against the current residual, each with the earlier ones removed from ``q``;
the walk follows the first accepted child, and where none is accepted one token is drawn from the residual (a
bonus token from ``p`` below a node without children). Every node gets its own uniform, so each node's test
is independent of the others; then which nodes are kept follows from the outcomes alone. Everything is
computed for every node at once, in a fixed number of tensor operations that depends on the tree only: no
host read, the same kernels every round (a CUDA graph can hold it). Rows carry a leading batch dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .rules import AcceptanceRule, step_cost
from .sampling import sample

# origin codes of a round's last token (their names: coolsd.core.stats.ORIGINS)
RESAMPLED_CODE, BONUS_CODE, TARGET_CODE = 0, 1, 2


@dataclass
class Verdict:
    """What verification made of a round, per batch row (all on the device). ``N`` = tree nodes + 1 (node 0
    is the root), ``I`` = inner nodes (those with children), ``D`` = tree depth."""

    count: Tensor  # (B,) tokens emitted: accepted drafts + 1
    emitted: Tensor  # (B, D + 1) the accepted drafts' tokens, then the last token (unset past count)
    keep: Tensor  # (B, D + 1) the kept nodes, root first (the pending area's rows to commit; 0 past count)
    origin: Tensor  # (B,) how the last token came: RESAMPLED_CODE, BONUS_CODE or TARGET_CODE
    on_path: Tensor  # (B, N) bool: the root and the accepted nodes
    accept_prob: Tensor  # (B, N + 1) f of each node as a candidate (0 where it is not one; N: a sink)
    accepted: Tensor  # (B, N) bool: its test passed
    tested: Tensor  # (B, N) bool: it was tested (a child of a kept node, up to the first accepted one)
    cost: Tensor  # (B, N + 1) its step's TV cost e = sum [q f - p]_+ (spec section 4; read where tested)
    level_prob: Tensor  # (B, I) P(some child is accepted) at each inner node, given it is reached


@dataclass
class SiblingTests:
    """Every inner node's children tested in draw order, for all inner nodes at once."""

    accept_prob: Tensor  # (B, N + 1)
    cost: Tensor  # (B, N + 1)
    level_prob: Tensor  # (B, I)
    final_law: Tensor  # (B, N, V): per node, the law of a last token drawn there (a residual, or p at a leaf)


def sibling_tests(index: dict, tokens: Tensor, valid: Tensor, p: Tensor, q: Tensor, rule: AcceptanceRule
                  ) -> SiblingTests:
    """Each child's ``f`` and step cost against the residual its earlier siblings left, with ``q`` renormalised
    without them. A node's invalid children come last in draw order (zero-probability draws), so once a rank is
    not live, no later one is: only ``f`` and the final residual need the mask. Ranks where some inner node has
    no child read the sink column N (token 0, never live). A rank's children are a slice where they are a run
    (a chain's), so reading and writing them costs no index kernel."""
    depth, tiny, inner = index["child_depth"], torch.finfo(p.dtype).tiny, index["inner"]
    if index["absent_children"]:
        tokens, valid = torch.cat([tokens, tokens[:, :1]], 1), torch.cat([valid, valid.new_zeros(len(valid), 1)], 1)
    current_p, current_q = p[:, inner], q
    residual = current_p
    accept_prob = p.new_zeros(len(p), p.shape[1] + 1)
    cost = torch.zeros_like(accept_prob)  # a lossless rule's steps cost nothing: left at zero
    ranks = index["rank_children"]
    none_accepted = None
    for rank, child in enumerate(ranks):
        y = tokens[:, child, None]  # (B, I, 1)
        live = valid[:, child]
        mass = rule.accepted_mass(current_p, current_q, depth)
        f = (mass.gather(-1, y) / current_q.gather(-1, y).clamp_min(tiny))[..., 0] * live
        accept_prob[:, child] = f  # absent children all write to the sink N
        if rule.relaxes:
            cost[:, child] = step_cost(current_p, mass)
        if len(ranks) > 1:
            none_accepted = 1 - f if none_accepted is None else none_accepted * (1 - f)
        current_p = rule.residual(current_p, current_q, y[..., 0], depth, mass)
        residual = torch.where(live[..., None], current_p, residual)
        if rank + 1 < len(ranks):
            rest = current_q.scatter(-1, y, 0.0)
            current_q = rest / rest.sum(-1, keepdim=True).clamp_min(tiny)
    final_law = p.index_copy(1, index["inner_index"], residual)
    return SiblingTests(accept_prob, cost, f if len(ranks) == 1 else 1 - none_accepted, final_law)


def walk(index: dict, tokens: Tensor, valid: Tensor, p: Tensor, q: Tensor, rule: AcceptanceRule,
         uniforms: Tensor) -> Verdict:
    """Verify a drafted tree (spec section 3). ``index``: the tree's tensors (``DraftTree.tensors``);
    ``tokens`` (B, N) drafted tokens (node 0: the root); ``valid`` (B, N) which nodes are real drafts;
    ``p`` (B, N, V) the target's distribution after each node; ``q`` (B, I, V) the draft distribution each
    inner node's children were drawn from (inner nodes in node order); ``uniforms`` (B, N + 1) in [0, 1): node i's
    test, then the last token's draw. Rows of ``p`` and ``q`` sum to one (an empty tree: any scale)."""
    if not index["depth"]:  # nothing drafted (AR): one draw from the target
        return target_draw(index, p, uniforms)
    dtype = p.dtype
    tests = sibling_tests(index, tokens, valid, p, q, rule)
    accepted = uniforms < tests.accept_prob  # (B, N + 1); f is 0 wherever a node is not a candidate

    # a child is chosen when accepted with no earlier sibling accepted; a node is kept when every edge from the
    # root down to it was chosen (tree constants as 0/1 matrices: small products, whatever the outcome)
    if index["siblings"]:
        blocked = (accepted.to(dtype) @ index["earlier_siblings"]) > 0
        chosen = accepted & ~blocked
    else:  # no node has an earlier sibling: nothing is blocked
        chosen = accepted
    # on the path: all of its edges chosen (their number is the node's depth)
    on_path = chosen.to(dtype) @ index["path_edges"] == index["depth_of"]  # (B, N)
    # one product with the tree's columns gives, per depth, the kept node and the next depth's, and the count
    window = index["depth"] + 1
    kept = (on_path.to(dtype) @ index["kept_columns"]).long()
    keep, keep_next, count, last = kept[:, :window], kept[:, window:2 * window], kept[:, -2], kept[:, -1:]
    end = keep.amax(-1, keepdim=True)  # the deepest kept node (ids grow with depth)
    final_law = tests.final_law.gather(1, end[..., None].expand(-1, -1, p.shape[-1]))[:, 0]
    final = sample(final_law, uniforms[:, -1])
    emitted = tokens.gather(1, keep_next).scatter_(1, last, final[:, None])  # drafts, then the last token
    # the last token was resampled where the deepest kept node had a valid child (refused), else drawn from p
    refused = (valid.to(dtype) @ index["child_of"]).gather(1, end)[:, 0]
    origin = index["leaf_origin"].index_select(0, end[:, 0]) * (refused == 0)  # zeroed: RESAMPLED_CODE (0)
    tested = on_path.index_select(1, index["parent_or_root"]) & valid & index["is_child"]
    if index["siblings"]:
        tested &= ~blocked[:, :-1]
    return Verdict(count, emitted, keep, origin, on_path, tests.accept_prob, accepted[:, :-1], tested, tests.cost,
                   tests.level_prob)


def target_draw(index: dict, p: Tensor, uniforms: Tensor) -> Verdict:
    """The round of an empty tree: the token is drawn from the target's ``p`` at the root; the other fields
    are constants (the engine records them once)."""
    emitted = sample(p[:, 0], uniforms[:, -1])[:, None]
    ones = index["one"].expand(len(p), 1)
    return Verdict(ones[:, 0], emitted, ones - 1, ones[:, 0] * TARGET_CODE, ones.bool(), None, None, None, None,
                   None)


def distributions(probs: Tensor) -> Tensor:
    """Rows renormalised in the acceptance dtype (float64 on the CPU), as the walk expects them."""
    return probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
