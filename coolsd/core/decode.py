"""The decoding loop: one engine for vanilla AR (the empty draft), chain and static-tree speculative decoding.

A round (spec section 1): the drafter proposes a tree, the target scores root + tree in one forward pass,
``verify`` walks the tree with the acceptance rule, the target cache keeps the accepted path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..models.gpt import Drafter, KVCache, Transformer
from .rules import AcceptanceRule, CoolSD, Eagle, Lantern, UniformRSD, step_cost
from .sampling import SamplingConfig, draw_without_replacement, probabilities, sample
from .stats import BONUS, DRAFT, FIRST, RESAMPLED, TARGET, Candidate, GenerationStats, Round, Timer
from .trees import DraftTree, parse_draft

METHODS = ("ar", "eagle", "uniform", "cool", "lantern")
EMPTY = DraftTree((), "none")


@dataclass
class Generation:
    tokens: list[int]
    stats: GenerationStats


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


def draft(drafter: Drafter, target: Transformer, cache: KVCache, tree: DraftTree, pending_tokens: list[int],
          pending_features: Tensor, sampling: SamplingConfig, generator: torch.Generator
          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Catch the drafter up on the newly committed tokens (with the target's features), then draft the tree
    depth by depth from its own predicted features. Returns, per node 0..M (0 = root): tokens, validity, the
    draft distribution its children were drawn from (M+1, V; zero at leaves) and its predicted feature
    (left unset at the deepest level, which is never fed back)."""
    device = pending_features.device
    rows = pending_features.shape[0]
    index = tree.tensors(device)
    start, count = cache.length, len(pending_tokens)
    embeds = target.tok_embeddings(torch.tensor(pending_tokens, device=device))[None].expand(rows, -1, -1)
    causal = torch.ones(count, count, dtype=torch.bool, device=device).tril() if count > 1 else None
    out = drafter(embeds, pending_features, torch.arange(start, start + count, device=device), cache, 0, causal)
    cache.commit(list(range(count)))

    features = out.new_empty(rows, tree.size + 1, out.shape[-1])
    features[:, 0] = out[:, -1]
    tokens = torch.zeros(tree.size + 1, dtype=torch.long, device=device)
    valid = torch.ones(tree.size + 1, dtype=torch.bool, device=device)
    q = torch.zeros(tree.size + 1, target.config.vocab_size, device=device)
    for depth, level in enumerate(index["levels"], start=1):
        nodes = tree.levels[depth]
        q_level = probabilities(target.output(features[:, level["distinct"]]), sampling)
        q[level["distinct"]] = q_level
        drawn, drawn_valid = draw_without_replacement(q_level, level["width"], generator)
        tokens[nodes.start:nodes.stop] = drawn[level["slot"], level["rank"]]
        valid[nodes.start:nodes.stop] = drawn_valid[level["slot"], level["rank"]] & valid[level["parents"]]
        if depth < tree.depth:
            embeds = target.tok_embeddings(tokens[nodes.start:nodes.stop])[None].expand(rows, -1, -1)
            positions = torch.full((len(nodes),), start + count + depth - 1, device=device)
            mask = index["mask"][nodes.start:nodes.stop, 1:nodes.stop]
            features[:, nodes.start:nodes.stop] = drafter(embeds, features[:, level["parents"]], positions, cache,
                                                          nodes.start - 1, mask)
    return tokens, valid, q, features


def to_numpy(probs: Tensor) -> np.ndarray:
    """float64 rows, renormalised, for the exact acceptance arithmetic."""
    rows = probs.double().cpu().numpy()
    totals = rows.sum(axis=-1, keepdims=True)
    return np.divide(rows, totals, out=rows, where=totals > 0)  # rows never filled (leaves) stay zero


@torch.inference_mode()
def decode(target: Transformer, drafter: Drafter | None, class_id: int, rule: AcceptanceRule, tree: DraftTree,
           sampling: SamplingConfig, seed: int, method: str = "", capture: bool = False) -> Generation:
    """Generate one image's tokens. ``tree`` empty = vanilla AR (one token per target forward)."""
    cfg = target.config
    device = target.output.weight.device
    n_image, rows = cfg.image_tokens, sampling.rows
    if tree.size and drafter is None:
        raise ValueError("this model has no drafter: only method 'ar' is available")
    labels = torch.tensor([class_id, cfg.null_class][:rows], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    rng = np.random.default_rng(seed)
    timer = Timer(sync=torch.cuda.synchronize if device.type == "cuda" else (lambda: None))
    stats = GenerationStats(method=method or rule.name, params=rule.params(), draft=tree.name,
                            tree_depth=tree.depth, class_id=class_id, seed=seed, sampling=sampling.to_dict(),
                            omegas=[rule.omega(d) for d in range(1, tree.depth + 1)])
    captured = stats.captured if capture else None
    target_cache = target.new_cache(rows, n_image + tree.size + 1)
    drafter_cache = drafter.new_cache(rows, n_image + tree.size + 1) if tree.size else None
    began = time.perf_counter()

    with timer.phase("target_forward"):
        hidden = target(target.class_inputs(labels), torch.zeros(1, dtype=torch.long, device=device), target_cache)
        target_cache.commit([0])
        logits = target.output(hidden)
    with timer.phase("acceptance"):
        token = sample(to_numpy(probabilities(logits, sampling))[0], rng)
    stats.rounds.append(Round(0, [], [], [], {}, [token], FIRST))
    stats.emit(FIRST)
    tokens, pending_tokens, pending_features = [token], [token], hidden

    while len(tokens) < n_image:
        n = len(tokens)
        round_tree = tree.truncated(n_image - n - 1)
        index = round_tree.tensors(device)
        node_tokens = torch.tensor([tokens[-1]], device=device)
        drafted, valid, q_rows = [tokens[-1]], [True], None
        if round_tree.size:
            with timer.phase("drafting"):
                node_tokens, node_valid, q, _ = draft(drafter, target, drafter_cache, round_tree, pending_tokens,
                                                   pending_features, sampling, generator)
                node_tokens[0] = tokens[-1]
                drafted, valid, q_rows = node_tokens.tolist(), node_valid.tolist(), to_numpy(q)
            stats.drafter_forwards += round_tree.depth
        with timer.phase("target_forward"):
            embeds = target.tok_embeddings(node_tokens)[None].expand(rows, -1, -1)
            mask = index["mask"] if round_tree.size else None
            hidden = target(embeds, n + index["depths"], target_cache, 0, mask)
            logits = target.output(hidden)
        with timer.phase("acceptance"):
            p_rows = to_numpy(probabilities(logits, sampling))
            path, token, origin, tested, level_prob = verify(round_tree, drafted, valid, p_rows, q_rows, rule,
                                                             rng, captured)
        keep = [0] + path
        target_cache.commit(keep)
        pending_features = hidden[:, keep]
        pending_tokens = [drafted[i] for i in path] + [token]
        probs_by_node = {c.node: c.accept_prob for c in tested}
        for i in path:
            stats.emit(DRAFT, round_tree.depths[i], probs_by_node[i])
        stats.emit(origin)
        stats.rounds.append(Round(n, drafted[1:], valid[1:], tested, level_prob, pending_tokens, origin))
        tokens += pending_tokens

    stats.seconds = dict(timer.seconds, total=time.perf_counter() - began)
    stats.seconds["other"] = stats.seconds["total"] - sum(timer.seconds.values())
    return Generation(tokens, stats)


def build_rule(method: str, params: dict | None, depth: int, neighbours=None) -> AcceptanceRule:
    """Method name + parameters -> acceptance rule. ``neighbours(count)`` gives LANTERN++'s code table."""
    params = dict(params or {})
    allowed = {"ar": set(), "eagle": set(), "uniform": {"delta"}, "cool": {"delta", "nu", "mu", "schedule"},
               "lantern": {"k", "lambda", "residual"}}
    if method not in allowed:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    unknown = set(params) - allowed[method]
    if unknown:
        raise ValueError(f"method {method!r} takes no parameter {', '.join(sorted(unknown))} "
                         f"(it takes: {', '.join(sorted(allowed[method])) or 'none'})")
    if method in ("ar", "eagle"):
        return Eagle()
    if method == "uniform":
        return UniformRSD(**params)
    if method == "cool":
        return CoolSD(depth=max(depth, 1), **params)
    if neighbours is None:
        raise ValueError("method 'lantern' needs the tokenizer's codebook, which this model lacks")
    k = params.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    return Lantern(neighbours(k + 1), k=k, lam=params.get("lambda", 5.0), residual=params.get("residual", "gstar"))


def generate(bundle, class_id: int, method: str = "eagle", params: dict | None = None,
             draft: "str | DraftTree" = "chain:5", sampling: SamplingConfig | None = None, seed: int = 0,
             capture: bool = False) -> Generation:
    """One image's tokens and statistics from a model bundle (see :mod:`coolsd.bundle`)."""
    cfg = bundle.target.config
    if isinstance(class_id, bool) or not isinstance(class_id, int) or not 0 <= class_id < cfg.num_classes:
        raise ValueError(f"class must be an integer in [0, {cfg.num_classes - 1}], got {class_id!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2^63), got {seed!r}")
    tree = EMPTY if method == "ar" else parse_draft(draft)
    rule = build_rule(method, params, tree.depth, bundle.neighbours)
    return decode(bundle.target, bundle.drafter, class_id, rule, tree, sampling or bundle.sampling, seed,
                  method=method, capture=capture)


__all__ = ["Generation", "METHODS", "build_rule", "decode", "draft", "generate", "verify"]
