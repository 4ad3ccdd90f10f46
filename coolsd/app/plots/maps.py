"""The acceptance maps: the token grid over an image, each token coloured by where it came from (an accepted
draft by its depth, the target's own tokens by their origin) and a Jacobi window's drafts marked by source."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ...core.stats import BONUS, DRAFT, FIRST, RESAMPLED, TARGET, GenerationStats
from .cells import add_cells, grid_axes, mark_size, source_legend, source_marks
from .style import DEPTH_CMAP, ORIGIN_STYLE, SOURCE_STYLE, fill, figure, layout, legend_below

MOST_DEPTH_ENTRIES = 8  # more accepted depths than this (a deep Jacobi window) share legend entries by range


def _depth_color(depth: int, depth_max: int):
    return DEPTH_CMAP((depth - 1) / max(1, depth_max - 1))


def _depth_entries(depths: list[int], depth_max: int) -> list[Patch]:
    """A legend entry per accepted depth; past MOST_DEPTH_ENTRIES depths, one per range of them, coloured at its
    middle (each cell still shows its depth)."""
    if len(depths) <= MOST_DEPTH_ENTRIES:
        return [Patch(color=_depth_color(d, depth_max), label=f"draft, depth {d}") for d in depths]
    groups = [list(group) for group in np.array_split(depths, MOST_DEPTH_ENTRIES)]
    return [Patch(color=_depth_color(group[len(group) // 2], depth_max),
                  label=f"draft, depth {group[0]}" + (f"–{group[-1]}" if len(group) > 1 else "")) for group in groups]


def _accepted_sources(stats: GenerationStats) -> list[str]:
    """Each accepted draft's source, in image order (a run recorded before sources were: none)."""
    return [source for origin, source in zip(stats.token_origin, stats.token_source) if origin == DRAFT]


def _origin_legend(stats: GenerationStats) -> list:
    """One entry per colour the map uses: each accepted draft depth that occurs, then the other origins (short
    labels: two columns must fit the map's 400 px), then a Jacobi window's sources among the accepted drafts."""
    depth_max = max(1, stats.tree_depth)
    depths = sorted({d for origin, d in zip(stats.token_origin, stats.token_depth) if origin == DRAFT})
    entries: list = _depth_entries(depths, depth_max)
    origins = set(stats.token_origin)
    labels = {RESAMPLED: "R: resampled", BONUS: "B: bonus"}
    entries += [Patch(color=ORIGIN_STYLE[origin][0], label=text)
                for origin, text in labels.items() if origin in origins]
    if origins & {FIRST, TARGET}:
        entries.append(Patch(color=ORIGIN_STYLE[FIRST][0], label="1st / AR: target"))
    return entries + source_legend(_accepted_sources(stats))


def acceptance_map(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], title: str, *,
                   narrow: bool = False) -> Figure:
    """The token grid over the image: accepted drafts coloured by depth, other origins marked."""
    style = layout(narrow)
    legend = _origin_legend(stats)
    fig, (ax,) = figure(style.map_width, 4.4 + 0.2 * math.ceil(len(legend) / 2))
    fig.suptitle(fill(f"{title}: where each token came from", style.subtitle + 1, style.map_width),
                 fontsize=style.subtitle + 1)
    cell = grid_axes(ax, image, grid, dim=0.55)
    depth_max = max(1, stats.tree_depth)
    cells, marks = [], {}
    sources = stats.token_source or [""] * len(stats.token_origin)
    for index, (origin, depth, source) in enumerate(zip(stats.token_origin, stats.token_depth, sources)):
        x, y, cell_w, cell_h = cell(index)
        color, text = (_depth_color(depth, depth_max), str(depth)) if origin == DRAFT else ORIGIN_STYLE[origin]
        cells.append(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor="white", lw=0.4))
        ax.text(x + cell_w / 2, y + cell_h / 2, text, ha="center", va="center", fontsize=style.small,
                color="white", fontweight="bold")
        if origin == DRAFT and source in SOURCE_STYLE:  # in the cell's top left corner, clear of its depth
            marks.setdefault(source, []).append((x + 0.2 * cell_w, y + 0.2 * cell_h))
    add_cells(ax, cells)
    source_marks(ax, marks, mark_size(style.map_width, grid[1], 0.22, 5))
    legend_below(fig, legend, ncol=2, size=style.legend)
    return fig
