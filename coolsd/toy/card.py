"""Measure the shipped model and write its model card (``assets/fashion/README.md``), metrics and sample grid.

    python -m coolsd.card --samples-per-class 100 --eagle-images 200

Every number in the card is measured by this command with the shipped weights.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from ..core.decode import generate
from ..core.params import program
from ..core.rules import build_rule
from ..core.trees import parse_draft
from ..models.bundle import DEFAULT_MODEL, Bundle, load_bundle
from ..models.gpt import parameter_count
from .data import load_split
from .judge import fid_to_reference, grey, judge_metrics, predict


def sample_images(bundle: Bundle, method: str, per_class: int, draft: str = "chain:5", seed: int = 0,
                  desc: str = "") -> tuple[list[np.ndarray], list[int], list]:
    images, classes, stats = [], [], []
    total = per_class * bundle.config.num_classes
    for i in tqdm(range(total), desc=desc or method):
        cls = i % bundle.config.num_classes
        result = generate(bundle, cls, build_rule(method, {}, 0), parse_draft(draft), bundle.sampling, seed + i)
        images.append(bundle.image(result.tokens))
        classes.append(cls)
        stats.append(result.stats)
    return images, classes, stats


def step_times(ar_stats: list, eagle_stats: list) -> dict:
    """Seconds per model call, from the engine's own phase timers: a target forward in AR (1 new token), a
    target verification forward of a chain:5 round (6 new tokens), and a drafter step (forward, head,
    sampling transform and draw)."""
    def per(stats, phase, count):
        return sum(s.seconds[phase] for s in stats) / sum(count(s) for s in stats)
    return {"target_forward_1_token_s": per(ar_stats, "target_forward", lambda s: s.target_forwards),
            "target_forward_chain5_round_s": per(eagle_stats, "target_forward", lambda s: s.target_forwards),
            "drafter_step_s": per(eagle_stats, "drafting", lambda s: s.drafter_forwards)}


def grid_picture(images: list[np.ndarray], classes: list[int], columns: int, path: Path, scale: int = 3) -> None:
    """Rows = classes, ``columns`` samples each, enlarged without blur."""
    classes_n = max(classes) + 1
    h, w = images[0].shape[:2]
    canvas = np.zeros((classes_n * (h + 2), columns * (w + 2), *images[0].shape[2:]), dtype=np.uint8)
    filled = [0] * classes_n
    for image, cls in zip(images, classes):
        if filled[cls] < columns:
            r, c = cls * (h + 2), filled[cls] * (w + 2)
            canvas[r:r + h, c:c + w] = image
            filled[cls] += 1
    picture = Image.fromarray(canvas)
    picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST).save(path)


CARD = """# Default model: Fashion-MNIST, class-conditional

The model every `coolsd` command and the app use unless told otherwise: a VQ tokenizer, a LlamaGen-style
class-conditional target, an Eagle-1 draft head and a quality judge, trained from Fashion-MNIST
({trained_where}). Every number below was measured with these weights by `python -m coolsd.card` (training
numbers by `python -m coolsd.train`), on a 2-core {processor} CPU with {threads} torch thread(s) per job;
times are wall-clock, on a machine that other jobs shared.

![samples](samples.png)

*AR samples, one row per class (top to bottom: {classes}).*

## Data and licence

Fashion-MNIST (Xiao, Rasul, Vollgraf 2017; MIT licence), from Debian's `dataset-fashion-mnist` package:
60,000 training and 10,000 test images of 28x28 grey-scale garments in 10 classes. The weights here are
derived from it and are shipped under the same MIT licence.

## Parts

| part | what | parameters |
|---|---|---|
| judge | CNN classifier (2 conv + 2 linear); its 128-d penultimate features define the judge-FID | {p_judge:,} |
| tokenizer | VQ autoencoder, 28x28 padded to 32x32, 8x8 codes from an L2-normalised codebook of {vocab} | {p_tok:,} |
| target | LlamaGen-style decoder: {layers} layers, width {dim}, {heads} heads, 2-D RoPE, class token + "no class" row | {p_target:,} |
| drafter | Eagle-1 head: `fc(2h -> h)` + one decoder layer + the target's frozen output head | {p_drafter:,} |
{shape_section}
## Training (`python -m coolsd.train <stage>`, then `export`)

| stage | steps x batch | time | result |
|---|---|---|---|
| judge | {judge_steps} x 128 | {t_judge} | test accuracy {judge_acc:.2%} |
| tokenizer | {tok_steps} x 64 | {t_tok} | judge accuracy on test reconstructions {acc_recon:.2%} vs {acc_orig:.2%} on originals ({ratio:.1%}); {codes} of {vocab} codes used |
| target | {target_steps} x 64 | {t_target}{target_device} | final cross-entropy {target_loss:.3f} nats/token |
| drafter | {drafter_steps} x {drafter_batch} | {t_drafter}{drafter_device} | final loss {drafter_loss:.3f} (SmoothL1 + 0.1 soft CE) |

{reused}Label dropout 0.1 for the target; AdamW, warm-up then cosine decay. The drafter was trained by the general
drafter trainer (`python -m coolsd.train drafter --model ...`) on {drafter_images} images the target sampled
itself (both CFG rows recorded, 10% of rows unconditional); its time includes generating them.

## Measured quality and speed

Sampling settings (the bundle's defaults): CFG scale {cfg}, temperature {temperature}, top-k {top_k}
(0 = off), top-p {top_p}.

| measure | value |
|---|---|
| AR class consistency (judge), {ar_n} samples, {per_class} per class | **{ar_acc:.1%}** (per class: {per_class_acc}) |
| AR judge-FID ({ar_n} samples vs the test set) | {ar_fid:.2f} |
| real training images' judge-FID ({real_n} images vs the test set) | {real_fid:.2f} |
| Eagle-1 (lossless), chain L=5: mean accepted length tau over {eagle_n} images | **{tau:.3f}** |
| one target forward, 1 new token (AR) | {t_fwd1:.2f} ms |
| one target forward, verification of a chain:5 round (6 new tokens) | {t_fwd6:.2f} ms |
| one drafter step (forward, head, sampling) | {t_draft:.2f} ms |
| image latency, median: AR / Eagle-1 chain:5 | {lat_ar:.0f} ms / {lat_eagle:.0f} ms |
{round_rows}
`tau` counts the prefill as a round, so AR has exactly 1. FID in a 128-d feature space with a few hundred
or thousand samples is biased upwards; compare it only with the real-image row measured the same way.
{eagle3_section}
## Reproduce

```bash
apt-get install -y dataset-fashion-mnist
{recipe}
python -m coolsd.card --samples-per-class 100 --eagle-images 200
python -m torch.distributed.run --standalone --nproc_per_node 2 -m coolsd.bench --preset paper --preset jacobi \\
  --images 1000 --latency-images 200 --batch 16 --shared-timing --work runs/study --threads 1 \\
  --out assets/fashion/bench_results.json --csv assets/fashion/bench_results.csv --plots assets/fashion/study \\
  --summary assets/fashion/study_summary.md
```
"""


def format_minutes(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds / 60:.0f} min"


# The recipe of a model trained stage by stage, its drafter self-distilled afterwards (training logs without a
# recipe of their own: the earlier default model's).
STAGE_RECIPE = ("for stage in judge tokenizer target drafter export; do python -m coolsd.train $stage; done\n"
                "{drafter_command}\n"
                "cp runs/drafter-fashion/drafter.safetensors assets/fashion/  # the self-distilled drafter replaces "
                "the stage's")


def target_gpu(log: dict) -> str | None:
    """The GPU the target stage ran on (its log names the device), or None for the CPU."""
    device = log.get("target", {}).get("device", "")
    return device if device and not device.startswith("cpu") else None


def trained_where(gpu: str | None) -> str:
    """Where the stages ran, in words: all on the CPU, or the target and its drafter on a GPU."""
    if gpu:
        return (f"the judge and the tokenizer on two CPU cores, the target and its drafter on one {gpu} GPU with "
                "the same commands and `--device cuda`")
    return "all on two CPU cores"


def drafter_row(log: dict, record: dict) -> dict:
    """The drafter's training row: from the general trainer's record when it trained the shipped drafter, else
    from the drafter stage's log."""
    if record.get("steps"):
        seconds = record.get("seconds_this_process", {})  # generating the data and training (not the report)
        return {"steps": record["steps"], "batch": record["settings"]["batch"], "loss": record["loss_last_50"],
                "images": record["settings"]["images"],
                "seconds": seconds["data"] + seconds["training"] if seconds else None}
    stage = log.get("drafter", {})
    return {"steps": stage.get("steps"), "batch": stage.get("batch", 64), "loss": stage.get("final_loss", float("nan")),
            "images": stage.get("images", 0), "seconds": log.get("seconds", {}).get("drafter")}


def shape_section(choice: dict | None) -> str:
    """Why the target has its shape: what each shape measured when it was chosen (a list in ``config.json``'s
    ``shape_choice``, each with the commands that measured it); nothing when the bundle records no choice."""
    if not choice:
        return ""
    rows = "\n".join(f"| {row['shape']} | {row['parameters']:,} | {row['measured']} |" for row in choice["shapes"])
    commands = "\n".join(choice["commands"])
    return (f"\n## Why this shape\n\n{choice['why']}\n\n| target shape | parameters | measured |\n|---|---|---|\n"
            f"{rows}\n\nMeasured with:\n\n```bash\n{commands}\n```\n")


def round_rows(parts: dict | None) -> str:
    """The card's rows for what a chain:5 round costs by phase, in AR steps (the profile's medians)."""
    if not parts:
        return ""
    ar = parts["ar_step"]["median_s"]
    share = {name: parts[key]["median_s"] / ar for name, key in (
        ("verification", "verify chain:5"), ("acceptance", "acceptance chain:5"), ("drafting", "drafting chain:5"),
        ("level", "drafter_level"), ("round", "round chain:5"))}
    repeats = parts["ar_step"]["repeats"]
    return (f"| a chain:5 round from a mid-image state, in AR steps (median of {repeats} repeats; AR step "
            f"{1000 * ar:.2f} ms) | **{share['round']:.2f}**: verification {share['verification']:.2f}, drafting "
            f"{share['drafting']:.2f} (a drafter level {share['level']:.3f}), acceptance {share['acceptance']:.2f} |\n")


EAGLE3_SECTION = """
## Second drafter: EAGLE-3

The model also carries an EAGLE-3 head (`eagle3.safetensors`, `coolsd.models.eagle.Eagle3Drafter`; choose it
with `--drafter eagle3` or the app's drafter control): the inputs of target layers {taps} side by side, reduced
by `fc` ({fused} -> {dim}), then one decoder layer that reads the next token's embedding and that feature (both
normed, side by side) and its own norm before the target's frozen output head; {parameters:,} parameters.
It was trained by the general trainer with EAGLE-3's training-time test over {ttt} steps (its own predicted
features fed back, attending as a chain draft does; soft cross-entropy against the target only, step k weighted
0.8^k) on {images:,} images the target sampled itself, {epochs} epochs of batches of {batch} = {steps:,} steps,
on {device} ({machine}): {generation} generating the images, {training} training; final loss {loss:.3f}.

| measure | Eagle-1 | EAGLE-3 |
|---|---|---|
| chain L=5, lossless: mean accepted length tau over {eagle_n} images (the same (class, seed) pairs; the two drafters alternating image by image, eager steps) | {tau1:.3f} | **{tau3:.3f}** |
| image latency, median (chain:5; the machine shared with another job) | {lat1:.0f} ms | {lat3:.0f} ms |
| one drafter step (forward, head, sampling) | {step1:.2f} ms | {step3:.2f} ms |
| trainer's report, 20 held-out images: tau chain:5 / tree:eagle25 | {report1} | {report3} |
| teacher-forced top-1 agreement at depths 1-5 (trainer's report) | {agree1} | {agree3} |

```bash
{command}
cp runs/eagle3-fashion/eagle3.safetensors runs/eagle3-fashion/config.json assets/fashion/
python -m coolsd.card --drafters-only  # the drafter rows above, the other numbers kept from metrics.json
```
"""


def eagle3_section(metrics: dict, bundle: Bundle) -> str:
    """The EAGLE-3 drafter's section: its training record (``config.json``'s ``eagle3``) and the rows measured
    beside Eagle-1's; nothing for a model without one."""
    entry, rows = bundle.info.get("eagle3"), metrics.get("drafters", {})
    if not entry or "eagle3" not in rows or "eagle3" not in bundle.drafters:
        return ""
    one, three = rows["eagle1"], rows["eagle3"]
    record, settings = entry["training"], entry["training"]["settings"]
    seconds, quality = record["seconds_this_process"], record["quality"]

    def report(which: str) -> str:
        return " / ".join(f"{quality[which]['tau'][d]:.3f}" for d in ("chain:5", "tree:eagle25")) \
            if which in quality else "-"

    def agreement(which: str) -> str:
        return ", ".join(f"{a:.2f}" for a in quality[which]["agreement"]) if which in quality else "-"

    drafter = bundle.drafters["eagle3"]
    return EAGLE3_SECTION.format(
        taps=", ".join(map(str, entry["taps"])), fused=len(entry["taps"]) * bundle.config.dim, dim=bundle.config.dim,
        parameters=sum(p.numel() for p in drafter.parameters()), ttt=settings["ttt_steps"], images=settings["images"],
        epochs=settings["epochs"], batch=settings["batch"], steps=record["steps"], device=record["device"],
        machine=record["machine"],
        generation=format_minutes(seconds.get("data", 0) + record.get("seconds_earlier_calls", {}).get("data", 0)),
        training=format_minutes(seconds.get("training")), loss=record["loss_last_50"],
        eagle_n=three["images"], tau1=one["tau"], tau3=three["tau"], lat1=1000 * one["latency_median_s"],
        lat3=1000 * three["latency_median_s"], step1=1000 * one["drafter_step_s"], step3=1000 * three["drafter_step_s"],
        report1=report("existing"), report3=report("new"), agree1=agreement("existing"), agree3=agreement("new"),
        command="\n".join([*record.get("earlier_calls", []), record["command"]]))


def write_card(metrics: dict, path: Path, bundle: Bundle) -> None:
    """The model card, every number taken from ``metrics`` and the training log in ``config.json``."""
    log = bundle.info.get("training", {})
    seconds = log.get("seconds", {})
    tok = log.get("tokenizer", {})
    cfg, steps = bundle.config, metrics["step_seconds"]
    record = bundle.info.get("drafter_training", {})
    drafter = drafter_row(log, record)
    command = record.get("command", "python -m coolsd.train drafter")
    reused, gpu = log.get("reused"), target_gpu(log)
    text = CARD.format(
        shape_section=shape_section(bundle.info.get("shape_choice")), round_rows=round_rows(metrics.get("round")),
        reused=f"{reused}\n\n" if reused else "", trained_where=trained_where(gpu),
        target_device=f" on {gpu}" if gpu else "",
        drafter_device=f" on {gpu or 'a GPU'}" if str(record.get("device", "cpu")).startswith("cuda") else "",
        recipe=log.get("recipe", STAGE_RECIPE).format(drafter_command=command),
        processor=metrics["machine"]["processor"], threads=metrics["machine"]["threads"],
        classes=", ".join(bundle.class_names), p_judge=metrics["parameters"]["judge"],
        p_tok=metrics["parameters"]["tokenizer"], p_target=metrics["parameters"]["target"],
        p_drafter=metrics["parameters"]["drafter"], vocab=cfg.vocab_size, layers=cfg.n_layer, dim=cfg.dim,
        heads=cfg.n_head, judge_steps=log.get("judge", {}).get("steps"), t_judge=format_minutes(seconds.get("judge")),
        judge_acc=log.get("judge", {}).get("test_accuracy", float("nan")), tok_steps=tok.get("steps"),
        t_tok=format_minutes(seconds.get("tokenizer")), acc_recon=tok.get("judge_accuracy_reconstruction", float("nan")),
        acc_orig=tok.get("judge_accuracy_original", float("nan")), ratio=tok.get("ratio", float("nan")),
        codes=tok.get("codes_used_10k_train"), target_steps=log.get("target", {}).get("steps"),
        t_target=format_minutes(seconds.get("target")), target_loss=log.get("target", {}).get("final_loss", float("nan")),
        drafter_steps=drafter["steps"], t_drafter=format_minutes(drafter["seconds"]), drafter_batch=drafter["batch"],
        drafter_images=f"{drafter['images']:,}", drafter_loss=drafter["loss"], **bundle.sampling.to_dict(),
        cfg=bundle.sampling.cfg_scale, ar_n=metrics["ar"]["images"],
        per_class=metrics["ar"]["images"] // cfg.num_classes, ar_acc=metrics["ar"]["judge_accuracy"],
        per_class_acc=", ".join(f"{a:.0%}" for a in metrics["ar"]["judge_accuracy_per_class"]),
        ar_fid=metrics["ar"]["fid"], real_n=metrics["real_train_fid"]["images"],
        real_fid=metrics["real_train_fid"]["fid"], eagle_n=metrics["eagle_chain5"]["images"],
        tau=metrics["eagle_chain5"]["tau"], t_fwd1=1000 * steps["target_forward_1_token_s"],
        t_fwd6=1000 * steps["target_forward_chain5_round_s"], t_draft=1000 * steps["drafter_step_s"],
        lat_ar=1000 * metrics["ar"]["latency_median_s"], lat_eagle=1000 * metrics["eagle_chain5"]["latency_median_s"],
        eagle3_section=eagle3_section(metrics, bundle))
    (path / "README.md").write_text(text)


def build_parser() -> argparse.ArgumentParser:
    """The card's options, each with its help (the usage names the command as it was called)."""
    parser = argparse.ArgumentParser(prog=program("coolsd.card"), description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="the bundle directory whose card is written (default: the shipped model's)")
    parser.add_argument("--samples-per-class", type=int, default=100,
                        help="AR images per class for the quality numbers (default 100)")
    parser.add_argument("--eagle-images", type=int, default=200,
                        help="Eagle-1 chain:5 images for tau and the latencies (default 200)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--round-repeats", type=int, default=30, help="timed repeats of each part of a round")
    parser.add_argument("--drafters-only", action="store_true",
                        help="measure only the drafters' rows (Eagle-1 and, where the model has it, EAGLE-3, on the "
                             "same images, interleaved); the other numbers are kept from the model's metrics.json")
    return parser


def drafter_rows(bundle: Bundle, eagle_images: int) -> dict:
    """Eagle-1's chain:5 rows for each drafter the model carries, the same (class, seed) pairs, the drafters
    alternating image by image so that machine load hits both alike."""
    per_class = max(1, eagle_images // bundle.config.num_classes)
    runs = {name: [] for name in bundle.drafters}
    for i in tqdm(range(per_class * bundle.config.num_classes), desc="drafters"):
        for name, stats in runs.items():
            stats.append(generate(bundle.with_drafter(name), i % bundle.config.num_classes, build_rule("eagle", {}, 0),
                                  parse_draft("chain:5"), bundle.sampling, 10**6 + i).stats)
    return {name: {"images": len(stats), "tau": float(np.mean([s.tau for s in stats])),
                   "latency_median_s": statistics.median(s.seconds["total"] for s in stats),
                   "drafter_step_s": sum(s.seconds["drafting"] for s in stats) / sum(s.drafter_forwards for s in stats)}
            for name, stats in runs.items()}


def main(argv: list[str] | None = None, round_profile: Callable[[Bundle, int], dict] | None = None) -> int:
    """Measure and write the card; ``round_profile(bundle, repeats)`` (the command line's profiler, which this
    package does not import) times a round's phases for the card's round row."""
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = load_bundle(args.model, device="cpu")
    if args.drafters_only:
        metrics = json.loads((args.model / "metrics.json").read_text())
        rows = metrics["drafters"] = drafter_rows(bundle, args.eagle_images)
        (args.model / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        write_card(metrics, args.model, bundle)
        print(json.dumps(rows, indent=1))
        return 0
    started = time.time()
    ar_images, ar_classes, ar_stats = sample_images(bundle, "ar", args.samples_per_class, desc="AR samples")
    ar_quality = judge_metrics(bundle.quality.judge, ar_images, ar_classes)
    eagle_per_class = max(1, args.eagle_images // bundle.config.num_classes)
    _, _, eagle_stats = sample_images(bundle, "eagle", eagle_per_class, seed=10**6, desc="Eagle-1 chain:5")
    train_images, _ = load_split("train")
    pick = torch.randperm(len(train_images), generator=torch.Generator().manual_seed(0))[:len(ar_images)]
    predicted, wanted = predict(bundle.quality.judge, grey(ar_images)), torch.tensor(ar_classes)
    metrics = {
        "sampling": bundle.sampling.to_dict(),
        "ar": {"images": len(ar_images), **ar_quality,
               "judge_accuracy_per_class": [float((predicted[wanted == k] == k).float().mean())
                                            for k in range(bundle.config.num_classes)],
               "latency_median_s": statistics.median(s.seconds["total"] for s in ar_stats)},
        "real_train_fid": {"images": len(pick), "fid": fid_to_reference(bundle.quality.judge, train_images[pick])},
        "eagle_chain5": {"images": len(eagle_stats), "tau": float(np.mean([s.tau for s in eagle_stats])),
                         "latency_median_s": statistics.median(s.seconds["total"] for s in eagle_stats)},
        "step_seconds": step_times(ar_stats, eagle_stats),
        **({"drafters": drafter_rows(bundle, args.eagle_images)} if len(bundle.drafters) > 1 else {}),
        "round": round_profile(bundle, args.round_repeats) if round_profile is not None else None,
        "parameters": {"target": parameter_count(bundle.target), "drafter": parameter_count(bundle.drafter),
                       "tokenizer": parameter_count(bundle.decoder.model), "judge": parameter_count(bundle.quality.judge)},
        "machine": {"processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "measured_in_s": time.time() - started,
    }
    (args.model / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    grid_picture(ar_images, ar_classes, 10, args.model / "samples.png")
    write_card(metrics, args.model, bundle)
    print(json.dumps({k: v for k, v in metrics.items() if k != "ar"} | {"ar": ar_quality}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
