"""The figures stay readable in the app: legends beside the data, readable text, integer ticks on integer
quantities, no empty series, and the trade-off plot in the app's own words."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import named
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from coolsd.app import plots, session
from coolsd.models.bundle import random_bundle

DRAFT = "chain:3"
COOL = {"delta": 2.0, "nu": 0.7, "mu": "auto", "schedule": "exp"}


@pytest.fixture(scope="module")
def runs():
    """Tiny random-model generations: the chosen method (COOL-SD or AR) and lossless Eagle-1."""
    bundle = random_bundle("tiny")
    made = {method: named(bundle, 0, method, params, DRAFT, seed=0)
            for method, params in (("cool", COOL), ("eagle", {}), ("ar", {}))}
    grid = (bundle.config.grid_height, bundle.config.grid_width)
    return {"made": made, "grid": grid, "image": bundle.image(made["cool"].tokens)}


@pytest.fixture(scope="module")
def bench_runs():
    """A plain benchmark (``coolsd.bench --methods ...``, 200 images, one draft), as a model directory may ship:
    the shipped model's own file is a study, drawn by ``study_quality``."""
    return json.loads((Path(__file__).parent / "data" / "plain_bench.json").read_text())["runs"]


THEORY_TABLE = {"depth": [1, 2, 3], "beta": [0.9, 0.7, 0.4], "cost": [0.2, 0.1, 0.0], "reach": [1.0, 0.9, 0.63],
                "expected_accepted": 2.1, "tv_bound": 0.3}


def every_figure(runs, bench_runs) -> dict[str, Figure]:
    cool, eagle, ar = (runs["made"][m].stats for m in ("cool", "eagle", "ar"))
    image, grid = runs["image"], runs["grid"]
    with_eagle = [("COOL-SD", cool), ("Eagle-1", eagle)]
    ar_and_eagle = [("AR (no drafting)", ar), ("Eagle-1", eagle)]
    return {
        "per_position": plots.per_position(with_eagle, cool.omegas),
        "per_position_ar": plots.per_position(ar_and_eagle),
        "lengths": plots.accepted_lengths(with_eagle),
        "lengths_ar": plots.accepted_lengths(ar_and_eagle),
        "map": plots.acceptance_map(image, cool, grid, "COOL-SD"),
        "map_ar": plots.acceptance_map(image, ar, grid, "AR (no drafting)"),
        "replay": plots.replay(image, cool, grid, 1),
        "theory": plots.theory(THEORY_TABLE, "COOL-SD"),
        "tradeoff_fid": plots.tradeoff(bench_runs, (3.57, 7.55), y_key="fid"),
        "tradeoff_accuracy": plots.tradeoff(bench_runs, None, y_key="judge_accuracy"),
    }


@pytest.fixture(scope="module")
def figures(runs, bench_runs):
    made = every_figure(runs, bench_runs)
    for fig in made.values():
        if not isinstance(fig.canvas, FigureCanvasAgg):  # a bare Figure() cannot measure its artists
            FigureCanvasAgg(fig)
        fig.canvas.draw()
    return made


def legends(fig: Figure) -> list:
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def overlap_area(a, b) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(0.0, width) * max(0.0, height)


def test_legends_sit_beside_the_data_and_inside_the_figure(figures):
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        whole = fig.bbox
        for legend in legends(fig):
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert overlap_area(box, ax.get_window_extent(renderer)) < 1.0, f"{name}: legend covers the axes"
            assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1, f"{name}: legend cut off at the sides"
            assert whole.y0 - 1 <= box.y0 and box.y1 <= whole.y1 + 1, f"{name}: legend cut off at top or bottom"


def test_text_is_readable(figures):
    """8 pt is about 11 px at the app's 100 dpi."""
    for name, fig in figures.items():
        for legend in legends(fig):
            assert all(t.get_fontsize() >= 8 for t in legend.get_texts()), name
        small = [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text)
                 if t.get_visible() and t.get_text() and t.get_fontsize() < 8]
        assert not small, f"{name}: {small}"


def test_every_figure_has_a_title(figures):
    for name, fig in figures.items():
        titles = [fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes]
        assert any(titles), name


def test_a_run_without_drafts_adds_no_series(runs, figures):
    labels = [t.get_text() for legend in legends(figures["per_position_ar"]) for t in legend.get_texts()]
    assert labels and not any(label.startswith("AR") for label in labels)
    alone = plots.per_position([("AR (no drafting)", runs["made"]["ar"].stats)])
    assert not legends(alone)
    assert any("AR drafts nothing" in text for text in texts(alone))


def integer_ticks(axis) -> bool:
    low, high = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_ticklocs() if low - 1e-9 <= t <= high + 1e-9]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def test_integer_quantities_get_integer_ticks(figures):
    (per_position,) = figures["per_position_ar"].axes
    assert integer_ticks(per_position.xaxis)
    assert integer_ticks(figures["per_position"].axes[0].xaxis)
    for name in ("lengths", "lengths_ar"):
        line, hist = figures[name].axes
        assert all(integer_ticks(axis) for axis in (line.xaxis, line.yaxis, hist.xaxis, hist.yaxis)), name
    assert integer_ticks(figures["theory"].axes[0].xaxis)


def test_replay_explains_its_colours(figures):
    (legend,) = legends(figures["replay"])
    labels = " | ".join(t.get_text() for t in legend.get_texts())
    for colour in ("accepted draft", "resampled after a rejection", "bonus", "not yet generated", "earlier tokens"):
        assert colour in labels


def test_acceptance_map_lists_only_the_colours_it_uses(figures):
    labels = [t.get_text() for legend in legends(figures["map_ar"]) for t in legend.get_texts()]
    assert labels == ["1st / AR: target"]


def test_image_figures_show_the_image_at_its_brightness(runs, caplog):
    """The acceptance map (dimmed to 0.55) and the replay show the picture itself: matplotlib shows a float RGB
    array only in [0, 1] and clips the rest to white, so a 0-255 float picture would come out white."""
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    image[:, :16] = 200  # a bright left half on black
    cool, grid = runs["made"]["cool"].stats, runs["grid"]
    with caplog.at_level("WARNING", logger="matplotlib"):
        for fig, dim in ((plots.acceptance_map(image, cool, grid, "COOL-SD"), 0.55),
                         (plots.replay(image, cool, grid, 1), 1.0)):
            shown = fig.axes[0].images[0]
            FigureCanvasAgg(fig).draw()
            assert np.allclose(shown.get_array(), image * dim / 255)
            pixels = np.asarray(shown.make_image(fig.canvas.get_renderer(), unsampled=True)[0])[..., :3]
            assert np.allclose(pixels[:, :16], round(200 * dim), atol=1) and (pixels[:, 16:] == 0).all()
    assert not [r for r in caplog.records if "Clipping input data" in r.getMessage()]


INTERNAL = re.compile(r"\b(cool|uniform|lantern|eagle|ar|gstar|residual|fid|judge_accuracy|delta|lambda|nu)\b")


def test_tradeoff_uses_the_apps_names(figures):
    for name in ("tradeoff_fid", "tradeoff_accuracy"):
        shown = texts(figures[name])
        assert not [text for text in shown if INTERNAL.search(text)], name
    legend = [t.get_text() for t in figures["tradeoff_fid"].legends[0].get_texts()]
    assert {"COOL-SD", "UniformRSD", "LANTERN++", "LANTERN++ with G*", "Eagle-1 (lossless)", "AR (no drafting)",
            "COOL-SD (ν=0.3, exp)", "COOL-SD (ν=0.3, linear)", "current setting"} == set(legend)
    assert figures["tradeoff_fid"].axes[0].get_ylabel() == "judge-FID (lower is better)"
    assert figures["tradeoff_accuracy"].axes[0].get_ylabel().startswith("class consistency")


def test_tradeoff_labels_every_point(figures, bench_runs):
    (ax,) = figures["tradeoff_fid"].axes
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == sum(run.get("fid") is not None for run in bench_runs)
    assert {"δ=2", "δ=1.1", "k=10, λ=5", "k=5, λ=2", "AR", "Eagle-1"} <= set(labels)


def test_tradeoff_warns_that_small_fid_differences_are_noise(figures, bench_runs):
    assert any("about ±1 are noise at 200 images" in text for text in texts(figures["tradeoff_fid"]))
    assert not any("noise" in text for text in texts(figures["tradeoff_accuracy"]))
    bigger = plots.tradeoff(bench_runs, None, y_key="fid", images=800)
    assert any("about ±0.5 are noise at 800 images" in text for text in texts(bigger))


def test_display_names_match_the_app():
    for label, (method, fixed) in session.method_entries().items():
        assert plots.method_name(method, fixed) == label
    run = {"method": "lantern", "params": {"k": 10, "lambda": 5, "residual": "gstar"}}
    assert (plots.family_name(run), plots.point_label(run)) == ("LANTERN++ with G*", "k=10, λ=5")
    run = {"method": "cool", "params": {"delta": 2, "nu": 0.3, "schedule": "linear"}}
    assert (plots.family_name(run), plots.point_label(run)) == ("COOL-SD (ν=0.3, linear)", "δ=2")
    assert plots.family(run) == "cool (nu=0.3, schedule=linear)"  # the internal series key is unchanged



def study_result() -> dict:
    """A hand-made two-draft study: Eagle-1, two COOL-SD points and one LANTERN++ point per draft, each with
    its difference from Eagle-1 and interval, and per-depth acceptance."""
    def run(method, params, draft, tau, value, low, high, accept):
        return {"method": method, "params": params, "draft": draft, "label": f"{method}{params}", "tau": tau,
                "speedup_vs_ar": tau / 2, "vs_eagle": {"log_likelihood_per_token":
                                                       {"value": value, "low": low, "high": high}},
                "per_depth": {"depth": [1, 2, 3], "reached": [10, 8, 6], "accept_prob": accept}}
    runs = [{"method": "ar", "params": {}, "draft": "none", "label": "ar", "tau": 1.0, "speedup_vs_ar": 1.0,
             "per_depth": {"depth": [], "reached": [], "accept_prob": []}}]
    for shift, draft in ((0.0, "chain:5"), (0.5, "tree:eagle25")):
        runs += [run("eagle", {}, draft, 2.9 + shift, 0.0, 0.0, 0.0, [0.6, 0.5, 0.4]),
                 run("cool", {"delta": 1.5, "nu": 0.7, "schedule": "exp"}, draft, 3.3 + shift, -0.02, -0.05, 0.01,
                     [0.65, 0.6, 0.5]),
                 run("cool", {"delta": 2, "nu": 0.7, "schedule": "exp"}, draft, 3.8 + shift, -0.1, -0.14, -0.06,
                     [0.7, 0.65, 0.6 + shift / 10]),
                 run("lantern", {"k": 10, "lambda": 5, "residual": "gstar"}, draft, 3.5 + shift, -0.2, -0.3, -0.1,
                     [0.68, 0.6, 0.55])]
    return {"images": 1000, "latency_images": 200, "drafts": ["chain:5", "tree:eagle25"], "runs": runs}


def test_study_quality_draws_each_difference_with_its_interval_per_draft():
    result = study_result()
    fig = plots.study_quality(result)
    FigureCanvasAgg(fig).draw()
    assert [ax.get_title() for ax in fig.axes] == ["chain:5", "tree:eagle25"]
    assert not [text for text in texts(fig) if INTERNAL.search(text)]
    for ax, draft in zip(fig.axes, result["drafts"]):
        cool = [r for r in result["runs"] if r["draft"] == draft and r["method"] == "cool"]
        (line,) = [c for c in ax.containers if c.get_label() == "COOL-SD (ν=0.7, exp)"]
        assert list(line.lines[0].get_xdata()) == [r["tau"] for r in cool]
        assert list(line.lines[0].get_ydata()) == [r["vs_eagle"]["log_likelihood_per_token"]["value"] for r in cool]
        bars = line.lines[2][0].get_segments()  # one vertical segment per point: (x, low) to (x, high)
        want = [(r["vs_eagle"]["log_likelihood_per_token"]["low"], r["vs_eagle"]["log_likelihood_per_token"]["high"])
                for r in cool]
        assert [(round(s[0][1], 9), round(s[1][1], 9)) for s in bars] == want
    legend = {t.get_text() for legend in fig.legends for t in legend.get_texts()}
    assert legend == {"Eagle-1 (lossless)", "COOL-SD (ν=0.7, exp)", "LANTERN++ with G*"}


def test_study_acceptance_shows_each_familys_named_point():
    result = study_result()
    fig = plots.study_acceptance(result)
    chain, tree = fig.axes
    cool = {line.get_label(): list(line.get_ydata()) for line in tree.get_lines()}
    # delta=2 is the named point, not the first or the last
    assert cool["COOL-SD (ν=0.7, exp), δ=2"] == [0.7, 0.65, 0.65]
    assert cool["Eagle-1 (lossless)"] == [0.6, 0.5, 0.4]
    assert chain.get_ylim()[0] == 0


def test_tradeoff_keeps_two_drafts_apart():
    runs = [dict(r, fid=1.0 + r["tau"]) for r in study_result()["runs"]]
    fig = plots.tradeoff(runs, None, y_key="fid", images=1000)
    legend = {t.get_text() for legend in fig.legends for t in legend.get_texts()}
    assert {"COOL-SD (ν=0.7, exp) · chain:5", "COOL-SD (ν=0.7, exp) · tree:eagle25", "AR (no drafting)"} <= legend


def test_tradeoff_says_when_the_benchmark_lacks_the_measure(bench_runs):
    """A benchmark written before log-likelihoods were recorded: the figure says so instead of empty axes."""
    older = [{key: value for key, value in run.items() if key != "log_likelihood_per_token"} for run in bench_runs]
    (ax,) = plots.tradeoff(older, None, y_key="log_likelihood_per_token").axes
    assert not ax.get_lines()
    said = "this benchmark did not record log-likelihood per token under the target"
    assert [t.get_text() for t in ax.texts] == [said]
    (ax,) = plots.tradeoff(older, None, y_key="fid").axes
    assert ax.get_lines() and not any("did not record" in t.get_text() for t in ax.texts)
