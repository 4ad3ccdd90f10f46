"""Paired bootstrap intervals (coolsd.core.stats.bootstrap_interval): they cover a known difference at about
their level, and pairing removes the spread two methods share (what makes 1,000 images enough to rank them)."""

import numpy as np

from coolsd.core.stats import bootstrap_interval


def sample(rng, n=200, shift=0.3, shared=1.0, own=0.2):
    """Paired per-image values of two methods: a large spread the images share, a small own noise."""
    common = rng.normal(0, shared, n)
    return common + shift + rng.normal(0, own, n), common + rng.normal(0, own, n)


def test_interval_covers_the_true_difference_at_its_level():
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(200):
        a, b = sample(rng)
        ci = bootstrap_interval(len(a), lambda i: a[i].mean() - b[i].mean(), resamples=400, seed=trial)
        covered += ci["low"] <= 0.3 <= ci["high"]
    # 95% nominal: binomial(200, 0.95) lies in [181, 197] with probability > 99.9%
    assert 181 <= covered <= 197, covered


def test_pairing_narrows_the_interval_and_resolves_the_difference():
    a, b = sample(np.random.default_rng(2), shift=0.1)
    paired = bootstrap_interval(len(a), lambda i: a[i].mean() - b[i].mean())
    rng = np.random.default_rng(3)  # unpaired: each method's images resampled independently
    unpaired = np.quantile([a[rng.integers(0, 200, 200)].mean() - b[rng.integers(0, 200, 200)].mean()
                            for _ in range(2000)], [0.025, 0.975])
    assert paired["low"] > 0  # resolved
    assert unpaired[0] < 0 < unpaired[1]  # the same data, unpaired, cannot tell
    assert (paired["high"] - paired["low"]) < 0.4 * (unpaired[1] - unpaired[0])
    assert paired["value"] == a.mean() - b.mean()


def test_interval_of_a_ratio_of_medians():
    """Speed-up style statistics (median / median) work the same way, on the same indices."""
    rng = np.random.default_rng(4)
    ar = rng.lognormal(np.log(200), 0.1, 300)
    method = ar / 1.5 * rng.lognormal(0, 0.05, 300)
    ci = bootstrap_interval(300, lambda i: np.median(ar[i]) / np.median(method[i]))
    assert ci["low"] < 1.5 < ci["high"] and ci["high"] - ci["low"] < 0.1
