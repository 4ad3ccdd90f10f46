"""Marks on the benchmark's scatter figures (the trade-off and the study's quality panels): each point's label,
placed where it covers no marker, bar or other label, and the current setting's star."""

from __future__ import annotations

from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.text import Text
from matplotlib.transforms import Bbox

LABEL_OFFSETS = [(5, 4), (5, -12), (-5, 4), (-5, -12), (5, 14), (5, -22), (-5, 14), (-5, -22), (12, -4),
                 (-12, -4), (5, 24), (5, -32), (-5, 24), (-5, -32), (5, -42), (-5, -42), (5, 34), (-5, 34)]  # points


def label_points(ax: Axes, points: list[tuple[float, float, str]], size: float = 8,
                 spans: Sequence[tuple[float, float, float]] = (), star: tuple[float, float] | None = None) -> None:
    """Label each point beside it, trying the next side when a label would cover a marker, an error bar
    (``spans``: x, low, high), the current setting's ``star``, an earlier label or the axes' edge; a point with
    no free side in a dense cluster stays unlabelled rather than hide its neighbours. The figure must be drawn
    already (its layout final); the labels take no part in the layout, so the positions measured here hold in
    the saved image."""
    renderer, scale = ax.figure.canvas.get_renderer(), ax.figure.dpi / 72  # offsets and sizes are in points
    radius = 4 * scale  # a marker's half-width in pixels
    placed = [Bbox.from_bounds(px - radius, py - radius, 2 * radius, 2 * radius)
              for px, py in ax.transData.transform([(x, y) for x, y, _ in points])] if points else []
    cap = 3 * scale  # an error bar's caps are 4 pt wide
    for x, low, high in spans:
        (x0, y0), (_, y1) = ax.transData.transform([(x, low), (x, high)])
        placed.append(Bbox.from_extents(x0 - cap, min(y0, y1) - cap, x0 + cap, max(y0, y1) + cap))
    if star is not None:
        (px, py), half = ax.transData.transform(star), 7 * scale  # the star is 14 pt wide
        placed.append(Bbox.from_bounds(px - half, py - half, 2 * half, 2 * half))
    for x, y, text in points:
        found = _free_label_box(ax, renderer, (x, y), text, size, placed)
        if found is None:
            continue
        (dx, dy), box = found
        leader = {"arrowstyle": "-", "color": "0.6", "lw": 0.6} if abs(dy) > 20 else None  # a far label
        label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=size,
                            ha="left" if dx > 0 else "right", color="0.25", arrowprops=leader)
        label.set_in_layout(False)
        placed.append(box)


def _free_label_box(ax: Axes, renderer, xy: tuple[float, float], text: str, size: float,
                    placed: list[Bbox]) -> tuple[tuple[float, float], Bbox] | None:
    """The first of LABEL_OFFSETS where the label's box (a pixel apart, so that "δ=2δ=2" never reads as one
    label) covers nothing ``placed`` and stays inside the axes, with that box; None if none. The text is laid out
    once: another offset or side only moves its box, so trying all of them costs arithmetic, not layouts."""
    (dx0, dy0), scale = LABEL_OFFSETS[0], ax.figure.dpi / 72  # offsets are in points
    probe = ax.annotate(text, xy, xytext=(dx0, dy0), textcoords="offset points", fontsize=size, ha="left")
    probe.update_positions(renderer)
    first = Text.get_window_extent(probe, renderer)  # the text alone, not a leader line
    probe.remove()
    for dx, dy in LABEL_OFFSETS:  # ha="right" puts the text's right edge where "left" puts its left edge
        shift = (dx - dx0) * scale - (first.width if dx < 0 else 0)
        box = first.translated(shift, (dy - dy0) * scale).padded(1)
        if not any(box.overlaps(other) for other in placed) and ax.bbox.contains(*box.p0) \
                and ax.bbox.contains(*box.p1):
            return (dx, dy), box
    return None


def current_star(ax: Axes, current: tuple[float, float] | None) -> None:
    if current is not None:
        ax.plot(*current, "*", color="red", markersize=14, label="current setting", zorder=4)

