"""The shipped model's tokens, pinned: every method on a chain and a tree, a few classes and seeds. A
refactoring of the engine or the models must leave them unchanged (record them again only when a change of
behaviour is intended, and say so): ``PYTHONPATH=. python tests/test_fingerprint.py``."""

import json
from pathlib import Path

import torch
from helpers import named

from coolsd.models.bundle import load_bundle

RECORD = Path(__file__).resolve().parent / "data" / "fashion_tokens.json"
METHODS = [("ar", {}), ("eagle", {}), ("uniform", {"delta": 2.0}), ("cool", {"delta": 2.0}),
           ("cool", {"delta": 2.0, "nu": 0.3, "schedule": "linear"}), ("cool", {"delta": 1.5, "nu": 0.7, "mu": 0.2}),
           ("lantern", {"k": 10, "lambda": 5.0, "residual": "gstar"}),
           ("lantern", {"k": 10, "lambda": 5.0, "residual": "lantern"})]
DRAFTS = ["chain:5", "tree:eagle25"]
CLASSES, SEEDS = [0, 7], [0, 1]


def cases() -> list[tuple[str, dict, str, int, int]]:
    return [(m, p, d, c, s) for m, p in METHODS for d in DRAFTS for c in CLASSES for s in SEEDS
            if not (m == "ar" and d != DRAFTS[0])]


def key(method: str, params: dict, draft: str, class_id: int, seed: int) -> str:
    return f"{method}:{json.dumps(params, sort_keys=True)}|{draft}|class={class_id}|seed={seed}"


def record() -> dict[str, list[int]]:
    bundle = load_bundle(device="cpu")
    return {key(*case): named(bundle, case[3], case[0], case[1], case[2], bundle.sampling, case[4]).tokens
            for case in cases()}


def test_shipped_model_tokens_are_unchanged():
    expected = json.loads(RECORD.read_text())
    got = record()
    assert set(got) == set(expected)
    changed = [k for k in got if got[k] != expected[k]]
    assert not changed, f"{len(changed)} of {len(got)} generations changed, e.g. {changed[:3]}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record()) + "\n")
    print(f"recorded {len(cases())} generations in {RECORD}")
