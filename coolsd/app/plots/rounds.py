"""Replay: one round of a generation, on the image (the tokens it added, the cells its window drafted) and as
the tree it drafted (each node accepted, rejected, not tested or invalid, and the token the target added)."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ...core.params import counted
from ...core.stats import BONUS, FIRST, RESAMPLED, TARGET, GenerationStats, Round
from ...core.trees import DraftTree, parse_draft
from ..series import method_name
from .cells import add_cells, grid_axes, mark_size, source_legend, source_marks
from .style import (ACCEPTED_COLOR, NOT_YET_COLOR, ORIGIN_STYLE, REJECTED_EDGE, SOURCE_STYLE, Layout, fill,
                    layout, legend_below)

ACCEPTED, REJECTED, UNTESTED, INVALID = "accepted", "rejected", "not tested", "invalid"
NODE_STYLE = {  # status -> (colour, marker, legend text); verification (spec section 3) gives the status
    ACCEPTED: (ACCEPTED_COLOR, "o", "accepted"),
    REJECTED: (REJECTED_EDGE, "X", "tested, rejected"),
    UNTESTED: ("0.65", "o", "drafted, not tested"),
    INVALID: ("black", "x", "invalid draw"),
}


def round_tree(stats: GenerationStats, current: Round) -> DraftTree | None:
    """The tree ``current`` drafted: the generation's draft, cut at the depth that leaves the round's node count
    (near the image's end fewer positions remain; see ``DraftTree.truncated``). None when it drafted nothing,
    or when the draft's name is not one ``parse_draft`` knows."""
    if not current.drafted:
        return None
    try:
        tree = parse_draft(stats.draft)
    except ValueError:
        return None
    cuts = [tree.truncated(depth) for depth in range(tree.depth, 0, -1)]
    return next((cut for cut in cuts if cut.size == len(current.drafted)), None)


def node_status(current: Round) -> list[str]:
    """Per drafted node 1..M: accepted or rejected when verification tested it, else not tested (a sibling after
    the accepted one, or below a rejected node), or invalid (its draft row had no token left to draw)."""
    tested = {c.node: c.accepted for c in current.tested}
    return [INVALID if not valid else (ACCEPTED if tested[node] else REJECTED) if node in tested else UNTESTED
            for node, valid in enumerate(current.valid, start=1)]


def tree_layout(tree: DraftTree) -> np.ndarray:
    """(M+1, 2) positions of nodes 0..M: x is the depth, y a leaf slot in depth-first order (a parent sits at
    the mean of its children), so edges never cross and siblings stand together."""
    y = np.zeros(tree.size + 1)
    leaves = sorted((n for n in range(1, tree.size + 1) if not tree.children[n]), key=lambda n: tree.paths[n - 1])
    y[leaves] = np.arange(len(leaves))
    for node in reversed(range(tree.size + 1)):  # children are numbered after their parent
        if tree.children[node]:
            y[node] = y[tree.children[node]].mean()
    return np.column_stack([tree.depths, y])


def _tree_legend() -> list:
    """Every mark the tree can use, in the same order for every round (the layout holds still while playing)."""
    nodes = [Line2D([], [], ls="", marker=marker, color=color, label=text)
             for color, marker, text in NODE_STYLE.values()]
    return nodes + [Line2D([], [], ls="", marker="D", markersize=9, color=ORIGIN_STYLE[origin][0], label=text)
                    for origin, text in ((RESAMPLED, "R: resampled"), (BONUS, "B: bonus"))]


def _draw_tree(ax: Axes, tree: DraftTree, current: Round, size: float) -> None:
    """Each drafted node at (depth, slot) marked by its status, the accepted path in bold, and the round's own
    token (resampled or bonus) half a depth after the last accepted node."""
    at, status = tree_layout(tree), node_status(current)
    edges = [(at[tree.parent[n]], at[n]) for n in range(1, tree.size + 1)]
    ax.add_collection(LineCollection(edges, colors="0.8", lw=0.8, zorder=1))
    path = [0] + [n for n in range(1, tree.size + 1) if status[n - 1] == ACCEPTED]
    ax.plot(at[path, 0], at[path, 1], "-", color=ACCEPTED_COLOR, lw=2.5, zorder=2)
    for name, (color, marker, _) in NODE_STYLE.items():
        nodes = [n for n in range(1, tree.size + 1) if status[n - 1] == name]
        ax.scatter(at[nodes, 0], at[nodes, 1], s=36, marker=marker, color=color, zorder=3, label=name)
    ax.scatter(*at[0], s=36, marker="s", color="0.3", zorder=3)
    color, letter = ORIGIN_STYLE[current.next_origin]
    x, y = at[path[-1], 0] + 0.5, at[path[-1], 1]
    ax.plot([at[path[-1], 0], x], [y, y], ":", color=color, lw=1.5, zorder=2)
    ax.scatter([x], [y], s=110, marker="D", color=color, edgecolor="white", zorder=4, label=current.next_origin)
    ax.text(x, y, letter, ha="center", va="center", fontsize=size, color="white", fontweight="bold", zorder=5)
    step = math.ceil(tree.depth / 12)  # a 32-draft window: every third depth labelled, so labels never overlap
    shown = [0] + list(range(step, tree.depth + 1, step))
    ax.set_xticks(shown, ["root"] + [str(d) for d in shown[1:]])
    ax.set_xlim(-0.4, tree.depth + 0.9)
    ax.set_ylim(at[:, 1].max() + 0.6, -0.6)  # first child on top
    ax.set_yticks([])
    ax.set_xlabel("draft depth (root: the last token before this round)")


def _tree_panel(ax: Axes, stats: GenerationStats, current: Round, style: Layout) -> None:
    """The drafted tree of the round, or why there is none (the prefill, AR, a round at the image's end)."""
    tree = round_tree(stats, current)
    tested, accepted = len(current.tested), current.accepted
    if tree is None:
        ax.set_xticks([])
        ax.set_yticks([])
        why = ("nothing drafted in this round" if not current.drafted
               else f"the structure of draft {stats.draft} is not known here")
        ax.text(0.5, 0.5, fill(why, style.subtitle, style.width / 2), transform=ax.transAxes, ha="center",
                va="center", fontsize=style.subtitle, color="0.35")
    else:
        _draw_tree(ax, tree, current, style.small)
    invalid = len(current.valid) - sum(current.valid)
    counts = counted(len(current.drafted), "node") + (f" ({invalid} invalid)" if invalid else "")
    ax.set_title(fill(f"drafted tree: {counts}, {tested} tested, {accepted} accepted", style.subtitle,
                      style.width if style.stacked else style.width / 2), fontsize=style.subtitle)


def _replay_legend() -> list[Patch]:
    """Every colour the image can use, in the same order for every round, so the layout holds still."""
    return [Patch(facecolor=ACCEPTED_COLOR, alpha=0.6, label="accepted draft"),
            Patch(facecolor=ORIGIN_STYLE[RESAMPLED][0], alpha=0.6, edgecolor=REJECTED_EDGE, lw=2,
                  label="resampled after a rejection"),
            Patch(facecolor=ORIGIN_STYLE[BONUS][0], alpha=0.6, label="bonus (all drafts accepted)"),
            Patch(facecolor=ORIGIN_STYLE[TARGET][0], alpha=0.6, label="sampled by the target (1st / AR)"),
            Patch(facecolor="0.75", edgecolor="0.4", label="earlier tokens (image so far)"),
            Patch(facecolor=NOT_YET_COLOR, label="not yet generated")]


def window_sources(current: Round, cells: int) -> dict[str, list[int]]:
    """The image cells of a round's drafted window by Jacobi source: a Jacobi window is a chain, so node ``i``
    drafts position ``start + i - 1``; drafts past the image's end and the draft model's drafts are left out."""
    marked: dict[str, list[int]] = {}
    for node, source in enumerate(current.sources, start=1):
        if source in SOURCE_STYLE and current.start + node - 1 < cells:
            marked.setdefault(source, []).append(current.start + node - 1)
    return marked


def _image_panel(ax: Axes, image: np.ndarray, grid: tuple[int, int], current: Round, size: float,
                 mark: float = 6) -> None:
    """Earlier tokens shown, this round's accepted drafts (green) and its extra token (pink if resampled after
    a rejection, outlined red; yellow if a bonus), later cells covered; a Jacobi window's drafts marked by source
    (``mark`` points wide) in the cells they drafted."""
    cell = grid_axes(ax, image, grid)
    start, emitted = current.start, len(current.emitted)
    cells = []
    for index in range(start, grid[0] * grid[1]):
        x, y, cell_w, cell_h = cell(index)
        if index >= start + emitted:  # not generated yet: hidden (the finished image must not show through)
            cells.append(Rectangle((x, y), cell_w, cell_h, facecolor=NOT_YET_COLOR, lw=0))
            continue
        last = index == start + emitted - 1
        color = ORIGIN_STYLE[current.next_origin][0] if last else ACCEPTED_COLOR
        cells.append(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor=color, lw=1.5))
        if last and current.next_origin == RESAMPLED:  # a candidate was rejected in this cell
            cells.append(Rectangle((x, y), cell_w, cell_h, fill=False, edgecolor=REJECTED_EDGE, lw=2.5))
    add_cells(ax, cells)
    centres = {}
    for source, indices in window_sources(current, grid[0] * grid[1]).items():
        centres[source] = [(x + w / 2, y + h / 2) for x, y, w, h in map(cell, indices)]
    source_marks(ax, centres, mark)
    ax.set_title(_emitted_words(current), fontsize=size)


def _emitted_words(current: Round) -> str:
    """What the round added to the image, in words."""
    if current.next_origin == FIRST:
        return "the prefill: the target samples the first token"
    if not current.drafted:
        return "1 token, sampled by the target"
    return (f"{counted(len(current.emitted), 'token')}: {counted(current.accepted, 'accepted draft')} "
            f"+ 1 {current.next_origin}")


def replay(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], round_index: int, *,
           narrow: bool = False) -> Figure:
    """One round: the image with the round's tokens marked (left; above on a phone) and the tree it drafted,
    each node marked accepted, rejected, not tested or invalid, with the token the target added (right). A Jacobi
    window's drafts are marked by source in the cells they drafted, with a legend entry for each source the run
    used in any round (so the layout holds still while playing)."""
    style = layout(narrow)
    round_index = int(np.clip(round_index, 0, len(stats.rounds) - 1))
    current = stats.rounds[round_index]
    fig = Figure(figsize=(style.width, 9.6 if style.stacked else 5.4), layout="constrained")
    FigureCanvasAgg(fig)
    panels = fig.subfigures(2, 1, height_ratios=[1.15, 1]) if style.stacked else fig.subfigures(1, 2)
    sources = source_legend(source for past in stats.rounds for source in past.sources)  # every round's: held still
    for panel, legend, ncol in zip(panels, (_replay_legend() + sources, _tree_legend()), (1, 2)):
        legend_below(panel, legend, ncol=ncol, size=style.legend)
    width = style.width if style.stacked else style.width / 2
    _image_panel(panels[0].subplots(), image, grid, current, style.subtitle, mark_size(width, grid[1], 0.4, 7))
    _tree_panel(panels[1].subplots(), stats, current, style)
    fig.suptitle(f"{method_name(stats.method, stats.params)}: round {round_index} of {len(stats.rounds) - 1}",
                 fontsize=style.subtitle + 1)
    return fig
