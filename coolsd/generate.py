"""``python -m coolsd.generate``: see :mod:`coolsd.cli.generate`."""

from .cli.generate import main

if __name__ == "__main__":
    raise SystemExit(main())
