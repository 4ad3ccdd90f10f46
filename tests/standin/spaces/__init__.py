"""A stand-in for Hugging Face's ``spaces`` package on ZeroGPU, for tests only (put ``tests/standin`` on
PYTHONPATH; never shipped). Like the real one (spaces 0.51, ``spaces/zero/wrappers.py``), with
``SPACES_ZERO_GPU=true`` its ``GPU`` runs each call in a forked worker process, arguments and results pickled
(a closure or lambda fails in the caller), generator functions yield from the worker and closing one stops it
there; otherwise ``GPU`` returns the function as it is. It fails where ZeroGPU fails or quietly misbehaves:
* imported after coolsd asked torch for CUDA (``coolsd.models.bundle.CUDA_ASKED``; the real one checks CUDA);
* called without a Gradio request in its context (a thread pool's thread): the real one cannot tell whose quota
  to charge, so it charges the Space's, or refuses;
* a ``duration`` that is not a positive whole number of seconds (or a timedelta), or over the longest call.
``SPACES_STANDIN_LOG``, when set, names a file that gets a JSON line per call: the function, the seconds it
asked for and the seconds it took."""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta
from functools import partial, wraps

ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")
LONGEST_S = 120  # longer calls are refused (the real limit depends on the visitor's plan)
FORK = multiprocessing.get_context("fork")

if ZERO_GPU and getattr(sys.modules.get("coolsd.models.bundle"), "CUDA_ASKED", False):
    raise RuntimeError("CUDA has been initialized before importing the `spaces` package. "
                       "Try importing `spaces` before any other CUDA-related package.")


class Ok:
    def __init__(self, value):
        self.value = value


class Failed:
    def __init__(self, error: BaseException):
        self.error_name = type(error).__name__
        self.traceback = "".join(traceback.format_exception(error))
        self.gradio_error = error if type(error).__module__.startswith("gradio") else None


class End:
    pass


def gradio_error(title: str, message: str):
    import gradio as gr
    return gr.Error(message, title=title, print_exception=False)


def seconds_of(duration, args, kwargs) -> float:
    """The GPU seconds a call asks for (the real default: 60), checked as ZeroGPU checks it."""
    asked = duration(*args, **kwargs) if callable(duration) else duration
    asked = 60 if asked is None else asked
    asked = asked.total_seconds() if isinstance(asked, timedelta) else asked
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not 0 < asked <= LONGEST_S:
        raise gradio_error("ZeroGPU illegal duration", f"The requested GPU duration ({asked!r}s) is not allowed")
    return float(asked)


def visitor_check() -> None:
    """A call must carry its visitor: Gradio's request, in the context of the handler's thread."""
    from gradio.context import LocalContext
    if LocalContext.request.get(None) is None:
        raise gradio_error("ZeroGPU stand-in", "spaces.GPU was called outside a Gradio request's context (e.g. "
                           "from a thread pool): ZeroGPU would not know whose quota to charge")


def log_call(task, asked: float, started: float) -> None:
    path = os.environ.get("SPACES_STANDIN_LOG")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"function": task.__name__, "asked_s": asked,
                                  "took_s": round(time.perf_counter() - started, 3)}) + "\n")


def worker(task, payload: bytes, results, stop) -> None:
    """The forked process: unpickle the call, run it, put each result (pickled by the queue) or the failure."""
    args, kwargs = pickle.loads(payload)
    try:
        if inspect.isgeneratorfunction(task):
            steps = task(*args, **kwargs)
            for step in steps:
                if stop.is_set():
                    steps.close()
                    break
                results.put(Ok(step))
        else:
            results.put(Ok(task(*args, **kwargs)))
    except Exception as error:  # noqa: BLE001 (crosses back as the real worker's ExceptionResult)
        results.put(Failed(error))
    results.put(End())


def start(task, args, kwargs):
    """Pickle the call (failing in the caller, as the real queue does), then fork its worker."""
    payload = pickle.dumps((args, kwargs))
    results, stop = FORK.SimpleQueue(), FORK.Event()
    process = FORK.Process(target=worker, args=(task, payload, results, stop), daemon=True)
    process.start()
    return process, results, stop


def drain(process, results) -> None:
    """Read what a stopped worker still sends until it ends (a full pipe would block it), then reap it."""
    while process.is_alive() or not results.empty():
        if results.empty():
            time.sleep(0.01)
        elif isinstance(results.get(), End):
            break
    process.join(timeout=30)


def unpacked(result):
    """The value of an Ok; a failure raised as the real wrapper raises it."""
    if isinstance(result, Failed):
        if result.gradio_error is not None:
            raise result.gradio_error
        print(result.traceback, file=sys.stderr)
        raise gradio_error("ZeroGPU worker error", result.error_name)
    return result.value


def results_of(task, duration, args, kwargs):
    """One call through a worker: its results as they come (a generator's each step; a function's one value),
    the worker told to stop when the caller closes this; the call logged once the worker has ended."""
    visitor_check()
    asked, started = seconds_of(duration, args, kwargs), time.perf_counter()
    process, results, stop = start(task, args, kwargs)
    try:
        while not isinstance(result := results.get(), End):
            try:
                yield unpacked(result)
            except GeneratorExit:
                stop.set()
                raise
    finally:
        drain(process, results)
        log_call(task, asked, started)


def wrap(task, duration):
    if inspect.isgeneratorfunction(task):
        @wraps(task)
        def generator(*args, **kwargs):
            yield from results_of(task, duration, args, kwargs)
        return generator

    @wraps(task)
    def function(*args, **kwargs):
        value, = results_of(task, duration, args, kwargs)
        return value
    return function


def GPU(task=None, *, duration=None, size=None, **kwargs):  # noqa: N802 (the real name)
    """``spaces.GPU``: ``@GPU``, ``@GPU(duration=...)``; the function itself when not on ZeroGPU."""
    if not callable(task):
        return partial(GPU, duration=duration, size=size)
    return wrap(task, duration) if ZERO_GPU else task
