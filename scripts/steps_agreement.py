"""How many images the compiled phases decode to eager's exact tokens, on the shipped model (1 thread):

    python scripts/steps_agreement.py --images 200

Image i is class i mod 10 with seed i, for AR, Eagle-1 and COOL-SD delta=2 on chain:5 and SCD on jacobi:8:coupled.
Inductor's float32 kernels may round a target row differently from eager's, so a draw can differ where its uniform
falls within that rounding of a boundary (docs/performance.md, "The round compiled on a CPU")."""

import argparse

import torch

from coolsd.core.decode import generate
from coolsd.core.rules import build_rule
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import load_bundle

CASES = (("ar", "chain:5", {}), ("eagle", "chain:5", {}), ("cool", "chain:5", {"delta": 2.0}),
         ("eagle", "jacobi:8:coupled", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    images = parser.parse_args().images
    torch.set_num_threads(1)
    bundle = load_bundle()
    eager, compiled = bundle.with_steps("eager"), bundle.with_steps("compiled")
    for method, draft, params in CASES:
        tree = parse_draft(draft)
        rule = build_rule(method, params, tree.depth, bundle.target)
        differing = []
        for i in range(images):
            want = generate(eager, i % bundle.config.num_classes, rule, tree, seed=i).tokens
            got = generate(compiled, i % bundle.config.num_classes, rule, tree, seed=i).tokens
            if got != want:
                differing.append((i, next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)))
        print(f"{method} {draft}: {images - len(differing)}/{images} images identical; "
              f"(image, first differing token) of the others: {differing}", flush=True)


if __name__ == "__main__":
    main()
