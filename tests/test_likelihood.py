"""The target's log-likelihood of an image (coolsd.core.likelihood) against laws computed independently: the
enumerated AR law of test_laws (class model; guidance, top-k, top-p, temperature) and of test_prefix (text model
with a padded caption). Sum over tokens = log P(image) under the sampling transform, image by image."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_laws import CLASS_ID, TinyWorld, vanilla_law
from test_laws import bundle as law_bundle  # noqa: F401  (a fixture)
from test_prefix import ENUM, GUIDED, PADDED, caption, enumerated_law
from test_prefix import bundle as text_bundle

from coolsd.core.likelihood import mean_log_likelihood, token_log_likelihoods
from coolsd.core.sampling import SamplingConfig

SAMPLINGS = {"plain": SamplingConfig(), "filtered": SamplingConfig(cfg_scale=2.0, top_k=3, top_p=0.9, temperature=1.3)}


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_log_likelihood_is_the_enumerated_law(law_bundle, name):  # noqa: F811
    sampling = SAMPLINGS[name]
    law = vanilla_law(TinyWorld(law_bundle, CLASS_ID, sampling))
    images = sorted(law)[:: max(1, len(law) // 40)]  # about 40 images spread over the law
    excluded = 0
    for image in images:
        got = token_log_likelihoods(law_bundle.target, CLASS_ID, list(image), sampling)
        assert got.shape == (len(image),)
        if law[image] > 0:
            assert got.sum() == pytest.approx(math.log(law[image]), abs=1e-4)
            assert mean_log_likelihood(law_bundle.target, CLASS_ID, list(image), sampling) == pytest.approx(
                math.log(law[image]) / len(image), abs=1e-4)
        else:
            excluded += 1
            assert got.sum() == -math.inf
    if name == "filtered":  # top-k 3 of the vocabulary excludes some images: they get -inf, not a number
        assert excluded > 0


def test_log_likelihood_of_a_padded_caption_is_the_masked_law():
    model = text_bundle(ENUM)
    cap = caption(PADDED)
    law = enumerated_law(model.target, cap, GUIDED)
    unmasked = enumerated_law(model.target, cap, GUIDED, masked=False)
    images = sorted(law)[::50]
    got = np.array([token_log_likelihoods(model.target, cap, list(image), GUIDED).sum() for image in images])
    want = np.log([law[image] for image in images])
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(got - np.log([unmasked[image] for image in images])).max() > 1e-2  # the mask matters here
