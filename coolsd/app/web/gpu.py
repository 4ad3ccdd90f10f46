"""The app's GPU work, run where the device places it (:class:`.device.Device`): in this process, or in ZeroGPU's
forked worker. Written for the stricter of the two (docs/space.md): what it takes and yields is plain and
picklable (a request's setting, pictures, statistics; never a CUDA tensor, a closure or the model); it is a
generator where the page watches it, since each ``yield`` crosses back from the worker and closing the generator
stops the work there; and each call asks for a ``duration`` computed from its request (:mod:`.budget`).
Handlers call :func:`compare`, :func:`measure` and :func:`compare_batch`, in their own thread (ZeroGPU reads the
visitor from the request's context: a call from another thread would be charged to nobody)."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial

from PIL import Image

from ...core.decode import Generation
from ...core.stats import Round
from ...models.bundle import Bundle
from .. import session, views
from .runtime import current

log = logging.getLogger("coolsd.app")


@dataclass
class Frame:
    """The live view between two yields: each run drawn since the last frame, its image at the decoder's size,
    how far it got and its last round. Small on purpose: it crosses ZeroGPU's pickling at every frame, and the
    picture is enlarged and marked where it is shown (:meth:`pictures`)."""

    pixels: dict[str, views.Pixels]
    made: dict[str, views.Made]
    last: dict[str, Round | None]

    @classmethod
    def of(cls, bundle: Bundle, runs: dict[str, Generation]) -> Frame:
        """The frame of these runs so far (the model's part of the work: decoding their tokens)."""
        return cls({run: views.live_pixels(bundle, generation) for run, generation in runs.items()},
                   {run: views.made_so_far(generation) for run, generation in runs.items()},
                   {run: (generation.stats.rounds or [None])[-1] for run, generation in runs.items()})

    def merged(self, newer: Frame) -> Frame:
        """This frame and a newer one as one: each run as the newer shows it, if it shows it."""
        return Frame({**self.pixels, **newer.pixels}, {**self.made, **newer.made}, {**self.last, **newer.last})

    def pictures(self, grid: tuple[int, int]) -> dict[str, Image.Image]:
        return {run: views.live_picture(pixels, grid, self.made[run][0], self.last[run])
                for run, pixels in self.pixels.items()}


class Stopped(Exception):
    """Raised in a run being watched once nobody watches it any more (its generator was closed)."""


# What runs on the GPU (module-level functions: ZeroGPU's worker runs them in a fork of this process) ----------
Owner = tuple[str | None, int]  # a generation's browser session and serial (:class:`session.Latest`)


def comparison_frames(request: session.Request, live: bool = True, owner: Owner | None = None
                      ) -> Iterator[Frame | session.Comparison]:
    """Both runs of a request (:func:`session.compare`); with ``live`` a :class:`Frame` at most every
    ``session.LIVE_INTERVAL`` seconds while they decode; then the comparison. Closing the generator stops both
    runs at their next round, and so does a newer click of ``owner``'s session seen here (in this process: a
    handler Gradio has cancelled may never close it)."""
    bundle = current().bundle_of(request)
    request = session.rebuilt(bundle, request)
    shown: dict[str, Generation] = {}
    closed = threading.Event()

    def watch(run: str, generation: Generation) -> None:
        if closed.is_set() or (owner is not None and not current().latest.current(*owner)):
            raise Stopped
        shown[run] = generation

    running = session.long_lived_threads("live", 2).submit(session.compare, bundle, request, None,
                                                             watch if live else None)
    drawn: dict[str, Generation] = {}
    try:
        while not wait([running], timeout=session.LIVE_INTERVAL).done:
            fresh = {run: generation for run, generation in list(shown.items()) if drawn.get(run) is not generation}
            if fresh:
                drawn.update(fresh)
                yield Frame.of(bundle, fresh)
        try:
            yield running.result()
        except Stopped:
            return  # replaced: nobody wants these images any more
    finally:
        closed.set()


def timing_steps(request: session.Request, repeats: int) -> Iterator[session.Progress | session.Timing]:
    """The timing run (:func:`session.timing_runs`): its progress before each run, then the timing."""
    bundle = current().bundle_of(request)
    yield from session.timing_runs(bundle, session.rebuilt(bundle, request), repeats)


def batch_runs(request: session.Request, seeds: list[int]) -> list[session.Comparison]:
    """Both runs of a request at each of ``seeds``, one batch per method (:func:`session.compare_batch`)."""
    bundle = current().bundle_of(request)
    return session.compare_batch(bundle, session.rebuilt(bundle, request), seeds)


# How many tokens each call decodes by each rule (what its duration is computed from) ---------------------------
def image_tokens(request: session.Request) -> int:
    return current().bundle_of(request).config.image_tokens


def rate_key(request: session.Request, rule: str) -> str:
    """The budget's name for ``rule``'s runs of ``request``: the rule, and the drafter where it is not the default
    one (another drafter drafts at another cost; AR drafts nothing)."""
    other = request.drafter and request.drafter != session.DEFAULT_DRAFTER and rule != "ar"
    return f"{rule}+{request.drafter}" if other else rule


def comparison_tokens(request: session.Request, live: bool = True, owner: Owner | None = None) -> dict[str, int]:
    return dict.fromkeys((rate_key(request, rule) for rule in (request.method, "eagle")), image_tokens(request))


def timing_tokens(request: session.Request, repeats: int) -> dict[str, int]:
    warm = 0 if current().bundle_of(request).steps == "eager" else 1  # graphs are captured in a first pass
    return dict.fromkeys((rate_key(request, rule) for rule in ("ar", "eagle", request.method)),
                         image_tokens(request) * (repeats + warm))


def batch_tokens(request: session.Request, seeds: list[int]) -> dict[str, int]:
    return {rule: tokens * len(seeds) for rule, tokens in comparison_tokens(request).items()}


TOKENS: dict[Callable, Callable[..., dict[str, int]]] = {comparison_frames: comparison_tokens,
                                                         timing_steps: timing_tokens, batch_runs: batch_tokens}
PLACED: dict[Callable, Callable] = {}
PLACED_LOCK = threading.Lock()


def duration(function: Callable) -> Callable[..., int]:
    """The seconds a call of ``function`` asks ZeroGPU for, from the same arguments (:class:`.budget.Budget`)."""
    def seconds(request: session.Request, *args, **kwargs) -> int:
        return current().budget.seconds(request.model, TOKENS[function](request, *args, **kwargs))
    return seconds


def placed(function: Callable) -> Callable:
    """``function`` as the device runs it, placed once (ZeroGPU wants its functions wrapped before launch:
    :func:`place_all`)."""
    with PLACED_LOCK:
        if function not in PLACED:
            PLACED[function] = current().device.place(function, duration(function))
        return PLACED[function]


def place_all() -> None:
    for function in TOKENS:
        placed(function)


def newest_frames(steps: Iterator) -> Iterator:
    """``steps`` read ahead in another thread, run in this thread's context (ZeroGPU reads the visitor from it),
    with the frames that arrive while the caller is busy merged into one: a worker sends a frame every
    ``session.LIVE_INTERVAL`` whether or not the page has shown the last, and the page should show the newest
    picture of each run, never work through a backlog. Closing it stops ``steps`` after their next step."""
    arrived = threading.Condition()
    pending: list = []
    ended: list[BaseException | None] = []
    stop = threading.Event()

    def read() -> None:
        error = None
        try:
            for step in steps:
                with arrived:
                    if isinstance(step, Frame) and pending and isinstance(pending[-1], Frame):
                        pending[-1] = pending[-1].merged(step)
                    else:
                        pending.append(step)
                    arrived.notify()
                if stop.is_set():
                    break
        except BaseException as caught:  # noqa: BLE001 (raised again in the caller's thread)
            error = caught
        finally:
            steps.close()
            with arrived:
                ended.append(error)
                arrived.notify()

    threading.Thread(target=contextvars.copy_context().run, args=(read,), daemon=True, name="gpu-steps").start()
    try:
        while True:
            with arrived:
                arrived.wait_for(lambda: pending or ended)
                taken, pending[:] = list(pending), []
                error = ended[0] if ended and not taken else None
                over = bool(ended) and not taken
            yield from taken
            if error is not None:
                raise error
            if over:
                return
    finally:
        stop.set()


# What handlers call ------------------------------------------------------------------------------------------
def called(function: Callable, request: session.Request, *args) -> tuple[int, float]:
    """What a call asks for (seconds) and when it starts, logged with what it took by :func:`took`."""
    return duration(function)(request, *args), time.perf_counter()


def took(name: str, request: session.Request, asked: int, started: float,
         runs: dict[str, tuple[Generation, list[float]]]) -> None:
    """One log line per GPU call (asked against taken), and each run's measured rate, which sizes the next
    calls: ``runs[rule]`` is a decoded run and the seconds of each time it was decoded."""
    for rule, (run, seconds) in runs.items():
        current().budget.record(request.model, rule, sum(seconds), len(seconds) * len(run.tokens),
                                len(seconds) * run.stats.target_forwards)
    log.info("gpu %s %s: asked %d s, took %.2f s", name, request.label, asked, time.perf_counter() - started)


def measured(request: session.Request, method: Generation, eagle: Generation, images: int = 1) -> dict[str, tuple]:
    """What a comparison's runs tell the budget (:func:`took`): each run with its time, which a batch's
    ``images`` images share (a batched run's seconds are the whole batch's)."""
    return {rate_key(request, rule): (run, [run.stats.seconds["total"] / images] * images)
            for rule, run in ((request.method, method), ("eagle", eagle))}


def compare(request: session.Request, live: bool = True, owner: Owner | None = None
            ) -> Iterator[Frame | session.Comparison]:
    """:func:`comparison_frames` where the device runs it; the comparison comes back with ``request`` itself
    (its rule and tree: they do not cross the worker's pickling)."""
    asked, started = called(comparison_frames, request, live, owner)
    with closing(newest_frames(placed(comparison_frames)(request, live, owner))) as steps:
        for step in steps:
            if isinstance(step, session.Comparison):
                step.request = request
                took("compare", request, asked, started, measured(request, step.method, step.eagle))
            yield step


def measure(request: session.Request, repeats: int = session.TIMING_REPEATS
            ) -> Iterator[session.Progress | session.Timing]:
    """:func:`timing_steps` where the device runs it: on ZeroGPU with as many of ``repeats`` as fit in one call's
    longest duration (a slow model's timing run would be stopped half-way, and ask more than a visitor's day);
    the table says how many it ran."""
    if current().device.zero_gpu:
        repeats = current().budget.most_that_fit(request.model, partial(timing_tokens, request), repeats)
    asked, started = called(timing_steps, request, repeats)
    with closing(placed(timing_steps)(request, repeats)) as steps:
        for step in steps:
            if isinstance(step, session.Timing):
                rules = {run: rate_key(request, rule) for run, rule in (("ar", "ar"), ("eagle", "eagle"),
                                                                          ("method", request.method))}
                took("timing", request, asked, started,
                     {rules[run]: (made, step.seconds[run]) for run, made in step.runs.items()})
            yield step


def compare_batch(request: session.Request, seeds: list[int]) -> list[session.Comparison]:
    """:func:`batch_runs` where the device runs it."""
    asked, started = called(batch_runs, request, seeds)
    results = placed(batch_runs)(request, seeds)
    for result in results:
        result.request = replace(request, seed=result.request.seed)
    took("batch", request, asked, started, measured(request, results[0].method, results[0].eagle, len(seeds)))
    return results
