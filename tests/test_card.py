"""The model card is written from measured numbers only: the round's phases in AR steps, the drafter's training
row from the general trainer's record, and the shape choice the bundle records, each checked here against
numbers computed in the test."""

import json

from coolsd.models.bundle import DEFAULT_MODEL, load_bundle
from coolsd.toy import card


def part(seconds: float) -> dict:
    return {"median_s": seconds, "iqr_s": [seconds, seconds], "repeats": 30}


def test_the_card_states_the_rounds_phases_in_ar_steps_and_the_trainers_record(tmp_path):
    bundle = load_bundle(DEFAULT_MODEL)
    metrics = json.loads((DEFAULT_MODEL / "metrics.json").read_text())
    metrics["round"] = {"ar_step": part(0.008), "verify chain:5": part(0.0096), "acceptance chain:5": part(0.0004),
                        "drafting chain:5": part(0.002), "drafter_level": part(0.00032), "round chain:5": part(0.012)}
    record = {"steps": 1234, "settings": {"batch": 16, "images": 5000}, "loss_last_50": 0.5,
              "seconds_this_process": {"data": 60.0, "training": 120.0, "report": 600.0}, "command": "train it"}
    choice = {"why": "Deep and narrow.", "commands": ["measure it"],
              "shapes": [{"shape": "32 x 96", "parameters": 3644544, "measured": "round 1.4 AR steps"}]}
    bundle.info = {**bundle.info, "drafter_training": record, "shape_choice": choice,
                   "training": {**bundle.info["training"], "reused": "Judge and tokenizer reused.",
                                "recipe": "make the target\n{drafter_command}"}}
    card.write_card(metrics, tmp_path, bundle)
    text = (tmp_path / "README.md").read_text()
    # 12 / 8 = 1.50 AR steps a round: 9.6 / 8 = 1.20 verification, 2 / 8 = 0.25 drafting, 0.32 / 8 = 0.04 a level
    assert ("in AR steps (median of 30 repeats; AR step 8.00 ms) | **1.50**: verification 1.20, drafting 0.25 "
            "(a drafter level 0.040), acceptance 0.05 |") in text
    assert "| drafter | 1234 x 16 | 3 min | final loss 0.500 (SmoothL1 + 0.1 soft CE) |" in text  # data + training
    assert "on 5,000 images the target sampled" in text
    assert "## Why this shape\n\nDeep and narrow." in text and "| 32 x 96 | 3,644,544 | round 1.4 AR steps |" in text
    assert "Judge and tokenizer reused.\n\nLabel dropout" in text and "make the target\ntrain it\n" in text


def test_the_shipped_card_renders_unchanged_from_its_own_metrics(tmp_path):
    """The card command's output is a function of the shipped bundle and its metrics: re-rendering reproduces the
    shipped card exactly (no hand edits)."""
    bundle = load_bundle(DEFAULT_MODEL)
    card.write_card(json.loads((DEFAULT_MODEL / "metrics.json").read_text()), tmp_path, bundle)
    assert (tmp_path / "README.md").read_text() == (DEFAULT_MODEL / "README.md").read_text()
