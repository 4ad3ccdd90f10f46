"""Parameter checking: one validation helper (:func:`number`) and the schema types a rule's parameters are
declared with (:class:`Param`, :class:`Choice`). The rule registry (:mod:`coolsd.core.rules`) holds the method
parameters; :data:`PARAMS` holds the others (sampling, seed, timing). The app's controls, its API, ``generate``
and ``bench`` all check values here, and the parameter table of docs/app.md lists the same numbers. Every command line
ends on bad input with one ``error:`` line and exit code 2 (:class:`OneLineParser`, :func:`run_command`)."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was, so a huge value never floods a message or
    a log."""
    return text if len(text) <= limit else f"{text[:max(limit - 20, 1)]}... ({len(text)} chars)"


def shorten(value: Any, limit: int = 40) -> str:
    """``repr(value)``, clipped: how a bad value is quoted in an error message."""
    return clip(repr(value), limit)


def number(name: str, value: Any, low: float | None = None, high: float | None = None, *, integer: bool = False,
           above: float | None = None) -> int | float:
    """``value`` as a finite number (numeric strings accepted; never a bool), whole if ``integer``, within
    ``[low, high]`` and ``> above`` where given; else a ValueError naming the parameter, the (shortened) value
    and what is allowed. Every numeric check of the project goes through here."""
    allowed = describe_range(low, high, above)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is missing (allowed: {allowed})")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) and not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be a number, got {shorten(value)}")
    if integer and not isinstance(value, (str, float)):
        number_value = int(value)  # exact, even beyond float precision (seeds up to 2^63)
    else:
        try:
            number_value = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name} must be a number, got {shorten(value)}") from None
        if not math.isfinite(number_value):
            raise ValueError(f"{name} must be a finite number, got {shorten(value)}")
        if integer:
            if number_value != int(number_value):
                raise ValueError(f"{name} must be a whole number, got {shorten(value)}")
            number_value = int(number_value)
    if (low is not None and number_value < low) or (high is not None and number_value > high) or \
            (above is not None and number_value <= above):
        raise ValueError(f"{name} must be {allowed}, got {shorten(value)}")
    return number_value


def show_number(value: float) -> str:
    """A range end as people write it: a whole number in full (``2147483647``, where ``:g`` gives
    ``2.14748e+09``), any other in ``:g``'s short form (``0.05``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 token``, ``0 tokens``, ``2 accepted drafts``: a count with its noun in the number it takes, so that no
    caption reads "1 tokens" (``plural`` where adding an s is wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def describe_range(low: float | None, high: float | None, above: float | None = None) -> str:
    """``between 0.05 and 5``, ``> 0``, ``>= 1``, or ``any finite number``."""
    if low is not None and high is not None:
        return f"between {show_number(low)} and {show_number(high)}"
    bounds = ((">", above), (">=", low), ("<=", high))
    return " and ".join(f"{sign} {show_number(end)}" for sign, end in bounds if end is not None) or "any finite number"


@dataclass(frozen=True)
class Param:
    """A numeric parameter: its allowed closed range, default, slider step, label and help. ``words`` are
    non-numeric values it also takes (``mu``: ``auto``)."""

    name: str
    low: float
    high: float
    default: float | str
    step: float
    label: str
    integer: bool = False
    help: str = ""
    words: tuple[str, ...] = ()

    def span(self) -> str:
        """The allowed values as a command line's help gives them: ``0 to 2147483647``, ``-5 to 5 or auto``."""
        return f"{show_number(self.low)} to {show_number(self.high)}" + "".join(f" or {word}" for word in self.words)

    def check(self, value: Any, high: float | None = None) -> float | int | str:
        """A number in ``[low, high]`` (or one of ``words``), else a ValueError that names the parameter, the
        (shortened) value and the range. ``high`` overrides the upper bound (top-k: the vocabulary)."""
        if isinstance(value, str) and value.strip().lower() in self.words:
            return value.strip().lower()
        try:
            return number(self.name, value, self.low, self.high if high is None else high, integer=self.integer)
        except ValueError as error:
            raise ValueError(f"{error}; or {' or '.join(self.words)}" if self.words else str(error)) from None


@dataclass(frozen=True)
class Choice:
    """A parameter with named values (a schedule, a residual)."""

    name: str
    choices: tuple[str, ...]
    default: str
    label: str
    help: str = ""

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise ValueError(f"{self.name} must be one of: {', '.join(self.choices)}; got {shorten(value)}")
        return value


PROMPT_CHARS = 1000  # the longest prompt the app and the command line accept (T5 reads only the caption slots)


def check_prompt(prompt: Any) -> str:
    """A text model's prompt: a non-empty string of at most :data:`PROMPT_CHARS` characters, stripped; the app
    and ``generate`` refuse the same prompts with the same message."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt must be a non-empty text for a text-to-image model, got {shorten(prompt)}")
    if len(prompt) > PROMPT_CHARS:
        raise ValueError(f"prompt must be at most {PROMPT_CHARS} characters long, got {len(prompt)} characters")
    return prompt.strip()


PARAMS: dict[str, Param] = {p.name: p for p in (
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


def program(module: str) -> str:
    """The command's name for its usage line, as it was called: pyproject's console script for ``module``
    (``coolsd-generate`` for ``coolsd.generate``) when that is what runs, else ``python -m coolsd.generate``. A
    fixed ``prog`` would tell a user of the installed script to type a command they did not."""
    script = module.replace(".", "-")
    return script if Path(sys.argv[0]).name == script else f"python -m {module}"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error raises ValueError, so :func:`run_command` prints it as one ``error:`` line."""

    def error(self, message: str):
        raise ValueError(f"{message} (see --help)")


def run_command(work: Callable[[], int]) -> int:
    """Run a command's work; a bad option or an unreadable file ends it with one ``error:`` line and exit code 2."""
    try:
        return work()
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
