"""The app's callbacks, called directly: validation, outputs, theory updates, API payload."""

import math

import gradio as gr
import pytest
from matplotlib.figure import Figure
from PIL import Image

import app
from coolsd import explorer, plots
from coolsd.rules import resolve_mu


def no_progress(*args, **kwargs):
    pass


def controls(**overrides):
    values = dict(app.DEFAULTS)
    values.update(overrides)
    return [values[key] for key in ("method", "delta", "nu", "mu_auto", "mu", "k", "lam", "draft", "class_name",
                                    "seed", "cfg", "temperature", "top_k", "top_p", "schedule")]


@pytest.fixture(scope="module")
def generated():
    return app.on_generate(*controls(), progress=no_progress)


def test_generate_fills_every_output(generated):
    image, eagle_image, table, caption, slider, result = generated
    per_position, lengths, map_method, map_eagle, replay, theory_fig, theory_md, tradeoff_fig = \
        app.on_figures(result, "fid")
    grid = app.BUNDLE.config
    size = app.BUNDLE.image(result.method.tokens).shape
    assert isinstance(image["value"], Image.Image) and image["value"].size == (size[1] * 10, size[0] * 10)
    assert image["label"] == "COOL-SD"
    assert isinstance(eagle_image, Image.Image)
    assert "speed-up vs AR" in table and "COOL-SD" in table and "Eagle-1" in table and "AR" in table
    for figure in (per_position, lengths, map_method, map_eagle, replay, theory_fig):
        assert isinstance(figure, Figure)
    assert slider["maximum"] == max(1, len(result.method.stats.rounds) - 1)
    assert "E[N]" in theory_md and "TV bound" in theory_md
    assert result.method.stats.tokens == grid.image_tokens and result.eagle.stats.relaxation_cost == 0
    assert result.method.stats.method == "cool" and result.eagle.stats.method == "eagle"
    assert "COOL-SD" in caption


@pytest.mark.parametrize("overrides, needle", [
    ({"delta": -1}, "delta"),
    ({"delta": float("nan")}, "delta"),
    ({"delta": "abc"}, "delta"),
    ({"delta": None}, "delta"),
    ({"nu": 99}, "nu"),
    ({"seed": -3}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"method": "Medusa"}, "method"),
    ({"class_name": "Spaceship"}, "class"),
    ({"draft": "tree:huge"}, "draft"),
    ({"top_k": 10**6}, "top_k"),
    ({"temperature": 0}, "temperature"),
    ({"schedule": "linear"}, "nu"),
    ({"mu_auto": False, "mu": "x"}, "mu"),
    ({"method": "LANTERN++", "k": -2}, "k"),
    ({"method": "LANTERN++", "lam": 0.5}, "lambda"),
])
def test_bad_input_is_a_readable_error(overrides, needle):
    with pytest.raises(gr.Error) as error:
        app.on_generate(*controls(**overrides), progress=no_progress)
    assert needle in str(error.value.message)
    assert "Traceback" not in str(error.value.message)


def test_every_method_runs(generated):
    for method in explorer.METHODS:
        outputs = app.on_generate(*controls(method=method, draft="tree:eagle25"), progress=no_progress)
        result = outputs[5]
        assert result.method.stats.tokens == app.BUNDLE.config.image_tokens
        assert (result.method.stats.target_forwards == app.BUNDLE.config.image_tokens) == (method.startswith("AR"))
        figures = app.on_figures(result, "fid")
        assert isinstance(figures[0], Figure)
        assert ("AR drafts nothing" in figures[6]) == method.startswith("AR")


def test_theory_follows_the_sliders(generated):
    result = generated[5]
    source_args = ("last generation", 0)
    low = app.on_theory(result, *controls(delta=1.0, nu=0.0, mu_auto=False, mu=0.0), *source_args)
    high = app.on_theory(result, *controls(delta=4.0), *source_args)
    assert isinstance(low[0], Figure)

    def expected(md):
        return float(md.split("E[N] = **")[1].split("**")[0])

    assert expected(high[1]) > expected(low[1])
    assert "TV bound per round = **0.0000**" in low[1]  # delta=1, nu=0, mu=0 is lossless
    toy = app.on_theory(None, *controls(), "toy distributions", 3)
    assert "toy" in toy[1]
    skipped = app.on_theory(result, *controls(method="AR (no drafting)"), *source_args)
    assert "AR drafts nothing" in skipped[1]


def test_controls_shown_per_method_and_mu_auto_value():
    updates = app.on_method("LANTERN++")
    assert [u["visible"] for u in updates] == [False, False, False, False, True, True, True, False]
    updates = app.on_method("COOL-SD")
    assert [u["visible"] for u in updates] == [True, True, True, True, False, False, True, True]
    assert [u["visible"] for u in app.on_method("UniformRSD")] == [True] + [False] * 5 + [True, False]
    assert not app.on_method("AR (no drafting)")[6]["visible"]
    shown = app.on_mu(True, 0.7, "chain:5", "exp", 0.0)
    assert shown["interactive"] is False
    assert math.isclose(shown["value"], round(resolve_mu(0.7, "auto", 5), 4))
    assert app.on_mu(False, 0.7, "chain:5", "exp", 0.3)["interactive"] is True
    assert "omega: " in explorer.omega_line("COOL-SD", 2.0, 0.7, True, 0.0, "chain:5", "exp")


def test_replay_every_round(generated):
    result = generated[5]
    for index in range(len(result.method.stats.rounds)):
        assert isinstance(app.on_replay(result, index), Figure)
    frames = list(app.on_play(result))
    assert len(frames) == len(result.method.stats.rounds)


def test_api_payload_is_deterministic():
    first = app.api_generate(method="UniformRSD", delta=1.5, seed=4)
    second = app.api_generate(method="UniformRSD", delta=1.5, seed=4)
    assert first["method"]["tokens"] == second["method"]["tokens"]
    assert first["method"]["stats"]["params"] == {"delta": 1.5}
    assert first["eagle"]["stats"]["method"] == "eagle"
    assert len(first["method"]["png_base64"]) > 20
    with pytest.raises(gr.Error):
        app.api_generate(method="COOL-SD", delta=-2)


def test_tradeoff_stars_only_the_measured_setting():
    """The star marks the benchmark run made with exactly the current setting (defaults filled in)."""
    bench = {run["label"]: run for run in explorer.load_bench()["runs"]}

    def point(method, **changes):
        request = explorer.parse_request(app.BUNDLE, *controls(method=method, **changes))
        return explorer.measured_point(app.BUNDLE, request, "fid")

    def expected(label):
        return bench[label]["tau"], bench[label]["fid"]

    assert point("COOL-SD", delta=2.0) == expected("cool:delta=2")
    assert point("COOL-SD", delta=2.0, nu=0.3) == expected("cool:delta=2,nu=0.3,schedule=exp")
    assert point("COOL-SD", delta=2.0, nu=0.3, schedule="linear") == expected("cool:delta=2,nu=0.3,schedule=linear")
    assert point("COOL-SD", delta=2.0, nu=0.5) is None
    assert point("COOL-SD", delta=2.0, draft="tree:eagle25") is None
    assert point("COOL-SD", delta=2.0, cfg=3.0) is None
    assert point("LANTERN++ with G*", k=10, lam=5.0) == expected("lantern:k=10,lambda=5,residual=gstar")
    assert point("LANTERN++", k=10, lam=5.0) == expected("lantern:k=10,lambda=5,residual=lantern")
    assert point("AR (no drafting)") == expected("ar")
    assert {plots.family(run) for run in bench.values()} == {
        "ar", "eagle", "cool", "cool (nu=0.3, schedule=exp)", "cool (nu=0.3, schedule=linear)", "uniform",
        "lantern (residual=gstar)", "lantern (residual=lantern)"}
