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
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from .bundle import DEFAULT_MODEL, Bundle, load_bundle
from .data import load_split
from .decode import generate
from .judge import judge_metrics, new_fid
from .model import parameter_count


def sample_images(bundle: Bundle, method: str, per_class: int, draft: str = "chain:5", seed: int = 0,
                  desc: str = "") -> tuple[list[np.ndarray], list[int], list]:
    images, classes, stats = [], [], []
    total = per_class * bundle.config.num_classes
    for i in tqdm(range(total), desc=desc or method):
        cls = i % bundle.config.num_classes
        result = generate(bundle, cls, method, {}, draft, bundle.sampling, seed + i)
        images.append(bundle.image(result.tokens))
        classes.append(cls)
        stats.append(result.stats)
    return images, classes, stats


@torch.no_grad()
def real_fid(bundle: Bundle, images: torch.Tensor) -> float:
    fid = new_fid(bundle.judge, bundle.judge.reference)
    fid.update(images, real=False)
    return float(fid.compute())


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
    h, w = images[0].shape
    canvas = np.zeros((classes_n * (h + 2), columns * (w + 2)), dtype=np.uint8)
    filled = [0] * classes_n
    for image, cls in zip(images, classes):
        if filled[cls] < columns:
            r, c = cls * (h + 2), filled[cls] * (w + 2)
            canvas[r:r + h, c:c + w] = image
            filled[cls] += 1
    picture = Image.fromarray(canvas)
    picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST).save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coolsd.card", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--samples-per-class", type=int, default=100)
    parser.add_argument("--eagle-images", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = load_bundle(args.model, device="cpu")
    started = time.time()
    ar_images, ar_classes, ar_stats = sample_images(bundle, "ar", args.samples_per_class, desc="AR samples")
    ar_quality = judge_metrics(bundle, ar_images, ar_classes)
    eagle_per_class = max(1, args.eagle_images // bundle.config.num_classes)
    _, _, eagle_stats = sample_images(bundle, "eagle", eagle_per_class, seed=10**6, desc="Eagle-1 chain:5")
    train_images, _ = load_split("train")
    pick = torch.randperm(len(train_images), generator=torch.Generator().manual_seed(0))[:len(ar_images)]
    metrics = {
        "sampling": bundle.sampling.to_dict(),
        "ar": {"images": len(ar_images), **ar_quality,
               "judge_accuracy_per_class": [float(np.mean([bundle.judge(torch.from_numpy(img)[None]).argmax().item()
                                                           == c for img, c in zip(ar_images, ar_classes) if c == k]))
                                            for k in range(bundle.config.num_classes)],
               "latency_median_s": statistics.median(s.seconds["total"] for s in ar_stats)},
        "real_train_fid": {"images": len(pick), "fid": real_fid(bundle, train_images[pick])},
        "eagle_chain5": {"images": len(eagle_stats), "tau": float(np.mean([s.tau for s in eagle_stats])),
                         "latency_median_s": statistics.median(s.seconds["total"] for s in eagle_stats)},
        "step_seconds": step_times(ar_stats, eagle_stats),
        "parameters": {"target": parameter_count(bundle.target), "drafter": parameter_count(bundle.drafter),
                       "tokenizer": parameter_count(bundle.tokenizer), "judge": parameter_count(bundle.judge)},
        "machine": {"processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "measured_in_s": time.time() - started,
    }
    (args.model / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    grid_picture(ar_images, ar_classes, 10, args.model / "samples.png")
    print(json.dumps({k: v for k, v in metrics.items() if k != "ar"} | {"ar": ar_quality}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
