"""``coolsd.bench --profile``: every part of a round is timed, and the implied speed-ups follow from the parts by
the cost model (checked by recomputing them here; no timing is asserted)."""

import json

from coolsd.cli import bench

PARTS = ["ar_step", "verify chain:5", "acceptance chain:5", "verify tree:eagle25", "acceptance tree:eagle25",
         "verify tree:wide57", "acceptance tree:wide57", "drafter_level", "image_decode"]


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
    for spec, depth in (("chain:5", 5), ("tree:eagle25", 5), ("tree:wide57", 5)):
        round_s = seconds[f"verify {spec}"] + depth * seconds["drafter_level"] + seconds[f"acceptance {spec}"]
        row = result["implied"][spec]
        assert abs(row["round_over_ar_step"] - round_s / seconds["ar_step"]) < 1e-9
        assert abs(row["at tau 3.34 (COOL-SD delta=2)"] - 3.34 * seconds["ar_step"] / round_s) < 1e-9
    measured = result["measured"]
    assert set(measured) == {"AR", "Eagle-1 chain:5", "COOL-SD delta=2 chain:5"} and measured["AR"]["tau"] == 1.0
    assert measured["Eagle-1 chain:5"]["tau"] > 1.0
    printed = capsys.readouterr().out
    assert "implied at tau 2.42" in printed and "whole images (measured)" in printed
