"""How likely the target finds an image: the low-noise quality measure of a method (spec section 1's transform).

One teacher-forced forward over prefix + image gives ``log p(x_i | x_<i, condition)`` for every token, with the
same guidance, filtering and temperature as sampling. For a lossless method its mean estimates the target's own
(negative) entropy rate; a relaxation that accepts tokens the target finds less likely lowers it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .interface import Target, allowed_tokens
from .sampling import SamplingConfig, probabilities


@torch.inference_mode()
def token_log_likelihoods(target: Target, condition: Any, tokens: list[int], sampling: SamplingConfig) -> np.ndarray:
    """(N,) float64 ``log p(x_i | x_<i)`` under the sampling transform; ``-inf`` where filtering excluded x_i."""
    device, rows = target.device, sampling.rows
    prefix = target.prefix(condition, rows)
    length, count = prefix.length, len(tokens)
    image = torch.tensor(tokens, device=device)
    inputs = torch.cat([prefix.embeds, target.embed(image[:-1])[None].expand(rows, -1, -1)], dim=1)
    valid = None
    if prefix.valid is not None:  # a padded caption: its mask, then every image position is a real key
        valid = torch.cat([prefix.valid, torch.ones(rows, count - 1, dtype=torch.bool, device=device)], dim=1)
    hidden = target(inputs, torch.arange(length + count - 1, device=device), valid=valid)
    allowed = allowed_tokens(target, torch.arange(count, device=device))  # masked as sampled (spec section 8)
    probs = probabilities(target.logits(hidden[:, length - 1:]), sampling, allowed)  # position P-1+i predicts x_i
    chosen = probs[torch.arange(count, device=device), image].double().cpu().numpy()
    with np.errstate(divide="ignore"):
        return np.log(chosen)


def mean_log_likelihood(target: Target, condition: Any, tokens: list[int], sampling: SamplingConfig) -> float:
    """Nats per token (higher: more likely under the target)."""
    return float(np.mean(token_log_likelihoods(target, condition, tokens, sampling)))
