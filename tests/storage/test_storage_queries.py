"""Every example query in db/queries/*.sql runs on a populated database on every backend, and
answers what its header says on data whose answer is known."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from musku.experiment import Experiment
from musku.storage import open_store
from musku.storage.store import Store

from .conftest import BACKENDS, empty_database
from .populate import PLAN, STEPS, Populated, populate

QUERIES = Path(__file__).resolve().parents[2] / "db" / "queries"
ALL = sorted(QUERIES.glob("*.sql"))


@pytest.fixture(scope="module", params=BACKENDS)
def populated(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    experiment: Experiment,
) -> Iterator[tuple[Store, Populated]]:
    """One populated database per backend, shared by this module's (read-only) tests."""
    url = empty_database(request, tmp_path_factory.mktemp("queries"))
    with open_store(url) as store:
        yield store, populate(store, experiment, samples_per_host=60)


def _run(store: Store, path: Path, **params: Any) -> list[dict[str, Any]]:
    # comments are documentation: dropped so SQLAlchemy does not bind ":name" inside them
    sql = _strip_comments(path.read_text(encoding="utf-8"))
    wanted = set(re.findall(r"(?<![:\w]):(\w+)", sql))
    with store.engine.connect() as conn:
        result = conn.execute(text(sql), {k: v for k, v in params.items() if k in wanted})
        return [dict(r) for r in result.mappings()]


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def test_there_are_queries() -> None:
    assert len(ALL) >= 6


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_query_has_a_header_saying_what_it_answers(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("-- ") and len(lines[0]) > 10
    assert any(line.startswith("-- Answers:") for line in lines[:8])


def test_every_query_runs(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    any_cmp = next(iter(data.results))
    for path in ALL:
        rows = _run(store, path, comparison_id=any_cmp)
        assert rows, f"{path.name} returned nothing on a populated database"


def test_best_setting_per_knob(populated: tuple[Store, Populated]) -> None:
    store, _ = populated
    rows = _run(store, QUERIES / "best_setting_per_knob.sql")
    got = {(r["platform"], r["knob"]): (r["setting"], r["estimate"]) for r in rows}
    expected: dict[tuple[str, str], tuple[str, float]] = {}
    for platform, plan in PLAN.items():
        for knob, setting, decision, effect in plan:
            if decision.value == "better" and (
                (platform, knob) not in expected or effect > expected[(platform, knob)][1]
            ):
                expected[(platform, knob)] = (str(setting), effect)
    assert set(got) == set(expected)  # no "cdp:runoff" / "cdp:confirm" pseudo-knobs
    assert {k for _, k in got} <= {k for plan in PLAN.values() for k, *_ in plan}
    for key, (setting, effect) in expected.items():
        assert got[key][0] == setting
        assert got[key][1] == pytest.approx(effect)


def test_softsku_gains(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    rows = _run(store, QUERIES / "softsku_gains.sql")
    assert {r["platform"]: r["soft_sku_id"] for r in rows} == data.softskus
    # the crashed run's soft SKU is newer, but its experiment failed: not reported
    assert data.failed_softsku > data.softskus["skylake18"]
    assert data.failed_softsku not in {r["soft_sku_id"] for r in rows}
    for r in rows:
        assert r["vs_production_pct"] == pytest.approx(5.0)
        assert r["vs_stock_ci_low_pct"] == pytest.approx(6.0)
        assert r["vs_stock_decision"] == "better"


def test_inconclusive_comparisons(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    rows = _run(store, QUERIES / "inconclusive_comparisons.sql")
    expected = {cid for cid, r in data.results.items() if r.decision.value == "inconclusive"}
    assert {r["comparison_id"] for r in rows} == expected and len(expected) == 2
    assert all(r["ci_width"] == pytest.approx(0.022) for r in rows)


def test_host_time_per_experiment(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    rows = {r["experiment_id"]: r for r in _run(store, QUERIES / "host_time_per_experiment.sql")}
    for platform, exp_id in data.experiments.items():
        ids = _ids(store, exp_id)
        mine = [r for cid, r in data.results.items() if cid in ids]
        row = rows[exp_id]
        steps = sum(1 for plat, *_ in STEPS if plat == platform)
        assert row["comparisons"] == len(PLAN[platform]) + steps + 2  # + two validations
        assert row["host_hours"] == pytest.approx(sum(r.host_time_s for r in mine) / 3600)
        assert row["inconclusive"] == sum(
            1 for *_, d, _e in PLAN[platform] if d.value == "inconclusive"
        )
        assert row["status"] == "done"


def _ids(store: Store, exp_id: int) -> set[int]:
    return {c.id for c in store.comparisons(exp_id)}


def test_sample_distribution(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    cmp_id = data.comparisons[("skylake18", "cdp", "6:5")]
    rows = _run(store, QUERIES / "sample_distribution.sql", comparison_id=cmp_id)
    n = data.samples_per_host
    assert [(r["role"], r["period"]) for r in rows] == [
        (role, p) for role in "AB" for p in range((n + 19) // 20)
    ]
    assert sum(r["windows"] for r in rows) == 2 * n
    assert sum(r["warmup"] for r in rows) == 2 * 5
    # direct check of the kept-window mean against the stored samples
    kept_b = [
        s["value"]
        for s in store.samples(cmp_id)
        if s["role"] == "B" and s["period"] == 1 and s["valid"] and not s["warmup"]
    ]
    row_b1 = next(r for r in rows if r["role"] == "B" and r["period"] == 1)
    assert row_b1["kept"] == len(kept_b)
    assert row_b1["mean_value"] == pytest.approx(sum(kept_b) / len(kept_b))
    assert row_b1["variance"] > 0


def test_decisions_over_time(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    rows = _run(store, QUERIES / "decisions_over_time.sql")
    assert sum(r["comparisons"] for r in rows) == len(data.results)
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["day"]) for r in rows)


def test_raw_effect_agrees_with_planted_effects(populated: tuple[Store, Populated]) -> None:
    store, data = populated
    rows = {r["comparison_id"]: r for r in _run(store, QUERIES / "raw_effect_vs_decision.sql")}
    for cid, result in data.results.items():
        assert rows[cid]["raw_effect"] == pytest.approx(result.estimate, abs=0.01)


def test_sample_batches_stream_in_key_order(populated: tuple[Store, Populated]) -> None:
    """The exports' streaming reader (a server-side cursor on PostgreSQL): bounded batches,
    every sample of the experiment once, in primary-key order."""
    store, data = populated
    exp_id = data.experiments["skylake18"]
    ids = _ids(store, exp_id)
    batches = list(
        store.sample_batches(exp_id, columns=["comparison_id", "seq", "host"], batch_rows=97)
    )
    rows = [r for b in batches for r in b]
    assert max(len(b) for b in batches) == 97 and len(batches) > 3
    assert rows == sorted(rows) and len(set(rows)) == len(rows)
    assert {r[0] for r in rows} <= ids
    assert len(rows) == sum(len(store.samples(c)) for c in ids)
    one = next(iter(ids))
    only = [r for b in store.sample_batches(exp_id, comparison_ids=[one]) for r in b]
    assert len(only) == len(store.samples(one))
