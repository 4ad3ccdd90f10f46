"""Token cells over an image, shared by the acceptance maps and Replay: the image as a grid of cells, the cells'
patches drawn at once, and the marks (with their legend) of where a Jacobi window's drafts came from."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from .style import SOURCE_EDGE, SOURCE_STYLE


def grid_axes(ax, image: np.ndarray, grid: tuple[int, int], dim: float = 1.0):
    """Show ``image`` (uint8, grey or RGB) at ``dim`` of its brightness; return a function from a token's raster
    index to its cell ``(x, y, width, height)``. Scaled to [0, 1]: matplotlib clips float RGB above 1 to white."""
    ax.imshow(image.astype(np.float32) * (dim / 255), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    cell_h, cell_w = image.shape[0] / grid[0], image.shape[1] / grid[1]

    def cell(index: int) -> tuple[float, float, float, float]:
        row, col = divmod(index, grid[1])
        return col * cell_w - 0.5, row * cell_h - 0.5, cell_w, cell_h
    return cell


def add_cells(ax: Axes, cells: list[Rectangle]) -> None:
    """Draw token cells as one collection, each keeping its own style: a patch per cell costs a limits update
    each, most of a map's or a replay's drawing time. The image already fixes the axes' limits."""
    if cells:
        ax.add_collection(PatchCollection(cells, match_original=True), autolim=False)


def source_legend(sources: Iterable[str]) -> list[Line2D]:
    """An entry per Jacobi source among ``sources`` (none for the draft model's drafts), in SOURCE_STYLE's order."""
    present = set(sources)
    return [Line2D([], [], ls="", marker=marker, markersize=7, markerfacecolor=color, markeredgecolor=SOURCE_EDGE,
                   label=text) for source, (marker, color, text) in SOURCE_STYLE.items() if source in present]


def source_marks(ax: Axes, points: dict[str, list[tuple[float, float]]], size: float) -> None:
    """One scatter per source that has points (its label the source's name, for legends and tests), ``size``
    points wide, above the cells."""
    for source, (marker, color, _) in SOURCE_STYLE.items():
        at = np.array(points.get(source, []), dtype=float).reshape(-1, 2)
        if len(at):
            ax.scatter(at[:, 0], at[:, 1], s=size ** 2, marker=marker, c=color, edgecolors=SOURCE_EDGE,
                       linewidths=0.6, zorder=4, label=source)


def mark_size(width: float, columns: int, share: float, most: float) -> float:
    """A mark's size in points: ``share`` of a cell of a ``width``-inch image with ``columns`` cells a row (the
    axes take about 0.85 of it), at most ``most``."""
    return min(most, share * width * 72 * 0.85 / max(1, columns))

