"""Draft sources: where a round's drafted tokens and their draft distributions ``q`` come from.

The engine (:mod:`coolsd.core.decode`) verifies whatever a source drafted with any acceptance rule; a source only
fills the workspace's drafted tree (``node_tokens``, ``node_valid``, ``q``, ``node_origin``) in place on the
device. It takes part at three points of a generation: ``start`` after the prefill (the first token is known),
``draft`` as the round's drafting phase (sources whose drafts need no model of their own have none), and
``observe`` at the end of the acceptance phase (what the walk kept, and this round's target rows ``p``). Its
random numbers (``randoms``) are drawn from each image's own generator right after the walk's uniforms, so an
image's stream is consumed in the same order alone or in any batch (spec section 9). A new source is one small
class here and an entry in :data:`SOURCES`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .interface import Drafter
from .sampling import draw_without_replacement
from .verify import Verdict

Workspace = Any  # coolsd.core.decode.Workspace, whose buffers a source fills (decode imports this module, not back)

# Where a drafted token came from (a round's record keeps one code per node; names: coolsd.core.stats.DRAFT_ORIGINS)
DRAFTER_CODE, FRESH_CODE, REFRESHED_CODE, KEPT_CODE = 0, 1, 2, 3


class DraftSource:
    """Nothing drafted (vanilla AR): every hook does nothing."""

    drafting_phase = False  # whether rounds run :meth:`draft` as a phase of their own before verification

    def __init__(self, ws: Workspace, drafter: Drafter | None = None) -> None:
        self.randoms: list[tuple[Tensor, str]] = []  # (buffer (B, ...), "uniform" | "exponential") drawn per round

    def reset(self) -> None:
        """New images (buffers kept)."""

    def state(self) -> list[Tensor]:
        """The buffers a round reads and rewrites, besides the workspace's (to save and restore a round)."""
        return []

    def caches(self) -> list:
        """The source's own KV caches."""
        return []

    def start(self, ws: Workspace, embeds: Tensor, hidden: Tensor) -> None:
        """After the prefill: ``embeds`` its prefix inputs and ``hidden`` its features (rows, P, dim); the first
        token is ``ws.tokens[:, 0]`` and ``ws.n`` is 1."""

    def draft(self, ws: Workspace, levels: int) -> None:
        """The drafting phase: fill the drafted tree down to ``levels`` depths."""

    def observe(self, ws: Workspace, verdict: Verdict, p: Tensor, count: Tensor) -> None:
        """After the walk, ``ws.n`` already advanced by ``count`` (B,): ``p`` (B, N, V) the round's target rows."""


class DrafterSource(DraftSource):
    """An Eagle head (spec section 5; Eagle-1, or EAGLE-3, whose target features are the target's taps): it
    catches up on the pairs the last round kept, then drafts the tree
    level by level from its own predicted features, children drawn without replacement (exponential races)."""

    drafting_phase = True

    def __init__(self, ws: Workspace, drafter: Drafter | None = None) -> None:
        tree, batch, vocab, device = ws.tree, ws.batch, ws.target.vocab_size, ws.device
        if drafter is None:
            raise ValueError("this model has no drafter: only method 'ar' or a Jacobi draft "
                             "(e.g. --draft jacobi:16) is available")
        self.drafter, window = drafter, tree.depth + 1
        self.cache = drafter.new_cache(ws.rows, ws.max_len, batch)
        # each level's exponential races (float32, as the draft distributions), for the next round's drafting:
        # views of one buffer, levels in order, so a round draws them all in one call per image
        widths = [len(level["distinct"]) for level in tree.level_draws]
        races = torch.zeros(batch, sum(widths), vocab, device=device)
        self.races = list(races.split(widths, dim=1))
        self.randoms = [(races, "exponential")]
        # the (input, feature) pairs the drafter has not seen: the last round's kept nodes and emitted tokens
        self.pending_count = torch.zeros(batch, dtype=torch.long, device=device)
        self.pending_tokens = torch.zeros(batch, window, dtype=torch.long, device=device)
        self.pending_features: Tensor | None = None  # (rows, window, dim), made by the first prefill
        self.node_features: Tensor | None = None  # (rows, nodes, dim): the drafter's predicted feature per node

    def reset(self) -> None:
        self.cache.reset()

    def state(self) -> list[Tensor]:
        features = [self.pending_features] if self.pending_features is not None else []
        return [self.pending_count, self.pending_tokens, *features]

    def caches(self) -> list:
        return [self.cache]

    def feature_buffers(self, ws: Workspace, like: Tensor) -> None:
        """The feature buffers, made once from the prefill's features for the drafter (rows, T, width) of the
        target's dtype: the pending ones are that wide (an EAGLE-3 drafter's taps: k * dim), the drafter's own
        predicted ones as wide as the target's features."""
        if self.pending_features is None:
            self.pending_features = like.new_zeros(ws.rows, ws.tree.depth + 1, like.shape[-1])
            self.node_features = like.new_zeros(ws.rows, ws.tree.size + 1, ws.target.config.dim)

    def start(self, ws: Workspace, embeds: Tensor, hidden: Tensor) -> None:
        """The drafter sees the prefix pairs but the last: slot s pairs the target's feature at s with the next
        input (the prefix's embedding at s + 1); slot P - 1 pairs with the first token and is the first round's
        catch-up."""
        length = embeds.shape[1]
        if length > 1:
            lead = self.drafter.lead_inputs(embeds)
            self.drafter(lead, hidden[:, :-1], torch.arange(length - 1, device=ws.device), self.cache, 0,
                         causal_mask(length - 1, ws.device))
            self.cache.commit(None, length - 1)
        self.feature_buffers(ws, hidden)
        self.pending_features[:, :1] = hidden[:, -1:]
        self.pending_tokens[:, 0] = ws.tokens[:, 0]
        self.pending_count.fill_(1)

    def draft(self, ws: Workspace, levels: int) -> None:
        """Catch the drafter up on the pending (input, target feature) pairs (a fixed window, the first
        ``pending_count`` real), then draft the tree depth by depth from its own predicted features: per node the
        token, its validity and (at inner nodes) the draft distribution its children are drawn from. Past
        ``levels`` the nodes are invalid."""
        drafter, target, tree, index = self.drafter, ws.target, ws.tree, ws.index
        cache, count = self.cache, self.pending_count
        root_position = ws.n + (target.prefix_length - 1)  # the root: the last emitted token, not yet in any cache
        inputs = ws.per_row(drafter.embed(self.pending_tokens))
        positions = (root_position[:, None] - count[:, None] + ws.window_range).clamp_max(ws.last_position)
        out = drafter(inputs, self.pending_features, ws.row_positions(positions), cache, 0, ws.window_mask)
        cache.commit(None, count)

        features = self.node_features
        last_pair = ws.per_row((count - 1).clamp_min(0))  # a finished image has none: any row will do
        features[:, :1] = out.gather(1, last_pair[:, None, None].expand(-1, 1, out.shape[-1]))
        level_positions = (root_position[:, None] + ws.window_range[:levels]).clamp_max(ws.last_position)
        level_allowed = ws.allowed(ws.window_range[:levels])  # depth d's tokens: generated position n + d - 1
        tokens, valid = ws.node_tokens, ws.node_valid
        for depth, level in enumerate(index["levels"][:levels], start=1):
            nodes = tree.levels[depth]
            allowed = level_allowed[:, depth - 1:depth] if level_allowed is not None else None
            logits = drafter.logits(features[:, level["distinct"]], target.logits)
            q_level = ws.guided(logits, allowed)  # (B, parents, V)
            ws.q[:, level["distinct_inner"]] = q_level
            drawn, races = draw_without_replacement(q_level, level["width"], self.races[depth - 1])
            tokens[:, nodes.start:nodes.stop] = drawn.flatten(1)[:, level["drawn"]]
            if level["width"] == 1:  # one draw per parent always finds a token (a row of q has mass somewhere)
                valid[:, nodes.start:nodes.stop] = valid[:, level["parents"]]
            else:
                drawn_valid = races.flatten(1)[:, level["drawn"]] > 0
                valid[:, nodes.start:nodes.stop] = drawn_valid & valid[:, level["parents"]]
            if depth < levels:
                embeds = ws.per_row(drafter.embed(tokens[:, nodes.start:nodes.stop]))
                positions = ws.row_positions(level_positions[:, depth - 1:depth].expand(-1, len(nodes)))
                mask = None if level["sees_all"] else index["mask"][nodes.start:nodes.stop, 1:nodes.stop]
                features[:, nodes.start:nodes.stop] = drafter(embeds, features[:, level["parents"]], positions,
                                                              cache, nodes.start - 1, mask)
        if levels < tree.depth:
            valid[:, tree.levels[levels + 1].start:] = False

    def observe(self, ws: Workspace, verdict: Verdict, p: Tensor, count: Tensor) -> None:
        """The next catch-up's pairs: the kept nodes' target features and the emitted tokens."""
        hidden = ws.source_hidden
        self.pending_features.copy_(hidden[:, :ws.tree.depth + 1] if ws.tree.is_chain else
                                    gather_rows(hidden, ws.per_row(verdict.keep)))
        self.pending_tokens.copy_(verdict.emitted)
        self.pending_count.copy_(count)


def causal_mask(length: int, device: torch.device) -> Tensor | None:
    """The pending-area mask of ``length`` positions in a row (None for one: it sees everything)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril() if length > 1 else None


def gather_rows(values: Tensor, index: Tensor) -> Tensor:
    """``values[b, index[b, j]]`` for (B, N, F) values and (B, J) indices -> (B, J, F)."""
    return values.gather(1, index[..., None].expand(-1, -1, values.shape[-1]))
