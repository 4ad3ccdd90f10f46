"""The app's MCP server end to end: ``python app.py`` as a user starts it, and an MCP client (the ``mcp``
package's, over streamable HTTP): its tools are exactly the public API, a call answers with the pictures (PNG)
and their statistics (text), a bad value with one readable line, and the HTTP guard still refuses the page's
handlers."""

import asyncio
import base64
import io
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from app_process import start_app
from gradio_client import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from PIL import Image

from coolsd.app.web.server import MCP_ENV, mcp_wanted
from coolsd.app.web.tools import STATISTICS
from coolsd.core.rules import schema
from coolsd.models.bundle import DEFAULT_MODEL, EAGLE3_FILE

PUBLIC = {"generate", "generate_batch"}
REQUEST = {"method": "COOL-SD", "seed": 3, "draft": "chain:3"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """``python app.py`` on a free localhost port, offline, with no MCP setting of its own: the URL and the log."""
    log = tmp_path_factory.mktemp("mcp") / "app.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", COOLSD_TIMING_REPEATS="2")
    for name in (MCP_ENV, "GRADIO_MCP_SERVER", "COOLSD_THREADS", "SPACE_ID"):  # SPACE_ID would prefix tool names
        env.pop(name, None)
    process, url = start_app(env, log)
    try:
        yield url, log
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture(scope="module")
def expected(app) -> dict:
    """The HTTP API's answer to :data:`REQUEST`: what the MCP tool's answer must show."""
    return Client(app[0], verbose=False).predict(**REQUEST, api_name="/generate")


def in_session(url: str, work):
    """``await work(session)`` in an initialized MCP session with the app, over streamable HTTP; in a thread of
    its own, since a browser test's Playwright (sync API) may keep an event loop running in this one."""
    async def run():
        async with streamable_http_client(f"{url}gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def call(url: str, tool: str, arguments: dict):
    """The MCP client's result of calling ``tool`` with ``arguments``."""
    return in_session(url, lambda session: session.call_tool(tool, arguments))


def picture(block) -> Image.Image:
    """An MCP image block's picture, checked to be a PNG."""
    assert block.type == "image" and block.mimeType == "image/png", block
    image = Image.open(io.BytesIO(base64.b64decode(block.data)))
    assert image.format == "PNG"
    return image


def statistics(block) -> dict:
    """The statistics an answer's last text block holds as JSON."""
    assert block.type == "text" and block.text.startswith(STATISTICS), block
    return json.loads(block.text.removeprefix(STATISTICS))


def page_handlers(url: str) -> set[str]:
    """The names of the page's events with a Python function that are not the API (private, every one)."""
    config = json.loads(urllib.request.urlopen(f"{url}config", timeout=30).read())
    return {d["api_name"] for d in config["dependencies"] if d.get("api_name") and d.get("backend_fn")} - PUBLIC


def test_the_tools_are_the_public_api_and_no_page_handler(app):
    url, _ = app
    tools = {tool.name: tool for tool in in_session(url, lambda session: session.list_tools()).tools}
    handlers = page_handlers(url)
    assert "on_model" in handlers and len(handlers) > 10, handlers
    assert set(tools) == PUBLIC and not handlers & set(tools), sorted(tools)
    schema_route = json.loads(urllib.request.urlopen(f"{url}gradio_api/mcp/schema", timeout=30).read())
    assert {tool["name"] for tool in schema_route} == PUBLIC  # the schema route passes the HTTP guard too
    for tool in tools.values():  # a description a client can act on: what it answers, each value in words
        assert "Over MCP the answer is" in tool.description and "Eagle-1" in tool.description, tool.description
        properties = tool.inputSchema["properties"]
        assert all(len(value.get("description", "")) > 10 for value in properties.values()), properties
        assert schema("delta").span() in properties["delta"]["description"]
    assert "seed" in tools["generate"].inputSchema["properties"]
    assert "seeds" in tools["generate_batch"].inputSchema["properties"]


def test_generate_answers_both_pictures_and_their_statistics(app, expected):
    result = call(app[0], "generate", REQUEST)
    assert not result.isError, result.content
    assert [block.type for block in result.content] == ["text", "image", "text", "image", "text"]
    measured = statistics(result.content[4])
    for index, run, label in ((0, "method", "COOL-SD"), (2, "eagle", "Eagle-1")):
        line, image, stats = result.content[index].text, picture(result.content[index + 1]), measured[run]
        pixels = expected[run]["pixels"]
        assert image.size == (len(pixels[0]), len(pixels)) and image.mode == "RGB"
        low, high = image.convert("L").getextrema()
        assert high - low > 50, (low, high)  # a picture, not a blank
        assert result.content[index + 1].data == expected[run]["png_base64"]  # the HTTP API's picture
        rounds = stats["accepted_per_round"]
        assert len(rounds) == stats["target_forwards"] and sum(rounds) + len(rounds) == stats["tokens"]
        assert stats["tau"] == pytest.approx(stats["tokens"] / stats["target_forwards"])
        for name in ("tau", "accepted_per_round", "per_depth", "draft", "seed"):
            assert stats[name] == expected[run]["stats"][name], name
        assert line.startswith(label) and "draft chain:3 (Eagle-1 drafter)" in line and "seed 3" in line, line
        assert stats["drafter"] == "eagle1"
        assert f"tau {stats['tau']:.2f}" in line and "acceptance rate by draft depth" in line, line
    assert measured["timing"] is None and "tokens_detail" not in measured["method"]


def test_generate_batch_answers_each_seeds_pictures(app, expected):
    result = call(app[0], "generate_batch", {**{k: v for k, v in REQUEST.items() if k != "seed"}, "seeds": [3]})
    assert not result.isError, result.content
    assert [block.type for block in result.content] == ["text", "text", "image", "text", "image", "text"]
    assert result.content[0].text.startswith("1 seeds decoded as one batch per method: COOL-SD in")
    assert result.content[2].data == expected["method"]["png_base64"]  # a seed's single-request picture
    assert result.content[4].data == expected["eagle"]["png_base64"]
    measured = statistics(result.content[5])
    assert measured["batch"] == 1 and measured["images"][0]["seed"] == 3
    assert measured["images"][0]["method"]["tau"] == expected["method"]["stats"]["tau"]


def test_a_bad_value_or_a_page_handler_is_one_readable_line(app):
    url, log = app
    before = len(log.read_text().splitlines())
    bad = call(url, "generate", {**REQUEST, "delta": 10.0})
    assert bad.isError and len(bad.content) == 1, bad.content
    assert "delta must be between 0.05 and 5" in bad.content[0].text
    assert "\n" not in bad.content[0].text and len(bad.content[0].text) < 300, bad.content[0].text
    handler = call(url, "on_model", {})
    assert handler.isError and "Unknown tool" in handler.content[0].text, handler.content
    time.sleep(0.2)
    added = log.read_text().splitlines()[before:]
    assert not any("Traceback" in line for line in added), added
    assert sum("rejected request" in line for line in added) == 1, added


def test_the_drafter_is_a_tool_value_and_a_bad_one_is_one_readable_line(app):
    """The tools take the drafter, said in words. A drafter that does not exist is one line naming those that do;
    EAGLE-3 on the shipped model is one line naming its drafters while it ships none, else its images' lines say
    they drafted with it."""
    url, _ = app
    tools = {tool.name: tool for tool in in_session(url, lambda session: session.list_tools()).tools}
    for tool in tools.values():
        assert "EAGLE-3" in tool.inputSchema["properties"]["drafter"]["description"]
    bad = call(url, "generate", {**REQUEST, "drafter": "medusa"})
    assert bad.isError and len(bad.content) == 1, bad.content
    assert "drafter must be one of: eagle1 (Eagle-1), eagle3 (EAGLE-3)" in bad.content[0].text, bad.content
    assert "\n" not in bad.content[0].text and "Traceback" not in bad.content[0].text
    eagle3 = call(url, "generate", {**REQUEST, "drafter": "EAGLE-3"})
    if (DEFAULT_MODEL / EAGLE3_FILE).exists():
        assert not eagle3.isError and "draft chain:3 (EAGLE-3 drafter)" in eagle3.content[0].text, eagle3.content
    else:
        assert eagle3.isError and len(eagle3.content) == 1, eagle3.content
        assert "has no EAGLE-3 drafter (eagle3); it has: eagle1 (Eagle-1)" in eagle3.content[0].text


def test_the_guard_still_refuses_a_page_handler_by_name(app):
    request = urllib.request.Request(f"{app[0]}gradio_api/run/on_model", data=b'{"data": []}',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 404 and b"no endpoint" in refused.value.read()


@pytest.mark.parametrize("value, wanted", [(None, True), ("on", True), ("off", False), (" OFF ", False),
                                           ("0", False), ("false", False), ("1", True), ("maybe", True)])
def test_coolsd_mcp_turns_the_server_off_only_when_off(value, wanted):
    assert mcp_wanted({} if value is None else {MCP_ENV: value}) is wanted
