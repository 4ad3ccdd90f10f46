"""coolsd explorer, the Space's entry point: ``python app.py`` serves http://127.0.0.1:7860 (or
``GRADIO_SERVER_NAME``:``GRADIO_SERVER_PORT``) with the embedded default model (``COOLSD_MODEL`` names another;
``COOLSD_THREADS`` sets torch's CPU threads, default 1). The app lives in ``coolsd/app/web``
(docs/architecture.md); this file prepares the process, makes the app's state, builds the page and launches it.
"""

import ctypes
import os
import time

STARTED = time.perf_counter()


def say(message: str) -> None:
    """Start-up progress on the console, so a slow start is visible and attributable."""
    print(f"coolsd [{time.perf_counter() - STARTED:5.1f}s] {message}", flush=True)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own heap ("arena") and seldom returns freed memory, so a
    server whose requests run on a pool of threads grows with the pool (measured, 4 clients: 597 -> 653 MB
    from 20 to 100 UI generations with glibc's default, 527 -> 534 MB from 20 to 60 with 2 arenas). No-op off
    glibc. First, before any import starts a thread (numpy's BLAS does)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # -8 = M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def import_spaces_on_zero_gpu() -> None:
    """On a ZeroGPU Space (``SPACES_ZERO_GPU``, as coolsd.app.web.device reads it; the package itself is on every
    Space), ``spaces`` first: it patches torch, and refuses to load once CUDA has been touched."""
    if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true"):
        say("ZeroGPU: importing spaces")
        import spaces  # noqa: F401


limit_malloc_arenas()
import_spaces_on_zero_gpu()
say("importing gradio and torch")
import logging

from coolsd.app.web import layout, runtime, server

state = runtime.start(say)
say("building the interface")
demo = layout.build_demo(state)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    say("starting the web server")
    server.serve(demo)
