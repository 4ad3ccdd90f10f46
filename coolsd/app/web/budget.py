"""How many GPU seconds each ZeroGPU call asks for (its ``duration``). ZeroGPU refuses a visitor's call that asks
for more than the visitor's daily quota has left (2 minutes a day anonymous, 5 with a free account), and the
default of 60 s would allow one click a day: so each call asks for little more than it needs, computed from its
request (the tokens each of its runs decodes) and from how fast this server's runs of the same model and rule
have been. Rates are kept per rule because a token costs each rule differently: AR pays a target forward for
every token, a speculative rule one round for several."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping

WORKER_START_S = 5.0  # a fresh worker's fork, CUDA start and weight copy (docs/space.md: not measured on a GPU yet)
MARGIN = 2.0  # on the measured rates: live pictures, a slower call, a busier GPU
FIRST_RATE_S = 0.02  # seconds per token of one run before the model has been measured here (docs/space.md)
LONGEST_S = 120  # never more than an anonymous visitor's whole day
KEPT = 8  # the recent measured runs of a model and rule, the slowest of which sets the rate


class Budget:
    """The measured GPU seconds per decoded token of each model's recent runs by rule, and seconds per target
    forward by model, and the durations they give."""

    def __init__(self) -> None:
        self.per_token: dict[tuple[str, str], deque[float]] = {}
        self.per_forward: dict[str, deque[float]] = {}
        self.lock = threading.Lock()

    def record(self, model: str, rule: str, seconds: float, tokens: int, forwards: int) -> None:
        """A finished run of ``rule`` took ``seconds`` (as measured where it ran) for ``tokens`` decoded tokens in
        ``forwards`` target forwards (its rounds)."""
        if tokens > 0 and seconds > 0:
            with self.lock:
                self.per_token.setdefault((model, rule), deque(maxlen=KEPT)).append(seconds / tokens)
                if forwards > 0:
                    self.per_forward.setdefault(model, deque(maxlen=KEPT)).append(seconds / forwards)

    def rate(self, model: str, rule: str) -> float:
        """Seconds per token of one run of ``rule``: its slowest recent run's. Before any, the slowest recent
        round of the model's other rules: every rule commits at least one token a round, so a token costs at
        most a round (AR's first timing is sized by the rounds of the generation before it). Before any run of
        the model, :data:`FIRST_RATE_S`."""
        with self.lock:
            own = self.per_token.get((model, rule))
            return max(own or self.per_forward.get(model) or [FIRST_RATE_S])

    def needed(self, model: str, tokens: Mapping[str, int]) -> int:
        """The whole seconds a call should ask for, uncapped, whose runs decode ``tokens[rule]`` tokens of
        ``model`` by each rule."""
        return math.ceil(WORKER_START_S + MARGIN * sum(count * self.rate(model, rule)
                                                       for rule, count in tokens.items()))

    def seconds(self, model: str, tokens: Mapping[str, int]) -> int:
        """The duration such a call asks for: :meth:`needed`, at most :data:`LONGEST_S`."""
        return min(LONGEST_S, self.needed(model, tokens))

    def most_that_fit(self, model: str, tokens_of: Callable[[int], Mapping[str, int]], wanted: int) -> int:
        """The most of ``wanted`` repeats (at least one) whose call, of ``tokens_of(repeats)`` tokens by rule,
        needs no more than :data:`LONGEST_S`: ZeroGPU stops a call that outlasts the duration it asked for."""
        return max((n for n in range(1, wanted + 1) if self.needed(model, tokens_of(n)) <= LONGEST_S), default=1)
