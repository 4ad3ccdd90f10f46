"""The drafters' training objectives.

Eagle-1's, as LANTERN uses it for LlamaGen (spec section 5): from the target's feature at slot ``s`` and the next
input, predict the feature at ``s + 1``; the loss is SmoothL1 on that feature plus ``ce_weight`` (0.1) x the soft
cross-entropy between the target's head on the true next feature (softmax: the soft label) and the same head on
the predicted one.

EAGLE-3's (:func:`ttt_loss`, after ``SafeAILab/EAGLE``'s ``traineagle3``): training-time test. Step 0 reads the
target's taps; step ``k`` reads the drafter's own step ``k - 1`` prediction at the same slot, with the next
inputs shifted by ``k``, and attends as a chain draft's depth-``k`` node does (the true slots up to ``s``, its own
earlier steps at ``s``, itself). Only the soft cross-entropy against the target's distribution at the predicted
position counts (no feature regression), step ``k`` weighted ``0.8 ** k``.

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
from ..models.cache import hide_invalid_keys
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


def level_mask(slots: int, level: int, device: torch.device) -> Tensor:
    """Pending-area mask (slots, level * slots) of draft step ``level`` >= 1 over ``slots`` slots: slot ``s`` sees
    the true slots up to ``s``, its own slot at the earlier steps, and itself (a chain draft's attention)."""
    index = torch.arange(slots, device=device)
    mask = torch.zeros(slots, level * slots, dtype=torch.bool, device=device)
    mask[:, :slots] = index[None, :] <= index[:, None]
    for earlier in range(1, level):
        mask[index, earlier * slots + index] = True
    return mask


class GrowingKeys:
    """A training stand-in for a drafter's KV cache: each step's keys and values are appended, layer by layer, by
    concatenation (no in-place write, so gradients flow through every step), and a step's mask is the one it is
    given, with the keys a drafter marked invalid (padding) hidden as the cache hides them."""

    def __init__(self) -> None:
        self.keys: dict[int, tuple[Tensor, Tensor]] = {}
        self.valid: Tensor | None = None

    def mark_valid(self, valid: Tensor, offset: int) -> None:
        self.valid = valid if self.valid is None else torch.cat([self.valid, valid], 1)

    def write(self, layer: int, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        if layer in self.keys:
            k, v = (torch.cat([old, new], 2) for old, new in zip(self.keys[layer], (k, v)))
        self.keys[layer] = (k, v)
        return k, v

    def attention_mask(self, pending_mask: Tensor | None, length: int, offset: int = 0) -> Tensor | None:
        return pending_mask if self.valid is None else hide_invalid_keys(pending_mask, self.valid, length)


TTT_DECAY = 0.8  # EAGLE-3's per-step weight


def ttt_features(drafter: Drafter, inputs: Tensor, taps: Tensor, steps: int) -> list[Tensor]:
    """The drafter's predicted features (B, slots, dim) at each of ``steps`` training-time test steps, over every
    slot at once: step 0 reads the target's ``taps`` (B, slots, k * dim) with ``inputs`` (B, slots, dim), the
    next input of each slot; step ``k`` reads step ``k - 1``'s prediction at the same slot with the input ``k``
    slots on, at rotary position ``s + k``, and attends as a chain draft's depth-``k`` node (:func:`level_mask`).
    Slots past the end are clamped to the last (their predictions are never scored)."""
    slots, device = inputs.shape[1], inputs.device
    index, cache, hidden, out = torch.arange(slots, device=device), GrowingKeys(), taps, []
    for step in range(steps):
        shifted = (index + step).clamp(max=slots - 1)
        hidden = drafter(inputs[:, shifted], hidden, shifted, cache, step * slots, level_mask(slots, step + 1, device))
        out.append(hidden)
    return out


def ttt_loss(drafter: Drafter, head: Callable[[Tensor], Tensor], batch: Shard, prefix_length: int,
             generator: torch.Generator, steps: int, noise: float = 0.0,
             unconditional: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """EAGLE-3's training-time test over ``steps`` steps: sum over steps ``k`` of ``0.8 ** k`` x the soft CE of
    the drafter's step-``k`` distribution at slot ``s`` (it predicts position ``s + k + 2``'s token) against the
    target head's softmax on its true feature at ``s + k + 1``, averaged over slots ``P - 1 <= s`` with
    ``s + k + 1`` inside the sequence. Random draws, in order: the unconditional choice, then the noise (on the
    taps)."""
    device = batch.features.device
    choose = torch.rand(len(batch), generator=generator, device=device) < unconditional
    features, lead = pick_rows(batch, choose)
    taps = batch.taps[torch.arange(len(batch), device=device), choose.long().to(device)][:, :-1].float()
    inputs, true_next = training_inputs(drafter, batch, features, lead)
    with torch.no_grad():
        labels = head(true_next).float().softmax(-1)  # (B, slots, V): the target's distribution after slot s
    noisy = taps + input_noise(drafter, taps, noise, generator) if noise else taps
    start, slots = prefix_length - 1, inputs.shape[1]
    total, terms = 0.0, {}
    for step, predicted in enumerate(ttt_features(drafter, inputs, noisy, min(steps, slots - start))):
        log_q = drafter.logits(predicted[:, start:slots - step], head).float().log_softmax(-1)
        soft_ce = -(labels[:, start + step:] * log_q).sum(-1).mean()
        total = total + TTT_DECAY ** step * soft_ce
        terms[f"soft_ce_{step}"] = soft_ce.detach()
    return total, terms


def training_loss(drafter: Drafter, head: Callable[[Tensor], Tensor], batch: Shard, prefix_length: int,
                  generator: torch.Generator, config) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of the drafter's kind for a :class:`coolsd.distill.trainer.TrainConfig`: EAGLE-3's training-time
    test for a drafter that reads target layers, else Eagle-1's."""
    if drafter.target_layers:
        return ttt_loss(drafter, head, batch, prefix_length, generator, config.ttt_steps, config.noise,
                        config.unconditional)
    return step_loss(drafter, head, batch, prefix_length, generator, config.noise, config.unconditional,
                     config.ce_weight)


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
