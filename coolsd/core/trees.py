"""Draft structures (spec section 2): a chain is the static tree with one child per node.

Nodes are numbered 1..M in (depth, path) order with the root (the last emitted token) as node 0, so each
depth is a contiguous range and a parent always precedes its children.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

from .params import number, shorten
from .rules import MAX_DRAFT_DEPTH
from .transfer import index_tensor, to_device
from .verify import BONUS_CODE, TARGET_CODE

Path = tuple[int, ...]


@dataclass(frozen=True)
class DraftTree:
    """A static tree drafted by a draft model (the Eagle-1 head): ``source`` names the draft source that fills it
    (:mod:`coolsd.core.sources`)."""

    paths: tuple[Path, ...]
    name: str = "tree"
    _truncated: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _tensors: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    source = "drafter"  # class attributes, not fields: what kind of draft this is
    needs_drafter = True

    def __post_init__(self) -> None:
        paths = tuple(sorted({tuple(int(i) for i in p) for p in self.paths}, key=lambda p: (len(p), p)))
        known = set(paths)
        for path in paths:
            if not path or min(path) < 0:
                raise ValueError(f"draft tree: invalid path {list(path)}")
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"draft tree: path {list(path)} has no parent {list(path[:-1])}")
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in known:
                raise ValueError(f"draft tree: path {list(path)} skips sibling {path[-1] - 1}")
        object.__setattr__(self, "paths", paths)

    @property
    def size(self) -> int:
        """Number of drafted nodes M (the root not counted)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.paths[-1]) if self.paths else 0

    @cached_property
    def parent(self) -> list[int]:
        """``parent[i]`` for nodes 1..M (index 0, the root, maps to -1)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index.get(p[:-1], 0) for p in self.paths]

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def children(self) -> list[list[int]]:
        """Children of each node, in draw order (the ``b``-th child gets the ``b``-th token drawn)."""
        kids: list[list[int]] = [[] for _ in range(self.size + 1)]
        for node in range(1, self.size + 1):
            kids[self.parent[node]].append(node)
        return kids

    @cached_property
    def inner_nodes(self) -> list[int]:
        """The nodes that have children (whose draft distributions verification reads), in order."""
        return [node for node, kids in enumerate(self.children) if kids]

    @cached_property
    def levels(self) -> list[range]:
        """``levels[d]``: the node indices at depth ``d`` (``levels[0]`` is the root)."""
        bounds = [0] + [sum(1 for p in self.paths if len(p) <= d) + 1 for d in range(self.depth + 1)]
        return [range(bounds[d], bounds[d + 1]) for d in range(self.depth + 1)]

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """(M+1, M+1) bool: ``[i, j]`` is True when node ``j`` is node ``i`` or one of its ancestors."""
        mask = torch.eye(self.size + 1, dtype=torch.bool)
        for node in range(1, self.size + 1):
            mask[node] |= mask[self.parent[node]]
        return mask

    @cached_property
    def level_draws(self) -> list[dict]:
        """Per depth d>=1, how its nodes get their tokens: the distinct parents (each drafts ``width``
        tokens without replacement, one row of draws each), each node's parent and its place ``drawn`` in the
        flattened (parent, rank) draws; ``sees_all``: the level is one node whose ancestors are the whole
        pending area (a chain), so its drafter forward needs no mask."""
        out = []
        for d in range(1, self.depth + 1):
            nodes = list(self.levels[d])
            parents = [self.parent[n] for n in nodes]
            distinct = sorted(set(parents))
            ranks = [self.paths[n - 1][-1] for n in nodes]
            width = max(ranks) + 1
            sees_all = all(len(self.levels[e]) == 1 for e in range(1, d + 1))  # a chain down to here
            out.append({"parents": parents, "distinct": distinct, "width": width, "sees_all": sees_all,
                        "drawn": [distinct.index(p) * width + r for p, r in zip(parents, ranks)],
                        "distinct_inner": [self.inner_nodes.index(p) for p in distinct]})
        return out

    @cached_property
    def is_chain(self) -> bool:
        """One node per depth: the kept path is always a prefix of the nodes, committed without a gather."""
        return all(len(level) == 1 for level in self.levels)

    @cached_property
    def width(self) -> int:
        """The most children of any node (at least 1, so that an empty tree still has a column of them)."""
        return max(1, *map(len, self.children))

    def child_table(self, nodes: list[int]) -> list[list[int]]:
        """Each of ``nodes``' children in draw order, padded to :attr:`width` with ``size + 1`` (no node)."""
        return [self.children[n] + [self.size + 1] * (self.width - len(self.children[n])) for n in nodes]

    def tensors(self, device: torch.device, dtype: torch.dtype = torch.float64) -> dict:
        """The indices the decoding loop and the acceptance walk need, built once per device: a slice where the
        indices are a run (every chain index, many of a tree's), which costs no index kernel and no copy, else
        a tensor; the walk's 0/1 matrices in ``dtype`` (the acceptance arithmetic's)."""
        key = (str(device), dtype)
        if key not in self._tensors:
            self._tensors[key] = {**self.loop_indices(device), **self.walk_matrices(device, dtype)}
        return self._tensors[key]

    def loop_indices(self, device: torch.device) -> dict:
        levels = [{k: run_or_tensor(v, device) if isinstance(v, list) else v for k, v in lvl.items()}
                  for lvl in self.level_draws]
        inner, nodes = self.inner_nodes, list(range(self.size + 1))
        table = self.child_table(inner)
        return {"depths": index_tensor(self.depths, device), "inner": run_or_tensor(inner, device),
                "mask": to_device(self.ancestor_mask, device), "levels": levels, "depth": self.depth,
                "inner_row": index_tensor([inner.index(n) if n in inner else 0 for n in nodes], device),
                "rank_children": [run_or_tensor([row[rank] for row in table], device) for rank in range(self.width)]
                if inner else [], "inner_index": index_tensor(inner, device),
                "absent_children": any(self.size + 1 in row for row in table),
                "child_depth": index_tensor([self.depths[n] + 1 for n in inner], device)[:, None],
                "parent_or_root": index_tensor([max(0, p) for p in self.parent], device),
                "is_child": to_device(torch.tensor(nodes) > 0, device), "one": index_tensor([1], device)[0],
                "siblings": self.width > 1}

    def walk_matrices(self, device: torch.device, dtype: torch.dtype) -> dict:
        """The tree as 0/1 matrices over nodes, so the walk finds its path with products: earlier siblings
        ``[s, c]`` and path edges ``[j, v]`` (``j`` a non-root node on the root-to-``v`` path), both with a row
        for the sink; children ``[c, n]`` (``n`` is ``c``'s parent); each node's depth; ``kept_columns``, whose
        product with a path lists its nodes by depth, then each depth's successor, then counts its nodes and its
        drafts; the origin of a last token drawn from ``p`` at each node (the root: the target's own draw,
        deeper: a bonus token)."""
        n = self.size + 1
        earlier, children = torch.zeros(n, n, dtype=dtype), torch.zeros(n, n, dtype=dtype)
        for node in range(1, n):
            siblings = self.children[self.parent[node]]
            earlier[siblings[:siblings.index(node)], node] = 1
            children[node, self.parent[node]] = 1
        edges = self.ancestor_mask.T.to(dtype)
        edges[0] = 0
        # the walk's flags carry a sink column N (absent children): never an earlier sibling, never on a path
        earlier, edges = F.pad(earlier, (0, 1, 0, 1)), F.pad(edges, (0, 0, 0, 1))
        window = self.depth + 1
        columns = [[0] * (2 * window) + [1, int(node > 0)] for node in range(n)]  # then count nodes, and drafts
        for node, depth in enumerate(self.depths):
            columns[node][depth] = node  # the kept node at each depth
            if depth:
                columns[node][window + depth - 1] = node  # the kept node one depth below each depth
        kept_columns = torch.tensor(columns, dtype=dtype)
        leaf_origin = torch.tensor([TARGET_CODE] + [BONUS_CODE] * (n - 1))  # the last token, drawn from p there
        return {name: to_device(value, device) for name, value in (
            ("earlier_siblings", earlier), ("path_edges", edges), ("child_of", children),
            ("depth_of", torch.tensor(self.depths, dtype=dtype)), ("kept_columns", kept_columns),
            ("leaf_origin", leaf_origin))}

    def truncated(self, max_depth: int) -> "DraftTree":
        """The same tree cut at ``max_depth`` (used near the end of the image)."""
        if max_depth >= self.depth:
            return self
        if max_depth not in self._truncated:
            self._truncated[max_depth] = DraftTree(tuple(p for p in self.paths if len(p) <= max_depth),
                                                   f"{self.name}@{max_depth}")
        return self._truncated[max_depth]


def run_or_tensor(values: list[int], device: torch.device) -> "slice | torch.Tensor":
    """``values`` as a slice when they are consecutive and increasing (indexing by it gives the same rows as
    the index tensor, as a view), else as an index tensor on ``device``."""
    if values and values == list(range(values[0], values[0] + len(values))):
        return slice(values[0], values[0] + len(values))
    return index_tensor(values, device)


def chain(length: int) -> DraftTree:
    length = number("chain length", length, 1, integer=True)
    return DraftTree(chain_paths(length), f"chain:{length}")


def chain_paths(length: int) -> tuple[Path, ...]:
    return tuple((0,) * d for d in range(1, length + 1))


# Jacobi windows (spec section 11): how drafts past the commit point are refreshed from the round's own target rows,
# and the law of a fresh draft (a position never drafted from the target).
REFRESHES = ("independent", "coupled", "gumbel")
FRESH_LAWS = ("point", "uniform")
DEFAULT_FRESH = "uniform"


@dataclass(frozen=True)
class JacobiWindow(DraftTree):
    """A window of ``L`` drafts for the next ``L`` positions that the target makes for itself (spec section 11): a
    chain to the walk, filled by :class:`coolsd.core.jacobi.JacobiSource` instead of a draft model. ``refresh``:
    ``independent`` (SJD), ``coupled`` (maximal coupling, SCD's exact form) or ``gumbel`` (Gumbel coupling by
    absolute position); ``fresh``: a fresh draft's stored ``q``, ``point`` (SJD) or ``uniform`` (SJD-PAC)."""

    refresh: str = "independent"
    fresh: str = DEFAULT_FRESH

    source = "jacobi"
    needs_drafter = False


def jacobi(length: int, refresh: str = "independent", fresh: str = DEFAULT_FRESH) -> JacobiWindow:
    """The Jacobi window ``jacobi:L[:refresh][:fresh]`` (defaults left out of the name)."""
    length = number("Jacobi window", length, 1, integer=True)
    name = ":".join([f"jacobi:{length}"] + [part for part, default in ((refresh, "independent"),
                                                                         (fresh, DEFAULT_FRESH)) if part != default])
    return JacobiWindow(chain_paths(length), name, refresh, fresh)


def parse_jacobi(spec: str, arg: str, max_depth: int | None) -> JacobiWindow:
    """``jacobi:L``, then at most one refresh (:data:`REFRESHES`) and one fresh-draft law (:data:`FRESH_LAWS`)."""
    length_text, *options = arg.split(":")
    try:
        length = int(length_text)
    except ValueError:
        length = 0
    if length < 1:
        raise ValueError(f"draft: a Jacobi window must be a whole number of drafts from 1 to {MAX_DRAFT_DEPTH}, "
                         f"got {shorten(length_text)} in {shorten(spec)}")
    chosen = {"refresh": "independent", "fresh": DEFAULT_FRESH}
    given: set[str] = set()
    for option in options:
        kind = "refresh" if option in REFRESHES else "fresh" if option in FRESH_LAWS else None
        if kind is None:
            raise ValueError(f"draft: unknown Jacobi option {shorten(option)} in {shorten(spec)}; a refresh is one "
                             f"of {', '.join(REFRESHES)} and a fresh-draft law one of {', '.join(FRESH_LAWS)}")
        if kind in given:
            raise ValueError(f"draft: {shorten(spec)} names the {kind} twice")
        given.add(kind)
        chosen[kind] = option
    check_depth(length, f"jacobi:{length}", max_depth)
    return jacobi(length, chosen["refresh"], chosen["fresh"])


def rank_budget_tree(budgets: tuple[int, ...]) -> tuple[Path, ...]:
    """Every path whose child ranks sum to at most ``budgets[depth-1]``: wide near the root, thin below."""
    paths = []
    for depth, budget in enumerate(budgets, start=1):
        paths += [p for p in itertools.product(range(budget + 1), repeat=depth) if sum(p) <= budget]
    return tuple(paths)


# Eagle-1's default static tree (25 nodes, depth 5; "mc_sim_7b_63" in the Eagle-1 code base).
EAGLE25 = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
           (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
           (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1))

TREES: dict[str, tuple[Path, ...]] = {
    "eagle25": EAGLE25,
    # A wider 57-node depth-5 tree of the kind LANTERN++ uses (11, 15, 20, 5, 6 nodes per depth).
    "wide57": rank_budget_tree((10, 4, 3, 1, 1)),
}


def usable_depth(image_tokens: int) -> int:
    """The deepest draft a model with ``image_tokens`` tokens per image can use: the prefill emits the first
    token, and every round emits its accepted drafts plus one token of the target's, so a round starting with
    ``n >= 1`` tokens can use at most ``image_tokens - n - 1`` drafted positions (see ``decode``)."""
    return max(1, image_tokens - 2)


DRAFTER_DEFAULT = "chain:5"  # a model with a draft model starts here
# a model without one starts on the widest of these its images leave room for (jacobi:32:coupled: SCD's setting)
JACOBI_DEFAULTS = ("jacobi:32:coupled", "jacobi:16:coupled", "jacobi:8:coupled")


def default_draft(image_tokens: int, has_drafter: bool) -> str:
    """A model's starting draft (the app's, and the command line's without --draft): ``chain:5`` with a draft
    model, else the widest coupled Jacobi window its images leave room for (Lumina-mGPT: ``jacobi:32:coupled``)."""
    depth = usable_depth(image_tokens)
    if has_drafter:
        return DRAFTER_DEFAULT if parse_draft(DRAFTER_DEFAULT).depth <= depth else "chain:1"
    return next((d for d in JACOBI_DEFAULTS if parse_draft(d).depth <= depth), JACOBI_DEFAULTS[-1])


def check_depth(depth: int, spec: str, max_depth: int | None) -> None:
    """Refuse a draft deeper than ``max_depth`` (the model's :func:`usable_depth`) or than MAX_DRAFT_DEPTH."""
    if max_depth is not None and depth > max_depth and max_depth <= MAX_DRAFT_DEPTH:
        raise ValueError(f"draft {spec} is deeper than this model can use: its images leave room for at most "
                         f"{max_depth} drafted positions per round (e.g. "
                         f"{'jacobi' if spec.startswith('jacobi') else 'chain'}:{max_depth})")
    if depth > MAX_DRAFT_DEPTH:
        raise ValueError(f"draft {spec} is too deep: at most {MAX_DRAFT_DEPTH} drafted positions are supported")


def parse_draft(spec: "str | DraftTree", max_depth: int | None = None) -> DraftTree:
    """``chain:L``, ``tree:<preset>`` (presets: see ``TREES``) or ``jacobi:L[:refresh][:fresh]`` (a window the
    target drafts for itself). ``max_depth`` (a model's :func:`usable_depth`) and MAX_DRAFT_DEPTH bound the depth;
    both are checked before the tree is built."""
    if isinstance(spec, DraftTree):
        if not spec.size:
            raise ValueError("draft tree is empty: it needs at least one node")
        check_depth(spec.depth, spec.name, max_depth)
        return spec
    kind, _, arg = str(spec).partition(":")
    if kind == "chain":
        try:
            length = int(arg)
        except ValueError:  # also a number too long to convert (Python refuses over 4,300 digits)
            length = 0
        if length < 1:
            raise ValueError(f"draft: chain length must be a whole number from 1 to {MAX_DRAFT_DEPTH}, "
                             f"got {shorten(arg)}")
        check_depth(length, f"chain:{length}", max_depth)
        return chain(length)
    if kind == "tree":
        if arg not in TREES:
            raise ValueError(f"draft: unknown tree preset {shorten(arg)}; choose one of {sorted(TREES)}")
        tree = DraftTree(TREES[arg], f"tree:{arg}")
        check_depth(tree.depth, tree.name, max_depth)
        return tree
    if kind == "jacobi":
        return parse_jacobi(str(spec), arg, max_depth)
    raise ValueError(f"draft must look like 'chain:5', 'tree:eagle25' or 'jacobi:16', got {shorten(spec)}")
