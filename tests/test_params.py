"""The one definition of parameter ranges, its messages, the linear schedule's diagnosis, and thread choice."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from coolsd.core.params import PARAMS, check, number, shorten
from coolsd.core.rules import omega_schedule
from coolsd.core.rules import param as method_param
from coolsd.models.bundle import set_threads

ROOT = Path(__file__).resolve().parent.parent


def test_every_range_is_documented_in_the_app_reference():
    page = (ROOT / "docs" / "app.md").read_text()
    for name, param in PARAMS.items():
        if name == "top_k":  # its upper end is the model's vocabulary
            assert "| `top_k` | 0 (off) to the vocabulary size |" in page
            continue
        high = f"{param.high:g}" if param.high < 1e6 else f"{int(param.high)}"
        assert re.search(rf"\| `{name}` \| {param.low:g} to {high}\b", page), name


def test_check_names_the_parameter_the_shortened_value_and_the_range():
    assert method_param("delta").check("2.5") == 2.5
    assert method_param("k").check(3.0) == 3 and isinstance(method_param("k").check(3.0), int)
    with pytest.raises(ValueError, match=r"^delta must be between 0.05 and 5, got 5.5$"):
        method_param("delta").check(5.5)
    with pytest.raises(ValueError, match="k must be a whole number"):
        method_param("k").check(2.5)
    with pytest.raises(ValueError, match="must be a finite number"):
        method_param("nu").check(float("inf"))
    for bad in (True, [1], {"a": 1}, None, ""):
        with pytest.raises(ValueError, match="delta"):
            method_param("delta").check(bad)
    with pytest.raises(ValueError) as error:
        method_param("delta").check("9" * 1_000_000)
    assert len(str(error.value)) < 120 and "(1000002 chars)" in str(error.value)
    assert len(shorten("x" * 10_000)) <= 40
    with pytest.raises(ValueError, match="top_k must be between 0 and 512"):
        check("top_k", 513, high=512)



def test_whole_range_ends_read_in_full_and_fractions_stay_short():
    """2**31 - 1 reads 2147483647 (not 2.14748e+09) wherever a range is described: errors and the help."""
    with pytest.raises(ValueError, match=r"^seed must be between 0 and 2147483647, got -1$"):
        check("seed", -1)
    with pytest.raises(ValueError, match=r"^top_k must be between 0 and 1000000, got -1$"):
        check("top_k", -1)
    with pytest.raises(ValueError, match=r"^images must be between 1 and 100000000, got 0$"):
        number("images", 0, 1, 10**8, integer=True)
    with pytest.raises(ValueError, match=r"^steps must be <= 1000000000, got 1000000001$"):
        number("steps", 10**9 + 1, high=10**9, integer=True)  # a one-sided range too
    with pytest.raises(ValueError, match=r"^max-hours must be > 0, got 0$"):
        number("max-hours", 0, above=0)
    with pytest.raises(ValueError, match=r"^delta must be between 0.05 and 5, got 6$"):
        method_param("delta").check(6)
    with pytest.raises(ValueError, match=r"^lambda must be between 1 and 10, got 0.5$"):
        method_param("lambda").check(0.5)
    from coolsd.cli.generate import build_parser
    shown = " ".join(build_parser().format_help().split())
    assert "--seed SEED 0 to 2147483647" in shown and "0.05 to 5, default 2 " in shown and "e+0" not in shown

def linear_omegas(delta: float, nu: float, mu: float, depth: int) -> list[float]:
    """The spec's linear schedule written out: omega_d = delta (1 - nu d - mu), d = 1..depth."""
    return [delta * (1 - nu * d - mu) for d in range(1, depth + 1)]


@pytest.mark.parametrize("nu, mu, depth, position, blamed, direction", [
    (-2.0, "auto", 8, 1, "nu", "raise"),   # auto mu = -nu (D+1)/2 = 9 makes omega_1 the non-positive one
    (2.0, "auto", 5, 5, "nu", "lower"),
    (0.7, "auto", 5, 5, "nu", "lower"),
    (0.0, 1.0, 5, 1, "mu", "lower"),       # nu=0 cannot be at fault: mu alone zeroes every omega
    (-0.5, 1.5, 4, 1, "mu", "lower"),
    (0.3, 0.5, 5, 5, "nu", "lower"),
])
def test_linear_schedule_error_names_position_and_cause_and_the_way_out(nu, mu, depth, position, blamed, direction):
    auto = mu == "auto"
    mu_value = -nu * (depth + 1) / 2 if auto else mu
    omegas = linear_omegas(2.0, nu, mu_value, depth)
    assert omegas[position - 1] == min(omegas) <= 0
    with pytest.raises(ValueError) as error:
        omega_schedule(2.0, nu, mu, depth, "linear")
    message = str(error.value)
    assert f"omega_{position} = " in message and f"position {position} of {depth}" in message
    assert message.startswith(f"{blamed}=")
    bound = float(re.search(rf"{direction} {blamed} (?:below|above) (-?[\d.]+)", message).group(1))
    # following the advice (just past the stated bound) gives a valid schedule; stopping short does not
    step = 1e-3 if direction == "raise" else -1e-3
    fixed = {"nu": nu, "mu": mu}
    fixed[blamed] = bound + step
    assert min(omega_schedule(2.0, fixed["nu"], fixed["mu"], depth, "linear")) > 0
    fixed[blamed] = bound - 5 * step
    with pytest.raises(ValueError):
        omega_schedule(2.0, fixed["nu"], fixed["mu"], depth, "linear")


def blas_threads() -> set[int]:
    """numpy's BLAS threads (the FID bootstrap's eigen-solves run there)."""
    np.linalg.eigvalsh(np.eye(2))  # numpy loads its BLAS on import; this makes sure it is in use
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_threads_default_to_one_and_follow_the_environment(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("COOLSD_THREADS", raising=False)
        torch.set_num_threads(2)
        threadpool_limits(limits=2, user_api="blas")
        assert set_threads() == 1 and torch.get_num_threads() == 1 and blas_threads() == {1}
        monkeypatch.setenv("COOLSD_THREADS", "2")
        assert set_threads() == 2 and torch.get_num_threads() == 2 and blas_threads() == {2}
        assert set_threads(1) == 1  # an explicit choice wins
        for bad in ("zero", "0", "-1"):
            monkeypatch.setenv("COOLSD_THREADS", bad)
            with pytest.raises(ValueError, match="COOLSD_THREADS|threads"):
                set_threads()
    finally:
        torch.set_num_threads(before)
        threadpool_limits(limits=before, user_api="blas")


def test_timing_repeats_follow_the_environment():
    from coolsd.app.session import timing_repeats
    assert timing_repeats({}) == 5 and timing_repeats({"COOLSD_TIMING_REPEATS": " 2 "}) == 2
    for bad in ("0", "21", "two", "1.5"):
        with pytest.raises(ValueError, match="COOLSD_TIMING_REPEATS"):
            timing_repeats({"COOLSD_TIMING_REPEATS": bad})
