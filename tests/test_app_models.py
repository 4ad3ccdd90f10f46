"""The app's model selector, offline: the listing (default first, COOLSD_MODELS's directories, presets only when
available), switching to a tiny text-to-image model.json directory (prompt box instead of the class dropdown),
generating with a prompt through the UI's callbacks and the API, readable errors for a bad or unloadable model,
and images at native resolution from 128 px up."""

from __future__ import annotations

import base64
import io
import json
import os

import gradio as gr
import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from test_model_json import GPT_ARGS, VQ_ARGS, model_dir  # noqa: F401 (model_dir: the tiny text-to-image model)

import app
from coolsd.app import models, session, views
from coolsd.models.registry import preset_names


def no_progress(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory):
    """A model.json directory that is listed but cannot load (its weights are missing)."""
    root = tmp_path_factory.mktemp("broken")
    (root / "model.json").write_text(json.dumps({"family": "llamagen", "name": "broken", "gpt": "missing.pt",
                                                 "vq": "missing_vq.pt", "model_args": GPT_ARGS, "vq_args": VQ_ARGS}))
    return root


@pytest.fixture(autouse=True)
def local_models(model_dir, broken_dir, monkeypatch):  # noqa: F811
    """COOLSD_MODELS names the tiny model and the broken one; offline, with no preset cached."""
    monkeypatch.setenv(models.ENV, os.pathsep.join([str(model_dir), str(broken_dir), "/no/such/dir"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: False)


def controls(**overrides):
    values = app.defaults()
    values.update(overrides)
    return [values[name] for name in session.value_names()]


def test_the_listing_has_the_default_first_then_the_local_models(model_dir, broken_dir):  # noqa: F811
    choices = app.MODELS.choices()
    assert [choice.key for choice in choices] == [models.DEFAULT, str(model_dir), str(broken_dir)]
    assert choices[0].label == f"{app.BUNDLE.name} (default)"
    assert choices[1].label.startswith("tiny text-to-image")
    dropdown = app.demo.named["model"]
    assert dropdown.value == models.DEFAULT and dropdown.label == "Model"


def test_presets_are_listed_only_when_available(monkeypatch):
    def keys():
        return [choice.key for choice in app.MODELS.choices() if choice.key in preset_names()]

    assert keys() == []  # offline, nothing cached
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: True)
    assert keys() == preset_names()
    assert all(not choice.label.endswith("use)") for choice in app.MODELS.choices())
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert keys() == preset_names()
    labels = [choice.label for choice in app.MODELS.choices() if choice.key in preset_names()]
    assert all(label.endswith("(downloads on first use)") for label in labels)


def test_the_cache_check_reads_the_hugging_face_cache(monkeypatch, tmp_path):
    monkeypatch.undo()  # the real check, on an empty cache, then on one holding a file
    monkeypatch.setattr(models, "HUB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not models.hub_cached("hf://peizesun/llamagen_t2i/vq_ds16_t2i.pt")
    assert models.preset_status("llamagen-t2i-xl") is None
    repo = tmp_path / "models--peizesun--llamagen_t2i"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("a" * 40) / "vq_ds16_t2i.pt").write_bytes(b"x")
    assert models.hub_cached("hf://peizesun/llamagen_t2i/vq_ds16_t2i.pt")
    assert not models.hub_cached("hf://peizesun/llamagen_t2i/t2i_XL_stage1_256.pt")


def test_switching_to_a_text_model_shows_the_prompt_box(model_dir):  # noqa: F811
    outputs = dict(zip(app.MODEL_OUTPUTS, app.on_model(str(model_dir), models.DEFAULT, "fid", progress=no_progress)))
    assert outputs["class_name"]["visible"] is False and outputs["prompt_box"]["visible"] is True
    assert outputs["top_k"]["maximum"] == 16 and outputs["cfg_scale"] == 3.0
    assert outputs["model_state"] == str(model_dir)
    back = dict(zip(app.MODEL_OUTPUTS, app.on_model(models.DEFAULT, str(model_dir), "fid", progress=no_progress)))
    assert back["class_name"]["visible"] is True and back["prompt_box"]["visible"] is False
    assert back["class_name"]["choices"] == app.BUNDLE.class_names and back["class_name"]["value"] == "Trouser"
    assert back["top_k"]["maximum"] == app.BUNDLE.config.vocab_size and back["cfg_scale"] == 2.0
    assert isinstance(back["tradeoff_plot"], Figure) and back["model_state"] == models.DEFAULT


def test_generating_with_a_prompt_fills_every_output(model_dir):  # noqa: F811
    prompt = "a red cat on the grass"
    image, eagle_image, table, caption, _slider, result = app.on_generate(
        *controls(model=str(model_dir), prompt=prompt, cfg_scale=3.0), progress=no_progress)
    assert image["value"].size == (80, 80) and eagle_image.size == (80, 80)  # 8 px, enlarged 10x
    assert prompt in caption and "Trouser" not in caption
    assert result.request.class_id is None and result.request.prompt == prompt
    assert result.method.stats.tokens == 16 and "speed-up vs AR" in table
    figures = app.on_figures(result, "fid")
    assert all(isinstance(figure, Figure) for figure in figures[:6]) and figures[7] is None  # no benchmark shipped
    assert isinstance(app.on_replay(result, 0), Figure)
    assert any(key[0] == str(model_dir) and prompt in key for key in session.EAGLE_CACHE.items)
    table, timed = app.on_timing(result)
    assert timed.timing.repeats == session.TIMING_REPEATS
    with pytest.raises(gr.Error) as error:
        app.on_generate(*controls(model=str(model_dir), prompt="  "), progress=no_progress)
    assert "prompt must be a non-empty text" in error.value.message


def test_images_show_at_native_resolution_from_128_px():
    assert views.enlarge(np.zeros((256, 256, 3), np.uint8)).size == (256, 256)
    assert views.enlarge(np.zeros((8, 8, 3), np.uint8)).size == (80, 80)
    assert views.enlarge(np.zeros((28, 28, 3), np.uint8)).size == (280, 280)
    crisp = np.array(views.enlarge(np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8)))
    assert set(np.unique(crisp)) == {0, 255}  # nearest neighbour: no blur


def test_the_api_takes_a_model_and_a_prompt(model_dir):  # noqa: F811
    first = app.api_generate(method="COOL-SD", seed=3, model=str(model_dir), prompt="a blue dog")
    second = app.api_generate(method="COOL-SD", seed=3, model=str(model_dir), prompt="a blue dog")
    assert first["method"]["tokens"] == second["method"]["tokens"] and len(first["method"]["tokens"]) == 16
    assert np.array(first["method"]["pixels"]).shape == (8, 8, 3)
    assert first["method"]["stats"]["sampling"]["cfg_scale"] == 3.0  # the model's default
    assert first["method"]["stats"]["condition"]["caption"] == "a blue dog"
    assert Image.open(io.BytesIO(base64.b64decode(first["eagle"]["png_base64"]))).size == (8, 8)
    default = app.api_generate(method="COOL-SD", seed=3)  # the existing contract: the default model
    assert len(default["method"]["tokens"]) == app.BUNDLE.config.image_tokens
    again = app.api_generate(method="COOL-SD", seed=3, model="", prompt="ignored by a class model")
    assert again["method"]["tokens"] == default["method"]["tokens"] and again["method"]["stats"]["class_id"] == 1


@pytest.mark.parametrize("model, needle", [
    ("no-such-model", "model must be one of"),
    (["x"], "model must be a string"),
    ("/etc", "model must be one of"),
])
def test_a_bad_model_is_a_readable_error(model, needle):
    with pytest.raises(gr.Error) as error:
        app.api_generate(model=model)
    assert needle in error.value.message and "Traceback" not in error.value.message
    with pytest.raises(gr.Error) as error:
        app.on_generate(*controls(model=model), progress=no_progress)
    assert needle in error.value.message


def test_a_model_that_cannot_load_is_a_notice_and_the_selection_goes_back(broken_dir):
    with pytest.warns(UserWarning, match="could not load model"):
        outputs = app.on_model(str(broken_dir), models.DEFAULT, "fid", progress=no_progress)
    named = dict(zip(app.MODEL_OUTPUTS, outputs))
    assert named["model"]["value"] == models.DEFAULT and named["model_state"] == models.DEFAULT
    with pytest.raises(gr.Error) as error:
        app.api_generate(model=str(broken_dir))
    assert "could not load model" in error.value.message and "missing.pt" in error.value.message


def test_reset_keeps_the_model_and_takes_its_defaults(model_dir):  # noqa: F811
    app.MODELS.get(str(model_dir))
    names = [name for name in session.value_names() if name not in session.CONDITION]
    values = dict(zip(names, app.on_reset(str(model_dir))))
    assert values["cfg_scale"] == 3.0 and values["method"] == app.DEFAULT_METHOD
    assert dict(zip(names, app.on_reset(models.DEFAULT)))["class_name"] == "Trouser"
