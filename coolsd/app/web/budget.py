"""How many GPU seconds each ZeroGPU call asks for (its ``duration``). ZeroGPU refuses a visitor's call that asks
for more than the visitor's daily quota has left (2 minutes a day anonymous, 5 with a free account), and the
default of 60 s would allow one click a day: so each call asks for little more than it needs, computed from its
request (the tokens its runs decode) and from how fast this server's calls of the same model have been."""

from __future__ import annotations

import math
import threading
from collections import deque

WORKER_START_S = 5.0  # a fresh worker's fork, CUDA start and weight copy (docs/space.md: not measured on a GPU yet)
MARGIN = 2.0  # on the measured rate: live pictures, a slower call, a busier GPU
FIRST_RATE_S = 0.02  # seconds per token of one run before the model has been measured here (docs/space.md)
LONGEST_S = 120  # never more than an anonymous visitor's whole day
KEPT = 8  # the model's recent measured calls, the slowest of which sets the rate


class Budget:
    """The measured GPU seconds per decoded token of each model's recent calls, and the durations they give."""

    def __init__(self) -> None:
        self.rates: dict[str, deque[float]] = {}
        self.lock = threading.Lock()

    def record(self, model: str, seconds: float, tokens: int) -> None:
        """A finished call's runs took ``seconds`` (as measured where they ran) for ``tokens`` decoded tokens."""
        if tokens > 0 and seconds > 0:
            with self.lock:
                self.rates.setdefault(model, deque(maxlen=KEPT)).append(seconds / tokens)

    def rate(self, model: str) -> float:
        """Seconds per token of one run: the slowest recent call's, or :data:`FIRST_RATE_S` before any."""
        with self.lock:
            return max(self.rates.get(model) or [FIRST_RATE_S])

    def seconds(self, model: str, tokens: int) -> int:
        """The duration a call that decodes ``tokens`` tokens of ``model`` asks for, in whole seconds."""
        return min(LONGEST_S, math.ceil(WORKER_START_S + MARGIN * tokens * self.rate(model)))
