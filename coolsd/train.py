"""``python -m coolsd.train``: every kind of training under one command. ``drafter --model <preset or directory>``
(or ``--random-init``) trains a drafter for any target (:mod:`coolsd.distill.command`); the stages of the shipped
default model (``judge`` ... ``export``, and ``drafter`` without a model) are :mod:`coolsd.toy.train`'s. A bad
command or option ends with one ``error:`` line and exit code 2."""

from __future__ import annotations

import sys

from .core.params import program, run_command, shorten


def wants_general_trainer(argv: list[str]) -> bool:
    """``drafter`` is the general trainer unless every option given is one the default model's drafter stage
    uses: a bare ``drafter`` (or with ``--work``, ``--steps``...) is that stage; ``--model``, ``--random-init``,
    ``--help``, ``--out`` (the stage writes none: export does) or any of the general trainer's own options
    (``--images``...) name the general one, which then asks for what is missing."""
    if not argv or argv[0] != "drafter":
        return False
    from .toy.train import stage_options
    options = {arg.split("=", 1)[0] for arg in argv[1:] if arg.startswith("--") or arg == "-h"}
    return not options <= stage_options() - {"--out"}


def overview() -> str:
    """The help of ``python -m coolsd.train``: both kinds of training, one line each."""
    from .distill import command
    from .toy.train import help_lines, stage_lines
    general = " ".join(command.__doc__.split()).split(". ")[0] + "."
    return "\n".join([
        f"usage: {program('coolsd.train')} COMMAND [options]", "",
        "A drafter for any target (a preset, a model.json directory, a bundle, or a random-init shape):",
        help_lines([("drafter --model M --out DIR", f"{general} --random-init SIZE instead of --model: a randomly "
                                                    "initialised target.")]),
        "", "The shipped default model, stage by stage in this order (fixed seeds; checkpoints resume):",
        stage_lines(), "", "python -m coolsd.train COMMAND --help shows a command's options."])


def check_command(argv: list[str]) -> str:
    """The command named first: ``drafter`` or a default-model stage."""
    from .toy.train import STAGES
    if not argv:
        raise ValueError(f"give a command: {', '.join(STAGES)} (see python -m coolsd.train --help)")
    if argv[0] not in STAGES:
        raise ValueError(f"command must be one of: {', '.join(STAGES)}; got {shorten(argv[0])} "
                         "(see python -m coolsd.train --help)")
    return argv[0]


def dispatch(argv: list[str]) -> int:
    """The overview for ``--help``, else the command's own ``main`` (which checks its options)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(overview())
        return 0
    check_command(argv)
    if wants_general_trainer(argv):
        from .distill.command import main as distill_main
        return distill_main(argv[1:])
    from .toy.train import main as toy_main
    return toy_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: dispatch(argv))


if __name__ == "__main__":
    raise SystemExit(main())
