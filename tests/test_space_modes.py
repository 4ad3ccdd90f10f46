"""The app as a Hugging Face Space runs it, in a real browser: on ZeroGPU (``SPACES_ZERO_GPU=true``, with the
stand-in ``spaces`` of tests/standin: every GPU call in a forked worker, arguments and results pickled, refused
outside a request's context) and on a CPU Space (``spaces`` importable, as on every Space, but no ZeroGPU), which
must behave exactly as a laptop does. Each test prints what a visitor waits for (click to first live picture, to
the final images, to the timing table, to the race's end)."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from app_process import ROOT, start_app
from test_browser import SLOW, TEST_TIMING_REPEATS, image_sources, write_slow_model
from test_mcp import REQUEST, in_session, picture

STANDIN = ROOT / "tests" / "standin"
MODES = {"zero_gpu": {"SPACES_ZERO_GPU": "true"}, "cpu_space": {}}


def start_space(tmp: Path, mode: str) -> tuple[subprocess.Popen, str, Path, Path]:
    """``python app.py`` as a Space starts it (``SPACE_ID`` set, the stand-in ``spaces`` importable), on the slow
    random model at 16 x 16 tokens: its pictures can be watched, and on a loaded CI machine (where a timing run of
    the 24 x 24 model took more than a call's longest 120 s) a timing run still fits in one ZeroGPU call."""
    model = tmp / SLOW
    write_slow_model(model, side=16)
    log, calls = tmp / "app.log", tmp / "gpu_calls.jsonl"
    env = {key: value for key, value in os.environ.items() if key not in ("SPACES_ZERO_GPU", "COOLSD_THREADS")}
    env.update(MODES[mode], PYTHONPATH=os.pathsep.join([str(STANDIN), env.get("PYTHONPATH", "")]),
               SPACE_ID="user/coolsd", SPACES_STANDIN_LOG=str(calls), GRADIO_ANALYTICS_ENABLED="False",
               HF_HUB_OFFLINE="1", COOLSD_MODEL=str(model), COOLSD_TIMING_REPEATS=str(TEST_TIMING_REPEATS))
    process, url = start_app(env, log)
    return process, url, log, calls


def watch_one_generation(page) -> dict:
    """Click Generate and note, in seconds from the click, the first live picture (a picture shown while the
    caption says the runs are in progress), the final images, the timing table and the race's end; the
    number of distinct live pictures, and whether the timing run's progress bar was seen."""
    events, live = {}, set()
    before = image_sources(page)
    page.get_by_role("button", name="Generate", exact=True).click()
    started = time.perf_counter()
    while time.perf_counter() - started < 420 and "race_end" not in events:  # a loaded CI machine: minutes
        caption = page.locator("#caption").inner_text()
        sources = image_sources(page)
        now = round(time.perf_counter() - started, 2)
        if caption.startswith("Generating"):
            events.setdefault("generating", now)
            if " of " in caption and sources and sources[0] and sources[0] not in before:  # "COOL-SD: 40 of 576 tokens"
                live.add(sources[0])
                events.setdefault("first_live_picture", now)
        elif "generating" in events:
            events.setdefault("images", now)
        if "images" in events and page.locator(".progress-text").count():
            events.setdefault("timing_progress", now)
        # on ZeroGPU a loaded machine may leave fewer repeats than asked: those that fit in one call (gpu.measure)
        repeats = re.search(r"of (\d+) interleaved repeats", page.locator("#timings").inner_text())
        if repeats:
            events.setdefault("timing_table", now)
            events.setdefault("repeats", int(repeats.group(1)))
        if "finished first" in page.locator("#race-text").inner_text():
            events.setdefault("race_end", now)
        page.wait_for_timeout(25)
    return {**events, "live_pictures": len(live)}


@pytest.mark.parametrize("mode", MODES)
def test_a_space_shows_live_pictures_the_timing_table_and_the_race(mode, browser, tmp_path):
    """On ZeroGPU as on a CPU Space: Generate shows the runs drawn live, then the final images, the timing
    table and the race to its end. On ZeroGPU every generation and timing went through ``spaces.GPU`` (the
    stand-in's log) and each asked for more GPU seconds than it took; on a CPU Space nothing did, and the page
    opened with the start-up images and shows the timing run's progress, as on a laptop."""
    process, url, log, calls = start_space(tmp_path, mode)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(url)
        page.get_by_role("button", name="Generate", exact=True).wait_for()
        startup = page.locator("#caption").inner_text()
        seen = watch_one_generation(page)
        print(f"\n{mode}: seconds from the click: {json.dumps(seen)}")
        assert {"first_live_picture", "images", "timing_table", "race_end"} <= set(seen), (seen, log.read_text())
        assert seen["live_pictures"] >= 2, seen
        assert seen["first_live_picture"] < seen["images"] < seen["timing_table"] < seen["race_end"], seen
        made = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        print(f"{mode}: GPU calls: {made}")
        if mode == "zero_gpu":
            assert "Made at start-up" not in startup  # no CUDA work outside a request on ZeroGPU
            assert [call["function"] for call in made] == ["comparison_frames", "timing_steps"], made
            assert all(call["took_s"] < call["asked_s"] for call in made), made
            assert 1 <= seen["repeats"] <= TEST_TIMING_REPEATS, seen  # those that fit in the longest call
        else:
            assert "Made at start-up" in startup and len(image_sources(page)) == 2
            assert made == [] and "timing_progress" in seen, (made, seen)
            assert seen["repeats"] == TEST_TIMING_REPEATS, seen
        # an MCP client's call is a request like the page's: on ZeroGPU it goes through spaces.GPU with its visitor
        tools = in_session(url, lambda session: session.list_tools()).tools
        generate = next(tool.name for tool in tools if tool.name.endswith("generate"))  # SPACE_ID prefixes names
        answer = in_session(url, lambda session: session.call_tool(generate, REQUEST))
        assert not answer.isError and picture(answer.content[1]).size[0] > 0, answer
        more = calls.read_text().splitlines()[len(made):] if calls.exists() else []
        assert [json.loads(line)["function"] for line in more] == (["comparison_frames"] if mode == "zero_gpu" else [])
        assert "Traceback" not in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=20)
