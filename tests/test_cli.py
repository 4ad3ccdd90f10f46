"""The two command-line contracts: coolsd.generate and coolsd.bench (on random-init models)."""

import json
import math

import numpy as np
from PIL import Image

from coolsd import bench, generate
from coolsd.methods import parse_method


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
