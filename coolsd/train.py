"""``python -m coolsd.train``: see :mod:`coolsd.toy.train`."""

from .toy.train import main

if __name__ == "__main__":
    raise SystemExit(main())
