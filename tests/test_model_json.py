"""A whole LlamaGen text-to-image stack as a ``model.json`` directory (tiny random weights in the official
formats: GPT ``.pt``, VQ-16 ``.pt``, LANTERN drafter directory, T5 directory) through ``load_bundle`` and both
command lines, offline. Also the shipped presets: readable without weights, and a clear error when offline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_lantern import random_weights, write_lantern_dir
from test_llamagen import random_model
from test_text import save_tokenizer, vocab
from test_vq16 import tiny_model

from coolsd.cli import bench, generate
from coolsd.models.bundle import load_bundle
from coolsd.models.registry import model_config, preset_names, read_spec

# Matches test_lantern's tiny drafter: 16 codes on a 4x4 grid, width 32, 8 caption slots of 12-d features.
GPT_ARGS = {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": 16, "cls_token_num": 8, "caption_dim": 12,
            "block_size": 16, "model_type": "t2i", "multiple_of": 16}
VQ_ARGS = {"codebook_size": 16, "codebook_embed_dim": 8, "decoder_ch_mult": [1, 2], "z_channels": 32, "ch": 32}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny_llamagen"))


def write_model_dir(root: Path) -> Path:
    """A tiny text-to-image model.json directory in LlamaGen's formats, with LANTERN's drafter and a T5."""
    from transformers import T5Config, T5EncoderModel

    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": random_model(GPT_ARGS).state_dict()}, root / "t2i_tiny.pt")
    torch.save({"model": tiny_model(codebook_size=16).state_dict()}, root / "vq_tiny.pt")
    write_lantern_dir(root / "drafter", random_weights())
    torch.manual_seed(0)
    t5 = T5Config(vocab_size=len(vocab()), d_model=12, d_kv=6, d_ff=24, num_layers=1, num_heads=2, pad_token_id=0,
                  eos_token_id=1, decoder_start_token_id=0)
    T5EncoderModel(t5).eval().save_pretrained(root / "t5")
    save_tokenizer(root / "t5")
    spec = {"family": "llamagen", "name": "tiny text-to-image", "gpt": "t2i_tiny.pt", "vq": "vq_tiny.pt",
            "drafter": "drafter", "t5": "t5", "model_args": GPT_ARGS, "vq_args": VQ_ARGS,
            "sampling": {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}}
    (root / "model.json").write_text(json.dumps(spec))
    return root


def test_the_directory_loads_as_one_bundle(model_dir):
    bundle = load_bundle(model_dir, device="cpu")
    assert bundle.config.text_conditioned and bundle.config.prefix_length == 8
    assert type(bundle.drafter).__name__ == "LanternDrafter" and bundle.text_encoder is not None
    assert bundle.codebook.shape == (16, 8) and bundle.neighbours(3).shape == (16, 3)
    caption = bundle.text_encoder(["a red cat on the grass"])[0]
    assert caption.features.shape == (8, 12) and caption.valid.sum() == 7  # 6 words + end of sequence
    assert bundle.image(list(range(16))).shape == (8, 8, 3)


def test_generate_with_a_prompt_writes_the_image_and_stats(model_dir, tmp_path, capsys):
    out, stats = tmp_path / "cat.png", tmp_path / "stats.json"
    assert generate.main(["--model", str(model_dir), "--prompt", "a blue dog in front of the house", "--method",
                          "cool", "--draft", "tree:eagle25", "--device", "cpu", "--out", str(out), "--stats",
                          str(stats)]) == 0
    record = json.loads(stats.read_text())
    assert record["condition"]["caption"] == "a blue dog in front of the house" and record["class_id"] is None
    assert record["tokens"] == 16 and Image.open(out).size == (64, 64)  # 8 px, enlarged 8x below 128 px


def test_greedy_eagle_equals_greedy_ar_through_the_command_line(model_dir, tmp_path):
    tokens = {}
    for method in ("ar", "eagle"):
        stats = tmp_path / f"{method}.json"
        assert generate.main(["--model", str(model_dir), "--prompt", "a photo of a cat", "--method", method,
                              "--top-k", "1", "--device", "cpu", "--stats", str(stats)]) == 0
        record = json.loads(stats.read_text())
        tokens[method] = [t for r in record["rounds"] for t in r["emitted"]]
    assert tokens["ar"] == tokens["eagle"]


def test_bench_runs_a_text_model_on_the_example_prompts(model_dir, tmp_path):
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(model_dir), "--methods", "eagle", "--images", "2", "--warmup", "0",
                       "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    assert [run["method"] for run in json.loads(out.read_text())["runs"]] == ["ar", "eagle"]


@pytest.mark.parametrize("argv, needle", [
    (["--class", "3"], "give --prompt, not --class"),
    ([], "give --prompt"),
])
def test_a_text_model_refuses_a_class(model_dir, argv, needle, capsys):
    assert generate.main(["--model", str(model_dir), *argv]) == 2
    assert needle in capsys.readouterr().err



def test_the_command_line_refuses_the_over_long_prompt_the_app_refuses(model_dir, capsys, monkeypatch):
    """One limit for both: 1,000 characters (the app's prompt box), checked before any model loads."""
    from coolsd.app import session

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the prompt was checked")

    monkeypatch.setattr(generate, "load_model", no_model)
    assert generate.main(["--model", str(model_dir), "--prompt", "a" * 10_000, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: prompt ") and "Traceback" not in err, err
    assert "1000" in err and "10000" in err
    with pytest.raises(ValueError) as app_error:
        session.check_prompt("a" * 10_000)
    assert err == f"error: {app_error.value}\n"

    def cli_condition(prompt: str):
        argv = ["--model", str(model_dir), "--prompt", prompt, "--device", "cpu"]
        return generate.check_args(generate.build_parser().parse_args(argv)).condition

    at_limit, over = "b" * 1000, "b" * 1001
    assert session.check_prompt(at_limit) == at_limit and cli_condition(at_limit) == at_limit
    for check in (session.check_prompt, cli_condition):
        with pytest.raises(ValueError, match="at most 1000 characters"):
            check(over)


def test_presets_are_read_without_weights_and_fail_clearly_offline(monkeypatch, capsys):
    names = preset_names()
    assert {"llamagen-t2i-xl", "llamagen-c2i-b", "llamagen-c2i-l", "llamagen-c2i-xl"} <= set(names)
    configs = {name: model_config(read_spec(Path("assets/models") / f"{name}.json")) for name in names}
    assert configs["llamagen-t2i-xl"].prefix_length == 120 and configs["llamagen-t2i-xl"].image_tokens == 256
    assert configs["llamagen-c2i-xl"].image_tokens == 576 and not configs["llamagen-c2i-xl"].text_conditioned
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert generate.main(["--model", "llamagen-c2i-b", "--class", "goldfish, Carassius auratus"]) == 2
    assert "not in the local Hugging Face cache" in capsys.readouterr().err
    assert generate.main(["--model", "llamagen-c2i-b", "--class", "1001"]) == 2
    assert "class must be an index 0 to 999" in capsys.readouterr().err


def test_imagenet_names_ship_with_the_presets():
    names = json.loads(Path("assets/models/imagenet_classes.json").read_text())
    assert len(names) == 1000 and names[1] == "goldfish, Carassius auratus" and names[999].startswith("toilet tissue")
    assert np.all([isinstance(name, str) and name for name in names])


@pytest.mark.parametrize("text, says", [("[1, 2, 3]", "got list"), ('"a string"', "got str"), ("null", "got NoneType"),
                                        (('{"family": "llamagen", "gpt": "g.pt", "vq": "v.pt", "model_args": '
                                          '"notadict", "vq_args": {}}'), "'model_args' must be a JSON object")])
def test_a_model_file_that_is_valid_json_but_not_an_object_of_fields_is_one_clear_error(tmp_path, text, says):
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(ValueError, match=says) as error:
        read_spec(tmp_path / "model.json")
    assert "\n" not in str(error.value)
