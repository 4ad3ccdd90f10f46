"""What stands between a request and a handler: ``Explorer``, the ``gr.Blocks`` whose endpoints answer malformed
input with one readable line, and ``KnownEndpoints``, the HTTP guard that answers 404 for anything but the public
API; and :func:`serve`, which launches the page with both, and with the public API's MCP server (``tools``)."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable

import gradio as gr
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from ...core.params import clip
from ..models import OFF, ON
from .api import OPTIONAL_TRAILING
from .inputs import INVALID_SETTING
from .texts import CSS
from .tools import ToolServer
from .widgets import unchecked

log = logging.getLogger("coolsd.app")
SESSIONS_KEPT = 64  # per-session results (about 1 MB each) kept for at most this many browser sessions
BY_NAME = re.compile(r"/gradio_api/(run|api|call/v2|call)/([^/]+)/?$")  # Gradio's routes that run an event by name
JOIN = re.compile(r"/gradio_api/queue/join/?$")  # ... and by number (what the page uses)
REFUSAL_TITLES = ("Invalid request", INVALID_SETTING)  # gr.Error titles of a refused value: HTTP 422
MCP_ENV = "COOLSD_MCP"  # on / off: whether serve() adds the MCP server (unset: on)


class Explorer(gr.Blocks):
    """``gr.Blocks`` whose endpoints answer a malformed request with a readable error: Gradio itself rejects too
    few values with an empty error, silently drops extra ones, and hides why a value could not be read."""

    named: dict  # set by layout.build_demo: value names (session.value_names) and output names -> components

    @property
    def mcp_server_obj(self) -> ToolServer | None:
        """The MCP server launched with the page (None without one)."""
        return self.__dict__.get("_tool_server")

    @mcp_server_obj.setter
    def mcp_server_obj(self, server) -> None:
        """Gradio's launch sets its own MCP server here, before it mounts its routes: ours serves in its place,
        so that the tools answer with pictures and text (:class:`ToolServer`)."""
        if server is not None and not isinstance(server, ToolServer):
            server = ToolServer(self)
        self.__dict__["_tool_server"] = server

    def validate_inputs(self, block_fn, inputs):
        optional = OPTIONAL_TRAILING.get(block_fn.api_name, [])
        wanted = len(block_fn.inputs)
        if wanted - len(optional) <= len(inputs) < wanted:  # a client of the older contract: defaults follow
            inputs.extend(optional[len(inputs) - wanted:])
        if len(inputs) != wanted:
            count = f"{wanted - len(optional)} to {wanted}" if optional else str(wanted)
            message = f"/{block_fn.api_name} takes {count} values, got {len(inputs)}"
            log.info("rejected request: %s", message)
            raise gr.Error(message, title="Invalid request", print_exception=False)

    def launch(self, *args, **kwargs):
        """Gradio's launch, with :class:`KnownEndpoints` in front of the app."""
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), Middleware(KnownEndpoints, blocks=self)]
        return super().launch(*args, app_kwargs=app_kwargs, **kwargs)

    async def postprocess_data(self, block_fn, predictions, state):
        """Gradio's, then every output it rebuilt from an :func:`unchecked` one made unchecked too."""
        outputs = await super().postprocess_data(block_fn, predictions, state)
        for block in block_fn.outputs:
            if getattr(block, "unchecked", False) and state is not None and block._id in state:
                unchecked(state[block._id])
        return outputs

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        self.validate_inputs(block_fn, inputs)  # its own message (Gradio's call of it then passes)
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except gr.Error as error:  # Gradio refuses a value (one no dropdown offers): one line, no traceback
            reason = clip(str(error.message), 300)
            log.info("rejected request: %s", reason)
            raise gr.Error(reason, title="Invalid request", print_exception=False) from None
        except Exception as error:  # Gradio's message: "Could not preprocess ... \n\nExpected ... was: value"
            parts = str(error).split("\n\n")
            reason = parts[0].split(" with input components")[0] + (f": {parts[1]}" if len(parts) > 1 else "")
            log.info("rejected request: %s", clip(reason, 300))
            raise gr.Error(clip(reason, 300), title="Invalid request", print_exception=False) from None


class KnownEndpoints:
    """ASGI middleware in front of every route by which Gradio runs an event. By name (``POST /gradio_api/run/``,
    ``/api/``, ``/call/`` and ``/call/v2/``): only the public API; an unknown name, an event that runs in the
    browser (the seed dice) or one of the page's own handlers (``on_model`` would start loading a 7B model)
    answers 404 in one line, where Gradio answers 500 with a traceback or runs the handler. By number
    (``POST /gradio_api/queue/join``): a page handler only as the page itself sends it (with the header
    ``x-gradio-user: app`` that Gradio's page client adds); an event that does not exist or has no Python function
    answers 404. A refused call of the API by name answers 422, not Gradio's 500. Not access control: a client
    that sends what the page sends can do what the page can. The MCP server's routes pass (``/gradio_api/mcp/``;
    for SSE clients ``.../sse`` and ``.../messages/``; ``.../schema``): its tools are the public endpoints only,
    and it runs a tool call as Gradio's client of the API would, joining the queue with the endpoint's number."""

    def __init__(self, app, blocks: gr.Blocks) -> None:
        self.app, self.blocks = app, blocks

    def public(self) -> set[str]:
        """The names callable by name: events with a Python function that are not private."""
        return {fn.api_name for fn in self.blocks.fns.values()
                if fn.fn and getattr(fn, "api_visibility", "public") != "private"}

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" and scope["method"] == "POST" else ""
        if (named := BY_NAME.search(path)) is not None:
            if named.group(2) not in self.public():
                return await refuse(f"this app has no endpoint {clip(repr(named.group(2)), 80)}", scope, receive, send)
            if named.group(1) in ("run", "api"):  # answered at once: a refusal's status is ours to set
                send = refusals_as_422(send)
        elif JOIN.search(path):
            body, receive = await read_body(receive)
            why = self.unsent_by_page(body, scope)
            if why:
                return await refuse(why, scope, receive, send)
        await self.app(scope, receive, send)

    def unsent_by_page(self, body: bytes, scope) -> str | None:
        """Why a queue join names an event the page would not send (None: it would, or Gradio judges the body)."""
        try:
            index = json.loads(body).get("fn_index")
        except (ValueError, AttributeError):
            return None  # not a JSON object: Gradio's own 422
        if not isinstance(index, int):
            return None
        fn = self.blocks.fns.get(index)
        if fn is None or not fn.fn:
            return f"this app has no event {index}"
        page = dict(scope.get("headers", [])).get(b"x-gradio-user") == b"app"
        if getattr(fn, "api_visibility", "public") == "private" and not page:
            return f"event {index} is the page's own"
        return None


async def read_body(receive) -> tuple[bytes, Callable]:
    """A request's whole body, and a ``receive`` that hands the app the same messages again."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body"):
            break

    async def replay():
        return messages.pop(0) if messages else await receive()
    return b"".join(message.get("body", b"") for message in messages), replay


async def refuse(why: str, scope, receive, send) -> None:
    """404 with one readable line, logged once."""
    log.info("rejected request: %s", why)
    await JSONResponse({"error": f"{why}; its API is /generate and /generate_batch"}, 404)(scope, receive, send)


def refusals_as_422(send) -> Callable:
    """``send``, but a 500 whose error is one of the app's refusals of a value (:data:`REFUSAL_TITLES`) goes out
    as 422: the client sent something wrong, the server did not fail. Other 500s pass as they are."""
    start: dict = {}
    body: list[bytes] = []

    async def forward(message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 500:
            start.update(message)
            return
        if not start or message["type"] != "http.response.body":
            return await send(message)
        body.append(message.get("body", b""))
        if message.get("more_body"):
            return
        try:
            refused = json.loads(b"".join(body)).get("title") in REFUSAL_TITLES
        except (ValueError, AttributeError):
            refused = False
        await send({**start, "status": 422 if refused else 500})
        await send({"type": "http.response.body", "body": b"".join(body)})
    return forward


def mcp_wanted(environ=os.environ) -> bool:
    """Whether :func:`serve` adds the MCP server: ``COOLSD_MCP`` on or off; unset (or neither), on."""
    value = environ.get(MCP_ENV, "").strip().lower()
    if value and value not in ON + OFF:
        log.warning("%s=%s is neither on nor off: taken as on", MCP_ENV, clip(repr(value), 40))
    return value not in OFF


def serve(demo: Explorer) -> None:
    """Serve the page at ``GRADIO_SERVER_NAME``:``GRADIO_SERVER_PORT`` (default 127.0.0.1:7860) until stopped,
    with the public API's MCP server at ``/gradio_api/mcp/`` unless ``COOLSD_MCP=off``."""
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=True,
                state_session_capacity=SESSIONS_KEPT, mcp_server=mcp_wanted())
