"""Key/value caches: :class:`KVCache`, sliced to a committed length kept on the host (one image, eager steps),
and :class:`StaticKVCache`, whose shapes never change and whose committed length per image lives on the device
(CUDA graphs, and batches of images that each commit their own number of tokens per round, spec section 9).

Both hold keys as (layers, rows, heads, slots, head_dim). A batch of ``B`` images has ``rows = g * B`` rows,
``g`` guidance rows per image, conditional rows first: row ``r`` belongs to image ``r mod B``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.transfer import index_tensor


def hide_invalid_keys(mask: Tensor, key_valid: Tensor, length: int) -> Tensor:
    """As LlamaGen's text model does: keys marked invalid (padding) are hidden from every query, and each new
    position always sees itself, so a padded slot attends to itself only (spec section 7)."""
    end = mask.shape[1]
    mask = mask[None, None] & key_valid[:, None, None, :end]
    own = torch.arange(end - length, end, device=mask.device)
    mask[..., torch.arange(length, device=mask.device), own] = True
    return mask


class KVCache:
    """Preallocated keys/values of one image. ``length`` entries are committed; a forward writes its tokens
    after them (at ``offset`` within the pending area) without committing, and ``commit`` keeps a chosen subset.
    ``valid`` (rows, max_len), present once a padded prefix was written, marks the keys others may attend to."""

    def __init__(self, n_layer: int, rows: int, n_head: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (n_layer, rows, n_head, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # each layer's part, as views made once: a forward's per-layer writes and reads then index nothing more
        self.layer_keys, self.layer_values = self.keys.unbind(0), self.values.unbind(0)
        self.length = 0
        self.valid: Tensor | None = None

    def mark_valid(self, valid: Tensor, offset: int) -> None:
        """Record the key validity (rows, T) of pending positions written at ``offset``."""
        if self.valid is None:
            self.valid = torch.ones(valid.shape[0], self.keys.shape[3], dtype=torch.bool, device=valid.device)
        start = self.length + offset
        self.valid[:, start:start + valid.shape[1]] = valid

    def write(self, layer: int, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """Store pending ``k, v`` (rows, H, T, D); return everything visible to them."""
        start = self.length + offset
        end = start + k.shape[2]
        if end > self.keys.shape[3]:
            raise ValueError(f"KV cache overflow: need {end} slots, have {self.keys.shape[3]}")
        keys, values = self.layer_keys[layer], self.layer_values[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def attention_mask(self, pending_mask: Tensor | None, length: int, offset: int = 0) -> Tensor | None:
        """What ``length`` new positions, written at ``offset`` in the pending area, see: every committed entry,
        plus ``pending_mask`` (length, offset + length) over the pending area (None = a single new position,
        which sees everything), then padding hidden (:func:`hide_invalid_keys`). None where SDPA needs no mask."""
        if pending_mask is None and self.valid is None:
            return None
        device = self.keys.device
        if pending_mask is None:
            pending_mask = torch.ones(length, offset + length, dtype=torch.bool, device=device)
        committed = torch.ones(length, self.length, dtype=torch.bool, device=device)
        mask = torch.cat([committed, pending_mask], dim=1)
        return mask if self.valid is None else hide_invalid_keys(mask, self.valid, length)

    def commit(self, keep: "list[int] | Tensor | None", count: "Tensor | int | None" = None) -> None:
        """Append pending entries and drop the rest: the first ``count`` of ``keep`` (indices into the pending
        area, in order; a list keeps all of it; a tensor may carry the engine's batch dimension of one image),
        or with ``keep`` None the first ``count`` pending entries as they are (a chain keeps a prefix, already in
        place). A tensor ``count`` is read here: this cache slices by its host-side length (the static cache
        commits on the device)."""
        n = len(keep) if isinstance(keep, list) else int(count)
        if isinstance(keep, list) and keep == list(range(n)):
            keep = None  # a prefix of the pending area: already in place
        if keep is not None:
            keep = index_tensor(keep, self.keys.device) if isinstance(keep, list) else keep.reshape(-1)[:n]
            index = keep + self.length
            self.keys[:, :, :, self.length:self.length + n] = self.keys.index_select(3, index)
            self.values[:, :, :, self.length:self.length + n] = self.values.index_select(3, index)
            if self.valid is not None:
                self.valid[:, self.length:self.length + n] = self.valid.index_select(1, index)
        self.length += n

    def reset(self) -> "KVCache":
        """Empty again (the buffers are kept)."""
        self.length, self.valid = 0, None
        return self


class StaticKVCache(KVCache):
    """A KV cache whose shapes never change, with a committed length per image: writes go to slots computed on
    the device from ``start`` (rows,), each row's committed length, and attention reads the whole buffer through
    a mask. ``images`` (B) images share it, ``rows // B`` rows each; :meth:`commit` takes one count (and one kept
    path) per image. ``length`` follows on the host only while commits are host integers (the prefill)."""

    def __init__(self, n_layer: int, rows: int, n_head: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype, images: int = 1) -> None:
        super().__init__(n_layer, rows, n_head, head_dim, max_len, device, dtype)
        if rows % images:
            raise ValueError(f"a cache of {rows} rows cannot hold {images} images")
        self.images, self.guidance_rows = images, rows // images
        self.valid = torch.ones(rows, max_len, dtype=torch.bool, device=device)
        self.start = torch.zeros(rows, dtype=torch.long, device=device)
        self.key_index = torch.arange(max_len, device=device)

    def reset(self) -> "StaticKVCache":
        """Empty again, keeping the buffers (a captured graph holds their addresses)."""
        self.length = 0
        self.start.zero_()
        self.valid.fill_(True)
        return self

    def per_row(self, per_image: Tensor) -> Tensor:
        """A per-image tensor (B, ...) repeated for every guidance row (rows, ...), conditional rows first."""
        return torch.cat([per_image] * self.guidance_rows) if self.guidance_rows > 1 else per_image

    def commit(self, keep: "list[int] | Tensor | None", count: "Tensor | int | None" = None) -> None:
        """As :meth:`KVCache.commit`, with ``keep`` (B, W) per image (padded: only the first ``count`` of a row
        matter, the rest land past its new length) and ``count`` (B,) on the device: each row's kept entries are
        gathered into place and its ``start`` advances, with nothing read to the host."""
        if isinstance(keep, list):
            super().commit(keep)
            self.start.fill_(self.length)
            return
        if keep is not None:
            keep = self.per_row(keep.reshape(self.images, -1))
            slots = self.start[:, None] + self.key_index[:keep.shape[1]]
            index = self.start[:, None] + keep
            layers, rows, heads, _, dim = self.keys.shape
            spread_slots, spread_index = (i[None, :, None, :, None].expand(layers, rows, heads, -1, dim)
                                          for i in (slots, index))
            for buffer in (self.keys, self.values):
                buffer.scatter_(3, spread_slots, buffer.gather(3, spread_index))
            self.valid.scatter_(1, slots, self.valid.gather(1, index))
        if isinstance(count, Tensor):
            self.start.add_(self.per_row(count.reshape(self.images)))
        else:
            self.start.add_(count)
            self.length += count

    def slots(self, offset: int, count: int) -> Tensor:
        """Each row's slots (rows, count) for ``count`` pending positions written at ``offset``."""
        return self.start[:, None] + (offset + self.key_index[:count])

    def mark_valid(self, valid: Tensor, offset: int) -> None:
        self.valid.scatter_(1, self.slots(offset, valid.shape[1]), valid)

    def write(self, layer: int, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        rows, heads, length, dim = k.shape
        slots = self.slots(offset, length)[:, None, :, None].expand(rows, heads, length, dim)
        keys, values = self.layer_keys[layer], self.layer_values[layer]
        keys.scatter_(2, slots, k)
        values.scatter_(2, slots, v)
        return keys, values

    def attention_mask(self, pending_mask: Tensor | None, length: int, offset: int = 0) -> Tensor:
        """The same visibility as :meth:`KVCache.attention_mask` for each row, over all ``max_len`` keys
        (rows, 1, length, max_len): committed keys, ``pending_mask`` placed at the row's pending area, valid
        keys only, and each new position's own slot."""
        width = offset + length if pending_mask is None else pending_mask.shape[1]
        relative = self.key_index - self.start[:, None]  # (rows, L): key slot relative to the pending area
        inside = (relative >= 0) & (relative < width)
        if pending_mask is None:
            pending = inside[:, None, :]
        else:
            pending = pending_mask[:, relative.clamp(0, width - 1)].transpose(0, 1) & inside[:, None, :]
        mask = (pending | (relative < 0)[:, None, :]) & self.valid[:, None, :]
        own = self.slots(width - length, length)  # (rows, length)
        return (mask | (self.key_index == own[..., None]))[:, None]


def kv_cache(n_layer: int, rows: int, n_head: int, head_dim: int, max_len: int, device: torch.device,
             dtype: torch.dtype, images: int = 1) -> KVCache:
    """The cache a model hands the decoding loop: sliced by a host length for one image, per-image lengths on
    the device for a batch (its images commit different numbers of tokens per round)."""
    if images == 1:
        return KVCache(n_layer, rows, n_head, head_dim, max_len, device, dtype)
    return StaticKVCache(n_layer, rows, n_head, head_dim, max_len, device, dtype, images)


__all__ = ["KVCache", "StaticKVCache", "hide_invalid_keys", "kv_cache"]
