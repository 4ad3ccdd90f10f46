"""How often Generate's live view sends a picture: the app's Generate handler called directly, on the default
model and on a random model slow enough to watch (24 x 24 tokens, 8 layers of width 192), a few fresh seeds
each; per call the pictures sent before the final images, the seconds to the final images, pictures per
second and the shortest gap between two pictures. The cap is ten a second (``coolsd.app.session.LIVE_INTERVAL``).

    python scripts/live_rate.py [--seeds 5]
"""

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from coolsd.app import session
from coolsd.app.web import generation, inputs, runtime
from coolsd.models.bundle import Bundle, Drafter, Transformer
from coolsd.models.config import ModelConfig


def slow_model() -> Bundle:
    config = ModelConfig(vocab_size=256, dim=192, n_layer=8, n_head=4, num_classes=10, grid_height=24, grid_width=24)
    torch.manual_seed(0)
    codes = torch.nn.functional.normalize(torch.randn(config.vocab_size, 8), dim=-1)
    return Bundle(Transformer(config).eval(), Drafter(config).eval(), codes, name="slow",
                  class_names=runtime.current().bundle.class_names)


def one_call(model: str, seed: int) -> tuple[int, float, float, float | None]:
    values = {**inputs.defaults(), "model": model, "seed": seed}
    started, stamps = time.perf_counter(), []
    for _ in generation.on_generate(*[values[name] for name in session.value_names()], progress=lambda *a, **k: None):
        stamps.append(time.perf_counter())
    pictures, seconds = len(stamps) - 1, stamps[-1] - started
    gaps = [b - a for a, b in itertools.pairwise(stamps[:-1])]
    return pictures, seconds, pictures / seconds, min(gaps) if gaps else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="fresh seeds (1..N) per model")
    args = parser.parse_args()
    state = runtime.start()  # the app's state, as app.py makes it
    state.models.loaded["slow"] = slow_model()
    print(f"torch threads: {torch.get_num_threads()}; per call: (pictures, seconds, pictures per second, "
          "shortest gap in seconds)")
    for model in ("default", "slow"):
        rows = [one_call(model, seed) for seed in range(1, args.seeds + 1)]
        print(model, [(p, round(s, 3), round(r, 2), None if g is None else round(g, 3)) for p, s, r, g in rows])


if __name__ == "__main__":
    main()
