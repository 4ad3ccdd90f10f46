"""One rule registry serves every front end: a throwaway method registered here, and nowhere else, appears and
works in the command line, the benchmark's method specs, the app's controls and the plots' names."""

import json

import gradio as gr
import pytest
import torch

from coolsd.app import plots, series, session
from coolsd.app.controls import method_boxes
from coolsd.cli import bench, generate
from coolsd.cli.methods import parse_method
from coolsd.core.params import Param
from coolsd.core.rules import RULES, AcceptanceRule, RuleSpec

TINY = ["--random-init", "tiny"]
STRENGTH = Param("strength", 1.0, 3.0, 2.0, 0.1, "Half strength (s)", help="multiplies the target's p")


class Half(AcceptanceRule):
    """``p_hat = strength * p``: the smallest rule there is, to be found by every front end."""

    name = "half"

    def __init__(self, strength: float = 2.0) -> None:
        self.strength = float(strength)

    def params(self) -> dict:
        return {"strength": self.strength}

    def relaxed_target(self, p: torch.Tensor, depth) -> torch.Tensor:
        return self.strength * p


def build_half(params: dict, depth: int, model) -> Half:
    return Half(**params)


@pytest.fixture
def half():
    """The throwaway method, registered for one test; the registry is restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(RULES, "half", RuleSpec("half", "Half-relaxed", build_half, (STRENGTH,), swept=("strength",),
                                              help="p_hat = strength * p"))
        yield RULES["half"]
    assert "half" not in RULES


def no_progress(*args, **kwargs):
    pass


def test_the_command_line_generates_with_it(half, tmp_path, capsys):
    assert "--strength" in generate.build_parser().format_help() and "half: Half-relaxed" in \
        generate.build_parser().format_help()
    stats_path = tmp_path / "stats.json"
    code = generate.main(["--method", "half", "--strength", "1.5", "--class", "2", "--seed", "3",
                          "--stats", str(stats_path), *TINY])
    assert code == 0, capsys.readouterr().err
    stats = json.loads(stats_path.read_text())
    assert stats["method"] == "half" and stats["params"] == {"strength": 1.5} and stats["tokens"] == 16
    assert generate.main(["--method", "half", "--strength", "5", *TINY]) == 2
    assert "error: strength must be between 1 and 3, got '5'" in capsys.readouterr().err
    assert generate.main(["--method", "half", "--delta", "2", *TINY]) == 2  # another method's parameter
    assert "takes no parameter 'delta'" in capsys.readouterr().err


def test_the_benchmark_runs_it(half, tmp_path):
    assert parse_method("half:strength=1.5") == ("half", {"strength": 1.5})
    with pytest.raises(ValueError, match="strength must be between 1 and 3"):
        parse_method("half:strength=9")
    out = tmp_path / "bench.json"
    assert bench.main(["--methods", "half:strength=1.5", *TINY, "--images", "1", "--warmup", "0", "--no-progress",
                       "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(run["method"], run["params"]) for run in runs] == [("ar", {}), ("half", {"strength": 1.5})]
    assert runs[1]["label"] == "half:strength=1.5" and runs[1]["tau"] >= 1


def test_the_plots_name_it(half):
    assert series.method_name("half") == "Half-relaxed"
    run = {"method": "half", "params": {"strength": 1.5}}
    assert (plots.family(run), series.family_name(run), series.point_label(run)) == ("half", "Half-relaxed",
                                                                                  "strength=1.5")


def test_the_app_lists_it_with_its_own_control(half):
    from coolsd.app.web import layout, runtime, settings

    assert session.method_entries()["Half-relaxed"] == ("half", {})
    control = next(control for control in session.method_controls() if control.name == "strength")
    assert control.labels == {"Half-relaxed"} and control.schema is STRENGTH
    demo = layout.build_demo(runtime.start())
    ui = demo.named
    assert ("Half-relaxed", "Half-relaxed") in ui["method"].choices
    strength = ui["strength"]
    assert isinstance(strength, gr.Slider) and strength.label == STRENGTH.label
    assert (strength.minimum, strength.maximum, strength.step, strength.value) == (1.0, 3.0, 0.1, 2.0)
    boxes = method_boxes()
    box = next(i for i, (_, items) in enumerate(boxes) if "strength" in items)
    assert boxes[box][0] == {"Half-relaxed"}

    def shown(method):
        return [update["visible"] for update in settings.on_method(method)]

    assert shown("Half-relaxed")[box] and shown("Half-relaxed")[-1]  # its box, and the draft (it drafts)
    assert sum(shown("Half-relaxed")[:-1]) == 1  # no other method's controls
    assert not any(shown(label)[box] for label in session.method_entries() if label != "Half-relaxed")


def test_the_app_generates_with_it(half):
    from coolsd.app.web import api, generation, inputs, panels, runtime

    state = runtime.start()  # the app's state, as app.py makes it
    values = {**inputs.defaults(), "method": "Half-relaxed", "strength": 1.5, "draft": "tree:eagle25"}
    ordered = [values[name] for name in session.value_names()]
    *_, (image, _, table, caption, _, result, *_race) = generation.on_generate(*ordered, progress=no_progress)
    assert image["label"] == "Half-relaxed (tree:eagle25)" and "Half-relaxed" in table and "Half-relaxed" in caption
    assert result.method.stats.method == "half" and result.method.stats.params == {"strength": 1.5}
    assert result.method.stats.tokens == state.bundle.config.image_tokens
    figures = generation.on_figures(result, "fid")
    assert figures[0] is not None and "E[N]" in figures[6]
    assert "E[N]" in panels.on_theory(result, *ordered, "toy distributions", 0, False)[1]
    # typed out of range (its box's own check warns and sets it back): the generation runs at the range's end
    *_, final = generation.on_generate(*[{**values, "strength": 4}[name] for name in session.value_names()],
                                       progress=no_progress)
    clamped = final[5]  # the result
    assert clamped.request.param_dict == {"strength": 3.0}
    with pytest.raises(ValueError, match="strength must be between 1 and 3"):
        session.parse_controls(state.bundle, [{**values, "strength": 4}[name] for name in session.value_names()])
    answer = api.generate(method="Half-relaxed", seed=1)  # the API's 15 parameters: strength at its default
    assert answer["method"]["stats"]["params"] == {"strength": 2.0}
