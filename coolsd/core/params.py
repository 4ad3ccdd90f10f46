"""The one definition of every user-facing parameter's range: the app's sliders, its API, ``generate`` and
``bench`` all check values here, and the README's parameter table lists the same numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was, so a huge value never floods a message or
    a log."""
    return text if len(text) <= limit else f"{text[:max(limit - 20, 1)]}... ({len(text)} chars)"


def shorten(value: Any, limit: int = 40) -> str:
    """``repr(value)``, clipped: how a bad value is quoted in an error message."""
    return clip(repr(value), limit)


@dataclass(frozen=True)
class Param:
    """A numeric parameter: its allowed closed range, default, slider step and label."""

    name: str
    low: float
    high: float
    default: float
    step: float
    label: str
    integer: bool = False

    def check(self, value: Any, high: float | None = None) -> float | int:
        """A finite number in ``[low, high]`` (numeric strings accepted), else a ValueError that names the
        parameter, the (shortened) value and the range. ``high`` overrides the upper bound (top-k: the vocabulary)."""
        high = self.high if high is None else high
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(f"{self.name} is missing (allowed: {self.low:g} to {high:g})")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{self.name} must be a number, got {shorten(value)}")
        if self.integer and isinstance(value, int):  # exact, even beyond float precision (seeds up to 2^63)
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{self.name} must be a number, got {shorten(value)}") from None
            if not math.isfinite(number):
                raise ValueError(f"{self.name} must be a finite number, got {shorten(value)}")
        if self.integer:
            if number != int(number):
                raise ValueError(f"{self.name} must be a whole number, got {shorten(value)}")
            number = int(number)
        if not self.low <= number <= high:
            raise ValueError(f"{self.name} must be between {self.low:g} and {high:g}, got {shorten(value)}")
        return number


PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("delta", 0.05, 5.0, 2.0, 0.05, "δ (delta): total relaxation"),
    Param("nu", -1.0, 2.0, 0.7, 0.05, "ν (nu): decay per draft position"),
    Param("mu", -5.0, 5.0, 0.0, 0.01, "μ (mu): offset"),
    Param("k", 0, 50, 10, 1, "LANTERN++ k (neighbours)", integer=True),
    Param("lambda", 1.0, 10.0, 5.0, 0.1, "LANTERN++ λ (lambda)"),
    Param("cfg_scale", 0.0, 10.0, 2.0, 0.1, "CFG scale"),
    Param("temperature", 0.1, 2.0, 1.0, 0.05, "Temperature"),
    Param("top_k", 0, 1_000_000, 0, 1, "Top-k (0 = off)", integer=True),  # at most the vocabulary in practice
    Param("top_p", 0.05, 1.0, 1.0, 0.01, "Top-p (1 = off)"),
    Param("seed", 0, 2**31 - 1, 0, 1, "Seed", integer=True),
    Param("timing_repeats", 0, 20, 0, 1, "Timing repeats (0 = no timing)", integer=True),
)}


def check(name: str, value: Any, high: float | None = None) -> float | int:
    """``PARAMS[name].check(value)``."""
    return PARAMS[name].check(value, high)
