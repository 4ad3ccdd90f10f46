"""What a run will cost, measured before it starts: a few warm-up steps of each kind of work on the real models
and device (a generation step of a full batch at the middle of the sequence, a training step of a full batch, an
Eagle-1 round), scaled by how many of each the run needs. Runs that will not fit ``--max-hours`` are refused."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from ..core.sampling import probabilities
from ..core.stats import time_calls
from ..core.trees import parse_draft
from ..models.bundle import Bundle
from ..models.gpt import Caption, parameter_count
from .data import Shard, batch_prefix, bytes_per_image, causal, shard_sizes
from .heads import new_drafter, trainable
from .objective import training_loss
from .report import AGREEMENT_DEPTH, REPORT_DRAFTS
from .trainer import TrainConfig, autocast, data_in_memory


@dataclass(frozen=True)
class Measured:
    """Seconds per unit of work, measured on this device (median of a few runs after a warm-up)."""

    prefill: float  # the prefix forward of one generation batch
    ar_step: float  # one AR step (forward, guidance, sampling) of a generation batch, halfway through the image
    train_step: float  # one training step (forward, loss, backward, optimizer) of a training batch
    round: float  # one Eagle-1 round of tree:eagle25 at batch 1: the verification forward + 5 drafter levels
    peak_bytes: int | None = None  # CUDA memory at the peak of the warm-up steps (None on the CPU)


@dataclass(frozen=True)
class Estimate:
    generation: float
    training: float
    report: float
    data_bytes: int
    in_memory: bool
    target_parameters: int
    drafter_parameters: int
    measured: Measured

    @property
    def total(self) -> float:
        return self.generation + self.training + self.report

    def describe(self, config: TrainConfig, image_tokens: int, device: str) -> str:
        m = self.measured
        where = "in memory" if self.in_memory else "in shards on disk"
        lines = [
            f"cost estimate on {device} (measured: generation {m.ar_step * 1e3:.1f} ms/step for a batch of "
            f"{config.gen_batch}, training {m.train_step * 1e3:.1f} ms/step, Eagle-1 round {m.round * 1e3:.1f} ms)",
            f"  target {self.target_parameters:,} parameters, drafter {self.drafter_parameters:,} trained; {config.images} images x {image_tokens} tokens, {config.epochs} epochs = {config.steps} steps "
            f"of {config.batch}",
            f"  self-distillation {duration(self.generation)}, training {duration(self.training)}, quality report "
            f"at most {duration(self.report)}: total about {duration(self.total)}",
            f"  data {self.data_bytes / 2**30:.2f} GiB {where}"
            + (f"; peak CUDA memory of a step {m.peak_bytes / 2**30:.2f} GiB" if m.peak_bytes else ""),
        ]
        return "\n".join(lines)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def timed(work: Callable[[], object], device: torch.device, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall seconds of ``work`` after ``warmup`` untimed calls."""
    return statistics.median(time_calls(work, repeats, warmup, device))


def placeholder_conditions(bundle: Bundle, count: int) -> list:
    """Conditions of the right shape for timing (zero captions for a text model: no text encoder needed)."""
    cfg = bundle.config
    if cfg.text_conditioned and not cfg.caption_dim:  # prompt tokens (Chameleon): its own tokenizer, cheap
        return bundle.text_encoder(["a placeholder prompt"]) * count
    if cfg.text_conditioned:
        caption = Caption(torch.zeros(cfg.cls_token_num, cfg.caption_dim), torch.ones(cfg.cls_token_num, dtype=bool))
        return [caption] * count
    return [i % cfg.num_classes for i in range(count)]


@torch.inference_mode()
def time_generation(bundle: Bundle, rows: int) -> tuple[float, float]:
    """(prefill, AR step) seconds for a batch of ``rows`` images, the step timed with half the image cached."""
    target, device = bundle.target, bundle.device
    p, n = target.prefix_length, target.image_tokens
    embeds, valid = batch_prefix(target, placeholder_conditions(bundle, rows))
    cache = target.new_cache(2 * rows, p + n)
    prefill = timed(lambda: target(embeds, torch.arange(p, device=device), cache, 0, causal(p, device), valid), device)
    cache.length = p + n // 2
    step = target.embed(torch.zeros(rows, dtype=torch.long, device=device)).repeat(2, 1)[:, None]
    position = torch.tensor([p + n // 2], device=device)

    def ar_step() -> None:
        probs = probabilities(target.logits(target(step, position, cache)[:, -1]).unflatten(0, (2, -1)),
                              bundle.sampling)
        torch.multinomial(probs, 1)

    return prefill, timed(ar_step, device)


def time_training(bundle: Bundle, config: TrainConfig) -> float:
    """Seconds per training step on a batch of random features (a throw-away drafter and optimizer)."""
    target, device, cfg = bundle.target, bundle.device, bundle.config
    drafter = new_drafter(bundle, config.seed + 1, config.kind, config.taps).train()
    optimizer = torch.optim.AdamW(trainable(drafter), lr=config.lr)
    generator = torch.Generator(device).manual_seed(0)
    dtype = target.output.weight.dtype
    length, taps = target.prefix_length + target.image_tokens - 1, len(drafter.target_layers)
    batch = Shard(torch.randint(cfg.vocab_size, (config.batch, target.image_tokens), device=device),
                  torch.randn(config.batch, 2, length, cfg.dim, device=device, dtype=dtype),
                  torch.randn(config.batch, 2, target.prefix_length - 1, cfg.dim, device=device, dtype=dtype),
                  torch.randn(config.batch, 2, length, taps * cfg.dim, device=device, dtype=dtype) if taps else None)

    def train_step() -> None:
        with autocast(device):
            loss, _ = training_loss(drafter, target.logits, batch, target.prefix_length, generator, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return timed(train_step, device)


@torch.inference_mode()
def time_round(bundle: Bundle, config: TrainConfig) -> float:
    """Seconds of one tree:eagle25 round at batch 1: its verification forward and five drafter levels, with
    half the image cached (host-side acceptance, a few percent of a round, is left out)."""
    target, device = bundle.target, bundle.device
    rows, p, n = bundle.sampling.rows, target.prefix_length, target.image_tokens
    tree = parse_draft(REPORT_DRAFTS[-1])
    drafter = new_drafter(bundle, 0, config.kind, config.taps).to(target.output.weight.dtype)  # as loaded
    target_cache, drafter_cache = target.new_cache(rows, p + n + tree.size), drafter.new_cache(rows, p + n + tree.size)
    target_cache.length = drafter_cache.length = p + n // 2
    nodes = target.embed(torch.zeros(tree.size + 1, dtype=torch.long, device=device))[None].expand(rows, -1, -1)
    positions = torch.full((tree.size + 1,), p + n // 2, device=device)
    width = max(len(level) for level in tree.levels[1:])
    features = nodes[:, :width]
    verify = timed(lambda: target(nodes, positions, target_cache), device)
    level = timed(lambda: drafter.logits(drafter(features, features, positions[:width], drafter_cache),
                                         target.logits), device)
    return verify + tree.depth * level


def calibrate(bundle: Bundle, config: TrainConfig) -> Measured:
    device = bundle.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    prefill, ar_step = time_generation(bundle, min(config.gen_batch, config.images))
    train_step = time_training(bundle, config)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Measured(prefill, ar_step, train_step, time_round(bundle, config), peak)


def estimate(bundle: Bundle, config: TrainConfig, measured: Measured, eval_images: int,
             drafters_reported: int = 1) -> Estimate:
    """Scale the measured unit times by the run's counts. Generation: every batch as a full one; the report:
    one token per round (an untrained drafter's worst case), so it is an upper bound."""
    n = bundle.target.image_tokens
    batches = len(shard_sizes(config.images, config.gen_batch)) + math.ceil(eval_images / config.gen_batch)
    generation = batches * (measured.prefill + n * measured.ar_step)
    report = drafters_reported * len(REPORT_DRAFTS) * eval_images * n * measured.round
    report += eval_images * AGREEMENT_DEPTH * measured.ar_step  # the teacher-forced agreement: a few forwards
    drafter = new_drafter(bundle, 0, config.kind, config.taps)
    taps = len(drafter.target_layers)
    data = config.images * bytes_per_image(bundle.target, bundle.config.dim, bundle.target.output.weight.dtype, taps)
    return Estimate(generation, config.steps * measured.train_step, report, data, data_in_memory(bundle, config, taps),
                    parameter_count(bundle.target), sum(p.numel() for p in trainable(drafter)), measured)


def check_budget(estimate: Estimate, max_hours: float, force: bool) -> None:
    """Refuse a run whose estimate exceeds ``max_hours`` (unless ``force``)."""
    if estimate.total > max_hours * 3600 and not force:
        raise ValueError(f"this run would take about {duration(estimate.total)}, more than --max-hours {max_hours:g}; "
                         "use fewer --images or --epochs, raise --max-hours, or pass --force")
