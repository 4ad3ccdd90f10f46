"""The Trade-off tab's figure for a plain benchmark: quality against mean accepted length, a line per series
with its points labelled; and the series a benchmark offers to draw, with those drawn by default (the study's
figures choose theirs the same way)."""

from __future__ import annotations

from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from ...core.params import shorten
from ...core.rules import RULES
from ..series import family, family_name, point_label
from .labels import current_star, label_points
from .style import MARKERS, fill, figure, layout, legend_below

METRIC_LABELS = {"fid": "judge-FID (lower is better)", "judge_accuracy": "class consistency (higher is better)",
                 "log_likelihood_per_token": "log-likelihood per token under the target (nats)",
                 "tau": "mean accepted length τ (tokens per target forward)"}


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


def chosen_series(runs: list[dict], families: Sequence[str] | None, study: bool) -> set[str]:
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
    style, chosen = layout(narrow), chosen_series(runs, families, study=False)
    fig, (ax,) = figure(style.width, 6.4 if narrow else 4.4)
    images = images or _benchmark_images(runs)
    fig.suptitle(fill("Quality against speed: the shipped benchmark" + (f" ({images} images per method)"
                                                                        if images else ""), style.title, style.width),
                 fontsize=style.title)
    measured = any(run.get(y_key) is not None for run in runs)
    if measured:
        ax.set_title(fill(_pair_note(runs, y_key), style.subtitle, style.width), fontsize=style.subtitle,
                     style="italic", color="0.3")
    points = _tradeoff_series(ax, runs, chosen, x_key, y_key)
    if not points:
        said = (f"this benchmark did not record {METRIC_LABELS.get(y_key, y_key).split(' (')[0]}" if not measured
                else "no series chosen")
        ax.text(0.5, 0.5, said, ha="center", va="center", transform=ax.transAxes, fontsize=style.subtitle)
    current_star(ax, current)
    ax.set_xlabel(fill(METRIC_LABELS.get(x_key, x_key), 10, style.width - 1))
    ax.set_ylabel(fill(METRIC_LABELS.get(y_key, y_key), 10, 3.6))
    if y_key == "judge_accuracy":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.margins(x=0.12, y=0.12)
    handles = ax.get_legend_handles_labels()[0]
    if handles and narrow:
        legend_below(fig, handles, ncol=1, size=style.legend)
    elif handles:
        fig.legend(handles=handles, loc="outside right center", fontsize=style.legend, frameon=False)
    fig.canvas.draw()
    label_points(ax, points, style.small, star=current)
    return fig
