"""``python -m coolsd.train``: ``drafter --model <preset or directory>`` (or ``--random-init``) trains a drafter for
any target (:mod:`coolsd.distill`); every other stage trains the shipped default model (:mod:`coolsd.toy.train`)."""

from __future__ import annotations

import sys


def wants_general_trainer(argv: list[str]) -> bool:
    """``drafter`` with a model to train for; a bare ``drafter`` is the shipped model's stage."""
    options = {arg.split("=", 1)[0] for arg in argv[1:]}
    return bool(argv) and argv[0] == "drafter" and bool(options & {"--model", "--random-init"})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_general_trainer(argv):
        from .distill.command import main as distill_main
        return distill_main(argv[1:])
    from .toy.train import main as toy_main
    return toy_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
