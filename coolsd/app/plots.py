"""Matplotlib figures of a generation's statistics (used by the app; each function returns a Figure).

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
from typing import Iterable, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.figure import Figure, SubFigure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator, PercentFormatter
from matplotlib.transforms import Bbox

from ..core.params import Choice, shorten
from ..core.rules import RULES
from ..core.stats import BONUS, DRAFT, FIRST, RESAMPLED, TARGET, GenerationStats, Round
from ..core.trees import DraftTree, parse_draft

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
MOST_DEPTH_ENTRIES = 8  # more accepted depths than this (a deep Jacobi window) share legend entries by range
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


def _fill(text: str, size: float, width: float) -> str:
    """``text`` wrapped to lines that fit ``width`` inches at ``size`` points (a character is about 0.58 em)."""
    return textwrap.fill(text, max(16, int(width * 72 / (0.58 * size))), break_long_words=False)


def _figure(width: float = WIDE, height: float = 3.6, cols: int = 1, rows: int = 1) -> tuple[Figure, np.ndarray]:
    """A standalone figure (not registered with pyplot, so nothing accumulates in a long-running server), with
    an Agg canvas so that callers and tests can measure its artists after ``fig.canvas.draw()``."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False).flatten()


def _panels(style: Layout, count: int, height: float, stacked_height: float) -> tuple[Figure, np.ndarray]:
    """``count`` panels side by side (desktop; two to a row past two, each further row ``ROW_HEIGHT`` inches) or
    one above the other, ``stacked_height`` inches each (phone). Unused grid cells are removed."""
    if style.stacked and count > 1:
        return _figure(style.width, stacked_height * count, rows=count)
    if count <= 2:
        return _figure(style.width, height, cols=count)
    rows = math.ceil(count / 2)
    fig, axes = _figure(style.width, height + ROW_HEIGHT * (rows - 1), cols=2, rows=rows)
    for ax in axes[count:]:
        fig.delaxes(ax)
    return fig, axes[:count]


def _legend_below(fig: Figure | SubFigure, handles: list, ncol: int, size: float = 9) -> None:
    """A figure legend under the axes: constrained layout shrinks the axes to make room, so it covers nothing."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(ncol, len(handles)), fontsize=size,
                   frameon=False)


def _integer_ticks(*axes) -> None:
    """Ticks only at whole numbers, for counts and positions (no "round 1.5")."""
    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def _position_ticks(axis, values: Sequence[int]) -> None:
    """A tick at every value while there are few (a chain's positions), else whole-number ticks the axis can
    hold: a 16-draft Jacobi window's labels ran together on a phone."""
    if len(values) <= 10:
        axis.set_ticks(list(values))
    else:
        _integer_ticks(axis)


# Names the app shows: from the rule registry ------------------------------------------------------------
SYMBOLS = {"delta": "δ", "nu": "ν", "mu": "μ", "lambda": "λ"}


def _variant(method: str, params: dict | None) -> tuple[str, dict]:
    """The app's entry for a method and its parameters: (label, the parameters that entry fixes)."""
    spec = RULES.get(method)
    if spec is None:
        return method, {}
    for label, fixed in spec.variants.items():
        if all((params or {}).get(key) == value for key, value in fixed.items()):
            return label, fixed
    return spec.label, {}


def method_name(method: str, params: dict | None = None) -> str:
    """The app's label for an internal method name, so figures speak the UI's language."""
    return _variant(method, params)[0]


def swept(method: str) -> tuple[str, ...]:
    """The parameters whose values vary along one of the method's lines (its relaxation strength)."""
    return RULES[method].swept if method in RULES else ()


def _named(method: str, key: str) -> bool:
    """Whether the parameter takes named values (a schedule): shown bare, after the numbers."""
    return method in RULES and isinstance(next((p for p in RULES[method].params if p.name == key), None), Choice)


def _parameter(method: str, key: str, value) -> str:
    """``δ=2`` for a parameter; a named value shows bare (``linear``)."""
    return str(value) if _named(method, key) else f"{SYMBOLS.get(key, key)}={value}"


# A Jacobi window's refresh, as the published method it makes with Eagle-1's rule (spec section 11)
WINDOW_NAMES = {"independent": "SJD", "coupled": "SCD", "gumbel": "Gumbel coupling"}


def _window(run: dict) -> DraftTree | None:
    """The run's Jacobi window, or None for a draft model's draft (or none): the drafter-free runs are told apart
    by how their window is refreshed, not by their method alone (Eagle-1 on a window is SJD, SCD, ...)."""
    draft = run.get("draft")
    if not draft or draft == "none" or not draft.startswith("jacobi"):
        return None
    return parse_draft(draft)


def family(run: dict) -> str:
    """A benchmark run's series: its method and every parameter except the relaxation strength, and for a Jacobi
    window its kind (refresh and fresh-draft law, not its length: ``eagle @ jacobi:coupled:point``). Internal
    names; :func:`family_name` is what the figure shows."""
    fixed = ", ".join(f"{key}={value}" for key, value in sorted(run["params"].items())
                      if key not in swept(run["method"]))
    key = f"{run['method']} ({fixed})" if fixed else run["method"]
    window = _window(run)
    return key if window is None else f"{key} @ jacobi:{window.refresh}:{window.fresh}"


def window_name(window: DraftTree) -> str:
    """``SCD`` for a coupled window whose fresh drafts are point masses (as published), ``SCD, uniform fresh``
    for the other law."""
    return WINDOW_NAMES[window.refresh] + ("" if window.fresh == "point" else f", {window.fresh} fresh")


def family_name(run: dict) -> str:
    """A series' display name: the app's method name plus the fixed parameters, e.g. ``COOL-SD (ν=0.3, linear)``;
    on a Jacobi window, the published method (``SJD``, ``GSD``) or the rule and its window (``COOL-SD on SCD``)."""
    params = run["params"]
    name, in_name = _variant(run["method"], params)
    keys = sorted(params, key=lambda key: (_named(run["method"], key), key))  # "COOL-SD (ν=0.3, linear)"
    fixed = [_parameter(run["method"], key, params[key]) for key in keys
             if key not in swept(run["method"]) and key not in in_name]
    name = f"{name} ({', '.join(fixed)})" if fixed else name
    window = _window(run)
    if window is None:
        return name
    if run["method"] == "eagle":
        return window_name(window)
    if run["method"] == "gsd" and (window.refresh, window.fresh) == ("independent", "point"):
        return name  # GSD as published
    return f"{name} on {window_name(window)}"


def point_label(run: dict) -> str:
    """What varies along a series at this point (``δ=2``, ``k=10, λ=5``); the series' name for a lone point
    (``Eagle-1``, or ``SCD`` for Eagle-1 on a coupled Jacobi window)."""
    method, params = run["method"], run["params"]
    varied = [_parameter(method, key, params[key]) for key in swept(method) if key in params]
    return ", ".join(varied) if varied else family_name(run).split(" (")[0]


# Per-generation figures -----------------------------------------------------------------------------------
def _color(stats: GenerationStats) -> str:
    """Eagle-1 is green in every figure, whether it is the chosen method or the lossless reference."""
    return EAGLE_COLOR if stats.method == "eagle" else METHOD_COLOR


def _drafted(stats: GenerationStats) -> bool:
    """Whether a run has any draft position to show (AR has none)."""
    return stats.tree_depth > 0 and any(v is not None for v in stats.per_depth()["accept_prob"])


def _nan_for_none(values: list) -> list[float]:
    return [np.nan if v is None else v for v in values]


def _omega_curve(ax: Axes, depths: Sequence[int], omegas: Sequence[float]) -> list:
    """omega_d on a right-hand axis, with the lossless omega = 1 line; returns their legend handles."""
    twin = ax.twinx()
    handles = twin.plot(depths, omegas, "^:", color=OMEGA_COLOR, label=r"$\omega_i$ (relaxation schedule, right axis)")
    handles.append(twin.axhline(1.0, color=OMEGA_COLOR, lw=0.8, alpha=0.4,
                                label=r"$\omega_i = 1$ on the right axis: lossless"))
    twin.set_ylabel(r"$\omega_i$", color=OMEGA_COLOR)
    twin.set_ylim(0, max(1.1, max(omegas) * 1.1))
    return handles


def per_position(runs: list[tuple[str, GenerationStats]], omegas: list[float] | None = None, *,
                 narrow: bool = False) -> Figure:
    """Per draft depth: mean acceptance probability (solid) and empirical rate (dashed) per run, and omega_d.
    A run that drafts nothing (AR) adds no series: its legend entries would describe empty lines."""
    style = layout(narrow)
    fig, (ax,) = _figure(style.width, 4.6 if narrow else 3.8)
    fig.suptitle("Acceptance per draft position", fontsize=style.title)
    shown = [(label, stats, _color(stats)) for label, stats in runs if _drafted(stats)]
    skipped = [label for label, stats in runs if not _drafted(stats)]
    if not shown and not omegas:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "AR drafts nothing:\nno draft positions to show", transform=ax.transAxes, ha="center",
                va="center", fontsize=12, color="0.35")
        return fig
    if skipped:
        ax.set_title(_fill(f"{' and '.join(skipped)} drafts nothing (not shown)", style.subtitle, style.width),
                     fontsize=style.subtitle)
    depth = max([len(omegas or [])] + [stats.tree_depth for _, stats, _ in shown])
    for label, stats, color in shown:
        per_depth = stats.per_depth()
        ax.plot(per_depth["depth"], _nan_for_none(per_depth["accept_prob"]), "o-", color=color,
                label=f"{label}: mean acceptance probability")
        ax.plot(per_depth["depth"], _nan_for_none(per_depth["accept_rate"]), "s--", color=color, alpha=0.7,
                label=f"{label}: empirical acceptance rate")
    _position_ticks(ax.xaxis, range(1, depth + 1))
    ax.set_xlim(0.7, depth + 0.3)
    ax.set_xlabel(_fill("draft position (depth in the draft window)", 10, style.width - 1))
    ax.set_ylabel("probability / rate")
    ax.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0]
    if omegas:
        handles += _omega_curve(ax, range(1, len(omegas) + 1), omegas)
    _legend_below(fig, handles, ncol=min(2, style.columns), size=style.legend)
    return fig


def _accepted(stats: GenerationStats) -> list[int]:
    return stats.accepted_per_round[1:]  # round 0 is the prefill (no drafts)


def accepted_lengths(runs: list[tuple[str, GenerationStats]], *, narrow: bool = False) -> Figure:
    """Accepted drafts per round along the image, and how often each count occurs (bars side by side, so that
    neither run hides the other); on a phone the two panels stand one above the other."""
    style = layout(narrow)
    fig, (line, hist) = _panels(style, 2, 3.8, 2.8)
    fig.suptitle(_fill("Accepted drafts per round (round 0, the prefill, left out)", style.title, style.width),
                 fontsize=style.title)
    longest = max([0] + [stats.tree_depth for _, stats in runs])
    counts = np.arange(longest + 1)
    width = 0.8 / max(1, len(runs))
    for i, (label, stats) in enumerate(runs):
        accepted, color = _accepted(stats), _color(stats)
        line.step(range(1, len(accepted) + 1), accepted, where="mid", color=color,
                  label=f"{label} (τ = {stats.tau:.2f} tokens per target forward)")
        rounds = np.bincount(accepted, minlength=longest + 1)[:longest + 1] if accepted else np.zeros_like(counts)
        hist.bar(counts + (i - (len(runs) - 1) / 2) * width, rounds, width=width, color=color, alpha=0.8)
    line.set_xlabel("round")
    line.set_ylabel("accepted drafts")
    line.set_ylim(-0.3, longest + 0.3)
    line.set_title("along the image", fontsize=style.subtitle)
    hist.set_xlabel("accepted drafts in a round")
    hist.set_ylabel("rounds")
    _position_ticks(hist.xaxis, counts)
    hist.set_title("how often each count occurs", fontsize=style.subtitle)
    _integer_ticks(line.xaxis, line.yaxis, hist.yaxis)
    _legend_below(fig, line.get_legend_handles_labels()[0], ncol=1, size=style.legend)
    return fig


def _grid_axes(ax, image: np.ndarray, grid: tuple[int, int], dim: float = 1.0):
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


def _add_cells(ax: Axes, cells: list[Rectangle]) -> None:
    """Draw token cells as one collection, each keeping its own style: a patch per cell costs a limits update
    each, most of a map's or a replay's drawing time. The image already fixes the axes' limits."""
    if cells:
        ax.add_collection(PatchCollection(cells, match_original=True), autolim=False)


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


def _source_legend(sources: Iterable[str]) -> list[Line2D]:
    """An entry per Jacobi source among ``sources`` (none for the draft model's drafts), in SOURCE_STYLE's order."""
    present = set(sources)
    return [Line2D([], [], ls="", marker=marker, markersize=7, markerfacecolor=color, markeredgecolor=SOURCE_EDGE,
                   label=text) for source, (marker, color, text) in SOURCE_STYLE.items() if source in present]


def _source_marks(ax: Axes, points: dict[str, list[tuple[float, float]]], size: float) -> None:
    """One scatter per source that has points (its label the source's name, for legends and tests), ``size``
    points wide, above the cells."""
    for source, (marker, color, _) in SOURCE_STYLE.items():
        at = np.array(points.get(source, []), dtype=float).reshape(-1, 2)
        if len(at):
            ax.scatter(at[:, 0], at[:, 1], s=size ** 2, marker=marker, c=color, edgecolors=SOURCE_EDGE,
                       linewidths=0.6, zorder=4, label=source)


def _mark_size(width: float, columns: int, share: float, most: float) -> float:
    """A mark's size in points: ``share`` of a cell of a ``width``-inch image with ``columns`` cells a row (the
    axes take about 0.85 of it), at most ``most``."""
    return min(most, share * width * 72 * 0.85 / max(1, columns))


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
    return entries + _source_legend(_accepted_sources(stats))


def acceptance_map(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], title: str, *,
                   narrow: bool = False) -> Figure:
    """The token grid over the image: accepted drafts coloured by depth, other origins marked."""
    style = layout(narrow)
    legend = _origin_legend(stats)
    fig, (ax,) = _figure(style.map_width, 4.4 + 0.2 * math.ceil(len(legend) / 2))
    fig.suptitle(_fill(f"{title}: where each token came from", style.subtitle + 1, style.map_width),
                 fontsize=style.subtitle + 1)
    cell = _grid_axes(ax, image, grid, dim=0.55)
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
    _add_cells(ax, cells)
    _source_marks(ax, marks, _mark_size(style.map_width, grid[1], 0.22, 5))
    _legend_below(fig, legend, ncol=2, size=style.legend)
    return fig


# Replay: one round on the image, and the tree it drafted ---------------------------------------------------
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
        ax.text(0.5, 0.5, _fill(why, style.subtitle, style.width / 2), transform=ax.transAxes, ha="center",
                va="center", fontsize=style.subtitle, color="0.35")
    else:
        _draw_tree(ax, tree, current, style.small)
    invalid = len(current.valid) - sum(current.valid)
    counts = f"{len(current.drafted)} nodes" + (f" ({invalid} invalid)" if invalid else "")
    ax.set_title(_fill(f"drafted tree: {counts}, {tested} tested, {accepted} accepted", style.subtitle,
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
    cell = _grid_axes(ax, image, grid)
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
    _add_cells(ax, cells)
    centres = {}
    for source, indices in window_sources(current, grid[0] * grid[1]).items():
        centres[source] = [(x + w / 2, y + h / 2) for x, y, w, h in map(cell, indices)]
    _source_marks(ax, centres, mark)
    ax.set_title(_emitted_words(current), fontsize=size)


def _emitted_words(current: Round) -> str:
    """What the round added to the image, in words."""
    if current.next_origin == FIRST:
        return "the prefill: the target samples the first token"
    if not current.drafted:
        return "1 token, sampled by the target"
    return f"{len(current.emitted)} tokens: {current.accepted} accepted drafts + 1 {current.next_origin}"


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
    sources = _source_legend(source for past in stats.rounds for source in past.sources)  # every round's: held still
    for panel, legend, ncol in zip(panels, (_replay_legend() + sources, _tree_legend()), (1, 2)):
        _legend_below(panel, legend, ncol=ncol, size=style.legend)
    width = style.width if style.stacked else style.width / 2
    _image_panel(panels[0].subplots(), image, grid, current, style.subtitle, _mark_size(width, grid[1], 0.4, 7))
    _tree_panel(panels[1].subplots(), stats, current, style)
    fig.suptitle(f"{method_name(stats.method, stats.params)}: round {round_index} of {len(stats.rounds) - 1}",
                 fontsize=style.subtitle + 1)
    return fig


def theory(table: dict, title: str, *, narrow: bool = False) -> Figure:
    """beta_i, e_i and the chance of reaching position i, with E[N] and the TV bound in the title; omega_i on
    the right when the table gives one (``table["omega"]`` missing or with ``None`` entries: the rule has no
    schedule, e.g. Eagle-1 or LANTERN++, and no omega curve is drawn)."""
    style = layout(narrow)
    fig, (ax,) = _figure(style.width, 4.4 if narrow else 3.8)
    fig.suptitle(_fill(f"Theory of one round: {title}", style.title, style.width), fontsize=style.title)
    ax.set_title(_fill(f"E[N] = {table['expected_accepted']:.3f} accepted drafts per round, "
                       f"TV bound = {table['tv_bound']:.4f}", style.subtitle, style.width), fontsize=style.subtitle)
    x = np.array(table["depth"])
    ax.bar(x - 0.2, table["beta"], width=0.4, color=EAGLE_COLOR, label=r"$\beta_i$: acceptance rate at position $i$")
    ax.bar(x + 0.2, table["cost"], width=0.4, color=METHOD_COLOR, label=r"$e_i$: TV cost of step $i$")
    ax.plot(x, table["reach"], "k.-", label=r"P(reach position $i$)")
    _position_ticks(ax.xaxis, x)
    ax.set_xlabel(r"draft position $i$")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0]
    omegas = table.get("omega")
    if omegas and all(w is not None for w in omegas):
        handles += _omega_curve(ax, x, omegas)
    _legend_below(fig, handles, ncol=style.columns, size=style.legend)
    return fig


# Benchmark trade-off ------------------------------------------------------------------------------------
METRIC_LABELS = {"fid": "judge-FID (lower is better)", "judge_accuracy": "class consistency (higher is better)",
                 "log_likelihood_per_token": "log-likelihood per token under the target (nats)",
                 "tau": "mean accepted length τ (tokens per target forward)"}
DIFFERENCE_LABELS = {"log_likelihood_per_token": "log-likelihood per token minus Eagle-1's (nats)",
                     "fid": "judge-FID minus Eagle-1's (lower is better)",
                     "judge_accuracy": "class consistency minus Eagle-1's"}
LABEL_OFFSETS = [(5, 4), (5, -12), (-5, 4), (-5, -12), (5, 14), (5, -22), (-5, 14), (-5, -22), (12, -4),
                 (-12, -4), (5, 24), (5, -32), (-5, 24), (-5, -32), (5, -42), (-5, -42), (5, 34), (-5, 34)]  # points


def _label_points(ax: Axes, points: list[tuple[float, float, str]], size: float = 8,
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


def _benchmark_images(runs: list[dict]) -> int | None:
    """Images per method behind the benchmark's FID (each run records it as ``fid_images``)."""
    return max([run.get("fid_images") or 0 for run in runs], default=0) or None


def is_study(runs: list[dict]) -> bool:
    """A study compares every run with Eagle-1 on the same images (``vs_eagle``: paired intervals)."""
    return any("vs_eagle" in run for run in runs)


def _at_defaults(run: dict) -> bool:
    """Whether a run's fixed (not swept) parameters are its method's defaults; one not recorded counts as one."""
    spec = RULES.get(run["method"])
    return spec is None or all(run["params"].get(p.name, p.default) == p.default
                               for p in spec.params if p.name not in spec.swept)


def family_choices(runs: list[dict], study: bool = False) -> dict[str, str]:
    """Every series the benchmark can draw, display name -> key (:func:`family`), in the benchmark's order: the
    choices to offer beside the figure. In the study's figure (``study``) AR is the noise floor, not a series."""
    return {family_name(run): family(run) for run in runs if not (study and run["method"] == "ar")}


def default_families(runs: list[dict], study: bool = False) -> list[str]:
    """The series drawn unless others are chosen: each method at the app's default parameters (AR, Eagle-1,
    COOL-SD ν=0.7 exp, UniformRSD, LANTERN++ with G*); every series when none is at its defaults."""
    keys = list(dict.fromkeys(family_choices(runs, study).values()))
    chosen = [key for key in keys if any(_at_defaults(run) for run in runs if family(run) == key)]
    return chosen or keys


def _chosen(runs: list[dict], families: Sequence[str] | None, study: bool) -> set[str]:
    """The series keys to draw: ``families`` (checked against the benchmark's), or the defaults."""
    if families is None:
        return set(default_families(runs, study))
    available = list(dict.fromkeys(family_choices(runs).values()))  # AR too: a study just has no line for it
    unknown = [key for key in families if key not in available]
    if unknown:
        raise ValueError(f"families: unknown series {shorten(unknown[0])}; this benchmark has: {', '.join(available)}")
    return set(families)


def pair_noise(runs: list[dict], key: str) -> float | None:
    """AR against Eagle-1 in a plain benchmark: both sample the target's own distribution, so their largest
    difference on ``key`` is a measured (if rough) size of its noise; None without both."""
    ar = [run[key] for run in runs if run["method"] == "ar" and run.get(key) is not None]
    eagle = [run[key] for run in runs if run["method"] == "eagle" and run.get(key) is not None]
    return max(abs(a - e) for a in ar for e in eagle) if ar and eagle else None


def _pair_note(runs: list[dict], key: str) -> str:
    noise = pair_noise(runs, key)
    if noise is None:
        return "noise unknown: this benchmark has no AR and Eagle-1 pair to measure it"
    return (f"AR and Eagle-1 (the same distribution) differ by {noise:.2g} here: "
            "differences of that size can be noise")


def _current_star(ax: Axes, current: tuple[float, float] | None) -> None:
    if current is not None:
        ax.plot(*current, "*", color="red", markersize=14, label="current setting", zorder=4)


def _tradeoff_series(ax: Axes, runs: list[dict], chosen: set[str], x_key: str, y_key: str) -> list:
    """One line per chosen series (a study's drafts apart); each series keeps its colour and marker whichever
    others are shown. Returns the points to label."""
    series: dict[str, list[dict]] = {}
    several_drafts = len({run["draft"] for run in runs if run["method"] != "ar"}) > 1
    for run in runs:
        if run.get(y_key) is not None:
            name = family_name(run) + (f" · {run['draft']}" if several_drafts and run["method"] != "ar" else "")
            series.setdefault(name, []).append(run)
    points = []
    for i, (name, items) in enumerate(series.items()):
        if family(items[0]) in chosen:
            items = sorted(items, key=lambda r: r[x_key])
            xs, ys = [r[x_key] for r in items], [r[y_key] for r in items]
            ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}", ls="-", label=name)
            points += [(x, y, point_label(r)) for x, y, r in zip(xs, ys, items)]
    return points


def tradeoff(runs: list[dict], current: tuple[float, float] | None, x_key: str = "tau", y_key: str = "fid",
             images: int | None = None, *, families: Sequence[str] | None = None, narrow: bool = False) -> Figure:
    """Benchmark results: quality against mean accepted length, one series per method family (``families``:
    the keys of :func:`family_choices` to draw; default :func:`default_families`), each point labelled with
    its relaxation strength, and the benchmark's own AR-against-Eagle-1 difference as its noise note."""
    style, chosen = layout(narrow), _chosen(runs, families, study=False)
    fig, (ax,) = _figure(style.width, 6.4 if narrow else 4.4)
    images = images or _benchmark_images(runs)
    fig.suptitle(_fill("Quality against speed: the shipped benchmark" + (f" ({images} images per method)"
                                                                         if images else ""), style.title, style.width),
                 fontsize=style.title)
    measured = any(run.get(y_key) is not None for run in runs)
    if measured:
        ax.set_title(_fill(_pair_note(runs, y_key), style.subtitle, style.width), fontsize=style.subtitle,
                     style="italic", color="0.3")
    points = _tradeoff_series(ax, runs, chosen, x_key, y_key)
    if not points:
        said = (f"this benchmark did not record {METRIC_LABELS.get(y_key, y_key).split(' (')[0]}" if not measured
                else "no series chosen")
        ax.text(0.5, 0.5, said, ha="center", va="center", transform=ax.transAxes, fontsize=style.subtitle)
    _current_star(ax, current)
    ax.set_xlabel(_fill(METRIC_LABELS.get(x_key, x_key), 10, style.width - 1))
    ax.set_ylabel(_fill(METRIC_LABELS.get(y_key, y_key), 10, 3.6))
    if y_key == "judge_accuracy":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.margins(x=0.12, y=0.12)
    handles = ax.get_legend_handles_labels()[0]
    if handles and narrow:
        _legend_below(fig, handles, ncol=1, size=style.legend)
    elif handles:
        fig.legend(handles=handles, loc="outside right center", fontsize=style.legend, frameon=False)
    fig.canvas.draw()
    _label_points(ax, points, style.small, star=current)
    return fig


# Study figures (the app's Trade-off tab, and bench --plots DIR for docs/results.md) ------------------------------
# the point of each family whose acceptance curve the per-position figure shows
REPRESENTATIVE = {"cool": {"delta": 2}, "uniform": {"delta": 2}, "lantern": {"k": 10, "lambda": 5}}
MARKERS = "osD^vP*Xh"
# tab20's dark colours, then its light ones: a study's 20-odd series (drafter and drafter-free) each get their own
SERIES_COLORS = [colormaps["tab20"](i) for i in (*range(0, 20, 2), *range(1, 20, 2))]


def noise_floor(result: dict, metric: str) -> dict | None:
    """The study's AR-minus-Eagle-1 paired interval on ``metric`` (``value``, ``low``, ``high``): both sample
    the target's own distribution, so a difference from Eagle-1 inside it is not resolved. None without AR."""
    ar = next((r for r in result.get("runs", []) if r["method"] == "ar" and metric in r.get("vs_eagle", {})), None)
    return ar["vs_eagle"][metric] if ar is not None else None


def reference(run: dict) -> str:
    """The run a study compares this one with on the same images: AR for a drafter-free run (its own
    reference: a Jacobi window's lossless rule is already SJD or SCD), else Eagle-1 on the same draft."""
    return "vs_ar" if _window(run) is not None else "vs_eagle"


def study_difference(run: dict, metric: str) -> dict | None:
    """The run's paired difference on ``metric`` from its :func:`reference` (``value``, ``low``, ``high``)."""
    return run.get(reference(run), {}).get(metric)


def panel(draft: str) -> str:
    """The study panel a draft's runs go in: each draft model's draft alone, Jacobi windows by length whatever
    their refresh (so SJD, SCD, Gumbel coupling, GSD and COOL-SD on SCD share axes)."""
    tree = parse_draft(draft)
    return f"jacobi:{tree.depth}" if tree.source == "jacobi" else draft


def panel_title(key: str) -> str:
    return f"Jacobi windows of {key.split(':')[1]}, against AR" if key.startswith("jacobi") else f"draft model, {key}"


def _mirrored(floor: dict | None) -> dict | None:
    """The noise floor as Eagle-1 minus AR: the band for a panel measured against AR."""
    return None if floor is None else {"value": -floor["value"], "low": -floor["high"], "high": -floor["low"]}


def quietest_measure(result: dict) -> str | None:
    """The quality measure the study resolves best: the smallest ratio of its noise floor's width (AR minus
    Eagle-1, paired 95% interval; without an AR run, the runs' median interval width) to the spread (standard
    deviation) of the configurations' differences from Eagle-1. None when the result has no paired intervals."""
    scores = {}
    for metric in DIFFERENCE_LABELS:
        differences = [r["vs_eagle"][metric] for r in result.get("runs", [])
                       if r["method"] not in ("ar", "eagle") and metric in r.get("vs_eagle", {})]
        spread = np.std([d["value"] for d in differences]) if len(differences) > 1 else 0.0
        if spread > 0:
            floor = noise_floor(result, metric)
            width = floor["high"] - floor["low"] if floor else np.median([d["high"] - d["low"] for d in differences])
            scores[metric] = width / spread
    return min(scores, key=scores.get) if scores else None


def _study_families(runs: list[dict]) -> dict[str, list[dict]]:
    """Speculative runs by family (method, fixed parameters and Jacobi window kind), each sorted by tau; AR has
    no draft."""
    families: dict[str, list[dict]] = {}
    for run in runs:
        if run["method"] != "ar":
            families.setdefault(family_name(run), []).append(run)
    return {name: sorted(items, key=lambda r: r["tau"]) for name, items in families.items()}


def _study_axes(result: dict, height: float, style: Layout
                ) -> tuple[Figure, list[tuple[Axes, str]], dict[str, tuple[str, str]]]:
    """One panel per :func:`panel` (side by side, two to a row past two; stacked on a phone), and one (colour,
    marker) per family, the same in every panel and whichever families are shown."""
    drafts = result.get("drafts") or sorted({r["draft"] for r in result["runs"] if r["method"] != "ar"})
    keys = list(dict.fromkeys(panel(draft) for draft in drafts))
    fig, axes = _panels(style, len(keys), height, 4.2)
    styles = {name: (SERIES_COLORS[i % len(SERIES_COLORS)], MARKERS[i % len(MARKERS)])
              for i, name in enumerate(_study_families(result["runs"]))}
    return fig, list(zip(axes, keys)), styles


def _study_legend(fig: Figure, axes: list[tuple[Axes, str]], style: Layout, extra: Sequence = ()) -> None:
    handles = {}
    for ax, _ in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    longest = max((len(label) for label in handles), default=0)  # long names (Jacobi series) take two columns
    _legend_below(fig, list(handles.values()) + list(extra), ncol=style.columns if longest <= 30 else
                  min(style.columns, 2), size=style.legend)


def _band(floor: dict | None, mirrored: bool) -> Patch | None:
    """The noise floor's legend entry, with its numbers; ``mirrored``: some panels, against AR, draw its mirror."""
    if floor is None:
        return None
    said = "AR − Eagle-1; against AR, its mirror" if mirrored else "AR − Eagle-1"
    return Patch(facecolor=NOISE_COLOR, label=f"noise floor ({said}):\n"
                                              f"{floor['value']:+.3g} [{floor['low']:+.3g}, {floor['high']:+.3g}]")


def _quality_panel(ax: Axes, runs: list[dict], metric: str, styles: dict, floor: dict | None) -> tuple[list, list]:
    """One panel's differences from their references with their paired intervals over the noise floor's band;
    returns the points to label and the bars they must not cover."""
    if floor is not None:
        ax.axhspan(floor["low"], floor["high"], color=NOISE_COLOR, zorder=0, lw=0)
    ax.axhline(0, color="0.5", lw=0.8, ls="--")
    points, spans = [], []
    for name, items in _study_families(runs).items():
        color, marker = styles[name]
        differences = [study_difference(r, metric) for r in items]
        values = np.array([d["value"] for d in differences])
        lows, highs = np.array([d["low"] for d in differences]), np.array([d["high"] for d in differences])
        ax.errorbar([r["tau"] for r in items], values, yerr=[values - lows, highs - values], color=color,
                    marker=marker, ms=4, capsize=2, lw=1, label=name)
        points += [(r["tau"], v, point_label(r)) for r, v in zip(items, values)]
        spans += [(r["tau"], low, high) for r, low, high in zip(items, lows, highs)]
    return points, spans


def study_quality(result: dict, metric: str | None = None, current: tuple[str, float, float] | None = None, *,
                  families: Sequence[str] | None = None, narrow: bool = False) -> Figure:
    """The paper's quality/speed view with its noise: each configuration's quality minus Eagle-1's on the same
    images (a drafter-free one's minus AR's: :func:`reference`), against tau, with the paired 95% bootstrap
    interval as a bar and the study's measured noise floor (AR minus Eagle-1) as a grey band; one panel per
    draft model's draft and per Jacobi window length, each point labelled with its relaxation strength.
    ``metric`` defaults to :func:`quietest_measure`; ``families`` as in :func:`tradeoff`; ``current``
    (draft, tau, difference) stars the app's current setting."""
    metric = metric or quietest_measure(result) or next(iter(DIFFERENCE_LABELS))
    style = layout(narrow)
    chosen = _chosen(result["runs"], families, study=True)
    fig, axes, styles = _study_axes(result, 5.6, style)
    floor = noise_floor(result, metric)
    title = (f"Quality against speed: minus Eagle-1 (drafter-free runs: minus AR) on the same {result['images']} "
             "images (bars: paired 95% intervals)" + ("" if floor else "; no AR run, so the noise floor is unknown"))
    fig.suptitle(_fill(title, style.title, style.width), fontsize=style.title)
    labels = []
    for ax, key in axes:
        in_panel = [r for r in result["runs"] if r["method"] != "ar" and panel(r["draft"]) == key]
        runs = [r for r in in_panel if study_difference(r, metric) is not None and family(r) in chosen]
        star = current[1:] if current is not None and panel(current[0]) == key else None
        band = _mirrored(floor) if key.startswith("jacobi") else floor
        labels.append((ax, *_quality_panel(ax, runs, metric, styles, band), star))
        _current_star(ax, star)
        if not any(metric in r.get("vs_eagle", {}) for r in result["runs"]):
            ax.text(0.5, 0.5, f"this study did not record {METRIC_LABELS.get(metric, metric).split(' (')[0]}",
                    ha="center", va="center", transform=ax.transAxes, fontsize=style.subtitle)
        elif not runs:  # every series unticked: the panel's tau range, not matplotlib's empty -0.06..0.06
            taus = [r["tau"] for r in in_panel] or [1.0]
            ax.set_xlim(min(taus) - 0.1, max(taus) + 0.1)
            ax.text(0.5, 0.5, "no series chosen", ha="center", va="center", transform=ax.transAxes,
                    fontsize=style.subtitle)
        ax.set_title(panel_title(key), fontsize=style.subtitle)
        ax.set_xlabel(METRIC_LABELS["tau"].split(" (")[0])
        label = DIFFERENCE_LABELS.get(metric, metric)
        label = label.replace("Eagle-1", "AR") if key.startswith("jacobi") else label
        ax.set_ylabel(_fill(label, 10, 3.2 if style.stacked or len(axes) > 2 else 4.4))
        ax.margins(x=0.1, y=0.1)
    mirrored = any(key.startswith("jacobi") for _, key in axes)
    _study_legend(fig, axes, style, [band for band in [_band(floor, mirrored)] if band])
    fig.canvas.draw()
    for ax, points, spans, star in labels:
        _label_points(ax, points, style.small, spans, star)
    return fig


def study_speedup(result: dict, *, narrow: bool = False) -> Figure:
    """Measured speed-up over AR against tau, per draft: how much of tau the round's cost leaves."""
    style = layout(narrow)
    fig, axes, styles = _study_axes(result, 4.6, style)
    fig.suptitle(_fill(f"Speed-up over AR against tau ({result.get('latency_images', result['images'])} timed "
                       f"images per configuration, {result.get('device', 'cpu')}, {result.get('threads', 1)} "
                       "thread(s))", style.title, style.width), fontsize=style.title)
    for ax, key in axes:
        ax.axhline(1, color="0.5", lw=0.8, ls="--")
        runs = [r for r in result["runs"] if r["method"] != "ar" and panel(r["draft"]) == key]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            ax.plot([r["tau"] for r in items], [r["speedup_vs_ar"] for r in items], color=color, marker=marker,
                    ms=4, lw=1, label=name)
        ax.set_title(panel_title(key), fontsize=style.subtitle)
        ax.set_xlabel(METRIC_LABELS["tau"].split(" (")[0])
        ax.set_ylabel(_fill("speed-up over AR (ratio of median latencies)", 10, 3.2))
    _study_legend(fig, axes, style)
    return fig


def _representative(items: list[dict]) -> dict:
    """The family's point named in REPRESENTATIVE, else its middle point by tau."""
    wanted = REPRESENTATIVE.get(items[0]["method"], {})
    chosen = [r for r in items if wanted and all(r["params"].get(k) == v for k, v in wanted.items())]
    return chosen[0] if chosen else items[len(items) // 2]


def study_acceptance(result: dict, *, narrow: bool = False) -> Figure:
    """P(accept at a draft position | reached), pooled over every round of every image, one line per family
    (its representative point) and per draft."""
    style = layout(narrow)
    fig, axes, styles = _study_axes(result, 4.6, style)
    fig.suptitle(_fill("Acceptance per draft position (pooled over all rounds that reached it)", style.title,
                       style.width), fontsize=style.title)
    for ax, key in axes:
        runs = [r for r in result["runs"] if r["method"] != "ar" and panel(r["draft"]) == key
                and r.get("per_depth", {}).get("depth")]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            run = _representative(items)
            depths = run["per_depth"]
            ax.plot(depths["depth"], _nan_for_none(depths["accept_prob"]), color=color, marker=marker, ms=4, lw=1,
                    label=f"{name}, {point_label(run)}" if len(items) > 1 else name)
        ax.set_title(panel_title(key), fontsize=style.subtitle)
        ax.set_xlabel("draft position (depth)")
        ax.set_ylim(0, 1.02)
        _integer_ticks(ax.xaxis)
    axes[0][0].set_ylabel("P(accept | reached)")
    _study_legend(fig, axes, style)
    return fig


def study_figures(result: dict, *, narrow: bool = False) -> dict[str, Figure]:
    """Every study figure by file stem: quality (each recorded measure, every family), speed-up and acceptance
    per position."""
    recorded = {m for r in result["runs"] for m in r.get("vs_eagle", {})}
    every = list(dict.fromkeys(family_choices(result["runs"], study=True).values()))
    figures = {f"quality_{m}": study_quality(result, m, families=every, narrow=narrow)
               for m in DIFFERENCE_LABELS if m in recorded}
    figures["speedup"] = study_speedup(result, narrow=narrow)
    if any(r.get("per_depth", {}).get("depth") for r in result["runs"]):
        figures["acceptance"] = study_acceptance(result, narrow=narrow)
    return figures
