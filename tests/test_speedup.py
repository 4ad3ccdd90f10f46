"""The one definition of a speed-up over AR (coolsd.core.stats.speedup_over_ar), shared by the bench's table and
JSON and the app's timing table: AR's median latency / the run's, bracketed by the lowest and highest paired
ratio, a bracket that holds it whatever the latencies (the quartiles of the ratios did not)."""

import numpy as np
import pytest

from coolsd.core.stats import speedup_over_ar


def test_speedup_is_the_ratio_of_medians_and_its_bracket_the_paired_ratios_extremes():
    ar, run = [0.30, 0.10, 0.20, 0.50], [0.10, 0.08, 0.05, 0.40]
    assert speedup_over_ar(ar, run) == pytest.approx((0.25 / 0.09, 1.25, 4.0))


def test_the_bracket_holds_the_speedup_where_quartiles_of_the_ratios_do_not():
    rng = np.random.default_rng(0)
    quartiles_missed = 0
    for trial in range(3000):
        n = int(rng.integers(1, 12))
        shared = rng.lognormal(0, 1.0, n)  # images differ a lot; each run adds its own heavy-tailed noise
        ar = shared * rng.lognormal(1.0, 0.6, n) * 0.1
        run = shared * rng.lognormal(0.0, 0.6, n) * 0.1
        headline, low, high = speedup_over_ar(list(ar), list(run))
        ratios = ar / run
        assert headline == pytest.approx(np.median(ar) / np.median(run))
        assert (low, high) == (pytest.approx(ratios.min()), pytest.approx(ratios.max()))
        assert low <= headline <= high, (trial, ar, run)
        q1, q3 = np.percentile(ratios, [25, 75])
        quartiles_missed += not q1 <= headline <= q3
    assert quartiles_missed > 0  # the former bracket: a headline outside its own bracket happens


def test_unpaired_latencies_are_refused():
    with pytest.raises(ValueError, match="pairs AR's latencies"):
        speedup_over_ar([0.1, 0.2], [0.1])
    with pytest.raises(ValueError):
        speedup_over_ar([], [])
