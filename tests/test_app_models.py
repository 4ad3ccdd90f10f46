"""The app's model selector, offline: the listing (default first, COOLSD_MODELS's directories, presets only when
available), switching to a tiny text-to-image model.json directory (prompt box instead of the class dropdown),
generating with a prompt through the UI's callbacks and the API, readable errors for a bad or unloadable model,
and images at native resolution from 128 px up."""

from __future__ import annotations

import base64
import http.server
import io
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from test_model_json import GPT_ARGS, VQ_ARGS, model_dir  # noqa: F401 (model_dir: the tiny text-to-image model)

from coolsd.app import models, session, views
from coolsd.app.controls import DEFAULT_METHOD
from coolsd.app.web import api, generation, inputs, layout, panels, runtime, settings
from coolsd.models.bundle import random_bundle
from coolsd.models.registry import PRESETS, preset_names, read_spec

STATE = runtime.start()  # the app's state, as app.py makes it
DEMO = layout.build_demo(STATE)


def no_progress(*args, **kwargs):
    pass


def last(outputs):
    """The final outputs of Generate (it yields pictures of the runs in progress first)."""
    *_, final = outputs
    return final


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
    values = inputs.defaults()
    values.update(overrides)
    return [values[name] for name in session.value_names()]


def test_the_listing_has_the_default_first_then_the_local_models(model_dir, broken_dir):  # noqa: F811
    choices = STATE.models.choices()
    assert [choice.key for choice in choices] == [models.DEFAULT, str(model_dir), str(broken_dir)]
    assert choices[0].label == f"{STATE.bundle.name} (default)"
    assert choices[1].label.startswith("tiny text-to-image")
    dropdown = DEMO.named["model"]
    assert dropdown.value == models.DEFAULT and dropdown.label == "Model"


def test_presets_are_listed_only_when_available(monkeypatch):
    def keys():
        return [choice.key for choice in STATE.models.choices() if choice.key in preset_names()]

    assert keys() == []  # offline, nothing cached
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: True)
    assert keys() == preset_names()
    assert all(not choice.label.endswith("use)") for choice in STATE.models.choices())
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert keys() == preset_names()
    labels = [choice.label for choice in STATE.models.choices() if choice.key in preset_names()]
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
    outputs = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(str(model_dir), models.DEFAULT, False, progress=no_progress)))
    assert outputs["class_name"]["visible"] is False and outputs["prompt_box"]["visible"] is True
    assert outputs["top_k"]["maximum"] == 16 and outputs["cfg_scale"] == 3.0
    assert outputs["model_state"] == str(model_dir)
    back = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(models.DEFAULT, str(model_dir), False, progress=no_progress)))
    assert back["class_name"]["visible"] is True and back["prompt_box"]["visible"] is False
    assert back["class_name"]["choices"] == STATE.bundle.class_names and back["class_name"]["value"] == "Trouser"
    assert back["top_k"]["maximum"] == STATE.bundle.config.vocab_size and back["cfg_scale"] == 2.0
    assert isinstance(back["tradeoff_plot"], Figure) and back["model_state"] == models.DEFAULT


def test_generating_with_a_prompt_fills_every_output(model_dir):  # noqa: F811
    prompt = "a red cat on the grass"
    *_, (image, eagle_image, table, caption, _slider, result, *_race) = generation.on_generate(
        *controls(model=str(model_dir), prompt=prompt, cfg_scale=3.0), progress=no_progress)
    assert image["value"].size == (80, 80) and eagle_image["value"].size == (80, 80)  # 8 px, enlarged 10x
    assert prompt in caption and "Trouser" not in caption
    assert result.request.class_id is None and result.request.prompt == prompt
    assert result.method.stats.tokens == 16 and "speed-up vs AR" in table
    figures = generation.on_figures(result, "fid")
    assert all(isinstance(figure, Figure) for figure in figures[:6]) and figures[7] is None  # no benchmark shipped
    assert "has no shipped study" in figures[8]
    assert isinstance(panels.on_replay(result, 0), Figure)
    assert any(key[0] == str(model_dir) and prompt in key for key in session.EAGLE_CACHE.items)
    table, timed = generation.on_timing(result)
    assert timed.timing.repeats == session.TIMING_REPEATS
    with pytest.raises(gr.Error) as error:
        list(generation.on_generate(*controls(model=str(model_dir), prompt="  "), progress=no_progress))
    assert "prompt must be a non-empty text" in error.value.message


def test_images_show_at_native_resolution_from_128_px():
    assert views.enlarge(np.zeros((256, 256, 3), np.uint8)).size == (256, 256)
    assert views.enlarge(np.zeros((8, 8, 3), np.uint8)).size == (80, 80)
    assert views.enlarge(np.zeros((28, 28, 3), np.uint8)).size == (280, 280)
    crisp = np.array(views.enlarge(np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8)))
    assert set(np.unique(crisp)) == {0, 255}  # nearest neighbour: no blur


def test_the_api_takes_a_model_and_a_prompt(model_dir):  # noqa: F811
    first = api.generate(method="COOL-SD", seed=3, model=str(model_dir), prompt="a blue dog")
    second = api.generate(method="COOL-SD", seed=3, model=str(model_dir), prompt="a blue dog")
    assert first["method"]["tokens"] == second["method"]["tokens"] and len(first["method"]["tokens"]) == 16
    assert np.array(first["method"]["pixels"]).shape == (8, 8, 3)
    assert first["method"]["stats"]["sampling"]["cfg_scale"] == 3.0  # the model's default
    assert first["method"]["stats"]["condition"]["caption"] == "a blue dog"
    assert Image.open(io.BytesIO(base64.b64decode(first["eagle"]["png_base64"]))).size == (8, 8)
    default = api.generate(method="COOL-SD", seed=3)  # the existing contract: the default model
    assert len(default["method"]["tokens"]) == STATE.bundle.config.image_tokens
    again = api.generate(method="COOL-SD", seed=3, model="", prompt="")  # an empty prompt is no prompt
    assert again["method"]["tokens"] == default["method"]["tokens"] and again["method"]["stats"]["class_id"] == 1


@pytest.mark.parametrize("model, needle", [
    ("no-such-model", "model must be one of"),
    (["x"], "model must be a string"),
    ("/etc", "model must be one of"),
])
def test_a_bad_model_is_a_readable_error(model, needle):
    with pytest.raises(gr.Error) as error:
        api.generate(model=model)
    assert needle in error.value.message and "Traceback" not in error.value.message
    with pytest.raises(gr.Error) as error:
        list(generation.on_generate(*controls(model=model), progress=no_progress))
    assert needle in error.value.message


def test_a_model_that_cannot_load_is_a_notice_and_the_selection_goes_back(broken_dir):
    with pytest.warns(UserWarning, match="could not load model"):
        outputs = settings.on_model(str(broken_dir), models.DEFAULT, False, progress=no_progress)
    named = dict(zip(settings.MODEL_OUTPUTS, outputs))
    assert named["model"]["value"] == models.DEFAULT and named["model_state"] == models.DEFAULT
    with pytest.raises(gr.Error) as error:
        api.generate(model=str(broken_dir))
    assert "could not load model" in error.value.message and "missing.pt" in error.value.message


def test_reset_keeps_the_model_and_takes_its_defaults(model_dir):  # noqa: F811
    STATE.models.get(str(model_dir))
    names = [name for name in session.value_names() if name not in session.CONDITION]
    values = dict(zip(names, settings.on_reset(str(model_dir))))
    assert values["cfg_scale"] == 3.0 and values["method"] == DEFAULT_METHOD
    assert dict(zip(names, settings.on_reset(models.DEFAULT)))["class_name"] == "Trouser"


# A preset that must download: one short probe of the hub, a remembered failure, and its own queue ---------
def closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that takes connections and never answers, as a hub behind a black hole does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def answering_port():
    """A port where an HTTP server answers every request (404): the hub is there."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class HubClient:
    """Stands in for huggingface_hub's download: it would retry for half a minute before giving up."""

    def __init__(self, seconds: float = 6.0) -> None:
        self.seconds, self.calls = seconds, 0

    def __call__(self, key):
        self.calls += 1
        time.sleep(self.seconds)
        raise FileNotFoundError(f"{key}: no network")


@pytest.fixture
def downloads(monkeypatch):
    """Not offline, nothing cached: every preset must download first; the probes are counted."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    probes = []
    real = models.hub_reachable

    def counted(timeout=models.PROBE_SECONDS):
        probes.append(timeout)
        return real(timeout)

    monkeypatch.setattr(models, "hub_reachable", counted)
    return probes


@pytest.mark.parametrize("where, probe_seconds", [("closed", 2.5), ("silent", 1.0)])
def test_an_unreachable_hub_fails_in_seconds_says_what_to_do_and_is_remembered(where, probe_seconds, downloads,
                                                                               silent_port, monkeypatch):
    """A closed local port, and one that never answers (with a short probe): the choice is refused within the
    probe's timeout, the download (and its retries) never starts, and a second choice answers at once,
    without a new probe."""
    port = closed_port() if where == "closed" else silent_port
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(models, "PROBE_SECONDS", probe_seconds)
    hub = HubClient()
    store = models.Models(STATE.bundle, hub)
    preset = preset_names()[0]
    started = time.perf_counter()
    with pytest.raises(ValueError) as error:
        store.get(preset)
    assert time.perf_counter() - started < probe_seconds + 2  # a timeout, not a benchmark
    message = str(error.value)
    assert f"could not load model {preset}" in message and "cannot be reached from this machine" in message
    assert "HF_HUB_OFFLINE=1" in message and "download them where there is a network" in message
    assert f"127.0.0.1:{port}" in message and hub.calls == 0 and len(downloads) == 1
    started = time.perf_counter()
    with pytest.raises(ValueError, match="remembered from a try"):
        store.get(preset)
    assert time.perf_counter() - started < 0.5 and len(downloads) == 1 and hub.calls == 0
    monkeypatch.setattr(models, "FAILURE_SECONDS", 0.0)  # once forgotten, the next choice probes again
    with pytest.raises(ValueError, match="cannot be reached"):
        store.get(preset)
    assert len(downloads) == 2


def test_a_reachable_hub_downloads_and_a_failed_download_is_remembered(downloads, answering_port, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{answering_port}")
    hub = HubClient(seconds=0.0)
    store = models.Models(STATE.bundle, hub)
    preset = preset_names()[0]
    with pytest.raises(ValueError, match="no network"):
        store.get(preset)
    assert hub.calls == 1 and len(downloads) == 1
    with pytest.raises(ValueError, match="remembered"):
        store.get(preset)
    assert hub.calls == 1
    store = models.Models(STATE.bundle, lambda key: STATE.bundle)
    assert store.get(preset) is STATE.bundle and not store.failed


def test_a_local_model_loads_without_probing_the_hub(model_dir, downloads):  # noqa: F811
    store = models.Models(STATE.bundle, lambda key: STATE.bundle)
    assert store.get(str(model_dir)) is STATE.bundle and downloads == []


def test_the_ui_loads_models_in_their_own_queue_and_generate_never_loads_one():
    events = {fn.api_name: fn for fn in DEMO.fns.values()}
    assert events["on_model"].concurrency_id != events["on_generate"].concurrency_id
    assert events["on_timing"].concurrency_id == events["on_generate"].concurrency_id == "generate"
    with pytest.raises(gr.Error, match="is not loaded yet"):
        generation.on_check(*controls(model=str(next(key for key in (c.key for c in STATE.models.choices())
                                                  if key not in STATE.models.loaded))))


def test_a_generation_is_not_delayed_by_slow_model_loads(broken_dir, monkeypatch):
    """The real app and queue: two visitors choose a model whose load takes 8 s; a third one's generation,
    sent meanwhile, comes back without waiting for them."""
    from app_process import free_port
    from test_browser import GOOD, api_call, ui_call

    monkeypatch.setattr(STATE.models, "loader", HubClient(seconds=8.0))
    port = free_port()
    demo = layout.build_demo()  # its selector lists COOLSD_MODELS as set now
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        server = type("Server", (), {"url": f"http://127.0.0.1:{port}/"})
        fn = {d["api_name"]: d["id"] for d in demo.config["dependencies"]}
        with ThreadPoolExecutor(max_workers=2) as pool:
            loads = [pool.submit(ui_call, server, f"loader{i}", fn["on_model"],
                                 [str(broken_dir), None, False, None, None]) for i in range(2)]
            time.sleep(1.0)  # both loads are under way
            started = time.perf_counter()
            answer = api_call(server, "generate", GOOD)
            waited = time.perf_counter() - started
            assert all(not load.done() for load in loads)
            for load in loads:
                load.result(timeout=60)
        assert answer[0]["method"]["tokens"] and waited < 5, waited
    finally:
        demo.close()


# A model without a draft model (Lumina-mGPT ships none): Jacobi windows, and every method on them -------------
NO_DRAFTER = "no-drafter"


@pytest.fixture
def no_drafter():
    """A tiny class model (16 tokens per image) without a draft model, chosen in the selector."""
    bundle = replace(random_bundle("tiny"), drafter=None, drafters={}, name=NO_DRAFTER)
    STATE.models.loaded[NO_DRAFTER] = bundle
    yield bundle
    del STATE.models.loaded[NO_DRAFTER]


def test_a_model_without_a_draft_model_starts_on_a_jacobi_window(no_drafter):
    """Lumina-mGPT (48 x 48 tokens) starts on SCD's jacobi:32:coupled; a model of 16 tokens on the widest
    coupled window its images leave room for; a model with a draft model on chain:5."""
    lumina = read_spec(PRESETS / "lumina-mgpt-7b-768.json")
    assert "drafter" not in lumina
    tokens = (lumina["image_size"] // 16) ** 2
    assert session.default_draft(SimpleNamespace(drafter=None, config=SimpleNamespace(image_tokens=tokens))) == \
        "jacobi:32:coupled"
    assert session.default_draft(no_drafter) == "jacobi:8:coupled" and session.default_draft(STATE.bundle) == "chain:5"
    assert inputs.defaults(no_drafter)["draft"] == "jacobi:8:coupled"
    names = [name for name in session.value_names() if name not in session.CONDITION]
    assert dict(zip(names, settings.on_reset(NO_DRAFTER)))["draft"] == "jacobi:8:coupled"
    chosen = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(NO_DRAFTER, models.DEFAULT, False, "tree:eagle25",
                                                      progress=no_progress)))
    assert chosen["draft"] == "jacobi:8:coupled" and chosen["model_state"] == NO_DRAFTER
    kept = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(NO_DRAFTER, models.DEFAULT, False, "jacobi:8",
                                                    progress=no_progress)))
    assert kept["draft"] == gr.skip()  # a window that fits stays the user's
    back = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(models.DEFAULT, NO_DRAFTER, False, "jacobi:8:coupled",
                                                    progress=no_progress)))
    assert back["draft"] == gr.skip()  # and runs on the shipped model too
    events = {fn.api_name: fn for fn in DEMO.fns.values()}
    draft = DEMO.named["draft"]
    assert draft in events["on_model"].inputs and draft in events["on_model"].outputs


def test_every_method_runs_on_a_model_without_a_draft_model(no_drafter):
    start = inputs.defaults(no_drafter)
    for method in session.method_entries():
        values = controls(method=method, model=NO_DRAFTER, draft=start["draft"], class_name=no_drafter.class_names[0])
        result = last(generation.on_generate(*values, progress=no_progress))[5]
        assert result.method.stats.tokens == 16 and result.method.stats.drafter_forwards == 0, method
        assert result.eagle.stats.draft == "jacobi:8:coupled"
    answer = api.generate(method="COOL-SD", model=NO_DRAFTER, class_name=no_drafter.class_names[0])
    assert answer["method"]["stats"]["draft"] == "jacobi:8:coupled"  # the API's default draft follows the model


@pytest.mark.parametrize("method, draft, needle", [
    ("COOL-SD", "chain:4", "draft chain:4 needs a draft model, and no-drafter has none: choose a Jacobi window"),
    ("AR (no drafting)", "tree:eagle25", "draft tree:eagle25 needs a draft model"),  # the Eagle-1 image drafts
    ("Eagle-1 (lossless)", "jacobi:16", "draft jacobi:16 is deeper than this model can use"),
])
def test_a_draft_the_model_cannot_run_is_one_readable_line(no_drafter, method, draft, needle):
    values = controls(method=method, model=NO_DRAFTER, draft=draft, class_name=no_drafter.class_names[0])
    for call in (lambda: generation.on_check(*values), lambda: list(generation.on_generate(*values, progress=no_progress)),
                 lambda: api.generate(method=method, draft=draft, model=NO_DRAFTER,
                                          class_name=no_drafter.class_names[0])):
        with pytest.raises(gr.Error) as error:
            call()
        message = error.value.message
        assert needle in message and "\n" not in message and "Traceback" not in message
    assert "e.g. jacobi:8:coupled" in message or "e.g. jacobi:14" in message


def test_a_broken_or_missing_local_model_is_listed_or_left_out_with_one_log_line_each(tmp_path, monkeypatch, caplog):
    """A COOLSD_MODELS directory whose model.json is valid JSON but no object (it once stopped the app from
    starting) is listed by its folder's name; a missing directory is left out; each is logged once."""
    not_an_object = tmp_path / "list"
    not_an_object.mkdir()
    (not_an_object / "model.json").write_text("[1, 2, 3]")
    monkeypatch.setenv(models.ENV, os.pathsep.join([str(not_an_object), str(tmp_path / "gone")]))
    monkeypatch.setattr(models, "WARNED", {})
    with caplog.at_level("WARNING", logger="coolsd.app"):
        for _ in range(3):
            keys = [choice.key for choice in models.listing("fashion")]
    assert keys == [models.DEFAULT, str(not_an_object)]
    lines = sorted(record.getMessage() for record in caplog.records)
    assert len(lines) == 2
    assert "gone: left out: no such directory" in lines[0] and "cannot load" in lines[1] and "got list" in lines[1]


def test_presets_are_off_on_a_shared_space_unless_the_deployment_turns_them_on(monkeypatch):
    """A preset is a real model of gigabytes: on a Hugging Face Space (SPACE_ID set) no visitor may start loading
    one unless COOLSD_PRESETS is on; COOLSD_PRESETS off hides them anywhere. Hidden, a preset is no valid model
    for the UI or the API either."""
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: True)

    def listed() -> list[str]:
        return [choice.key for choice in STATE.models.choices() if choice.key in preset_names()]

    monkeypatch.delenv(models.PRESETS_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert listed() == preset_names()
    monkeypatch.setenv("SPACE_ID", "someone/coolsd")
    assert listed() == []
    with pytest.raises(ValueError, match="model must be one of"):
        STATE.models.key(preset_names()[0])
    monkeypatch.setenv(models.PRESETS_ENV, "on")
    assert listed() == preset_names()
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv(models.PRESETS_ENV, "off")
    assert listed() == []


def test_a_model_without_a_draft_model_has_no_drafter_to_choose(no_drafter):
    """Its drafter selector offers nothing and hides; its requests name no drafter (a Jacobi window drafts with
    none), whether the control is empty or still holds the default; a drafter it lacks is one readable line."""
    assert inputs.defaults(no_drafter)["drafter"] is None
    update = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(NO_DRAFTER, models.DEFAULT, False, "chain:5", "eagle1",
                                                                progress=no_progress)))["drafter"]
    assert update["choices"] == [] and update["value"] is None and update["visible"] is False
    name = no_drafter.class_names[0]
    for drafter in (None, "eagle1"):
        request = session.parse_controls(no_drafter, controls(model=NO_DRAFTER, draft="jacobi:8:coupled",
                                                              class_name=name, drafter=drafter))
        assert request.drafter == ""
    answer = api.generate(model=NO_DRAFTER, class_name=name, seed=1)
    assert answer["method"]["stats"]["drafter"] is None and answer["eagle"]["stats"]["drafter"] is None
    with pytest.raises(gr.Error) as error:
        api.generate(model=NO_DRAFTER, class_name=name, drafter="EAGLE-3")
    assert "no-drafter has no EAGLE-3 drafter (eagle3); it has: none" in error.value.message
    assert "\n" not in error.value.message
