"""Eagle-1's training objective as LANTERN uses it for LlamaGen (spec section 5): from the target's feature at
slot ``s`` and the next input, predict the feature at ``s + 1``; the loss is SmoothL1 on that feature plus
``ce_weight`` (0.1) x the soft cross-entropy between the target's head on the true next feature (softmax: the
soft label) and the same head on the predicted one.

Choices written down here (docs/training.md and the model card repeat them):

* Input features get uniform noise ``U(-noise, noise)``, ``noise = 0.1``: the value the EAGLE paper states.
  (EAGLE's and LANTERN's code scale it by ``512 / sequence length``, which for LlamaGen's text model, 376
  positions, gives about 0.136; a fixed amplitude does not depend on the prefix length.) Targets are clean.
* A row is the unconditional (CFG) one with probability ``unconditional = 0.1``, chosen per image, so the drafter
  also predicts the features guidance subtracts.
* The loss counts the slots that draft image tokens, ``s >= P - 1`` (LANTERN's loss mask); earlier prefix slots
  are inputs only. SmoothL1 is averaged over the feature dimension, then both terms over those slots.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.interface import Drafter
from .data import Shard


def pick_rows(batch: Shard, unconditional: Tensor) -> tuple[Tensor, Tensor]:
    """Each image's conditional row, or its unconditional row where ``unconditional`` (B,) is True: its
    features (B, P + N - 1, dim) and lead inputs (B, P - 1, dim)."""
    row = unconditional.long().to(batch.features.device)
    index = torch.arange(len(batch), device=row.device)
    return batch.features[index, row], batch.lead[index, row]


def uniform_noise(like: Tensor, amplitude: float, generator: torch.Generator) -> Tensor:
    """``U(-amplitude, amplitude)`` of ``like``'s shape, drawn from ``generator``, in float32."""
    draw = torch.rand(like.shape, generator=generator, device=like.device, dtype=torch.float32)
    return (2 * draw - 1) * amplitude


def input_noise(drafter: Drafter, features: Tensor, amplitude: float, generator: torch.Generator) -> Tensor:
    """The training noise on the input features; zero at padding slots for a drafter that recognises padding by
    its zero features (LANTERN's Chameleon drafter), so they stay padding."""
    noise = uniform_noise(features, amplitude, generator)
    if getattr(drafter, "padding_from_zero_features", False):
        noise = noise * (features.abs().amax(-1, keepdim=True) > 0)
    return noise


def training_inputs(drafter: Drafter, batch: Shard, features: Tensor, lead: Tensor) -> tuple[Tensor, Tensor]:
    """Slot inputs and their true next features: slot ``s`` pairs the feature at ``s`` with the next input (the
    lead inputs at prefix slots, then image tokens 0..N-2), and should predict the feature at ``s + 1``."""
    inputs = torch.cat([lead.float(), drafter.embed(batch.tokens[:, :-1]).float()], dim=1)
    return inputs, features[:, 1:].float()


def eagle_loss(predicted: Tensor, true_next: Tensor, head: Callable[[Tensor], Tensor],
               ce_weight: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """SmoothL1(predicted, true next feature) + ``ce_weight`` x soft CE(softmax(head(true)), head(predicted)),
    both averaged over the slots given (B, T, dim). Returns the loss and its two terms (detached)."""
    feature = F.smooth_l1_loss(predicted.float(), true_next, reduction="none").mean(-1).mean()
    with torch.no_grad():
        soft_label = head(true_next).float().softmax(-1)
    soft_ce = -(soft_label * head(predicted).float().log_softmax(-1)).sum(-1).mean()
    return feature + ce_weight * soft_ce, {"feature": feature.detach(), "soft_ce": soft_ce.detach()}


def step_loss(drafter: Drafter, head: Callable[[Tensor], Tensor], batch: Shard, prefix_length: int,
              generator: torch.Generator, noise: float = 0.1, unconditional: float = 0.1,
              ce_weight: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """One training batch's loss: pick rows, add input noise, run the drafter without a cache over every slot,
    score the slots from ``P - 1`` on. Random draws, in order: the unconditional choice, then the noise."""
    device = batch.features.device
    choose = torch.rand(len(batch), generator=generator, device=device) < unconditional
    features, lead = pick_rows(batch, choose)
    inputs, true_next = training_inputs(drafter, batch, features, lead)
    noisy = features[:, :-1].float() + input_noise(drafter, features[:, :-1], noise, generator)
    positions = torch.arange(noisy.shape[1], device=device)
    predicted = drafter(inputs, noisy, positions)
    start = prefix_length - 1
    return eagle_loss(predicted[:, start:], true_next[:, start:], head, ce_weight)
