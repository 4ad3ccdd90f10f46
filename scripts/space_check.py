"""The Python half of scripts/space_build.sh (the standard library, ``packaging`` or pip's copy of it, and
in ``serve``, which runs in the Space's venv, gradio_client and PIL).

  space_check.py field DIR KEY              print one field of DIR/README.md's front matter (empty if unset)
  space_check.py config DIR PYTHON_VERSION  check the front matter against DIR/requirements.txt and the Python
                                            the build uses; exit 1 with a one-line reason on a mismatch
  space_check.py serve DIR                  start DIR/app.py as a CPU Space would, time its start and one
                                            /generate call, check the page and the images; exit 1 on failure
"""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TITLE = "coolsd explorer"  # the page's title (coolsd/app/web/layout.py)
START_LIMIT_S = 300  # the first start of a new venv also compiles every module it imports
CALL_LIMIT_S = 300
SPACE_ID = "user/coolsd"


def say(text: str) -> None:
    print(f"space_build: {text}", flush=True)


class Failure(Exception):
    """A check that failed, with its one-line reason."""


def front_matter(readme: Path) -> dict[str, str]:
    """The top-level ``key: value`` fields of the README's YAML front matter (the Space's settings), as text:
    ``python_version: 3.10`` stays "3.10", not YAML's float 3.1."""
    lines = readme.read_text().splitlines()
    if not lines or lines[0].strip() != "---":
        raise Failure(f"{readme.name} has no front matter (a first line ---)")
    fields = {}
    for line in lines[1:]:
        if line.strip() == "---":
            return fields
        key, colon, value = line.partition(":")
        if colon and line[:1].isalpha():  # nested lines and list items belong to the key above
            fields[key.strip()] = value.split(" #")[0].strip().strip("'\"")
    raise Failure(f"{readme.name}'s front matter has no closing ---")


def gradio_conflicts(requirements: Path, sdk_version: str) -> list[str]:
    """The requirements.txt lines asking for a gradio other than ``sdk_version``: a Space installs
    gradio==sdk_version after requirements.txt, so such a line is either overridden or breaks the build."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name
    except ImportError:  # pip's own copy: a Python that can build the Space's venv has pip
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
        from pip._vendor.packaging.utils import canonicalize_name

    conflicts = []
    for number, line in enumerate(requirements.read_text().splitlines(), 1):
        text = line.split(" #")[0].strip()
        if not text or text.startswith(("#", "-")):  # comments and pip options (-r, --index-url, ...)
            continue
        try:
            wanted = Requirement(text)
        except InvalidRequirement:
            continue  # pip itself reports it in the install step
        if canonicalize_name(wanted.name) != "gradio":
            continue
        if wanted.url or not wanted.specifier.contains(sdk_version, prereleases=True):
            conflicts.append(f"requirements.txt line {number} '{text}' asks for another gradio than "
                             f"sdk_version {sdk_version}")
    return conflicts


def python_note(wanted: str, have: str) -> str:
    """What the build's Python means for the Space's (``python_version``)."""
    if not wanted:
        return f"python_version unset: the Space uses its default Python; this build uses {have}"
    if have == wanted or have.startswith(wanted + "."):
        return f"Python {have}, as python_version {wanted} asks"
    return (f"NOTE: the Space runs Python {wanted} (python_version) but this build uses Python {have}, the only "
            f"one given (SPACE_PYTHON picks another): what differs under {wanted} is not tested here")


def check_config(space: Path, python_version: str) -> None:
    """The Space's settings are consistent with what is pushed; print what was checked."""
    fields = front_matter(space / "README.md")
    if fields.get("sdk") != "gradio" or not fields.get("sdk_version"):
        raise Failure("the front matter must say sdk: gradio and an sdk_version")
    if not (space / fields.get("app_file", "app.py")).is_file():
        raise Failure(f"app_file {fields.get('app_file', 'app.py')} is not in the upload")
    conflicts = gradio_conflicts(space / "requirements.txt", fields["sdk_version"])
    if conflicts:
        raise Failure("; ".join(conflicts))
    say(f"front matter: sdk gradio {fields['sdk_version']}, app_file {fields.get('app_file', 'app.py')}, "
          f"python_version {fields.get('python_version') or 'unset'}; requirements.txt agrees on gradio")
    say(python_note(fields.get("python_version", ""), python_version))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def space_environment(port: int) -> dict[str, str]:
    """What a CPU Space gives its app: SPACE_ID and SYSTEM, and not SPACES_ZERO_GPU; none of this shell's own
    settings of the app, gradio or Python's path. Offline (no network here), on loopback rather than the
    Space's 0.0.0.0 so that nothing outside this machine can reach it."""
    own = ("COOLSD_", "GRADIO_", "SPACES_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if not key.startswith(own)}
    return env | {"SPACE_ID": SPACE_ID, "SYSTEM": "spaces", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                  "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_SERVER_NAME": "127.0.0.1",
                  "GRADIO_SERVER_PORT": str(port)}


def wait_for_page(url: str, app: subprocess.Popen) -> str:
    """The page's HTML, once the app answers HTTP 200."""
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise Failure(f"the app exited with code {app.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.read().decode()
        except OSError:  # not listening yet (an HTTP error status too: then it is not up either)
            time.sleep(0.25)
    raise Failure(f"no HTTP 200 from {url} within {START_LIMIT_S} s")


def check_image(run: dict, name: str) -> str:
    """One run's PNG decodes, has the size of the pixels it comes with, and is not one flat colour."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(run["png_base64"]))).convert("RGB")
    size = (len(run["pixels"][0]), len(run["pixels"]))
    if image.size != size or min(size) < 8:
        raise Failure(f"{name}'s PNG is {image.size[0]}x{image.size[1]}, its pixels {size[0]}x{size[1]}")
    colours = image.getcolors(maxcolors=image.width * image.height)
    if len(colours) < 2:
        raise Failure(f"{name}'s image is all one colour {colours[0][1]}")
    return f"{name} {image.width}x{image.height}, {len(colours)} colours"


def generate_once(url: str) -> dict:
    from gradio_client import Client

    return Client(url, verbose=False).submit(method="COOL-SD", seed=0, api_name="/generate") \
        .result(timeout=CALL_LIMIT_S)


def check_app(url: str, app: subprocess.Popen, started: float) -> None:
    page = wait_for_page(url, app)
    say(f"start to HTTP 200: {time.perf_counter() - started:.1f} s")
    if TITLE not in page:
        raise Failure(f"the page answers 200 but does not mention '{TITLE}'")
    called = time.perf_counter()
    answer = generate_once(url)
    seconds = time.perf_counter() - called
    say(f"/generate: {seconds:.1f} s ({check_image(answer['method'], 'method')}; "
        f"{check_image(answer['eagle'], 'eagle')})")


def serve(space: Path) -> None:
    """Start ``python app.py`` (the front matter's app_file) in ``space`` with this Python, the Space venv's,
    check it, stop it."""
    app_file, port = front_matter(space / "README.md").get("app_file", "app.py"), free_port()
    log = Path(tempfile.mkstemp(prefix="space-app-", suffix=".log")[1])
    started = time.perf_counter()
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, app_file], cwd=space, env=space_environment(port), stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        check_app(f"http://127.0.0.1:{port}/", app, started)
        say("app start-up: " + " | ".join(line for line in log.read_text().splitlines()
                                          if line.startswith("coolsd [")))
    except BaseException:
        print(f"the app's log ({log}), last lines:\n" + "\n".join(log.read_text().splitlines()[-25:]),
              file=sys.stderr)
        raise
    finally:
        app.terminate()
        try:
            app.wait(timeout=20)
        except subprocess.TimeoutExpired:
            app.kill()
    log.unlink()


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["field"] and len(argv) == 3:
            print(front_matter(Path(argv[1]) / "README.md").get(argv[2], ""))
        elif argv[:1] == ["config"] and len(argv) == 3:
            check_config(Path(argv[1]), argv[2])
        elif argv[:1] == ["serve"] and len(argv) == 2:
            serve(Path(argv[1]))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Exception as error:  # any failure ends in one line: its reason
        reason = str(error) if isinstance(error, Failure) else f"{type(error).__name__}: {error}"
        print(f"space_build: FAILED: {' '.join(reason.split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
