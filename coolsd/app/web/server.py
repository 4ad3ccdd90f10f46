"""What stands between a request and a handler: ``Explorer``, the ``gr.Blocks`` whose endpoints answer malformed
input with one readable line, and ``KnownEndpoints``, the HTTP guard that answers 404 for anything but the public
API; and :func:`serve`, which launches the page with both."""

from __future__ import annotations

import logging
import os
import re

import gradio as gr
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from ...core.params import clip
from .api import OPTIONAL_TRAILING
from .texts import CSS
from .widgets import unchecked

log = logging.getLogger("coolsd.app")
SESSIONS_KEPT = 64  # per-session results (about 1 MB each) kept for at most this many browser sessions
CALL = re.compile(r"/gradio_api/call/([^/]+)/?$")


class Explorer(gr.Blocks):
    """``gr.Blocks`` whose endpoints answer a malformed request with a readable error: Gradio itself rejects too
    few values with an empty error, silently drops extra ones, and hides why a value could not be read."""

    named: dict  # set by layout.build_demo: value names (session.value_names) and output names -> components

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
    """ASGI middleware: ``POST /gradio_api/call/<name>`` for a name that is not a documented endpoint (unknown, an
    event that runs in the browser, such as the seed dice, or one of the page's own handlers, which Gradio
    serves there although they are private: ``on_model`` would start loading a 7B model) answers 404 with one
    readable line. Gradio itself answers an unknown name with HTTP 500 and runs a browser-only one into a
    traceback."""

    def __init__(self, app, blocks: gr.Blocks) -> None:
        self.app, self.blocks = app, blocks

    def public(self) -> set[str]:
        """The names callable at /gradio_api/call: events with a Python function that are not private."""
        return {fn.api_name for fn in self.blocks.fns.values()
                if fn.fn and getattr(fn, "api_visibility", "public") != "private"}

    async def __call__(self, scope, receive, send) -> None:
        called = CALL.search(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if called is not None and called.group(1) not in self.public():
            name = clip(repr(called.group(1)), 80)
            log.info("rejected request: no endpoint %s", name)
            response = JSONResponse({"error": f"this app has no endpoint {name}; its API is /generate"}, 404)
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


def serve(demo: Explorer) -> None:
    """Serve the page at ``GRADIO_SERVER_NAME``:``GRADIO_SERVER_PORT`` (default 127.0.0.1:7860) until stopped."""
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=True,
                state_session_capacity=SESSIONS_KEPT)
