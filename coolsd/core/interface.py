"""What the decoding loop needs from a model: the written interface that every target, drafter and image
decoder implements (structural typing: no base class to inherit). ``coolsd.models`` holds implementations.

Sequence layout (spec section 7): a condition becomes ``P >= 1`` prefix positions (a class token; or caption
slots with a padding mask); image token ``i`` sits at position ``P + i``. Every tensor of a forward has
``rows`` batch rows: for one image, row 0 conditional and row 1 unconditional when guidance is on (spec section
1); for a batch of ``B`` images (spec section 9), ``g * B`` rows with ``g`` guidance rows per image, the
conditional rows of all images first, so row ``r`` belongs to image ``r mod B``. Positions are (T,), shared by
every row, or (rows, T) where the images of a batch stand at different lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor


@dataclass
class Prefix:
    """A condition turned into inputs: ``embeds`` (rows, P, dim) and, when some slots are padding, ``valid``
    (rows, P) bool (False = padding: no later position attends to it; it attends to itself only)."""

    embeds: Tensor
    valid: Tensor | None = None

    @property
    def length(self) -> int:
        return self.embeds.shape[1]


@dataclass(frozen=True)
class PositionRules:
    """Per generated position t (0 = the first generated token): ``kinds`` (T,) long, each position's kind;
    ``allowed`` (K, V) bool, the tokens each kind allows (a forced position's kind allows exactly one)."""

    kinds: Tensor
    allowed: Tensor

    def padded(self, extra: int, device: torch.device) -> "PositionRules":
        """On ``device``, with ``extra`` positions past the image reading the last kind (a drafted node past
        the image's end is invalid, but its distribution is still computed: no bounds check needed)."""
        kinds = torch.cat([self.kinds, self.kinds[-1:].expand(extra)])
        return PositionRules(kinds.to(device), self.allowed.to(device))

    def allowed_at(self, positions: Tensor) -> Tensor:
        """(..., V) bool: the tokens generated ``positions`` (...) allow (two lookups, on the device)."""
        kinds = self.kinds.index_select(0, positions.reshape(-1))
        return self.allowed.index_select(0, kinds).view(*positions.shape, -1)


def allowed_tokens(target: Any, positions: Tensor) -> Tensor | None:
    """(T, V) bool: what a constrained target allows at generated ``positions`` (T,), on their device; None for
    a target without position rules (spec section 8). For callers outside the decoding loop, which keeps the
    rules on its device once per workspace."""
    rules = getattr(target, "position_rules", None)
    return None if rules is None else rules.allowed_at(positions.cpu()).to(positions.device)


def stack_rows(per_image: list[Tensor]) -> Tensor:
    """Each image's rows (g, ...) -> the batch's model rows (g * B, ...), conditional rows of every image first."""
    return per_image[0] if len(per_image) == 1 else torch.stack(per_image, 1).flatten(0, 1)


class Cache(Protocol):
    """A model's key/value cache: committed positions, then a pending area a forward writes after them.
    ``commit(keep, count)`` appends the first ``count`` pending positions ``keep`` lists (indices into the
    pending area, in order; None: the first ``count`` as they are), with ``keep`` (images, W) and ``count``
    (images,) possibly on the device, one row per image; ``reset()`` empties it for the next images."""

    def commit(self, keep: "list[int] | Tensor | None", count: "Tensor | int | None" = None) -> None: ...

    def reset(self) -> "Cache": ...


@runtime_checkable
class Target(Protocol):
    """The target model ``P``. ``position_rules`` (spec section 8): None when every token may be drawn at every
    position; else what each generated position allows (structural tokens, image codes only), applied by the
    sampling transform to ``p`` and ``q`` alike. ``image_tokens`` counts every generated position."""

    prefix_length: int  # P
    image_tokens: int  # generated positions per image, structural ones included
    vocab_size: int
    device: torch.device
    position_rules: PositionRules | None

    def prefix(self, condition: Any, rows: int) -> Prefix:
        """The condition's prefix for ``rows`` rows (row 1, if asked for, is the unconditional input)."""

    def embed(self, tokens: Tensor) -> Tensor:
        """(T,) image tokens -> (T, dim) input embeddings."""

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> Cache:
        """A cache for ``rows`` rows of ``images`` images; with several images it keeps a committed length per
        image on the device, and ``commit`` takes one kept path and one count per image."""

    def __call__(self, x: Tensor, positions: Tensor, cache: Cache, offset: int = 0, mask: Tensor | None = None,
                 valid: Tensor | None = None, taps: tuple[int, ...] = ()) -> "Tensor | tuple[Tensor, Tensor]":
        """Inputs ``x`` (rows, T, dim) at sequence ``positions`` (T,) or (rows, T) -> final-normed features
        (rows, T, dim); with ``taps`` (a drafter's ``target_layers``), the pair (features, the inputs of those
        layers concatenated in layer order (rows, T, len(taps) * dim)). Asked only by an EAGLE-3 drafter.
        They see every committed cache entry and, within the pending area, what ``mask`` (T, offset + T) allows
        (None: a single new position, or causal when ``valid`` is given). ``valid`` (rows, T): key validity of
        the new positions (the prefix's padding mask), kept in the cache."""

    def logits(self, features: Tensor) -> Tensor:
        """Features -> logits over the vocabulary (the output head, shared with the drafter)."""


@runtime_checkable
class Drafter(Protocol):
    """An Eagle style drafter: from the target's (or its own predicted) feature at slot ``s`` and the next
    input's embedding, predict the feature at ``s + 1`` (spec section 5); its :meth:`logits` give draft logits.
    ``target_layers``: empty for a drafter that reads the target's final-normed features (Eagle-1); else the
    target layers whose inputs it reads, concatenated (EAGLE-3), which the target's forward then also returns
    (``taps``). Its own predicted features are as wide as the target's."""

    target_layers: tuple[int, ...]

    def logits(self, features: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        """Predicted features -> draft logits, given the target's output ``head`` (:meth:`Target.logits`)."""

    def embed(self, tokens: Tensor) -> Tensor:
        """(T,) tokens -> (T, dim) embeddings of the drafter's input (its own table, or the target's)."""

    def lead_inputs(self, prefix_embeds: Tensor) -> Tensor:
        """The next inputs paired with prefix slots 0..P-2 at the prefill, (rows, P-1, dim), given the target's
        prefix embeddings (rows, P, dim): the prefix's own next slots for our Eagle head, token 0 for LANTERN's."""

    def new_cache(self, rows: int, max_len: int, images: int = 1) -> Cache:
        """As :meth:`Target.new_cache`."""

    def __call__(self, inputs: Tensor, features: Tensor, positions: Tensor, cache: Cache, offset: int = 0,
                 mask: Tensor | None = None) -> Tensor:
        """Next-input embeddings and features (rows, T, dim) at slots ``positions`` ((T,) or (rows, T): the target
        position of each feature) -> predicted next features (rows, T, dim)."""


@runtime_checkable
class ImageDecoder(Protocol):
    """Image tokens -> picture."""

    def __call__(self, tokens: list[int]) -> np.ndarray:
        """A row-major token grid -> uint8 RGB array (H, W, 3)."""
