"""``python -m coolsd.bench``: see :mod:`coolsd.cli.bench`."""

from .cli.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
