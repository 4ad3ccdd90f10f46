"""What every figure shares: its colours, its two layouts and the helpers that build it (a standalone figure,
panels, a legend below, tick and text wrapping rules).

The app shows each figure as a PNG at 100 dpi, scaled to its panel, without Gradio's own plot labels. So every
figure carries its own title and puts its legend outside the axes, where it cannot cover data. Each figure has
two layouts (:class:`Layout`): the desktop one for a panel about 800 px wide (400 px for the acceptance maps,
which sit side by side) and, with ``narrow=True``, a phone one for a panel about 360 px wide (panels stacked,
legends in one column); in both its smallest text is at least 10 px on screen.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import MaxNLocator

from ...core.stats import BONUS, FIRST, RESAMPLED, TARGET

METHOD_COLOR, EAGLE_COLOR, OMEGA_COLOR, ACCEPTED_COLOR = "#d95f02", "#1b9e77", "#7570b3", "#1b9e77"
ORIGIN_STYLE = {FIRST: ("#9e9e9e", "1st"), TARGET: ("#9e9e9e", "AR"), RESAMPLED: ("#e7298a", "R"),
                BONUS: ("#e6ab02", "B")}
DEPTH_CMAP = colormaps["viridis"]
NOT_YET_COLOR, REJECTED_EDGE, NOISE_COLOR = "black", "red", "0.82"
# Where a Jacobi window's draft came from (coolsd.core.stats.DRAFT_ORIGINS) -> (marker, colour, legend text): a mark
# in its cell, so that the depth colours stay; the draft model's own drafts get none (a drafter run looks as before).
SOURCE_STYLE = {"fresh": ("^", "#56b4e9", "fresh (random) draft"),
                "refreshed": ("o", "#e69f00", "refreshed by the target"),
                "kept": ("s", "white", "kept by the coupling")}
SOURCE_EDGE = "black"
WIDE, NARROW = 8.0, 4.2  # inches: a full-width desktop panel, and one of the two side-by-side acceptance maps
ROW_HEIGHT = 3.0  # inches: each further row of a desktop figure's panels
PHONE_WIDTH = 4.0  # inches: a phone's panel (about 360 px) shows it at 0.9x, so 9 pt is 11 px on screen


@dataclass(frozen=True)
class Layout:
    """Figure width and text sizes (points) for a panel. At 100 dpi a point is 100/72 px before the panel
    scales the PNG: desktop 8 in at 800 px keeps 8 pt at 11 px; phone 4 in at 360 px needs 9 pt for 11 px."""

    width: float  # inches: a full-width figure
    map_width: float  # inches: an acceptance map
    small: float  # point labels, map cells
    legend: float
    subtitle: float
    title: float
    columns: int  # most legend columns
    stacked: bool  # side-by-side panels go one above the other


DESKTOP = Layout(WIDE, NARROW, 8, 9, 9, 11, 3, False)
PHONE = Layout(PHONE_WIDTH, PHONE_WIDTH, 9, 9, 10, 11, 1, True)


def layout(narrow: bool) -> Layout:
    return PHONE if narrow else DESKTOP


def fill(text: str, size: float, width: float) -> str:
    """``text`` wrapped to lines that fit ``width`` inches at ``size`` points (a character is about 0.58 em)."""
    return textwrap.fill(text, max(16, int(width * 72 / (0.58 * size))), break_long_words=False)


def message(text: str, narrow: bool = False) -> Figure:
    """A figure that holds only ``text``, centred: what a tab shows before there is anything to plot."""
    style = layout(narrow)
    fig, (ax,) = figure(style.width, 1.6)
    ax.axis("off")
    ax.text(0.5, 0.5, fill(text, style.title, style.width - 0.4), ha="center", va="center", fontsize=style.title,
            transform=ax.transAxes)
    return fig


def figure(width: float = WIDE, height: float = 3.6, cols: int = 1, rows: int = 1) -> tuple[Figure, np.ndarray]:
    """A standalone figure (not registered with pyplot, so nothing accumulates in a long-running server), with
    an Agg canvas so that callers and tests can measure its artists after ``fig.canvas.draw()``."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False).flatten()


def panels(style: Layout, count: int, height: float, stacked_height: float) -> tuple[Figure, np.ndarray]:
    """``count`` panels side by side (desktop; two to a row past two, each further row ``ROW_HEIGHT`` inches) or
    one above the other, ``stacked_height`` inches each (phone). Unused grid cells are removed."""
    if style.stacked and count > 1:
        return figure(style.width, stacked_height * count, rows=count)
    if count <= 2:
        return figure(style.width, height, cols=count)
    rows = math.ceil(count / 2)
    fig, axes = figure(style.width, height + ROW_HEIGHT * (rows - 1), cols=2, rows=rows)
    for ax in axes[count:]:
        fig.delaxes(ax)
    return fig, axes[:count]


def legend_below(fig: Figure | SubFigure, handles: list, ncol: int, size: float = 9) -> None:
    """A figure legend under the axes: constrained layout shrinks the axes to make room, so it covers nothing."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(ncol, len(handles)), fontsize=size,
                   frameon=False)


def integer_ticks(*axes) -> None:
    """Ticks only at whole numbers, for counts and positions (no "round 1.5")."""
    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def position_ticks(axis, values: Sequence[int]) -> None:
    """A tick at every value while there are few (a chain's positions), else whole-number ticks the axis can
    hold: a 16-draft Jacobi window's labels ran together on a phone."""
    if len(values) <= 10:
        axis.set_ticks(list(values))
    else:
        integer_ticks(axis)


def nan_for_none(values: list) -> list[float]:
    return [np.nan if v is None else v for v in values]


MARKERS = "osD^vP*Xh"  # a series' marker, by its index (trade-off and study figures)
