"""The profile's CPU fit with a per-wake-up term (musku.qsim.profile.fit_cpu), the wake stages it
writes (a wake-up's cost once per batch), and the /proc readers the fit and the validation bench
take their figures from (the servers' CPU time and context switches)."""

from __future__ import annotations

import os
import threading
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from musku.hostfs import HostFS
from musku.qsim.engine import simulate
from musku.qsim.model import load, with_overrides
from musku.qsim.profile import (
    WAKE_BATCH,
    RatePoint,
    context_switches,
    fit_cpu,
    fitted_cpu_per_request_us,
    model_cpu_per_request_us,
    model_wakeups_per_visit,
    proc_cpu_s,
    write_model,
)
from tests.qsim.test_profile import _profile

# Set Algebra's run-3 figures (docs/qsim.md): switches per request fall from 9.7 (mid-tier) and
# 2.0 (a leaf) at 100 QPS to 7.8 and 1.6 at 480 and 1.6 and 0.24 in the closed loop
SWITCHES = {100.0: (9.7, 2.0), 480.0: (7.8, 1.6), 1300.0: (1.6, 0.24)}
A_MID, W_MID, A_LEAF, W_LEAF = 126.0, 24.0, 57.0, 41.0


def _points(b_mid: float = 0.0, b_leaf: float = 0.0, leaves: int = 3) -> list[RatePoint]:
    out = []
    for r, (sm, sl) in SWITCHES.items():
        cpu = (A_MID + W_MID * sm + b_mid / r,) + (A_LEAF + W_LEAF * sl + b_leaf / r,) * leaves
        out.append(RatePoint(r, cpu, (sm,) + (sl,) * leaves, deep=r == 1300.0))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.floats(0.0, 2000.0),
    w=st.floats(0.0, 200.0),
    b=st.floats(0.0, 2e5),
    floor=st.floats(0.0, 1.0),
    rates=st.lists(st.floats(10.0, 1e4), min_size=3, max_size=6, unique=True),
    switches=st.lists(st.floats(0.05, 20.0), min_size=6, max_size=6),
)
def test_fit_recovers_known_costs(
    a: float, w: float, b: float, floor: float, rates: list[float], switches: list[float]
) -> None:
    import numpy as np

    s = switches[: len(rates)]
    x = np.column_stack([np.ones(len(rates)), s, 1 / np.asarray(rates)])
    # the three terms must be told apart by the windows (not collinear, well conditioned)
    assume(np.linalg.cond(x / np.linalg.norm(x, axis=0)) < 1e3)
    c = [a + w * si + b / r for r, si in zip(rates, s, strict=True)]
    f = fit_cpu(rates, c, s, floor_us=floor * a)
    scale = max(c)
    assert f.per_request_us == pytest.approx(a, abs=1e-6 * scale)
    assert f.per_wakeup_us * max(s) == pytest.approx(w * max(s), abs=1e-6 * scale)
    assert f.per_second_us / min(rates) == pytest.approx(b / min(rates), abs=1e-6 * scale)
    for r, si, ci in zip(rates, s, c, strict=True):
        assert f.at(r, si) == pytest.approx(ci, abs=1e-6 * scale)


@given(
    a=st.floats(50.0, 500.0),
    w=st.floats(0.0, 50.0),
    noise=st.lists(st.floats(-0.3, 0.3), min_size=3, max_size=3),
)
def test_fit_never_negative_and_keeps_the_floor(a: float, w: float, noise: list[float]) -> None:
    # noisy windows (cost rising with load, as a busy machine can make it) never give a negative
    # term nor a per-request cost below the handlers' own CPU
    rates, s = [100.0, 500.0, 1500.0], [9.0, 6.0, 1.5]
    c = [(a + w * si) * (1 + n) for si, n in zip(s, noise, strict=True)]
    f = fit_cpu(rates, c, s, floor_us=40.0)
    assert f.per_request_us >= 40.0 and f.per_wakeup_us >= 0 and f.per_second_us >= 0


def test_fit_without_switches_is_the_two_rate_fit() -> None:
    # c = a + b / r through (100, 700) and (500, 500): a = 450, b = 25,000 (as before)
    f = fit_cpu([100.0, 500.0], [700.0, 500.0], [0.0, 0.0], floor_us=10.0)
    assert (f.per_request_us, f.per_wakeup_us) == (pytest.approx(450.0), 0.0)
    assert f.per_second_us == pytest.approx(25000.0)
    # the same switch count everywhere: no wake-up term to tell apart, three windows
    f = fit_cpu([100.0, 500.0, 900.0], [700.0, 500.0, 450 + 25000 / 900], [3.0] * 3)
    assert f.per_wakeup_us == 0 and f.per_request_us == pytest.approx(450.0)


def test_model_pays_a_wakeup_once_per_batch(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "sa.toml"
    p = _profile(points=_points())
    fit = write_model(p, out)
    assert fit.mid_per_switch_us == pytest.approx(W_MID) and fit.leaf_per_switch_us == (
        pytest.approx(W_LEAF)
    )
    a_total = A_MID + 3 * A_LEAF
    assert fit.fixed_cpu_share == pytest.approx(0.0, abs=1e-9)
    assert fitted_cpu_per_request_us(p, fit, 100.0) == pytest.approx(
        a_total + W_MID * 9.7 + 3 * W_LEAF * 2.0
    )
    m = tomllib.loads(out.read_text())
    for svc in m["services"]:
        if svc["name"] != "client_delay":
            wake = [s for s in svc["stages"] if s["name"] == "wake"]
            assert wake and wake[0]["batch"] == WAKE_BATCH and wake[0]["time"]["per_job_us"] == 0
    # the mid-tier's low-rate wake-up cost spread over its three queued nodes
    assert fit.mid_wake_batches == 3
    assert fit.mid_wakeup_us == pytest.approx(W_MID * 9.7 / 3)
    doc = load(out).engine
    low = simulate(with_overrides(doc, qps=100, duration_s=20))
    # at a low rate every node is a batch of one: the model's CPU per request is the fit's
    low_cpu = model_cpu_per_request_us(low)
    assert low_cpu == pytest.approx(fitted_cpu_per_request_us(p, fit, 100.0), rel=0.03)
    # under deep queues (32 users, closed loop) a wake-up serves many requests: the cost per
    # request falls toward the per-request part, as the fit's does with the switch counts
    closed = dict(doc, client={"kind": "closed", "users": 32, "think_us": 0.0, "connections": 32})
    deep = simulate(with_overrides(closed, duration_s=5))
    deep_cpu = model_cpu_per_request_us(deep)
    assert a_total < deep_cpu < 0.75 * low_cpu
    # a batch of one per visit at the low rate; far fewer wake-ups per visit in the closed loop
    assert model_wakeups_per_visit(doc, low) == pytest.approx(1.0, abs=0.02)
    assert model_wakeups_per_visit(doc, deep) < 0.6
    # and the model saturates where its CPU per request says a core does
    assert deep["throughput_qps"] == pytest.approx(1e6 / deep_cpu, rel=0.05)


def test_model_without_switch_counts_has_no_wake_stage(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "sa.toml"
    fit = write_model(_profile(), out)
    assert fit.mid_wakeup_us == 0 and fit.leaf_wakeup_us == 0
    m = tomllib.loads(out.read_text())
    assert all(s["name"] != "wake" for svc in m["services"] for s in svc["stages"])


def test_proc_readers_on_a_fake_root(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    proc = tmp_path / "proc" / "4242"
    (proc / "task").mkdir(parents=True)
    # a command name with a space and a ')' (the fields are counted after the last ')')
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", str(3 * tick), str(tick)]
    (proc / "stat").write_text("4242 (mid tier) x) " + " ".join(fields + ["0"] * 30) + "\n")
    for tid, (v, n) in {"4242": (10, 2), "4243": (100, 7)}.items():
        (proc / "task" / tid).mkdir()
        (proc / "task" / tid / "status").write_text(
            f"Name:\tx\nvoluntary_ctxt_switches:\t{v}\nnonvoluntary_ctxt_switches:\t{n}\n"
        )
    (proc / "task" / "4244").mkdir()  # a thread that ended between the listing and the read
    fs = HostFS(tmp_path, read_only=True)
    assert proc_cpu_s(fs, 4242) == pytest.approx(4.0)
    assert context_switches(fs, 4242) == 119


def test_proc_readers_on_this_process() -> None:
    fs = HostFS(read_only=True)
    c0, s0 = proc_cpu_s(fs, os.getpid()), context_switches(fs, os.getpid())
    t0 = time.process_time()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    used = time.process_time() - t0
    # the busy loop's CPU time as this process counts it (within the clock tick)
    assert proc_cpu_s(fs, os.getpid()) - c0 == pytest.approx(used, abs=0.05)
    # 50 sleeps of a thread, read while it lives (an ended thread's switches leave /proc with
    # it; the servers' pools live as long as the server): at least 50 voluntary switches
    slept, done = threading.Event(), threading.Event()

    def sleeper() -> None:
        for _ in range(50):
            time.sleep(0.001)
        slept.set()
        done.wait(60)

    th = threading.Thread(target=sleeper)
    th.start()
    try:
        assert slept.wait(60)
        assert context_switches(fs, os.getpid()) - s0 >= 50
    finally:
        done.set()
        th.join()
