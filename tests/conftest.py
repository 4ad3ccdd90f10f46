"""Tests use tiny models: one torch thread each keeps per-op overhead low and lets pytest-xdist use the cores.
Nothing may come from a model hub: every test runs offline."""

import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
# the tests' model steps are eager unless a test asks for others (the benchmark's CPU default, compiled phases,
# would compile every tiny model anew: test_steps checks that mode and the default itself)
os.environ.setdefault("COOLSD_STEPS", "eager")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def chromium():
    """One headless chromium per test process (Playwright's sync API allows one per thread), for every browser
    test module."""
    from app_process import CHROMIUM, CHROMIUM_FLAGS
    from playwright.sync_api import sync_playwright
    assert Path(CHROMIUM).exists(), "install Debian chromium: apt-get install -y --no-install-recommends chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def browser(chromium):
    """The process's chromium for one test, which closes every page the test opened when it ends: an open page
    of the app keeps running its scripts: one suite run had left 43 open, each taking about 5% of a core."""
    yield chromium
    for context in chromium.contexts:
        context.close()
