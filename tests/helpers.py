"""Small models and exact reference distributions shared by the tests."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from coolsd.bundle import Bundle
from coolsd.model import Drafter, ModelConfig, Transformer
from coolsd.sampling import SamplingConfig, probabilities


def peaky_bundle(cfg: ModelConfig, seed: int = 0, std: float = 0.5) -> Bundle:
    """Random target and drafter with large weights, so p and q are far from uniform and from each other."""
    torch.manual_seed(seed)
    target, drafter = Transformer(cfg).eval(), Drafter(cfg).eval()
    with torch.no_grad():
        for module in (target, drafter):
            for name, param in module.named_parameters():
                if "norm" not in name:
                    param.normal_(0, std)
    codebook = nn.functional.normalize(torch.randn(cfg.vocab_size, 4), dim=-1)
    return Bundle(target, drafter, codebook, name="peaky")


def exact_distribution(target: Transformer, class_id: int, sampling: SamplingConfig) -> dict[tuple, float]:
    """P(x_1..x_N) of every token sequence, from uncached forwards over all prefixes (vanilla AR's law)."""
    cfg = target.config
    n, vocab = cfg.image_tokens, cfg.vocab_size
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=n)))
    rows = sampling.rows
    labels = torch.tensor([class_id, cfg.null_class][:rows])
    with torch.no_grad():
        prefixes = seqs[::vocab]  # each distinct x_1..x_{N-1}
        inputs = torch.cat([target.sequence_inputs(labels.repeat_interleave(len(prefixes)),
                                                   prefixes.repeat(rows, 1))], dim=0)
        hidden = target(inputs, torch.arange(n))
        logits = target.output(hidden).view(rows, len(prefixes), n, vocab)
        probs = probabilities(logits, sampling).double()  # (prefixes, n, V)
    law = {}
    for i, seq in enumerate(seqs.tolist()):
        prefix = probs[i // vocab]
        law[tuple(seq)] = float(np.prod([prefix[t, seq[t]].item() for t in range(n)]))
    return law


def chi_square_pvalue(samples: list[tuple], law: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Pearson's test of ``samples`` against ``law``; cells expected below ``min_expected`` are pooled."""
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    n = len(samples)
    stat, cells, pool_obs, pool_exp = 0.0, 0, 0, 0.0
    for seq, prob in law.items():
        expected, observed = n * prob, counts.get(seq, 0)
        if expected < min_expected:
            pool_obs += observed
            pool_exp += expected
        else:
            stat += (observed - expected) ** 2 / expected
            cells += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        cells += 1
    dof = cells - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
