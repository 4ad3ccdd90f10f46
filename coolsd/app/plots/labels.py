"""Marks on the benchmark's scatter figures (the trade-off and the study's quality panels): each point's label,
placed where it covers no marker, bar or other label, and the current setting's star."""

from __future__ import annotations

from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.text import Text
from matplotlib.transforms import Bbox

LABEL_OFFSETS = [(5, 4), (5, -12), (-5, 4), (-5, -12), (5, 14), (5, -22), (-5, 14), (-5, -22), (12, -4),
                 (-12, -4), (5, 24), (5, -32), (-5, 24), (-5, -32), (5, -42), (-5, -42), (5, 34), (-5, 34),
                 (20, -4), (-20, -4), (14, 10), (-14, 10), (14, -18), (-14, -18), (5, 44), (-5, 44), (5, -52),
                 (-5, -52), (28, 4), (-28, 4), (28, -12), (-28, -12)]  # points


def label_points(ax: Axes, points: list[tuple[float, float, str]], size: float = 8,
                 spans: Sequence[tuple[float, float, float]] = (), star: tuple[float, float] | None = None,
                 rules: Sequence[float] = ()) -> None:
    """Label each point beside it, trying the next side when a label would cover a marker, an error bar
    (``spans``: x, low, high), the current setting's ``star``, a horizontal reference line (``rules``: its y; a
    label struck through reads as crossed out), an earlier label or its leader line, or the axes' edge; a point
    with no free side in a dense cluster stays unlabelled rather than hide its neighbours. The figure must be drawn
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
    for rule in rules:
        _, py = ax.transData.transform((0, rule))
        placed.append(Bbox.from_extents(ax.bbox.x0, py - scale, ax.bbox.x1, py + scale))
    labels: list[Bbox] = []  # the labels placed so far: a leader line may cross a marker or a bar, not a label
    for x, y, text in points:
        found = _free_label_box(ax, renderer, (x, y), text, size, placed, labels)
        if found is None:
            continue
        (dx, dy), box = found
        leader = {"arrowstyle": "-", "color": "0.6", "lw": 0.6} if needs_leader(dy) else None
        label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=size,
                            ha="left" if dx > 0 else "right", color="0.25", arrowprops=leader)
        label.set_in_layout(False)
        placed.append(box)
        labels.append(box)
        if leader:
            placed += leader_boxes(ax.transData.transform((x, y)), box)


def needs_leader(dy: float) -> bool:
    """A label this far (points) above or below its point gets a leader line to it."""
    return abs(dy) > 20


def leader_boxes(point, box: Bbox) -> list[Bbox]:
    """Small boxes along a far label's leader line, from its point to the centre of its text's box (matplotlib
    draws it to the box's edge, on that line), so that no label is drawn across it, nor it across a label."""
    (px, py), cx, cy = point, (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
    steps = max(2, int(max(abs(cx - px), abs(cy - py)) / 3))
    along = [(px + (cx - px) * t / steps, py + (cy - py) * t / steps) for t in range(2, steps)]
    return [Bbox.from_bounds(x - 1.5, y - 1.5, 3, 3) for x, y in along if not box.contains(x, y)]


def leader_clear(ax: Axes, xy: tuple[float, float], dy: float, box: Bbox, labels: list[Bbox]) -> bool:
    """Whether the leader a label at ``box`` would need (if any) crosses none of the ``labels``."""
    if not needs_leader(dy):
        return True
    return not any(part.overlaps(other) for part in leader_boxes(ax.transData.transform(xy), box) for other in labels)


def _free_label_box(ax: Axes, renderer, xy: tuple[float, float], text: str, size: float, placed: list[Bbox],
                    labels: list[Bbox]) -> tuple[tuple[float, float], Bbox] | None:
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
                and ax.bbox.contains(*box.p1) and leader_clear(ax, xy, dy, box, labels):
            return (dx, dy), box
    return None


def current_star(ax: Axes, current: tuple[float, float] | None) -> None:
    if current is not None:
        ax.plot(*current, "*", color="red", markersize=14, label="current setting", zorder=4)

