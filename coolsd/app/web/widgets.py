"""The page's number controls: a slider or number box whose value reaches our own checks as it was typed
(``Param.check``: one message that names the parameter), and a slider made from a parameter's one definition."""

from __future__ import annotations

import gradio as gr

from ...core.params import Param
from ..controls import slider_start


def unchecked(component: gr.components.Component) -> gr.components.Component:
    """``component`` (a slider or number box) passing a typed value on as it is, for our schema to check
    (``Param.check``: one message that names the parameter): Gradio's own check raises an unnamed range error
    once per event that reads the control. (A subclass would do the same, but Gradio writes a ``.pyi`` file
    next to the module of every component subclass.) Gradio rebuilds a component whose properties a handler
    updates (a range, its visibility): ``server.Explorer.postprocess_data`` marks the rebuilt one again."""
    component.preprocess = lambda payload: payload
    component.unchecked = True
    return component


def slider(param: Param, **kwargs) -> gr.Slider:
    """A slider whose range, step, default and label come from the parameter's one definition (the rule
    registry or ``coolsd.core.params``), which the API and the command line check too."""
    maximum = kwargs.pop("maximum", param.high)
    return unchecked(gr.Slider(param.low, maximum, **{"value": slider_start(param, maximum), "step": param.step,
                                                      "label": param.label, **kwargs}))
