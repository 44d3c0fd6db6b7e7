"""run_comparison end to end on the controlled FakePair (tests/abtest/fakes.py)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from musku.abtest import Progress, run_comparison
from musku.abtest.calibration import PairCalibration, PairMemory, pair_identity
from musku.abtest.rules import ConfidenceSequenceRule
from musku.domain import (
    ComparisonSpec,
    Configuration,
    Decision,
    Direction,
    Guardrail,
    StatsSettings,
)
from musku.errors import HostError, InputError, LinkDown, UnsupportedError
from tests.abtest.fakes import A, B, FakeHost, FakePair, freq_level


def make_spec(**stats_kw: Any) -> ComparisonSpec:
    base: dict[str, Any] = {"warmup_s": 10.0, "min_effect": 0.005, "sample_cap": 30_000}
    base.update(stats_kw)
    return ComparisonSpec(stats=StatsSettings(**base))


SPEC = make_spec()


def collect() -> tuple[list[dict[str, Any]], Any]:
    rows: list[dict[str, Any]] = []
    return rows, rows.extend


# ----------------------------------------------------------------- decisions


@pytest.mark.parametrize(
    ("effect", "decision"),
    [(0.03, Decision.BETTER), (-0.03, Decision.WORSE), (0.0, Decision.NO_DIFFERENCE)],
)
def test_three_stop_reasons(effect: float, decision: Decision) -> None:
    pair = FakePair(freq_level(effect), seed=1)
    r = run_comparison(pair, A, B, SPEC, seed=1)
    assert r.decision is decision
    assert r.ci_low <= effect <= r.ci_high
    assert r.estimate == pytest.approx(effect, abs=0.006)
    assert r.samples > 0 and f"{r.samples:,} samples" in r.reason
    if decision is Decision.NO_DIFFERENCE:
        # decided on the two one-sided bounds (each at alpha), inside +-min_effect; the
        # reported two-sided interval is a little wider
        lo, hi = (
            float(x) for x in re.findall(r"bounds \[([-+.\d]+) %, ([-+.\d]+) %\]", r.reason)[0]
        )
        assert -0.5 < lo < hi < 0.5
        assert r.ci_low * 100 < lo and hi < r.ci_high * 100
        assert "(two one-sided tests) lie inside ±0.50 %" in r.reason
    else:
        assert "excludes 0" in r.reason
        assert (r.ci_low > 0) == (decision is Decision.BETTER)
    assert r.method.startswith("cs:")
    assert r.baseline == A and r.candidate == B


def test_crossover_cancels_host_bias_that_fools_a_naive_paired_test() -> None:
    """Host 1 is 2 % faster than host 0 on the same configuration. Paired without crossover,
    the bias reads as a 2 % effect; with crossover it cancels. (The pair's bias bound must cover
    the 2 %, else there is no early path: see the next test.)"""
    crossed = run_comparison(FakePair(seed=2, bias=0.02), A, A, SPEC, seed=2)
    naive = run_comparison(FakePair(seed=2, bias=0.02), A, A, SPEC, seed=2, rule="naive-paired")
    assert naive.decision is Decision.BETTER
    assert naive.estimate == pytest.approx(0.02, abs=0.004)
    assert crossed.decision is Decision.NO_DIFFERENCE
    assert abs(crossed.estimate) < 0.003
    # and it is measured, not just removed
    m = re.search(r"bias ([+-][0-9.]+) %", crossed.reason)
    assert m and float(m.group(1)) == pytest.approx(2.0, abs=0.2)


def calibrated(pair: FakePair, bound: float, **kw: Any) -> PairMemory:
    """A PairMemory holding a fresh calibration of ``pair`` with |bias| <= ``bound``."""
    key, hw = pair_identity(pair.describe())
    cal = PairCalibration(key, hw, "mips", 0.0, -bound, bound, 2000, datetime.now(UTC), **kw)
    return PairMemory(calibration=cal, hardware=hw)


def test_no_early_decision_without_a_calibration() -> None:
    """Issue 19: the early path used to trust an unchecked 1 % bound and read a 2 % host bias
    as an effect. Without a calibration there is no early decision; the crossover removes
    the bias, and its estimate beyond the default bound marks the pair for recalibration."""
    breaches: list[str] = []
    memory = PairMemory(on_breach=breaches.append)
    r = run_comparison(FakePair(seed=2, bias=0.02), A, A, SPEC, seed=2, memory=memory)
    assert r.decision is Decision.NO_DIFFERENCE
    assert "before crossover" not in r.reason
    assert "no early path" in r.method
    assert len(breaches) == 1 and "recalibration" in breaches[0]
    assert "marked for recalibration" in r.reason
    # a calibration that covers the 2 %: no breach
    pair = FakePair(seed=2, bias=0.02)
    mem = calibrated(pair, 0.03)
    mem.on_breach = breaches.append
    declared = run_comparison(pair, A, A, SPEC, seed=2, memory=mem)
    assert declared.decision is Decision.NO_DIFFERENCE
    assert len(breaches) == 1


@pytest.mark.parametrize("why", ["old", "hardware", "flagged"])
def test_unusable_calibration_is_warned_and_turns_the_early_path_off(why: str) -> None:
    pair = FakePair(freq_level(0.1), seed=20)
    mem = calibrated(pair, 0.01)
    assert mem.calibration is not None
    if why == "old":
        mem.max_age_s = 3600.0
        mem.now = datetime.now(UTC) + timedelta(hours=2)
    elif why == "hardware":
        mem.hardware = '{"platform": "other"}'
    else:
        mem.calibration = replace(mem.calibration, needs_recalibration=True, note="breach")
    r = run_comparison(pair, A, B, SPEC, seed=20, memory=mem)
    assert r.decision is Decision.BETTER
    assert "before crossover" not in r.reason
    assert "early decisions off" in r.reason
    assert {"old": "h old", "hardware": "other hardware", "flagged": "recalibration"}[why] in (
        r.reason
    )


def test_crossover_holds_up_against_a_bias_drifting_with_the_slow_load() -> None:
    """Host 1 responds 10 % more to a +-30 % hourly load swing: a host bias drifting by a few
    percent over the hour. The alternating periods average it out; without them it reads as
    an effect whose sign depends on where the load happened to be."""
    crossed: Counter[Decision] = Counter()
    naive: Counter[Decision] = Counter()
    for s in range(10):
        kw: dict[str, Any] = {
            "seed": s,
            "bias": 0.0,
            "load_sensitivity": 0.1,
            "load_amp": 0.3,
            "load_period_s": 3600.0,
            "sigma": 0.01,
        }
        r = run_comparison(FakePair(**kw), A, A, SPEC, seed=s)
        assert abs(r.estimate) < 0.002 and r.ci_low <= 0 <= r.ci_high
        crossed[r.decision] += 1
        naive[run_comparison(FakePair(**kw), A, A, SPEC, seed=s, rule="naive-paired").decision] += 1
    assert crossed[Decision.NO_DIFFERENCE] == 10
    assert naive[Decision.BETTER] + naive[Decision.WORSE] >= 7


def test_false_positive_rate_small_sample_with_bias() -> None:
    """A few dozen continuously monitored A/A comparisons with a 0.3 % host bias: musku almost
    never declares a difference; the no-crossover paired test does most of the time."""
    n = 30
    spec = make_spec(min_effect=0.004)
    musku = Counter(
        run_comparison(FakePair(seed=s, bias=0.003, sigma=0.004), A, A, spec, seed=s).decision
        for s in range(n)
    )
    naive = Counter(
        run_comparison(
            FakePair(seed=s, bias=0.003, sigma=0.004), A, A, spec, seed=s, rule="naive-paired"
        ).decision
        for s in range(n)
    )
    assert musku[Decision.BETTER] + musku[Decision.WORSE] <= 3
    assert naive[Decision.BETTER] >= n // 2


def test_sample_cap_gives_inconclusive() -> None:
    spec = make_spec(sample_cap=200)
    pair = FakePair(freq_level(0.004), seed=3, sigma=0.03)
    r = run_comparison(pair, A, B, spec, seed=3)
    assert r.decision is Decision.INCONCLUSIVE
    # the cap counts every steady window measured; a transient seen at a later swap may
    # drop some of them after the fact (musku.abtest.structure: short probes at this cap)
    assert 150 <= r.samples <= 200
    assert "no significant difference" in r.reason and "sample cap" in r.reason
    assert r.ci_low < 0 < r.ci_high


def test_lower_is_better_metric() -> None:
    """p99 5 % lower on the candidate is 'better'; the effect follows the 1 - B/A convention."""
    spec = replace(SPEC, metric="p99_ms", direction=Direction.LOWER)
    pair = FakePair(seed=4, p99_level=lambda c: 0.95 if c == B else 1.0)
    r = run_comparison(pair, A, B, spec, seed=4)
    assert r.decision is Decision.BETTER
    assert r.ci_low <= 0.05 <= r.ci_high
    worse = run_comparison(
        FakePair(seed=4, p99_level=lambda c: 1.05 if c == B else 1.0), A, B, spec, seed=4
    )
    assert worse.decision is Decision.WORSE
    assert worse.ci_low <= 1 - 1.05 <= worse.ci_high


# ----------------------------------------------------------------- guardrails


def test_guardrail_prunes_candidate_early() -> None:
    spec = replace(SPEC, guardrails=(Guardrail("p99_ms", "<=", 12.0),))
    # candidate is 2 % faster but its p99 is 15 ms, above the 12 ms limit
    pair = FakePair(freq_level(0.02), seed=5, p99_level=lambda c: 1.5 if c == B else 1.0)
    r = run_comparison(pair, A, B, spec, seed=5)
    assert r.decision is Decision.GUARDRAIL
    assert "p99_ms <= 12" in r.reason
    assert r.guardrail_values["p99_ms"] == pytest.approx(15.0, rel=0.05)
    ok = run_comparison(FakePair(freq_level(0.02), seed=5), A, B, spec, seed=5)
    assert ok.decision is Decision.BETTER
    assert ok.guardrail_values["p99_ms"] == pytest.approx(10.0 / 1.02, rel=0.05)


def test_guardrail_lower_limit() -> None:
    spec = replace(SPEC, guardrails=(Guardrail("mips", ">=", 1100.0),))
    r = run_comparison(FakePair(freq_level(0.02), seed=6, load_amp=0.0), A, B, spec, seed=6)
    assert r.decision is Decision.GUARDRAIL
    assert r.guardrail_values["mips"] == pytest.approx(1020 * 1.0015, rel=0.02)


# ----------------------------------------------------------------- warm-up, invalid windows


def test_warmup_detection_discards_the_transient() -> None:
    """A -20 % transient with tau 40 s after each change: far longer than the 10 s minimum.
    The tester (rule option transient = "discard": each apply's transient searched for its
    end) discards it from the data and still estimates the effect correctly; the joint fit
    (the default) is tests/abtest/test_transient.py's."""
    rows, sink = collect()
    # both hosts start on A: the first apply changes only the B host, whose transient then
    # shows in the log-ratio (a swap changes both hosts alike and cancels in it)
    pair = FakePair(freq_level(0.02), seed=7, warm_amp=0.2, warm_tau_s=40.0, bias=0.0, initial=A)
    r = run_comparison(
        pair, A, B, SPEC, seed=7, on_window=sink, rule_options={"transient": "discard"}
    )
    assert r.decision is Decision.BETTER
    assert r.ci_low <= 0.02 <= r.ci_high
    first = [x for x in rows if x["period"] == 0 and x["host"] == 0]
    warm = [x for x in first if x["warmup"]]
    assert len(warm) > 10 + 20  # minimum warm-up plus a detected part
    # what was kept is steady: the first kept window is within ~3 % of the level
    t_first = min(x["t"] for x in first if not x["warmup"])
    assert 0.2 * math.exp(-(t_first - 2.0) / 40.0) < 0.06


def test_no_transient_costs_only_the_minimum_warmup() -> None:
    rows, sink = collect()
    run_comparison(FakePair(freq_level(0.02), seed=8), A, B, SPEC, seed=8, on_window=sink)
    first = [x for x in rows if x["period"] == 0 and x["host"] == 0]
    assert sum(x["warmup"] for x in first) == 10


def test_invalid_windows_are_skipped() -> None:
    bad = set(range(0, 5000, 7))  # every 7th window had a knob drift (and a wild value)
    rows, sink = collect()
    pair = FakePair(freq_level(0.02), seed=9, invalid=bad)
    r = run_comparison(pair, A, B, SPEC, seed=9, on_window=sink)
    assert r.decision is Decision.BETTER
    assert r.ci_low <= 0.02 <= r.ci_high
    invalid_rows = [x for x in rows if not x["valid"]]
    assert invalid_rows and len(invalid_rows) == 2 * len({x["seq"] for x in invalid_rows})
    used = sum(1 for x in rows if x["valid"] and not x["warmup"] and x["host"] == 0)
    assert r.samples == used


def test_hosts_that_keep_drifting_are_a_host_error() -> None:
    pair = FakePair(seed=10, invalid=range(0, 100_000, 1))
    with pytest.raises(HostError, match="drifting"):
        run_comparison(pair, A, B, SPEC, seed=10)


# ----------------------------------------------------------------- callbacks, abort


def test_on_window_rows_are_complete() -> None:
    rows, sink = collect()
    pair = FakePair(freq_level(0.01), seed=11)
    r = run_comparison(pair, A, B, SPEC, seed=11, on_window=sink)
    keys = {"seq", "t", "host", "role", "period", "warmup", "valid", "metrics"}
    assert all(set(x) == keys for x in rows)
    seqs = [x["seq"] for x in rows]
    assert seqs == sorted(seqs) and seqs[0] == 0
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for x in rows:
        by_seq.setdefault(x["seq"], []).append(x)
    assert set(by_seq) == set(range(len(by_seq)))  # every window, once
    for pair_rows in by_seq.values():
        assert sorted(x["host"] for x in pair_rows) == [0, 1]
        assert sorted(x["role"] for x in pair_rows) == ["A", "B"]
        assert pair_rows[0]["t"] == pair_rows[1]["t"]
        assert "mips" in pair_rows[0]["metrics"]
    periods = sorted({x["period"] for x in rows})
    assert periods == list(range(len(periods))) and len(periods) >= 2
    # crossover: roles swap every period
    for p in periods:
        roles = {x["role"] for x in rows if x["period"] == p and x["host"] == 0}
        assert len(roles) == 1
    role0 = [next(x["role"] for x in rows if x["period"] == p and x["host"] == 0) for p in periods]
    assert all(a != b for a, b in zip(role0, role0[1:], strict=False))
    steady = sum(1 for x in rows if x["host"] == 0 and x["valid"] and not x["warmup"])
    assert steady == r.samples
    # every period starts with warm-up windows
    for p in periods:
        first = min((x for x in rows if x["period"] == p), key=lambda x: x["seq"])
        assert first["warmup"]


def test_on_progress_reports_each_look() -> None:
    seen: list[Progress] = []
    pair = FakePair(freq_level(0.01), seed=12)
    r = run_comparison(pair, A, B, SPEC, seed=12, on_progress=seen.append)
    assert len(seen) >= 3
    assert [p.samples for p in seen] == sorted(p.samples for p in seen)
    assert seen[-1].decision is r.decision and all(p.decision is None for p in seen[:-1])
    assert seen[-1].host_time_s == pytest.approx(r.host_time_s)
    assert seen[-1].batch_size > 0 and seen[-1].batches * seen[-1].batch_size <= r.samples


def test_should_stop_aborts_with_what_was_measured() -> None:
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 6

    pair = FakePair(freq_level(0.0), seed=13, sigma=0.03)
    r = run_comparison(pair, A, B, SPEC, seed=13, should_stop=stop)
    assert r.decision is Decision.ABORTED
    assert not r.decision.final
    assert "stopped on request" in r.reason
    assert r.host_time_s == pytest.approx(pair.now())
    immediate = run_comparison(FakePair(seed=13), A, B, SPEC, should_stop=lambda: True)
    assert immediate.decision is Decision.ABORTED
    assert immediate.samples == 0 and immediate.estimate == 0.0
    assert immediate.ci_low == -math.inf and immediate.ci_high == math.inf


@pytest.mark.parametrize("after", [1, 2, 3, 5, 8, 13, 40])
def test_abort_keeps_every_measured_window(after: int) -> None:
    """Wherever the stop lands (minimum warm-up, probe, batches), every window the hosts
    measured reaches on_window."""
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > after

    rows, sink = collect()
    # a slow transient makes the probe extend, so stops land inside it too
    pair = FakePair(freq_level(0.0), seed=20, warm_amp=0.3, warm_tau_s=200.0, initial=A)
    spec = make_spec(warmup_s=200.0, sample_interval_s=2.0)
    r = run_comparison(pair, A, B, spec, seed=20, should_stop=stop, on_window=sink)
    assert r.decision is Decision.ABORTED
    assert len(rows) == 2 * pair.count
    assert r.samples == sum(1 for x in rows if x["host"] == 0 and x["valid"] and not x["warmup"])


def test_host_time_includes_reboots_and_periods_grow_with_swap_cost() -> None:
    def periods(reboot_s: float) -> tuple[float, int]:
        rows, sink = collect()
        pair = FakePair(
            freq_level(0.0),
            seed=14,
            sigma=0.02,
            reboot_s=reboot_s,
            reboot_knobs={"core_freq"},
        )
        spec = replace(make_spec(sample_cap=4000), reboot_knobs=frozenset({"core_freq"}))
        r = run_comparison(pair, A, B, spec, seed=14, on_window=sink)
        assert r.host_time_s == pytest.approx(pair.now())
        steady_p1 = sum(1 for x in rows if x["period"] == 1 and x["host"] == 0)
        return r.host_time_s, steady_p1

    t_fast, len_fast = periods(0.0)
    t_slow, len_slow = periods(300.0)
    assert len_slow > 2 * len_fast
    assert t_slow > t_fast


def test_threading_reported_per_role() -> None:
    pair = FakePair(freq_level(0.02), seed=15, threading_models=("inline", "dispatch"))
    r = run_comparison(pair, A, B, SPEC, seed=15)
    assert set(r.threading) == {"A", "B"}
    assert sorted(r.threading.values()) == ["dispatch", "inline"]


def test_seed_controls_role_order_and_reproducibility() -> None:
    runs = [run_comparison(FakePair(freq_level(0.01), seed=16), A, B, SPEC, seed=s) for s in (1, 1)]
    assert runs[0] == runs[1]
    orders = set()
    for s in range(8):
        pair = FakePair(seed=16)
        run_comparison(pair, A, B, make_spec(sample_cap=100), seed=s)
        orders.add(pair.applied[0])
    assert orders == {(A, B), (B, A)}


def test_paper_welch_rule_has_no_crossover() -> None:
    rows, sink = collect()
    r = run_comparison(
        FakePair(freq_level(0.03), seed=17), A, B, SPEC, rule="welch", on_window=sink
    )
    assert r.decision is Decision.BETTER
    assert r.method.startswith("welch:")
    assert {x["role"] for x in rows if x["host"] == 0} == {"A"}
    assert {x["period"] for x in rows} == {0}


def test_rule_object_and_options() -> None:
    rule = ConfidenceSequenceRule(seed=3, min_batches=20)
    r = run_comparison(FakePair(freq_level(0.03), seed=18), A, B, SPEC, rule=rule)
    assert r.decision is Decision.BETTER
    r2 = run_comparison(
        FakePair(freq_level(0.03), seed=18), A, B, SPEC, rule="cs", rule_options={"min_batches": 20}
    )
    assert r2.decision is Decision.BETTER


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (make_spec(confidence=1.5), "confidence"),
        (make_spec(confidence=float("nan")), "confidence"),
        (make_spec(min_effect=0.0), "min_effect"),
        (make_spec(warmup_s=-1.0), "warmup_s"),
        (make_spec(sample_interval_s=0.0), "sample_interval_s"),
        (make_spec(sample_cap=5), "sample_cap"),
        (make_spec(sample_cap=True), "sample_cap"),
        (replace(SPEC, metric=""), "metric"),
        (replace(SPEC, direction="up"), "direction"),  # type: ignore[arg-type]
        (replace(SPEC, guardrails=(Guardrail("p99_ms", "<", 1.0),)), "guardrail"),
        (replace(SPEC, guardrails=(Guardrail("p99_ms", "<=", math.inf),)), "guardrail"),
    ],
)
def test_bad_spec_is_one_line_input_error(spec: ComparisonSpec, match: str) -> None:
    pair = FakePair(seed=0)
    with pytest.raises(InputError, match=match) as info:
        run_comparison(pair, A, B, spec)
    assert "\n" not in str(info.value)
    assert pair.applied == []  # rejected before touching the hosts


def test_unknown_metric_and_rule_are_input_errors() -> None:
    with pytest.raises(InputError, match="do not report metric 'qps'"):
        run_comparison(FakePair(seed=0), A, B, replace(SPEC, metric="qps"))
    with pytest.raises(InputError, match="do not report metric 'power_w'"):
        spec = replace(SPEC, guardrails=(Guardrail("power_w", "<=", 100.0),))
        run_comparison(FakePair(seed=0), A, B, spec)
    with pytest.raises(InputError, match="unknown decision rule 'bayes'"):
        run_comparison(FakePair(seed=0), A, B, SPEC, rule="bayes")
    with pytest.raises(InputError, match="not a DecisionRule"):
        run_comparison(FakePair(seed=0), A, B, SPEC, rule="musku.domain:Configuration")
    with pytest.raises(InputError, match="unexpected keyword"):
        run_comparison(FakePair(seed=0), A, B, SPEC, rule_options={"nope": 1})


def test_configuration_is_not_mutated() -> None:
    a, b = Configuration.of(core_freq=2.0), Configuration.of(core_freq=2.2)
    r = run_comparison(FakePair(freq_level(0.02), seed=19), a, b, SPEC)
    assert r.baseline == Configuration.of(core_freq=2.0)
    assert r.candidate == Configuration.of(core_freq=2.2)


# ----------------------------------------------------------------- early decision, no-op swaps


class BoundedPair(FakePair):
    """A FakePair that states its own host-bias bound in describe()."""

    def __init__(self, *args: Any, max_host_bias: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.max_host_bias = max_host_bias

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_host_bias": self.max_host_bias}


@pytest.mark.parametrize(("effect", "decision"), [(0.1, Decision.BETTER), (-0.1, Decision.WORSE)])
def test_large_effect_decides_before_the_first_swap(effect: float, decision: Decision) -> None:
    rows, sink = collect()
    pair = FakePair(freq_level(effect), seed=20)
    r = run_comparison(pair, A, B, SPEC, seed=20, on_window=sink, memory=calibrated(pair, 0.01))
    assert r.decision is decision
    assert r.reason.startswith("decided before crossover: interval [")
    assert "even allowing ±1.00 % host bias" in r.reason
    assert {x["period"] for x in rows} == {0}  # no swap: one apply, one warm-up
    assert len(pair.applied) == 1
    # the reported interval is widened by the bias bound on both sides
    assert r.ci_high - r.ci_low > 0.02
    assert r.ci_low <= effect <= r.ci_high


def test_host_bias_bound_from_the_pair_and_from_rule_options() -> None:
    # the pair says its hosts may differ by 20 %: a 10 % effect needs the crossover (the
    # larger of the calibrated and the stated bound is used)
    rows, sink = collect()
    pair = BoundedPair(freq_level(0.1), seed=21, max_host_bias=0.2)
    r = run_comparison(pair, A, B, SPEC, seed=21, on_window=sink, memory=calibrated(pair, 0.01))
    assert r.decision is Decision.BETTER
    assert "before crossover" not in r.reason
    assert {x["period"] for x in rows} >= {0, 1}
    # explicit rule options replace the pair's statement
    pair = BoundedPair(freq_level(0.1), seed=21, max_host_bias=0.2)
    r = run_comparison(
        pair,
        A,
        B,
        SPEC,
        seed=21,
        rule_options={"max_host_bias": 0.02},
        memory=calibrated(pair, 0.01),
    )
    assert "even allowing ±2.00 % host bias" in r.reason
    with pytest.raises(InputError, match="max_host_bias"):
        p = BoundedPair(seed=21, max_host_bias=0.7)
        run_comparison(p, A, B, SPEC, seed=21, memory=calibrated(p, 0.01))


def test_small_effect_still_uses_the_crossover() -> None:
    rows, sink = collect()
    r = run_comparison(FakePair(freq_level(0.01), seed=22), A, B, SPEC, seed=22, on_window=sink)
    assert r.decision is Decision.BETTER
    assert "before crossover" not in r.reason and "bias" in r.reason
    assert {x["period"] for x in rows} >= {0, 1}


def test_guardrail_prunes_before_any_swap() -> None:
    spec = replace(SPEC, guardrails=(Guardrail("p99_ms", "<=", 12.0),))
    rows, sink = collect()
    pair = FakePair(freq_level(0.0), seed=23, p99_level=lambda c: 2.0 if c == B else 1.0)
    r = run_comparison(pair, A, B, spec, seed=23, on_window=sink)
    assert r.decision is Decision.GUARDRAIL
    assert {x["period"] for x in rows} == {0}


def test_a_a_swaps_apply_nothing_and_skip_the_warmup() -> None:
    rows, sink = collect()
    pair = FakePair(seed=24)
    r = run_comparison(pair, A, A, SPEC, seed=24, on_window=sink)
    assert r.decision is Decision.NO_DIFFERENCE
    assert len(pair.applied) == 1  # only the first apply; role swaps change no host
    later = [x for x in rows if x["period"] > 0]
    assert later and not any(x["warmup"] for x in later)


class _BlindHost(FakeHost):
    """A host that cannot say what it runs: ``configuration()`` raises ``error``."""

    def __init__(self, host: FakeHost, error: Exception) -> None:
        super().__init__(host.name, host.config)
        self.error = error

    def configuration(self) -> Configuration:
        raise self.error


@pytest.mark.parametrize(
    "error", [LinkDown("agent gone"), HostError("no answer"), UnsupportedError("no readback")]
)
def test_a_host_that_cannot_say_its_configuration_is_assumed_changed(error: Exception) -> None:
    """The first apply asks each host what it runs (which host warms up); a host error from
    the Host API is informational: both hosts count as changed and the comparison runs on."""
    pair = FakePair(freq_level(0.03), seed=1)
    blind = tuple(_BlindHost(h, error) for h in pair.hosts)
    pair.hosts = (blind[0], blind[1])
    r = run_comparison(pair, A, B, SPEC, seed=1, rule_options={"transient": "fit"})
    assert r.decision is Decision.BETTER, r.reason


def test_a_bug_reading_the_configuration_is_not_swallowed() -> None:
    """Anything but a host error from ``configuration()`` is a bug: it goes up, not taken for
    a change of configuration."""
    pair = FakePair(freq_level(0.03), seed=1)
    blind = tuple(_BlindHost(h, KeyError("core_freq")) for h in pair.hosts)
    pair.hosts = (blind[0], blind[1])
    with pytest.raises(KeyError, match="core_freq"):
        run_comparison(pair, A, B, SPEC, seed=1)
