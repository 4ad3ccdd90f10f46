"""The page: the settings column, the images with their timing table, the figure tabs and the guided tour, as
Gradio components built from the rule registry and the running state; :func:`build_demo` assembles them and has
``events`` wire them. ``demo.named`` maps value and output names to components."""

from __future__ import annotations

import gradio as gr

from ...core.params import PARAMS, Choice
from ...models.bundle import Bundle
from ...models.registry import EXAMPLE_PROMPTS
from .. import models, session, tour, views
from ..controls import OMEGA_LINE, drafter_choices, drafting_labels, method_boxes, shows_drafter, word_label
from . import events, gpu
from .generation import RACE_WAITING
from .inputs import defaults
from .runtime import Runtime, current
from .server import Explorer
from .texts import INTRO, METHOD_NOTES, THEORY_INTRO, TOUR_INTRO
from .widgets import slider, unchecked

QUALITY_AXES = [("judge-FID (lower is better)", "fid"), ("class consistency", "judge_accuracy"),
                ("log-likelihood per token (the target's own score)", "log_likelihood_per_token")]
PAPER = {"method": "COOL-SD", "nu": 0.7, "mu_auto": True, "schedule": "exp"}  # the paper's COOL-SD; any draft
PRESETS = {  # button -> the control values it sets: every one the setting depends on (the draft stays the user's)
    "Paper: COOL-SD δ=1.1": {**PAPER, "delta": 1.1},
    "Paper: COOL-SD δ=2": {**PAPER, "delta": 2.0},
}


def method_control(control: session.MethodControl, start: dict) -> dict[str, gr.components.Component]:
    """One method parameter's widgets by value name: a radio for named choices; a slider for a number, after a
    checkbox per word it also takes (ticked: the word stands, and the slider hides)."""
    param = control.schema
    if isinstance(param, Choice):
        return {control.name: gr.Radio(list(param.choices), value=start[control.name], label=param.label)}
    widgets = {name: gr.Checkbox(value=start[name], label=word_label(param, word), info=param.help or None)
               for name, word in control.words.items()}
    hidden = any(start[name] for name in widgets)
    widgets[control.name] = slider(param, value=start[control.name], visible=not hidden,
                                   elem_id=f"{control.name}-slider")
    return widgets


def method_panel(start: dict) -> tuple[dict, list[gr.Column]]:
    """The method controls, box by box (:func:`method_boxes`), each box visible for the entries it applies to."""
    controls = {control.name: control for control in session.method_controls()}
    named: dict = {}
    boxes = []
    for labels, items in method_boxes():
        with gr.Column(visible=start["method"] in labels, elem_classes="method-controls") as box:
            for item in items:
                if item == OMEGA_LINE:
                    named[OMEGA_LINE] = gr.Markdown(elem_id="omega-line")
                else:
                    named.update(method_control(controls[item], start))
        boxes.append(box)
    return named, boxes


def settings_panel(state: Runtime, start: dict) -> tuple[dict, list[gr.Column]]:
    """The left column: model, method, presets, the method's controls, draft, class or prompt, seed, sampling,
    Generate."""
    named: dict = {"model": gr.Dropdown([(choice.label, choice.key) for choice in state.models.choices()],
                                        value=start["model"], label="Model", elem_id="model")}
    notes = models.warnings()  # broken COOLSD_MODELS entries (met while listing the choices): in the log and here
    gr.Markdown("\n".join(f"⚠️ {views.plain(note, 400)}  " for note in notes), visible=bool(notes),
                elem_id="model-warnings")
    named["method"] = gr.Radio(list(session.method_entries()), value=start["method"], label="Method")
    with gr.Row():
        named["presets"] = {gr.Button(text, size="sm"): values for text, values in PRESETS.items()}
        named["reset"] = gr.Button("Reset", size="sm")
    controls, boxes = method_panel(start)
    named.update(controls)
    bundle = state.bundle
    with gr.Column(visible=start["method"] in drafting_labels(), elem_id="draft-box") as named["draft_box"]:
        named["draft"] = gr.Dropdown(session.DRAFTS, value=start["draft"], label="Draft structure")
        named["draft_note"] = gr.Markdown(views.draft_note(start["draft"]), elem_id="draft-note")
        named["drafter"] = drafter_radio(bundle, start)
    text = session.text_model(bundle)
    named["class_name"] = gr.Dropdown(bundle.class_names, value=start["class_name"], label="Class",
                                      visible=not text, elem_id="class-name")
    with gr.Column(visible=text) as named["prompt_box"]:
        named["prompt"] = gr.Textbox(value=start["prompt"], label="Prompt", lines=2, max_lines=6,
                                     max_length=session.PROMPT_CHARS, elem_id="prompt")
        named["examples"] = gr.Dropdown(list(EXAMPLE_PROMPTS), value=None, label="Example prompts",
                                        elem_id="example-prompts")
    with gr.Row():
        named["seed"] = unchecked(gr.Number(value=start["seed"], precision=0, label="Seed", minimum=PARAMS["seed"].low,
                                            maximum=PARAMS["seed"].high, elem_id="seed"))
        named["dice"] = gr.Button("Random seed", size="sm")
    with gr.Accordion("Advanced: sampling", open=False):
        for name in ("cfg_scale", "temperature", "top_k", "top_p"):
            top = {"maximum": bundle.config.vocab_size} if name == "top_k" else {}
            named[name] = slider(PARAMS[name], value=start[name], **top)
    # last among the settings, but pinned to the window's bottom while they are in view (CSS: #generate)
    named["run"] = gr.Button("Generate", variant="primary", elem_id="generate")
    return named, boxes


def drafter_radio(bundle: Bundle, start: dict) -> gr.Radio:
    """The drafter selector: the model's drafters by display name (Eagle-1, EAGLE-3). Shown only where it is a
    choice that matters (:func:`shows_drafter`: two drafters or more, a chain or tree); it follows the draft and
    the model (``events``)."""
    return gr.Radio(drafter_choices(bundle), value=start["drafter"], label="Drafter", elem_id="drafter",
                    info="the draft model that proposes the chain's or tree's tokens; both images draft with it",
                    visible=shows_drafter(bundle, start["draft"]))


def results_panel(state: Runtime) -> dict:
    """The right column: both images, the timing table, and the figure tabs."""
    first = state.first_images
    named: dict = {"caption": gr.Markdown(first["caption"], elem_id="caption")}
    with gr.Row():
        # the caption above names both (Gradio's label and buttons would cover the picture's top rows)
        named["image_method"] = gr.Image(first.get("method"), label=first["labels"][0], show_label=False, buttons=[],
                                         type="pil", format="png", height=300, elem_classes="pixelated",
                                         interactive=False, elem_id="image-method")
        named["image_eagle"] = gr.Image(first.get("eagle"), label=first["labels"][1], show_label=False, buttons=[],
                                        type="pil", format="png", height=300, elem_classes="pixelated",
                                        interactive=False, elem_id="image-eagle")
    named["timings"] = gr.Markdown(elem_classes="timings", elem_id="timings")
    shown = views.first_figures(state.bundle, first.get("result"))
    rounds = len(first["result"].method.stats.rounds) if first.get("result") else 2
    with gr.Tabs(overflow_behavior="wrap"):  # every tab's name in view, on two lines on a phone
        with gr.Tab("Race"):
            named["race_image"] = gr.Image(show_label=False, buttons=[], type="pil", format="png", interactive=False,
                                           elem_id="race-image", elem_classes="race-picture", visible=False)
            named["race_text"] = gr.Markdown(RACE_WAITING, elem_id="race-text", elem_classes="timings")
            named["race_again"] = gr.Button("▶ Race again", size="sm")
        with gr.Tab("Per position"):
            named["per_position"] = gr.Plot(shown["per_position"], show_label=False, elem_id="per-position")
        with gr.Tab("Accepted lengths"):
            named["lengths"] = gr.Plot(shown["lengths"], show_label=False, elem_id="lengths")
        with gr.Tab("Acceptance maps"), gr.Row():  # side by side; one above the other on a phone
            named["map_method"] = gr.Plot(shown["map_method"], show_label=False, min_width=340, elem_id="map-method")
            named["map_eagle"] = gr.Plot(shown["map_eagle"], show_label=False, min_width=340, elem_id="map-eagle")
        with gr.Tab("Replay"):
            with gr.Row():
                named["round_slider"] = unchecked(gr.Slider(0, max(1, rounds - 1), value=0, step=1, label="Round",
                                                            elem_id="round-slider"))
                named["play"] = gr.Button("▶ Play", size="sm")
            named["replay_plot"] = gr.Plot(shown["replay_plot"], show_label=False, elem_id="replay-plot")
        with gr.Tab("Theory"):
            named.update(theory_tab())
        with gr.Tab("Trade-off"):
            named.update(tradeoff_tab(state))
    return named


def tradeoff_tab(state: Runtime) -> dict:
    """The study's quality/speed figure: its quietest measure first, the methods at their default parameters
    (the other series on demand), and a note when the current setting is not on the study's grid."""
    bundle = state.bundle
    metric, (choices, shown) = views.default_metric(bundle), views.tradeoff_families(bundle)
    figure, note = views.tradeoff_panel(bundle, None, metric, shown)
    named = {"metric": gr.Radio(QUALITY_AXES, value=metric, label="quality axis"),
             "families": gr.CheckboxGroup(list(choices.items()), value=shown, label="series", elem_id="families"),
             "tradeoff_plot": gr.Plot(value=figure, show_label=False, elem_id="tradeoff-plot"),
             "tradeoff_note": gr.Markdown(views.plain(note, 600) if note else "", elem_id="tradeoff-note")}
    gr.Markdown(METHOD_NOTES, elem_classes="formulas")  # a phone scrolls its table sideways
    return named


def theory_tab() -> dict:
    """The theory panel: where its (p, q) pairs come from, its figure and its table."""
    gr.Markdown(THEORY_INTRO)
    named = {}
    with gr.Row():
        named["source"] = gr.Radio(["last generation", "toy distributions"], value="last generation",
                                   label="(p, q) pairs from")
        named["toy_seed"] = unchecked(gr.Number(value=views.TOY_SEED.default, precision=0, label=views.TOY_SEED.label,
                                                minimum=views.TOY_SEED.low, maximum=views.TOY_SEED.high,
                                                elem_id="toy-seed"))
    named["theory_plot"] = gr.Plot(show_label=False, elem_id="theory-plot")
    named["theory_md"] = gr.Markdown(elem_id="theory-text")
    return named


def tour_panel() -> dict:
    """The guided tour: a button per step (:data:`coolsd.app.tour.STEPS`) and the chosen step's text."""
    with gr.Accordion("Guided tour", open=False, elem_id="tour"):
        gr.Markdown(TOUR_INTRO.format(steps=len(tour.STEPS)))
        with gr.Row():
            buttons = [gr.Button(step.title, size="sm") for step in tour.STEPS]
        text = gr.Markdown(elem_id="tour-text")
    return {"tour_buttons": buttons, "tour_text": text}


def build_demo(state: Runtime | None = None) -> Explorer:
    """The explorer's page over ``state`` (default: the running one), its method controls read from the rule
    registry now (a method registered before the call gets its controls); ``demo.named`` maps names (value
    names, outputs) to components."""
    state = state or current()
    gpu.place_all()  # before launch: ZeroGPU wants its functions wrapped by then
    start = defaults(state.bundle)
    with Explorer(title="coolsd explorer", delete_cache=(3600, 3600)) as demo:  # image files: an hour
        named: dict = {"result": gr.State(state.first_images.get("result")), "model_state": gr.State(start["model"]),
                       "narrow": gr.Checkbox(False, visible=False, elem_id="narrow"),  # set in the browser
                       "relayout": gr.Button("relayout", visible="hidden", elem_id="relayout"),  # clicked by it
                       "shown_serial": gr.Number(0, visible="hidden", elem_id="shown-serial")}  # events.SHOW_NEW
        gr.Markdown(INTRO)
        named.update(tour_panel())
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                settings, boxes = settings_panel(state, start)
            with gr.Column(scale=2, min_width=300):
                named.update(results_panel(state))
        named.update(settings)
        demo.named = named
        events.wire(demo, named, boxes, start)
    demo.queue(default_concurrency_limit=2, max_size=64)
    return demo
