"""Training of the shipped default model, stage by stage (fixed seeds, resumable checkpoints): judge, tokenizer,
target, drafter, export, in that order (:data:`STAGE_HELP` says what each does; ``python -m coolsd.train --help``
prints it). A drafter for any other target is :mod:`coolsd.distill`'s.

``--shape`` (a name in ``coolsd.models.config.CONFIGS``, default ``fashion``) picks the target's shape; the target
stage records it and later stages read it back.

Checkpoints go to ``--work`` (default ``runs/fashion``); an interrupted stage resumes from its last one.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..core.params import OneLineParser, program, run_command
from ..core.sampling import SamplingConfig
from ..models.bundle import DEFAULT_MODEL, Bundle, save_bundle
from ..models.config import CONFIGS, ModelConfig
from ..models.eagle import Drafter
from ..models.gpt import Transformer
from .data import CLASS_NAMES, load_split, to_unit
from .judge import Judge, load_judge, predict, reference_statistics, save_judge
from .vq import VQConfig, VQModel, load_tokenizer, save_tokenizer

TARGET_CONFIG = CONFIGS["fashion-deep"]  # the shipped target's shape; its drafter is one layer of the same width
DEFAULT_SAMPLING = SamplingConfig(cfg_scale=2.0, temperature=1.0, top_k=0, top_p=1.0)


@dataclass
class Schedule:
    steps: int
    batch: int
    lr: float
    warmup: int = 100
    checkpoint_every: int = 500

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10%."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def batches(size: int, batch: int, seed: int) -> Iterator[Tensor]:
    """Endless shuffled index batches, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(size, generator=generator)
        for start in range(0, size - batch + 1, batch):
            yield order[start:start + batch]


def recent_mean(losses: list[float], window: int = 200) -> float:
    """Mean of the last ``window`` losses (all of them in a shorter run)."""
    tail = losses[-window:]
    return sum(tail) / len(tail)


def fit(name: str, model: nn.Module, loss_fn: Callable[[Tensor, int], Tensor], size: int, schedule: Schedule,
        checkpoint: Path | None = None, seed: int = 0, progress: bool = True,
        after_step: Callable[[int], None] | None = None) -> list[float]:
    """AdamW over index batches of ``size`` items; resumes from and writes ``checkpoint``."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=schedule.lr,
                                  betas=(0.9, 0.95), weight_decay=0.05)
    step, losses = 0, []
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True, map_location=next(model.parameters()).device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, losses = state["step"], state["losses"]
    torch.manual_seed(seed + step)
    stream = batches(size, schedule.batch, seed)
    for _ in range(step):  # replay the data order so a resumed run sees the same batches
        next(stream)
    model.train()
    bar = tqdm(total=schedule.steps, initial=step, desc=name, disable=not progress, dynamic_ncols=True)
    while step < schedule.steps:
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step)
        loss = loss_fn(next(stream), step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
        if after_step is not None:
            after_step(step)
        bar.update()
        bar.set_postfix(loss=f"{recent_mean(losses, 50):.4f}")
        if checkpoint is not None and (step % schedule.checkpoint_every == 0 or step == schedule.steps):
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "losses": losses}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
    bar.close()
    model.eval()
    return losses


# --- stages -----------------------------------------------------------------------------------------------

def train_judge(images: Tensor, labels: Tensor, schedule: Schedule, checkpoint: Path | None = None,
                progress: bool = True) -> tuple[Judge, list[float]]:
    torch.manual_seed(0)
    judge = Judge()

    def loss_fn(index: Tensor, step: int) -> Tensor:
        return F.cross_entropy(judge(images[index]), labels[index])

    return judge, fit("judge", judge, loss_fn, len(images), schedule, checkpoint, progress=progress)


def accuracy(judge: Judge, images: Tensor, labels: Tensor) -> float:
    return int((predict(judge, images) == labels).sum()) / len(images)


def train_tokenizer(images: Tensor, judge: Judge, schedule: Schedule, cfg: VQConfig = VQConfig(),
                    checkpoint: Path | None = None, progress: bool = True, perceptual: float = 0.1
                    ) -> tuple[VQModel, list[float]]:
    """Reconstruction (L1 + L2) + VQ loss + the judge's feature distance; unused codes are re-seeded from
    encoder outputs every 100 steps so that the whole codebook is used."""
    torch.manual_seed(0)
    model = VQModel(cfg)
    judge = judge.eval().requires_grad_(False)
    unit = to_unit(images)
    usage = torch.zeros(cfg.codebook_size)
    last_z: list[Tensor] = []

    def loss_fn(index: Tensor, step: int) -> Tensor:
        x = unit[index]
        z = model.encoder(x)
        zq, codes, vq_loss = model.quantize(z)
        recon = model.decoder(zq)
        usage.index_add_(0, codes.flatten(), torch.ones(codes.numel()))
        last_z[:] = [z.detach()]
        crop = lambda t: t[:, :, 2:30, 2:30].clamp(-1, 1).add(1).div(2)  # noqa: E731
        feature_loss = F.mse_loss(judge.features(crop(recon)), judge.features(crop(x)))
        return F.l1_loss(recon, x) + F.mse_loss(recon, x) + vq_loss + perceptual * feature_loss

    def reseed(step: int) -> None:
        if step % 100 or step > schedule.steps * 0.8:
            return
        dead = (usage == 0).nonzero().flatten()
        if len(dead):
            z = F.normalize(last_z[0].permute(0, 2, 3, 1).reshape(-1, cfg.code_dim), dim=-1)
            pick = torch.randint(len(z), (len(dead),))
            with torch.no_grad():
                model.quantize.embedding.weight[dead] = z[pick] * model.quantize.embedding.weight.norm(dim=-1).mean()
        usage.zero_()

    losses = fit("tokenizer", model, loss_fn, len(images), schedule, checkpoint, progress=progress,
                 after_step=reseed)
    return model, losses


@torch.no_grad()
def tokenize(model: VQModel, images: Tensor, batch: int = 1000) -> Tensor:
    """uint8 images (N, 28, 28) -> codes (N, H*W) in raster order, on the CPU (the model may be elsewhere)."""
    device = next(model.parameters()).device
    return torch.cat([model.encode(to_unit(images[i:i + batch].to(device))).flatten(1).cpu()
                      for i in range(0, len(images), batch)])


def train_target(tokens: Tensor, labels: Tensor, cfg: ModelConfig, schedule: Schedule,
                 checkpoint: Path | None = None, progress: bool = True, device: str = "cpu"
                 ) -> tuple[Transformer, list[float]]:
    """Next-token cross-entropy; the class is replaced by the "no class" row with probability 0.1. The model is
    returned on ``device`` (float32 there too: a GPU only trains faster)."""
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    tokens, labels, positions = tokens.to(device), labels.to(device), torch.arange(cfg.image_tokens, device=device)

    def loss_fn(index: Tensor, step: int) -> Tensor:
        index = index.to(device)
        seq, cls = tokens[index], labels[index].clone()
        cls[torch.rand(len(cls), device=device) < cfg.class_dropout] = cfg.null_class
        logits = model.output(model(model.sequence_inputs(model.class_prefix(cls), seq), positions))
        return F.cross_entropy(logits.flatten(0, 1), seq.flatten())

    return model, fit("target", model, loss_fn, len(tokens), schedule, checkpoint, progress=progress)


def train_drafter(target: Transformer, tokens: Tensor, labels: Tensor, schedule: Schedule,
                  checkpoint: Path | None = None, progress: bool = True, unconditional: float = 0.1
                  ) -> tuple[Drafter, list[float]]:
    """Eagle-1 recipe (spec section 5) on the target's features of the real training images, through the one
    drafter trainer (:mod:`coolsd.distill`: SmoothL1 + 0.1 x soft CE, 10% unconditional rows, input noise,
    AdamW with warm-up then cosine decay, exact resumption). ``schedule.steps`` x ``schedule.batch`` images are
    rounded to whole epochs over ``tokens``; ``checkpoint`` names the run's work folder (its suffix dropped)."""
    import tempfile

    from ..distill.trainer import TrainConfig
    from ..distill.trainer import train_drafter as train_general

    bundle = Bundle(target, None, torch.zeros(target.vocab_size, 1), name="fashion")
    epochs = max(1, round(schedule.steps * schedule.batch / len(tokens)))
    config = TrainConfig(images=len(tokens), epochs=epochs, batch=schedule.batch, lr=schedule.lr,
                         warmup=schedule.warmup / schedule.steps, unconditional=unconditional,
                         checkpoint_every=schedule.checkpoint_every)
    with tempfile.TemporaryDirectory() as scratch:
        work = checkpoint.with_suffix("") if checkpoint is not None else Path(scratch)
        result = train_general(bundle, config, work, progress=progress, given=(labels.tolist(), tokens))
    if (work / "shards").exists():
        shutil.rmtree(work / "shards")
    return result.drafter.cpu(), result.losses


# --- command line -----------------------------------------------------------------------------------------

SCHEDULES = {  # sized for two CPU cores (see assets/fashion/README.md for the measured times)
    "judge": Schedule(steps=2000, batch=128, lr=1e-3, checkpoint_every=500),
    "tokenizer": Schedule(steps=3000, batch=64, lr=1e-3, checkpoint_every=250),
    "target": Schedule(steps=4000, batch=64, lr=1e-3, warmup=200, checkpoint_every=250),
    "drafter": Schedule(steps=3000, batch=64, lr=1e-3, warmup=200, checkpoint_every=250),
}


@dataclass
class StageContext:
    """What a stage reads and writes: the work and bundle folders, its schedule and both data splits."""
    work: Path
    out: Path
    schedule: Schedule | None  # None for export, which trains nothing
    train: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    config: ModelConfig = TARGET_CONFIG  # the target's shape
    device: str = "cpu"  # where the target and codes stages compute


def stage_judge(ctx: StageContext, log: dict) -> None:
    """Train the judge; save it with the test set's reference statistics for the judge-FID."""
    (train_images, train_labels), (test_images, test_labels) = ctx.train, ctx.test
    judge, _ = train_judge(train_images, train_labels, ctx.schedule, ctx.work / "judge.ckpt")
    acc = accuracy(judge, test_images, test_labels)
    save_judge(judge, reference_statistics(judge, test_images), ctx.work)
    log["judge"] = {"test_accuracy": acc, "steps": ctx.schedule.steps}
    print(f"judge test accuracy {acc:.4f}")


def stage_tokenizer(ctx: StageContext, log: dict) -> None:
    """Train the VQ tokenizer, score its reconstructions with the judge and tokenize the training set."""
    (train_images, _), (test_images, test_labels) = ctx.train, ctx.test
    judge = load_judge(ctx.work)
    model, _ = train_tokenizer(train_images, judge, ctx.schedule, checkpoint=ctx.work / "tokenizer.ckpt")
    save_tokenizer(model, ctx.work)
    recon = torch.from_numpy(model.decode_to_uint8(tokenize(model, test_images).view(-1, 8, 8)))
    acc_orig, acc_recon = accuracy(judge, test_images, test_labels), accuracy(judge, recon, test_labels)
    train_tokens = tokenize(model, train_images)
    used = int(train_tokens[:10000].unique().numel())
    log["tokenizer"] = {"judge_accuracy_original": acc_orig, "judge_accuracy_reconstruction": acc_recon,
                        "ratio": acc_recon / acc_orig, "codes_used_10k_train": used, "steps": ctx.schedule.steps}
    print(f"judge accuracy: originals {acc_orig:.4f}, reconstructions {acc_recon:.4f} "
          f"({acc_recon / acc_orig:.1%}); codes used: {used}/{model.config.codebook_size}")
    torch.save(train_tokens, ctx.work / "train_tokens.pt")


# which stage writes each file a later stage reads, for the error that says what to run first
MADE_BY = {"train_tokens.pt": "tokenizer (or codes, with a tokenizer in the folder)", "target.pt": "target"}


def needed(work: Path, name: str) -> Path:
    """``work / name``, or a one-line error naming the stage that writes it."""
    path = work / name
    if not path.exists():
        raise ValueError(f"{path} is missing: run `python -m coolsd.train {MADE_BY[name]}` with --work {work} first")
    return path


def stage_target(ctx: StageContext, log: dict) -> None:
    """Train the target transformer on the tokenizer stage's codes."""
    tokens = torch.load(needed(ctx.work, "train_tokens.pt"), weights_only=True)
    model, losses = train_target(tokens, ctx.train[1], ctx.config, ctx.schedule, ctx.work / "target.ckpt",
                                 device=ctx.device)
    torch.save(model.cpu().state_dict(), ctx.work / "target.pt")
    log["target"] = {"final_loss": recent_mean(losses), "steps": ctx.schedule.steps, "shape": ctx.config.to_dict(),
                     "device": device_words(ctx.device)}


def stage_codes(ctx: StageContext, log: dict) -> None:
    """Tokenize the training set with the tokenizer already in the work folder (e.g. copied from a bundle, to
    train another target on the same codes)."""
    torch.save(tokenize(load_tokenizer(ctx.work).to(ctx.device), ctx.train[0]), ctx.work / "train_tokens.pt")


def stage_drafter(ctx: StageContext, log: dict) -> None:
    """Train the Eagle-1 drafter against the finished, frozen target."""
    tokens = torch.load(needed(ctx.work, "train_tokens.pt"), weights_only=True)
    target = trained(Transformer, needed(ctx.work, "target.pt"), ctx.config)
    drafter, losses = train_drafter(target, tokens, ctx.train[1], ctx.schedule, ctx.work / "drafter.ckpt")
    torch.save(drafter.state_dict(), ctx.work / "drafter.pt")
    log["drafter"] = {"final_loss": recent_mean(losses), "steps": ctx.schedule.steps}


def stage_export(ctx: StageContext, log: dict) -> None:
    """Write the bundle; it trains nothing, so it adds nothing to ``log``."""
    export(ctx.work, ctx.out, ctx.config)
    print(f"bundle written to {ctx.out}")


STAGES: dict[str, Callable[[StageContext, dict], None]] = {
    "judge": stage_judge, "tokenizer": stage_tokenizer, "target": stage_target, "drafter": stage_drafter,
    "export": stage_export, "codes": stage_codes,
}
STAGE_HELP = {  # one line each, for the help
    "judge": "CNN classifier, the quality judge",
    "tokenizer": "VQ autoencoder (needs the judge: its features are a perceptual loss)",
    "target": "class-conditional LlamaGen-style transformer on the VQ codes",
    "drafter": "Eagle-1 head on the target's features of the training images",
    "export": "write the bundle (safetensors + JSON) to --out, default the shipped model's folder (without a "
              "drafter if its stage has not run)",
    "codes": "tokenize the training set with the work folder's tokenizer (to train another target on its codes)",
}


def help_lines(rows: list[tuple[str, str]], width: int = 100) -> str:
    """``name  what it does`` rows, the descriptions aligned and wrapped under themselves."""
    indent = max(len(name) for name, _ in rows) + 4
    return "\n".join(textwrap.fill(text, width, initial_indent=f"  {name:<{indent - 4}}  ",
                                    subsequent_indent=" " * indent, break_on_hyphens=False) for name, text in rows)


def stage_lines() -> str:
    """The stages in order, one line each (``drafter`` marked as the one without ``--model``)."""
    return help_lines([("drafter (without --model)" if name == "drafter" else name, STAGE_HELP[name])
                       for name in STAGES])


def build_parser() -> OneLineParser:
    """One stage name plus folder, step-count, thread and shape options."""
    parser = OneLineParser(prog=program("coolsd.train"), formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=f"Train the shipped default model, one stage at a time, in this order "
                                       f"(checkpoints resume):\n{stage_lines()}",
                           epilog="A drafter for any other target:\n"
                                  "    python -m coolsd.train drafter --model M --out DIR\n"
                                  "(see python -m coolsd.train drafter --help).")
    parser.add_argument("stage", choices=list(STAGES), metavar="STAGE", help=", ".join(STAGES))
    parser.add_argument("--work", type=Path, default=Path("runs/fashion"), help="checkpoints and stage outputs "
                        "(default: runs/fashion)")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL, help="bundle directory written by export "
                        "(default: the shipped model's)")
    parser.add_argument("--steps", type=int, default=None, help="override the stage's step count")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="where the codes and target stages compute: cpu, cuda or "
                        "cuda:N (default cpu; the weights are float32 either way)")
    parser.add_argument("--shape", choices=list(CONFIGS), default=None,
                        help="target shape (default: the one the target stage recorded, else fashion)")
    return parser


def stage_options() -> set[str]:
    """The options a stage takes (``--help`` aside): ``coolsd.train`` sends ``drafter`` with any other option to
    the general drafter trainer."""
    return {option for action in build_parser()._actions for option in action.option_strings} - {"-h", "--help"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def stage_schedule(stage: str, steps: int | None) -> Schedule | None:
    """The stage's schedule with ``--steps`` applied; None for export."""
    schedule = SCHEDULES.get(stage)
    if schedule is not None and steps:
        schedule = Schedule(**{**asdict(schedule), "steps": steps})
    return schedule


def main(argv: list[str] | None = None) -> int:
    """Run one stage; a bad option or missing data ends it with one ``error:`` line and exit code 2."""
    return run_command(lambda: run_stage(parse_args(argv)))


def run_stage(args: argparse.Namespace) -> int:
    """One stage; a training stage also records its results and wall time in ``work/log.json``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    schedule = stage_schedule(args.stage, args.steps)
    started = time.time()
    train, test = load_split("train"), load_split("test")
    log = read_log(args.work)
    STAGES[args.stage](StageContext(args.work, args.out, schedule, train, test, target_config(args.shape, log),
                                    args.device), log)
    if args.stage != "export":
        log.setdefault("seconds", {})[args.stage] = time.time() - started
        (args.work / "log.json").write_text(json.dumps(log, indent=2) + "\n")
    return 0


def device_words(device: str) -> str:
    """The device a stage ran on, for the log: the GPU's name, or the CPU with its torch thread count."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu, {torch.get_num_threads()} torch thread(s)"


def target_config(shape: str | None, log: dict) -> ModelConfig:
    """``--shape`` if given, else the shape the target stage recorded in the work folder, else the shipped one."""
    recorded = log.get("target", {}).get("shape")
    return CONFIGS[shape] if shape else ModelConfig(**recorded) if recorded else TARGET_CONFIG


def read_log(work: Path) -> dict:
    """What the finished stages recorded (accuracies, losses, wall times)."""
    return json.loads((work / "log.json").read_text()) if (work / "log.json").exists() else {}


def trained(model_class: type[Transformer] | type[Drafter], path: Path, config: ModelConfig = TARGET_CONFIG
            ) -> nn.Module:
    """A target or drafter of shape ``config`` with a finished stage's weights."""
    model = model_class(config)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def export(work: Path, out: Path, config: ModelConfig = TARGET_CONFIG) -> Bundle:
    """Assemble the trained stages into a bundle directory (weights as safetensors). Without the drafter stage's
    weights the bundle has no drafter: a target for the general drafter trainer to self-distil one for."""
    tokenizer, judge = load_tokenizer(work), load_judge(work)
    drafter = trained(Drafter, work / "drafter.pt", config) if (work / "drafter.pt").exists() else None
    bundle = Bundle(trained(Transformer, work / "target.pt", config), drafter,
                    tokenizer.quantize.codebook.detach().clone(), name="fashion", class_names=CLASS_NAMES,
                    sampling=DEFAULT_SAMPLING)
    save_bundle(bundle, out, extra={"training": read_log(work)})
    save_tokenizer(tokenizer, out)
    save_judge(judge, judge.reference, out)
    return bundle


if __name__ == "__main__":
    raise SystemExit(main())
