"""Verification of one round (spec section 3): walk the drafted tree with an acceptance rule."""

from __future__ import annotations

import numpy as np

from .rules import AcceptanceRule, step_cost
from .sampling import sample
from .stats import BONUS, RESAMPLED, TARGET, Candidate
from .trees import DraftTree


def verify(tree: DraftTree, drafted: list[int], valid: list[bool], p_rows: np.ndarray, q_rows: np.ndarray | None,
           rule: AcceptanceRule, rng: np.random.Generator, capture: list | None = None
           ) -> tuple[list[int], int, str, list[Candidate], dict[int, float]]:
    """Walk the drafted tree from the root (spec section 3).

    ``p_rows[i]``: target distribution after node i (0 = root); ``q_rows[i]``: the draft distribution node i's
    children were drawn from. Siblings are tried in draw order against the current residual; a sibling's ``q``
    excludes the earlier ones. Returns (accepted nodes, next token, its origin, tested candidates,
    P(some candidate accepted) per reached depth).
    """
    node, p = 0, p_rows[0]
    path: list[int] = []
    tested: list[Candidate] = []
    level_prob: dict[int, float] = {}
    while True:
        kids = [c for c in tree.children[node] if valid[c]]
        if not kids:
            return path, sample(p, rng), (BONUS if node else TARGET), tested, level_prob
        depth = tree.depths[node] + 1
        q = q_rows[node]
        if capture is not None:
            capture.append({"depth": depth, "p": p.astype(np.float32), "q": q.astype(np.float32)})
        chosen, none_accepted = 0, 1.0
        for j, child in enumerate(kids):
            y = drafted[child]
            if chosen:  # a sibling after the accepted one is only scored: its f is all that is needed
                mass, f = None, rule.accept_prob(p, q, y, depth)
            else:
                mass = rule.accepted_mass(p, q, depth)
                f = min(1.0, mass[y] / q[y])
                accepted = bool(rng.random() < f)
                tested.append(Candidate(child, depth, f, accepted, step_cost(p, mass)))
                chosen = child if accepted else 0
            none_accepted *= 1.0 - f
            if j + 1 < len(kids) or not chosen:  # later siblings (tested or only scored) see the residual
                p = rule.residual(p, q, y, depth, mass)
                q = q.copy()
                q[y] = 0.0
                q /= q.sum() or 1.0  # the next sibling was drawn from q without the earlier ones
        level_prob[depth] = 1.0 - none_accepted
        if not chosen:
            return path, sample(p, rng), RESAMPLED, tested, level_prob
        path.append(chosen)
        node, p = chosen, p_rows[chosen]
