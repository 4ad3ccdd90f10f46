"""``python -m coolsd.card``: see :mod:`coolsd.toy.card`; the round's phases are timed by the profiler of
``python -m coolsd.bench --profile``."""

from .cli.profile import profile
from .models.bundle import Bundle
from .toy.card import main as card_main


def round_parts(bundle: Bundle, repeats: int) -> dict:
    """Each part of a round, timed from a saved mid-image state (:func:`coolsd.cli.profile.profile`)."""
    return profile(bundle, bundle.sampling, repeats=repeats, images=0)["parts"]


def main(argv: list[str] | None = None) -> int:
    return card_main(argv, round_profile=round_parts)


if __name__ == "__main__":
    raise SystemExit(main())
