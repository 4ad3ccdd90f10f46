"""The two command-line contracts: coolsd.generate and coolsd.bench (on random-init models)."""

import json
import math
import tracemalloc

import numpy as np
import pytest
import torch
from helpers import count_generations
from PIL import Image

from coolsd.cli import bench, generate, passes, summaries
from coolsd.cli.methods import parse_method
from coolsd.core.rules import schema
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import random_bundle

TINY = ["--random-init", "tiny"]


def test_generate_writes_image_and_stats(tmp_path):
    out, stats_path = tmp_path / "img.png", tmp_path / "stats.json"
    code = generate.main(["--method", "cool", "--delta", "2", "--nu", "0.7", "--mu", "auto", "--class", "3",
                          "--seed", "0", "--out", str(out), "--stats", str(stats_path), "--random-init", "tiny",
                          "--scale", "4"])
    assert code == 0
    image = Image.open(out)
    assert image.size == (16, 16)  # 4x4 grid, enlarged 4x
    stats = json.loads(stats_path.read_text())
    assert stats["method"] == "cool" and stats["params"]["delta"] == 2.0 and stats["class_id"] == 3
    assert stats["tokens"] == 16 and sum(a + 1 for a in stats["accepted_per_round"]) == 16
    assert stats["target_forwards"] == len(stats["accepted_per_round"])
    assert math.isclose(stats["tau"], 16 / stats["target_forwards"])
    depth = stats["per_depth"]
    assert depth["depth"] == [1, 2, 3, 4, 5] and len(depth["omega"]) == 5
    assert abs(np.mean(depth["omega"]) - 2.0) < 1e-12  # mu="auto"
    detail = stats["tokens_detail"]
    assert detail["origin"][0] == "first" and len(detail["origin"]) == 16
    assert set(detail["origin"]) <= {"first", "draft", "resampled", "bonus", "target"}
    for origin, d, prob in zip(detail["origin"], detail["depth"], detail["accept_prob"]):
        assert (origin == "draft") == (d > 0) == (prob is not None)
    assert set(stats["seconds"]) >= {"drafting", "target_forward", "acceptance", "other", "total"}
    assert stats["relaxation_cost"] >= 0



def test_generate_without_out_says_the_image_was_not_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert generate.main(["--method", "eagle", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "no --out given: the image was not written (add --out img.png to write it)" in printed
    assert list(tmp_path.iterdir()) == []  # nothing written behind the user's back
    assert generate.main(["--method", "eagle", "--out", str(tmp_path / "img.png"), *TINY]) == 0
    assert "--out" not in capsys.readouterr().out and (tmp_path / "img.png").is_file()


def test_uniform_without_delta_runs_the_documented_default(tmp_path):
    """README's parameter table: delta defaults to 2 for UniformRSD as for COOL-SD (1 would be lossless Eagle-1),
    in generate (on the shipped model) and in bench's method specs alike."""
    stats_path = tmp_path / "stats.json"
    assert generate.main(["--method", "uniform", "--device", "cpu", "--stats", str(stats_path)]) == 0
    stats = json.loads(stats_path.read_text())
    assert stats["params"] == {"delta": 2.0} and stats["relaxation_cost"] > 0
    out = tmp_path / "r.json"
    assert bench.main(["--methods", "uniform", "--images", "1", "--warmup", "0", *TINY, "--out", str(out),
                       "--no-progress"]) == 0
    run = next(r for r in json.loads(out.read_text())["runs"] if r["method"] == "uniform")
    assert run["params"] == {} and run["rule_params"] == {"delta": 2.0} and run["relaxation_cost_mean"] > 0

def test_generate_rejects_bad_input(tmp_path, capsys):
    assert generate.main(["--method", "uniform", "--delta", "-1", "--random-init", "tiny"]) == 2
    assert "delta" in capsys.readouterr().err
    assert generate.main(["--method", "lantern", "--delta", "2", "--random-init", "tiny"]) == 2
    assert "delta" in capsys.readouterr().err
    assert generate.main(["--method", "eagle", "--draft", "tree:nope", "--random-init", "tiny"]) == 2
    assert "tree" in capsys.readouterr().err
    assert generate.main(["--method", "eagle", "--class", "99", "--random-init", "tiny"]) == 2
    assert "class" in capsys.readouterr().err


def test_bench_runs_every_method(tmp_path):
    out = tmp_path / "results.json"
    code = bench.main(["--methods", "ar", "eagle", "cool:delta=2", "uniform:delta=2",
                       "lantern:k=10,lambda=5,residual=gstar", "lantern:k=3,lambda=2,residual=lantern",
                       "--images", "2", "--warmup", "1", "--random-init", "tiny", "--out", str(out), "--no-progress"])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["method"] for r in runs] == ["ar", "eagle", "cool", "uniform", "lantern", "lantern"]
    for run in runs:
        for key in ("method", "params", "tau", "target_forwards_per_image", "latency_median_s", "speedup_vs_ar",
                    "acceptance_vs_target_forward"):
            assert key in run
    assert runs[0]["tau"] == 1.0 and runs[0]["speedup_vs_ar"] == 1.0
    assert runs[0]["target_forwards_per_image"] == 16
    assert runs[1]["target_forwards_per_image"] < 16
    # the target's log-likelihood of the images: image i is class i mod C with seed i, recomputed here
    from coolsd.core.decode import generate
    from coolsd.core.likelihood import mean_log_likelihood
    from coolsd.core.rules import AR
    from coolsd.models.bundle import random_bundle
    model = random_bundle("tiny", device="cpu")
    want = np.mean([mean_log_likelihood(model.target, i % 10, generate(model, i % 10, AR(), seed=i).tokens,
                                        model.sampling) for i in range(2)])
    assert runs[0]["log_likelihood_per_token"] == pytest.approx(want, abs=1e-6)
    assert all(-np.log(model.config.vocab_size) * 3 < r["log_likelihood_per_token"] < 0 for r in runs)
    # paired differences from Eagle-1 with bootstrap intervals: zero for Eagle-1 itself, the plain difference
    # of the means for every method, inside its interval
    assert all(runs[1]["vs_eagle"][k]["low"] == runs[1]["vs_eagle"][k]["high"] == 0 for k in runs[1]["vs_eagle"])
    for run in runs:
        for key in ("tau", "log_likelihood_per_token"):
            diff = run["vs_eagle"][key]
            assert diff["value"] == pytest.approx(run[key] - runs[1][key], abs=1e-12)
            assert diff["low"] <= diff["value"] <= diff["high"] and diff["level"] == 0.95
        speedup = run["vs_eagle"]["speedup_vs_ar"]
        assert speedup["value"] == pytest.approx(run["speedup_vs_ar"] - runs[1]["speedup_vs_ar"], abs=1e-12)


def test_bench_adds_ar_and_rejects_bad_specs(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench.main(["--methods", "eagle", "--images", "1", "--warmup", "0", "--random-init", "tiny",
                       "--out", str(out), "--no-progress"]) == 0
    assert [r["method"] for r in json.loads(out.read_text())["runs"]] == ["ar", "eagle"]
    assert bench.main(["--methods", "cool:delta", "--images", "1", "--random-init", "tiny", "--no-progress"]) == 2
    assert "key=value" in capsys.readouterr().err
    assert bench.main(["--methods", "cool:delta=-2", "--images", "1", "--random-init", "tiny", "--no-progress"]) == 2
    assert "delta" in capsys.readouterr().err


def test_parse_method():
    assert parse_method("lantern:k=10,lambda=5,residual=gstar") == ("lantern", {"k": 10, "lambda": 5,
                                                                                "residual": "gstar"})
    assert parse_method("cool:delta=2,mu=auto") == ("cool", {"delta": 2, "mu": "auto"})


def check(name: str, value):
    """The one definition's verdict on a value: coolsd.core.params, or the rule registry's schema."""
    return schema(name).check(value)


def one_line_error(capsys) -> str:
    """The command's stderr, which must be exactly one ``error: ...`` line (never a traceback)."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_draft_deeper_than_the_model_can_use_is_refused_before_it_is_built(capsys):
    # a tiny image has 16 tokens: the prefill gives the first, and a round ends with one of the target's
    assert generate.main(["--method", "eagle", "--draft", "chain:15", *TINY]) == 2
    assert "at most 14 drafted positions" in one_line_error(capsys)
    assert generate.main(["--method", "eagle", "--draft", "chain:14", *TINY]) == 0
    capsys.readouterr()
    assert bench.main(["--methods", "eagle", "--draft", "chain:20000", "--images", "1", *TINY, "--no-progress"]) == 2
    assert "at most 14 drafted positions" in one_line_error(capsys)
    with pytest.raises(ValueError, match="deeper than this model can use"):
        parse_draft("tree:eagle25", max_depth=4)
    assert parse_draft("tree:eagle25", max_depth=5).depth == 5
    tracemalloc.start()
    for spec in ("chain:5000", "chain:" + "9" * 30, "chain:" + "9" * 5000):  # no model bound: an absolute one
        with pytest.raises(ValueError, match="draft"):
            parse_draft(spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # nothing was built


def no_model(*args, **kwargs):
    raise AssertionError("the model was loaded before the options were checked")


@pytest.mark.parametrize("argv", [
    ["--out", "{tmp}/missing/a.png"], ["--out", "{tmp}"], ["--out", "{tmp}/a.xyz"], ["--stats", "{tmp}/missing/s.json"],
    ["--stats", "{tmp}"], ["--scale", "0"], ["--scale", "x"], ["--threads", "-1"], ["--threads", "0"],
    ["--device", "cuda"], ["--device", "cuda:0"], ["--device", "foo"], ["--device", "meta"], ["--method", "nope"],
])
def test_generate_checks_every_option_before_any_work(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generate, "load_model", no_model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert generate.main([a.format(tmp=tmp_path) for a in argv] + TINY) == 2
    one_line_error(capsys)


@pytest.mark.parametrize("argv", [
    ["--out", "{tmp}/missing/r.json"], ["--out", "{tmp}"], ["--images", "0"], ["--warmup", "-1"], ["--repeats", "0"],
    ["--threads", "-1"], ["--device", "foo"], ["--methods", "eagle", "eagle"], ["--methods", "cool:schedule=x"],
    ["--batch", "0"], ["--batch", "-4"], ["--batch", "2.5"], ["--batch", "5000"], ["--latency-batch", "0"],
    ["--latency-batch", "4", "x"], ["--images", "8", "--latency-batch", "16"],
    ["--images", "8", "--latency-images", "2", "--latency-batch", "4"],
])
def test_bench_checks_every_option_before_any_work(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "load_model", no_model)
    assert bench.main([a.format(tmp=tmp_path) for a in argv] + TINY + ["--no-progress"]) == 2
    one_line_error(capsys)


def test_cuda_on_a_machine_without_it_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert generate.main(["--device", "cuda", *TINY]) == 2
    assert "use --device cpu" in one_line_error(capsys)


@pytest.mark.parametrize("argv, name, value", [
    (["--delta", "6"], "delta", "6"), (["--nu", "3"], "nu", "3"), (["--mu", "9"], "mu", "9"),
    (["--method", "lantern", "--k", "51"], "k", "51"), (["--method", "lantern", "--lambda", "11"], "lambda", "11"),
    (["--cfg", "11"], "cfg_scale", "11"), (["--temperature", "50"], "temperature", "50"),
    (["--top-p", "0"], "top_p", "0"), (["--seed", "-1"], "seed", "-1"), (["--seed", "2.5"], "seed", "2.5"),
    (["--delta", "nan"], "delta", "nan"),
])
def test_generate_numbers_use_the_app_ranges(argv, name, value, capsys):
    assert generate.main(argv + TINY) == 2
    with pytest.raises(ValueError) as expected:
        check(name, value)
    assert str(expected.value) in one_line_error(capsys)


def test_top_k_is_bounded_by_the_vocabulary_and_mu_is_auto_or_a_number(capsys):
    assert generate.main(["--top-k", "17", *TINY]) == 2  # the tiny model has 16 codes
    assert one_line_error(capsys) == "error: top_k must be between 0 and 16, got '17'"
    assert generate.main(["--top-k", "16", "--mu", "-0.5", *TINY]) == 0
    capsys.readouterr()
    assert generate.main(["--mu", "often", *TINY]) == 2
    assert one_line_error(capsys) == "error: mu must be a number, got 'often'; or auto"


@pytest.mark.parametrize("spec, name, value", [
    ("cool:delta=9", "delta", 9), ("cool:delta=2,nu=-2", "nu", -2), ("lantern:k=60", "k", 60),
    ("lantern:k=2.5", "k", 2.5), ("uniform:delta=inf", "delta", float("inf")),
])
def test_bench_method_specs_use_the_app_ranges(spec, name, value, capsys):
    assert bench.main(["--methods", spec, "--images", "1", *TINY, "--no-progress"]) == 2
    with pytest.raises(ValueError) as expected:
        check(name, value)
    assert str(expected.value) in one_line_error(capsys)


def test_bench_sampling_options_use_the_app_ranges(capsys):
    assert bench.main(["--methods", "eagle", "--cfg", "11", "--images", "1", *TINY, "--no-progress"]) == 2
    assert one_line_error(capsys) == "error: cfg_scale must be between 0 and 10, got '11'"


def test_threads_are_chosen_deliberately(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COOLSD_THREADS", raising=False)
    torch.set_num_threads(2)  # torch's default on a 2-core machine
    try:
        assert generate.main(TINY) == 0
        assert torch.get_num_threads() == 1  # no --threads, no COOLSD_THREADS: one thread
        out = tmp_path / "r.json"
        assert bench.main(["--methods", "eagle", "--images", "1", "--warmup", "0", *TINY, "--no-progress",
                           "--out", str(out)]) == 0
        assert "1 torch thread," in capsys.readouterr().out
        assert json.loads(out.read_text())["threads"] == 1
        monkeypatch.setenv("COOLSD_THREADS", "lots")
        assert generate.main(TINY) == 2
        assert "COOLSD_THREADS" in one_line_error(capsys)
    finally:
        torch.set_num_threads(1)


def test_bench_repeats_and_speedup_spread(tmp_path, capsys, monkeypatch):
    calls = count_generations(monkeypatch)
    out = tmp_path / "r.json"
    assert bench.main(["--methods", "eagle", "cool:delta=2", "--images", "4", "--repeats", "3", "--warmup", "1",
                       *TINY, "--no-progress", "--out", str(out)]) == 0
    assert len(calls) == 3 * 1 + 3 * 4 * 3  # warm-up, then 3 methods x 4 images x 3 repeats
    assert calls[3:9] == ["ar", "eagle", "cool"] * 2  # repeats interleaved across methods
    result = json.loads(out.read_text())
    assert result["repeats"] == 3 and result["warnings"] == []
    ar = result["runs"][0]
    assert ar["speedup_vs_ar"] == 1.0 and ar["speedup_vs_ar_range"] == [1.0, 1.0]
    table = capsys.readouterr().out
    assert "speed-up range" in table and "latency IQR ms" in table and "3 timing(s) each" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines()}
    for run in result["runs"]:
        low, high = run["latency_iqr_s"]
        assert 0 < low <= run["latency_median_s"] <= high
        # the headline is the ratio of medians, its bracket the paired per-image ratios' extremes: in it, in the
        # JSON and in the table as printed
        assert run["speedup_vs_ar_range"][0] <= run["speedup_vs_ar"] <= run["speedup_vs_ar_range"][1]
        shown = rows[run["label"]]
        headline = float(next(cell for cell in shown if cell.endswith("x") and "-" not in cell)[:-1])
        bracket = [float(v) for v in next(cell for cell in shown if cell.endswith("x") and "-" in cell)[:-1].split("-")]
        assert bracket[0] <= headline <= bracket[1], shown


def test_bench_batches_keep_the_results_and_time_every_batch_size(tmp_path, capsys, monkeypatch):
    """--batch decodes the untimed pass in batches and changes no result; --latency-batch times the timed images
    at each size (interleaved), each size with its images/s and speed-up over AR at the same size; a timed image's
    tokens equal its sample's at every size (else the bench stops: not deterministic)."""
    base = ["--methods", "eagle", "cool:delta=2", "--images", "6", "--warmup", "1", *TINY, "--no-progress"]
    paths = {name: tmp_path / f"{name}.json" for name in ("plain", "batched", "timed")}
    assert bench.main(base + ["--latency-images", "2", "--out", str(paths["plain"])]) == 0
    calls = count_generations(monkeypatch)
    assert bench.main(base + ["--latency-images", "2", "--batch", "4", "--out", str(paths["batched"])]) == 0
    assert len(calls) == 3 * 1 + 3 * 2 + 3 * 4  # warm-up and timing at batch 1, then 4 untimed images per method
    plain, batched = (json.loads(paths[name].read_text()) for name in ("plain", "batched"))
    for a, b in zip(plain["runs"], batched["runs"]):  # the same tokens; costs to float rounding (docs/batches.md)
        for name in ("tau", "log_likelihood_per_token", "target_forwards_per_image"):
            assert a[name] == b[name]
        assert a["relaxation_cost_mean"] == pytest.approx(b["relaxation_cost_mean"], rel=1e-5)
    assert batched["batch"] == 4 and batched["latency_batch"] == 1
    calls.clear()
    capsys.readouterr()
    assert bench.main(base + ["--latency-batch", "1", "3", "--repeats", "2", "--out", str(paths["timed"])]) == 0
    # warm-up (one call per size and method: 1 + 3 images), then 6 images at each size, twice, per method
    assert len(calls) == 3 * (1 + 3) + 3 * 2 * (6 + 6)
    timed = json.loads(paths["timed"].read_text())
    assert [(row["batch"], row["label"]) for row in timed["batches"]] == \
        [(size, label) for size in (1, 3) for label in ("ar", "eagle", "cool:delta=2")]
    for row in timed["batches"]:
        assert row["calls"] == 6 // row["batch"] and row["images_per_s"] > 0
        if row["label"] == "ar":
            assert row["speedup_vs_ar"] == 1.0
        assert row["lockstep_rounds_over_own"] >= 1.0 and (row["batch"] > 1 or row["lockstep_rounds_over_own"] == 1)
    for a, b in zip(plain["runs"], timed["runs"]):
        assert a["tau"] == b["tau"]
    out = capsys.readouterr()
    assert "images/s" in out.out and "speed-up vs AR" in out.out
    assert out.err.startswith("memory: a batch of 3 images on chain:5 holds about")


def test_bench_refuses_repeats_that_differ(capsys, monkeypatch):
    real_generate = passes.generate_batch
    count = iter(range(10**6))

    def drifting(*args, **kwargs):
        results = real_generate(*args, **kwargs)
        results[0].tokens[0] += next(count)  # as if decoding were not deterministic
        return results

    monkeypatch.setattr(passes, "generate_batch", drifting)
    assert bench.main(["--methods", "eagle", "--images", "1", "--repeats", "2", "--warmup", "0", *TINY,
                       "--no-progress"]) == 1
    assert "not deterministic" in one_line_error(capsys)


class FakeQuality:
    """Stands in for the shipped judge: 128-d features, a fixed (implausible) FID."""

    num_features = 128

    def __call__(self, images, classes):
        return {"judge_accuracy": 1.0, "fid_images": len(images), "fid": 515.0}


def test_small_samples_warn(tmp_path, capsys, monkeypatch):
    assert summaries.sample_warnings(200, 128) == [] and summaries.sample_warnings(2, None) == []
    assert len(summaries.sample_warnings(150, 128)) == 1 and "200" in summaries.sample_warnings(150, 128)[0]
    def with_judge(args):
        bundle = random_bundle("tiny")
        bundle.quality = FakeQuality()
        return bundle

    monkeypatch.setattr(bench, "load_model", with_judge)
    out = tmp_path / "r.json"
    assert bench.main(["--methods", "eagle", "--images", "2", "--warmup", "0", *TINY, "--no-progress",
                       "--out", str(out)]) == 0
    captured = capsys.readouterr()
    warnings = json.loads(out.read_text())["warnings"]
    assert len(warnings) == 2
    assert "fid on 2 images is meaningless" in warnings[0] and "128" in warnings[0] and "--images 200" in warnings[0]
    assert "judge_accuracy on 2 images" in warnings[1] and "35 percentage points" in warnings[1]
    assert all(f"warning: {w}" in captured.err for w in warnings)
    assert "515.00" in captured.out


def test_residual_has_one_list_per_method_in_the_help_and_both_checks(capsys, monkeypatch):
    """Issue 42.7: GSD's residual is gsd or gstar, LANTERN++'s gstar or lantern (their schemas in the registry):
    argparse, the rule's check, bench's method strings and the help must each give a method its own list."""
    monkeypatch.setattr(generate, "load_model", no_model)
    monkeypatch.setattr(bench, "load_model", no_model)
    lists = {"gsd": ("gsd", "gstar"), "lantern": ("gstar", "lantern")}
    for method, choices in lists.items():
        for value in ("gsd", "gstar", "lantern"):
            argv = ["--method", method, "--residual", value, *TINY]
            spec = [f"{method}:residual={value}"]
            if value in choices:
                assert generate.check_args(generate.build_parser().parse_args(argv)).params == {"residual": value}
                assert bench.check_args(bench.build_parser().parse_args(["--methods", *spec, *TINY])).study
            else:
                want = f"residual must be one of: {', '.join(choices)}; got '{value}'"
                assert generate.main(argv) == 2 and want in one_line_error(capsys)
                assert bench.main(["--methods", *spec, *TINY, "--no-progress"]) == 2
                assert want in one_line_error(capsys)
    text = " ".join(generate.build_parser().format_help().split())
    assert "(lantern) gstar: the optimal G*; lantern: the published heuristic; gstar or lantern, default gstar" in text
    assert "(gsd) gsd: the published token-level Norm([p - q]+); gstar: the optimal G* of the grouped f; " \
           "gsd or gstar, default gsd" in text


def test_every_option_of_the_commands_has_help():
    """Issue 42.12: bench's --images and --no-progress (and the card's options) printed no help at all."""
    from coolsd.distill import command
    from coolsd.toy import card, train
    for module in (generate, bench, train, command, card):
        parser = module.build_parser()
        assert [a.option_strings for a in parser._actions if not (a.help or "").strip()] == [], module.__name__
