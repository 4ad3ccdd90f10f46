"""Every training stage runs a few steps on tiny synthetic data and its loss falls; checkpoints resume."""

import re

import pytest
import torch

from coolsd.models.config import ModelConfig
from coolsd.toy.data import to_uint8, to_unit
from coolsd.toy.judge import Judge, judge_metrics, new_fid, reference_statistics
from coolsd.toy.train import (
    Schedule,
    accuracy,
    tokenize,
    train_drafter,
    train_judge,
    train_target,
    train_tokenizer,
)
from coolsd.toy.vq import VQConfig

TINY = ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, num_classes=4, grid_height=8, grid_width=8,
                   multiple_of=16)


def synthetic_images(n=128, classes=4, seed=0):
    """Class c is a bright bar in quarter c of the image, plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    images = torch.randint(0, 40, (n, 28, 28), generator=g)
    for i, c in enumerate(labels.tolist()):
        images[i, 7 * c:7 * c + 6, 4:24] = 230
    return images.to(torch.uint8), labels


def synthetic_tokens(n=64, classes=4, length=64, vocab=16):
    """Token sequences that depend on the class: (c + position) mod vocab, with one random token."""
    labels = torch.arange(n) % classes
    tokens = (labels[:, None] + torch.arange(length)[None]) % vocab
    tokens[:, 5] = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0))
    return tokens, labels


def falls(losses, k=5):
    return sum(losses[-k:]) / k < 0.8 * sum(losses[:k]) / k


def test_judge_trains_and_resumes(tmp_path):
    images, labels = synthetic_images()
    schedule = Schedule(steps=40, batch=32, lr=3e-3, warmup=5, checkpoint_every=20)
    judge, losses = train_judge(images, labels, schedule, tmp_path / "judge.ckpt", progress=False)
    assert falls(losses)
    assert accuracy(judge, images, labels) > 0.9
    longer = Schedule(steps=45, batch=32, lr=3e-3, warmup=5, checkpoint_every=20)
    _, resumed = train_judge(images, labels, longer, tmp_path / "judge.ckpt", progress=False)
    assert len(resumed) == 45 and resumed[:40] == losses  # picked up at step 40


def test_tokenizer_trains():
    images, labels = synthetic_images()
    cfg = VQConfig(codebook_size=16, code_dim=4, channels=(8, 8, 8))
    model, losses = train_tokenizer(images, Judge(), Schedule(steps=40, batch=16, lr=3e-3, warmup=5), cfg,
                                    progress=False)
    assert falls(losses)
    codes = tokenize(model, images[:8])
    assert codes.shape == (8, 64) and int(codes.max()) < 16
    pictures = model.decode_to_uint8(codes.view(-1, 8, 8))
    assert pictures.shape == (8, 28, 28) and pictures.dtype.name == "uint8"


def test_target_and_drafter_train():
    tokens, labels = synthetic_tokens()
    target, losses = train_target(tokens, labels, TINY, Schedule(steps=40, batch=16, lr=3e-3, warmup=5),
                                  progress=False)
    assert falls(losses)
    drafter, draft_losses = train_drafter(target, tokens, labels, Schedule(steps=40, batch=16, lr=3e-3, warmup=5),
                                          progress=False)
    assert falls(draft_losses)
    assert all(not p.requires_grad for p in target.parameters())  # the target stays frozen


def test_judge_metrics_on_known_input():
    """Real images scored against their own reference statistics: FID ~ 0, accuracy = the judge's accuracy;
    a shifted set gets a clearly larger FID."""
    images, labels = synthetic_images(256)
    judge, _ = train_judge(images, labels, Schedule(steps=30, batch=32, lr=3e-3, warmup=5), progress=False)
    judge.reference = reference_statistics(judge, images)

    same = judge_metrics(judge, list(images.numpy()), labels.tolist())
    assert same["judge_accuracy"] == accuracy(judge, images, labels)
    assert abs(same["fid"]) < 1e-3
    shifted = judge_metrics(judge, list(torch.roll(images, 7, dims=2).numpy()), labels.tolist())
    assert shifted["fid"] > 1.0
    wrong = judge_metrics(judge, list(images.numpy()), ((labels + 1) % 4).tolist())
    assert wrong["judge_accuracy"] < 0.2
    fid = new_fid(judge, judge.reference)
    assert int(fid.real_features_num_samples) == 256


def test_image_round_trip_helpers():
    images, _ = synthetic_images(4)
    assert torch.equal(to_uint8(to_unit(images)), images)


def test_target_shape_is_chosen_then_recorded_and_read_back():
    from coolsd.models.config import CONFIGS
    from coolsd.toy.train import TARGET_CONFIG, target_config

    assert target_config(None, {}) == TARGET_CONFIG == CONFIGS["fashion-deep"]
    assert target_config("fashion", {}) == CONFIGS["fashion"]
    log = {"target": {"shape": CONFIGS["fashion"].to_dict()}}  # what stage_target writes
    assert target_config(None, log) == CONFIGS["fashion"] and target_config("fashion-deep", log) == TARGET_CONFIG



def test_export_writes_a_drafter_only_when_its_stage_ran(tmp_path):
    """Without the drafter stage's weights, export writes a target-only bundle (what the general drafter trainer
    self-distils from); with them, the bundle carries that drafter."""
    from coolsd.models.bundle import load_bundle
    from coolsd.models.eagle import Drafter
    from coolsd.models.gpt import Transformer
    from coolsd.toy.judge import save_judge
    from coolsd.toy.train import export
    from coolsd.toy.vq import VQModel, save_tokenizer

    cfg = ModelConfig(vocab_size=512, dim=32, n_layer=2, n_head=2, num_classes=10, grid_height=8, grid_width=8,
                      multiple_of=16)
    torch.manual_seed(0)
    save_tokenizer(VQModel(VQConfig()), tmp_path)
    judge = Judge()
    save_judge(judge, reference_statistics(judge, synthetic_images(16)[0]), tmp_path)
    target = Transformer(cfg)
    torch.save(target.state_dict(), tmp_path / "target.pt")
    export(tmp_path, tmp_path / "alone", cfg)
    alone = load_bundle(tmp_path / "alone")
    assert alone.drafter is None and not (tmp_path / "alone" / "drafter.safetensors").exists()
    assert torch.equal(alone.target.output.weight, target.output.weight)
    drafter = Drafter(cfg)
    torch.save(drafter.state_dict(), tmp_path / "drafter.pt")
    export(tmp_path, tmp_path / "both", cfg)
    assert torch.equal(load_bundle(tmp_path / "both").drafter.fc.weight, drafter.fc.weight)

# --- the command line: python -m coolsd.train ----------------------------------------------------------------

def shown(text: str) -> str:
    """Help text with argparse's line wrapping undone."""
    return " ".join(text.split())


def test_train_help_lists_both_kinds_of_training(capsys):
    from coolsd import train

    assert train.main(["--help"]) == 0
    text = shown(capsys.readouterr().out)
    assert "drafter --model" in text and "--random-init" in text  # the general trainer, found at the top
    assert "Train an Eagle-1 drafter for any target coolsd loads, by self-distillation." in text
    for stage, words in (("judge", "quality judge"), ("tokenizer", "VQ autoencoder"), ("target", "transformer"),
                         ("export", "bundle"), ("codes", "tokenize")):
        assert f" {stage} " in text and words in text, stage
    assert "drafter (without --model)" in text  # the default model's drafter stage, told apart


def test_train_drafter_help_is_the_general_trainers_in_full(capsys):
    from coolsd import train

    for argv in (["drafter", "--help"], ["drafter", "--model", "x", "--help"], ["drafter", "-h"]):
        with pytest.raises(SystemExit) as done:
            train.main(argv)
        assert done.value.code == 0
        raw = capsys.readouterr().out
        text = shown(raw)
        assert text.startswith("usage: python -m coolsd.train drafter") and "--model MODEL" in text
        assert "Train an Eagle-1 drafter for any target coolsd loads, by self-distillation." in text  # not cut
        assert "(default: None)" not in raw and "None" not in raw and "False" not in raw
        assert re.search(r"\(default[^)]*\)\s*\(default", raw) is None  # no option's default twice
        assert "--images IMAGES self-distilled images to generate (default 2000)" in text
        assert "python -m coolsd.train drafter --work runs/fashion" in text  # how to run the default model's stage


def test_a_stage_help_points_to_the_general_drafter_trainer(capsys):
    from coolsd import train

    with pytest.raises(SystemExit):
        train.main(["judge", "--help"])
    assert "python -m coolsd.train drafter --model" in shown(capsys.readouterr().out)


def test_drafter_is_the_default_models_stage_only_with_that_stages_options():
    from coolsd.train import wants_general_trainer

    assert not wants_general_trainer(["drafter"]) and not wants_general_trainer(["drafter", "--work", "w",
                                                                                 "--steps", "3"])
    assert wants_general_trainer(["drafter", "--help"]) and wants_general_trainer(["drafter", "--random-init=tiny"])
    assert wants_general_trainer(["drafter", "--out", "x", "--images", "5"])  # the general trainer's options
    assert wants_general_trainer(["drafter", "--out", "x"])  # the stage writes no --out; the trainer asks for --model
    assert not wants_general_trainer(["target", "--model", "x"])


@pytest.mark.parametrize("argv, needle", [
    ([], "give a command"), (["bogus"], "'bogus'"), (["judge", "--steps", "x"], "--steps"),
    (["judge", "--nope"], "--nope"), (["drafter", "--model", "x"], "--out"),
    (["drafter", "--out", "x", "--images", "5"], "--model"),
    (["drafter", "--random-init", "tiny", "--out", "x", "--images", "0"], "images"),
])
def test_train_errors_are_one_line(argv, needle, capsys):
    from coolsd import train

    assert train.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert needle in captured.err and "usage:" not in captured.err and captured.out == ""


@pytest.mark.parametrize("stage, missing, run_first", [("drafter", "train_tokens.pt", "tokenizer"),
                                                       ("target", "train_tokens.pt", "tokenizer")])
def test_a_stage_run_too_early_says_which_stage_to_run_first(tmp_path, stage, missing, run_first):
    from coolsd.toy.train import STAGES, StageContext, stage_schedule
    data = synthetic_images(4)
    context = StageContext(tmp_path, tmp_path, stage_schedule(stage, 1), data, data)
    with pytest.raises(ValueError, match=f"{missing} is missing: run `python -m coolsd.train {run_first}") as error:
        STAGES[stage](context, {})
    assert "\n" not in str(error.value)


def test_the_drafter_stage_with_codes_but_no_target_says_to_train_the_target_first(tmp_path):
    from coolsd.toy.train import STAGES, StageContext, stage_schedule
    torch.save(torch.zeros(4, 64, dtype=torch.long), tmp_path / "train_tokens.pt")
    data = synthetic_images(4)
    with pytest.raises(ValueError, match="target.pt is missing: run `python -m coolsd.train target`"):
        STAGES["drafter"](StageContext(tmp_path, tmp_path, stage_schedule("drafter", 1), data, data), {})
