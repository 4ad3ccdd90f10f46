"""Self-distilled training data: the target samples whole images for random conditions in batches (one KV-cached
AR loop per batch, its own sampling settings, both CFG rows) and records its final-normed features. Given images
(real data, as the shipped model's drafter is trained) get the same record from one teacher-forced pass.

A batch of images is a :class:`Shard`. Shards stay in memory (on the training device) when the whole set is small
enough, else they are written to disk and read back one at a time; either way training visits them in the same
order (:class:`BatchPlan`), so the two give identical batches.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..core.interface import Drafter, Target, allowed_tokens, stack_rows
from ..core.sampling import SamplingConfig, probabilities


@dataclass
class Shard:
    """``n`` self-distilled sequences. ``tokens`` (n, N) the sampled image; ``features`` (n, 2, P + N - 1, dim)
    the target's final-normed features at positions 0..P+N-2 for the conditional (0) and unconditional (1) row;
    ``lead`` (n, 2, P - 1, dim) the drafter's next inputs at prefix slots 0..P-2 (empty for a class model);
    ``taps`` (n, 2, P + N - 1, k * dim), for an EAGLE-3 drafter only, the inputs of the ``k`` target layers it
    reads, at the same positions (None otherwise)."""

    tokens: Tensor
    features: Tensor
    lead: Tensor
    taps: Tensor | None = None

    FIELDS = ("tokens", "features", "lead", "taps")

    def parts(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.FIELDS if getattr(self, name) is not None}

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def take(self, rows: Tensor) -> Shard:
        rows = rows.to(self.tokens.device)
        return Shard(**{name: value[rows] for name, value in self.parts().items()})

    def to(self, device: torch.device | str) -> Shard:
        return Shard(**{name: value.to(device) for name, value in self.parts().items()})

    @staticmethod
    def cat(shards: Sequence[Shard]) -> Shard:
        if len(shards) == 1:
            return shards[0]
        return Shard(**{name: torch.cat([s.parts()[name] for s in shards]) for name in shards[0].parts()})

    def save(self, path: Path) -> None:
        """Write atomically (a half-written shard never looks finished)."""
        temporary = path.with_suffix(".tmp")
        save_file({name: value.contiguous().cpu() for name, value in self.parts().items()}, temporary)
        temporary.replace(path)

    @staticmethod
    def load(path: Path) -> Shard:
        return Shard(**load_file(path))


def bytes_per_image(target: Target, dim: int, dtype: torch.dtype, taps: int = 0) -> int:
    """Memory one self-distilled image takes (features, lead inputs and ``taps`` tapped layers of both rows,
    and its tokens)."""
    p, n = target.prefix_length, target.image_tokens
    return 2 * ((1 + taps) * (p + n - 1) + p - 1) * dim * torch.finfo(dtype).bits // 8 + 8 * n


# --- conditions ----------------------------------------------------------------------------------------------

def draw_conditions(num_classes: int, prompts: Sequence[str] | None, count: int, seed: int) -> list[int | str]:
    """``count`` conditions drawn uniformly: class indices, or prompts from ``prompts`` (text models)."""
    generator = torch.Generator().manual_seed(seed)
    if prompts:
        return [prompts[i] for i in torch.randint(len(prompts), (count,), generator=generator).tolist()]
    return torch.randint(num_classes, (count,), generator=generator).tolist()


def encode_conditions(specs: Sequence[int | str], encoder: Callable[[list[str]], list] | None) -> list[Any]:
    """Class indices pass through; prompts become the model's Caption conditions through its text encoder."""
    if not specs or not isinstance(specs[0], str):
        return list(specs)
    if encoder is None:
        raise ValueError("this text-to-image model has no text encoder (t5 in its model.json) to encode prompts")
    return list(encoder(list(specs)))


# --- generation ----------------------------------------------------------------------------------------------

def causal(length: int, device: torch.device) -> Tensor | None:
    """The pending-area mask of ``length`` positions in a row (None for one position, which sees everything)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril() if length > 1 else None


def batch_prefix(target: Target, conditions: Sequence[Any]) -> tuple[Tensor, Tensor | None]:
    """Prefix embeddings (2B, P, dim) with every conditional row first, then the unconditional ones, and the
    padding mask (2B, P) when the prefix has one."""
    prefixes = [target.prefix(condition, 2) for condition in conditions]
    embeds = stack_rows([p.embeds for p in prefixes])
    return embeds, stack_rows([p.valid for p in prefixes]) if prefixes[0].valid is not None else None


def by_image(rows: Tensor) -> Tensor:
    """(2B, ...) with conditional rows first -> (B, 2, ...)."""
    return rows.unflatten(0, (2, -1)).transpose(0, 1).contiguous()


@torch.no_grad()  # not inference mode: the shards are training inputs
def generate_shard(target: Target, drafter: Drafter, conditions: Sequence[Any], sampling: SamplingConfig,
                   generator: torch.Generator) -> Shard:
    """Sample one image per condition, all in one batched AR loop with the target's KV cache, and keep the
    features the loop computes (they are the teacher-forced features of the sampled tokens). Both CFG rows are
    always run, so the unconditional features exist even when the model samples without guidance."""
    p, n, device, taps = target.prefix_length, target.image_tokens, target.device, drafter.target_layers
    embeds, valid = batch_prefix(target, conditions)
    cache = target.new_cache(embeds.shape[0], p + n)
    hidden, tapped = with_taps(target(embeds, torch.arange(p, device=device), cache, 0, causal(p, device), valid,
                                      taps=taps))
    cache.commit(list(range(p)))
    features, tapped_features, tokens = [hidden], [tapped], []
    for i in range(n):
        allowed = allowed_tokens(target, torch.tensor([i], device=target.device))  # spec section 8
        probs = probabilities(target.logits(features[-1][:, -1]).unflatten(0, (2, -1)), sampling,
                              None if allowed is None else allowed[0])
        token = torch.multinomial(probs, 1, generator=generator)[:, 0]
        tokens.append(token)
        if i == n - 1:
            break
        step = target.embed(token).repeat(2, 1)[:, None]
        hidden, tapped = with_taps(target(step, torch.tensor([p + i], device=device), cache, 0, taps=taps))
        features.append(hidden)
        tapped_features.append(tapped)
        cache.commit([0])
    lead = drafter.lead_inputs(embeds)
    return Shard(torch.stack(tokens, 1), by_image(torch.cat(features, 1)), by_image(lead.to(hidden.dtype)),
                 by_image(torch.cat(tapped_features, 1)) if taps else None)


def with_taps(output: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    """A target forward's output as (features, taps or None)."""
    return output if isinstance(output, tuple) else (output, None)


# --- storage and batch order -----------------------------------------------------------------------------------

class ShardStore:
    """The self-distilled shards, resident on ``device`` (``folder`` None) or as files in ``folder``."""

    def __init__(self, device: torch.device, folder: Path | None = None) -> None:
        self.device, self.folder = device, folder
        self.sizes: list[int] = []
        self.resident: list[Shard] = []
        self.loaded: dict[int, Shard] = {}  # the last shards read from disk (training walks them in order)

    def path(self, index: int) -> Path:
        return self.folder / f"shard-{index:05d}.safetensors"

    def add(self, shard: Shard) -> None:
        if self.folder is None:
            self.resident.append(shard.to(self.device))
        else:
            shard.save(self.path(len(self.sizes)))
        self.sizes.append(len(shard))

    def add_existing(self, size: int) -> None:
        """Count a shard already on disk (a resumed run)."""
        self.sizes.append(size)

    def shard(self, index: int) -> Shard:
        if self.folder is None:
            return self.resident[index]
        if index not in self.loaded:
            if len(self.loaded) >= 2:
                self.loaded.pop(next(iter(self.loaded)))
            self.loaded[index] = Shard.load(self.path(index)).to(self.device)
        return self.loaded[index]

    def gather(self, items: Sequence[tuple[int, int]]) -> Shard:
        """The (shard, row) items in order, as one batch on ``device``."""
        parts, start = [], 0
        while start < len(items):
            index = items[start][0]
            end = start
            while end < len(items) and items[end][0] == index:
                end += 1
            rows = torch.tensor([row for _, row in items[start:end]])
            parts.append(self.shard(index).take(rows))
            start = end
        return Shard.cat(parts)

    def __len__(self) -> int:
        return sum(self.sizes)


class BatchPlan:
    """Which (shard, row) items make up training step ``s``: each epoch visits the shards in a shuffled order and
    the rows of each shard shuffled, reproducibly from ``seed`` and the epoch. The data position is the step."""

    def __init__(self, sizes: Sequence[int], batch: int, seed: int) -> None:
        self.sizes, self.batch, self.seed = list(sizes), batch, seed
        self.steps_per_epoch = math.ceil(sum(self.sizes) / batch)
        self.cached: tuple[int, list[tuple[int, int]]] | None = None

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        if self.cached is None or self.cached[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = []
            for index in torch.randperm(len(self.sizes), generator=generator).tolist():
                order += [(index, row) for row in torch.randperm(self.sizes[index], generator=generator).tolist()]
            self.cached = (epoch, order)
        return self.cached[1]

    def items(self, step: int) -> list[tuple[int, int]]:
        epoch, position = divmod(step, self.steps_per_epoch)
        return self.epoch_order(epoch)[position * self.batch:(position + 1) * self.batch]


def shard_sizes(images: int, per_shard: int) -> list[int]:
    """Images per generation batch (= shard): full ones, then the remainder."""
    return [min(per_shard, images - start) for start in range(0, images, per_shard)]


def shard_seed(seed: int, index: int) -> int:
    """Each shard's own seed (its conditions and its sampling), so a shard can be made again on its own."""
    return seed * 1_000_003 + 7919 * (index + 1)


def check_folder(folder: Path, description: dict) -> None:
    """Shards already in ``folder`` must come from the same settings; a new folder records them."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / "data.json"
    if meta.exists():
        found = json.loads(meta.read_text())
        if found != description:
            changed = sorted(k for k in set(found) | set(description) if found.get(k) != description.get(k))
            raise ValueError(f"{folder} holds shards made with other settings ({', '.join(changed)}); remove it or "
                             "choose another --work folder")
    else:
        meta.write_text(json.dumps(description, indent=2) + "\n")


@torch.no_grad()
def teacher_forced_shard(target: Target, drafter: Drafter, conditions: Sequence[Any], tokens: Tensor) -> Shard:
    """The same record for given images (real data): one teacher-forced pass over both rows, no sampling."""
    p, n, device = target.prefix_length, target.image_tokens, target.device
    embeds, valid = batch_prefix(target, conditions)
    tokens = tokens.to(device)
    inputs = torch.cat([embeds, target.embed(tokens[:, :-1]).repeat(2, 1, 1)], 1)
    if valid is not None:
        valid = torch.cat([valid, torch.ones(valid.shape[0], n - 1, dtype=torch.bool, device=device)], 1)
    taps = drafter.target_layers
    hidden, tapped = with_taps(target(inputs, torch.arange(p + n - 1, device=device), valid=valid, taps=taps))
    return Shard(tokens, by_image(hidden), by_image(drafter.lead_inputs(embeds).to(hidden.dtype)),
                 by_image(tapped) if taps else None)


def make_data(bundle: Any, drafter: Drafter, images: int, per_shard: int, seed: int, folder: Path | None,
              prompts: Sequence[str] | None = None, progress: bool = True,
              given: tuple[Sequence[Any], Tensor] | None = None) -> ShardStore:
    """Generate ``images`` self-distilled images in shards of ``per_shard`` (kept on the target's device when
    ``folder`` is None, else written there; shards a previous run finished in ``folder`` are kept). ``given``
    (conditions, tokens (images, N)): record the target's features of these images instead of sampling."""
    from tqdm import tqdm

    target = bundle.target
    store = ShardStore(target.device, folder)
    bar = tqdm(total=images, desc="self-distilled images" if given is None else "target features", unit="img",
               disable=not progress, dynamic_ncols=True)
    for index, size in enumerate(shard_sizes(images, per_shard)):
        if folder is not None and store.path(index).exists():
            store.add_existing(size)
        elif given is not None:
            start = index * per_shard
            conditions = encode_conditions(given[0][start:start + size], bundle.text_encoder)
            store.add(teacher_forced_shard(target, drafter, conditions, given[1][start:start + size]))
        else:
            specs = draw_conditions(bundle.config.num_classes, prompts, size, shard_seed(seed, index))
            generator = torch.Generator(target.device).manual_seed(shard_seed(seed, index))
            conditions = encode_conditions(specs, bundle.text_encoder)
            store.add(generate_shard(target, drafter, conditions, bundle.sampling, generator))
        bar.update(size)
    bar.close()
    return store
