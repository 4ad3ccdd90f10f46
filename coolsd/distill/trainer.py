"""The training loop: AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA (float32 on the CPU), a tqdm
bar with the loss, and checkpoints that resume exactly (drafter, optimizer, scheduler, RNG states; the data
position is the step), so an interrupted run resumed ends with the same weights as an uninterrupted one."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from tqdm import tqdm

from ..models.bundle import Bundle
from .data import BatchPlan, ShardStore, bytes_per_image, check_folder, make_data
from .heads import new_drafter, trainable
from .objective import training_loss


@dataclass(frozen=True)
class TrainConfig:
    """What a run does. ``warmup`` is a fraction of all steps; ``memory_gb``: self-distilled data up to this size
    stays in memory (on the device), a larger set is written to disk in shards of ``gen_batch`` images."""

    images: int = 2000
    epochs: int = 4
    batch: int = 32
    lr: float = 1e-3
    warmup: float = 0.03
    weight_decay: float = 0.01
    grad_clip: float = 0.5
    noise: float = 0.1
    unconditional: float = 0.1
    ce_weight: float = 0.1
    seed: int = 0
    gen_batch: int = 64
    memory_gb: float = 4.0
    checkpoint_every: int = 200
    kind: str = "eagle1"  # eagle1, or eagle3 (training-time test over ttt_steps steps, reading target layers taps)
    ttt_steps: int = 5
    taps: tuple[int, ...] = ()  # EAGLE-3's target layers (empty: EAGLE-3's choice, 2, n // 2, n - 3)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.images / self.batch)

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.warmup * self.steps))

    def lr_factor(self, step: int) -> float:
        """Linear warm-up to ``lr``, then cosine decay to zero at the last step."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def data_settings(self) -> dict:
        """The settings that determine the self-distilled data (shards on disk must match them)."""
        return {"images": self.images, "gen_batch": self.gen_batch, "seed": self.seed}


@dataclass
class TrainResult:
    drafter: nn.Module
    losses: list[float]  # per step, from the first (a resumed run includes the steps before the interruption)
    finished: bool
    seconds: dict[str, float] = field(default_factory=dict)  # "data", "training" (this process only)
    in_memory: bool = True


def identity(config: TrainConfig) -> dict:
    """The settings a checkpoint must share with the run that resumes it (not where data or checkpoints go)."""
    return {k: v for k, v in asdict(config).items() if k not in ("memory_gb", "checkpoint_every")}


def data_in_memory(bundle: Bundle, config: TrainConfig, taps: int = 0) -> bool:
    """Whether the self-distilled set (with ``taps`` tapped layers) fits ``memory_gb``."""
    size = config.images * bytes_per_image(bundle.target, bundle.config.dim, bundle.target.output.weight.dtype, taps)
    return size <= config.memory_gb * 2**30


def autocast(device: torch.device):
    """bf16 autocast on CUDA; on the CPU float32 (bf16 there is slow without matrix units and changes the
    numbers the tests compare bit for bit)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


class Checkpoint:
    """``work/checkpoint.pt``: everything a resumed run needs to continue bit for bit."""

    def __init__(self, work: Path, identity: dict) -> None:
        self.path, self.identity = work / "checkpoint.pt", identity

    def save(self, step: int, drafter: nn.Module, optimizer, scheduler, generator: torch.Generator,
             losses: list[float]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"identity": self.identity, "step": step, "drafter": drafter.state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "generator": generator.get_state(), "torch_rng": torch.get_rng_state(), "losses": losses}
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        temporary = self.path.with_suffix(".tmp")
        torch.save(state, temporary)
        temporary.replace(self.path)

    def restore(self, drafter: nn.Module, optimizer, scheduler, generator: torch.Generator) -> tuple[int, list[float]]:
        """Load the checkpoint if there is one; returns (step, losses), (0, []) for a fresh run."""
        if not self.path.exists():
            return 0, []
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        if state["identity"] != self.identity:
            changed = sorted(k for k in self.identity if state["identity"].get(k) != self.identity[k])
            raise ValueError(f"{self.path} was written by a run with other settings ({', '.join(changed)}); "
                             "remove it or choose another --work folder")
        drafter.load_state_dict(state["drafter"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        return state["step"], list(state["losses"])


def prepare_data(bundle: Bundle, drafter: nn.Module, config: TrainConfig, work: Path, prompts: list[str] | None,
                 progress: bool, given: tuple[list, torch.Tensor] | None = None) -> ShardStore:
    """The training set: in memory when it fits ``memory_gb``, else shards in ``work/shards``."""
    taps = list(drafter.target_layers)
    folder = None if data_in_memory(bundle, config, len(taps)) else work / "shards"
    if folder is not None:
        check_folder(folder, {**config.data_settings(), "model": bundle.name, "sampling": bundle.sampling.to_dict(),
                              "prompts": len(prompts or []), "given": given is not None,
                              **({"taps": taps} if taps else {})})
    return make_data(bundle, drafter, config.images, config.gen_batch, config.seed, folder, prompts, progress, given)


def train_drafter(bundle: Bundle, config: TrainConfig, work: Path, prompts: list[str] | None = None,
                  progress: bool = True, stop_after: int | None = None,
                  after_step: Callable[[int, float], None] | None = None,
                  given: tuple[list, torch.Tensor] | None = None) -> TrainResult:
    """Self-distil the data, then train a new drafter for ``bundle``'s frozen target, resuming from
    ``work/checkpoint.pt`` when present. ``stop_after``: checkpoint and return unfinished after that many steps.
    ``after_step(step, loss)`` runs after every step; if it raises, the (complete) step is checkpointed first.
    ``given`` (conditions, tokens): train on these images (``config.images`` of them) instead of sampled ones."""
    target, device = bundle.target.eval().requires_grad_(False), bundle.device
    if given is not None and len(given[1]) != config.images:
        raise ValueError(f"given {len(given[1])} images, but the config says images={config.images}")
    drafter = new_drafter(bundle, config.seed, config.kind, config.taps)
    started = time.perf_counter()
    store = prepare_data(bundle, drafter, config, work, prompts, progress, given)
    seconds = {"data": time.perf_counter() - started}
    plan = BatchPlan(store.sizes, config.batch, config.seed)
    optimizer = torch.optim.AdamW(trainable(drafter), lr=config.lr, betas=(0.9, 0.95),
                                  weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_factor)
    generator = torch.Generator(device).manual_seed(config.seed)
    checkpoint = Checkpoint(work, {**identity(config), "model": bundle.name})
    step, losses = checkpoint.restore(drafter, optimizer, scheduler, generator)
    started = time.perf_counter()
    drafter.train()
    bar = tqdm(total=config.steps, initial=step, desc="drafter", disable=not progress, dynamic_ncols=True)
    while step < config.steps and (stop_after is None or step < stop_after):
        batch = store.gather(plan.items(step))
        with autocast(device):
            loss, _ = training_loss(drafter, target.logits, batch, target.prefix_length, generator, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(trainable(drafter), config.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        losses.append(float(loss.detach()))
        bar.update()
        bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.4f}")
        if step % config.checkpoint_every == 0 or step == config.steps or step == stop_after:
            checkpoint.save(step, drafter, optimizer, scheduler, generator, losses)
        if after_step is not None:
            try:
                after_step(step, losses[-1])
            except BaseException:
                checkpoint.save(step, drafter, optimizer, scheduler, generator, losses)
                raise
    bar.close()
    seconds["training"] = time.perf_counter() - started
    return TrainResult(drafter.eval(), losses, step >= config.steps, seconds, store.folder is None)
