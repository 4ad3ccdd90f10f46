"""``python -m coolsd.card``: see :mod:`coolsd.toy.card`."""

from .toy.card import main

if __name__ == "__main__":
    raise SystemExit(main())
