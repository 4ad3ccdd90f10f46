"""The explorer's session logic, independent of Gradio: request validation, the side-by-side runs (chosen
method and lossless Eagle-1, cached), and their timing in interleaved repeats. What is shown of them lives in
:mod:`coolsd.app.views`."""

from __future__ import annotations

import itertools
import os
import statistics
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace

import numpy as np

import torch

from ..core.decode import Generation, Watch, generate, generate_batch
from ..core.params import PROMPT_CHARS as PROMPT_CHARS  # the prompt box's limit (the page's and the API's)
from ..core.params import Choice, Param, check, check_prompt, number, shorten
from ..core.rules import AR, RULES, AcceptanceRule, Eagle, build_rule, param, resolve_mu
from ..core.sampling import SamplingConfig
from ..core.stats import speedup_over_ar
from ..core.trees import TREES, DraftTree, chain, parse_draft, usable_depth
from ..core.trees import default_draft as model_default_draft
from ..models.bundle import DRAFTER_NAMES, Bundle, device_name
from ..models.steps import default_mode

# Chains and trees of the draft model, then Jacobi windows, which the target drafts for itself (no draft model):
# refreshed independently (SJD), by maximal coupling (SCD) or by Gumbel coupling.
JACOBI_DRAFTS = ["jacobi:8", "jacobi:8:coupled", "jacobi:16", "jacobi:16:coupled", "jacobi:16:gumbel",
                 "jacobi:32:coupled"]
DRAFTS = [f"chain:{n}" for n in range(1, 9)] + [f"tree:{name}" for name in TREES] + JACOBI_DRAFTS
# after the method's values (the drafter: which of the model's drafters a chain or tree drafts with)
COMMON = ("draft", "drafter", "class_name", "seed", "cfg_scale", "temperature", "top_k", "top_p")
DEFAULT_DRAFTER = "eagle1"  # the API's documented drafter, and the page's first choice where the model has it
CONDITION = ("model", "prompt")  # last: the chosen model (a key of coolsd.app.models) and a text model's prompt


def timing_repeats(environ: Mapping[str, str] = os.environ) -> int:
    """The interleaved repeats behind the page's timing table: ``COOLSD_TIMING_REPEATS`` (1 to 20), else 5.
    Fewer keep a slow or shared machine responsive; more narrow the ranges."""
    text = environ.get("COOLSD_TIMING_REPEATS", "").strip()
    return 5 if not text else int(number("COOLSD_TIMING_REPEATS", text, 1, 20, integer=True))


TIMING_REPEATS = timing_repeats()


def choice(name: str, value, options) -> str:
    """``value`` if it is one of ``options`` (strings), else a readable ValueError (the value shortened)."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of: {', '.join(options)}; got {shorten(value)}")
    return value


def flag(name: str, value) -> bool:
    """A checkbox value: True/False (or the strings "true"/"false"/"auto" an API client may send)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "auto"):
        return value.strip().lower() != "false"
    raise ValueError(f"{name} must be true or false, got {shorten(value)}")


# The app's methods and their controls, read from the rule registry at call time ---------------------------
def method_entries() -> dict[str, tuple[str, dict]]:
    """The app's method entries, read now so that a method registered later is listed: UI label -> (rule
    name, the parameters that entry fixes)."""
    return {label: (spec.name, fixed) for spec in RULES.values() for label, fixed in spec.entries().items()}


@dataclass(frozen=True)
class MethodControl:
    """One method parameter the app shows: its schema (the first registered method's, for a shared name) and
    the method entries (UI labels) that take it without fixing it."""

    schema: Param | Choice
    labels: frozenset[str]

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def words(self) -> dict[str, str]:
        """The checkbox of each word the parameter also takes, by value name: ``{"mu_auto": "auto"}``."""
        return {f"{self.name}_{word}": word for word in getattr(self.schema, "words", ())}

    @property
    def value_names(self) -> tuple[str, ...]:
        """The values this control sends: a checkbox per word (``mu_auto``), then the parameter itself."""
        return (*self.words, self.name)


def method_controls() -> list[MethodControl]:
    """Every parameter of the registered methods, once per name in registry order, with the entries it
    applies to; a parameter every entry of its method fixes (LANTERN++'s residual) gets no control."""
    schemas: dict[str, Param | Choice] = {}
    labels: dict[str, set[str]] = {}
    for spec in RULES.values():
        for schema in spec.params:
            takers = {label for label, fixed in spec.entries().items() if schema.name not in fixed}
            if takers:
                schemas.setdefault(schema.name, schema)
                labels.setdefault(schema.name, set()).update(takers)
    return [MethodControl(schema, frozenset(labels[name])) for name, schema in schemas.items()]


def value_names(controls: list[MethodControl] | None = None) -> list[str]:
    """The names of the app's control values, in the order its callbacks take them: the method, each method
    control's values, then the draft, class, seed and sampling settings, then the model and prompt."""
    controls = method_controls() if controls is None else controls
    return ["method", *(name for control in controls for name in control.value_names), *COMMON, *CONDITION]


def raw_params(values: dict, label: str, controls: list[MethodControl]) -> dict:
    """The raw parameters of entry ``label`` from named control values: a ticked word checkbox stands for its
    word (``mu_auto`` -> ``mu="auto"``), otherwise the slider's or radio's value."""
    params = {}
    for control in controls:
        if label not in control.labels:
            continue
        ticked = [word for name, word in control.words.items() if flag(name.replace("_", " "), values[name])]
        params[control.name] = ticked[0] if ticked else values[control.name]
    return params


def parse_controls(bundle: Bundle, values: Sequence) -> Request:
    """A :class:`Request` from the app's control values, in :func:`value_names` order; ``bundle`` is the model
    the values' ``model`` names (the caller loads it)."""
    controls = method_controls()
    names = value_names(controls)
    if len(values) != len(names):
        raise ValueError(f"expected {len(names)} control values ({', '.join(names)}), got {len(values)}")
    named = dict(zip(names, values))
    label = choice("method", named["method"], method_entries())
    return parse_request(bundle, label, raw_params(named, label, controls), **{name: named[name] for name in COMMON},
                         prompt=named["prompt"], model=named["model"])


@dataclass(frozen=True)
class Request:
    """One validated generation request."""

    label: str
    method: str
    params: tuple
    draft: str
    class_id: int | None  # None for a text model
    seed: int
    sampling: SamplingConfig
    rule: AcceptanceRule = field(compare=False)  # built once, from method and params
    tree: DraftTree = field(compare=False)
    model: str = ""  # the model's key in the app's selector ("" or "default": the shipped model)
    prompt: str = ""  # a text model's prompt ("" for a class model)
    drafter: str = ""  # the drafter a chain or tree drafts with (a key of Bundle.drafters); "" for a Jacobi window

    @property
    def param_dict(self) -> dict:
        return dict(self.params)

    def __reduce__(self):
        """A request crosses processes (ZeroGPU's worker) as its setting alone: its rule and tree, which may hold
        the model's tensors (LANTERN++'s neighbours on the GPU), are rebuilt there for its model (:func:`rebuilt`)."""
        return unpickled_request, ({**{f.name: getattr(self, f.name) for f in fields(self)}, "rule": None,
                                    "tree": None},)

    def __copy__(self) -> Request:
        return self  # immutable: a copy (gr.State deep-copies its values) is the request itself, rule and all

    def __deepcopy__(self, memo) -> Request:
        return self


def unpickled_request(values: dict) -> Request:
    return Request(**values)


def rebuilt(bundle: Bundle, request: Request) -> Request:
    """``request`` with its rule and draft tree, built for ``bundle`` as :func:`parse_request` builds them, when it
    crossed a process without them (:meth:`Request.__reduce__`); its drafter crossed with it, a name, which
    :func:`drafting` applies where the runs are made."""
    if request.rule is not None and request.tree is not None:
        return request
    tree = model_draft(bundle, request.draft)
    return replace(request, rule=build_rule(request.method, request.param_dict, tree.depth, bundle), tree=tree)


def method_params(name: str, fixed: dict, raw: Mapping) -> dict:
    """Method ``name``'s parameters: those its entry fixes, the others checked against its schema (an absent
    one takes its default); values meant for other methods are ignored."""
    params = dict(fixed)
    for schema in RULES[name].params:
        if schema.name not in fixed:
            params[schema.name] = schema.check(raw.get(schema.name, schema.default))
    return params


def same_value(value, default) -> bool:
    """Whether an API value is its parameter's default (``2`` is ``2.0``, ``"AUTO"`` is ``"auto"``)."""
    if isinstance(value, str) or isinstance(default, str):
        return isinstance(value, str) and isinstance(default, str) and value.strip().lower() == default.lower()
    try:
        return not isinstance(value, bool) and float(value) == float(default)
    except (TypeError, ValueError, OverflowError):
        return False


def refuse_foreign(label: str, raw: Mapping) -> None:
    """A ValueError for the first value in ``raw`` (method parameters by name) that the entry ``label`` does
    not take and that differs from its default: an API client that sets ``nu`` for UniformRSD asked for
    something this method cannot do (the app's controls, which send every value, skip this)."""
    name, fixed = method_entries()[choice("method", label, method_entries())]
    takes = [schema.name for schema in RULES[name].params if schema.name not in fixed]
    for control in method_controls():
        if control.name in raw and control.name not in takes and not same_value(raw[control.name],
                                                                               control.schema.default):
            raise ValueError(f"{control.name} is not a parameter of {label} (it takes: {', '.join(takes) or 'none'}); "
                             f"got {shorten(raw[control.name])}")


def text_model(bundle: Bundle) -> bool:
    return bool(getattr(bundle.config, "text_conditioned", False))


def has_drafter(bundle: Bundle) -> bool:
    """Whether the model ships a draft model: without one, only Jacobi windows (and AR) can run."""
    return getattr(bundle, "drafter", None) is not None


def model_draft(bundle: Bundle, draft: str) -> DraftTree:
    """``draft`` parsed for ``bundle``: no deeper than its images leave room for, and a chain or tree only when
    it has a draft model (one readable line otherwise, naming a draft that works)."""
    tree = parse_draft(draft, usable_depth(bundle.config.image_tokens))
    if tree.needs_drafter and not has_drafter(bundle):
        raise ValueError(f"draft {draft} needs a draft model, and {bundle.name} has none: choose a Jacobi window, "
                         f"where the target drafts for itself (e.g. {default_draft(bundle)})")
    return tree


def drafter_key(value) -> str | None:
    """A drafter as the API or a control names it, by name or display name (``eagle3``, ``EAGLE-3``), as its
    name; None for none named (the model's own); a one-line ValueError for any other value."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        for name, shown in DRAFTER_NAMES.items():
            if value.strip().lower() in (name, shown.lower()):
                return name
    said = ", ".join(f"{name} ({shown})" for name, shown in DRAFTER_NAMES.items())
    raise ValueError(f"drafter must be one of: {said}; got {shorten(value)}")


def default_drafter(bundle: Bundle) -> str | None:
    """A model's starting drafter: Eagle-1 where it carries one, else its own (None: it has no draft model)."""
    return DEFAULT_DRAFTER if DEFAULT_DRAFTER in bundle.drafters else bundle.drafter_name


def model_drafter(bundle: Bundle, drafter, tree: DraftTree) -> str:
    """The drafter ``tree`` drafts with on ``bundle`` (none named: the model's own): its name, or "" where no
    drafter drafts (a Jacobi window). A drafter the model does not carry is one readable line, whatever the draft:
    the user asked for something this model cannot do; but the default one passes on a model without any, where
    nothing drafts (:func:`model_draft` refuses its chains and trees), as a control left at its default sends it."""
    name = drafter_key(drafter)
    if name is not None and name not in bundle.drafters and (bundle.drafters or name != DEFAULT_DRAFTER):
        have = ", ".join(f"{key} ({DRAFTER_NAMES.get(key, key)})" for key in bundle.drafters) or "none"
        raise ValueError(f"{bundle.name} has no {DRAFTER_NAMES[name]} drafter ({name}); it has: {have}")
    name = name or bundle.drafter_name
    return name if tree.needs_drafter and name is not None else ""


def drafting(bundle: Bundle, request: Request) -> Bundle:
    """The model as ``request``'s runs use it: drafting with the request's drafter (both images of a comparison
    and every timed run draft with it); the model's own where the request names none."""
    return bundle.with_drafter(request.drafter or None)


def suits(bundle: Bundle, draft: str) -> bool:
    """Whether ``draft`` runs on ``bundle`` (see :func:`model_draft`)."""
    try:
        model_draft(bundle, draft)
    except ValueError:
        return False
    return True


def default_draft(bundle: Bundle) -> str:
    """A model's starting draft (:func:`coolsd.core.trees.default_draft`)."""
    return model_default_draft(bundle.config.image_tokens, has_drafter(bundle))


def suited_draft(bundle: Bundle, draft) -> str:
    """``draft`` if it runs on ``bundle``, else the model's :func:`default_draft` (a model switch keeps the
    user's draft where it can)."""
    return draft if isinstance(draft, str) and draft in DRAFTS and suits(bundle, draft) else default_draft(bundle)


def parse_request(bundle: Bundle, method: str, params: Mapping, draft: str, class_name: str, seed, cfg_scale,
                  temperature, top_k, top_p, prompt="", model: str = "", drafter=None) -> Request:
    """Validate raw UI/API values (any type may arrive) into a :class:`Request`: ``method`` is an entry's UI
    label, ``params`` its parameters by name (ranges from the rule registry and ``coolsd.core.params``). A text
    model takes ``prompt`` and ignores ``class_name``; a class model ignores ``prompt``. ``model``: the bundle's
    key in the app's selector, kept in the request (and the cache keys). ``drafter``: one of the model's drafters,
    by name or display name (None: its own, Eagle-1 where it has it), kept where a chain or tree drafts with it."""
    entries = method_entries()
    name, fixed = entries[choice("method", method, entries)]
    choice("draft structure", draft, DRAFTS)
    if text_model(bundle):
        prompt, class_id = check_prompt(prompt), None
    else:
        prompt, class_id = "", bundle.class_names.index(choice("class", class_name, bundle.class_names))
    if not isinstance(params, Mapping):
        raise ValueError(f"method parameters must be a mapping of name to value, got {shorten(params)}")
    checked = method_params(name, fixed, params)
    sampling = SamplingConfig(cfg_scale=check("cfg_scale", cfg_scale), temperature=check("temperature", temperature),
                              top_k=check("top_k", top_k, high=bundle.config.vocab_size), top_p=check("top_p", top_p))
    tree = model_draft(bundle, draft)  # the Eagle-1 image beside the method drafts with it too, even beside AR
    drafter = model_drafter(bundle, drafter, tree)  # and with the same drafter
    rule = build_rule(name, checked, tree.depth, bundle)  # refuses e.g. a too steep linear nu
    return Request(method, name, tuple(sorted(checked.items())), draft, class_id, check("seed", seed), sampling, rule,
                   tree, model if isinstance(model, str) else "", prompt, drafter)


class ResultCache:
    """A small thread-safe LRU cache for deterministic runs (same request, same tokens)."""

    def __init__(self, size: int = 32) -> None:
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        """In a forked child (ZeroGPU's worker): the lock anew, in case another thread held it at the fork."""
        self.lock = threading.Lock()

    def get_or_run(self, key, run):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = run()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value

    def __contains__(self, key) -> bool:
        with self.lock:
            return key in self.items


EAGLE_CACHE = ResultCache()
CAPTIONS = ResultCache(64)  # encoded prompts, by model and prompt


def condition(bundle: Bundle, request: Request):
    """What ``generate`` conditions on: the class index, or the prompt encoded by the model's text encoder
    (cached per model and prompt)."""
    if request.class_id is not None:
        return request.class_id
    if bundle.text_encoder is None:
        raise ValueError(f"model {bundle.name} is text-to-image but has no text encoder")
    return CAPTIONS.get_or_run((request.model, bundle.name, request.prompt),
                               lambda: bundle.text_encoder([request.prompt])[0])


@dataclass
class Comparison:
    """The chosen method's run next to lossless Eagle-1 on the same class and seed, and (once measured) the
    latencies of both and of AR."""

    request: Request
    method: Generation
    eagle: Generation
    images: dict = field(default_factory=dict)
    timing: "Timing | None" = None
    serial: int = 0  # which request of its browser session this is (:class:`Latest`)
    eagle_reused: bool = False  # Eagle-1's run was made earlier for the same setting (:func:`eagle_reused`)


class Latest:
    """The newest generation of each browser session (the last ``sessions`` kept), so that a slower, older
    request's timing or figures, finishing after a newer request's images, are dropped instead of shown."""

    def __init__(self, sessions: int = 256) -> None:
        self.sessions, self.newest, self.lock = sessions, OrderedDict(), threading.Lock()
        self.count = itertools.count(1)

    def claim(self, session: str | None) -> int:
        """A new serial for ``session``'s newest request: every older one is stale from now on (not for None,
        a direct call)."""
        with self.lock:
            serial = next(self.count)
            if session is None:
                return serial
            self.newest[session] = serial
            self.newest.move_to_end(session)
            while len(self.newest) > self.sessions:
                self.newest.popitem(last=False)
            return serial

    def current(self, session: str | None, serial: int) -> bool:
        """Whether ``serial`` is still ``session``'s newest request (a session forgotten since, or None: yes)."""
        with self.lock:
            return self.newest.get(session, serial) == serial


POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}
POOLS_LOCK = threading.Lock()


def long_lived_threads(name: str, workers: int = 1) -> ThreadPoolExecutor:
    """A few long-lived threads named ``name`` of this process: a thread per request would give the allocator a
    new arena each time, and the server's memory would keep growing. Made anew in a forked process (ZeroGPU's
    worker), where the parent's threads do not exist and its pool would wait for them forever."""
    key = (name, os.getpid())
    with POOLS_LOCK:
        if key not in POOLS:
            POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix=name)
        return POOLS[key]


def fresh_pools_lock() -> None:
    """In a forked child: the lock anew (another of the parent's threads may have held it at the fork)."""
    global POOLS_LOCK
    POOLS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=fresh_pools_lock)


def side_by_side(bundle: Bundle) -> bool:
    """Whether the two images of a request may be generated at once: on a CPU with a core to spare (each run
    has its own caches and generators; on a GPU the steps share static caches and graphs, so they take turns)."""
    return bundle.device.type == "cpu" and (os.cpu_count() or 1) >= 2


Live = Callable[[str, Generation], None]  # a live view: ("method" or "eagle", that run's image so far)


def watch(live: Live | None, run: str) -> Watch | None:
    """The decoder's hook that hands ``run``'s image so far to ``live`` (none without a live view)."""
    return Watch(lambda images: live(run, images[0]), LIVE_INTERVAL) if live is not None else None


LIVE_INTERVAL = 0.1  # seconds: at most ten pictures a second of a run in progress


def eagle_key(bundle: Bundle, request: Request) -> tuple:
    """What Eagle-1's run depends on: the same key, the same tokens (every run has its own seeded generators).
    The drafter is the one that drafts (the model's own where the request names none): an EAGLE-3 run is never
    an Eagle-1 drafter's."""
    return (request.model, bundle.name, request.draft, request.drafter or bundle.drafter_name, request.class_id,
            request.prompt, request.seed, request.sampling)


def eagle_reused(bundle: Bundle, request: Request) -> bool:
    """Whether Eagle-1's run of this setting is already made (at start-up, or by an earlier click with another
    method): it is then shown whole at once, not decoded again."""
    return eagle_key(bundle, request) in EAGLE_CACHE


def compare(bundle: Bundle, request: Request, progress=None, live: Live | None = None) -> Comparison:
    """Run the chosen method and (cached per setting) lossless Eagle-1 for one request, at once where
    :func:`side_by_side` allows (the same tokens either way: every run has its own seeded generators); no
    timing yet (that is :func:`measure_speed`, one run at a time). ``live`` is shown each run's image so far,
    at most every :data:`LIVE_INTERVAL` seconds. Both draft with the request's drafter (:func:`drafting`)."""
    say = progress or (lambda *args, **kwargs: None)
    bundle = drafting(bundle, request)
    sampling, seed = request.sampling, request.seed
    cls = condition(bundle, request)
    key, reused = eagle_key(bundle, request), eagle_reused(bundle, request)

    def run_eagle() -> Generation:
        return generate(bundle, cls, Eagle(), request.tree, sampling, seed, capture=True, watch=watch(live, "eagle"))

    def run_method() -> Generation:
        return generate(bundle, cls, request.rule, request.tree, sampling, seed, watch=watch(live, "method"))

    if request.method == "eagle":
        say(0.1, desc=f"Generating with {request.label}")
        method = eagle = EAGLE_CACHE.get_or_run(key, run_eagle)
    elif side_by_side(bundle):
        say(0.1, desc=f"Generating with {request.label} and Eagle-1 (lossless), side by side")
        eagle_run = long_lived_threads("eagle-alongside").submit(EAGLE_CACHE.get_or_run, key, run_eagle)
        if live is not None:  # a cached run shows at once, whole
            eagle_run.add_done_callback(lambda done: done.exception() or live("eagle", done.result()))
        method = run_method()
        eagle = eagle_run.result()
    else:
        say(0.1, desc=f"Generating with {request.label}")
        method = run_method()
        say(0.6, desc="Generating with Eagle-1 (lossless)")
        eagle = EAGLE_CACHE.get_or_run(key, run_eagle)
    images = {"method": bundle.image(method.tokens), "eagle": bundle.image(eagle.tokens)}
    return Comparison(request, method, eagle, images, eagle_reused=reused)


BATCH_SEEDS = 16  # the most seeds one API call decodes together (a shared server's other visitors wait meanwhile)


def check_seeds(seeds) -> list[int]:
    """The API's list of seeds: 1 to BATCH_SEEDS seeds, each a valid seed (one-line errors otherwise)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise ValueError(f"seeds must be a list of seeds, got {shorten(seeds)}")  # noqa: TRY004
    if not 1 <= len(seeds) <= BATCH_SEEDS:
        raise ValueError(f"seeds must list 1 to {BATCH_SEEDS} seeds, got {len(seeds)}")
    return [check("seed", seed) for seed in seeds]


def compare_batch(bundle: Bundle, request: Request, seeds: list[int]) -> list[Comparison]:
    """The chosen method and lossless Eagle-1 for one request at each of ``seeds``: each method decodes all the
    seeds as one batch (spec section 9; every image gets the tokens it gets alone), with the request's drafter."""
    bundle = drafting(bundle, request)
    cls = condition(bundle, request)
    method = generate_batch(bundle, [cls] * len(seeds), request.rule, request.tree, request.sampling, seeds)
    eagle = method if request.method == "eagle" else \
        generate_batch(bundle, [cls] * len(seeds), Eagle(), request.tree, request.sampling, seeds)
    return [Comparison(replace(request, seed=seed), own, lossless,
                       {"method": bundle.image(own.tokens), "eagle": bundle.image(lossless.tokens)})
            for seed, own, lossless in zip(seeds, method, eagle)]


@dataclass
class Timing:
    """Latencies (seconds) of AR, Eagle-1 and the chosen method, from interleaved repeats in one request, so
    that every ratio compares runs made under the same machine conditions."""

    seconds: dict[str, list[float]]  # "ar" | "eagle" | "method" -> one latency per repeat
    threads: int
    device: str = "cpu"  # e.g. "cuda (NVIDIA H200)"
    dtype: str = "float32"
    steps: str = "eager"  # coolsd.models.steps.MODES
    runs: dict[str, Generation] = field(default_factory=dict, repr=False)  # each run's repeat of median latency
    images: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # their pictures (the race's lanes)

    @property
    def repeats(self) -> int:
        return len(self.seconds["ar"])

    def latency(self, run: str) -> tuple[float, float, float]:
        """Median, min and max latency of ``run``."""
        values = self.seconds[run]
        return statistics.median(values), min(values), max(values)

    def speedup(self, run: str) -> tuple[float, float, float]:
        """Median AR latency / median ``run`` latency, and the min and max of the per-repeat ratios
        (:func:`coolsd.core.stats.speedup_over_ar`, the bench's definition too)."""
        return speedup_over_ar(self.seconds["ar"], self.seconds[run])

    def to_dict(self) -> dict:
        return {"repeats": self.repeats, "threads": self.threads, "device": self.device, "dtype": self.dtype,
                "steps": self.steps, "seconds": self.seconds,
                **{f"speedup_vs_ar_{run}": self.speedup(run) for run in ("eagle", "method")}}


Progress = tuple[float, str]  # a timing run's progress: the fraction done, and what runs now


def timing_runs(bundle: Bundle, request: Request, repeats: int = TIMING_REPEATS) -> Iterator[Progress | Timing]:
    """Time AR, Eagle-1 and the chosen method ``repeats`` times each, interleaved, in rotating order (no run
    always goes first); the same class, seed and sampling as the images, so the tokens are the same too. Yields
    its progress before each run, then the :class:`Timing`, with each run's repeat of median latency and its
    picture (the race replays its rounds). A generator, so that whoever waits can stop it between two runs by
    closing it: nobody waits for those numbers any more. The drafting runs draft with the request's drafter."""
    bundle = drafting(bundle, request)
    runs = {"ar": AR(), "eagle": Eagle()}
    if request.method not in runs:
        runs["method"] = request.rule
    order = list(runs)
    cls = condition(bundle, request)
    made: dict[str, list[Generation]] = {run: [] for run in runs}
    if bundle.steps != "eager":  # CUDA graphs are captured (and compiled steps compiled) outside the timed runs
        for run in order:
            generate(bundle, cls, runs[run], request.tree, request.sampling, request.seed)
    for repeat in range(repeats):
        for k, run in enumerate(order[repeat % len(order):] + order[:repeat % len(order)]):
            yield ((repeat * len(order) + k) / (repeats * len(order)),
                   f"Timing AR, Eagle-1 and {request.label}: repeat {repeat + 1} of {repeats}")
            made[run].append(generate(bundle, cls, runs[run], request.tree, request.sampling, request.seed))
    seconds = {run: [g.stats.seconds["total"] for g in generations] for run, generations in made.items()}
    middle = {run: sorted(generations, key=lambda g: g.stats.seconds["total"])[(len(generations) - 1) // 2]
              for run, generations in made.items() if generations}
    if "method" not in seconds:  # AR or Eagle-1 chosen: it is one of the two
        seconds["method"] = seconds[request.method]
    dtype = str(bundle.dtype).removeprefix("torch.")
    yield Timing(seconds, torch.get_num_threads(), device_name(bundle.device), dtype, bundle.steps, middle,
                 {run: bundle.image(generation.tokens) for run, generation in middle.items()})


def measure_speed(bundle: Bundle, request: Request, repeats: int = TIMING_REPEATS) -> Timing:
    """:func:`timing_runs` to the end, for a caller that waits: its timing."""
    *_, timing = timing_runs(bundle, request, repeats)
    return timing


def fast_steps(bundle: Bundle, zero_gpu: bool = False) -> Bundle:
    """The bundle with its device's fastest steps (CUDA graphs on a GPU). On ZeroGPU each request runs in a
    fresh worker, so graphs captured in one would be lost: eager steps there."""
    return bundle.with_steps("eager" if zero_gpu else default_mode(bundle.device))


def warm_up(bundle: Bundle) -> None:
    """One small generation per code path, so that the first user request does not pay torch's start-up."""
    for rule in (AR(), Eagle()):
        generate(bundle, 0, rule, chain(2) if has_drafter(bundle) else parse_draft("jacobi:2"), bundle.sampling, 0)


def auto_mu(nu, draft: str, schedule: str = "exp") -> float:
    """The value ``mu="auto"`` stands for at the current ``nu``, draft depth and schedule."""
    return resolve_mu(param("nu").check(nu), "auto", parse_draft(choice("draft structure", draft, DRAFTS)).depth,
                      param("schedule").check(schedule))
