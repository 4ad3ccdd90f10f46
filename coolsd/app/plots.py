"""Matplotlib figures of a generation's statistics (used by the app; each function returns a Figure).

The app shows each figure as a PNG at 100 dpi in a panel about 800 px wide (400 px for the maps, which sit side
by side), without Gradio's own plot labels. So every figure carries its own title, keeps its text at 8 pt or
more, and puts its legend outside the axes, where it cannot cover data.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator, PercentFormatter
from matplotlib.transforms import Bbox

from ..core.params import Choice
from ..core.rules import RULES
from ..core.stats import BONUS, DRAFT, FIRST, RESAMPLED, TARGET, GenerationStats

METHOD_COLOR, EAGLE_COLOR, OMEGA_COLOR, ACCEPTED_COLOR = "#d95f02", "#1b9e77", "#7570b3", "#1b9e77"
ORIGIN_STYLE = {FIRST: ("#9e9e9e", "1st"), TARGET: ("#9e9e9e", "AR"), RESAMPLED: ("#e7298a", "R"),
                BONUS: ("#e6ab02", "B")}
DEPTH_CMAP = colormaps["viridis"]
NOT_YET_COLOR, REJECTED_EDGE = "black", "red"
TITLE_SIZE, SUBTITLE_SIZE, LEGEND_SIZE = 11, 9, 9  # points; 8 pt is about 11 px at the app's 100 dpi
WIDE, NARROW = 8.0, 4.2  # inches: a full-width panel, and one of the two side-by-side acceptance maps
REPLAY_WIDTH = 7.0  # Replay has the panel to itself: its legend goes right of the (square) image


def _figure(width: float = WIDE, height: float = 3.6, cols: int = 1) -> tuple[Figure, np.ndarray]:
    """A standalone figure (not registered with pyplot, so nothing accumulates in a long-running server), with
    an Agg canvas so that callers and tests can measure its artists after ``fig.canvas.draw()``."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, cols, squeeze=False)[0]


def _legend_below(fig: Figure, handles: list, ncol: int) -> None:
    """A figure legend under the axes: constrained layout shrinks the axes to make room, so it covers nothing."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(ncol, len(handles)), fontsize=LEGEND_SIZE,
                   frameon=False)


def _integer_ticks(*axes) -> None:
    """Ticks only at whole numbers, for counts and positions (no "round 1.5")."""
    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


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


def family(run: dict) -> str:
    """A benchmark run's series: its method and every parameter except the relaxation strength (internal names;
    :func:`family_name` is what the figure shows)."""
    fixed = ", ".join(f"{key}={value}" for key, value in sorted(run["params"].items())
                      if key not in swept(run["method"]))
    return f"{run['method']} ({fixed})" if fixed else run["method"]


def family_name(run: dict) -> str:
    """A series' display name: the app's method name plus the fixed parameters, e.g. ``COOL-SD (ν=0.3, linear)``."""
    params = run["params"]
    name, in_name = _variant(run["method"], params)
    keys = sorted(params, key=lambda key: (_named(run["method"], key), key))  # "COOL-SD (ν=0.3, linear)"
    fixed = [_parameter(run["method"], key, params[key]) for key in keys
             if key not in swept(run["method"]) and key not in in_name]
    return f"{name} ({', '.join(fixed)})" if fixed else name


def point_label(run: dict) -> str:
    """What varies along a series at this point (``δ=2``, ``k=10, λ=5``); the method for a lone point."""
    method, params = run["method"], run["params"]
    varied = [_parameter(method, key, params[key]) for key in swept(method) if key in params]
    return ", ".join(varied) if varied else method_name(run["method"], run["params"]).split(" (")[0]


# Per-generation figures -----------------------------------------------------------------------------------
def _color(stats: GenerationStats) -> str:
    """Eagle-1 is green in every figure, whether it is the chosen method or the lossless reference."""
    return EAGLE_COLOR if stats.method == "eagle" else METHOD_COLOR


def _drafted(stats: GenerationStats) -> bool:
    """Whether a run has any draft position to show (AR has none)."""
    return stats.tree_depth > 0 and any(v is not None for v in stats.per_depth()["accept_prob"])


def _nan_for_none(values: list) -> list[float]:
    return [np.nan if v is None else v for v in values]


def per_position(runs: list[tuple[str, GenerationStats]], omegas: list[float] | None = None) -> Figure:
    """Per draft depth: mean acceptance probability (solid) and empirical rate (dashed) per run, and omega_d.
    A run that drafts nothing (AR) adds no series: its legend entries would describe empty lines."""
    fig, (ax,) = _figure(WIDE, 3.8)
    fig.suptitle("Acceptance per draft position", fontsize=TITLE_SIZE)
    shown = [(label, stats, _color(stats)) for label, stats in runs if _drafted(stats)]
    skipped = [label for label, stats in runs if not _drafted(stats)]
    if not shown and not omegas:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "AR drafts nothing:\nno draft positions to show", transform=ax.transAxes, ha="center",
                va="center", fontsize=12, color="0.35")
        return fig
    if skipped:
        ax.set_title(f"{' and '.join(skipped)} drafts nothing (not shown)", fontsize=SUBTITLE_SIZE)
    depth = max([len(omegas or [])] + [stats.tree_depth for _, stats, _ in shown])
    for label, stats, color in shown:
        per_depth = stats.per_depth()
        ax.plot(per_depth["depth"], _nan_for_none(per_depth["accept_prob"]), "o-", color=color,
                label=f"{label}: mean acceptance probability")
        ax.plot(per_depth["depth"], _nan_for_none(per_depth["accept_rate"]), "s--", color=color, alpha=0.7,
                label=f"{label}: empirical acceptance rate")
    ax.set_xticks(range(1, depth + 1))
    ax.set_xlim(0.7, depth + 0.3)
    ax.set_xlabel("draft position (depth in the draft window)")
    ax.set_ylabel("probability / rate")
    ax.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0]
    if omegas:
        twin = ax.twinx()
        handles += twin.plot(range(1, len(omegas) + 1), omegas, "^:", color=OMEGA_COLOR,
                             label=r"$\omega_i$ (relaxation schedule, right axis)")
        handles.append(twin.axhline(1.0, color=OMEGA_COLOR, lw=0.8, alpha=0.4, label=r"$\omega_i = 1$: lossless"))
        twin.set_ylabel(r"$\omega_i$", color=OMEGA_COLOR)
        twin.set_ylim(0, max(1.1, max(omegas) * 1.1))
    _legend_below(fig, handles, ncol=2)
    return fig


def _accepted(stats: GenerationStats) -> list[int]:
    return stats.accepted_per_round[1:]  # round 0 is the prefill (no drafts)


def accepted_lengths(runs: list[tuple[str, GenerationStats]]) -> Figure:
    """Accepted drafts per round along the image, and how often each count occurs (bars side by side, so that
    neither run hides the other)."""
    fig, (line, hist) = _figure(WIDE, 3.8, cols=2)
    fig.suptitle("Accepted drafts per round (round 0, the prefill, left out)", fontsize=TITLE_SIZE)
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
    line.set_title("along the image", fontsize=SUBTITLE_SIZE)
    hist.set_xlabel("accepted drafts in a round")
    hist.set_ylabel("rounds")
    hist.set_xticks(counts)
    hist.set_title("how often each count occurs", fontsize=SUBTITLE_SIZE)
    _integer_ticks(line.xaxis, line.yaxis, hist.yaxis)
    _legend_below(fig, line.get_legend_handles_labels()[0], ncol=1)
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


def _depth_color(depth: int, depth_max: int):
    return DEPTH_CMAP((depth - 1) / max(1, depth_max - 1))


def _origin_legend(stats: GenerationStats) -> list[Patch]:
    """One entry per colour the map uses: each accepted draft depth that occurs, then the other origins (short
    labels: two columns must fit the map's 400 px)."""
    depth_max = max(1, stats.tree_depth)
    depths = sorted({d for origin, d in zip(stats.token_origin, stats.token_depth) if origin == DRAFT})
    entries = [Patch(color=_depth_color(d, depth_max), label=f"draft, depth {d}") for d in depths]
    origins = set(stats.token_origin)
    labels = {RESAMPLED: "R: resampled", BONUS: "B: bonus"}
    entries += [Patch(color=ORIGIN_STYLE[origin][0], label=text)
                for origin, text in labels.items() if origin in origins]
    if origins & {FIRST, TARGET}:
        entries.append(Patch(color=ORIGIN_STYLE[FIRST][0], label="1st / AR: target"))
    return entries


def acceptance_map(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], title: str) -> Figure:
    """The token grid over the image: accepted drafts coloured by depth, other origins marked."""
    legend = _origin_legend(stats)
    fig, (ax,) = _figure(NARROW, 4.4 + 0.2 * math.ceil(len(legend) / 2))
    fig.suptitle(f"{title}: where each token came from", fontsize=SUBTITLE_SIZE + 1)
    cell = _grid_axes(ax, image, grid, dim=0.55)
    depth_max = max(1, stats.tree_depth)
    for index, (origin, depth) in enumerate(zip(stats.token_origin, stats.token_depth)):
        x, y, cell_w, cell_h = cell(index)
        color, text = (_depth_color(depth, depth_max), str(depth)) if origin == DRAFT else ORIGIN_STYLE[origin]
        ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor="white", lw=0.4))
        ax.text(x + cell_w / 2, y + cell_h / 2, text, ha="center", va="center", fontsize=8, color="white",
                fontweight="bold")
    _legend_below(fig, legend, ncol=2)
    return fig


def _replay_legend() -> list[Patch]:
    """Every colour Replay can use, in the same order for every round, so the layout holds still while playing."""
    return [Patch(facecolor=ACCEPTED_COLOR, alpha=0.6, label="accepted draft"),
            Patch(facecolor=ORIGIN_STYLE[RESAMPLED][0], alpha=0.6, edgecolor=REJECTED_EDGE, lw=2,
                  label="resampled after a rejection"),
            Patch(facecolor=ORIGIN_STYLE[BONUS][0], alpha=0.6, label="bonus (all drafts accepted)"),
            Patch(facecolor=ORIGIN_STYLE[TARGET][0], alpha=0.6, label="sampled by the target (1st / AR)"),
            Patch(facecolor="0.75", edgecolor="0.4", label="earlier tokens (image so far)"),
            Patch(facecolor=NOT_YET_COLOR, alpha=0.8, label="not yet generated")]


def replay(image: np.ndarray, stats: GenerationStats, grid: tuple[int, int], round_index: int) -> Figure:
    """One round: earlier tokens shown, this round's accepted drafts (green) and its extra token (pink if
    resampled after a rejection, outlined red; yellow if a bonus), later cells dark."""
    round_index = int(np.clip(round_index, 0, len(stats.rounds) - 1))
    current = stats.rounds[round_index]
    start, emitted = current.start, len(current.emitted)
    fig, (ax,) = _figure(REPLAY_WIDTH, 4.6)
    cell = _grid_axes(ax, image, grid)
    for index in range(start, grid[0] * grid[1]):
        x, y, cell_w, cell_h = cell(index)
        if index >= start + emitted:  # not generated yet
            ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor=NOT_YET_COLOR, alpha=0.8, lw=0))
            continue
        last = index == start + emitted - 1
        color = ORIGIN_STYLE[current.next_origin][0] if last else ACCEPTED_COLOR
        ax.add_patch(Rectangle((x, y), cell_w, cell_h, facecolor=color, alpha=0.45, edgecolor=color, lw=1.5))
        if last and current.next_origin == RESAMPLED:  # a candidate was rejected in this cell
            ax.add_patch(Rectangle((x, y), cell_w, cell_h, fill=False, edgecolor=REJECTED_EDGE, lw=2.5))
    fig.suptitle(f"{method_name(stats.method, stats.params)}: round {round_index} of {len(stats.rounds) - 1}",
                 fontsize=SUBTITLE_SIZE + 1)
    ax.set_title(f"{sum(current.valid)} drafted, {len(current.tested)} tested, {emitted - 1} accepted, "
                 f"+1 {current.next_origin}", fontsize=SUBTITLE_SIZE)
    fig.legend(handles=_replay_legend(), loc="outside right center", fontsize=LEGEND_SIZE, frameon=False)
    return fig


def theory(table: dict, title: str) -> Figure:
    """beta_i, e_i and the chance of reaching position i, with E[N] and the TV bound in the title."""
    fig, (ax,) = _figure(WIDE, 3.8)
    fig.suptitle(f"Theory of one round: {title}", fontsize=TITLE_SIZE)
    ax.set_title(f"E[N] = {table['expected_accepted']:.3f} accepted drafts per round, "
                 f"TV bound = {table['tv_bound']:.4f}", fontsize=SUBTITLE_SIZE)
    x = np.array(table["depth"])
    ax.bar(x - 0.2, table["beta"], width=0.4, color=EAGLE_COLOR, label=r"$\beta_i$: acceptance rate at position $i$")
    ax.bar(x + 0.2, table["cost"], width=0.4, color=METHOD_COLOR, label=r"$e_i$: TV cost of step $i$")
    ax.plot(x, table["reach"], "k.-", label=r"P(reach position $i$)")
    ax.set_xticks(x)
    ax.set_xlabel(r"draft position $i$")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1.05)
    _legend_below(fig, ax.get_legend_handles_labels()[0], ncol=3)
    return fig


# Benchmark trade-off ------------------------------------------------------------------------------------
METRIC_LABELS = {"fid": "judge-FID (lower is better)", "judge_accuracy": "class consistency (higher is better)",
                 "log_likelihood_per_token": "log-likelihood per token under the target (nats)",
                 "tau": "mean accepted length τ (tokens per target forward)"}
FID_NOISE, FID_NOISE_IMAGES = 1.0, 200  # AR and Eagle-1 (one distribution) differ by ~1 at 200 images (docs/cli.md)
LABEL_OFFSETS = [(5, 4), (5, -12), (-5, 4), (-5, -12), (5, 14), (5, -22), (-5, 14), (-5, -22)]  # points


def fid_noise(images: int) -> float:
    """FID difference that is noise at ``images`` images: measured at 200; its sampling spread shrinks roughly
    as 1/sqrt(images), so other benchmark sizes get the same order of magnitude."""
    return FID_NOISE * math.sqrt(FID_NOISE_IMAGES / max(1, images))


def _label_points(ax: Axes, points: list[tuple[float, float, str]]) -> None:
    """Label each point beside it, trying the next side when a label would cover a marker or an earlier label."""
    ax.figure.canvas.draw()  # final layout first, so that measured label positions hold in the saved image
    renderer = ax.figure.canvas.get_renderer()
    radius = 4 * ax.figure.dpi / 72  # a marker's half-width in pixels
    placed = [Bbox.from_bounds(px - radius, py - radius, 2 * radius, 2 * radius)
              for px, py in ax.transData.transform([(x, y) for x, y, _ in points])] if points else []
    for x, y, text in points:
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=8,
                                ha="left" if dx > 0 else "right", color="0.25")
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            label.remove()
        else:
            label = ax.annotate(text, (x, y), xytext=LABEL_OFFSETS[0], textcoords="offset points", fontsize=8,
                                color="0.25")
        placed.append(label.get_window_extent(renderer))


def _benchmark_images(runs: list[dict]) -> int | None:
    """Images per method behind the benchmark's FID (each run records it as ``fid_images``)."""
    return max([run.get("fid_images") or 0 for run in runs], default=0) or None


def tradeoff(runs: list[dict], current: tuple[float, float] | None, x_key: str = "tau",
             y_key: str = "fid", images: int | None = None) -> Figure:
    """Benchmark results: quality against mean accepted length, one series per method family, each point labelled
    with its relaxation strength. ``images`` (default: the runs' ``fid_images``) sets the FID noise note."""
    fig, (ax,) = _figure(WIDE, 4.4)
    families: dict[str, list[dict]] = {}
    several_drafts = len({run["draft"] for run in runs if run["method"] != "ar"}) > 1
    for run in runs:
        if run.get(y_key) is not None:  # a study's drafts are separate series: one point per (family, draft)
            name = family_name(run) + (f" · {run['draft']}" if several_drafts and run["method"] != "ar" else "")
            families.setdefault(name, []).append(run)
    images = images or _benchmark_images(runs)
    fig.suptitle("Quality against speed: the shipped benchmark" + (f" ({images} images per method)" if images else ""),
                 fontsize=TITLE_SIZE)
    if y_key == "fid" and images:
        ax.set_title(f"FID differences of about ±{fid_noise(images):.1g} are noise at {images} images",
                     fontsize=SUBTITLE_SIZE, style="italic", color="0.3")
    markers = "osD^vP"
    points = []
    for i, (name, items) in enumerate(families.items()):
        items = sorted(items, key=lambda r: r[x_key])
        xs, ys = [r[x_key] for r in items], [r[y_key] for r in items]
        ax.plot(xs, ys, marker=markers[i % len(markers)], ls="-", label=name)
        points += [(x, y, point_label(r)) for x, y, r in zip(xs, ys, items)]
    if not families:
        ax.text(0.5, 0.5, f"this benchmark did not record {METRIC_LABELS.get(y_key, y_key).split(' (')[0]}",
                ha="center", va="center", transform=ax.transAxes)
    if current is not None:
        ax.plot(*current, "*", color="red", markersize=14, label="current setting", zorder=3)
    ax.set_xlabel(METRIC_LABELS.get(x_key, x_key))
    ax.set_ylabel(METRIC_LABELS.get(y_key, y_key))
    if y_key == "judge_accuracy":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.margins(x=0.12, y=0.12)
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        fig.legend(handles=handles, loc="outside right center", fontsize=LEGEND_SIZE, frameon=False)
    _label_points(ax, points)
    return fig


# Study figures (bench --plots DIR, shown in docs/results.md) -------------------------------------------------
DIFFERENCE_LABELS = {"log_likelihood_per_token": "log-likelihood per token minus Eagle-1's (nats)",
                     "fid": "judge-FID minus Eagle-1's (lower is better)",
                     "judge_accuracy": "class consistency minus Eagle-1's"}
# the point of each family whose acceptance curve the per-position figure shows
REPRESENTATIVE = {"cool": {"delta": 2}, "uniform": {"delta": 2}, "lantern": {"k": 10, "lambda": 5}}
MARKERS = "osD^vP*Xh"


def _study_families(runs: list[dict]) -> dict[str, list[dict]]:
    """Speculative runs by family (method and fixed parameters), each sorted by tau; AR has no draft."""
    families: dict[str, list[dict]] = {}
    for run in runs:
        if run["method"] != "ar":
            families.setdefault(family_name(run), []).append(run)
    return {name: sorted(items, key=lambda r: r["tau"]) for name, items in families.items()}


def _study_axes(result: dict, height: float) -> tuple[Figure, list[tuple[Axes, str]], dict[str, tuple[str, str]]]:
    """One panel per draft, and one (colour, marker) per family, the same in every panel."""
    drafts = result.get("drafts") or sorted({r["draft"] for r in result["runs"] if r["method"] != "ar"})
    fig, axes = _figure(WIDE, height, cols=len(drafts))
    colors = colormaps["tab10"]
    styles = {name: (colors(i % 10), MARKERS[i % len(MARKERS)])
              for i, name in enumerate(_study_families(result["runs"]))}
    return fig, list(zip(axes, drafts)), styles


def _study_legend(fig: Figure, axes: list[tuple[Axes, str]]) -> None:
    handles = {}
    for ax, _ in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    _legend_below(fig, list(handles.values()), ncol=3)


def study_quality(result: dict, metric: str = "log_likelihood_per_token",
                  current: tuple[str, float, float] | None = None) -> Figure:
    """The paper's quality/speed view with its noise: each configuration's quality minus Eagle-1's on the same
    images, against tau, with the paired 95% bootstrap interval as a bar; one panel per draft. ``current``
    (draft, tau, difference) stars the app's current setting."""
    fig, axes, styles = _study_axes(result, 5.2)
    fig.suptitle(f"Quality against speed: minus Eagle-1 on the same {result['images']} images "
                 "(bars: paired 95% intervals)", fontsize=TITLE_SIZE)
    for ax, draft in axes:
        ax.axhline(0, color="0.5", lw=0.8, ls="--")
        runs = [r for r in result["runs"] if r["draft"] == draft and metric in r.get("vs_eagle", {})]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            differences = [r["vs_eagle"][metric] for r in items]
            values = np.array([d["value"] for d in differences])
            bars = np.array([values - [d["low"] for d in differences], [d["high"] for d in differences] - values])
            ax.errorbar([r["tau"] for r in items], values, yerr=bars, color=color, marker=marker, ms=4, capsize=2,
                        lw=1, label=name)
        if current is not None and current[0] == draft:
            ax.plot(*current[1:], "*", color="red", markersize=14, label="current setting", zorder=3)
        ax.set_title(draft, fontsize=SUBTITLE_SIZE)
        ax.set_xlabel(METRIC_LABELS["tau"].split(" (")[0])
    axes[0][0].set_ylabel(DIFFERENCE_LABELS.get(metric, metric))
    _study_legend(fig, axes)
    return fig


def study_speedup(result: dict) -> Figure:
    """Measured speed-up over AR against tau, per draft: how much of tau the round's cost leaves."""
    fig, axes, styles = _study_axes(result, 4.6)
    fig.suptitle(f"Speed-up over AR against tau ({result.get('latency_images', result['images'])} timed images "
                 f"per configuration, {result.get('device', 'cpu')}, {result.get('threads', 1)} thread(s))",
                 fontsize=TITLE_SIZE)
    for ax, draft in axes:
        ax.axhline(1, color="0.5", lw=0.8, ls="--")
        runs = [r for r in result["runs"] if r["draft"] == draft]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            ax.plot([r["tau"] for r in items], [r["speedup_vs_ar"] for r in items], color=color, marker=marker,
                    ms=4, lw=1, label=name)
        ax.set_title(draft, fontsize=SUBTITLE_SIZE)
        ax.set_xlabel(METRIC_LABELS["tau"].split(" (")[0])
    axes[0][0].set_ylabel("speed-up over AR (ratio of median latencies)")
    _study_legend(fig, axes)
    return fig


def _representative(items: list[dict]) -> dict:
    """The family's point named in REPRESENTATIVE, else its middle point by tau."""
    wanted = REPRESENTATIVE.get(items[0]["method"], {})
    chosen = [r for r in items if wanted and all(r["params"].get(k) == v for k, v in wanted.items())]
    return chosen[0] if chosen else items[len(items) // 2]


def study_acceptance(result: dict) -> Figure:
    """P(accept at a draft position | reached), pooled over every round of every image, one line per family
    (its representative point) and per draft."""
    fig, axes, styles = _study_axes(result, 4.6)
    fig.suptitle("Acceptance per draft position (pooled over all rounds that reached it)", fontsize=TITLE_SIZE)
    for ax, draft in axes:
        runs = [r for r in result["runs"] if r["draft"] == draft and r.get("per_depth", {}).get("depth")]
        for name, items in _study_families(runs).items():
            color, marker = styles[name]
            run = _representative(items)
            depths = run["per_depth"]
            ax.plot(depths["depth"], _nan_for_none(depths["accept_prob"]), color=color, marker=marker, ms=4, lw=1,
                    label=f"{name}, {point_label(run)}" if len(items) > 1 else name)
        ax.set_title(draft, fontsize=SUBTITLE_SIZE)
        ax.set_xlabel("draft position (depth)")
        ax.set_ylim(0, 1.02)
        _integer_ticks(ax.xaxis)
    axes[0][0].set_ylabel("P(accept | reached)")
    _study_legend(fig, axes)
    return fig


def study_figures(result: dict) -> dict[str, Figure]:
    """Every study figure by file stem: quality (each recorded measure), speed-up and acceptance per position."""
    recorded = {m for r in result["runs"] for m in r.get("vs_eagle", {})}
    figures = {f"quality_{m}": study_quality(result, m) for m in DIFFERENCE_LABELS if m in recorded}
    figures["speedup"] = study_speedup(result)
    if any(r.get("per_depth", {}).get("depth") for r in result["runs"]):
        figures["acceptance"] = study_acceptance(result)
    return figures
