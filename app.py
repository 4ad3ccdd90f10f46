"""coolsd explorer: relaxed speculative decoding (COOL-SD and friends) next to lossless Eagle-1.

Run ``python app.py`` and open http://127.0.0.1:7860. The UI lives here; everything it computes lives in
``coolsd/explorer.py``.
"""

from __future__ import annotations

import logging
import os
import random
import time

import gradio as gr

from coolsd import explorer
from coolsd.bundle import load_bundle, random_bundle

try:  # Hugging Face ZeroGPU: the GPU is attached only inside functions wrapped by spaces.GPU
    import spaces
except ImportError:
    spaces = None

log = logging.getLogger("coolsd.app")


def load_model():
    """The shipped default model, or ``COOLSD_MODEL`` (a bundle directory, or ``random:tiny|small``)."""
    choice = os.environ.get("COOLSD_MODEL", "")
    if choice.startswith("random:"):
        return random_bundle(choice.split(":", 1)[1])
    return load_bundle(choice or None)


BUNDLE = load_model()
if spaces is None:  # on ZeroGPU, CUDA work may only run inside spaces.GPU functions
    explorer.warm_up(BUNDLE)
DEFAULTS = {"method": "COOL-SD", "delta": 2.0, "nu": 0.7, "mu_auto": True, "mu": 0.0, "k": 10, "lam": 5.0,
            "draft": "chain:5", "class_name": BUNDLE.class_names[1], "seed": 0, "cfg": BUNDLE.sampling.cfg_scale,
            "temperature": BUNDLE.sampling.temperature, "top_k": BUNDLE.sampling.top_k,
            "top_p": BUNDLE.sampling.top_p, "schedule": "exp"}
VISIBLE = {  # which method controls apply to which method
    "delta": {"COOL-SD", "UniformRSD"}, "cool": {"COOL-SD"},
    "lantern": {"LANTERN++", "LANTERN++ with G*"}, "draft": set(explorer.METHODS) - {"AR (no drafting)"},
}
INTRO = """
# coolsd: watch speculative decoding generate an image
A small **draft** model proposes the next few image tokens; the big **target** model checks them all in
one forward pass and keeps a prefix. *Lossless* Eagle-1 accepts a draft `y` with probability
`min(1, p(y)/q(y))`, so the image has exactly the target's distribution. *Relaxed* methods accept more
(faster) at a measured distortion: **COOL-SD** multiplies the ratio by `omega_i = delta * exp(-nu*i - mu)`,
relaxing early draft positions more than late ones, and resamples rejections from the optimal residual `G*`.
Pick a method, move the sliders, and compare with the lossless image on the right.
"""
METHOD_NOTES = """
| method | accept draft `y` at position `i` with probability | after a rejection, sample from |
|---|---|---|
| AR | (no drafts: one target forward per token) | `p` |
| Eagle-1 | `min(1, p(y)/q(y))` | `Norm([p - q]_+)` (exact: the target's distribution) |
| UniformRSD | `min(1, delta * p(y)/q(y))` | `G* = Norm([p - q f]_+)` |
| COOL-SD | `min(1, omega_i * p(y)/q(y))`, `omega_i = delta * exp(-nu*i - mu)` | `G*` |
| LANTERN++ | `min(1, p~(y)/q(y))`, `p~(y) = p(y) + ` mass of up to `k` nearest codes, `p~ <= lambda * p` | heuristic: clear `q` near `y`, then `Norm([p - q]_+)` |
| LANTERN++ with G* | the same | `G*` |

*mean accepted length* `tau` = image tokens / target forward passes (AR: 1). *Relaxation cost* sums, over
the tested drafts, the total-variation distance that step adds (`e = sum [q f - p]_+`); it is 0 for lossless
decoding. `mu = auto` makes the mean of `omega_1..omega_L` equal `delta`, so COOL-SD and UniformRSD at the same
`delta` spend the same total relaxation.
"""


def on_generate(method, delta, nu, mu_auto, mu, k, lam, draft, class_name, seed, cfg, temperature, top_k, top_p,
                schedule, progress=gr.Progress()):
    """The Generate button: validate, run, and show both images with their numbers (figures follow)."""
    request = checked(lambda: explorer.parse_request(BUNDLE, method, delta, nu, mu_auto, mu, k, lam, draft,
                                                     class_name, seed, cfg, temperature, top_k, top_p, schedule))
    started = time.perf_counter()
    result = checked(lambda: run_comparison(request, progress))
    log.info("generate %s class=%d seed=%d: %.2fs", request.label, request.class_id, request.seed,
             time.perf_counter() - started)
    rounds = len(result.method.stats.rounds)
    return (gr.update(value=explorer.enlarge(result.images["method"]), label=request.label),
            explorer.enlarge(result.images["eagle"]), explorer.timing_table(result),
            f"**{request.label}** (left) and **Eagle-1, lossless** (right): class *{class_name}*, "
            f"seed {request.seed}.", gr.update(maximum=max(1, rounds - 1), value=0), result)


def on_figures(result, metric):
    """Every figure of the last generation (drawn after the images are on screen)."""
    if result is None:
        return [gr.skip()] * 8
    figs = explorer.figures(BUNDLE, result)
    theory_fig, theory_md = theory_outputs(result, result.request, "last generation", 0)
    return (figs["per_position"], figs["lengths"], figs["map_method"], figs["map_eagle"],
            explorer.replay_figure(BUNDLE, result, 0), theory_fig, theory_md,
            explorer.tradeoff_figure(BUNDLE, result, metric))


def run_comparison(request, progress):
    return explorer.compare(BUNDLE, request, progress)


if spaces is not None:
    run_comparison = spaces.GPU(duration=60)(run_comparison)


def checked(compute):
    """Run ``compute``; bad input becomes a readable error in the UI, never a stack trace."""
    try:
        return compute()
    except gr.Error:
        raise
    except ValueError as error:
        raise gr.Error(str(error), title="Invalid setting") from None
    except Exception as error:  # keep the server up and say what happened
        log.exception("request failed")
        raise gr.Error(f"Generation failed: {type(error).__name__}: {error}", title="Error") from None


def theory_outputs(result, request, source, toy_seed):
    """Figure and table of the theory panel, or (unchanged figure, a hint) where it does not apply."""
    if request.method == "ar":
        return gr.skip(), "AR drafts nothing: choose a speculative method to see its theory."
    if result is None and source != "toy distributions":
        return gr.skip(), "Generate an image first, or choose *toy distributions*."
    figure, table, note = checked(lambda: explorer.theory_panel(
        BUNDLE, result, request, "toy" if source == "toy distributions" else "captured", int(toy_seed)))
    return figure, explorer.theory_markdown(table, note)


def on_theory(result, method, delta, nu, mu_auto, mu, k, lam, draft, class_name, seed, cfg, temperature, top_k,
              top_p, schedule, source, toy_seed):
    """Recompute the theory panel when a slider moves (no new generation)."""
    request = checked(lambda: explorer.parse_request(BUNDLE, method, delta, nu, mu_auto, mu, k, lam, draft,
                                                     class_name, seed, cfg, temperature, top_k, top_p, schedule))
    return theory_outputs(result, request, source, toy_seed)


def on_method(method):
    """Show only the controls that apply to ``method``."""
    return [gr.update(visible=method in VISIBLE[key]) for key in ("delta", "cool", "cool", "cool", "lantern",
                                                                   "lantern", "draft", "cool")]


def on_mu(mu_auto, nu, draft, schedule, mu):
    """With "auto" on, show the value it computes and lock the slider."""
    if not mu_auto:
        return gr.update(interactive=True)
    try:
        return gr.update(value=round(explorer.mu_shown(nu, draft, schedule), 4), interactive=False)
    except ValueError:
        return gr.update(interactive=False)


def on_replay(result, round_index):
    if result is None:
        return gr.skip()
    return explorer.replay_figure(BUNDLE, result, int(round_index))


def on_play(result):
    """Step through every round (a short animation)."""
    if result is None:
        raise gr.Error("Generate an image first.", title="Nothing to replay")
    for index in range(len(result.method.stats.rounds)):
        yield gr.update(value=index), explorer.replay_figure(BUNDLE, result, index)
        time.sleep(0.3)


def api_generate(method: str = "COOL-SD", delta: float = 2.0, nu: float = 0.7, mu: str = "auto", k: int = 10,
                 lam: float = 5.0, draft: str = "chain:5", class_name: str = DEFAULTS["class_name"], seed: int = 0,
                 cfg_scale: float = DEFAULTS["cfg"], temperature: float = DEFAULTS["temperature"],
                 top_k: int = DEFAULTS["top_k"], top_p: float = DEFAULTS["top_p"],
                 schedule: str = "exp") -> dict:
    """Generate with one method and with lossless Eagle-1: both images (PNG base64 and pixels), tokens and
    statistics, and AR's latency. ``mu`` is "auto" or a number."""
    mu_auto = str(mu).strip().lower() == "auto"
    request = checked(lambda: explorer.parse_request(BUNDLE, method, delta, nu, mu_auto, None if mu_auto else mu,
                                                     k, lam, draft, class_name, seed, cfg_scale, temperature,
                                                     top_k, top_p, schedule))
    return explorer.api_payload(checked(lambda: run_comparison(request, None)))


CSS = ".pixelated img { image-rendering: pixelated; } .timings th, .timings td { overflow-wrap: normal !important; word-break: normal !important; }"

with gr.Blocks(title="coolsd explorer") as demo:
    result_state = gr.State(None)
    gr.Markdown(INTRO)
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            method = gr.Radio(list(explorer.METHODS), value=DEFAULTS["method"], label="Method")
            with gr.Row():
                preset_11 = gr.Button("Paper: COOL-SD δ=1.1", size="sm")
                preset_2 = gr.Button("Paper: COOL-SD δ=2", size="sm")
                reset = gr.Button("Reset", size="sm")
            delta = gr.Slider(0.05, 5.0, value=DEFAULTS["delta"], step=0.05, label="δ (delta): total relaxation")
            nu = gr.Slider(-1.0, 2.0, value=DEFAULTS["nu"], step=0.05, label="ν (nu): decay per draft position")
            with gr.Row():
                mu_auto = gr.Checkbox(value=True, label="μ auto (mean ω = δ)", min_width=120)
                mu = gr.Slider(-5.0, 5.0, value=0.0, step=0.01, label="μ (mu): offset", interactive=False)
            omega_md = gr.Markdown()
            k = gr.Slider(0, 50, value=DEFAULTS["k"], step=1, label="LANTERN++ k (neighbours)", visible=False)
            lam = gr.Slider(1.0, 10.0, value=DEFAULTS["lam"], step=0.1, label="LANTERN++ λ (lambda)", visible=False)
            draft = gr.Dropdown(explorer.DRAFTS, value=DEFAULTS["draft"], label="Draft structure")
            class_name = gr.Dropdown(BUNDLE.class_names, value=DEFAULTS["class_name"], label="Class")
            with gr.Row():
                seed = gr.Number(value=0, precision=0, label="Seed", minimum=0, maximum=2**31 - 1)
                dice = gr.Button("Random seed", size="sm")
            with gr.Accordion("Advanced: sampling", open=False):
                cfg = gr.Slider(0.0, 10.0, value=DEFAULTS["cfg"], step=0.1, label="CFG scale")
                temperature = gr.Slider(0.1, 2.0, value=DEFAULTS["temperature"], step=0.05, label="Temperature")
                top_k = gr.Slider(0, BUNDLE.config.vocab_size, value=DEFAULTS["top_k"], step=1,
                                  label="Top-k (0 = off)")
                top_p = gr.Slider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.01, label="Top-p (1 = off)")
                schedule = gr.Radio(["exp", "linear"], value="exp", label="COOL-SD schedule")
            run = gr.Button("Generate", variant="primary")
        with gr.Column(scale=2):
            caption = gr.Markdown("Press **Generate**.")
            with gr.Row():
                image_method = gr.Image(label="Chosen method", type="pil", format="png", height=300,
                                        elem_classes="pixelated", interactive=False)
                image_eagle = gr.Image(label="Eagle-1 (lossless)", type="pil", format="png", height=300,
                                       elem_classes="pixelated", interactive=False)
            timings = gr.Markdown(elem_classes="timings")
            with gr.Tabs():
                with gr.Tab("Per position"):
                    per_position = gr.Plot(label="acceptance per draft position")
                with gr.Tab("Accepted lengths"):
                    lengths = gr.Plot(label="accepted length per round")
                with gr.Tab("Acceptance maps"):
                    with gr.Row():
                        map_method = gr.Plot(label="chosen method")
                        map_eagle = gr.Plot(label="Eagle-1")
                with gr.Tab("Replay"):
                    with gr.Row():
                        round_slider = gr.Slider(0, 1, value=0, step=1, label="Round")
                        play = gr.Button("▶ Play", size="sm")
                    replay_plot = gr.Plot(label="one round")
                with gr.Tab("Theory"):
                    gr.Markdown("Exact per-position acceptance rate `beta_i`, TV cost `e_i`, expected accepted drafts "
                                "`E[N]` and the total-variation bound of one round (spec section 4), under the "
                                "current sliders: move them and watch the trade-off.")
                    with gr.Row():
                        source = gr.Radio(["last generation", "toy distributions"], value="last generation",
                                          label="(p, q) pairs from")
                        toy_seed = gr.Number(value=0, precision=0, label="toy seed", minimum=0, maximum=10**6)
                    theory_plot = gr.Plot()
                    theory_md = gr.Markdown()
                with gr.Tab("Trade-off"):
                    metric = gr.Radio(["fid", "judge_accuracy"], value="fid", label="quality axis")
                    tradeoff_plot = gr.Plot(value=explorer.tradeoff_figure(BUNDLE, None, "fid"))
                    gr.Markdown(METHOD_NOTES)

    controls = [method, delta, nu, mu_auto, mu, k, lam, draft, class_name, seed, cfg, temperature, top_k, top_p,
                schedule]
    run.click(on_generate, controls, [image_method, image_eagle, timings, caption, round_slider, result_state],
              api_visibility="private", concurrency_id="generate").then(
        on_figures, [result_state, metric], [per_position, lengths, map_method, map_eagle, replay_plot, theory_plot,
                                             theory_md, tradeoff_plot], api_visibility="private")
    method.change(on_method, method, [delta, nu, mu_auto, mu, k, lam, draft, schedule])
    for control in (mu_auto, nu, draft, schedule):
        control.change(on_mu, [mu_auto, nu, draft, schedule, mu], mu)
    for control in (method, delta, nu, mu_auto, mu, draft, schedule):
        control.change(explorer.omega_line, [method, delta, nu, mu_auto, mu, draft, schedule], omega_md)
    for control in (method, delta, nu, mu_auto, mu, k, lam, schedule, source, toy_seed):
        control.change(on_theory, [result_state, *controls, source, toy_seed], [theory_plot, theory_md],
                       show_progress="hidden")
    round_slider.release(on_replay, [result_state, round_slider], replay_plot)
    play.click(on_play, result_state, [round_slider, replay_plot])
    metric.change(lambda result, metric: explorer.tradeoff_figure(BUNDLE, result, metric), [result_state, metric],
                  tradeoff_plot)
    dice.click(lambda: random.randrange(2**31), None, seed)
    preset_11.click(lambda: ("COOL-SD", 1.1, 0.7, True), None, [method, delta, nu, mu_auto])
    preset_2.click(lambda: ("COOL-SD", 2.0, 0.7, True), None, [method, delta, nu, mu_auto])
    reset.click(lambda: [DEFAULTS[key] for key in ("method", "delta", "nu", "mu_auto", "mu", "k", "lam", "draft",
                                                   "class_name", "seed", "cfg", "temperature", "top_k", "top_p",
                                                   "schedule")], None, controls)
    demo.load(explorer.omega_line, [method, delta, nu, mu_auto, mu, draft, schedule], omega_md)
    demo.load(on_mu, [mu_auto, nu, draft, schedule, mu], mu)
    gr.api(api_generate, api_name="generate", concurrency_id="generate")

demo.queue(default_concurrency_limit=2, max_size=64)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=False)
