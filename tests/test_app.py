"""The app's callbacks, called directly: validation, outputs, theory updates, API payload."""

import dataclasses
import json
import logging
import statistics
import time
from collections import Counter
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from helpers import DESKTOP_MAP_PANEL, DESKTOP_PANEL, PHONE_PANEL, small_texts
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from PIL import Image

from coolsd.app import frames, models, plots, session, tour, views
from coolsd.app.controls import method_boxes
from coolsd.app.web import api, generation, inputs, layout, panels, runtime, settings
from coolsd.core.decode import Generation
from coolsd.core.params import PARAMS
from coolsd.core.rules import param as method_param
from coolsd.core.rules import resolve_mu, schema
from coolsd.core.stats import FIRST, GenerationStats, Round
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import Bundle, Drafter, Transformer, random_bundle
from coolsd.models.config import ModelConfig

STATE = runtime.start()  # the app's state, as app.py makes it
DEMO = layout.build_demo(STATE)


def no_progress(*args, **kwargs):
    pass


ALIASES = {"lam": "lambda", "cfg": "cfg_scale"}  # "lambda" cannot be a keyword argument


def last(outputs):
    """The last of a streaming handler's outputs (Generate yields pictures of the runs in progress first)."""
    *_, final = outputs
    return final


def named_controls(**overrides):
    """The app's default control values by value name, with ``overrides``."""
    values = inputs.defaults()
    values.update({ALIASES.get(key, key): value for key, value in overrides.items()})
    return values


def controls(**overrides):
    """The control values in the order the app's callbacks take them (``session.value_names``)."""
    values = named_controls(**overrides)
    return [values[name] for name in session.value_names()]


@pytest.fixture(scope="module")
def generated():
    return last(generation.on_generate(*controls(), progress=no_progress))


def test_generate_fills_every_output(generated):
    image, eagle_image, table, caption, slider, result, race_image, race_text, serial = generated
    assert race_image == gr.skip() and race_text == gr.skip() and serial == gr.skip()  # set by the first output
    per_position, lengths, map_method, map_eagle, replay, theory_fig, theory_md, tradeoff_fig, tradeoff_note = \
        generation.on_figures(result, "fid")
    grid = STATE.bundle.config
    size = STATE.bundle.image(result.method.tokens).shape
    assert isinstance(image["value"], Image.Image) and image["value"].size == (size[1] * 10, size[0] * 10)
    assert image["label"] == "COOL-SD (chain:5)"
    assert isinstance(eagle_image["value"], Image.Image) and eagle_image["label"] == "Eagle-1 (lossless, chain:5)"
    assert "speed-up vs AR" in table and "COOL-SD" in table and "Eagle-1" in table and "AR" in table
    # latencies follow in their own step, after the figures: until it starts (its progress bar then shows), the
    # table says they come next, never that they are being measured (issue 42.20)
    assert "timing follows" in table and "measured next" in table and "measuring" not in table
    assert "being measured" not in table
    for figure in (per_position, lengths, map_method, map_eagle, replay, theory_fig):
        assert isinstance(figure, Figure)
    assert slider["maximum"] == max(1, len(result.method.stats.rounds) - 1)
    assert "E[N]" in theory_md and "TV bound" in theory_md
    assert result.method.stats.tokens == grid.image_tokens and result.eagle.stats.relaxation_cost == 0
    assert result.method.stats.method == "cool" and result.eagle.stats.method == "eagle"
    assert "COOL-SD" in caption


def test_timing_is_measured_in_the_request_with_its_spread(generated):
    result = generated[5]
    table, timed = generation.on_timing(result)
    timing = timed.timing
    assert timing.repeats == session.TIMING_REPEATS and set(timing.seconds) == {"ar", "eagle", "method"}
    assert all(len(values) == timing.repeats for values in timing.seconds.values())
    median, low, high = timing.speedup("method")
    assert low <= high and median > 0
    assert f"{timing.repeats} interleaved repeats" in table and "CPU thread" in table
    assert "on cpu (float32, eager steps" in table and timing.to_dict()["device"] == "cpu"  # where it ran
    # the baseline named: AR with the same steps, and on a CPU with eager steps, that a compiled AR is faster
    assert "against AR with the same eager steps" in table and views.EAGER_BASELINE in table
    compiled = dataclasses.replace(timing, steps="compiled")
    assert views.EAGER_BASELINE not in views.timing_table(dataclasses.replace(timed, timing=compiled))
    assert "against AR with the same compiled steps." in views.timing_table(dataclasses.replace(timed, timing=compiled))
    assert f"**{median:.2f}x**<br><small>{low:.2f}–{high:.2f}</small>" in table  # the range on a second line
    assert "measuring" not in table


def test_the_timing_run_reports_its_progress_and_keeps_each_runs_median_repeat(generated):
    """A progress step before each of the 3 x 5 timed runs, in order; each run's kept generation is its repeat
    of median latency (5 repeats: the median itself), with the images' tokens."""
    said = []
    _, timed = generation.on_timing(generated[5], None, lambda fraction, desc: said.append((fraction, desc)))
    timing, runs = timed.timing, 3 * session.TIMING_REPEATS
    assert [fraction for fraction, _ in said] == pytest.approx([k / runs for k in range(runs)])
    assert said[-1][1] == f"Timing AR, Eagle-1 and COOL-SD: repeat {session.TIMING_REPEATS} of {session.TIMING_REPEATS}"
    for run in ("ar", "eagle", "method"):
        assert timing.runs[run].stats.seconds["total"] == statistics.median(timing.seconds[run])
    assert timing.runs["method"].tokens == generated[5].method.tokens
    assert timing.runs["eagle"].tokens == generated[5].eagle.tokens


def test_the_race_plays_every_lane_to_its_measured_finish(generated, monkeypatch):
    """The race after a timing (its pauses skipped): AR, Eagle-1 and COOL-SD, each lane finishing at its median
    latency in the table, first to last in that order; the last frame names the fastest."""
    _, timed = generation.on_timing(generated[5])
    monkeypatch.setattr(generation.time, "sleep", lambda seconds: None)
    shown = list(generation.on_race(timed))
    assert len(shown) >= frames.RACE_SECONDS * frames.FRAMES_PER_SECOND
    finished_at = {}
    for index, (picture, text) in enumerate(shown):
        assert picture["visible"] and isinstance(picture["value"], Image.Image)
        for line in text.splitlines():
            if "finished at" in line:
                finished_at.setdefault(line.split(" | ")[0].strip("| "), index)
    medians = {name: timed.timing.latency(run)[0] for run, name in (("ar", "AR"), ("eagle", "Eagle-1"),
                                                                    ("method", "COOL-SD"))}
    assert sorted(finished_at, key=finished_at.get) == sorted(medians, key=medians.get)
    for name, seconds in medians.items():
        assert f"| {name} | 64 / 64 |" in shown[-1][1] and f"finished at {seconds * 1000:.1f} ms" in shown[-1][1]
    fastest = min(medians, key=medians.get)
    assert shown[-1][1].startswith(f"**{fastest} finished first**")
    assert list(generation.on_race(generated[5])) == [(gr.skip(), generation.RACE_WAITING)]  # not timed yet: nothing to race


@pytest.fixture(scope="module")
def slow_model():
    """A random model of 24 x 24 tokens and 8 layers of width 192 (about a second a generation on one core):
    slow enough to be watched, in the selector as "slow"."""
    config = ModelConfig(vocab_size=256, dim=192, n_layer=8, n_head=4, num_classes=10, grid_height=24, grid_width=24)
    torch.manual_seed(0)
    codes = torch.nn.functional.normalize(torch.randn(config.vocab_size, 8), dim=-1)
    STATE.models.loaded["slow"] = Bundle(Transformer(config).eval(), Drafter(config).eval(), codes, name="slow",
                                       class_names=STATE.bundle.class_names)
    yield "slow"
    del STATE.models.loaded["slow"]


def test_generate_streams_pictures_of_the_runs_at_most_ten_times_a_second(slow_model):
    """On a slow model Generate shows the runs in progress: two or more different pictures of the chosen
    method with a caption saying how far each run has got, at least 0.1 s apart, then the final images."""
    stamps, outputs, said = [], [], []
    for output in generation.on_generate(*controls(model=slow_model), progress=lambda *a, **k: said.append((a, k))):
        stamps.append(time.perf_counter())
        outputs.append(output)
    cleared, *live, final = outputs
    # first, before any picture: the last run's race goes (issue 42.2), and nothing else changes yet
    assert cleared[6]["visible"] is False and cleared[7] == generation.RACE_WAITING and cleared[3] == "Generating…"
    assert all(value == gr.skip() for value in cleared[:3] + cleared[4:6]) and cleared[8] > 0
    pictures = [np.asarray(output[0]) for output in live if isinstance(output[0], Image.Image)]
    assert len({picture.tobytes() for picture in pictures}) >= 2
    assert all(output[3].startswith("Generating… **COOL-SD (chain:5)**: ") for output in live)
    assert min(np.diff(stamps[1:-1]), default=1) >= 0.95 * session.LIVE_INTERVAL
    assert final[5].method.stats.tokens == 576 and "seed 0" in final[3]
    fractions = [a[0] for a, k in said if k.get("desc") == "Generating with COOL-SD"]  # the progress bar
    assert len(fractions) >= 2 and fractions == sorted(fractions) and 0 < fractions[-1] <= 1
    assert np.asarray(final[0]["value"]).shape == pictures[-1].shape  # the final image, as large as the live ones


def test_speedup_compares_runs_of_the_same_repeat():
    """Median AR / median run, and the range of the per-repeat ratios (synthetic latencies)."""
    timing = session.Timing({"ar": [0.10, 0.20, 0.12], "eagle": [0.05, 0.10, 0.10], "method": [0.04, 0.05, 0.06]},
                             threads=1)
    assert timing.speedup("method") == pytest.approx((0.12 / 0.05, 2.0, 4.0))
    assert timing.speedup("eagle") == pytest.approx((0.12 / 0.10, 1.2, 2.0))
    assert timing.latency("ar") == (0.12, 0.10, 0.20)


def test_timing_runs_interleave_in_rotating_order(monkeypatch):
    """Every repeat times AR, Eagle-1 and the method back to back, each going first in turn, on the same
    class, seed and sampling as the images."""
    calls = []

    def fake_generate(bundle, class_id, rule, draft, sampling, seed, capture=False):
        calls.append((rule.name, class_id, seed, draft.name))
        return session.Generation([0] * bundle.config.image_tokens, type("Stats", (), {"seconds": {"total": 0.1}})())

    monkeypatch.setattr(session, "generate", fake_generate)
    request = session.parse_controls(STATE.bundle, controls(seed=9))
    timing = session.measure_speed(STATE.bundle, request, repeats=3)
    assert [c[0] for c in calls] == ["ar", "eagle", "cool", "eagle", "cool", "ar", "cool", "ar", "eagle"]
    assert {c[1:] for c in calls} == {(request.class_id, 9, "chain:5")}
    assert timing.repeats == 3
    calls.clear()
    session.measure_speed(STATE.bundle, session.parse_controls(STATE.bundle, controls(method="Eagle-1 (lossless)")), 2)
    assert [c[0] for c in calls] == ["ar", "eagle", "eagle", "ar"]  # the method is Eagle-1: not timed twice


@pytest.mark.parametrize("overrides, name, runs", [
    ({"delta": -1}, "delta", 0.05),
    ({"delta": float("nan")}, "delta", 2.0),
    ({"delta": "abc"}, "delta", 2.0),
    ({"delta": None}, "delta", 2.0),
    ({"nu": 99}, "nu", 2.0),
    ({"seed": -3}, "seed", 0),
    ({"seed": 1.5}, "seed", 2),
    ({"top_k": 10**6}, "top_k", 512),
    ({"temperature": 0}, "temperature", 0.1),
    ({"mu_auto": False, "mu": "x"}, "mu", 0.0),
    ({"method": "LANTERN++", "k": -2}, "k", 0),
    ({"method": "LANTERN++", "lam": 0.5}, "lambda", 1.0),
])
def test_a_typed_number_out_of_range_runs_at_the_value_its_box_is_set_back_to(overrides, name, runs):
    """Generate with a number outside its range (clicked before the box's own check set it back, with its one
    warning): the generation runs at the nearest end of the range, or at the start value for what is no number,
    as the box shows (test_a_typed_value_out_of_range_is_one_named_warning_and_the_box_shows_what_runs); the API
    refuses the same value in one line."""
    request = last(generation.on_generate(*controls(**overrides), progress=no_progress))[5].request
    ran = {"seed": request.seed, "top_k": request.sampling.top_k, "temperature": request.sampling.temperature,
           **request.param_dict}
    assert ran[name] == pytest.approx(runs)
    api_method = {"LANTERN++": "LANTERN++"}.get(overrides.get("method"), "COOL-SD")
    given = {key: value for key, value in overrides.items() if key not in ("method", "mu_auto")}
    with pytest.raises(gr.Error) as error:
        api.generate(method=api_method, **given)
    assert ALIASES.get(next(iter(given)), next(iter(given))) in error.value.message


@pytest.mark.parametrize("overrides, needle", [
    ({"method": "Medusa"}, "method"),
    ({"class_name": "Spaceship"}, "class"),
    ({"draft": "tree:huge"}, "draft"),
    ({"schedule": "linear"}, "nu"),
])
def test_bad_input_is_a_readable_error(overrides, needle):
    with pytest.raises(gr.Error) as error:
        last(generation.on_generate(*controls(**overrides), progress=no_progress))
    assert needle in str(error.value.message)
    assert "Traceback" not in str(error.value.message)


def test_every_method_runs(generated):
    for method in session.method_entries():
        outputs = last(generation.on_generate(*controls(method=method, draft="tree:eagle25"), progress=no_progress))
        result = outputs[5]
        assert result.method.stats.tokens == STATE.bundle.config.image_tokens
        assert (result.method.stats.target_forwards == STATE.bundle.config.image_tokens) == (method.startswith("AR"))
        figures = generation.on_figures(result, "fid")
        assert isinstance(figures[0], Figure)
        assert ("AR drafts nothing" in figures[6]) == method.startswith("AR")


def test_theory_follows_the_sliders(generated):
    result = generated[5]
    source_args = ("last generation", 0)
    low = panels.on_theory(result, *controls(delta=1.0, nu=0.0, mu_auto=False, mu=0.0), *source_args, False)
    high = panels.on_theory(result, *controls(delta=4.0), *source_args, False)
    assert isinstance(low[0], Figure)

    def expected(md):
        return float(md.split("E[N] = **")[1].split("**")[0])

    assert expected(high[1]) > expected(low[1])
    assert "TV bound per round = **0.0000**" in low[1]  # delta=1, nu=0, mu=0 is lossless
    toy = panels.on_theory(None, *controls(), "toy distributions", 3, False)
    assert "toy" in toy[1]
    skipped = panels.on_theory(result, *controls(method="AR (no drafting)"), *source_args, False)
    assert "AR drafts nothing" in skipped[1]


def test_controls_shown_per_method():
    def visible(method):
        return [u["visible"] for u in settings.on_method(method)]  # delta, COOL-SD box, LANTERN++ box, GSD box, draft

    assert visible("COOL-SD") == [True, True, False, False, True]
    assert visible("UniformRSD") == [True, False, False, False, True]
    assert visible("LANTERN++") == visible("LANTERN++ with G*") == [False, False, True, False, True]
    assert visible("GSD") == visible("GSD with G*") == [False, False, False, True, True]
    assert visible("Eagle-1 (lossless)") == [False, False, False, False, True]
    assert visible("AR (no drafting)") == [False, False, False, False, False]


def test_controls_come_from_the_registry():
    """One control per parameter name, in registry order; a parameter every entry of its method fixes (LANTERN++'s
    residual) has none; each control is shown exactly for the entries that take it."""
    controls_by_name = {control.name: control for control in session.method_controls()}
    assert list(controls_by_name) == ["delta", "nu", "mu", "schedule", "k", "lambda", "ranks", "gap", "dist"]
    assert controls_by_name["delta"].labels == {"COOL-SD", "UniformRSD"}
    assert controls_by_name["k"].labels == {"LANTERN++", "LANTERN++ with G*"}
    assert all(controls_by_name[name].labels == {"GSD", "GSD with G*"} for name in ("ranks", "gap", "dist"))
    assert session.value_names()[:6] == ["method", "delta", "nu", "mu_auto", "mu", "schedule"]
    assert session.method_entries()["LANTERN++"] == ("lantern", {"residual": "lantern"})
    ui = DEMO.named
    assert ui["method"].choices == [(label, label) for label in session.method_entries()]
    assert isinstance(ui["schedule"], gr.Radio) and ui["schedule"].choices == [("exp", "exp"), ("linear", "linear")]
    assert isinstance(ui["mu_auto"], gr.Checkbox) and ui["mu_auto"].value is True and ui["mu"].visible is False
    assert "residual" not in ui
    start = inputs.defaults()
    assert all(ui[name].value == start[name] for name in session.value_names()), "a control starts off its default"
    for label in session.method_entries():
        shown = [update["visible"] for update in settings.on_method(label)]
        for (_, items), visible in zip(method_boxes(), shown):
            for name in items:
                if name in controls_by_name:
                    assert visible == (label in controls_by_name[name].labels), (label, name)


def test_parse_request_checks_only_what_the_method_takes():
    """Values meant for other methods are ignored, an entry's fixed values fill in, an absent parameter takes
    its default, and each value is checked against its method's schema."""
    common = ("chain:5", STATE.bundle.class_names[1], 0, 2.0, 1.0, 0, 1.0)
    request = session.parse_request(STATE.bundle, "LANTERN++", {"k": 3, "delta": "junk", "schedule": None}, *common)
    assert request.param_dict == {"k": 3, "lambda": 5.0, "residual": "lantern"}
    assert request.rule.params() == {"k": 3, "lambda": 5.0, "residual": "lantern"}
    request = session.parse_request(STATE.bundle, "UniformRSD", {"delta": 1.5, "nu": 99}, *common)
    assert request.param_dict == {"delta": 1.5} and request.rule.delta == 1.5
    with pytest.raises(ValueError, match="delta must be between 0.05 and 5"):
        session.parse_request(STATE.bundle, "COOL-SD", {"delta": 10}, *common)
    with pytest.raises(ValueError, match="method parameters must be a mapping"):
        session.parse_request(STATE.bundle, "COOL-SD", [2.0], *common)
    with pytest.raises(ValueError, match="expected 21 control values"):
        session.parse_controls(STATE.bundle, controls()[:3])


@pytest.mark.parametrize("schedule", ["exp", "linear"])
def test_mu_auto_never_pushes_the_slider_out_of_range(schedule):
    """Under "auto", mu can leave the slider's range (chain:8, nu=-1 gives 6.38); the slider is then hidden and
    the value is shown as text, and unticking auto starts the slider inside its range."""
    param = method_param("mu")
    for draft in session.DRAFTS:
        for nu in np.round(np.arange(method_param("nu").low, method_param("nu").high + 1e-9, 0.05), 2):
            hidden = settings.on_mu_auto(True, nu, draft, schedule)
            assert hidden["visible"] is False and "value" not in hidden
            shown = settings.on_mu_auto(False, nu, draft, schedule)
            assert shown["visible"] is True and param.low <= shown["value"] <= param.high


@pytest.mark.parametrize("draft, nu, schedule", [("chain:8", -1.0, "exp"), ("chain:7", -0.95, "exp"),
                                                 ("chain:5", 2.0, "linear"), ("chain:8", -1.0, "linear")])
def test_every_setting_the_controls_allow_gives_a_result_or_one_readable_message(draft, nu, schedule):
    """The settings that used to jam the page: each gives an image or a readable refusal, and the next legal
    setting works at once."""
    values = controls(draft=draft, nu=nu, schedule=schedule)
    named = named_controls(draft=draft, nu=nu, schedule=schedule)
    line = views.omega_line(*[named[name] for name in ("method", "delta", "nu", "mu_auto", "mu", "draft", "schedule")])
    try:
        outputs = last(generation.on_generate(*values, progress=no_progress))
    except gr.Error as error:
        assert "too steep" in error.message and f"nu={nu:g}" in error.message
        assert views.plain(error.message, 600) in line  # the same reason is shown under the sliders
        assert "Traceback" not in error.message
    else:
        assert outputs[5].method.stats.tokens == STATE.bundle.config.image_tokens
        assert f"μ = {resolve_mu(nu, 'auto', parse_draft(draft).depth, schedule):.4g} (auto" in line
    assert last(generation.on_generate(*controls(), progress=no_progress))[5] is not None


def test_mu_line_shows_the_auto_value():
    assert "omega" not in views.omega_line("UniformRSD", 2.0, 0.7, True, 0.0, "chain:5", "exp")
    line = views.omega_line("COOL-SD", 2.0, 0.7, True, 0.0, "chain:5", "exp")
    assert f"μ = {resolve_mu(0.7, 'auto', 5):.4g} (auto" in line and "ω_1..ω_5" in line
    assert "μ = 0.3;" in views.omega_line("COOL-SD", 2.0, 0.7, False, 0.3, "chain:5", "exp")


def test_replay_every_round(generated):
    result = generated[5]
    for index in range(len(result.method.stats.rounds)):
        assert isinstance(panels.on_replay(result, index), Figure)
    frames = list(panels.on_play(result))
    assert frames == list(range(len(result.method.stats.rounds)))  # the slider's change event draws each


def test_theory_is_cleared_for_ar(generated):
    """Switching to AR must not leave the previous method's plot above "AR drafts nothing"."""
    figure, text = panels.on_theory(generated[5], *controls(method="AR (no drafting)"), "last generation", 0, False)
    assert figure is None and "AR drafts nothing" in text
    figure, text = panels.on_theory(generated[5], *controls(schedule="linear"), "last generation", 0, False)
    assert figure is None and "too steep" in text  # shown in the panel, not as a toast per slider move


def test_api_payload_is_deterministic():
    first = api.generate(method="UniformRSD", delta=1.5, seed=4)
    second = api.generate(method="UniformRSD", delta=1.5, seed=4)
    assert first["method"]["tokens"] == second["method"]["tokens"]
    assert first["method"]["stats"]["params"] == {"delta": 1.5}
    assert first["eagle"]["stats"]["method"] == "eagle"
    assert len(first["method"]["png_base64"]) > 20
    assert first["timing"] is None
    timed = api.generate(method="UniformRSD", delta=1.5, seed=4, timing_repeats=2)
    assert timed["timing"]["repeats"] == 2 and len(timed["timing"]["seconds"]["ar"]) == 2
    with pytest.raises(gr.Error):
        api.generate(method="COOL-SD", delta=-2)


def test_api_lists_only_generate_and_describes_its_answer():
    info = DEMO.get_api_info()
    assert list(info["named_endpoints"]) == ["/generate", "/generate_batch"] and not info.get("unnamed_endpoints")
    returns = info["named_endpoints"]["/generate"]["returns"][0]["type"]
    assert set(returns["properties"]) == {"method", "eagle", "timing"}
    assert set(returns["properties"]["method"]["properties"]) == {"tokens", "pixels", "png_base64", "stats"}
    # the pixels are height x width x 3 (docs/app.md): the API page must type them so (issue 42.17)
    from gradio_client.utils import json_schema_to_python_type
    pixels = returns["properties"]["method"]["properties"]["pixels"]
    assert json_schema_to_python_type(pixels) == "list[list[list[int]]]"
    assert np.asarray(api.generate(seed=1)["method"]["pixels"]).ndim == 3
    docs = Path(__file__).resolve().parent.parent / "docs" / "app.md"
    assert "raw RGB pixels as nested lists, height x width x 3" in docs.read_text()
    seeds = next(p for p in info["named_endpoints"]["/generate_batch"]["parameters"] if p["parameter_name"] == "seeds")
    assert seeds["type"]["type"] == "array" and seeds["type"]["items"]["type"] == "integer"


def test_the_batch_api_gives_each_seed_its_single_request_answer():
    """/generate_batch decodes its seeds as one batch per method: every seed's images, tokens and statistics
    but the timings are /generate's for that seed."""
    batch = api.generate_batch(method="COOL-SD", delta=2.0, seeds=[4, 9, 4])
    assert batch["batch"] == 3 and [image["seed"] for image in batch["images"]] == [4, 9, 4]
    assert batch["seconds"]["method"] > 0 and batch["seconds"]["eagle"] > 0
    for image in batch["images"]:
        single = api.generate(method="COOL-SD", delta=2.0, seed=image["seed"])
        for run in ("method", "eagle"):
            assert image[run]["tokens"] == single[run]["tokens"] and image[run]["pixels"] == single[run]["pixels"]
            assert image[run]["stats"]["tau"] == single[run]["stats"]["tau"]
            assert image[run]["stats"]["batch"] == 3 and image[run]["stats"]["seed"] == image["seed"]


@pytest.mark.parametrize("seeds, needle", [
    ([], "seeds must list 1 to 16 seeds, got 0"),
    (list(range(17)), "seeds must list 1 to 16 seeds, got 17"),
    ("0, 1", "seeds must be a list of seeds"),
    ([0, -3], "seed must be"),
    ([0, float("nan")], "seed must be a finite number"),
])
def test_the_batch_api_refuses_bad_seeds_in_one_line(seeds, needle, caplog):
    with caplog.at_level(logging.INFO, logger="coolsd.app"):
        with pytest.raises(gr.Error, match=needle) as error:
            api.generate_batch(seeds=seeds)
    assert "\n" not in str(error.value.message)


@pytest.mark.parametrize("overrides, needle", [
    ({"method": ["COOL-SD"]}, "method must be one of"),
    ({"class_name": "x" * 1_000_000}, "class must be one of"),
    ({"seed": float("nan")}, "seed must be a finite number"),
    ({"draft": {"chain": 5}}, "draft structure must be one of"),
    ({"mu": [1]}, "mu must be a number"),
    ({"schedule": None}, "schedule must be one of"),
    ({"class_name": None}, "class must be one of"),  # a null is refused, as before: leaving a value out is not null
    ({"cfg_scale": None}, "cfg_scale is missing"),
])
def test_odd_api_values_are_readable_errors_logged_in_one_line(overrides, needle, caplog):
    with caplog.at_level(logging.INFO, logger="coolsd.app"):
        with pytest.raises(gr.Error) as error:
            api.generate(**overrides)
    assert needle in error.value.message and len(error.value.message) < 400
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and "\n" not in rejected[0] and len(rejected[0]) < 400


def taker(name: str) -> str:
    """A method entry that takes parameter ``name`` (COOL-SD for the sampling settings and the seed)."""
    return next((label for control in session.method_controls() if control.name == name
                 for label in sorted(control.labels)), "COOL-SD")


def test_ui_and_api_ranges_are_the_one_definition():
    """Every slider's range is coolsd.params's; the API refuses just outside it and accepts its ends."""
    ui = DEMO.named
    sliders = {name: ui[name] for name in ("delta", "nu", "mu", "k", "lambda", "ranks", "gap", "dist", "cfg_scale",
                                           "temperature", "top_p")}
    names = {"lambda": "lam", "cfg_scale": "cfg"}
    for name, component in sliders.items():
        param = schema(name)
        assert (component.minimum, component.maximum, component.step) == (param.low, param.high, param.step)
        method = taker(name)
        extra = {"mu_auto": False} if name == "mu" else {}
        for value in (param.low, param.high):
            session.parse_controls(STATE.bundle, controls(method=method, **{names.get(name, name): value}, **extra))
        for value in (param.low - param.step, param.high + param.step):
            with pytest.raises(ValueError, match=f"{name} must be between"):
                session.parse_controls(STATE.bundle, controls(method=method, **{names.get(name, name): value},
                                                               **extra))
    assert (ui["top_k"].minimum, ui["top_k"].maximum) == (0, STATE.bundle.config.vocab_size)
    assert (ui["seed"].minimum, ui["seed"].maximum) == (PARAMS["seed"].low, PARAMS["seed"].high)


@pytest.fixture
def study_of_this_model(monkeypatch):
    """The shipped study, as if it had measured the loaded weights: the star logic is tested against it whether or
    not the study has been rerun since the default model last changed (which model a study measured has its own
    test)."""
    shipped = views.load_bench(STATE.bundle)
    monkeypatch.setattr(views, "load_bench",
                        lambda bundle: {**shipped, "target_sha256": STATE.bundle.weights_digest()})


def test_tradeoff_stars_only_the_measured_setting(study_of_this_model):
    """The star marks the benchmark run made with exactly the current setting (defaults filled in)."""
    bench = {run["label"]: run for run in views.load_bench(STATE.bundle)["runs"]}

    def point(method, **changes):
        request = session.parse_controls(STATE.bundle, controls(method=method, **changes))
        return views.measured_point(STATE.bundle, request, "fid")

    def expected(label):
        return bench[label]["tau"], bench[label]["fid"]

    chain, tree = " @ chain:5", " @ tree:eagle25"  # the shipped study's labels name the draft
    assert point("COOL-SD", delta=2.0) == expected("cool:delta=2,nu=0.7,schedule=exp" + chain)
    assert point("COOL-SD", delta=2.0, draft="tree:eagle25") == expected("cool:delta=2,nu=0.7,schedule=exp" + tree)
    assert point("COOL-SD", delta=2.0, nu=0.3) == expected("cool:delta=2,nu=0.3,schedule=exp" + chain)
    assert point("COOL-SD", delta=2.0, nu=0.3, schedule="linear") == expected(
        "cool:delta=2,nu=0.3,schedule=linear" + chain)
    assert point("COOL-SD", delta=2.0, nu=0.5) is None
    assert point("COOL-SD", delta=2.0, draft="tree:wide57") is None
    assert point("COOL-SD", delta=2.0, cfg=3.0) is None
    assert point("LANTERN++ with G*", k=10, lam=5.0) == expected("lantern:k=10,lambda=5,residual=gstar" + chain)
    assert point("LANTERN++", k=10, lam=5.0) == expected("lantern:k=10,lambda=5,residual=lantern" + chain)
    assert point("AR (no drafting)") == expected("ar")
    assert {plots.family(run) for run in bench.values() if "jacobi" not in run["draft"]} == {
        "ar", "eagle", "cool (nu=0.7, schedule=exp)", "cool (nu=0.3, schedule=exp)", "cool (nu=0.3, schedule=linear)",
        "uniform", "lantern (residual=gstar)", "lantern (residual=lantern)"}


def test_tradeoff_of_a_study_shows_differences_from_eagle_and_stars_the_setting(monkeypatch):
    """A study file (runs compared with Eagle-1, two drafts): the tab shows each run's difference with its
    interval, and stars the current setting on its own draft's panel only."""
    def run(method, params, draft, tau, value):
        return {"method": method, "params": params, "draft": draft, "label": method, "tau": tau,
                "speedup_vs_ar": 1.0, "vs_eagle": {"fid": {"value": value, "low": value - 1, "high": value + 1}}}
    study = {"model": STATE.bundle.name, "sampling": STATE.bundle.sampling.to_dict(), "images": 1000,
             "drafts": ["chain:5", "tree:eagle25"],
             "runs": [run("eagle", {}, "chain:5", 2.9, 0.0), run("eagle", {}, "tree:eagle25", 3.5, 0.0),
                      run("cool", {"delta": 2, "nu": 0.7, "schedule": "exp"}, "chain:5", 3.7, 0.8),
                      run("cool", {"delta": 2, "nu": 0.7, "schedule": "exp"}, "tree:eagle25", 4.3, 1.5)]}
    monkeypatch.setattr(views, "load_bench", lambda bundle: study)
    request = session.parse_controls(STATE.bundle, controls(method="COOL-SD", delta=2.0, draft="tree:eagle25"))
    fig = views.tradeoff_figure(STATE.bundle, session.Comparison(request, None, None), "fid")
    chain, tree = fig.axes
    stars = [line for ax in (chain, tree) for line in ax.get_lines() if line.get_label() == "current setting"]
    assert len(stars) == 1 and stars[0].axes is tree
    assert (list(stars[0].get_xdata()), list(stars[0].get_ydata())) == ([4.3], [1.5])
    assert views.tradeoff_figure(STATE.bundle, None, "fid").axes[0].get_ylabel().startswith("judge-FID minus")
    # a drafter-free setting is starred in its window length's panel, at its difference from AR
    study["drafts"].append("jacobi:16:coupled")
    study["runs"] += [dict(run("cool", {"delta": 2}, "jacobi:16:coupled", 3.1, 9.0), label="cool @ jacobi",
                           vs_ar={"fid": {"value": 0.4, "low": -0.6, "high": 1.4}})]
    request = session.parse_controls(STATE.bundle, controls(method="COOL-SD", delta=2.0, draft="jacobi:16:coupled"))
    fig = views.tradeoff_figure(STATE.bundle, session.Comparison(request, None, None), "fid")
    (star,) = [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == "current setting"]
    assert star.axes.get_title() == "Jacobi windows of 16, against AR"
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([3.1], [0.4])


@pytest.mark.parametrize("metric", [metric for _, metric in layout.QUALITY_AXES])
def test_every_quality_axis_draws_every_run_of_the_shipped_study(metric, study_of_this_model):
    """Each quality measure the tab offers draws, in each draft's panel, one point with an interval bar for
    every run of the shipped study on that draft."""
    study = views.load_bench(STATE.bundle)
    every, _ = views.tradeoff_families(STATE.bundle)
    fig, note = views.tradeoff_panel(STATE.bundle, None, metric, families=list(every.values()))
    assert note == ""
    panels = {plots.panel(draft) for draft in study["drafts"]}
    assert len(fig.axes) == len(panels)
    for key in panels:
        ax = next(ax for ax in fig.axes if ax.get_title() == plots.panel_title(key))
        drawn = sorted(x for container in ax.containers for x in container.lines[0].get_xdata())
        runs = [run for run in study["runs"] if run["method"] != "ar" and plots.panel(run["draft"]) == key]
        # a drafter-free run is drawn minus AR's, every other minus Eagle-1's on its draft
        expected = sorted(run["tau"] for run in runs if metric in run["vs_ar" if "jacobi" in key else "vs_eagle"])
        assert len(expected) >= (10 if "jacobi" in key else 40) and drawn == expected


def comparison(**changes) -> session.Comparison:
    return session.Comparison(session.parse_controls(STATE.bundle, controls(**changes)), None, None)


def test_tradeoff_says_when_the_setting_is_not_on_the_studys_grid(study_of_this_model):
    """The note beside the figure, as text for the UI: why there is no star (a setting the study did not run,
    other sampling), nothing when the setting is starred."""
    def stars(fig):
        return [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == "current setting"]
    fig, note = views.tradeoff_panel(STATE.bundle, comparison(method="COOL-SD", delta=2.0))
    assert note == "" and len(stars(fig)) == 1
    fig, note = views.tradeoff_panel(STATE.bundle, comparison(method="COOL-SD", delta=2.5))
    assert not stars(fig)
    assert note == ("the current setting (COOL-SD (μ=auto, ν=0.7, exp), δ=2.5, chain:5) is not on the study's grid:"
                    " no star.")
    fig, note = views.tradeoff_panel(STATE.bundle, comparison(method="COOL-SD", delta=2.0, cfg=3.0))
    assert not stars(fig) and note == "the current sampling is not the study's: cfg_scale 3.0 (study: 2.0): no star."
    fig, note = views.tradeoff_panel(STATE.bundle, comparison(method="AR (no drafting)"))
    assert not stars(fig) and "noise floor" in note



def test_tradeoff_says_when_its_study_measured_other_weights_of_the_same_name(monkeypatch):
    """A study records the sha256 of the target it measured: the same model name with other weights (a retrained
    default model whose study has not been rerun) gets no star, and the note says which model the points are
    from, with or without a generation; the recorded weights themselves get the star."""
    shipped = views.load_bench(STATE.bundle)
    shape = {**STATE.bundle.config.to_dict(), "n_layer": 3, "dim": 40}
    monkeypatch.setattr(views, "load_bench", lambda bundle: {**shipped, "model_shape": shape,
                                                             "target_sha256": "0" * 64})
    fig, note = views.tradeoff_panel(STATE.bundle, comparison(method="COOL-SD", delta=2.0))
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == "current setting"]
    layers, width = STATE.bundle.config.n_layer, STATE.bundle.config.dim
    assert note == (f"These points were measured on an earlier model 'fashion' (3 layers of width 40), not the one "
                    f"loaded ({layers} layers of width {width}); the study has not been rerun on this model yet: no "
                    "star for the current setting.")
    assert views.tradeoff_panel(STATE.bundle, None)[1].endswith("has not been rerun on this model yet.")
    request = session.parse_controls(STATE.bundle, controls(method="COOL-SD", delta=2.0))
    assert views.measured_run(STATE.bundle, request) is None
    monkeypatch.setattr(views, "load_bench", lambda bundle: {**shipped, "target_sha256": STATE.bundle.weights_digest()})
    assert views.measured_run(STATE.bundle, request) is not None and views.tradeoff_panel(STATE.bundle, None)[1] == ""

def test_tradeoff_says_when_the_model_has_no_study():
    from coolsd.models.bundle import random_bundle
    bundle = random_bundle("tiny")
    assert views.tradeoff_panel(bundle, None) == (
        None, "this model (random-tiny) has no shipped study: no bench_results.json beside its weights.")
    assert views.tradeoff_families(bundle) == ({}, [])


def test_tradeoff_starts_on_the_quietest_measure_with_the_default_series():
    assert views.default_metric(STATE.bundle) == "log_likelihood_per_token"
    fig, _ = views.tradeoff_panel(STATE.bundle, None)
    assert fig.axes[0].get_ylabel().replace("\n", " ") == plots.DIFFERENCE_LABELS["log_likelihood_per_token"]
    every, default = views.tradeoff_families(STATE.bundle)
    assert default[:4] == ["eagle", "cool (nu=0.7, schedule=exp)", "uniform", "lantern (residual=gstar)"]
    assert all(" @ jacobi:" in key for key in default[4:])  # the drafter-free series at their defaults
    assert set(default) < set(every.values()) and "ar" not in every.values()
    assert {c.get_label() for c in fig.axes[0].containers} == {  # the chain's panel: the drafter series
        label for label, key in every.items() if key in default and " @ jacobi" not in key}
    fig, note = views.tradeoff_panel(STATE.bundle, None, families=["cool (nu=9)"])
    assert fig is None and note.startswith("families: unknown series 'cool (nu=9)'")


def test_every_figure_of_the_app_is_readable_on_a_phone_and_a_desktop(generated):
    """At 360 px (phone, narrow=True) and at 800 px (desktop; each acceptance map 400 px) every text of every
    figure the app shows is at least 10 px high on screen."""
    result = generated[5]
    bundle = STATE.bundle
    for narrow in (False, True):
        shown = dict(views.figures(bundle, result, narrow=narrow))
        shown["replay"] = views.replay_figure(bundle, result, 1, narrow=narrow)
        shown["theory"] = views.theory_panel(result, result.request, "captured", 0, bundle, narrow=narrow)[0]
        shown["tradeoff"] = views.tradeoff_panel(bundle, result, narrow=narrow)[0]
        for name, fig in shown.items():
            panel = PHONE_PANEL if narrow else DESKTOP_MAP_PANEL if name.startswith("map") else DESKTOP_PANEL
            assert not small_texts(fig, panel), (name, narrow)


@pytest.mark.parametrize("method, omega", [("COOL-SD", True), ("UniformRSD", True), ("Eagle-1 (lossless)", False),
                                           ("LANTERN++ with G*", False)])
def test_theory_draws_omega_only_for_a_rule_with_a_schedule(generated, method, omega):
    request = session.parse_controls(STATE.bundle, controls(method=method))
    fig, table, _ = views.theory_panel(generated[5], request, "captured", 0, STATE.bundle)
    curves = [line for ax in fig.axes for line in ax.get_lines() if "omega" in line.get_label()]
    assert bool(curves) == omega
    if omega:
        assert list(curves[0].get_ydata()) == table["omega"]


@pytest.mark.parametrize("at_once", [True, False])
def test_both_images_are_the_direct_generations_whether_run_at_once_or_in_turn(monkeypatch, at_once):
    """Side by side (a CPU with a core to spare) or one after the other, a request's two runs are exactly what
    generate gives for them alone, and the progress says how they run."""
    from coolsd.core.decode import generate
    from coolsd.core.rules import Eagle

    monkeypatch.setattr(session, "side_by_side", lambda bundle: at_once)
    monkeypatch.setattr(session, "EAGLE_CACHE", session.ResultCache())
    said = []
    request = session.parse_controls(STATE.bundle, controls(seed=11))
    result = session.compare(STATE.bundle, request, lambda *args, desc="": said.append(desc))
    cls = session.condition(STATE.bundle, request)
    assert result.method.tokens == generate(STATE.bundle, cls, request.rule, request.tree, request.sampling, 11).tokens
    assert result.eagle.tokens == generate(STATE.bundle, cls, Eagle(), request.tree, request.sampling, 11).tokens
    assert any("side by side" in text for text in said) == at_once


# A newer generation of a browser session makes an older one's timing and figures stale -------------------
class BrowserSession:
    """What Gradio passes as ``gr.Request``: only the session hash matters here."""

    def __init__(self, session_hash: str) -> None:
        self.session_hash = session_hash


def generate_in(session: str, **overrides):
    return last(generation.on_generate(*controls(**overrides), progress=no_progress, session=session))


def test_an_older_requests_timing_never_replaces_a_newer_one():
    """COOL-SD (seed 31), then Eagle-1 (seed 32) in the same session: COOL-SD's timing, asked for after the
    newer images are shown, measures nothing and writes neither the table nor the result state; Eagle-1's own
    timing does."""
    browser = BrowserSession("race")
    older = generate_in("race", method="COOL-SD", seed=31)[5]
    newer = generate_in("race", method="Eagle-1 (lossless)", seed=32)[5]
    assert generation.on_timing(older, browser) == (gr.skip(), gr.skip())
    assert generation.on_figures(older, "fid", None, False, browser) == [gr.skip()] * 9
    table, timed = generation.on_timing(newer, browser)
    assert timed.request.label == "Eagle-1 (lossless)" and timed.request.seed == 32 and timed.timing is not None
    assert "Eagle-1 (lossless, Eagle-1 drafter)" in table and "COOL-SD" not in table  # the drafter named
    assert newer.timing is None  # a copy is timed
    assert generation.on_timing(older, BrowserSession("another")) != (gr.skip(), gr.skip())  # other sessions: unaffected


def test_a_timing_stops_once_a_newer_request_of_its_session_arrives(monkeypatch):
    """The newer request arrives while the older one is being measured: the measurement stops before its next
    run, and nothing of it is shown."""
    browser = BrowserSession("stop")
    older = generate_in("stop", seed=5)[5]
    runs = []
    real = session.generate

    def counting(*args, **kwargs):
        runs.append(args[2].name)
        if len(runs) == 2:  # the newer request's images are shown during the older one's second timed run
            STATE.latest.claim("stop")
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "generate", counting)
    assert generation.on_timing(older, browser) == (gr.skip(), gr.skip())
    assert len(runs) == 2  # of the 3 x 5 runs a timing makes


def test_direct_calls_without_a_browser_session_are_never_stale():
    first = generate_in(None, seed=1)[5]
    generate_in(None, seed=2)
    assert STATE.latest.current(None, first.serial)


# The theory panel ----------------------------------------------------------------------------------------
def test_theory_of_lantern_on_toy_pairs_uses_the_toy_tokens_neighbours(generated):
    """LANTERN++ on the 64-token toy pairs: no index error from the model's 512-code neighbour table, no
    omega column (it has no schedule), and the same numbers as the rule built on the toy neighbours by hand."""
    import torch

    from coolsd.core.rules import Lantern, nearest_codes
    from coolsd.core.theory import chain_theory, toy_chain

    for label, residual in (("LANTERN++", "lantern"), ("LANTERN++ with G*", "gstar")):
        figure, text = panels.on_theory(generated[5], *controls(method=label, k=50, lam=3.0), "toy distributions", 7, False)
        assert isinstance(figure, Figure) and "⚠️" not in text
        assert "omega_i" not in text and "| position i | beta_i | e_i | P(reach i) |" in text
        p, q = toy_chain(vocab=views.TOY_VOCAB, length=5, seed=7)
        codes = np.random.default_rng([7, 1]).standard_normal((views.TOY_VOCAB, 8))
        codes /= np.linalg.norm(codes, axis=1, keepdims=True)
        neighbours = nearest_codes(torch.from_numpy(codes), 51)
        expected = chain_theory(p, q, Lantern(neighbours, k=50, lam=3.0, residual=residual))
        assert f"E[N] = **{expected['expected_accepted']:.3f}**" in text
    assert "omega_i" not in panels.on_theory(None, *controls(method="Eagle-1 (lossless)"), "toy distributions", 0, False)[1]
    assert "| position i | omega_i |" in panels.on_theory(None, *controls(method="UniformRSD"), "toy distributions", 0, False)[1]


def test_theory_of_captured_pairs_uses_the_model_that_made_them(generated, tmp_path):
    """Pairs captured with the shipped model (512 codes) while another model (16 codes) is selected: LANTERN++'s
    rule is the capturing model's, and the panel says the pairs are from another model."""
    other = STATE.models.peek(models.DEFAULT)
    small = random_bundle("tiny")
    STATE.models.loaded["tiny-test"] = small
    try:
        selected = controls(method="LANTERN++", model="tiny-test", class_name=small.class_names[0])
        figure, text = panels.on_theory(generated[5], *selected, "last generation", 0, False)
        assert isinstance(figure, Figure) and "⚠️" not in text and "omega_i" not in text
        assert "made with model default, not the selected model tiny-test" in text
        direct = views.captured_theory(generated[5].eagle.stats.captured, session.parse_controls(
            other, controls(method="LANTERN++")).rule, 5)
        assert f"E[N] = **{direct['expected_accepted']:.3f}**" in text
    finally:
        del STATE.models.loaded["tiny-test"]


def test_theory_says_a_tree_is_computed_as_a_chain_and_shows_toy_pairs_before_any_generation(generated):
    _, text = panels.on_theory(generated[5], *controls(draft="tree:eagle25"), "last generation", 0, False)
    assert "tree:eagle25 is a tree, but these are the numbers of a chain of its depth (5)" in text
    assert "numbers of a chain" not in panels.on_theory(generated[5], *controls(draft="chain:5"), "last generation", 0, False)[1]
    figure, text = panels.on_theory(None, *controls(), "last generation", 0, False)
    assert isinstance(figure, Figure) and "Nothing generated yet" in text and "E[N]" in text


def test_the_theory_panel_is_drawn_when_the_page_loads():
    loads = [d for d in DEMO.config["dependencies"] if d["api_name"] == "on_theory"]
    assert loads and any(target[1] == "load" for target in loads[0]["targets"])


# Typed values outside a control's range -------------------------------------------------------------------
@pytest.mark.parametrize("name", list(inputs.ranged_params()))
def test_a_typed_value_out_of_range_is_one_named_warning_and_the_box_shows_what_runs(name):
    """Every typed control: above and below its range, one warning naming it and its range, and the control is
    set to the nearest end, which Generate then accepts; a value inside the range passes untouched."""
    param = inputs.ranged_params()[name]
    high = STATE.bundle.config.vocab_size if name == "top_k" else param.high
    check = inputs.on_range(param)
    def written(bound):  # 0.05, 5, 2147483647
        return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"

    for typed, end in ((high + 7, high), (param.low - 7, param.low)):
        with pytest.warns(UserWarning) as warned:
            value = check(typed, "default")
        message = str(warned[0].message)
        assert len(warned) == 1 and value == end
        assert message.startswith(f"{name} must be between {written(param.low)} and {written(high)}, got ")
        assert message.endswith(f"(set to {written(end)})") and "Traceback" not in message
        if name != "toy_seed":  # what the box now shows is what Generate runs
            method = taker(name)
            extra = {"mu_auto": False} if name == "mu" else {}
            request = session.parse_controls(STATE.bundle, controls(method=method, **{name: value}, **extra))
            ran = request.seed if name == "seed" else getattr(request.sampling, name, None)
            assert (request.param_dict[name] if ran is None else ran) == end
    assert check(param.default if not isinstance(param.default, str) else 0, "default") == gr.skip()


# The paper's presets, the API's refusals, the Eagle-1 image's draft, text shown literally ----------------
@pytest.mark.parametrize("draft", session.DRAFTS)
@pytest.mark.parametrize("preset", list(layout.PRESETS))
def test_a_paper_preset_sets_every_control_its_setting_depends_on(preset, draft):
    """From a setting the rule refuses (linear schedule, nu=2, mu by hand), a preset gives the paper's COOL-SD:
    exponential schedule, mu auto, nu 0.7, its delta; the draft stays the user's, and every draft accepts it."""
    values = layout.PRESETS[preset]
    assert {"method", "delta", "nu", "mu_auto", "schedule"} <= set(values)
    request = session.parse_controls(STATE.bundle, controls(**{**named_controls(
        schedule="linear", nu=2.0, mu_auto=False, mu=-3.0, method="UniformRSD", draft=draft), **values}))
    assert request.method == "cool" and request.draft == draft
    assert request.param_dict == {"delta": float(preset.split("δ=")[1]), "nu": 0.7, "mu": "auto", "schedule": "exp"}


@pytest.mark.parametrize("overrides, needle", [
    ({"method": "UniformRSD", "nu": 9}, "nu is not a parameter of UniformRSD (it takes: delta); got 9"),
    ({"method": "UniformRSD", "schedule": "linear"}, "schedule is not a parameter of UniformRSD"),
    ({"method": "COOL-SD", "k": 3}, "k is not a parameter of COOL-SD (it takes: delta, nu, mu, schedule)"),
    ({"method": "LANTERN++", "delta": 1.5}, "delta is not a parameter of LANTERN++ (it takes: k, lambda)"),
    ({"method": "Eagle-1 (lossless)", "mu": "1.0"}, "mu is not a parameter of Eagle-1 (lossless) (it takes: none)"),
    ({"method": "AR (no drafting)", "lam": 2.0}, "lambda is not a parameter of AR (no drafting)"),
    ({"prompt": "x" * 5_000_000}, "prompt is for text-to-image models; fashion is a class-to-image model"),
])
def test_the_api_refuses_what_the_request_cannot_use(overrides, needle, caplog):
    with caplog.at_level(logging.INFO, logger="coolsd.app"):
        with pytest.raises(gr.Error) as error:
            api.generate(**overrides)
    assert needle in error.value.message and len(error.value.message) < 300  # a 5 MB prompt is not echoed
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and len(rejected[0]) < 400


def test_the_api_takes_other_methods_parameters_left_at_their_defaults():
    """gradio_client sends every parameter, the omitted ones at their defaults: those are not refused, in any
    form a client may send them."""
    answer = api.generate(method="UniformRSD", delta=1.5, nu=0.7, mu="AUTO", k=10, lam=5, schedule="exp",
                              prompt="  ", seed=2)
    assert answer["method"]["stats"]["params"] == {"delta": 1.5}


def test_the_eagle_image_names_the_draft_it_used_even_with_ar_chosen():
    image, eagle, _, text, _, result, *_race = last(generation.on_generate(*controls(method="AR (no drafting)", draft="tree:eagle25"),
                                                       progress=no_progress))
    assert image["label"] == "AR (no drafting)" and eagle["label"] == "Eagle-1 (lossless, tree:eagle25)"
    assert "Right: **Eagle-1 (lossless, tree:eagle25)**" in text
    assert result.eagle.stats.to_dict(rounds=False)["draft"] == "tree:eagle25"


def test_with_ar_chosen_the_caption_says_only_eagle_used_the_hidden_draft():
    """Issue 42.11: with AR chosen the draft selector hides, yet the right image's label names a draft (Eagle-1
    drafts with it): the caption says that only Eagle-1 used it and where it is set; a drafting method's does not."""
    ar = session.parse_controls(STATE.bundle, controls(method="AR (no drafting)", draft="jacobi:32:coupled"))
    text = views.caption(STATE.bundle, ar)
    assert ("Right: **Eagle-1 (lossless, jacobi:32:coupled)** (AR drafts nothing: only Eagle-1 used "
            "jacobi:32:coupled, the Draft structure that a drafting method shows).") in text
    assert settings.on_method("AR (no drafting)")[-1]["visible"] is False  # that selector is hidden
    eagle = session.parse_controls(STATE.bundle, controls(method="Eagle-1 (lossless)", draft="jacobi:32:coupled"))
    assert "drafts nothing" not in views.caption(STATE.bundle, eagle)


def test_the_live_caption_words_one_target_forward_in_the_singular():
    """Issue 42.19: right after the prefill a run has made 1 token in 1 target forward."""
    request = session.parse_controls(STATE.bundle, controls(method="AR (no drafting)"))
    stats = GenerationStats("ar", {}, "chain:0", 0, 0, 0, {}, [])
    stats.rounds = [Round(0, [], [], [], {}, [3], FIRST)]
    text = views.live_caption(request, {"method": views.made_so_far(Generation([3], stats))}, 64)
    assert text == "Generating… **AR (no drafting)**: 1 of 64 tokens, 1 target forward (seed 0)"


def test_the_live_caption_says_eagles_image_is_an_earlier_one_shown_again():
    """Issue 42.6: Eagle-1's run of the same setting made earlier (at start-up, or beside another method) shows
    whole at once while the method decodes: the caption says so, live and final, and only then."""
    request = session.parse_controls(STATE.bundle, controls())
    stats = GenerationStats("cool", {}, "chain:5", 0, 0, 0, {}, [])
    stats.rounds = [Round(0, [], [], [], {}, [3], FIRST)]
    shown = {"method": views.made_so_far(Generation([3], stats)),
             "eagle": views.made_so_far(Generation([3] * 64, stats))}
    reused = views.live_caption(request, shown, 64, eagle_reused=True)
    assert "**Eagle-1 (lossless, chain:5)**: made earlier for this setting, shown again" in reused
    assert "64 of 64" not in reused and "**COOL-SD (chain:5)**: 1 of 64 tokens" in reused
    assert "made earlier" not in views.live_caption(request, shown, 64)
    assert views.REUSED in views.caption(STATE.bundle, request, eagle_reused=True)
    assert views.REUSED not in views.caption(STATE.bundle, request)
    other_seed = session.parse_controls(STATE.bundle, controls(seed=987654))
    assert not session.eagle_reused(STATE.bundle, other_seed)  # never made: decoded live
    result = last(generation.on_generate(*controls(seed=987654), progress=no_progress))[5]
    assert not result.eagle_reused and session.eagle_reused(STATE.bundle, other_seed)
    again = last(generation.on_generate(*controls(method="UniformRSD", seed=987654), progress=no_progress))
    assert again[5].eagle_reused and views.REUSED in again[3]


def test_the_theory_panel_follows_the_controls_not_the_generation_it_was_drawn_for():
    """Issue 42.5: the method switched to UniformRSD while a COOL-SD generation decodes: that generation's
    figures keep the theory panel on UniformRSD (with the generation's captured pairs)."""
    result = last(generation.on_generate(*controls(), progress=no_progress))[5]
    uniform = (*controls(method="UniformRSD"), "last generation", 0)

    def titles(figure) -> str:
        return " ".join([figure._suptitle.get_text() if figure._suptitle else ""]
                        + [ax.get_title() for ax in figure.axes])

    assert "UniformRSD" in titles(generation.on_figures(result, "fid", None, False, None, uniform)[5])
    assert "COOL-SD" in titles(generation.on_figures(result, "fid")[5])  # without controls: the generation's


@pytest.mark.parametrize("text", ["a **bold** `tick`\nand a second line", "<b>x</b> & $$x^2$$ [link](y) #1 _i_ ~s~",
                                  "- item\n1. one\n> quote | pipe \\ backslash"])
def test_user_text_is_shown_literally_on_one_line(text):
    """Rendered as Markdown (CommonMark, as the page renders it), the escaped text reads exactly as typed, its
    runs of whitespace and newlines made one space, and no HTML element comes of it but the paragraph."""
    from markdown_it import MarkdownIt
    html = MarkdownIt("commonmark").render(views.plain(text)).strip()
    assert html.startswith("<p>") and html.endswith("</p>") and html.count("<") == 2
    import html as entities
    assert entities.unescape(html[3:-4]) == " ".join(text.split())
    caption = views.caption(STATE.bundle, session.parse_controls(STATE.bundle, controls()))
    assert "Class *Trouser*" in caption


# The guided tour -----------------------------------------------------------------------------------------
STUDY = json.loads((Path(__file__).resolve().parent.parent / "assets" / "fashion" / "bench_results.json").read_text())
RUNS = {run["label"]: run for run in STUDY["runs"]}


def pairs(aspect):
    return [c["a_minus_b"] for c in STUDY["comparisons"] if c["differs_in"] == aspect]


def contains_zero(d):
    return d["low"] <= 0 <= d["high"]


def test_every_tour_step_cites_the_shipped_study():
    """Each step's numbers are the study's own (spot checks, formatted here from the JSON), none is missing."""
    texts = [settings.on_tour(i)[-1] for i in range(len(tour.STEPS))]
    assert all("(not in the study)" not in text and "{" not in text for text in texts)
    eagle, cool = RUNS["eagle @ chain:5"], RUNS["cool:delta=2,nu=0.7,schedule=exp @ chain:5"]
    ar_fid = RUNS["ar"]["vs_eagle"]["fid"]
    said = "(resolved)" if resolved(ar_fid) else "(not resolved)"
    assert f"{ar_fid['value']:+.2f} [{ar_fid['low']:+.2f}, {ar_fid['high']:+.2f}] {said} in FID" in texts[0]
    assert f"emits {eagle['tau']:.2f} tokens per target forward, {eagle['speedup_vs_ar']:.2f}x" in texts[0]
    assert f"tau {cool['tau']:.2f} against Eagle-1's {eagle['tau']:.2f}" in texts[1]
    assert f"Over the study's {len(pairs('annealing'))} such pairs" in texts[2]
    assert f"Over the study's {len(pairs('residual'))} pairs" in texts[3]
    assert f"tau {RUNS['eagle @ tree:eagle25']['tau']:.2f} for Eagle-1 on tree:eagle25" in texts[4]
    scd_ll = RUNS["eagle @ jacobi:16:coupled"]["vs_ar"]["log_likelihood_per_token"]
    assert f"it minus AR: {scd_ll['value']:+.3f} [{scd_ll['low']:+.3f}, {scd_ll['high']:+.3f}]" in texts[5]



def test_the_tour_says_which_model_its_study_measured(tmp_path):
    """The study's recorded target weights against the shipped ones: the same file is "the shipped model";
    another (a retrained default model, its study not rerun yet) names the earlier model's shape instead."""
    weights = tmp_path / "target.safetensors"
    weights.write_bytes(b"weights")
    import hashlib
    same = {**STUDY, "target_sha256": hashlib.sha256(b"weights").hexdigest()}
    assert tour.study_facts(same, weights)["study_model"] == "the shipped model"
    other = {**STUDY, "target_sha256": "0" * 64, "model_shape": {"n_layer": 8, "dim": 192}}
    text = tour.step_text(tour.STEPS[0], tour.study_facts(other, weights))
    assert ("In our study (1,000 images of the previous default model (8 layers of width 192): the study has not "
            "been rerun on the shipped one yet), AR minus Eagle-1") in text

def resolved(d):
    return not contains_zero(d)


def paired_verdict(aspect: str, measures: tuple[str, ...], for_a: bool) -> str:
    """A paired claim's verdict recomputed here: per measure, a side decides when at least a quarter of the pairs
    resolve it that way (higher tau and speed-up better; lower FID and log-likelihood gap better); the measures
    that decide must agree."""
    decided = set()
    for m in measures:
        chosen = [d[m] for d in pairs(aspect)]
        higher = m in ("tau", "speedup_vs_ar", "judge_accuracy")
        a_better = sum((d["low"] > 0) if higher else (d["high"] < 0) for d in chosen)
        b_better = sum((d["high"] < 0) if higher else (d["low"] > 0) for d in chosen)
        favoured, against = (a_better, b_better) if for_a else (b_better, a_better)
        sides = (favoured >= len(chosen) / 4, against >= len(chosen) / 4)
        decided |= {{(True, False): "holds", (False, True): "reverses", (True, True): "mixed"}[sides]} if any(sides) \
            else set()
    return decided.pop() if len(decided) == 1 else "mixed" if decided else "not resolved"


def test_the_tours_claims_are_what_the_study_measured():
    """What the steps say in words, checked against the study independently of the code that fills them in."""
    texts = [settings.on_tour(i)[-1] for i in range(len(tour.STEPS))]
    quality = ("log_likelihood_per_token", "fid", "judge_accuracy")
    ar = RUNS["ar"]["vs_eagle"]
    assert ("every 95% interval contains 0" in texts[0]) == all(contains_zero(ar[m]) for m in quality)  # step 1
    same = [run for run in STUDY["runs"] if run["method"] == "cool" and not any(resolved(run["vs_eagle"][m])
                                                                                for m in quality)]
    if same:  # step 2: the strongest COOL-SD setting the study cannot tell from Eagle-1, or that there is none
        assert max(same, key=lambda run: run["tau"])["label"].replace(" @ ", " on ") in texts[1]
    else:
        assert "No COOL-SD setting of the study is indistinguishable from Eagle-1" in texts[1]
    gaps = ("log_likelihood_gap", "fid", "judge_accuracy")
    words = tour.VERDICT_WORDS
    assert f"the claim **{words[paired_verdict('annealing', ('tau', *gaps), True)]}**" in texts[2]  # step 3
    assert f"the claim **{words[paired_verdict('residual', gaps, False)]}**" in texts[3]  # step 4: G* is b
    slower = [RUNS[f"{m} @ tree:eagle25"]["speedup_vs_ar"] < RUNS[f"{m} @ chain:5"]["speedup_vs_ar"]
              for m in ("eagle", "cool:delta=2,nu=0.7,schedule=exp")]  # step 5
    assert ("so the tree is slower" in texts[4]) == all(slower)
    for aspect, measures in (("lossless_source", ("speedup_vs_ar",)), ("refresh", ("tau",)),
                             ("relaxed_source", ("speedup_vs_ar",))):  # step 6
        assert f"**{words[paired_verdict(aspect, measures, True)]}**" in texts[5], aspect
    scd = RUNS["eagle @ jacobi:16:coupled"]
    assert f"tau {scd['tau']:.2f} and {scd['speedup_vs_ar']:.2f}x AR's speed" in texts[5]


@pytest.mark.parametrize("index", range(len(tour.STEPS)))
def test_a_tour_step_sets_its_controls_to_a_setting_that_generates(index):
    step = tour.STEPS[index]
    answer = settings.on_tour(index)
    names = settings.tour_controls()
    assert len(answer) == len(names) + 1 and answer[-1].startswith(f"**{views.plain(step.title)}**")
    set_values = {name: value for name, value in zip(names, answer) if value != gr.skip()}
    assert set_values == step.values
    request = session.parse_controls(STATE.bundle, controls(**{"schedule": "linear", "nu": 2.0, **set_values}))
    assert request.label == step.values["method"] and request.draft == step.values["draft"]


# Jacobi windows: the target drafts for itself -------------------------------------------------------------
JACOBI = "jacobi:16:coupled"


def test_the_draft_selector_offers_jacobi_windows_and_says_what_the_chosen_draft_is():
    """The selector lists Jacobi windows after the draft model's chains and trees; the line under it follows the
    choice: who drafts, how many, what the refresh does and what Eagle-1 on it is known as."""
    ui = DEMO.named
    offered = [value for _, value in ui["draft"].choices]
    assert {"jacobi:8", "jacobi:16", JACOBI, "jacobi:16:gumbel", "jacobi:32:coupled"} <= set(offered)
    assert offered.index("chain:5") < offered.index("jacobi:8") and offered == session.DRAFTS
    assert all(parse_draft(draft).depth <= 62 for draft in offered)  # the shipped model's 64 tokens leave 62
    coupled, independent, gumbel = (views.draft_note(d) for d in (JACOBI, "jacobi:16", "jacobi:16:gumbel"))
    assert "Jacobi window" in coupled and "next 16 tokens" in coupled and "maximal coupling" in coupled
    assert "Eagle-1 here is SCD." in coupled and "Eagle-1 here is SJD." in independent and "Gumbel" in gumbel
    assert "draft model proposes 5 tokens in a row" in views.draft_note("chain:5")
    assert "25 tokens, 5 deep" in views.draft_note("tree:eagle25")
    assert "⚠️" in views.draft_note("jacobi:huge") and "\n" not in views.draft_note(["x"])
    assert ui["draft_note"].value == views.draft_note(inputs.defaults()["draft"])
    follows = [d for d in DEMO.config["dependencies"] if d["api_name"] == "draft_note"]
    assert follows and follows[0]["outputs"] == [ui["draft_note"]._id]
    assert [tuple(target) for target in follows[0]["targets"]] == [(ui["draft"]._id, "change")]
    assert settings.on_method("AR (no drafting)")[-1]["visible"] is False  # the selector and its note hide together


@pytest.fixture(scope="module")
def jacobi_runs():
    """Every method on a coupled Jacobi window of the shipped model (the Eagle-1 run beside them: SCD)."""
    return {method: last(generation.on_generate(*controls(method=method, draft=JACOBI), progress=no_progress))
            for method in session.method_entries()}


def test_every_method_runs_on_a_jacobi_window(jacobi_runs):
    for method, (image, eagle, table, caption, _, result, *_race) in jacobi_runs.items():
        stats = result.method.stats
        assert stats.tokens == STATE.bundle.config.image_tokens and stats.drafter_forwards == 0, method
        assert eagle["label"] == f"Eagle-1 (lossless, {JACOBI})" and JACOBI in caption
        assert result.eagle.stats.draft == JACOBI and result.eagle.stats.drafter_forwards == 0
        if method.startswith("AR"):
            continue
        assert image["label"].startswith(method.split(" (")[0]) and JACOBI in image["label"] and stats.draft == JACOBI
        sources = {source for past in stats.rounds for source in past.sources}
        assert sources <= {"fresh", "refreshed", "kept"} and "fresh" in sources, method
    assert jacobi_runs["COOL-SD"][5].method.stats.params["delta"] == 2.0


def replay_marks(fig) -> dict[str, np.ndarray]:
    """The source marks of a replay's image panel, by source."""
    image_ax = fig.axes[0]
    return {c.get_label(): c.get_offsets() for c in image_ax.collections if c.get_label() in plots.SOURCE_STYLE}


def test_the_replay_and_the_acceptance_map_of_a_jacobi_run_show_where_its_drafts_came_from(jacobi_runs):
    result = jacobi_runs["COOL-SD"][5]
    stats, grid = result.method.stats, STATE.bundle.config
    figures = generation.on_figures(result, "fid")
    legend = [t.get_text() for fig in (figures[2], figures[4]) for lg in fig.findobj(Legend) for t in lg.get_texts()]
    used = {source for past in stats.rounds for source in past.sources}
    for source in used:  # the replay's legend: every source of the run; the map's: those of its accepted drafts
        assert legend.count(plots.SOURCE_STYLE[source][2]) == 1 + (source in stats.token_source)
    for index in (1, len(stats.rounds) // 2, len(stats.rounds) - 1):
        marks = replay_marks(panels.on_replay(result, index))
        current = stats.rounds[index]
        expected = Counter(source for node, source in enumerate(current.sources)
                           if current.start + node < grid.image_tokens)
        assert {source: len(at) for source, at in marks.items()} == dict(expected), index
    cells = {c.get_label(): len(c.get_offsets()) for c in figures[2].axes[0].collections
             if c.get_label() in plots.SOURCE_STYLE}
    assert cells == dict(Counter(source for source in stats.token_source if source))
    eagle_chain = generated_eagle_map()
    assert not [c for c in eagle_chain.axes[0].collections if c.get_label() in plots.SOURCE_STYLE]


def generated_eagle_map():
    """The acceptance map of a drafter run (Eagle-1 on chain:5): no source marks."""
    result = last(generation.on_generate(*controls(method="Eagle-1 (lossless)"), progress=no_progress))[5]
    return generation.on_figures(result, "fid")[2]


@pytest.mark.parametrize("draft", [JACOBI, "jacobi:32:coupled"])
def test_a_deep_jacobi_window_keeps_its_figures_readable(draft, jacobi_runs):
    """16 and 32 draft positions, yet no tick labels overlap (16 ran together on a phone) and no text is small,
    on a phone and a desktop."""
    result = jacobi_runs["COOL-SD"][5] if draft == JACOBI else \
        last(generation.on_generate(*controls(draft=draft), progress=no_progress))[5]
    for narrow in (False, True):
        shown = dict(views.figures(STATE.bundle, result, narrow=narrow))
        shown["replay"] = views.replay_figure(STATE.bundle, result, 2, narrow=narrow)
        shown["theory"] = views.theory_panel(result, result.request, "toy", 0, STATE.bundle, narrow=narrow)[0]
        for name, fig in shown.items():
            panel = PHONE_PANEL if narrow else DESKTOP_MAP_PANEL if name.startswith("map") else DESKTOP_PANEL
            assert not small_texts(fig, panel), (name, narrow)
            fig.canvas.draw()
            for ax in fig.axes:
                boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
                assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), (name, narrow, ax.get_title())


# GSD: grouped acceptance --------------------------------------------------------------------------------------
def test_gsd_runs_from_the_controls_and_the_api():
    for label, residual in (("GSD", "gsd"), ("GSD with G*", "gstar")):
        result = last(generation.on_generate(*controls(method=label, ranks=3, gap=0.3, dist=1.0), progress=no_progress))[5]
        assert result.request.param_dict == {"ranks": 3, "gap": 0.3, "dist": 1.0, "residual": residual}
        assert result.method.stats.method == "gsd" and result.method.stats.tokens == STATE.bundle.config.image_tokens
    answer = api.generate(method="GSD", ranks=3, gap=0.3, dist=1.0, seed=2)
    assert answer["method"]["stats"]["params"] == {"ranks": 3, "gap": 0.3, "dist": 1.0, "residual": "gsd"}
    assert api.generate_batch(method="GSD with G*", ranks=5, seeds=[2])["images"][0]["method"]["stats"][
        "params"]["ranks"] == 5
    with pytest.raises(gr.Error, match="ranks is not a parameter of COOL-SD"):
        api.generate(method="COOL-SD", ranks=3)
    with pytest.raises(gr.Error, match="gap must be between 0.01 and 1"):
        api.generate(method="GSD", gap=2.0)


@pytest.mark.parametrize("endpoint, counts", [("generate", (15, 17, 20, 21)), ("generate_batch", (16, 19, 20))])
def test_older_api_clients_keep_their_positions(endpoint, counts):
    """GSD's values, then the drafter, come last: a client that sends the values of an older contract gets the
    defaults for the rest; one more value than the newest contract takes is refused in one line."""
    tail = {"generate": ["", "", 7, 0.15, 0.5, "eagle1"], "generate_batch": [7, 0.15, 0.5, "eagle1"]}[endpoint]
    fn = next(fn for fn in DEMO.fns.values() if fn.api_name == endpoint)
    parameters = DEMO.get_api_info()["named_endpoints"][f"/{endpoint}"]["parameters"]
    assert [parameter["parameter_name"] for parameter in parameters][-4:] == ["ranks", "gap", "dist", "drafter"]
    for count in counts[:-1]:
        values = [None] * count
        DEMO.validate_inputs(fn, values)
        assert len(values) == len(fn.inputs) == counts[-1] and values[count:] == tail[len(tail) - counts[-1] + count:]
    with pytest.raises(gr.Error, match=f"/{endpoint} takes {counts[0]} to {counts[-1]} values, got {counts[-1] + 1}"):
        DEMO.validate_inputs(fn, [None] * (counts[-1] + 1))


def test_theory_of_gsd_on_toy_pairs_uses_the_toy_tokens_embeddings(generated):
    """GSD needs embeddings: the toy pairs' own (from the toy seed), the same numbers as the rule built on them
    by hand, and more acceptance than Eagle-1 on the same pairs; on captured pairs, the shipped model's."""
    from coolsd.core.rules import Grouped
    from coolsd.core.theory import chain_theory, toy_chain

    figure, text = panels.on_theory(None, *controls(method="GSD", gap=0.5, dist=2.0), "toy distributions", 3, False)
    assert isinstance(figure, Figure) and "⚠️" not in text and "GSD's embeddings" in text and "omega_i" not in text
    p, q = toy_chain(vocab=views.TOY_VOCAB, length=5, seed=3)
    expected = chain_theory(p, q, Grouped(views.toy_embeddings(views.TOY_VOCAB, 3), 7, 0.5, 2.0))
    assert f"E[N] = **{expected['expected_accepted']:.3f}**" in text and expected["tv_bound"] > 0
    eagle = panels.on_theory(None, *controls(method="Eagle-1 (lossless)"), "toy distributions", 3, False)[1]
    assert float(eagle.split("E[N] = **")[1].split("**")[0]) < expected["expected_accepted"]
    figure, text = panels.on_theory(generated[5], *controls(method="GSD with G*"), "last generation", 0, False)
    assert isinstance(figure, Figure) and "⚠️" not in text and "captured along the last Eagle-1 run" in text


# The drafter: Eagle-1 or EAGLE-3, for every rule, in both images, the timing and the race ----------------------
TWO_DRAFTERS = "two-drafters"  # the selector's key of the shipped model with an EAGLE-3 drafter beside its Eagle-1
ONE_DRAFTER = "eagle1-only"  # ... and of the shipped model with its Eagle-1 drafter alone (whatever it ships)


@pytest.fixture(scope="module")
def one():
    """The shipped model with its Eagle-1 drafter alone, as the selector's model ONE_DRAFTER."""
    eagle1 = STATE.bundle.drafters["eagle1"]
    bundle = dataclasses.replace(STATE.bundle, drafter=eagle1, drafters={"eagle1": eagle1})
    STATE.models.loaded[ONE_DRAFTER] = bundle
    yield bundle
    del STATE.models.loaded[ONE_DRAFTER]


@pytest.fixture(scope="module")
def both():
    """The shipped model with a random EAGLE-3 drafter (reading its layers 2, 16 and 29) beside its Eagle-1, as
    the selector's model TWO_DRAFTERS."""
    from coolsd.models.eagle import Eagle3Drafter
    torch.manual_seed(0)
    eagle3 = Eagle3Drafter(STATE.bundle.config).eval()
    eagle3.share_embedding(STATE.bundle.target)
    bundle = dataclasses.replace(STATE.bundle, drafters={**STATE.bundle.drafters, "eagle3": eagle3})
    STATE.models.loaded[TWO_DRAFTERS] = bundle
    yield bundle
    del STATE.models.loaded[TWO_DRAFTERS]


def expected_runs(bundle, request, drafter):
    """The library's own runs of ``request`` (its rule, then Eagle-1's rule) with ``drafter``."""
    from coolsd.core.decode import generate
    from coolsd.core.rules import Eagle
    model, cls = bundle.with_drafter(drafter), session.condition(bundle, request)
    return [generate(model, cls, rule, request.tree, request.sampling, request.seed)
            for rule in (request.rule, Eagle())]


@pytest.fixture(scope="module")
def eagle3_generated(both):
    """Generate on TWO_DRAFTERS with the EAGLE-3 drafter chosen (seed 5), as the page sends it."""
    return last(generation.on_generate(*controls(model=TWO_DRAFTERS, drafter="eagle3", seed=5), progress=no_progress))


def test_the_drafter_control_offers_the_models_drafters_and_follows_model_and_draft(both, one):
    """The Drafter radio sits in the draft box with the shipped model's drafters, Eagle-1 chosen; a model with one
    drafter hides it (no choice to make), one with two shows both. Switching models keeps the user's choice where
    the new model has it, else Eagle-1; a Jacobi window hides it (the target drafts for itself)."""
    radio = DEMO.named["drafter"]
    assert isinstance(radio, gr.Radio) and radio.label == "Drafter" and radio.value == "eagle1"
    names = {"eagle1": "Eagle-1", "eagle3": "EAGLE-3"}
    assert radio.choices == [(names[name], name) for name in STATE.bundle.drafters]
    assert radio.visible is (len(STATE.bundle.drafters) > 1)
    assert inputs.defaults(both)["drafter"] == "eagle1"
    with gr.Blocks():
        shown, hidden = (layout.drafter_radio(bundle, inputs.defaults(bundle)) for bundle in (both, one))
    assert shown.choices == [("Eagle-1", "eagle1"), ("EAGLE-3", "eagle3")] and shown.visible is True
    assert hidden.choices == [("Eagle-1", "eagle1")] and hidden.visible is False
    events = {fn.api_name: fn for fn in DEMO.fns.values()}
    assert radio in events["on_model"].inputs and radio in events["on_model"].outputs
    assert radio in events["on_draft"].outputs

    def switch(model, previous, draft, drafter):
        return dict(zip(settings.MODEL_OUTPUTS, settings.on_model(model, previous, False, draft, drafter,
                                                                  progress=no_progress)))["drafter"]

    there = switch(TWO_DRAFTERS, "default", "chain:5", "eagle1")
    assert there["choices"] == [("Eagle-1", "eagle1"), ("EAGLE-3", "eagle3")] and there["visible"] is True
    assert switch(TWO_DRAFTERS, "default", "tree:eagle25", "eagle3")["value"] == "eagle3"
    assert switch(TWO_DRAFTERS, "default", "jacobi:16", "eagle3")["visible"] is False
    back = switch(ONE_DRAFTER, TWO_DRAFTERS, "chain:5", "eagle3")  # that model has no EAGLE-3 drafter
    assert back["choices"] == [("Eagle-1", "eagle1")] and back["value"] == "eagle1" and back["visible"] is False
    assert settings.on_draft("tree:eagle25", TWO_DRAFTERS)["visible"] is True
    assert settings.on_draft("jacobi:8:coupled", TWO_DRAFTERS)["visible"] is False
    assert settings.on_draft("chain:5", ONE_DRAFTER)["visible"] is False


def test_a_request_with_the_eagle3_drafter_decodes_both_images_with_it(both, eagle3_generated):
    """Both images of an EAGLE-3 request are the library's runs with the EAGLE-3 drafter, not Eagle-1's (whose
    rounds differ); the labels and the timing table name the drafter, AR's row none."""
    image, eagle_image, table, _, _, result, *_ = eagle3_generated
    request = result.request
    assert request.drafter == "eagle3" and request.model == TWO_DRAFTERS
    method, eagle = expected_runs(both, request, "eagle3")
    assert result.method.tokens == method.tokens and result.eagle.tokens == eagle.tokens
    assert result.method.stats.accepted_per_round == method.stats.accepted_per_round
    assert result.eagle.stats.accepted_per_round == eagle.stats.accepted_per_round
    eagle1 = expected_runs(both, request, "eagle1")[1]
    assert result.eagle.stats.accepted_per_round != eagle1.stats.accepted_per_round
    assert image["label"] == "COOL-SD (chain:5, EAGLE-3 drafter)"
    assert eagle_image["label"] == "Eagle-1 (lossless, chain:5, EAGLE-3 drafter)"
    assert "| COOL-SD (EAGLE-3 drafter) |" in table and "| Eagle-1 (lossless, EAGLE-3 drafter) |" in table
    assert "| AR (no drafting) |" in table and "Eagle-1 drafter" not in table


def test_the_drafter_is_checked_and_kept_as_the_request_crosses_a_process(both):
    """By name or display name; a Jacobi window keeps none (no drafter drafts), AR's request keeps it (the
    Eagle-1 image beside it drafts); a pickled request (ZeroGPU's worker) keeps it and is rebuilt with it."""
    import pickle

    def drafter(bundle, **changes):
        return session.parse_controls(bundle, controls(**changes)).drafter

    assert drafter(both, model=TWO_DRAFTERS, drafter="EAGLE-3") == "eagle3"
    assert drafter(both, model=TWO_DRAFTERS, drafter="Eagle-1") == "eagle1"
    assert drafter(both, model=TWO_DRAFTERS, drafter="eagle3", method="AR (no drafting)") == "eagle3"
    assert drafter(both, model=TWO_DRAFTERS, drafter="eagle3", draft="jacobi:16:coupled") == ""
    assert drafter(STATE.bundle) == "eagle1"
    request = session.parse_controls(both, controls(model=TWO_DRAFTERS, drafter="eagle3", draft="tree:eagle25"))
    crossed = pickle.loads(pickle.dumps(request))
    assert crossed.rule is None and crossed.drafter == "eagle3"
    assert session.rebuilt(both, crossed).tree.name == "tree:eagle25"
    assert session.drafting(both, crossed).drafter is both.drafters["eagle3"]


def test_the_eagle_cache_never_serves_one_drafters_run_for_another(both, monkeypatch):
    """The same setting with each drafter: two entries, each the library's run with that drafter; a Jacobi window
    (no drafter) is one entry whichever drafter the hidden control holds."""
    monkeypatch.setattr(session, "EAGLE_CACHE", session.ResultCache())
    runs = {}
    for drafter in ("eagle1", "eagle3"):
        request = session.parse_controls(both, controls(model=TWO_DRAFTERS, method="Eagle-1 (lossless)",
                                                        drafter=drafter, seed=6))
        assert not session.eagle_reused(both, request)
        runs[drafter] = session.compare(both, request).eagle
        assert session.eagle_reused(both, request)
        assert runs[drafter].tokens == expected_runs(both, request, drafter)[1].tokens
    assert len(session.EAGLE_CACHE.items) == 2
    assert runs["eagle1"].stats.accepted_per_round != runs["eagle3"].stats.accepted_per_round
    windows = [session.parse_controls(both, controls(model=TWO_DRAFTERS, drafter=drafter, draft="jacobi:8"))
               for drafter in ("eagle1", "eagle3")]
    assert session.eagle_key(both, windows[0]) == session.eagle_key(both, windows[1])


def test_the_timing_and_the_race_say_which_drafter_ran(both, eagle3_generated):
    """The timing run drafts with the request's drafter (its runs are the images' tokens); the table's drafting
    rows and the race's drafting lanes name it, AR's row and lane do not."""
    result = eagle3_generated[5]
    timing = session.measure_speed(both, result.request, repeats=1)
    assert timing.runs["method"].tokens == result.method.tokens and timing.runs["eagle"].tokens == result.eagle.tokens
    timed = dataclasses.replace(result, timing=timing)
    table = views.timing_table(timed)
    assert "| COOL-SD (EAGLE-3 drafter) |" in table and "| AR (no drafting) |" in table
    lanes = views.race_lanes(timed)
    assert {lane.name: lane.title for lane in lanes} == {"AR": "AR", "Eagle-1": "Eagle-1 (EAGLE-3 drafter)",
                                                        "COOL-SD": "COOL-SD (EAGLE-3 drafter)"}
    text = frames.race_table(lanes, 0.0, frames.slowdown(lanes))
    assert "Drafter: EAGLE-3 (Eagle-1, COOL-SD); AR drafts nothing." in text


def test_a_bad_or_missing_drafter_is_one_readable_line(both, one):
    """An unknown drafter, or one the model does not carry, through the API and the page: one line, no
    traceback; the API takes the drafter by display name too, and answers which drafter each image used."""
    cases = [({"drafter": "medusa"}, "drafter must be one of: eagle1 (Eagle-1), eagle3 (EAGLE-3); got 'medusa'"),
             ({"drafter": "eagle3", "model": ONE_DRAFTER},
              f"{one.name} has no EAGLE-3 drafter (eagle3); it has: eagle1 (Eagle-1)"),
             ({"drafter": ["eagle3"]}, "drafter must be one of")]
    for values, needle in cases:
        for call in (lambda: api.generate(seed=5, **values),
                     lambda: generation.on_check(*controls(**values))):
            with pytest.raises(gr.Error) as error:
                call()
            message = error.value.message
            assert needle in message and "\n" not in message and "Traceback" not in message
    with pytest.raises(gr.Error, match="has no EAGLE-3 drafter"):
        api.generate_batch(drafter="EAGLE-3", seeds=[5], model=ONE_DRAFTER)
    answer = api.generate(model=TWO_DRAFTERS, drafter="EAGLE-3", seed=5)
    method, eagle = expected_runs(both, session.parse_controls(both, controls(model=TWO_DRAFTERS, seed=5)), "eagle3")
    assert answer["method"]["tokens"] == method.tokens and answer["eagle"]["tokens"] == eagle.tokens
    assert answer["method"]["stats"]["drafter"] == "eagle3" and answer["eagle"]["stats"]["drafter"] == "eagle3"
    ar = api.generate(method="AR (no drafting)", seed=5)
    assert ar["method"]["stats"]["drafter"] is None and ar["eagle"]["stats"]["drafter"] == "eagle1"
