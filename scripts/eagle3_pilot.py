"""Short EAGLE-3 training runs on the first shards of a self-distilled set, to choose the training-time test's
``K`` and the fused layers by measurement before the long run. Each configuration trains a fresh drafter on the
same batches (AdamW, the trainer's schedule) and is scored on a held-out shard (teacher-forced top-1 agreement
per depth) and by Eagle-1's ``tau`` on ``chain:5`` over held-out (class, seed) pairs.

    python scripts/eagle3_pilot.py --shards runs/eagle3-work/shards --train-shards 6 --epochs 2 \
        --config K=3 --config K=5 --config K=7 --config K=5,taps=16+29

A configuration's taps must be a subset of the layers the shards recorded (their data.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from coolsd.distill.data import BatchPlan, Shard, ShardStore
from coolsd.distill.heads import new_drafter, trainable
from coolsd.distill.objective import training_loss
from coolsd.distill.report import agreement_by_depth, mean_tau, report_conditions
from coolsd.distill.trainer import TrainConfig
from coolsd.models.bundle import load_bundle, set_threads
from coolsd.models.eagle import Eagle3Drafter


def parse_config(text: str) -> dict:
    """``K=5,taps=16+29`` -> {"ttt_steps": 5, "taps": (16, 29)}."""
    config = {"ttt_steps": 5, "taps": (), "layers": 1}
    for part in text.split(","):
        key, value = part.split("=")
        if key == "K":
            config["ttt_steps"] = int(value)
        elif key == "taps":
            config["taps"] = tuple(int(t) for t in value.split("+"))
        elif key == "layers":
            config["layers"] = int(value)
    return config


def select_taps(shard: Shard, recorded: list[int], taps: tuple[int, ...], dim: int) -> Shard:
    """The shard with only ``taps`` of its ``recorded`` tapped layers (all of them when ``taps`` is empty)."""
    if not taps or list(taps) == recorded:
        return shard
    columns = torch.cat([torch.arange(dim) + recorded.index(t) * dim for t in taps])
    return Shard(shard.tokens, shard.features, shard.lead, shard.taps[..., columns])


@torch.inference_mode()
def level_seconds(bundle, drafter, repeats: int = 200) -> float:
    """Median seconds of one chain level at batch 1 (both guidance rows) halfway through an image: the head on one
    node with its KV cache, its logits and the guided distribution, as a drafting level runs them."""
    from coolsd.core.sampling import probabilities
    from coolsd.core.stats import time_calls
    target, rows, half = bundle.target, bundle.sampling.rows, bundle.config.image_tokens // 2
    cache = drafter.new_cache(rows, target.prefix_length + bundle.config.image_tokens + 8)
    cache.length = target.prefix_length + half
    inputs = drafter.embed(torch.zeros(rows, 1, dtype=torch.long))
    hidden, position = torch.zeros(rows, 1, bundle.config.dim), torch.tensor([target.prefix_length + half])

    def level() -> None:
        probabilities(drafter.logits(drafter(inputs, hidden, position, cache, 0), target.logits)
                      .unflatten(0, (rows, -1)), bundle.sampling)

    return statistics.median(time_calls(level, repeats, 20, torch.device("cpu")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--train-shards", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-images", type=int, default=20)
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    set_threads(args.threads)
    bundle = load_bundle(args.model)
    target, dim = bundle.target, bundle.config.dim
    recorded = json.loads((args.shards / "data.json").read_text())["taps"]
    held_out = Shard.load(args.shards / f"shard-{args.train_shards:05d}.safetensors")
    conditions = report_conditions(bundle, args.eval_images)
    results = []
    for text in args.config or ["K=5"]:
        chosen = parse_config(text)
        layers = chosen.pop("layers")
        store = ShardStore(bundle.device)
        for index in range(args.train_shards):
            store.add(select_taps(Shard.load(args.shards / f"shard-{index:05d}.safetensors"), recorded,
                                  chosen["taps"], dim))
        config = TrainConfig(images=len(store), epochs=args.epochs, lr=2e-3, kind="eagle3", **chosen)
        drafter = new_drafter(bundle, 0, "eagle3", chosen["taps"]).train()
        if layers > 1:  # EAGLE-3's layer, then plain decoder layers
            with torch.random.fork_rng():
                torch.manual_seed(0)
                drafter = Eagle3Drafter(bundle.config, chosen["taps"] or None, layers - 1).share_embedding(target)
        optimizer = torch.optim.AdamW(trainable(drafter), lr=config.lr, betas=(0.9, 0.95),
                                      weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_factor)
        generator, plan = torch.Generator().manual_seed(0), BatchPlan(store.sizes, config.batch, 0)
        started = time.perf_counter()
        for step in range(config.steps):
            loss, _ = training_loss(drafter, target.logits, store.gather(plan.items(step)), target.prefix_length,
                                    generator, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_value_(trainable(drafter), config.grad_clip)
            optimizer.step()
            scheduler.step()
        seconds = time.perf_counter() - started
        drafter.eval()
        shard = select_taps(held_out, recorded, chosen["taps"], dim)
        agreement = agreement_by_depth(target, drafter, [shard], bundle.sampling)
        tau = mean_tau(target, drafter, conditions, "chain:5", bundle.sampling)
        level = level_seconds(bundle, drafter)
        result = {"config": text, "taps": list(drafter.target_layers), "steps": config.steps,
                  "level_ms": round(1000 * level, 3),
                  "train_seconds": round(seconds, 1), "last_loss": float(loss), "tau_chain5": round(tau, 3),
                  "agreement": [round(a, 3) for a in agreement]}
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
