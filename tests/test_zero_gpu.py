"""ZeroGPU, offline: the stand-in ``spaces`` (tests/standin) fails where the real worker fails; the app's GPU work
crosses its fork and pickling whole (a request rebuilt on the other side, pictures and statistics back); the
platform is told by ``SPACES_ZERO_GPU`` alone; and each call asks for a duration computed from its request."""

import math
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_app import STATE, controls

from coolsd.app import models, session, views
from coolsd.app.web import budget, device, gpu, runtime

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin"


def run_with_standin(code: str, zero_gpu: bool = True) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with the stand-in ``spaces`` importable (and ZeroGPU on or off)."""
    env = {key: value for key, value in os.environ.items() if key != "SPACES_ZERO_GPU"}
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(ROOT), env.get("PYTHONPATH", "")])
    if zero_gpu:
        env["SPACES_ZERO_GPU"] = "true"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


IN_A_REQUEST = """
import os, pickle, spaces
from gradio.context import LocalContext

def in_a_request(call):
    token = LocalContext.request.set(object())  # what Gradio sets in a handler's thread
    try:
        return call()
    finally:
        LocalContext.request.reset(token)
"""


def test_the_standin_runs_each_call_in_a_forked_worker_and_streams_a_generator():
    done = run_with_standin(IN_A_REQUEST + """
@spaces.GPU(duration=lambda n: n)
def pids(n):
    for _ in range(n):
        yield os.getpid()

@spaces.GPU
def square(x):
    return x * x, os.getpid()

seen = in_a_request(lambda: list(pids(3)))
value, pid = in_a_request(lambda: square(7))
print(len(seen), len(set(seen)), os.getpid() not in seen, value, pid != os.getpid())
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1", "True", "49", "True"]


def test_the_standin_stops_a_closed_generator_in_its_worker():
    done = run_with_standin(IN_A_REQUEST + """
import time

@spaces.GPU(duration=10)
def endless(path):
    n = 0
    while True:
        n += 1
        open(path, "w").write(str(n))
        yield n
        time.sleep(0.01)

def first_two():
    steps = endless("/dev/shm/standin-steps" if os.path.isdir("/dev/shm") else "standin-steps")
    got = [next(steps), next(steps)]
    steps.close()
    return got

print(in_a_request(first_two))
path = "/dev/shm/standin-steps" if os.path.isdir("/dev/shm") else "standin-steps"
made = int(open(path).read()); time.sleep(0.3)
print(int(open(path).read()) == made)
os.remove(path)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[1, 2]", "True"]


@pytest.mark.parametrize("call, error", [
    ("square(lambda: 1)", "pickle"),  # a closure or lambda cannot cross to the worker
    ("square_outside()", "outside a Gradio request"),  # no visitor in a thread pool's thread
    ("square_asking(0)", "illegal duration"),
    ("square_asking(600)", "illegal duration"),
    ("square_failing()", "ZeroGPU worker error"),  # any other exception comes back by name, as the real one's
])
def test_the_standin_fails_where_zero_gpu_fails(call, error):
    done = run_with_standin(IN_A_REQUEST + f"""
from concurrent.futures import ThreadPoolExecutor

@spaces.GPU
def square(x):
    return x * x

def square_outside():
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(square, 3).result()

def square_asking(seconds):
    return spaces.GPU(duration=seconds)(lambda: 1)()

@spaces.GPU
def failing():
    raise KeyError("inside")

def square_failing():
    return failing()

try:
    in_a_request(lambda: {call})
except Exception as error:
    print(type(error).__name__, getattr(error, "title", ""), error)
else:
    print("no error")
""")
    assert done.returncode == 0, done.stderr
    assert error.lower() in done.stdout.lower(), done.stdout


def test_the_standin_refuses_to_load_after_coolsd_asked_for_cuda():
    """The real ``spaces`` refuses to load once CUDA is initialised; the stand-in, once coolsd's device code has
    asked torch for CUDA. app.py imports it first, before gradio and torch."""
    late = run_with_standin("from coolsd.models.bundle import pick_device\npick_device()\nimport spaces")
    assert late.returncode != 0 and "CUDA has been initialized before importing" in late.stderr
    assert run_with_standin("import spaces\nfrom coolsd.models.bundle import pick_device\npick_device()"
                            ).returncode == 0
    app = (ROOT / "app.py").read_text()
    assert app.index("import_spaces_on_zero_gpu()\n") < app.index("from coolsd")


def test_off_zero_gpu_the_standin_hands_back_the_function_itself():
    done = run_with_standin("import spaces\ndef f(): pass\nprint(spaces.GPU(f) is f, spaces.GPU(duration=5)(f) is f)",
                            zero_gpu=False)
    assert done.stdout.split() == ["True", "True"], done.stderr


@pytest.mark.parametrize("value, zero", [("true", True), ("1", True), ("T", True), ("True", True), ("", False),
                                         ("false", False), ("0", False), ("yes", False)])
def test_zero_gpu_is_told_by_its_variable_as_spaces_reads_it(value, zero):
    """``spaces`` is installed on every Space: only ``SPACES_ZERO_GPU`` says ZeroGPU, read as spaces reads it;
    app.py's early check (before coolsd can be imported) agrees with the device's."""
    assert device.Device.detect({"SPACES_ZERO_GPU": value}).zero_gpu is zero
    assert device.on_zero_gpu({"SPACES_ZERO_GPU": value}) is zero
    app = (ROOT / "app.py").read_text()
    values = "(" + ", ".join(f'"{value}"' for value in device.ZERO_GPU_VALUES) + ")"
    assert f'os.environ.get("{device.ZERO_GPU_VARIABLE}", "").strip().lower() in {values}' in app


@pytest.mark.parametrize("method", ["COOL-SD", "LANTERN++", "GSD with G*"])
def test_a_request_crosses_the_pickling_as_its_setting_and_is_rebuilt_the_same(method):
    """LANTERN++'s and GSD's rules hold the model's tensors (on the GPU on ZeroGPU): a pickled request leaves
    its rule and tree behind, and the worker rebuilds them for its model, equal to the parsed ones."""
    request = session.parse_controls(STATE.bundle, controls(method=method))
    crossed = pickle.loads(pickle.dumps(request))
    assert crossed.rule is None and crossed.tree is None and crossed == request
    again = session.rebuilt(STATE.bundle, crossed)
    assert again.rule.params() == request.rule.params() and again.tree.name == request.tree.name
    assert type(again.rule) is type(request.rule) and again.tree.size == request.tree.size


def test_the_gpu_work_yields_only_what_pickles(monkeypatch):
    """Every frame, the comparison and the timing pickle, and come back with what the page shows."""
    request = session.parse_controls(STATE.bundle, controls(seed=5))
    steps = [pickle.loads(pickle.dumps(step)) for step in gpu.comparison_frames(pickle.loads(pickle.dumps(request)))]
    result = steps[-1]
    assert isinstance(result, session.Comparison) and result.images["method"].shape[2] == 3
    assert steps[:-1] and all(isinstance(step, gpu.Frame) for step in steps[:-1])
    # a frame carries the decoder's picture, not the page's enlarged one: it crosses the pickling ten times a second
    assert all(pixels.shape == result.images["method"].shape for step in steps[:-1] for pixels in step.pixels.values())
    assert all(picture.width > pixels.shape[1] for step in steps[:-1] for picture, pixels in
               zip(step.pictures(views.grid_of(STATE.bundle)).values(), step.pixels.values()))
    timing = [pickle.loads(pickle.dumps(step)) for step in gpu.timing_steps(request, 1)][-1]
    assert set(timing.images) == set(timing.runs) == {"ar", "eagle", "method"}
    assert timing.runs["method"].tokens == result.method.tokens


def test_each_call_asks_for_a_duration_from_its_request():
    """Worker start plus twice the tokens of each rule times that rule's slowest recent rate, at most LONGEST_S.
    A rule not yet measured is sized by the model's slowest recent round (a token costs at most a round), and
    a model not yet measured by a first guess: a timing run of 5 repeats asks for more than a generation,
    Eagle-1 alone for less."""
    plan = budget.Budget()
    first = budget.WORKER_START_S + budget.MARGIN * 100 * budget.FIRST_RATE_S
    assert plan.seconds("m", {"cool": 100}) == math.ceil(first)
    plan.record("m", "cool", 1.0, 1000, 250)  # 1 ms a token, 4 ms a round
    plan.record("m", "cool", 0.5, 1000, 250)
    assert plan.rate("m", "cool") == pytest.approx(0.001) and plan.rate("other", "cool") == budget.FIRST_RATE_S
    assert plan.rate("m", "ar") == pytest.approx(0.004)  # AR, not yet measured: one round a token
    assert plan.seconds("m", {"cool": 1000}) == 7  # 5 + 2 * 1000 * 0.001
    assert plan.seconds("m", {"cool": 1000, "ar": 1000}) == 15  # 5 + 2 * (1 + 4)
    plan.record("m", "ar", 3.0, 1000, 1000)  # AR measured: 3 ms a token, its own rate from now on
    assert plan.rate("m", "ar") == pytest.approx(0.003) and plan.rate("m", "sjd") == pytest.approx(0.004)
    assert plan.seconds("m", {"cool": 10**9}) == budget.LONGEST_S
    tokens = STATE.bundle.config.image_tokens
    cool = session.parse_controls(STATE.bundle, controls())
    eagle = session.parse_controls(STATE.bundle, controls(method="Eagle-1 (lossless)"))
    assert gpu.comparison_tokens(cool) == {"cool": tokens, "eagle": tokens}
    assert gpu.comparison_tokens(eagle) == {"eagle": tokens}
    assert gpu.timing_tokens(cool, 5) == {"ar": 5 * tokens, "eagle": 5 * tokens, "cool": 5 * tokens}
    assert gpu.timing_tokens(eagle, 5) == {"ar": 5 * tokens, "eagle": 5 * tokens}
    assert gpu.batch_tokens(cool, [1, 2, 3]) == {"cool": 3 * tokens, "eagle": 3 * tokens}


def test_each_call_records_the_rate_of_each_of_its_runs(monkeypatch):
    """A generation's two runs and a timing run's three are each recorded under their own rule, with their
    tokens and rounds, so that AR's first timing (and every later one) is sized by what AR costs; a batch's
    seconds are shared by its images."""
    plan = budget.Budget()
    state = runtime.Runtime(STATE.bundle, models.Models(STATE.bundle), device.Device(zero_gpu=False), plan)
    monkeypatch.setattr(runtime, "RUNTIME", state)
    request = session.parse_controls(STATE.bundle, controls())
    result = [step for step in gpu.compare(request, live=False)][-1]
    for rule, run in (("cool", result.method), ("eagle", result.eagle)):
        seconds = run.stats.seconds["total"]
        assert list(plan.per_token["default", rule]) == [pytest.approx(seconds / len(run.tokens))]
        assert pytest.approx(seconds / run.stats.target_forwards) in plan.per_forward["default"]
    assert ("default", "ar") not in plan.per_token
    timing = list(gpu.measure(request, 2))[-1]
    ar = timing.runs["ar"]
    assert len(ar.tokens) == ar.stats.target_forwards == STATE.bundle.config.image_tokens
    assert list(plan.per_token["default", "ar"]) == [pytest.approx(sum(timing.seconds["ar"]) / (2 * len(ar.tokens)))]
    assert len(plan.per_token["default", "cool"]) == len(plan.per_token["default", "eagle"]) == 2
    batch = gpu.compare_batch(request, [1, 2, 3])
    seconds = batch[0].method.stats.seconds["total"]
    assert plan.per_token["default", "cool"][-1] == pytest.approx(seconds / (3 * len(batch[0].method.tokens)))


@pytest.mark.parametrize("zero_gpu", [True, False])
def test_a_timing_run_on_zero_gpu_keeps_the_repeats_that_fit_in_one_call(zero_gpu, monkeypatch):
    """ZeroGPU stops a call that outlasts its duration, and no call may ask more than LONGEST_S: there the timing
    run keeps as many repeats as fit (at least one), and asks for what they need; elsewhere it runs them all."""
    request = session.parse_controls(STATE.bundle, controls())
    tokens = STATE.bundle.config.image_tokens
    assert STATE.bundle.steps == "eager" and gpu.timing_tokens(request, 1) == dict.fromkeys(("ar", "eagle", "cool"),
                                                                                            tokens)  # no warm pass
    plan = budget.Budget()
    for rule, seconds in (("ar", 5.0), ("eagle", 3.0), ("cool", 2.0)):  # 10 s a repeat: n repeats need 5 + 20 n s
        plan.record(models.DEFAULT, rule, seconds, tokens, tokens)
    state = runtime.Runtime(STATE.bundle, models.Models(STATE.bundle), device.Device(zero_gpu=zero_gpu), plan)
    monkeypatch.setattr(runtime, "RUNTIME", state)
    ran = []

    def timing_steps(request, repeats):
        ran.append(repeats)
        yield session.Timing({run: [1.0] * repeats for run in ("ar", "eagle", "method")}, threads=1)

    monkeypatch.setitem(gpu.PLACED, gpu.timing_steps, timing_steps)
    timing = list(gpu.measure(request, 20))[-1]
    assert ran == [5 if zero_gpu else 20] and timing.repeats == ran[0]  # 5 + 20 * 5 = 105 <= 120 < 125
    assert plan.seconds(models.DEFAULT, gpu.timing_tokens(request, 5)) == 105
    plan.record(models.DEFAULT, "ar", 100.0, tokens, tokens)  # a repeat needs 200 s: one still runs (asks LONGEST_S)
    list(gpu.measure(request, 20))
    assert ran[-1] == (1 if zero_gpu else 20)


def test_on_zero_gpu_every_selectable_model_loads_at_start_up():
    """ZeroGPU moves the weights placed before the first request: every model of the selector loads at start-up
    (a preset only where presets are on), one that cannot is left out with one line."""
    class Store(models.Models):
        def choices(self):
            return [models.ModelChoice(models.DEFAULT, "default", None), models.ModelChoice("a", "a", "dir-a"),
                    models.ModelChoice("broken", "broken", "dir-b")]

    def loader(key: str):
        if key == "broken":
            raise OSError("no weights")
        return STATE.bundle

    store, said = Store(STATE.bundle, loader), []
    runtime.load_every_choice(store, said.append)
    assert set(store.loaded) == {models.DEFAULT, "a"}
    assert said == ["loading a", "loading broken", "left out: could not load model broken: no weights"]


def test_frames_that_arrive_while_the_page_is_busy_are_merged_and_the_rest_passes_in_order():
    """A worker sends frames whether or not the page has shown the last: read ahead in the caller's context,
    the ones that pile up become one (each run's newest picture), anything else passes as it came, and a
    failure reaches the caller."""
    import contextvars
    import time

    visitor = contextvars.ContextVar("visitor", default=None)
    seen_visitors = []

    def steps(fail: bool = False):
        seen_visitors.append(visitor.get())
        for n in range(20):
            yield gpu.Frame({"method" if n % 2 else "eagle": n}, {"method": (n, n)}, {"method": None})
            time.sleep(0.005)
        if fail:
            raise KeyError("in the worker")
        yield "the comparison"

    visitor.set("page")
    got = []
    for step in gpu.newest_frames(steps()):
        got.append(step)
        time.sleep(0.03)  # the page is slower than the worker
    assert seen_visitors == ["page"] and got[-1] == "the comparison" and 2 <= len(got) < 15, got
    last = got[-2]  # the newest of each run arrives, whichever frames were merged on the way
    assert last.pixels["method"] == 19 and last.made == {"method": (19, 19)}
    assert max(frame.pixels.get("eagle", -1) for frame in got[:-1]) == 18
    with pytest.raises(KeyError, match="in the worker"):
        list(gpu.newest_frames(steps(fail=True)))
