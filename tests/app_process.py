"""``python app.py`` started as a user (or a Space) starts it, for the tests that talk to the app over HTTP, and
the browser that visits it (Debian's chromium, driven by Playwright: the ``browser`` fixture of conftest.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(env: dict[str, str], log: Path, seconds: float = 600) -> tuple[subprocess.Popen, str]:
    """``python app.py`` on a free localhost port with ``env`` (the port added), its output in ``log``: the process
    and the page's URL once it answers HTTP 200 (a RuntimeError with the log if it exits or never answers within
    ``seconds``: a loaded CI machine took 83 s only to import torch and gradio)."""
    port = free_port()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env={**env, "GRADIO_SERVER_PORT": str(port)},
                                   stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"app exited early:\n{log.read_text()}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return process, url
        except OSError:
            time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"app did not start:\n{log.read_text()}")
