"""The benchmark as a study (coolsd.cli.study, coolsd.cli.bench): presets, paired intervals for quality,
resuming from a work folder, and the CSV; on the tiny random model."""

import csv
import json

import numpy as np
import pytest
from helpers import count_generations

from coolsd.cli import bench, summaries
from coolsd.cli.methods import parse_method
from coolsd.cli.study import Configuration, read_records
from coolsd.core.stats import bootstrap_interval, frechet_distance
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import random_bundle

TINY = ["--random-init", "tiny", "--no-progress"]
PARTS = 4


class PerImageJudge:
    """Stands in for the shipped judge (coolsd.toy.judge.JudgeQuality): per image, 4 features (the mean grey
    of each quarter of the picture) and a verdict that depends on the picture; FID against a standard normal."""

    num_features = PARTS

    def per_image(self, images, classes):
        features = np.array([[part.mean() / 64 for part in np.array_split(image[..., 0].ravel(), PARTS)]
                             for image in images], dtype=np.float32)
        correct = np.array([int(image.sum()) % 3 != c % 3 for image, c in zip(images, classes)])
        return {"features": features, "correct": correct}

    def fid(self, features):
        return frechet_distance(features, np.zeros(PARTS), np.eye(PARTS), np.eye(PARTS))

    def __call__(self, images, classes):
        raise AssertionError("the benchmark scores per image when the judge can")


def with_judge(args):
    model = random_bundle("tiny")
    model.quality = PerImageJudge()
    return model


def planned(argv):
    return bench.check_args(bench.build_parser().parse_args(argv + TINY)).study


def test_presets_expand_to_sweeps_and_skip_what_the_rule_refuses():
    study = planned(["--preset", "cool"])
    labels = [c.label for c in study.configurations]
    assert labels[0] == "ar" and len(labels) == 1 + 15 and len(set(labels)) == 16
    assert "cool:delta=1.1,nu=0.3,schedule=linear" in labels and "cool:delta=4,nu=0.7,schedule=exp" in labels
    assert [s["label"] for s in study.skipped] == [f"cool:delta={d},nu=0.7,schedule=linear"
                                                   for d in (1.1, 1.5, 2, 3, 4)]
    assert all("too steep" in s["reason"] and s["draft"] == "chain:5" for s in study.skipped)
    # combined with --methods: the methods first, a preset's repeat of one of them dropped
    study = planned(["--methods", "eagle", "uniform:delta=2", "--preset", "uniform"])
    assert [c.label for c in study.configurations] == ["ar", "eagle", "uniform:delta=2", "uniform:delta=1.1",
                                                       "uniform:delta=1.5", "uniform:delta=3", "uniform:delta=4"]
    assert planned([]).configurations[1].label == "eagle"  # no preset, no methods: the default methods


def test_the_paper_preset_runs_everything_on_both_drafts_and_ar_once():
    study = planned(["--preset", "paper", "--preset", "lantern"])  # the second adds nothing new
    configurations = study.configurations
    assert [c.label for c in configurations].count("ar") == 1 and configurations[0].draft == "none"
    drafted = [c for c in configurations if c.name != "ar"]
    assert {c.draft for c in drafted} == {"chain:5", "tree:eagle25"} and study.drafts == ["chain:5", "tree:eagle25"]
    assert all(c.label.endswith(f" @ {c.draft}") for c in drafted)
    for draft in ("chain:5", "tree:eagle25"):
        names = [c.name for c in drafted if c.draft == draft]
        # the tiny model has 16 codes: LANTERN++ k=20 (21 neighbours) is refused, k=1, 5, 10 remain
        assert names.count("eagle") == 1 and names.count("cool") == 15 and names.count("uniform") == 5
        assert names.count("lantern") == 3 * 3 * 2
    assert sum("neighbours" in s["reason"] for s in study.skipped) == 2 * 3 * 2


def test_quality_differences_are_paired_over_images(tmp_path, monkeypatch):
    """uniform:delta=1 is bit-identical to Eagle-1 image by image, so every paired difference is exactly 0 in
    every resample (an unpaired bootstrap would spread); cool:delta=4's intervals are the paired bootstrap of
    the recorded per-image judge outputs."""
    monkeypatch.setattr(bench, "load_model", with_judge)
    out, table = tmp_path / "r.json", tmp_path / "r.csv"
    assert bench.main(["--methods", "eagle", "uniform:delta=1", "cool:delta=4", "--images", "12", "--warmup", "0",
                       "--work", str(tmp_path / "w"), "--out", str(out), "--csv", str(table), *TINY]) == 0
    result = json.loads(out.read_text())
    ar, eagle, same, cool = result["runs"]
    for key in ("tau", "log_likelihood_per_token", "judge_accuracy", "fid"):
        assert same["vs_eagle"][key]["value"] == same["vs_eagle"][key]["low"] == same["vs_eagle"][key]["high"] == 0
    assert eagle["vs_eagle"]["fid"]["high"] - eagle["vs_eagle"]["fid"]["low"] == 0
    samples = {}
    for line in (tmp_path / "w" / "records-0.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "sample":
            samples.setdefault(record["configuration"], {})[record["image"]] = record
    features, correct = ({label: np.array([by_image[i][key] for i in range(12)], dtype=dtype)
                          for label, by_image in samples.items()}
                         for key, dtype in (("judge_features", np.float32), ("judge_correct", float)))
    judge = PerImageJudge()
    assert cool["fid"] == judge.fid(features["cool:delta=4"]) and cool["fid_images"] == 12
    assert cool["judge_accuracy"] == correct["cool:delta=4"].mean()
    f, e = features["cool:delta=4"], features["eagle"]
    assert cool["vs_eagle"]["fid"] == bootstrap_interval(12, lambda i: judge.fid(f[i]) - judge.fid(e[i]),
                                                         resamples=summaries.FID_RESAMPLES, seed=0)
    c, ce = correct["cool:delta=4"], correct["eagle"]
    assert cool["vs_eagle"]["judge_accuracy"] == bootstrap_interval(12, lambda i: c[i].mean() - ce[i].mean())
    assert cool["vs_eagle"]["fid"]["high"] > cool["vs_eagle"]["fid"]["low"]  # the images differ: a real interval
    # the CSV: one row per configuration, the JSON's numbers
    rows = list(csv.DictReader(table.open()))
    assert [row["label"] for row in rows] == [run["label"] for run in result["runs"]]
    assert rows[0]["vs_eagle_fid"] != "" and rows[3]["params"] == "delta=4" and rows[3]["draft"] == "chain:5"
    for key in ("tau", "speedup_vs_ar", "fid", "judge_accuracy"):
        assert float(rows[3][key]) == cool[key]
        for part, suffix in (("value", ""), ("low", "_low"), ("high", "_high")):
            assert float(rows[3][f"vs_eagle_{key}{suffix}"]) == cool["vs_eagle"][key][part]


def record_lines(work) -> list[dict]:
    return [record for path in sorted(work.glob("records-*.jsonl")) for record in read_records(path)]


def test_a_rerun_resumes_from_the_work_folder(tmp_path, monkeypatch, capsys):
    work, out = tmp_path / "w", tmp_path / "r.json"
    argv = ["--methods", "eagle", "cool:delta=2", "--images", "4", "--latency-images", "2", "--warmup", "1",
            "--work", str(work), "--out", str(out), *TINY]
    calls = count_generations(monkeypatch)
    assert bench.main(argv) == 0
    first = json.loads(out.read_text())
    assert len(calls) == 3 * 1 + 3 * 2 + 3 * 2  # warm-up, 2 timed images, 2 untimed ones
    assert len(record_lines(work)) == 3 * 4 + 3 * 2  # a sample per item, a timing per timed item
    calls.clear()
    assert bench.main(argv) == 0
    assert calls == [] and json.loads(out.read_text()) == first  # nothing redone, the same summary
    # lose eagle's image 0 (sample and timing) and cool's image 3 (sample), and leave a line cut short
    path = work / "records-0.jsonl"
    kept = [r for r in record_lines(work) if not ((r["configuration"], r["image"]) == ("eagle", 0) or
                                                  (r["configuration"], r["image"], r["kind"]) == ("cool:delta=2", 3,
                                                                                                  "sample"))]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"kind": "sample", "configur')
    assert bench.main(argv) == 0
    assert calls == ["eagle", "eagle", "cool"]  # eagle's warm-up and timing (which gives its sample), cool's sample
    again = json.loads(out.read_text())
    for run, before in zip(again["runs"], first["runs"]):
        for key in ("tau", "target_forwards_per_image", "relaxation_cost_mean", "log_likelihood_per_token"):
            assert run[key] == before[key]
        for key in ("tau", "log_likelihood_per_token"):
            assert run["vs_eagle"][key] == before["vs_eagle"][key]
    keys = [(r["kind"], r["configuration"], r["image"]) for r in record_lines(work)]
    assert len(keys) == len(set(keys)) == 3 * 4 + 3 * 2
    capsys.readouterr()
    # other arguments: refused in one line, before any work
    calls.clear()
    for other in (["--seed", "1"], ["--images", "5"], ["--repeats", "2"]):
        assert bench.main(argv + other) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --work {work} holds the records of other arguments") and err.count("\n") == 1
    assert calls == []
    assert bench.main([*argv[:2], "uniform:delta=2", *argv[3:]]) == 2
    assert "configurations" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--csv", "{tmp}/r.txt"], ["--csv", "{tmp}/missing/r.csv"], ["--latency-images", "0"],
    ["--images", "3", "--latency-images", "4"], ["--latency-images", "x"], ["--preset", "nope"],
    ["--work", "{tmp}/missing/w"], ["--work", "{tmp}/file"],
])
def test_study_options_are_checked_before_any_work(argv, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(bench, "load_model", lambda args: pytest.fail("the model was loaded"))
    assert bench.main([a.format(tmp=tmp_path) for a in argv] + TINY) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_the_log_likelihood_runs_under_every_step_mode(tmp_path):
    """The teacher-forced likelihood forward takes the plain model: the step wrappers (static caches, CUDA
    graphs, the default on CUDA) take no padding mask, and the benchmark used to fail there."""
    results = []
    for steps in ("eager", "static"):
        out = tmp_path / f"{steps}.json"
        assert bench.main(["--methods", "eagle", "--images", "2", "--warmup", "0", "--steps", steps, "--device", "cpu",
                           "--out", str(out), *TINY]) == 0
        results.append(json.loads(out.read_text())["runs"])
    for eager, static in zip(*results):
        assert static["log_likelihood_per_token"] == pytest.approx(eager["log_likelihood_per_token"], abs=1e-4)


def test_acceptance_per_position_pools_every_round_of_every_image(tmp_path):
    """The per-position curve of a run: for each depth, the rounds of all its images that reached it and their
    mean acceptance probability, recomputed here from direct generations (image i: class i mod C, seed i); and
    --plots writes the study's figures."""
    from coolsd.core.decode import generate
    from coolsd.core.rules import build_rule
    from coolsd.core.trees import parse_draft

    out, images = tmp_path / "depths.json", 6
    assert bench.main(["--methods", "eagle", "cool:delta=2", "--draft", "chain:3", "--images", str(images),
                       "--out", str(out), "--plots", str(tmp_path / "figures")] + TINY) == 0
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "acceptance.png", "quality_log_likelihood_per_token.png", "speedup.png"]
    model = random_bundle("tiny")
    for run in json.loads(out.read_text())["runs"]:
        reached, total = np.zeros(3), np.zeros(3)
        if run["method"] != "ar":
            for i in range(images):
                stats = generate(model, i % model.config.num_classes, build_rule(run["method"], run["params"], 3),
                                 parse_draft("chain:3"), seed=i).stats
                for r in stats.rounds:
                    for depth, prob in r.level_accept_prob.items():
                        reached[depth - 1] += 1
                        total[depth - 1] += prob
        depths = run["per_depth"]
        if run["method"] == "ar":
            assert depths == {"depth": [], "reached": [], "accept_prob": []}
            continue
        assert depths["depth"] == [1, 2, 3] and depths["reached"] == reached.astype(int).tolist()
        assert reached[0] > reached[2] > 0
        np.testing.assert_allclose(depths["accept_prob"], total / reached, rtol=1e-12)


def test_configurations_differing_in_one_respect_are_compared_on_the_same_images(tmp_path):
    """The claims' pairs: G* against the heuristic residual, exponential against linear decay, and COOL-SD
    against UniformRSD at the same delta; each difference is a's value minus b's, with a paired interval."""
    out = tmp_path / "pairs.json"
    methods = ["eagle", "lantern:k=5,lambda=2,residual=gstar", "lantern:k=5,lambda=2,residual=lantern",
               "cool:delta=2,nu=0.3,schedule=exp", "cool:delta=2,nu=0.3,schedule=linear", "uniform:delta=2",
               "uniform:delta=3"]
    assert bench.main(["--methods", *methods, "--draft", "chain:3", "--images", "6", "--out", str(out)] + TINY) == 0
    result = json.loads(out.read_text())
    runs = {run["label"]: run for run in result["runs"]}
    pairs = [(c["a"], c["b"], c["differs_in"]) for c in result["comparisons"]]
    assert pairs == [(methods[1], methods[2], "residual"), (methods[3], methods[4], "schedule"),
                     (methods[3], methods[5], "annealing"), (methods[4], methods[5], "annealing")]
    for compared in result["comparisons"]:
        a, b = runs[compared["a"]], runs[compared["b"]]
        for key in ("tau", "log_likelihood_per_token"):
            difference = compared["a_minus_b"][key]
            assert difference["value"] == pytest.approx(a[key] - b[key], abs=1e-12)
            assert difference["low"] <= difference["value"] <= difference["high"]


def configuration(spec: str, draft: str) -> Configuration:
    name, params = parse_method(spec)
    return Configuration(name, params, parse_draft(draft, 30), f"{spec} @ {draft}")


def test_pairs_across_drafts_compare_one_method_and_setting_on_two_drafts():
    """Eagle-1 on a coupled or Gumbel window against the independent window of the same length and fresh law
    (SCD against SJD); Eagle-1 on each window against Eagle-1 on the draft model's draft; COOL-SD on a coupled
    window against the same setting (its defaults filled in) on the draft model's draft, and on no other."""
    configurations = tuple(configuration(spec, draft) for spec, draft in [
        ("eagle", "chain:5"), ("cool:delta=2,nu=0.7,schedule=exp", "chain:5"), ("cool:delta=2,nu=0.3", "chain:5"),
        ("eagle", "jacobi:8"), ("eagle", "jacobi:8:coupled"), ("eagle", "jacobi:8:gumbel"),
        ("eagle", "jacobi:8:coupled:point"), ("eagle", "jacobi:16"), ("cool:delta=2", "jacobi:8:coupled"),
        ("cool:delta=2", "jacobi:8"), ("gsd", "jacobi:8:point")])
    pairs = {(a, b, aspect) for a, b, aspect in summaries.draft_pairs(configurations)}
    assert pairs == {(4, 3, "refresh"), (5, 3, "refresh"),  # jacobi:8:coupled:point has no independent :point
                     (3, 0, "lossless_source"), (4, 0, "lossless_source"), (5, 0, "lossless_source"),
                     (6, 0, "lossless_source"), (7, 0, "lossless_source"), (8, 1, "relaxed_source")}


def test_drafter_free_runs_are_also_compared_with_ar(tmp_path):
    """On a Jacobi window every run also has its differences from AR on the same images; on a draft model's
    draft none; a cross-draft comparison names both drafts."""
    out = tmp_path / "jacobi.json"
    assert bench.main(["--methods", "eagle", "cool:delta=2", "--draft", "jacobi:4:coupled", "--images", "4",
                       "--out", str(out)] + TINY) == 0
    runs = {run["label"]: run for run in json.loads(out.read_text())["runs"]}
    assert "vs_ar" not in runs["ar"]
    for label in ("eagle", "cool:delta=2"):
        difference = runs[label]["vs_ar"]["tau"]
        assert difference["value"] == pytest.approx(runs[label]["tau"] - 1.0, abs=1e-12)
        assert difference["low"] <= difference["value"] <= difference["high"]
