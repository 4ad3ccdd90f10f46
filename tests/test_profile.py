"""``coolsd.bench --profile``: every part of a round is timed, and the implied speed-ups follow from the parts by
the cost model (checked by recomputing them here; no timing is asserted)."""

import json

import pytest
import torch
from helpers import plant_host_read

from coolsd.cli import bench
from coolsd.models.bundle import random_bundle

PARTS = ["ar_step"] + [f"{part} {spec}" for spec in ("chain:5", "tree:eagle25", "tree:wide57")
                       for part in ("verify", "acceptance", "drafting", "round")] + ["drafter_level", "image_decode"]


def test_profile_reports_every_part_and_the_speedups_they_imply(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert bench.main(["--profile", "--random-init", "tiny", "--device", "cpu", "--threads", "1", "--images", "2",
                       "--repeats", "3", "--no-progress", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["parts"]) == PARTS
    for part in result["parts"].values():
        low, high = part["iqr_s"]
        assert 0 < low <= part["median_s"] <= high and part["repeats"] >= 3
    seconds = {name: part["median_s"] for name, part in result["parts"].items()}
    for spec in ("chain:5", "tree:eagle25", "tree:wide57"):  # the implied speed-ups use the round timed whole
        round_s = seconds[f"round {spec}"]
        row = result["implied"][spec]
        assert abs(row["round_over_ar_step"] - round_s / seconds["ar_step"]) < 1e-9
        assert abs(row["at tau 3.34 (COOL-SD delta=2)"] - 3.34 * seconds["ar_step"] / round_s) < 1e-9
    # the weight matmuls each part makes, counted from the architecture: every Linear once per forward
    tiny = random_bundle("tiny", device="cpu")
    target_linears = sum(isinstance(m, torch.nn.Linear) for m in tiny.target.modules())
    drafter_linears = sum(isinstance(m, torch.nn.Linear) for m in tiny.drafter.modules())
    assert target_linears == 5 * tiny.config.n_layer + 1 and drafter_linears == 6
    calls = {name: part["matmul_calls"] for name, part in result["parts"].items()}
    assert calls["ar_step"] == calls["verify chain:5"] == calls["verify tree:wide57"] == target_linears
    # chain:5: a catch-up forward and 4 level forwards of the drafter, and 5 draft heads (the target's output)
    assert calls["drafting chain:5"] == 5 * drafter_linears + 5 and calls["acceptance chain:5"] == 0
    assert calls["round chain:5"] == calls["drafting chain:5"] + calls["verify chain:5"]
    for part in result["parts"].values():
        assert part["matmul_s"] >= 0
    assert result["parts"]["drafting chain:5"]["matmul_s"] > 0
    matmul = {name: part["matmul_s"] for name, part in result["parts"].items()}
    for spec in ("chain:5", "tree:eagle25", "tree:wide57"):
        row = result["ceiling"][spec]
        round_s = seconds[f"verify {spec}"] + matmul[f"drafting {spec}"] + seconds[f"acceptance {spec}"]
        assert abs(row["round_over_ar_step"] - round_s / seconds["ar_step"]) < 1e-9
        assert abs(row["at tau 2.42 (Eagle-1)"] - 2.42 * seconds["ar_step"] / round_s) < 1e-9
        fused = matmul[f"verify {spec}"] + matmul[f"drafting {spec}"] + matmul[f"acceptance {spec}"]
        assert abs(row["matmuls_only_round_over_ar_step"] - fused / matmul["ar_step"]) < 1e-9
    measured = result["measured"]
    assert set(measured) == {"AR", "Eagle-1 chain:5", "COOL-SD delta=2 chain:5"} and measured["AR"]["tau"] == 1.0
    assert measured["Eagle-1 chain:5"]["tau"] > 1.0
    printed = capsys.readouterr().out
    assert "implied at tau 2.42" in printed and "whole images (measured)" in printed and "Ceiling" in printed


def test_matmul_seconds_replays_exactly_the_linear_calls_of_a_step():
    """Direct calls and Linear modules are both recorded; other operations are not, and the step runs once."""
    from coolsd.cli.profile import matmul_seconds

    layer, x, ran = torch.nn.Linear(8, 4), torch.randn(2, 8), []

    def step():
        ran.append(1)
        hidden = torch.nn.functional.linear(x, torch.ones(4, 8)).relu()
        return layer(torch.cat([hidden, hidden], dim=-1)) @ torch.ones(4, 3) + layer.bias.sum()

    result = matmul_seconds(step, repeats=3)
    assert result["matmul_calls"] == 2 and result["matmul_s"] > 0 and len(ran) == 1



def test_operation_count_counts_every_dispatched_operation_once():
    """Three arithmetic operations and a view are four ATen operations; a matrix product through ``Linear`` is one
    more (``linear`` dispatches as itself or its decomposition, counted as the dispatcher sees it)."""
    from coolsd.cli.profile import operation_count

    x = torch.randn(4, 3)
    assert operation_count(lambda: ((x + 1) * 2 - 3).view(12)) == 4
    assert operation_count(lambda: None) == 0
    with torch.inference_mode():
        layer = torch.nn.Linear(3, 2, bias=False)
        assert operation_count(lambda: layer(x)) == operation_count(lambda: torch.nn.functional.linear(x, layer.weight))

def test_random_init_offers_llamagen_shapes_read_without_weights():
    """``--random-init`` at the paper's shapes (for ``--profile``): the text XL shape is LlamaGen's stage I model
    and is checked before any weight is built."""
    from coolsd.cli.common import model_info
    from coolsd.models.config import CONFIGS, RANDOM_INIT_SIZES
    from coolsd.models.llamagen import LLAMAGEN_ARGS, config_from_args

    assert {"llamagen-b", "llamagen-t2i-xl"} <= set(RANDOM_INIT_SIZES)
    assert CONFIGS["llamagen-t2i-xl"] == config_from_args(LLAMAGEN_ARGS["t2i-xl-stage1-256"])
    assert CONFIGS["llamagen-b"] == config_from_args(LLAMAGEN_ARGS["c2i-b-256"])
    info = model_info(None, "llamagen-t2i-xl")
    assert info.config.prefix_length == 120 and info.config.image_tokens == 256


def test_profile_of_a_text_shaped_model_measures_whole_images(tmp_path, monkeypatch):
    """A text-conditioned target (random weights, random captions) goes through every part and whole images."""
    from coolsd.cli import profile
    from coolsd.core.sampling import SamplingConfig
    from coolsd.models.bundle import Bundle
    from coolsd.models.config import ModelConfig
    from coolsd.models.eagle import Drafter
    from coolsd.models.gpt import Transformer

    config = ModelConfig(vocab_size=16, dim=32, n_layer=1, n_head=2, grid_height=4, grid_width=4, multiple_of=16,
                         cls_token_num=6, caption_dim=12)
    bundle = Bundle(Transformer(config).eval(), Drafter(config).eval(), torch.randn(16, 8))
    result = profile.profile(bundle, SamplingConfig(cfg_scale=2.0), repeats=2, warmup=1, images=1)
    assert list(result["parts"]) == PARTS and result["measured"]["AR"]["tau"] == 1.0


READS_PER_AR_IMAGE = 3


def test_structure_counts_what_a_round_costs_the_host(monkeypatch):
    """The structural figures (no timing): rounds run as phases with no host read inside, the few operations and
    reads between them counted; a planted ``.item()`` inside verification is refused and counted."""
    from coolsd.cli.profile import structure
    from coolsd.core.graphs import HostReadError
    from coolsd.core.rules import AR, Eagle

    tiny = random_bundle("tiny", device="cpu")
    images = tiny.config.image_tokens
    ar = structure(tiny, tiny.sampling, "chain:5", AR(), 3)
    assert ar["rounds"] == images - 1 and ar["phase_runs_per_round"] == 1 and ar["host_reads_in_rounds"] == 0
    # AR knows every round is needed: one look at the image's length, then the records and the tokens (the
    # prefill's first token is drawn on the device too)
    assert ar["host_reads_per_image"] == READS_PER_AR_IMAGE, ar
    eagle = structure(tiny, tiny.sampling, "chain:5", Eagle(), 3)
    assert eagle["host_reads_in_rounds"] == 0 and 1 < eagle["phase_runs_per_round"] <= 2
    # reads: the records and the tokens, and one look at the length per batch of rounds known to be needed
    assert READS_PER_AR_IMAGE <= eagle["host_reads_per_image"] <= 2 + eagle["rounds"]
    plant_host_read(monkeypatch)
    counted = {}
    real = structure.__globals__["CountedPhases"]

    class Keep(real):
        def __init__(self, *args):
            super().__init__(*args)
            counted["runner"] = self

    monkeypatch.setattr("coolsd.cli.profile.CountedPhases", Keep)
    with pytest.raises(HostReadError, match="item"):
        structure(tiny, tiny.sampling, "chain:5", Eagle(), 3)
    assert counted["runner"].phase_reads == 1
