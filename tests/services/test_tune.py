"""The threading auto-tuner end to end: train a (small) table, run the mid-tier on it, and
refuse corrupt or stale tables without stopping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musku.errors import InputError
from musku.services import runtime
from musku.tune import train as tr
from tests.services import servers

pytestmark = pytest.mark.services

servers.skip_unless_built(*servers.SETALGEBRA)

SMALL = {"docs": 20_000, "terms": 500, "queries": 300, "seed": 3}


def test_build_table_picks_the_best_per_load_and_merges_rows() -> None:
    a, b = tr.Candidate.of("sync-inline-block"), tr.Candidate.of("async-dispatch-block", 2)

    def pt(q: float, p99: float, errors: int = 0, achieved: float | None = None) -> dict:
        return {"qps": q, "p99_us": p99, "errors": errors, "achieved_qps": achieved or q}

    grid = {
        a.key(): {10.0: pt(10, 100), 100.0: pt(100, 150), 1000.0: pt(1000, 9000, achieved=700)},
        b.key(): {10.0: pt(10, 300), 100.0: pt(100, 200), 1000.0: pt(1000, 2000)},
    }
    t = tr.build_table("setalgebra", [10.0, 100.0, 1000.0], grid, [a, b], host="h")
    assert [r["model"] for r in t["rows"]] == ["sync-inline-block", "async-dispatch-block"]
    assert t["rows"][0]["loads"] == [10.0, 100.0]
    assert t["rows"][0]["p99_us"] == 150  # the worst of its loads
    assert t["rows"][0]["max_qps"] == pytest.approx((100 * 1000) ** 0.5)
    assert t["rows"][1]["workers"] == 2
    assert t["rows"][1]["max_qps"] >= 1e11


def test_train_then_auto_then_bad_tables(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cands = [tr.Candidate.of("sync-inline-block"), tr.Candidate.of("async-dispatch-block", 1)]
    with runtime.deploy(
        "setalgebra", workdir=tmp_path / "t", data_dir=data, data_opts=SMALL
    ) as dep:
        table, grid = tr.train(dep, [50.0, 400.0], cands, duration_s=0.6, warmup_s=0.1,
                               rounds=2, contenders=1)  # fmt: skip
    assert set(grid) == {c.key() for c in cands}
    for pts in grid.values():
        for q, p in pts.items():
            assert p["errors"] == 0 and p["p99_us"] > 0 and p["qps"] == q
    # per load, the best candidate was measured twice and is judged by its worst round
    for q in (50.0, 400.0):
        judged = [p[q] for p in grid.values() if "p99_rounds_us" in p[q]]
        assert len(judged) == 1 and len(judged[0]["p99_rounds_us"]) == 2
        assert judged[0]["p99_us"] == max(judged[0]["p99_rounds_us"])  # its worst round counts
    path = tmp_path / "table.json"
    tr.write_table(table, path)
    assert tr.validate_table(path, "setalgebra")["rows"]

    with runtime.deploy(
        "setalgebra", workdir=tmp_path / "a", data_dir=data, data_opts=SMALL, table=path
    ) as dep:
        state = runtime.admin(dep.midtier.address, "get")
        assert state["auto_mode"] is True
        assert state["table"] == str(path)
        res = runtime.run_load(dep.midtier.address, "setalgebra", dep.load_data,
                               runtime.LoadSpec(qps=300, duration_s=1, warmup_s=0.2))  # fmt: skip
        assert res["total"]["errors"] == 0
        # a corrupt table over the control RPC: refused, still auto on the old table
        bad = tmp_path / "bad.json"
        bad.write_text('{"format": "musku-threading-table/1", "rows": [')
        with pytest.raises(InputError, match="corrupt"):
            runtime.set_threading(dep.midtier.address, "auto", table=str(bad))
        assert runtime.admin(dep.midtier.address, "get")["table"] == str(path)

    # Trained over unary leaf calls: a mid-tier on batched streams refuses it at start.
    assert table["leaf_transport"] == "unary"
    with runtime.deploy(
        "setalgebra",
        workdir=tmp_path / "b",
        data_dir=data,
        data_opts=SMALL,
        table=path,
        leaf_transport="batch",
    ) as dep:
        state = runtime.admin(dep.midtier.address, "get")
        assert state["leaf_transport"] == "batch"
        assert state["auto_mode"] is False
        assert "trained with leaf transport 'unary'" in state["last_error"]

    # A stale table (other CPU count) at start: clear message, serves on the fixed model.
    stale = dict(table, cpus=(os.cpu_count() or 1) + 7)
    stale_path = tmp_path / "stale.json"
    tr.write_table(stale, stale_path)
    with pytest.raises(InputError, match="stale"):
        tr.validate_table(stale_path, "setalgebra")
    with runtime.deploy(
        "setalgebra", workdir=tmp_path / "s", data_dir=data, data_opts=SMALL, table=stale_path
    ) as dep:
        state = runtime.admin(dep.midtier.address, "get")
        assert state["auto_mode"] is False
        assert "stale" in state["last_error"]
        assert "stale" in dep.midtier.log.read_text()
        res = runtime.run_load(dep.midtier.address, "setalgebra", dep.load_data,
                               runtime.LoadSpec(qps=100, duration_s=0.5, warmup_s=0.1))  # fmt: skip
        assert res["total"]["errors"] == 0


def test_tune_cli_writes_the_file_and_the_db(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    db = f"sqlite:///{tmp_path / 'r.db'}"
    cp = subprocess.run(
        [sys.executable, "-m", "musku", "tune", "train", "setalgebra", "--loads", "50,200",
         "--models", "sync-inline-block,async-inline-block", "--duration", "0.4", "--warmup",
         "0.1", "--docs", "20000", "--terms", "500", "--queries", "300", "--data-dir",
         str(tmp_path / "d"), "--out", str(out), "--db", db, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    assert res["path"] == str(out)
    assert json.loads(out.read_text())["rows"] == res["table"]["rows"]
    from musku.storage import open_store

    with open_store(db) as store:
        saved = store.threading_table("setalgebra", res["table"]["host"], "local", "{}")
    assert saved is not None and saved["rows"] == res["table"]["rows"]


def test_train_service_is_a_library_call(tmp_path: Path) -> None:
    """The workflow behind `musku tune train`, called directly: a table file, no DB."""
    run = tr.ServiceTraining(
        "setalgebra",
        [50.0],
        tr.parse_models("sync-inline-block,async-inline-block"),
        duration_s=0.3,
        warmup_s=0.1,
        min_samples=0,
        rounds=1,
        out=tmp_path / "t.json",
        platform="lab",
        config_key='{"thp": "never"}',
        data_opts={"docs": 20_000, "terms": 500, "queries": 300},
        data_dir=tmp_path / "d",
    )
    seen: list[str] = []
    done = tr.train_service(run, store=False, progress=lambda key, q, p: seen.append(key))
    assert done.db_id is None and done.path == tmp_path / "t.json"
    assert sorted(seen) == sorted(c.key() for c in run.candidates)
    written = tr.validate_table(done.path, "setalgebra")
    assert written["platform"] == "lab" and written["config_key"] == '{"thp": "never"}'
    assert written["rows"] == done.table["rows"]


def test_tune_cli_rejects_unknown_model_and_service(tmp_path: Path) -> None:
    cases = [
        (["nosuch"], "unknown service"),
        (["setalgebra", "--models", "fast-mode"], "unknown threading model"),
    ]
    for args, msg in cases:
        cp = subprocess.run([sys.executable, "-m", "musku", "tune", "train", *args, "--no-db"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert cp.returncode == 3
        assert msg in cp.stderr


def test_build_table_keeps_the_previous_choice_within_tolerance() -> None:
    a, b = tr.Candidate.of("sync-inline-poll"), tr.Candidate.of("async-dispatch-block", 2)

    def pt(q: float, p99: float) -> dict:
        return {"qps": q, "p99_us": p99, "errors": 0, "achieved_qps": q}

    grid = {
        a.key(): {10.0: pt(10, 100), 100.0: pt(100, 103), 1000.0: pt(1000, 500)},
        b.key(): {10.0: pt(10, 200), 100.0: pt(100, 100), 1000.0: pt(1000, 300)},
    }
    t = tr.build_table("setalgebra", [10.0, 100.0, 1000.0], grid, [a, b], host="h")
    # 100 QPS: b is 3 % better, within the 5 % tolerance: a stays (one switch, not two)
    assert [r["loads"] for r in t["rows"]] == [[10.0, 100.0], [1000.0]]
    t = tr.build_table("setalgebra", [10.0, 100.0, 1000.0], grid, [a, b], host="h", tolerance=0)
    assert [r["loads"] for r in t["rows"]] == [[10.0], [100.0, 1000.0]]


def test_build_table_prefers_among_ties_the_model_that_keeps_up_with_more_load() -> None:
    """At 100 QPS a sync model is 3 % better than an async one (a tie) but collapses at 3000
    QPS, where the async one keeps up: the table takes the async one from 100 QPS on, so a
    load rising faster than auto reacts meets a model that serves it. A sync model better
    beyond the noise keeps its row."""
    s, a = tr.Candidate.of("sync-inline-poll"), tr.Candidate.of("async-dispatch-block", 2)

    def pt(q: float, p99: float, achieved: float | None = None) -> dict:
        return {"qps": q, "p99_us": p99, "errors": 0, "achieved_qps": achieved or q}

    def grid(sync_100: float) -> dict:
        return {
            s.key(): {
                10.0: pt(10, 100),
                100.0: pt(100, sync_100),
                1000.0: pt(1000, 400),
                3000.0: pt(3000, 9e5, achieved=2000),
            },  # fmt: skip
            a.key(): {
                10.0: pt(10, 300),
                100.0: pt(100, 200),
                1000.0: pt(1000, 410),
                3000.0: pt(3000, 2000),
            },  # fmt: skip
        }

    loads = [10.0, 100.0, 1000.0, 3000.0]
    t = tr.build_table("setalgebra", loads, grid(194), [s, a], host="h")
    assert [(r["model"], r["loads"]) for r in t["rows"]] == [
        ("sync-inline-poll", [10.0]),
        ("async-dispatch-block", [100.0, 1000.0, 3000.0]),
    ]
    # at 1000 QPS the sync model is 2.5 % better: also a tie, also given to the async one; the
    # row's p99 is its worst load's (3000 QPS), the async model's own
    assert t["rows"][1]["p99_us"] == 2000
    # sync clearly better at 100 QPS (120 against 200 us): it keeps 100 QPS; 1000 QPS is a tie
    # and goes to the model that also serves 3000
    t = tr.build_table("setalgebra", loads, grid(120), [s, a], host="h")
    assert [(r["model"], r["loads"]) for r in t["rows"]] == [
        ("sync-inline-poll", [10.0, 100.0]),
        ("async-dispatch-block", [1000.0, 3000.0]),
    ]
    # no tolerance, no intervals: the lowest p99 per load, as before
    t = tr.build_table("setalgebra", loads, grid(194), [s, a], host="h", tolerance=0)
    assert [r["loads"] for r in t["rows"]] == [[10.0, 100.0, 1000.0], [3000.0]]


def test_build_table_keeps_the_previous_choice_the_measurements_cannot_tell_apart() -> None:
    """Beyond the tolerance, the previous choice still stays while the two p99s' intervals
    overlap (a few hundred requests cannot rank them); it goes when they do not."""
    a, b = tr.Candidate.of("sync-inline-poll"), tr.Candidate.of("async-dispatch-block", 2)

    def pt(q: float, p99: float, ci: tuple[float, float]) -> dict:
        return {"qps": q, "p99_us": p99, "errors": 0, "achieved_qps": q, "p99_ci_us": list(ci)}

    def grid(a_100_ci: tuple[float, float]) -> dict:
        return {
            a.key(): {10.0: pt(10, 100, (90, 120)), 100.0: pt(100, 130, a_100_ci)},
            b.key(): {10.0: pt(10, 200, (180, 230)), 100.0: pt(100, 100, (85, 125))},
        }

    # 100 QPS: b's p99 is 30 % lower, but a's interval reaches down into b's: a stays
    t = tr.build_table("setalgebra", [10.0, 100.0], grid((110, 160)), [a, b], host="h")
    assert [r["model"] for r in t["rows"]] == ["sync-inline-poll"]
    # the intervals are apart: b is better beyond the noise, the table switches
    t = tr.build_table("setalgebra", [10.0, 100.0], grid((126, 160)), [a, b], host="h")
    assert [r["model"] for r in t["rows"]] == ["sync-inline-poll", "async-dispatch-block"]
