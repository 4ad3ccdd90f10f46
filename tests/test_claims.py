"""The study's summary (coolsd.cli.claims) reads the right numbers: on a hand-made study whose answers are
known, and on a real tiny study through ``bench --summary``."""

import json

from coolsd.cli import bench
from coolsd.cli.claims import better, cool_relaxation, dominance, noise_floor, summary


def difference(value, half):
    return {"value": value, "low": value - half, "high": value + half}


def run(method, params, draft, tau, speedup, loglik, fid=None):
    vs = {"tau": difference(tau - 3.0, 0.05), "log_likelihood_per_token": loglik}
    if fid is not None:
        vs["fid"] = fid
    label = method + ":" + ",".join(f"{k}={v}" for k, v in params.items()) + f" @ {draft}"
    return {"method": method, "params": params, "draft": draft, "label": label, "tau": tau,
            "speedup_vs_ar": speedup, "vs_eagle": vs, "eagle_baseline": f"eagle @ {draft}"}


def study():
    cool = {"nu": 0.7, "schedule": "exp"}
    eagle = run("eagle", {}, "chain:5", 3.0, 1.5, difference(0.0, 0.0), difference(0.0, 0.0))
    eagle["label"] = "eagle @ chain:5"
    ar = run("ar", {}, "none", 1.0, 1.0, difference(0.004, 0.01), difference(-0.3, 0.9))
    ar["label"] = "ar"
    runs = [ar, eagle,
            run("cool", {"delta": 1.1, **cool}, "chain:5", 3.2, 1.6, difference(-0.01, 0.02), difference(0.2, 0.9)),
            run("cool", {"delta": 1.5, **cool}, "chain:5", 3.5, 1.8, difference(-0.015, 0.02), difference(0.5, 0.9)),
            run("cool", {"delta": 2, **cool}, "chain:5", 3.8, 1.9, difference(-0.05, 0.02), difference(0.8, 0.9)),
            run("cool", {"delta": 3, **cool}, "chain:5", 4.2, 2.1, difference(-0.10, 0.02), difference(2.0, 0.9)),
            run("lantern", {"k": 10}, "chain:5", 3.6, 1.8, difference(-0.05, 0.02), difference(1.0, 0.9)),
            run("lantern", {"k": 20}, "chain:5", 3.7, 1.85, difference(-0.01, 0.02), difference(0.1, 0.9))]
    return {"images": 1000, "drafts": ["chain:5"], "runs": runs, "comparisons": []}


def test_noise_floor_is_ar_minus_eagle():
    lines = "\n".join(noise_floor(study()))
    assert "log-likelihood / token: +0.0040 [-0.0060, +0.0140]" in lines and "FID: -0.3000 [-1.2000, +0.6000]" in lines
    assert "resolved" not in lines


def test_smallest_resolved_delta_and_best_indistinguishable_setting():
    lines = cool_relaxation(study())
    # delta 1.1 and 1.5: every interval holds 0; delta 2: log-likelihood [-0.07, -0.03] is resolved
    assert "* chain:5, nu=0.7, exp: delta=2 (log-likelihood / token -0.0500 [-0.0700, -0.0300])" in lines
    best = lines[-1]
    assert "cool:delta=1.5,nu=0.7,schedule=exp @ chain:5" in best and "tau 3.500" in best
    assert "1.20x Eagle-1's speed" in best  # 1.8 / 1.5


def test_dominance_counts_points_beaten_on_both_axes_in_both_directions():
    lines = dominance(study())
    # k=10 (tau 3.6, -0.05) is beaten by delta=2 (3.8, -0.05); k=20 (3.7, -0.01) by none (delta=2 is lower)
    assert ("* chain:5: 1 of 2 LANTERN++ points are matched or beaten on both tau and log-likelihood / token by a "
            "COOL-SD point") in lines
    # k=20 (3.7, -0.01) beats delta=1.1 (3.2, -0.01) and delta=1.5 (3.5, -0.015); nothing beats delta=2 or 3
    assert ("* chain:5: 2 of 4 COOL-SD points are matched or beaten on both tau and log-likelihood / token by a "
            "LANTERN++ point") in lines
    assert not any("UniformRSD" in line for line in lines)  # the study has no UniformRSD run
    with_uniform = study()
    with_uniform["runs"].append(run("uniform", {"delta": 2}, "chain:5", 4.0, 2.0, difference(-0.04, 0.02)))
    lines = dominance(with_uniform)
    # uniform (4.0, -0.04) beats delta=2 (3.8, -0.05) only: 1.1 and 1.5 score higher; none beats it (delta=3 is -0.10)
    assert ("* chain:5: 0 of 1 UniformRSD points are matched or beaten on both tau and log-likelihood / token by a "
            "COOL-SD point") in lines
    assert ("* chain:5: 1 of 4 COOL-SD points are matched or beaten on both tau and log-likelihood / token by a "
            "UniformRSD point") in lines


def test_direction_of_better_follows_the_measure():
    assert better(difference(-2.0, 1.0), "fid") is True and better(difference(-2.0, 1.0), "judge_accuracy") is False
    assert better(difference(0.5, 1.0), "fid") is None


def test_bench_writes_the_summary_of_a_real_study(tmp_path):
    out, text = tmp_path / "s.json", tmp_path / "summary.md"
    methods = ["eagle", "cool:delta=2,nu=0.3,schedule=exp", "cool:delta=2,nu=0.3,schedule=linear", "uniform:delta=2"]
    assert bench.main(["--methods", *methods, "--draft", "chain:3", "--images", "6", "--out", str(out), "--summary",
                       str(text), "--random-init", "tiny", "--no-progress"]) == 0
    result, written = json.loads(out.read_text()), text.read_text()
    assert written == summary(result)
    ar = next(r for r in result["runs"] if r["method"] == "ar")["vs_eagle"]["log_likelihood_per_token"]
    assert f"{ar['value']:+.4f} [{ar['low']:+.4f}, {ar['high']:+.4f}]" in written
    # the schedule pair names COOL-SD in both columns, the two annealing pairs in one
    assert written.count("| cool:delta=2,nu=0.3,schedule=") == 4 and written.count("| uniform:delta=2 |") == 2
