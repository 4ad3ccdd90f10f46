"""Matplotlib figures of a generation's statistics (used by the app; each function returns a Figure)."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .stats import BONUS, DRAFT, FIRST, RESAMPLED, TARGET, GenerationStats

METHOD_COLOR, EAGLE_COLOR, OMEGA_COLOR, ACCEPTED_COLOR = "#d95f02", "#1b9e77", "#7570b3", "#1b9e77"
ORIGIN_STYLE = {FIRST: ("#9e9e9e", "1st"), TARGET: ("#9e9e9e", "AR"), RESAMPLED: ("#e7298a", "R"),
                BONUS: ("#e6ab02", "B")}
DEPTH_CMAP = colormaps["viridis"]


def _figure(width: float = 6.4, height: float = 3.4, cols: int = 1) -> tuple[Figure, np.ndarray]:
    """A standalone figure (not registered with pyplot, so nothing accumulates in a long-running server)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, cols, squeeze=False)[0]


def per_position(runs: list[tuple[str, GenerationStats]], omegas: list[float] | None = None) -> Figure:
    """Per draft depth: mean acceptance probability (solid) and empirical rate (dashed) per run, and omega_d."""
    fig, (ax,) = _figure()
    for (label, stats), color in zip(runs, (METHOD_COLOR, EAGLE_COLOR)):
        depth = stats.per_depth()
        x = depth["depth"]
        prob = [np.nan if v is None else v for v in depth["accept_prob"]]
        rate = [np.nan if v is None else v for v in depth["accept_rate"]]
        ax.plot(x, prob, "o-", color=color, label=f"{label}: mean acceptance probability")
        ax.plot(x, rate, "s--", color=color, alpha=0.7, label=f"{label}: empirical acceptance rate")
    ax.set_xlabel("draft position (depth in the draft window)")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    if omegas:
        ax.set_xticks(range(1, len(omegas) + 1))
        twin = ax.twinx()
        twin.plot(range(1, len(omegas) + 1), omegas, "^:", color=OMEGA_COLOR, label="omega_i (schedule)")
        twin.axhline(1.0, color=OMEGA_COLOR, lw=0.6, alpha=0.4)
        twin.set_ylabel("omega_i", color=OMEGA_COLOR)
        twin.set_ylim(0, max(1.1, max(omegas) * 1.1))
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="lower left")
    else:
        ax.legend(fontsize=7, loc="lower left")
    ax.set_title("Acceptance per draft position", fontsize=10)
    return fig


def accepted_lengths(runs: list[tuple[str, GenerationStats]]) -> Figure:
    """Accepted drafts per round along the image, and their histogram."""
    fig, (line, hist) = _figure(9.0, 3.2, cols=2)
    top = 0
    for (label, stats), color in zip(runs, (METHOD_COLOR, EAGLE_COLOR)):
        accepted = stats.accepted_per_round[1:]  # round 0 is the prefill (no drafts)
        top = max([top, *accepted])
        line.step(range(1, len(accepted) + 1), accepted, where="mid", color=color,
                  label=f"{label} (tau={stats.tau:.2f})")
        hist.hist(accepted, bins=np.arange(-0.5, stats.tree_depth + 1.5), color=color, alpha=0.5, label=label)
    line.set_xlabel("round")
    line.set_ylabel("accepted drafts")
    line.set_yticks(range(top + 1))
    line.legend(fontsize=7)
    hist.set_xlabel("accepted drafts in a round")
    hist.set_ylabel("rounds")
    hist.legend(fontsize=7)
    line.set_title("Accepted length per round", fontsize=10)
    hist.set_title("Histogram", fontsize=10)
    return fig


def _grid_axes(ax, image: np.ndarray, grid: tuple[int, int], dim: float = 1.0):
    """Show ``image``; return a function from a token's raster index to its cell ``(x, y, width, height)``."""
    ax.imshow(image * dim, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    cell_h, cell_w = image.shape[0] / grid[0], image.shape[1] / grid[1]

    def cell(index: int) -> tuple[float, float, float, float]:
        row, col = divmod(index, grid[1])
        return col * cell_w - 0.5, row * cell_h - 0.5, cell_w, cell_h
    return cell


def acceptance_map(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], title: str) -> Figure:
    """The token grid over the image: accepted drafts coloured by depth, other origins marked."""
    fig, (ax,) = _figure(4.2, 4.4)
    cell = _grid_axes(ax, image, grid, dim=0.55)
    depth_max = max(1, stats.tree_depth)
    for index, (origin, depth) in enumerate(zip(stats.token_origin, stats.token_depth)):
        x, y, cell_w, cell_h = cell(index)
        if origin == DRAFT:
            color, text = DEPTH_CMAP((depth - 1) / max(1, depth_max - 1)), str(depth)
        else:
            color, text = ORIGIN_STYLE[origin]
        ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor="white", lw=0.4))
        ax.text(x + cell_w / 2, y + cell_h / 2, text, ha="center", va="center", fontsize=7, color="white",
                fontweight="bold")
    legend = [Patch(color=DEPTH_CMAP(i / max(1, depth_max - 1)), label=f"draft depth {i + 1}")
              for i in range(depth_max)] if stats.tree_depth else []
    legend += [Patch(color=ORIGIN_STYLE[RESAMPLED][0], label="R resampled"),
               Patch(color=ORIGIN_STYLE[BONUS][0], label="B bonus"),
               Patch(color=ORIGIN_STYLE[FIRST][0], label="first / AR")]
    ax.legend(handles=legend, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=3, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig


def replay(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], round_index: int) -> Figure:
    """One round: earlier tokens shown, this round's accepted drafts (green) and its extra token (pink if
    resampled after a rejection, outlined red; yellow if a bonus), later cells dark."""
    round_index = int(np.clip(round_index, 0, len(stats.rounds) - 1))
    current = stats.rounds[round_index]
    start, emitted = current.start, len(current.emitted)
    fig, (ax,) = _figure(4.2, 4.4)
    cell = _grid_axes(ax, image, grid)
    for index in range(start, grid[0] * grid[1]):
        x, y, cell_w, cell_h = cell(index)
        if index >= start + emitted:  # not generated yet
            ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor="black", alpha=0.8, lw=0))
            continue
        last = index == start + emitted - 1
        color = ORIGIN_STYLE[current.next_origin][0] if last else ACCEPTED_COLOR
        ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor=color, lw=1.5))
        if last and current.next_origin == RESAMPLED:  # a candidate was rejected in this cell
            ax.add_patch(Rectangle((x, y), cell_w, cell_h, fill=False, edgecolor="red", lw=2.5))
    drafted = sum(current.valid)
    tested = len(current.tested)
    ax.set_title(f"round {round_index}: {drafted} drafted, {tested} tested, {emitted - 1} accepted, "
                 f"+1 {current.next_origin}", fontsize=8)
    return fig


def theory(table: dict, title: str) -> Figure:
    """beta_i, e_i and the chance of reaching position i, with E[N] and the TV bound in the title."""
    fig, (ax,) = _figure(6.4, 3.2)
    x = table["depth"]
    ax.bar(np.array(x) - 0.2, table["beta"], width=0.4, color=EAGLE_COLOR, label="beta_i (acceptance rate)")
    ax.bar(np.array(x) + 0.2, table["cost"], width=0.4, color=METHOD_COLOR, label="e_i (TV cost of step i)")
    ax.plot(x, table["reach"], "k.-", label="P(reach i)")
    ax.set_xticks(x)
    ax.set_xlabel("draft position i")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.set_title(f"{title}\nE[N] = {table['expected_accepted']:.3f} accepted drafts per round, "
                 f"TV bound = {table['tv_bound']:.4f}", fontsize=9)
    return fig


SWEPT = ("delta", "k", "lambda")  # the strength of a relaxation: varies along a family's line


def family(run: dict) -> str:
    """A benchmark run's series: its method and every parameter except the relaxation strength."""
    fixed = ", ".join(f"{key}={value}" for key, value in sorted(run["params"].items()) if key not in SWEPT)
    return f"{run['method']} ({fixed})" if fixed else run["method"]


def tradeoff(runs: list[dict], current: tuple[float, float] | None, x_key: str = "tau",
             y_key: str = "fid") -> Figure:
    """Benchmark results: quality against mean accepted length, one series per method family."""
    fig, (ax,) = _figure(6.4, 3.6)
    families: dict[str, list[dict]] = {}
    for run in runs:
        if run.get(y_key) is not None:
            families.setdefault(family(run), []).append(run)
    for name, items in families.items():
        items = sorted(items, key=lambda r: r[x_key])
        ax.plot([r[x_key] for r in items], [r[y_key] for r in items], "o-", label=name)
    if current is not None:
        ax.plot(*current, "*", color="red", markersize=14, label="current setting")
    ax.set_xlabel("mean accepted length tau (tokens per target forward)")
    ax.set_ylabel({"fid": "judge-FID (lower is better)", "judge_accuracy": "class consistency"}.get(y_key, y_key))
    ax.legend(fontsize=7)
    return fig
