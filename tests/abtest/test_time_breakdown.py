"""Where a comparison's host time goes (issue 31 item 5): measuring, warm-up discarded,
switching and reboots, computed by the driver on the real simulator, stored in the results DB
(revision 0009) and summed in the sweep report, ``musku results`` and its ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison
from musku.domain import ComparisonSpec, StatsSettings, TimeBreakdown
from musku.experiment import load_experiment
from musku.sim import SimModel, SimPair
from musku.storage import open_store
from musku.sweep import run_sweep
from tests.cli.test_exit_codes import musku

MODEL = Path(__file__).resolve().parents[2] / "experiments" / "sim" / "web-skylake18.toml"
REBOOT = frozenset({"core_count"})
SPEC = ComparisonSpec(
    stats=StatsSettings(warmup_s=60.0, min_effect=0.005, sample_cap=6000), reboot_knobs=REBOOT
)
CHANGES = [("cdp", "6:5"), ("thp", "never"), ("core_count", 16), ("shp", 300)]


@pytest.fixture(scope="module")
def model() -> SimModel:
    return SimModel.load(MODEL)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(change=st.sampled_from(CHANGES), seed=st.integers(0, 10_000))
def test_breakdown_adds_up_and_names_reboots(
    model: SimModel, change: tuple[str, Any], seed: int
) -> None:
    base = model.reference_config
    assert base is not None
    cand = base.with_(*change)
    pair = SimPair(model, seed=seed, initial=(base, base), reboot_knobs=REBOOT)
    r = run_comparison(pair, base, cand, SPEC, seed=seed)
    t = r.time
    assert t is not None
    assert all(x >= 0 for x in t.seconds())
    assert t.total_s == pytest.approx(r.host_time_s, abs=1e-6)
    # the simulator's windows are all valid: measuring is exactly the windows the test used
    assert t.measuring_s == pytest.approx(r.samples * SPEC.stats.sample_interval_s)
    # at least the blind minimum after each apply is discarded
    assert t.warmup_s >= SPEC.stats.warmup_s
    timing = model.timing
    if change[0] in REBOOT:
        # every apply rebooted the host that changed: a whole number of (apply + reboot)
        assert pair.reboots >= 1 and t.switching_s == 0.0
        per = timing.apply_s + timing.reboot_s
        assert t.reboot_s == pytest.approx(per * round(t.reboot_s / per))
        assert t.reboot_s >= per
    else:
        assert pair.reboots == 0 and t.reboot_s == 0.0
        assert t.switching_s >= timing.apply_s


def test_breakdown_round_trips_through_json_and_sums() -> None:
    a = TimeBreakdown(10.0, 5.0, 2.0, 120.0)
    b = TimeBreakdown.from_dict(a.as_dict())
    assert a == b
    assert (a + b).total_s == pytest.approx(2 * 137.0)
    assert TimeBreakdown.from_dict({"warmup_s": 3}) == TimeBreakdown(warmup_s=3.0)


def test_sweep_report_db_and_results_agree(toy: Any, tmp_path: Path) -> None:
    """The toy sweep: the report's totals add up to its host time; the
    stored rows give back each comparison's breakdown; ``musku results`` prints the totals
    line and ``--json`` gives them."""
    url = f"sqlite:///{tmp_path}/r.db"
    exp = load_experiment(toy("independent", name="time-toy"))
    store = open_store(url)
    rep = run_sweep(exp, store=store)
    assert rep.experiment_id is not None
    assert rep.time_missing == 0
    assert rep.time.total_s == pytest.approx(rep.host_time_s)
    # the VM catalog's core_count is live (hotplug): no reboot; every change an apply
    assert rep.time.reboot_s == 0.0 and rep.time.switching_s > 0 and rep.time.warmup_s > 0
    assert rep.to_dict()["time"]["reboot_s"] == rep.time.reboot_s
    stored = [c.result for c in store.comparisons(rep.experiment_id) if c.result is not None]
    assert {(r.candidate.key(), r.time) for r in stored} >= {
        (r.candidate.key(), r.time) for o in rep.knobs for r in o.results
    }
    store.close()

    detail = json.loads(musku("results", "time-toy", "--db", url, "--json").stdout)
    assert detail["time"]["missing"] == 0
    assert detail["time"]["total_s"] == pytest.approx(
        sum(c["result"]["host_time_s"] for c in detail["comparisons"] if c["result"])
    )
    assert detail["time"]["reboot_s"] == pytest.approx(
        sum(c["result"]["time"]["reboot_s"] for c in detail["comparisons"] if c["result"])
    )
    text = musku("results", "time-toy", "--db", url, env={"COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    want = TimeBreakdown.from_dict(detail["time"])
    assert f"host time: measuring {want.measuring_s / 3600:.2f} h" in text.stdout
    assert f"reboots {want.reboot_s / 3600:.2f} h" in text.stdout


def test_rows_from_before_0009_have_no_breakdown(toy: Any, tmp_path: Path) -> None:
    """A decision stored without the columns (an older musku's row) reads back as None and
    counts as missing in the totals, never as zero time."""
    url = f"sqlite:///{tmp_path}/r.db"
    exp = load_experiment(toy("independent", name="old-toy"))
    store = open_store(url)
    rep = run_sweep(exp, store=store)
    store.close()
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE decisions SET time_reboot_s = NULL"))
    engine.dispose()
    store = open_store(url)
    assert rep.experiment_id is not None
    results = [c.result for c in store.comparisons(rep.experiment_id) if c.result is not None]
    store.close()
    assert results and all(r.time is None for r in results)
    total, missing = TimeBreakdown.total(results)
    assert missing == len(results) and total.total_s == 0.0
    detail = json.loads(musku("results", "old-toy", "--db", url, "--json").stdout)
    assert detail["time"]["missing"] == len(detail["comparisons"])
