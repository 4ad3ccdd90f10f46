"""How likely the target finds an image: the low-noise quality measure of a method (spec section 1's transform).

One teacher-forced forward over prefix + image gives ``log p(x_i | x_<i, condition)`` for every token, with the
same guidance, filtering and temperature as sampling. For a lossless method its mean estimates the target's own
(negative) entropy rate; a relaxation that accepts tokens the target finds less likely lowers it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .interface import Target, allowed_tokens, stack_rows
from .sampling import SamplingConfig, probabilities


@torch.inference_mode()
def images_log_likelihoods(target: Target, conditions: Sequence[Any], images: Sequence[list[int]],
                           sampling: SamplingConfig) -> np.ndarray:
    """(B, N) float64 ``log p(x_i | x_<i)`` of each image under the sampling transform, in one forward over the
    batch's rows (conditional rows of every image first); ``-inf`` where filtering excluded x_i."""
    device, rows = target.device, sampling.rows
    prefixes = [target.prefix(condition, rows) for condition in conditions]
    length, count = prefixes[0].length, len(images[0])
    tokens = torch.tensor([list(image) for image in images], device=device)  # (B, N)
    embeds = target.embed(tokens[:, :-1])
    inputs = torch.cat([stack_rows([prefix.embeds for prefix in prefixes]),
                        torch.cat([embeds] * rows) if len(images) > 1 else embeds.expand(rows, -1, -1)], dim=1)
    valid = None
    if prefixes[0].valid is not None:  # a padded caption: its mask, then every image position is a real key
        keys = stack_rows([prefix.valid for prefix in prefixes])
        valid = torch.cat([keys, torch.ones(len(keys), count - 1, dtype=torch.bool, device=device)], dim=1)
    hidden = target(inputs, torch.arange(length + count - 1, device=device), valid=valid)
    allowed = allowed_tokens(target, torch.arange(count, device=device))  # masked as sampled (spec section 8)
    logits = target.logits(hidden[:, length - 1:]).unflatten(0, (rows, len(images)))  # position P-1+i: x_i
    chosen = probabilities(logits, sampling, allowed).gather(-1, tokens[..., None])[..., 0]
    with np.errstate(divide="ignore"):
        return np.log(chosen.double().cpu().numpy())


def token_log_likelihoods(target: Target, condition: Any, tokens: list[int], sampling: SamplingConfig) -> np.ndarray:
    """(N,) float64 ``log p(x_i | x_<i)`` of one image (:func:`images_log_likelihoods` of one)."""
    return images_log_likelihoods(target, [condition], [tokens], sampling)[0]


def mean_log_likelihood(target: Target, condition: Any, tokens: list[int], sampling: SamplingConfig) -> float:
    """Nats per token (higher: more likely under the target)."""
    return float(np.mean(token_log_likelihoods(target, condition, tokens, sampling)))
