"""The MCP server: Gradio's (streamable HTTP at ``/gradio_api/mcp/``, SSE at ``/gradio_api/mcp/sse``), whose tools
are the public API's endpoints, ``generate`` and ``generate_batch`` (Gradio makes a tool of every public event
with a Python function; the page's handlers are private). Gradio would answer a tool call with one text holding
the whole JSON answer, raw pixels included; :class:`ToolServer` answers with what an MCP client shows: each
picture a PNG image after a line that says what it is, then the statistics as JSON."""

from __future__ import annotations

import json
from statistics import median
from typing import Any

from gradio.mcp import GradioMCPServer

from ...core.rules import RULES
from ...models.bundle import DRAFTER_NAMES

Part = tuple[str, str]  # ("text", words) or ("image", PNG as base64): one content block of a tool's answer
ANSWERS = {  # what an MCP client gets, per tool: its description ends with this
    "generate": "Over MCP the answer is the method's picture and Eagle-1's (PNG), each after a line of its "
                "statistics, then every statistic as JSON (and the latencies when timing_repeats > 0).",
    "generate_batch": "Over MCP the answer is the batch's seconds, then per seed the method's picture and "
                      "Eagle-1's (PNG), each after a line of its statistics, then every statistic as JSON.",
}
OMITTED = ("tokens_detail",)  # per-token lists: in the HTTP API's answer, too long for a reader
STATISTICS = "Statistics (JSON): "  # opens the last text of an answer


class ToolServer(GradioMCPServer):
    """Gradio's MCP server with the app's answers: ``/generate``'s and ``/generate_batch``'s JSON as images and
    text (:func:`answer_parts`); any other answer as Gradio gives it."""

    def get_fn_description(self, block_fn, tool_name: str) -> tuple[str, dict[str, str]]:
        """Gradio's (the endpoint's docstring: its summary, and each Args line for its parameter), then what
        the tool answers over MCP, which differs from the HTTP API's JSON."""
        description, parameters = super().get_fn_description(block_fn, tool_name)
        return " ".join(filter(None, [description, ANSWERS.get(block_fn.api_name, "")])), parameters

    def postprocess_output_data(self, data: Any, root_url: str) -> list:
        """An endpoint's outputs as MCP content blocks: ours as :func:`answer_parts` makes them."""
        parts = answer_parts(data[0]) if isinstance(data, list) and len(data) == 1 else None
        if parts is None:
            return super().postprocess_output_data(data, root_url)
        return [self.types.ImageContent(type="image", data=value, mimeType="image/png") if kind == "image" else
                self.types.TextContent(type="text", text=value) for kind, value in parts]


def answer_parts(answer: Any) -> list[Part] | None:
    """``/generate``'s or ``/generate_batch``'s answer as content parts; None for any other value."""
    if isinstance(answer, dict) and {"method", "eagle", "timing"} <= answer.keys():
        return generate_parts(answer)
    if isinstance(answer, dict) and {"batch", "seconds", "images"} <= answer.keys():
        return batch_parts(answer)
    return None


def generate_parts(answer: dict) -> list[Part]:
    """Both runs' lines and pictures, the latencies if measured, then the statistics as JSON."""
    parts = run_parts(answer["method"]) + run_parts(answer["eagle"])
    if answer["timing"]:
        parts.append(("text", timing_line(answer["timing"], answer["method"]["stats"])))
    measured = {"method": stats_of(answer["method"]), "eagle": stats_of(answer["eagle"]), "timing": answer["timing"]}
    return parts + [("text", STATISTICS + json.dumps(measured))]


def batch_parts(answer: dict) -> list[Part]:
    """The batch's seconds, each seed's lines and pictures, then the statistics as JSON."""
    seconds = answer["seconds"]
    label = run_label(answer["images"][0]["method"]["stats"]) if answer["images"] else "the method"
    parts = [("text", f"{answer['batch']} seeds decoded as one batch per method: {label} in "
                      f"{seconds['method']:.2f} s, Eagle-1 in {seconds['eagle']:.2f} s.")]
    for image in answer["images"]:
        parts += run_parts(image["method"]) + run_parts(image["eagle"])
    measured = {"batch": answer["batch"], "seconds": seconds,
                "images": [{"seed": image["seed"], "method": stats_of(image["method"]),
                            "eagle": stats_of(image["eagle"])} for image in answer["images"]]}
    return parts + [("text", STATISTICS + json.dumps(measured))]


def run_parts(run: dict) -> list[Part]:
    """One run: the line that says what its picture is, then the picture."""
    return [("text", run_line(run["stats"])), ("image", run["png_base64"])]


def run_label(stats: dict) -> str:
    """The method's name as the page shows it (``COOL-SD`` for the rule ``cool``)."""
    rule = RULES.get(stats["method"])
    return rule.label if rule is not None else str(stats["method"])


def run_line(stats: dict) -> str:
    """A run's statistics in one line: method and parameters, draft and drafter, condition, seed, tokens, target
    forwards, tau, the acceptance rate per draft depth, drafter forwards and seconds."""
    params = ", ".join(f"{name}={value}" for name, value in stats["params"].items())
    condition = ", ".join(f"{name} {json.dumps(value)}" for name, value in stats["condition"].items())
    rates = ", ".join("-" if rate is None else f"{rate:.2f}" for rate in stats["per_depth"]["accept_rate"])
    draft = "" if stats["draft"] in (None, "none") else f", draft {stats['draft']}"  # AR drafts nothing
    drafter = stats.get("drafter")
    draft += f" ({DRAFTER_NAMES.get(drafter, drafter)} drafter)" if draft and drafter else ""
    return (f"{run_label(stats)}{f' ({params})' if params else ''}{draft}, {condition}, "
            f"seed {stats['seed']}: {stats['tokens']} tokens in {stats['target_forwards']} target forwards "
            f"(tau {stats['tau']:.2f} tokens per target forward"
            + (f"; acceptance rate by draft depth: {rates}" if rates else "")
            + f"), {stats['drafter_forwards']} drafter forwards, {stats['seconds']['total']:.2f} s.")


def timing_line(timing: dict, stats: dict) -> str:
    """The interleaved repeats' median latencies and speed-ups over AR in one line (the method's own, where it
    is neither AR nor Eagle-1: ``stats``, its run's)."""
    seconds = timing["seconds"]
    runs = [("Eagle-1", "eagle")] + ([(run_label(stats), "method")] if stats["method"] not in ("ar", "eagle") else [])
    speedups = "; ".join(f"{name} {median(seconds[run]):.2f} s, {timing[f'speedup_vs_ar_{run}'][0]:.2f}x AR"
                         for name, run in runs if run in seconds and timing.get(f"speedup_vs_ar_{run}"))
    return (f"Latency, median of {timing['repeats']} interleaved repeats on {timing['device']}: "
            f"AR {median(seconds['ar']):.2f} s" + (f"; {speedups}." if speedups else "."))


def stats_of(run: dict) -> dict:
    """A run's statistics without the per-token lists (:data:`OMITTED`)."""
    return {name: value for name, value in run["stats"].items() if name not in OMITTED}
