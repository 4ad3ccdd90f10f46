"""The app's running state, made once per process by :func:`start`: the default model (loaded and warmed up),
the model selector's store, each browser session's newest generation, the device adapter and its GPU budget,
and what the page opens with (the first images, the tour's numbers). Handlers reach it with :func:`current`
(Gradio passes them component values only); importing this module loads nothing and starts no thread."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ...models.bundle import Bundle, load_bundle, random_bundle, set_threads
from .. import models, session, tour, views
from ..controls import defaults
from .budget import Budget
from .device import Device


@dataclass
class Runtime:
    """Everything the handlers share. GPU work runs through :mod:`.gpu`, where the device says."""

    bundle: Bundle  # the default model
    models: models.Models  # the selector's models: the default now, the others loaded on first use
    device: Device
    budget: Budget = field(default_factory=Budget)  # what each ZeroGPU call asks for
    latest: session.Latest = field(default_factory=session.Latest)  # each browser session's newest generation
    tour_facts: dict = field(default_factory=lambda: tour.study_facts(tour.read_study()))  # numbers the tour cites
    first_images: dict = field(default_factory=dict)  # :func:`first_images`

    def bundle_of(self, request: session.Request) -> Bundle:
        """The model a validated request was made for (already loaded)."""
        return self.models.get(request.model)


RUNTIME: Runtime | None = None


def current() -> Runtime:
    """The state :func:`start` made (a readable error before it)."""
    if RUNTIME is None:
        raise RuntimeError("the app has not started: call coolsd.app.web.runtime.start() first")
    return RUNTIME


def load_model() -> Bundle:
    """The shipped default model, or ``COOLSD_MODEL`` (a bundle directory, or ``random:tiny|small``)."""
    choice = os.environ.get("COOLSD_MODEL", "")
    if choice.startswith("random:"):
        return random_bundle(choice.split(":", 1)[1])
    return load_bundle(choice or None)


def load_every_choice(store: models.Models, say: Callable[[str], None]) -> None:
    """Every model of the selector, loaded now: on ZeroGPU the weights must be in place before the first request
    (the worker is a fork of this process, and ZeroGPU moves the weights placed at start-up), not loaded in a
    request. A model that cannot load is left out with one log line, as a visitor's choice of it would say."""
    for choice in store.choices():
        if choice.source is not None:
            say(f"loading {choice.key}")
            try:
                store.get(choice.key)
            except ValueError as error:
                say(f"left out: {error}")


def start(say: Callable[[str], None] = lambda message: None) -> Runtime:
    """The app's state, made on the first call (later calls return it): torch's threads set, the default model
    loaded with its device's fastest steps and warmed up, and the first images made. ``say`` reports each step."""
    global RUNTIME
    if RUNTIME is not None:
        return RUNTIME
    threads = set_threads()
    say(f"loading the model ({threads} torch thread{'s' * (threads > 1)}; set COOLSD_THREADS to change)")
    device = Device.detect()
    bundle = session.fast_steps(load_model(), zero_gpu=device.zero_gpu)  # CUDA graphs on a dedicated GPU
    if device.local:  # on ZeroGPU, CUDA work may only run inside spaces.GPU functions
        say("warming up")
        session.warm_up(bundle)
    store = models.Models(bundle, lambda key: session.fast_steps(load_bundle(key), zero_gpu=device.zero_gpu))
    if device.zero_gpu:
        load_every_choice(store, say)
    RUNTIME = Runtime(bundle, store, device)
    say("making the first images")
    RUNTIME.first_images = first_images(RUNTIME)
    return RUNTIME


def first_images(state: Runtime) -> dict:
    """What the page shows before any click: both runs of the starting settings, made once at start-up (not on
    ZeroGPU, where no CUDA work may run outside a request), with a caption that says so, and the run itself
    (``result``: each browser session's last generation until its first click, so every tab has it)."""
    start = defaults(state.bundle)
    request = session.parse_controls(state.bundle, [start[name] for name in session.value_names()])
    labels = views.image_labels(request)
    if not state.device.local:
        return {"caption": "Press **Generate**.", "labels": labels}
    made = session.compare(state.bundle, request)
    caption = (f"{views.caption(state.bundle, request)} Made at start-up with the settings on the left: press "
               "**Generate** to watch it drawn, and to time it.")
    return {"method": views.enlarge(made.images["method"]), "eagle": views.enlarge(made.images["eagle"]),
            "labels": labels, "result": made, "caption": caption}
