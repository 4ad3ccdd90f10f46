"""The general drafter trainer (coolsd.distill) on tiny random targets: its data are the target's own features, its
loss is Eagle's, a short run lowers the loss and raises Eagle-1's tau, an interrupted run resumes bit for bit,
shards on disk train exactly as data in memory, the result loads through load_bundle (bundle directory and
model.json), and the cost estimate refuses what cannot fit."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from coolsd.core.decode import decode, generate
from coolsd.core.rules import Eagle
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import parse_draft
from coolsd.distill import command
from coolsd.distill.cost import Measured, check_budget, estimate
from coolsd.distill.data import BatchPlan, Shard, generate_shard
from coolsd.distill.heads import new_drafter
from coolsd.distill.objective import eagle_loss, pick_rows, step_loss, uniform_noise
from coolsd.distill.report import agreement_counts, causal, quality, report_conditions
from coolsd.distill.trainer import TrainConfig, train_drafter
from coolsd.models.bundle import Bundle, load_bundle, random_bundle
from coolsd.models.config import ModelConfig
from coolsd.models.gpt import Caption, Transformer
from coolsd.train import wants_general_trainer

CONFIG = TrainConfig(images=192, epochs=4, batch=32, lr=3e-3, gen_batch=64, checkpoint_every=5)


def sharp_bundle() -> Bundle:
    """random_bundle("tiny") with a 30x output head, so the target's next-token distributions are peaked (a
    random target's are nearly uniform, which any drafter matches), sampled with CFG 2 (both rows matter)."""
    bundle = random_bundle("tiny", device="cpu")
    with torch.no_grad():
        bundle.target.output.weight.mul_(30)
    bundle.sampling = SamplingConfig(cfg_scale=2.0)
    return bundle


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    bundle = sharp_bundle()
    return bundle, train_drafter(bundle, CONFIG, tmp_path_factory.mktemp("run"), progress=False)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- objective ---------------------------------------------------------------------------------------------------

def test_the_loss_is_smooth_l1_plus_a_tenth_of_the_soft_cross_entropy():
    torch.manual_seed(0)
    predicted, true_next = torch.randn(2, 3, 4) * 2, torch.randn(2, 3, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    diff = (predicted - true_next).abs()
    smooth_l1 = torch.where(diff < 1, 0.5 * diff**2, diff - 0.5).mean()
    p = torch.softmax(true_next @ head.weight.T, -1)
    soft_ce = -(p * torch.log_softmax(predicted @ head.weight.T, -1)).sum(-1).mean()
    loss, parts = eagle_loss(predicted, true_next, head)
    assert torch.allclose(loss, smooth_l1 + 0.1 * soft_ce)
    assert torch.allclose(parts["feature"], smooth_l1) and torch.allclose(parts["soft_ce"], soft_ce)
    assert TrainConfig().ce_weight == 0.1 and TrainConfig().unconditional == 0.1 and TrainConfig().noise == 0.1
    loss.backward()  # the soft label is a constant: only the prediction's side carries gradient
    assert head.weight.grad is not None


def test_rows_noise_and_batch_order():
    features = torch.arange(3 * 2 * 2 * 1.0).view(3, 2, 2, 1)
    batch = Shard(torch.zeros(3, 2, dtype=torch.long), features, torch.zeros(3, 2, 0, 1))
    picked, _ = pick_rows(batch, torch.tensor([False, True, False]))
    assert torch.equal(picked, torch.stack([features[0, 0], features[1, 1], features[2, 0]]))
    noise = uniform_noise(torch.zeros(20000), 0.1, torch.Generator().manual_seed(0))
    assert noise.abs().max() <= 0.1 and abs(noise.abs().mean() - 0.05) < 0.002 and abs(noise.mean()) < 0.002
    plan = BatchPlan([5, 3], batch=3, seed=0)
    epoch = [item for step in range(plan.steps_per_epoch) for item in plan.items(step)]
    assert sorted(epoch) == [(0, i) for i in range(5)] + [(1, i) for i in range(3)]  # every image once per epoch
    assert plan.items(plan.steps_per_epoch) != plan.items(0) or plan.epoch_order(1) != plan.epoch_order(0)


# --- data ------------------------------------------------------------------------------------------------------

def test_recorded_features_are_the_targets_teacher_forced_features_of_both_rows():
    bundle = sharp_bundle()
    target = bundle.target
    shard = generate_shard(target, bundle.drafter, [0, 3, 1], bundle.sampling, torch.Generator().manual_seed(0))
    assert shard.tokens.shape == (3, 16) and shard.features.shape == (3, 2, 16, 32)
    positions = torch.arange(16)
    for row, labels in ((0, torch.tensor([0, 3, 1])), (1, torch.full((3,), target.config.null_class))):
        reference = target(target.sequence_inputs(target.class_prefix(labels), shard.tokens), positions)
        assert torch.allclose(shard.features[:, row], reference, atol=1e-5)


def text_bundle() -> Bundle:
    """A tiny text-conditioned target (8 caption slots, some padded) whose 'text encoder' hashes prompts."""
    cfg = ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, grid_height=4, grid_width=4, multiple_of=16,
                      cls_token_num=8, caption_dim=12)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    with torch.no_grad():
        target.output.weight.mul_(30)

    def encoder(prompts):
        captions = []
        for prompt in prompts:
            g = torch.Generator().manual_seed(len(prompt))
            valid = torch.arange(8) >= 8 - min(8, len(prompt.split()))
            captions.append(Caption(torch.randn(8, 12, generator=g) * valid[:, None], valid, prompt))
        return captions

    from coolsd.models.eagle import Drafter
    return Bundle(target, Drafter(cfg).eval(), F.normalize(torch.randn(16, 8), dim=-1), sampling=SamplingConfig(3.0),
                  text_encoder=encoder)


def test_a_text_model_trains_on_its_prompts(tmp_path):
    bundle = text_bundle()
    target = bundle.target
    captions = bundle.text_encoder(["a red fox", "two cats on a mat today"])
    shard = generate_shard(target, bundle.drafter, captions, bundle.sampling, torch.Generator().manual_seed(0))
    assert shard.features.shape == (2, 2, 8 + 15, 32) and shard.lead.shape == (2, 2, 7, 32)
    prefix = target.prefix(captions[1], 2)
    inputs = torch.cat([prefix.embeds, target.embed(shard.tokens[1, :-1])[None].expand(2, -1, -1)], 1)
    reference = target(inputs, torch.arange(23), valid=torch.cat([prefix.valid, torch.ones(2, 15, dtype=bool)], 1))
    assert torch.allclose(shard.features[1].float(), reference, atol=1e-5)
    assert torch.equal(shard.lead[1], prefix.embeds[:, 1:])  # our head pairs slot s with the prefix's s + 1
    config = dataclasses.replace(CONFIG, images=64, epochs=3)
    result = train_drafter(bundle, config, tmp_path, ["a red fox", "a blue bird in a tree", "an old boat"],
                           progress=False)
    assert result.finished and sum(result.losses[-3:]) < sum(result.losses[:3])


def test_a_step_noises_the_inputs_only_picks_rows_and_scores_the_image_slots():
    """step_loss against the recipe spelled out: 10% unconditional rows, U(-0.1, 0.1) noise on the input features
    (not on the targets), the prefix's lead inputs, and only slots P-1.. scored (P = 8 here)."""
    bundle = text_bundle()
    target, drafter = bundle.target, bundle.drafter
    shard = generate_shard(target, drafter, bundle.text_encoder(["a b c", "d e f g h i j k l", "m"]), bundle.sampling,
                           torch.Generator().manual_seed(1))
    loss, _ = step_loss(drafter, target.logits, shard, 8, torch.Generator().manual_seed(7), unconditional=0.5)
    g = torch.Generator().manual_seed(7)
    row = (torch.rand(3, generator=g) < 0.5).long()
    assert 0 < row.sum() < 3  # both kinds of rows in this batch
    features, lead = shard.features[torch.arange(3), row], shard.lead[torch.arange(3), row]
    noisy = features[:, :-1] + (2 * torch.rand(features[:, :-1].shape, generator=g) - 1) * 0.1
    inputs = torch.cat([lead, target.embed(shard.tokens[:, :-1])], 1)
    predicted = drafter(inputs, noisy, torch.arange(22))
    expected, _ = eagle_loss(predicted[:, 7:], features[:, 8:], target.logits)
    assert torch.allclose(loss, expected)


# --- training ----------------------------------------------------------------------------------------------------

def test_a_short_run_lowers_the_loss_and_raises_tau(trained):
    bundle, result = trained
    assert result.finished and len(result.losses) == CONFIG.steps
    assert sum(result.losses[-5:]) / 5 < 0.8 * sum(result.losses[:5]) / 5
    conditions = report_conditions(bundle, 8)
    shards = [generate_shard(bundle.target, result.drafter, conditions, bundle.sampling,
                             torch.Generator().manual_seed(99))]
    after = quality(bundle.target, result.drafter, conditions, shards, bundle.sampling)
    before = quality(bundle.target, new_drafter(bundle, CONFIG.seed), conditions, shards, bundle.sampling)
    assert after["tau"]["chain:5"] > before["tau"]["chain:5"] + 0.5, (before, after)
    assert after["tau"]["tree:eagle25"] > before["tau"]["tree:eagle25"] + 0.5, (before, after)
    assert after["agreement"][0] > before["agreement"][0] + 0.2
    assert all(not p.requires_grad for p in bundle.target.parameters())


def test_an_interrupted_run_resumes_bit_for_bit(trained, tmp_path):
    _, full = trained

    def interrupt(step, loss):
        if step == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_drafter(sharp_bundle(), CONFIG, tmp_path, progress=False, after_step=interrupt)
    part = train_drafter(sharp_bundle(), CONFIG, tmp_path, progress=False, stop_after=13)  # resumes at 7, stops
    assert not part.finished and len(part.losses) == 13
    resumed = train_drafter(sharp_bundle(), CONFIG, tmp_path, progress=False)
    assert resumed.finished and resumed.losses == full.losses
    assert same_weights(resumed.drafter, full.drafter)


def test_data_streamed_from_disk_trains_exactly_as_data_in_memory(trained, tmp_path):
    _, in_memory = trained
    on_disk = train_drafter(sharp_bundle(), dataclasses.replace(CONFIG, memory_gb=0), tmp_path, progress=False)
    assert in_memory.in_memory and not on_disk.in_memory
    assert len(list((tmp_path / "shards").glob("shard-*.safetensors"))) == 3
    assert on_disk.losses == in_memory.losses and same_weights(on_disk.drafter, in_memory.drafter)


def guided_top1(target, features, scale=2.0):
    """The most likely token of CFG-guided logits, features (2B, T, dim) with the conditional rows first."""
    cond, uncond = target.logits(features).unflatten(0, (2, -1))
    return (uncond + scale * (cond - uncond)).argmax(-1)


def test_the_teacher_forced_agreement_is_what_a_chain_draft_sees(trained):
    """The batched, masked agreement pass counts what a chain draft made slot by slot with the drafter's cache
    (as the decoding loop drafts) would: from each slot s, levels 1..3 fed the sequence's true next tokens."""
    bundle, result = trained
    target, drafter, sampling = bundle.target, result.drafter, bundle.sampling
    shard = generate_shard(target, drafter, [1, 2], sampling, torch.Generator().manual_seed(5))
    agree, compared = agreement_counts(target, drafter, shard, sampling, depth=3)
    features = shard.features.transpose(0, 1).flatten(0, 1)  # (4, 16, dim): conditional rows first
    inputs = torch.cat([shard.lead.transpose(0, 1).flatten(0, 1), drafter.embed(shard.tokens.repeat(2, 1)[:, :-1])], 1)
    slow_agree, slow_compared = [0] * 3, [0] * 3
    with torch.no_grad():
        for s in range(15):  # slot s holds feature s and the input at s + 1; the last feature is at 15
            cache = drafter.new_cache(4, 32)
            feature = drafter(inputs[:, :s + 1], features[:, :s + 1], torch.arange(s + 1), cache, 0,
                              causal(s + 1, torch.device("cpu")))[:, -1:]
            cache.commit(list(range(s + 1)))
            for level in range(1, 4):
                if s + level > 15:
                    break
                if level > 1:
                    feature = drafter(inputs[:, s + level - 1:s + level], feature, torch.tensor([s + level - 1]), cache)
                    cache.commit([0])
                same = guided_top1(target, feature) == guided_top1(target, features[:, s + level:s + level + 1])
                slow_agree[level - 1] += int(same.sum())
                slow_compared[level - 1] += 2
    assert list(compared) == slow_compared and list(agree) == slow_agree
    assert 0 < sum(slow_agree) < sum(slow_compared)  # neither trivially all nor none


# --- saving, loading, command line -------------------------------------------------------------------------------

def test_the_command_line_writes_a_bundle_that_loads_and_decodes(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["drafter", "--random-init", "tiny", "--out", str(out), "--images", "64", "--epochs", "2",
            "--eval-images", "4", "--device", "cpu", "--no-progress", "--memory-gb", "0"]
    assert wants_general_trainer(argv) and not wants_general_trainer(["drafter"]) \
        and not wants_general_trainer(["target", "--model", "x"])
    from coolsd.train import main
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "cost estimate on cpu" in printed and "Eagle-1 tau: chain:5" in printed
    bundle = load_bundle(out, device="cpu")
    record = json.loads((out / "config.json").read_text())["drafter_training"]
    assert record["steps"] == 4 and set(record["quality"]["new"]["tau"]) == {"chain:5", "tree:eagle25"}
    assert not (out / "work" / "shards").exists()  # removed once the drafter is written
    saved = torch.load(out / "work" / "checkpoint.pt", weights_only=True)["drafter"]
    assert all(torch.equal(bundle.drafter.state_dict()[k], v) for k, v in saved.items())
    image = generate(bundle, 1, Eagle(), parse_draft("chain:5"), seed=0)
    assert len(image.tokens) == 16 and bundle.image(image.tokens).shape[-1] == 3
    card = (out / "README.md").read_text()
    assert "tau chain:5" in card and "agree@5" in card and "--random-init tiny" in card


def llamagen_dir(root):
    """A tiny class-to-image model.json directory in LlamaGen's formats (GPT .pt, VQ-16 .pt), no drafter."""
    from test_llamagen import random_model
    from test_vq16 import tiny_model

    args = {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": 16, "num_classes": 4, "block_size": 16,
            "model_type": "c2i", "multiple_of": 16}
    root.mkdir()
    torch.save({"model": random_model(args).state_dict()}, root / "gpt.pt")
    torch.save({"model": tiny_model(codebook_size=16).state_dict()}, root / "vq.pt")
    spec = {"family": "llamagen", "gpt": "gpt.pt", "vq": "vq.pt", "model_args": args,
            "vq_args": {"codebook_size": 16, "codebook_embed_dim": 8, "decoder_ch_mult": [1, 2], "z_channels": 32,
                        "ch": 32}, "sampling": {"cfg_scale": 2.0}}
    (root / "model.json").write_text(json.dumps(spec))
    return root


def test_a_model_json_target_gets_a_lantern_drafter_that_its_model_json_loads(tmp_path):
    source, out = llamagen_dir(tmp_path / "source"), tmp_path / "out"
    assert command.main(["--model", str(source), "--out", str(out), "--images", "64", "--epochs", "2",
                         "--eval-images", "2", "--device", "cpu", "--no-progress"]) == 0
    spec = json.loads((out / "model.json").read_text())
    assert spec["drafter"] == "drafter" and (out / "drafter" / "model.safetensors").exists()
    bundle = load_bundle(out, device="cpu")
    assert type(bundle.drafter).__name__ == "LanternDrafter"
    assert torch.equal(bundle.drafter.embed_tokens.weight, bundle.target.tok_embeddings.weight)  # frozen copy
    tokens = decode(bundle.target, bundle.drafter, 2, Eagle(), parse_draft("tree:eagle25"), bundle.sampling, 0).tokens
    assert len(tokens) == 16 and bundle.image(tokens).shape == (8, 8, 3)


def test_the_cost_estimate_scales_and_refuses_what_cannot_fit(tmp_path, capsys):
    bundle = sharp_bundle()
    measured = Measured(prefill=0.01, ar_step=0.002, train_step=0.05, round=0.003)
    small = estimate(bundle, CONFIG, measured, eval_images=4)
    double = estimate(bundle, dataclasses.replace(CONFIG, images=2 * CONFIG.images), measured, eval_images=4)
    assert math.isclose(small.training, CONFIG.steps * 0.05)
    assert math.isclose(double.training, 2 * small.training)
    assert double.generation > 1.5 * small.generation and double.data_bytes == 2 * small.data_bytes
    check_budget(small, max_hours=1, force=False)
    with pytest.raises(ValueError, match="more than --max-hours"):
        check_budget(small, max_hours=small.total / 3600 / 2, force=False)
    check_budget(small, max_hours=small.total / 3600 / 2, force=True)
    out = tmp_path / "absurd"
    assert command.main(["--random-init", "tiny", "--out", str(out), "--images", "50000000", "--epochs", "1000",
                         "--device", "cpu", "--no-progress"]) == 2
    assert "more than --max-hours 12" in capsys.readouterr().err and not out.exists()
