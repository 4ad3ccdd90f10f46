"""Drafting without a drafter (spec section 11): the target drafts the next ``L`` positions for itself.

A Jacobi window keeps, per image, drafts ``d_1..d_L`` for the positions after the last token and the
distribution ``q_i`` each was drawn from (``ws.node_tokens``, ``ws.q``). A round scores ``[last token, d_1..d_L]``
in one target forward and the walk of section 3 accepts a prefix with any rule; then the positions past the new
commit point take new drafts from *this* forward's rows (a Jacobi step: those rows saw the old, partly wrong
drafts), and the window is topped up with fresh drafts. Every draw comes from the image's own stream, drawn with
the walk's uniforms, and every step is a fixed-shape tensor operation (no host read).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .interface import Drafter
from .rules import normalise
from .sampling import sample
from .sources import FRESH_CODE, KEPT_CODE, REFRESHED_CODE, DraftSource, Workspace, gather_rows
from .verify import Verdict


class JacobiSource(DraftSource):
    """The window's refresh, chosen by the draft (:class:`coolsd.core.trees.JacobiWindow`):

    * ``independent`` (SJD): the draft at a position is a new draw ``y ~ p`` from this round's row there;
    * ``coupled`` (SCD's maximal coupling, in its exact form): the old draft ``d`` is kept with probability
      ``min(1, p(d) / q(d))``, else one is drawn from ``Norm([p - q]_+)``; marginally ``y ~ p``;
    * ``gumbel`` (SCD's Gumbel coupling): ``y = argmax(p / E_t)``, ``E_t`` exponentials owned by the absolute
      position ``t`` until it is committed (``argmax(log p + G)`` with ``G = -log E``);

    and in every case the stored ``q := p`` (the law the new draft was drawn from). A position this round did not
    score gets a fresh draft: a uniformly random allowed token, stored with ``q`` a point mass on it (``point``,
    SJD: accepted with ``p(y)``) or the uniform law over the allowed tokens (``uniform``, SJD-PAC: accepted with
    ``min(1, |A| p(y))``); both are exact, since the draw really is uniform. Forced positions (section 8) are
    masked in ``p`` and in the fresh draws, so they are drafted as their token with ``q`` a point mass.
    """

    def __init__(self, ws: Workspace, drafter: Drafter | None = None) -> None:
        super().__init__(ws, drafter)
        tree, batch, vocab, device, dtype = ws.tree, ws.batch, ws.target.vocab_size, ws.device, ws.dtype
        self.window, self.refresh, self.fresh = tree.depth, tree.refresh, tree.fresh
        self.slots = torch.arange(self.window, device=device)
        # per slot: the coupling's test, a draw from the target's row, a fresh draw
        self.uniforms = torch.zeros(batch, 3, self.window, dtype=dtype, device=device)
        self.randoms = [(self.uniforms, "uniform")]
        if self.refresh == "gumbel":
            self.races = torch.zeros(batch, self.window, vocab, dtype=dtype, device=device)  # new positions' noise
            self.noise = torch.zeros_like(self.races)  # each window slot's position's exponentials
            self.randoms.append((self.races, "exponential"))
        self.everything = torch.ones(1, 1, vocab, dtype=dtype, device=device)  # allowed mass of a free position

    def state(self) -> list[Tensor]:
        return [self.noise] if self.refresh == "gumbel" else []

    def start(self, ws: Workspace, embeds: Tensor, hidden: Tensor) -> None:
        """The first window: every position fresh (its random numbers were drawn with the first token's)."""
        tokens, q = self.fresh_drafts(ws)
        ws.node_tokens[:, 1:] = tokens
        ws.q.copy_(q)
        ws.node_origin[:, 1:] = FRESH_CODE
        if self.refresh == "gumbel":
            self.noise.copy_(self.races)

    def observe(self, ws: Workspace, verdict: Verdict, p: Tensor, count: Tensor) -> None:
        """The next window from this round's rows ``p`` (row ``j``: the position ``j`` after the old last token):
        new slot ``s`` stands at row ``count + s``; rows up to ``L`` were scored, rows below ``L`` held a draft."""
        rows = count[:, None] + self.slots
        scored, drafted = rows <= self.window, rows < self.window
        p_rows = gather_rows(p, rows.clamp_max(self.window))
        old_tokens = ws.node_tokens[:, 1:].gather(1, rows.clamp_max(self.window - 1))
        tokens, kept = self.refreshed(ws, rows, p_rows, old_tokens, drafted)
        fresh_tokens, fresh_q = self.fresh_drafts(ws)
        ws.node_tokens[:, 1:] = torch.where(scored, tokens, fresh_tokens)
        ws.q.copy_(torch.where(scored[..., None], p_rows, fresh_q))
        origin = torch.where(kept, KEPT_CODE, REFRESHED_CODE)
        ws.node_origin[:, 1:] = torch.where(scored, origin, FRESH_CODE)

    def refreshed(self, ws: Workspace, rows: Tensor, p_rows: Tensor, old_tokens: Tensor, drafted: Tensor
                  ) -> tuple[Tensor, Tensor]:
        """Each slot's draft from its row ``p_rows`` (B, L, V), and whether it is the old draft kept."""
        test, draw = self.uniforms[:, 0], self.uniforms[:, 1]
        if self.refresh == "gumbel":  # the slot's position keeps its noise; a position new to the window takes new
            source = torch.where(drafted, rows, self.window + self.slots)
            self.noise.copy_(gather_rows(torch.cat([self.noise, self.races], 1), source))
            tokens = (p_rows / self.noise).argmax(-1)
            return tokens, drafted & (tokens == old_tokens)
        if self.refresh == "independent":
            return sample(p_rows, draw), torch.zeros_like(drafted)
        old_q = gather_rows(ws.q, rows.clamp_max(self.window - 1))  # maximal coupling of the old q and this p
        at_old = old_tokens[..., None]
        kept = drafted & (test * old_q.gather(-1, at_old)[..., 0] < p_rows.gather(-1, at_old)[..., 0])
        mass = torch.where(drafted[..., None], normalise((p_rows - old_q).clamp_min(0), p_rows), p_rows)
        return torch.where(kept, old_tokens, sample(mass, draw)), kept

    def fresh_drafts(self, ws: Workspace) -> tuple[Tensor, Tensor]:
        """A uniformly random allowed token for each slot (its position: ``n + slot``), and its stored ``q``."""
        allowed = ws.allowed(self.slots)
        mass = allowed.to(ws.dtype) if allowed is not None else self.everything.expand(ws.batch, self.window, -1)
        tokens = sample(mass, self.uniforms[:, 2])
        if self.fresh == "uniform":
            return tokens, mass / mass.sum(-1, keepdim=True)
        return tokens, torch.zeros_like(mass).scatter_(-1, tokens[..., None], 1.0)
