"""How many GPU seconds each ZeroGPU call asks for (its ``duration``). ZeroGPU refuses a visitor's call that asks
for more than the visitor's daily quota has left (2 minutes a day anonymous, 5 with a free account), and the
default of 60 s would allow one click a day: so each call asks for little more than it needs, computed from its
request (the tokens its runs decode) and from how fast this server's calls of the same model have been."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable

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

    def needed(self, model: str, tokens: int) -> int:
        """The whole seconds a call that decodes ``tokens`` tokens of ``model`` should ask for, uncapped."""
        return math.ceil(WORKER_START_S + MARGIN * tokens * self.rate(model))

    def seconds(self, model: str, tokens: int) -> int:
        """The duration such a call asks for: :meth:`needed`, at most :data:`LONGEST_S`."""
        return min(LONGEST_S, self.needed(model, tokens))

    def most_that_fit(self, model: str, tokens_of: Callable[[int], int], wanted: int) -> int:
        """The most of ``wanted`` repeats (at least one) whose call, of ``tokens_of(repeats)`` tokens, needs no
        more than :data:`LONGEST_S`: ZeroGPU stops a call that outlasts the duration it asked for."""
        return max((n for n in range(1, wanted + 1) if self.needed(model, tokens_of(n)) <= LONGEST_S), default=1)
