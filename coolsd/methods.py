"""Method specifications as users type them: ``cool:delta=2,nu=0.7`` or ``lantern:k=10,lambda=5,residual=gstar``."""

from __future__ import annotations

from .decode import METHODS


def parse_value(text: str) -> int | float | str:
    """``3`` -> 3, ``2.5`` -> 2.5, anything else (``auto``, ``gstar``) stays a string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_method(spec: str) -> tuple[str, dict]:
    """``name[:key=value,...]`` -> (name, params)."""
    name, _, rest = spec.strip().partition(":")
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {name!r} in {spec!r}")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"method parameters look like key=value, got {item!r} in {spec!r}")
        params[key.strip()] = parse_value(value.strip())
    return name, params


def method_label(name: str, params: dict) -> str:
    """Inverse of :func:`parse_method`, for tables and legends."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
