"""The study's figures (the app's Trade-off tab, and ``bench --plots DIR`` for docs/results.md): each
configuration's quality minus its reference's with paired intervals over the noise floor, the speed-up over AR
and the acceptance per draft position, one panel per draft model's draft and per Jacobi window length."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ...core.trees import parse_draft
from ..series import family, family_name, jacobi_window, point_label
from .labels import current_star, label_points
from .style import (MARKERS, NOISE_COLOR, Layout, fill, integer_ticks, layout, legend_below, nan_for_none,
                    panels)
from .benchmark import METRIC_LABELS, chosen_series, family_choices

DIFFERENCE_LABELS = {"log_likelihood_per_token": "log-likelihood per token minus Eagle-1's (nats)",
                     "fid": "judge-FID minus Eagle-1's (lower is better)",
                     "judge_accuracy": "class consistency minus Eagle-1's"}
# the point of each family whose acceptance curve the per-position figure shows
REPRESENTATIVE = {"cool": {"delta": 2}, "uniform": {"delta": 2}, "lantern": {"k": 10, "lambda": 5}}
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
    return "vs_ar" if jacobi_window(run) is not None else "vs_eagle"


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
    fig, axes = panels(style, len(keys), height, 4.2)
    styles = {name: (SERIES_COLORS[i % len(SERIES_COLORS)], MARKERS[i % len(MARKERS)])
              for i, name in enumerate(_study_families(result["runs"]))}
    return fig, list(zip(axes, keys)), styles


def _study_legend(fig: Figure, axes: list[tuple[Axes, str]], style: Layout, extra: Sequence = ()) -> None:
    handles = {}
    for ax, _ in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    longest = max((len(label) for label in handles), default=0)  # long names (Jacobi series) take two columns
    legend_below(fig, list(handles.values()) + list(extra), ncol=style.columns if longest <= 30 else
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
    chosen = chosen_series(result["runs"], families, study=True)
    fig, axes, styles = _study_axes(result, 5.6, style)
    floor = noise_floor(result, metric)
    title = (f"Quality against speed: minus Eagle-1 (drafter-free runs: minus AR) on the same {result['images']} "
             "images (bars: paired 95% intervals)" + ("" if floor else "; no AR run, so the noise floor is unknown"))
    fig.suptitle(fill(title, style.title, style.width), fontsize=style.title)
    labels = []
    for ax, key in axes:
        in_panel = [r for r in result["runs"] if r["method"] != "ar" and panel(r["draft"]) == key]
        runs = [r for r in in_panel if study_difference(r, metric) is not None and family(r) in chosen]
        star = current[1:] if current is not None and panel(current[0]) == key else None
        band = _mirrored(floor) if key.startswith("jacobi") else floor
        labels.append((ax, *_quality_panel(ax, runs, metric, styles, band), star))
        current_star(ax, star)
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
        ax.set_ylabel(fill(label, 10, 3.2 if style.stacked or len(axes) > 2 else 4.4))
        ax.margins(x=0.1, y=0.1)
    mirrored = any(key.startswith("jacobi") for _, key in axes)
    _study_legend(fig, axes, style, [band for band in [_band(floor, mirrored)] if band])
    fig.canvas.draw()
    for ax, points, spans, star in labels:
        label_points(ax, points, style.small, spans, star, rules=(0,))  # the dashed line: no difference
    return fig


def study_speedup(result: dict, *, narrow: bool = False) -> Figure:
    """Measured speed-up over AR against tau, per draft: how much of tau the round's cost leaves."""
    style = layout(narrow)
    fig, axes, styles = _study_axes(result, 4.6, style)
    fig.suptitle(fill(f"Speed-up over AR against tau ({result.get('latency_images', result['images'])} timed "
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
        ax.set_ylabel(fill("speed-up over AR (ratio of median latencies)", 10, 3.2))
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
    fig.suptitle(fill("Acceptance per draft position (pooled over all rounds that reached it)", style.title,
                      style.width), fontsize=style.title)
    for ax, key in axes:
        runs = [r for r in result["runs"] if r["method"] != "ar" and panel(r["draft"]) == key
                and r.get("per_depth", {}).get("depth")]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            run = _representative(items)
            depths = run["per_depth"]
            ax.plot(depths["depth"], nan_for_none(depths["accept_prob"]), color=color, marker=marker, ms=4, lw=1,
                    label=f"{name}, {point_label(run)}" if len(items) > 1 else name)
        ax.set_title(panel_title(key), fontsize=style.subtitle)
        ax.set_xlabel("draft position (depth)")
        ax.set_ylim(0, 1.02)
        integer_ticks(ax.xaxis)
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
