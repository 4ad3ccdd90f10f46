"""The study's summary (coolsd.app.claims) reads the right numbers: on a hand-made study whose answers are
known, and on a real tiny study through ``bench --summary``."""

import json
from pathlib import Path

from helpers import markdown_table

from coolsd.cli import bench, summaries
from coolsd.app.claims import (
    CLAIMS,
    against_ar,
    better,
    claim_rows,
    claims_table,
    comparisons,
    cool_relaxation,
    dominance,
    gsd_against_cool,
    key_table,
    key_tables,
    noise_floor,
    summary,
)
from coolsd.models.bundle import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent


def difference(value, half):
    return {"value": value, "low": value - half, "high": value + half}


def run(method, params, draft, tau, speedup, loglik, fid=None):
    vs = {"tau": difference(tau - 3.0, 0.05), "log_likelihood_per_token": loglik}
    if fid is not None:
        vs["fid"] = fid
    label = method + ":" + ",".join(f"{k}={v}" for k, v in params.items()) + f" @ {draft}"
    absolute = {"log_likelihood_per_token": -3.0 + loglik["value"]} | ({"fid": 5.0 + fid["value"]} if fid else {})
    return {"method": method, "params": params, "draft": draft, "label": label, "tau": tau,
            "speedup_vs_ar": speedup, "vs_eagle": vs, "eagle_baseline": "eagle @ chain:5",
            "relaxation_cost_mean": 2 * (tau - 3.0) if method not in ("ar", "eagle") else 0.0, **absolute}


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
    assert ("* chain:5: 1 of 2 LANTERN++ points are matched or beaten on both tau and log-likelihood gap to Eagle-1 "
            "by a COOL-SD point") in lines
    # k=20 (3.7, -0.01) beats delta=1.1 (3.2, -0.01) and delta=1.5 (3.5, -0.015); nothing beats delta=2 or 3
    assert ("* chain:5: 2 of 4 COOL-SD points are matched or beaten on both tau and log-likelihood gap to Eagle-1 "
            "by a LANTERN++ point") in lines
    assert not any("UniformRSD" in line for line in lines)  # the study has no UniformRSD run
    with_uniform = study()
    with_uniform["runs"].append(run("uniform", {"delta": 2}, "chain:5", 4.0, 2.0, difference(-0.04, 0.02)))
    lines = dominance(with_uniform)
    # uniform (4.0, -0.04) beats delta=2 (3.8, -0.05) only: 1.1 and 1.5 score higher; none beats it (delta=3 is -0.10)
    assert ("* chain:5: 0 of 1 UniformRSD points are matched or beaten on both tau and log-likelihood gap to Eagle-1 "
            "by a COOL-SD point") in lines
    assert ("* chain:5: 1 of 4 COOL-SD points are matched or beaten on both tau and log-likelihood gap to Eagle-1 "
            "by a UniformRSD point") in lines
    on_fid = dominance(study(), "fid")
    # k=10 (3.6, FID +1.0) is beaten by delta=2 (3.8, +0.8); k=20 (3.7, +0.1) by none
    assert on_fid[0] == "Dominance on tau and FID (point estimates):"
    assert "* chain:5: 1 of 2 LANTERN++ points are matched or beaten on both tau and FID by a COOL-SD point" in on_fid
    above = study()  # a LANTERN++ point ABOVE Eagle-1's log-likelihood departs from the target as much as one below
    above["runs"].append(run("lantern", {"k": 30}, "chain:5", 4.5, 2.2, difference(0.08, 0.02)))
    # it beats delta=3 (4.2, 0.10 away) but not delta=2 (3.8, 0.05 away): with the signed value it would beat all
    assert ("* chain:5: 3 of 4 COOL-SD points are matched or beaten on both tau and log-likelihood gap to Eagle-1 "
            "by a LANTERN++ point") in dominance(above)


def test_key_table_rows_show_differences_from_eagle_with_resolved_ones_in_bold():
    lines = key_table(study(), "chain:5")
    assert lines[0] == "chain:5: Eagle-1 itself has tau 3.000, log-likelihood / token -3.000, FID 5.00."
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| configuration")]
    assert [row.split(" | ")[0] for row in rows] == ["| ar", "| eagle"] + [
        f"| cool:delta={d},nu=0.7,schedule=exp" for d in (1.1, 1.5, 2, 3)]  # the LANTERN++ runs lack lambda
    assert rows[0] == "| ar | 1.000 | 1.00x | +0.004 [-0.006, +0.014] | -0.30 [-1.20, +0.60] | 0.00 |"
    assert rows[1] == "| eagle | 3.000 | 1.50x |  |  | 0.00 |"
    assert rows[4] == "| cool:delta=2,nu=0.7,schedule=exp | 3.800 | 1.90x | **-0.050 [-0.070, -0.030]** | " \
                      "+0.80 [-0.10, +1.70] | 1.60 |"
    assert rows[5].endswith("| **-0.100 [-0.120, -0.080]** | **+2.00 [+1.10, +2.90]** | 2.40 |")
    assert key_table(study(), "tree:eagle25") == []  # no Eagle-1 on that draft


def test_log_likelihood_gap_ranks_the_distance_from_eagle_either_side():
    def records(values):
        return [{"log_likelihood_per_token": v} for v in values]
    eagle = records([-2.0, -2.2, -2.1, -1.9])
    above = records([-1.9, -2.1, -2.0, -1.8])  # 0.1 above Eagle-1 on every image
    below = records([-2.05, -2.25, -2.15, -1.95])  # 0.05 below
    gap = summaries.log_likelihood_gap(above, below, eagle, seed=0)
    assert abs(gap["value"] - 0.05) < 1e-12 and abs(gap["low"] - 0.05) < 1e-12  # a signed difference: 0.15
    assert abs(summaries.log_likelihood_gap(below, above, eagle, seed=0)["value"] + 0.05) < 1e-12


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
    means = {r["label"]: r["log_likelihood_per_token"] for r in result["runs"]}
    for pair in result["comparisons"]:  # the gap ranks the distance from Eagle-1's value, either side
        gap = abs(means[pair["a"]] - means["eagle"]) - abs(means[pair["b"]] - means["eagle"])
        assert abs(pair["a_minus_b"]["log_likelihood_gap"]["value"] - gap) < 1e-9
    pairs, key = written.split("Key configurations")
    assert pairs.count("| cool:delta=2,nu=0.3,schedule=") == 4 and pairs.count("| uniform:delta=2 |") == 2
    # the key table: AR, Eagle-1, then the KEY_ROWS runs (the linear schedule is not one)
    assert [line.split(" | ")[0] for line in key.splitlines() if line.startswith("| ") and "---" not in line][1:] == [
        "| ar", "| eagle", "| cool:delta=2,nu=0.3,schedule=exp", "| uniform:delta=2"]


def test_the_shipped_summary_and_the_results_page_tables_are_the_shipped_study_s():
    """The summary file and the key tables of docs/results.md are what the shipped study JSON gives today: a
    rerun of the study command that changes the numbers cannot leave stale ones in the documentation."""
    result = json.loads((DEFAULT_MODEL / "bench_results.json").read_text())
    assert (DEFAULT_MODEL / "study_summary.md").read_text() == summary(result)
    page = (ROOT / "docs" / "results.md").read_text()
    rows = [line for line in key_tables(result) if line.startswith("|")]
    assert len(rows) > 30 and [row for row in rows if row not in page] == []
    drafter_free = [line for line in against_ar(result) if line.startswith("|")]
    assert len(drafter_free) == 2 + 24 and [row for row in drafter_free if row not in page] == []


# The README's headline rows: the shipped study's run on chain:5, and the paper's LlamaGen-XL row (method spec
# section 6: mean accepted length, speed-up vs AR, FID).
HEADLINE = {
    "AR": ("ar", None),
    "Eagle-1": ("eagle @ chain:5", ["2.42", "2.03x", "20.97"]),
    "LANTERN++ (ours: `k`=10, `lambda`=5, its own residual)": ("lantern:k=10,lambda=5,residual=lantern @ chain:5",
                                                              ["2.67", "2.15x", "21.17"]),
    "COOL-SD `delta`=1.1": ("cool:delta=1.1,nu=0.7,schedule=exp @ chain:5", ["2.73", "2.27x", "21.02"]),
    "COOL-SD `delta`=2": ("cool:delta=2,nu=0.7,schedule=exp @ chain:5", ["3.34", "2.72x", "21.20"]),
    "UniformRSD `delta`=2": ("uniform:delta=2 @ chain:5", None),
}


def interval_cell(difference: dict, digits: int) -> str:
    """A paired difference as the tables print it, bold when its interval excludes 0 (written out here)."""
    cell = f"{difference['value']:+.{digits}f} [{difference['low']:+.{digits}f}, {difference['high']:+.{digits}f}]"
    return f"**{cell}**" if difference["low"] > 0 or difference["high"] < 0 else cell


def test_the_readme_headline_table_is_the_shipped_study_s_next_to_the_paper_s():
    runs = {run["label"]: run for run in json.loads((DEFAULT_MODEL / "bench_results.json").read_text())["runs"]}
    rows = markdown_table((ROOT / "README.md").read_text(), "| method | `tau` | speed-up |")
    assert [row[0] for row in rows] == list(HEADLINE)
    for name, *cells in rows:
        label, paper = HEADLINE[name]
        run = runs[label]
        quality = [""] * 2 if run["method"] == "eagle" else [
            interval_cell(run["vs_eagle"]["log_likelihood_per_token"], 3), interval_cell(run["vs_eagle"]["fid"], 2)]
        assert cells == [f"{run['tau']:.3f}", f"{run['speedup_vs_ar']:.2f}x", *quality, *(paper or [""] * 3)], name
    paper_page = {row[1]: row[2:5] for row in markdown_table((ROOT / "docs" / "results.md").read_text(),
                                                             "| target | method |")[:4]}
    assert paper_page == {"Eagle-1": ["2.42", "2.03x", "20.97"], "LANTERN++": ["2.67", "2.15x", "21.17"],
                          "COOL-SD `delta`=1.1": ["2.73", "2.27x", "21.02"],
                          "COOL-SD `delta`=2": ["3.34", "2.72x", "21.20"]}


# The README's drafter-free rows: the shipped study's runs minus AR (Eagle-1 on chain:5: AR minus it, mirrored), and
# each paper's own headline against its own AR (method spec section 11)
JACOBI_HEADLINE = {
    "Eagle-1, `chain:5`": ("eagle @ chain:5", "2.37x"),
    "SJD as published (`jacobi:16:point`)": ("eagle @ jacobi:16:point", "about 2.0x"),
    "SCD as published (`jacobi:16:coupled:point`)": ("eagle @ jacobi:16:coupled:point",
                                                     "4.2x (`L`=32; SJD 2.3x beside it)"),
    "Gumbel coupling (`jacobi:16:gumbel`)": ("eagle @ jacobi:16:gumbel", ""),
    "GSD as published (`jacobi:16:point`)": ("gsd @ jacobi:16:point", "3.6-3.7x"),
    "COOL-SD `delta`=2, `chain:5`": ("cool:delta=2,nu=0.7,schedule=exp @ chain:5", "2.69x (`delta`=1.1)"),
    "COOL-SD `delta`=2, `jacobi:16:coupled`": ("cool:delta=2 @ jacobi:16:coupled", "not measured before"),
}


def test_the_readme_drafter_free_table_is_the_shipped_study_s_next_to_the_papers():
    result = json.loads((DEFAULT_MODEL / "bench_results.json").read_text())
    runs = {run["label"]: run for run in result["runs"]}
    rows = markdown_table((ROOT / "README.md").read_text(), "| method | `tau` | speed-up | log-likelihood / token minus AR")
    assert [row[0] for row in rows] == list(JACOBI_HEADLINE)
    for name, *cells in rows:
        label, paper = JACOBI_HEADLINE[name]
        run = runs[label]
        if "vs_ar" in run:
            minus_ar = interval_cell(run["vs_ar"]["log_likelihood_per_token"], 3)
        elif label == "eagle @ chain:5":  # AR minus Eagle-1, turned round
            ar = runs["ar"]["vs_eagle"]["log_likelihood_per_token"]
            minus_ar = interval_cell({"value": -ar["value"], "low": -ar["high"], "high": -ar["low"]}, 3)
        else:  # a relaxed drafter run is paired with Eagle-1 only (the headline table above has it)
            minus_ar = ""
        assert cells == [f"{run['tau']:.3f}", f"{run['speedup_vs_ar']:.2f}x", minus_ar, paper], name


def test_the_readme_and_the_results_page_state_each_claims_verdict_as_the_study_gives_it():
    result = json.loads((DEFAULT_MODEL / "bench_results.json").read_text())
    expected = [[claim.name, claim.source, f"**{said}**"] for claim, _, said in claim_rows(result)]
    assert len(expected) == len(CLAIMS)  # the shipped study has the runs of every claim
    assert markdown_table((ROOT / "README.md").read_text(), "| claim | from | verdict |") == expected
    page = (ROOT / "docs" / "results.md").read_text()
    assert [line for line in claims_table(result) if line.startswith("| ") and line not in page] == []


def jacobi_run(method, draft, tau, distance):
    """A drafter-free run whose log-likelihood lies ``distance`` from AR's (either side)."""
    return {"method": method, "params": {}, "draft": draft, "label": f"{method} @ {draft}", "tau": tau,
            "speedup_vs_ar": tau / 2, "vs_ar": {"tau": difference(tau - 1, 0.05),
                                               "log_likelihood_per_token": difference(distance, 0.01)}}


def test_gsd_and_cool_are_compared_at_equal_tau_per_window_length():
    """On jacobi:8: GSD (tau 3.0, 0.05 from AR) is beaten by COOL-SD delta=2 (3.2, 0.04 below) but not GSD
    with G* (3.5, 0.02); no GSD point beats a COOL-SD point there except (3.5, 0.02) beating (3.2, -0.04).
    jacobi:16 has no GSD: no line."""
    runs = [jacobi_run("gsd", "jacobi:8:point", 3.0, 0.05), jacobi_run("gsd", "jacobi:8:point", 3.5, 0.02),
            jacobi_run("cool", "jacobi:8:coupled", 3.2, -0.04), jacobi_run("cool", "jacobi:16:coupled", 4.0, -0.1)]
    runs[1]["label"] = "gsd:residual=gstar @ jacobi:8:point"
    lines = gsd_against_cool({"runs": runs})
    said = "are matched or beaten on both tau and the log-likelihood's distance from AR by a"
    assert lines[2:] == [f"* jacobi:8: 1 of 2 GSD points {said} COOL-SD point",
                         f"* jacobi:8: 1 of 1 COOL-SD points {said} GSD point"]
    table = against_ar({"runs": runs})
    assert "| gsd | jacobi:8:point | 3.000 | 1.50x | **+0.0500 [+0.0400, +0.0600]** |" in table


def test_comparisons_across_drafts_name_both_drafts_and_the_speed_up():
    compared = {"a": "eagle @ jacobi:8:coupled", "b": "eagle @ chain:5", "draft": "jacobi:8:coupled",
                "b_draft": "chain:5", "differs_in": "lossless_source",
                "a_minus_b": {"tau": difference(-0.5, 0.1), "speedup_vs_ar": difference(0.2, 0.05),
                              "log_likelihood_gap": difference(0.0, 0.02)}}
    result = {"runs": [{"vs_eagle": {"log_likelihood_per_token": {}}}], "comparisons": [compared]}
    lines = comparisons(result)
    assert lines[0].startswith("**lossless drafting by the target")
    assert lines[2] == "| a | b | draft | tau | speed-up over AR | log-likelihood gap to Eagle-1 |"
    assert lines[4] == ("| eagle @ jacobi:8:coupled | eagle @ chain:5 | jacobi:8:coupled / chain:5 | -0.5000 [-0.6000, "
                        "-0.4000] | +0.2000 [+0.1500, +0.2500] | +0.0000 [-0.0200, +0.0200] |")
    assert "speed-up over AR: a better in 1, b better in 0, unresolved in 0" in lines[-2]


def pair(aspect, **measures):
    """A comparison of ``aspect`` whose a minus b is resolved above 0 (+1), below (-1) or not (0) per measure."""
    return {"a": "x", "b": "y", "draft": "chain:5", "b_draft": "chain:5", "differs_in": aspect,
            "a_minus_b": {m: difference(0.5 * sign, 0.2 if sign else 0.9) for m, sign in measures.items()}}


def test_claim_verdicts_need_a_quarter_of_the_pairs_one_way():
    """Annealing (a favoured, higher tau better, FID lower better): of 8 pairs, tau is resolved for in 2 (a
    quarter: holds) and FID against in 1 (chance: not resolved), so the claim holds. G* (b favoured): FID a minus
    b resolved above 0 (a worse: for G*) in 2 and below in 2: mixed. Schedule: one stray resolved pair of 8."""
    result = study()
    result["comparisons"] = ([pair("annealing", tau=1, fid=1 if k == 0 else 0) for k in range(2)]
                             + [pair("annealing", tau=0, fid=0) for _ in range(6)]
                             + [pair("residual", fid=sign) for sign in (1, 1, -1, -1, 0, 0, 0, 0)]
                             + [pair("schedule", tau=-1)] + [pair("schedule", tau=0) for _ in range(7)])
    for row in result["comparisons"]:
        row["a_minus_b"].setdefault("log_likelihood_gap", difference(0.0, 0.5))
    rows = {claim.aspect: (shows, said) for claim, shows, said in claim_rows(result) if claim.aspect}
    assert rows["annealing"] == ("8 pairs; tau: 2 for, 0 against (holds); log-likelihood gap to Eagle-1: 0 for, 0 "
                                 "against (not resolved); FID: 0 for, 1 against (not resolved)", "holds")
    assert rows["residual"][1] == "mixed" and "FID: 2 for, 2 against (mixed)" in rows["residual"][0]
    assert rows["schedule"][1] == "not resolved" and "tau: 0 for, 1 against" in rows["schedule"][0]
    # planted: G* worse in every pair reverses the claim
    for row in result["comparisons"]:
        if row["differs_in"] == "residual":
            row["a_minus_b"]["fid"] = difference(-0.5, 0.2)
    assert {c.aspect: said for c, _, said in claim_rows(result)}["residual"] == "reverses"
    table = claims_table(result)
    assert table[2] == "| claim | from | what the study shows | verdict |"
    assert sum(line.startswith("| ") for line in table) == 1 + len(claim_rows(result))  # the header, then a row each


def test_dominance_claims_compare_families_per_panel_against_their_reference():
    """COOL-SD against LANTERN++ on chain:5 (study()): COOL-SD beats 1 of 2 LANTERN++ points on the log-likelihood
    distance and LANTERN++ 2 of 4 COOL-SD ones: neither dominates. COOL-SD against GSD on Jacobi windows of 8, read
    against AR: COOL-SD's point beats both GSD points, neither beats it: holds."""
    result = study()
    result["runs"] += [jacobi_run("gsd", "jacobi:8:point", 3.0, 0.05), jacobi_run("gsd", "jacobi:8:point", 3.1, 0.06),
                       jacobi_run("cool", "jacobi:8:coupled", 3.2, -0.04)]
    result["runs"][-2]["label"] = "gsd:residual=gstar @ jacobi:8:point"
    rows = {claim.families: (shows, said) for claim, shows, said in claim_rows(result) if claim.families}
    cool_lantern, cool_gsd = rows["cool", "lantern"], rows["cool", "gsd"]
    assert cool_lantern[1] == "mixed" and ("chain:5, log-likelihood gap to Eagle-1: 1 of 2 LANTERN++ points beaten, "
                                           "2 of 4 COOL-SD (mixed)") in cool_lantern[0]
    assert cool_gsd == ("jacobi:8, log-likelihood gap to AR: 2 of 2 GSD points beaten, 0 of 1 COOL-SD (holds)",
                        "holds")
    assert len(CLAIMS) == 8 and {c.aspect for c in CLAIMS} >= {"annealing", "residual", "schedule", "refresh",
                                                             "lossless_source", "relaxed_source"}
