"""How good a drafter is, measured on held-out conditions, and the model card (README.md) that records it.

* ``tau``: the mean over images of Eagle-1's mean accepted length (accepted drafts + 1 per target forward, the
  prefill counted as a round, as everywhere in coolsd), for ``chain:5`` and ``tree:eagle25``, with the model's
  sampling settings. Conditions: class ``i mod C`` with seed ``i`` for image ``i`` (what ``coolsd.bench`` uses),
  or the example prompts in turn for a text model.
* Top-1 agreement at depth ``d`` (teacher-forced): on sequences the target sampled for the held-out conditions,
  the drafter reads the target's features up to slot ``s`` (s from P - 1 on), then drafts ``d`` steps from its own
  predicted features, fed the sequence's true next tokens, with the attention a chain draft has (the true slots up
  to ``s`` and its own earlier steps). The agreement is the fraction of (image, ``s``) whose guided draft
  distribution at depth ``d`` has the same most likely token as the target's guided distribution there.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from ..core.decode import decode
from ..core.interface import Drafter, Target
from ..core.rules import Eagle
from ..core.sampling import SamplingConfig, probabilities
from ..core.trees import parse_draft
from ..models.registry import EXAMPLE_PROMPTS
from .data import Shard, causal, encode_conditions
from .objective import level_mask

REPORT_DRAFTS = ("chain:5", "tree:eagle25")
AGREEMENT_DEPTH = 5


def report_conditions(bundle: Any, count: int) -> list[Any]:
    """Held-out conditions: class ``i mod C`` for a class model, the example prompts in turn for a text model."""
    if bundle.config.text_conditioned:
        specs = [EXAMPLE_PROMPTS[i % len(EXAMPLE_PROMPTS)] for i in range(count)]
        return encode_conditions(specs, bundle.text_encoder)
    return [i % bundle.config.num_classes for i in range(count)]


def mean_tau(target: Target, drafter: Drafter, conditions: Sequence[Any], draft: str,
             sampling: SamplingConfig) -> float:
    """Mean over images of Eagle-1's tau; image ``i`` uses ``conditions[i]`` and seed ``i``."""
    tree = parse_draft(draft)
    taus = [decode(target, drafter, condition, Eagle(), tree, sampling, seed).stats.tau
            for seed, condition in enumerate(conditions)]
    return float(np.mean(taus))


def guided_top1(logits: Tensor, sampling: SamplingConfig) -> Tensor:
    """Most likely token of the guided distribution, (2B, T, V) logits (conditional rows first) -> (B, T)."""
    return probabilities(logits.unflatten(0, (2, -1)), sampling).argmax(-1)


def as_rows(per_image: Tensor) -> Tensor:
    """(B, 2, ...) -> (2B, ...) with the conditional rows first, as the decoding loop batches them."""
    return per_image.transpose(0, 1).flatten(0, 1)


@torch.inference_mode()
def agreement_counts(target: Target, drafter: Drafter, shard: Shard, sampling: SamplingConfig,
                     depth: int = AGREEMENT_DEPTH) -> tuple[np.ndarray, np.ndarray]:
    """(agreeing, compared) per depth 1..``depth`` on one shard (see the module docstring)."""
    p, n = target.prefix_length, target.image_tokens
    slots, device = p + n - 2, shard.features.device
    features, lead = as_rows(shard.features), as_rows(shard.lead)
    tokens = shard.tokens.repeat(2, 1)
    inputs = torch.cat([lead, drafter.embed(tokens[:, :-1]).to(lead.dtype)], dim=1)  # slot s: the input at s + 1
    wanted = guided_top1(target.logits(features), sampling)  # (B, P + N - 1): the target's choice after position t
    cache = drafter.new_cache(features.shape[0], slots * depth)
    index = torch.arange(slots, device=device)
    read = as_rows(shard.taps) if drafter.target_layers else features  # what the drafter reads of the target
    predicted = drafter(inputs, read[:, :slots], index, cache, 0, causal(slots, device))
    agree, compared = np.zeros(depth), np.zeros(depth)
    for level in range(1, depth + 1):
        if level > 1:
            shifted = (index + level - 1).clamp(max=slots - 1)
            predicted = drafter(inputs[:, shifted], predicted, shifted, cache, (level - 1) * slots,
                                level_mask(slots, level, device))
        start, stop = p - 1, slots + 1 - level  # slots s with s + level <= P + N - 2
        if stop <= start:
            continue
        drafted = guided_top1(drafter.logits(predicted[:, start:stop], target.logits), sampling)
        agree[level - 1] += float((drafted == wanted[:, start + level:stop + level]).sum())
        compared[level - 1] += drafted.numel()
    return agree, compared


def agreement_by_depth(target: Target, drafter: Drafter, shards: Sequence[Shard], sampling: SamplingConfig,
                       depth: int = AGREEMENT_DEPTH) -> list[float | None]:
    agree, compared = np.zeros(depth), np.zeros(depth)
    for shard in shards:
        a, c = agreement_counts(target, drafter, shard, sampling, depth)
        agree, compared = agree + a, compared + c
    return [float(a / c) if c else None for a, c in zip(agree, compared)]


def quality(target: Target, drafter: Drafter, conditions: Sequence[Any], shards: Sequence[Shard],
            sampling: SamplingConfig, drafts: Sequence[str] = REPORT_DRAFTS) -> dict:
    """tau per draft structure and top-1 agreement per depth of one drafter."""
    was_training = getattr(drafter, "training", False)
    drafter.eval()
    try:
        return {"tau": {draft: mean_tau(target, drafter, conditions, draft, sampling) for draft in drafts},
                "agreement": agreement_by_depth(target, drafter, shards, sampling)}
    finally:
        drafter.train(was_training)


def quality_rows(name: str, measured: dict) -> list[str]:
    taus = " | ".join(f"{measured['tau'][draft]:.3f}" for draft in REPORT_DRAFTS)
    agreement = " | ".join("-" if a is None else f"{a:.3f}" for a in measured["agreement"])
    return [f"| {name} | {taus} | {agreement} |"]


def model_card(record: dict) -> str:
    """The drafter's README.md: what it is, how it was trained, and its measured quality."""
    settings, report = record["settings"], record["quality"]
    eagle3 = record["format"] == "eagle3"
    kind = {"eagle": "our Eagle-1 head (`coolsd.models.eagle.Drafter`)",
            "eagle3": f"our EAGLE-3 head (`coolsd.models.eagle.Eagle3Drafter`), reading target layers "
                      f"{', '.join(map(str, record.get('taps', [])))}",
            }.get(record["format"], "LANTERN's Eagle-1 drafter layout (`coolsd.models.lantern.LanternDrafter`)")
    depths = " | ".join(f"agree@{d}" for d in range(1, AGREEMENT_DEPTH + 1))
    objective = (f"* Objective: EAGLE-3's training-time test over {settings['ttt_steps']} steps (step k reads "
                 "its own step k - 1 prediction, attending as a chain draft's depth-k node), soft cross-entropy "
                 f"against the target's distribution only, step k weighted 0.8^k; input taps + "
                 f"U(-{settings['noise']}, {settings['noise']}) noise; {settings['unconditional']:.0%} of rows "
                 "unconditional; target and head frozen." if eagle3 else
                 f"* Objective: SmoothL1 on the next feature + {settings['ce_weight']} x soft cross-entropy against "
                 f"the target head's distribution on the true next feature; input features + "
                 f"U(-{settings['noise']}, {settings['noise']}) noise; {settings['unconditional']:.0%} of rows "
                 "unconditional; target and head frozen.")
    lines = [
        f"# {'EAGLE-3' if eagle3 else 'Eagle-1'} drafter for {record['target']}",
        "",
        f"A self-distilled drafter in {kind}, trained by `coolsd.train drafter`. Use it with "
        "`python -m coolsd.generate --model <this directory>` or `coolsd.load_bundle(<this directory>)`.",
        "",
        "## Quality (held-out conditions)",
        "",
        f"{report['images']} images, sampling {report['sampling']}, Eagle-1 (lossless).",
        "",
        f"| drafter | tau {' | tau '.join(REPORT_DRAFTS)} | {depths} |",
        "|---" * (1 + len(REPORT_DRAFTS) + AGREEMENT_DEPTH) + "|",
        *quality_rows("this drafter", report["new"]),
        *(quality_rows("the model's Eagle-1 drafter" if eagle3 else "the model's previous drafter",
                       report["existing"]) if "existing" in report else []),
        "",
        "* `tau`: mean over images of the mean accepted length (accepted drafts + 1 per target forward, the prefill "
        "counted as a round). Image `i` uses class `i mod C` (or the `i`-th example prompt) and seed `i`.",
        "* `agree@d`: teacher-forced top-1 agreement at draft depth `d`: on sequences the target sampled for these "
        "conditions, from each slot `s >= P-1` the drafter drafts `d` steps from its own predicted features, fed the "
        "true next tokens and attending as a chain draft does; the fraction of positions where its guided "
        "distribution's most likely token is the target's.",
        "",
        "## Training",
        "",
        f"* Data: {settings['images']} images the target sampled itself (its own sampling settings, both CFG rows), "
        f"its final-normed features{' and the inputs of the tapped layers' if eagle3 else ''} recorded "
        f"({'in memory' if record['data_in_memory'] else 'in shards on disk'}).",
        objective,
        f"* Optimiser: AdamW (betas 0.9, 0.95, weight decay {settings['weight_decay']}), peak lr {settings['lr']}, "
        f"linear warm-up over {settings['warmup']:.0%} of the steps then cosine decay to 0, gradients clipped at "
        f"{settings['grad_clip']} (by value); {settings['epochs']} epochs of batches of {settings['batch']} = "
        f"{record['steps']} steps; bf16 autocast on CUDA, float32 on the CPU; seed {settings['seed']}.",
        f"* Loss: {record['loss_first_50']:.4f} (mean of the first 50 steps) -> {record['loss_last_50']:.4f} (last 50).",
        f"* Time on {record['device']} ({record['machine']}): "
        + ", ".join(f"{k} {v:.0f} s" for k, v in record["seconds_this_process"].items())
        + "; estimated beforehand: " + ", ".join(f"{k} {v:.0f} s" for k, v in record["estimated_seconds"].items())
        + " (the report's estimate is an upper bound).",
        "",
        "## Reproduce",
        "",
        "```bash",
        record["command"],
        "```",
        "",
    ]
    return "\n".join(lines)
