"""One generation's figures beside its images: acceptance per draft position (with COOL-SD's omega_i) and the
drafts accepted per round, for the chosen method and Eagle-1."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ...core.stats import GenerationStats
from .style import (EAGLE_COLOR, METHOD_COLOR, OMEGA_COLOR, fill, figure, integer_ticks, layout, legend_below,
                    nan_for_none, panels, position_ticks)


def _color(stats: GenerationStats) -> str:
    """Eagle-1 is green in every figure, whether it is the chosen method or the lossless reference."""
    return EAGLE_COLOR if stats.method == "eagle" else METHOD_COLOR


def _drafted(stats: GenerationStats) -> bool:
    """Whether a run has any draft position to show (AR has none)."""
    return stats.tree_depth > 0 and any(v is not None for v in stats.per_depth()["accept_prob"])


def omega_curve(ax: Axes, depths: Sequence[int], omegas: Sequence[float]) -> list:
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
    fig, (ax,) = figure(style.width, 4.6 if narrow else 3.8)
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
        ax.set_title(fill(f"{' and '.join(skipped)} drafts nothing (not shown)", style.subtitle, style.width),
                     fontsize=style.subtitle)
    depth = max([len(omegas or [])] + [stats.tree_depth for _, stats, _ in shown])
    for label, stats, color in shown:
        per_depth = stats.per_depth()
        ax.plot(per_depth["depth"], nan_for_none(per_depth["accept_prob"]), "o-", color=color,
                label=f"{label}: mean acceptance probability")
        ax.plot(per_depth["depth"], nan_for_none(per_depth["accept_rate"]), "s--", color=color, alpha=0.7,
                label=f"{label}: empirical acceptance rate")
    position_ticks(ax.xaxis, range(1, depth + 1))
    ax.set_xlim(0.7, depth + 0.3)
    ax.set_xlabel(fill("draft position (depth in the draft window)", 10, style.width - 1))
    ax.set_ylabel("probability / rate")
    ax.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0]
    if omegas:
        handles += omega_curve(ax, range(1, len(omegas) + 1), omegas)
    legend_below(fig, handles, ncol=min(2, style.columns), size=style.legend)
    return fig


def _accepted(stats: GenerationStats) -> list[int]:
    return stats.accepted_per_round[1:]  # round 0 is the prefill (no drafts)


def accepted_lengths(runs: list[tuple[str, GenerationStats]], *, narrow: bool = False) -> Figure:
    """Accepted drafts per round along the image, and how often each count occurs (bars side by side, so that
    neither run hides the other); on a phone the two panels stand one above the other."""
    style = layout(narrow)
    fig, (line, hist) = panels(style, 2, 3.8, 2.8)
    fig.suptitle(fill("Accepted drafts per round (round 0, the prefill, left out)", style.title, style.width),
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
    position_ticks(hist.xaxis, counts)
    hist.set_title("how often each count occurs", fontsize=style.subtitle)
    integer_ticks(line.xaxis, line.yaxis, hist.yaxis)
    legend_below(fig, line.get_legend_handles_labels()[0], ncol=1, size=style.legend)
    return fig
