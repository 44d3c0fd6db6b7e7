"""The co-tuner against a fake mid-tier: lookup order (cache -> results DB -> train), corrupt,
stale and refused tables retrained, a failed training puts the previous threading back,
impossible pool sizes and bad specs refused before anything changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from musku.agent.cotune import AgentRequest
from musku.cotune_spec import CotuneSpec
from musku.domain import Configuration
from musku.errors import HostError, InputError
from musku.storage import open_store
from musku.tune.cotune import CoTuner, TableCache, ThreadingState, describe, table_hash
from tests.tune.fakes import FakeMidtier, FakeTrainer, same_state, spec, table_for

CFG = Configuration.of(core_count=14, thp="always")
KEY = CFG.key()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    with open_store(f"sqlite:///{tmp_path / 'results.db'}") as s:
        yield s


def tuner(
    tmp: Path, mid: FakeMidtier | None = None, trainer: FakeTrainer | None = None, **kw: Any
) -> CoTuner:
    return CoTuner(
        kw.pop("spec", spec()),
        mid or FakeMidtier(),
        trainer or FakeTrainer(),
        TableCache(tmp / "tables"),
        "skylake18",
        **kw,
    )


def test_lookup_order_cache_then_db_then_train(tmp_path: Path, store: Any) -> None:
    t = tuner(tmp_path, store=store)
    trainer = t.trainer
    assert isinstance(trainer, FakeTrainer)
    # nothing anywhere: trained, cached, stored, loaded
    r = t.cotune(CFG)
    assert (r.source, trainer.calls, r.seconds) == ("trained", 1, 100.0)
    assert r.threading.startswith(f"auto:{r.table_hash} sync-inline-block p1 w0 r0 @ 42 qps")
    assert Path(r.path).is_file() and t.endpoint.get().table == r.path
    stored = store.threading_table("setalgebra", "h1", "skylake18", KEY)
    assert stored is not None and table_hash(stored) == r.table_hash
    assert stored["config_key"] == KEY and stored["platform"] == "skylake18"
    # again: the cache; the mid-tier already runs that table, nothing is switched
    loaded = len(t.endpoint.loaded)
    r2 = t.cotune(CFG)
    assert (r2.source, trainer.calls, r2.seconds) == ("cache", 1, 0.0)
    assert len(t.endpoint.loaded) == loaded
    # cache lost (another controller's run, a wiped disk): the results DB, re-cached
    Path(r.path).unlink()
    r3 = t.cotune(CFG)
    assert (r3.source, trainer.calls, r3.table_hash) == ("db", 1, r.table_hash)
    assert Path(r3.path).is_file()
    # another configuration: its own table
    r4 = t.cotune(CFG.with_("core_count", 16))
    assert (r4.source, trainer.calls) == ("trained", 2)
    assert describe(t.endpoint) == r4.threading


def test_cache_wins_over_db_and_db_over_offered_order(tmp_path: Path, store: Any) -> None:
    mid = FakeMidtier()
    t = tuner(tmp_path, mid, store=store)
    store.save_threading_table("setalgebra", "h1", "skylake18", KEY,
                               table_for(mid, "async-inline-block"))  # fmt: skip
    t.cache.save("setalgebra", "h1", "skylake18", KEY, table_for(mid, "sync-dispatch-block"))
    assert t.cotune(CFG).state.model == "sync-dispatch-block"
    t.cache.discard("setalgebra", "h1", "skylake18", KEY)
    r = t.cotune(CFG)
    assert (r.source, r.state.model) == ("db", "async-inline-block")
    # a table offered with an agent request (the controller's DB) is used like the DB's
    t2 = tuner(tmp_path / "other", FakeMidtier("h9"))
    r = t2.cotune(CFG, offered=table_for(mid, "sync-inline-poll", host="h9"))
    assert (r.source, r.state.model, t2.trainings) == ("db", "sync-inline-poll", 0)


def test_corrupt_cached_table_is_dropped_and_retrained(tmp_path: Path, store: Any) -> None:
    t = tuner(tmp_path, store=store)
    path = t.cache.path("setalgebra", "h1", "skylake18", KEY)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "musku-threading-table/1", "rows": [')
    r = t.cotune(CFG)
    assert r.source == "trained" and t.trainings == 1
    assert any("cached table dropped" in n and "corrupt" in n for n in r.notes)
    assert json.loads(path.read_text())["rows"]  # replaced by the new table


def test_corrupt_stored_table_is_dropped_and_retrained(tmp_path: Path, store: Any) -> None:
    mid = FakeMidtier()
    bad = table_for(mid, rows=[{"max_qps": 10, "model": "nope", "pollers": 1, "workers": 0,
                                "responders": 0}])  # fmt: skip
    store.save_threading_table("setalgebra", "h1", "skylake18", KEY, bad)
    t = tuner(tmp_path, mid, store=store)
    r = t.cotune(CFG)
    assert r.source == "trained" and any("stored table dropped" in n for n in r.notes)
    # the newest table wins on lookup: the DB now answers with the good one
    assert store.threading_table("setalgebra", "h1", "skylake18", KEY)["rows"][0]["model"] != "nope"


def test_stale_table_is_retrained(tmp_path: Path, store: Any) -> None:
    """A table trained with another CPU count (the core_count knob, another machine)."""
    mid = FakeMidtier(cpus=8)
    t = tuner(tmp_path, mid, store=store)
    t.cache.save("setalgebra", "h1", "skylake18", KEY, table_for(mid, cpus=16))
    store.save_threading_table("setalgebra", "h1", "skylake18", KEY, table_for(mid, cpus=12))
    r = t.cotune(CFG)
    assert r.source == "trained" and t.trainings == 1
    assert sum("stale" in n for n in r.notes) == 2
    assert json.loads(Path(r.path).read_text())["cpus"] == 8


def test_table_of_the_other_leaf_transport_is_retrained(tmp_path: Path, store: Any) -> None:
    """Threading measured over unary leaf calls says nothing about batched streams."""
    mid = FakeMidtier(cpus=8, leaf_transport="batch")
    t = tuner(tmp_path, mid, store=store)
    t.cache.save("setalgebra", "h1", "skylake18", KEY, table_for(mid))  # no field: unary
    store.save_threading_table(
        "setalgebra", "h1", "skylake18", KEY, table_for(mid, leaf_transport="unary")
    )
    r = t.cotune(CFG)
    assert r.source == "trained" and t.trainings == 1
    assert sum("trained with leaf transport 'unary'" in n for n in r.notes) == 2
    assert json.loads(Path(r.path).read_text())["leaf_transport"] == "batch"
    assert mid.loaded == [r.path]  # the mid-tier accepted the retrained table


def test_table_refused_by_the_midtier_is_retrained(tmp_path: Path) -> None:
    mid = FakeMidtier()
    t = tuner(tmp_path, mid)
    t.cache.save("setalgebra", "h1", "skylake18", KEY, table_for(mid))
    mid.refusals = ["row sync-inline-block p1 w0 r0: beyond --max-pollers"]
    r = t.cotune(CFG)
    assert r.source == "retrained" and t.trainings == 1 and r.seconds == 100.0
    assert any("refused by the mid-tier" in n for n in r.notes)
    assert mid.state.auto_mode and mid.state.table == r.path


@pytest.mark.parametrize(
    "how",
    ["training fails", "bad table trained", "mid-tier refuses the new table"],
)
def test_failed_training_restores_the_previous_threading(tmp_path: Path, how: str) -> None:
    store_path = tmp_path / "s.db"
    mid = FakeMidtier()
    trainer = FakeTrainer()
    with open_store(f"sqlite:///{store_path}") as store:
        t = tuner(tmp_path, mid, trainer, store=store)
        old = t.cotune(CFG.with_("core_count", 18))  # the mid-tier runs an older table
        before = mid.get()
        assert before.auto_mode and before.table == old.path
        if how == "training fails":
            trainer.fail = HostError("musku_loadgen failed: connection refused")
        elif how == "bad table trained":
            trainer.corrupt = True
        else:
            mid.refusals = ["threading table x is stale"]
        with pytest.raises(HostError) as exc:
            t.cotune(CFG)
        msg = exc.value.one_line()
        assert "\n" not in msg and "h1" in msg and KEY in msg
        assert f"it runs auto:{old.table_hash} sync-inline-block" in msg and "again" in msg
        assert same_state(mid.get(), before)  # auto on the older table again
        # nothing left behind that a later lookup would trust
        assert not t.cache.path("setalgebra", "h1", "skylake18", KEY).exists()
        assert store.threading_table("setalgebra", "h1", "skylake18", KEY) is None


def test_fixed_threading_is_restored_after_a_failed_training(tmp_path: Path) -> None:
    mid = FakeMidtier(model="sync-dispatch-poll")
    trainer = FakeTrainer()
    trainer.fail = HostError("the mid-tier stopped answering")
    before = mid.get()
    with pytest.raises(HostError, match=r"runs sync-dispatch-poll p1 w2 r0 again"):
        tuner(tmp_path, mid, trainer).cotune(CFG)
    assert mid.get() == before and trainer.calls == 1


def test_impossible_pool_sizes_refused_before_anything_changes(tmp_path: Path) -> None:
    mid = FakeMidtier(maxima=(4, 4, 4))
    before = mid.get()
    trainer = FakeTrainer()
    t = tuner(tmp_path, mid, trainer, spec=spec(workers=(2, 8)))
    with pytest.raises(InputError, match=r"workers \[8\] exceed .*at most 4.*impossible"):
        t.cotune(CFG)
    assert mid.get() == before and trainer.calls == 0
    no_resp = FakeMidtier(maxima=(4, 8, 0))
    with pytest.raises(InputError, match="async models cannot run"):
        tuner(tmp_path, no_resp).cotune(CFG)


def test_unreachable_midtier_is_a_host_error(tmp_path: Path) -> None:
    mid = FakeMidtier()
    mid.unreachable = True
    trainer = FakeTrainer()
    with pytest.raises(HostError, match="cannot reach the mid-tier"):
        tuner(tmp_path, mid, trainer).cotune(CFG)
    assert trainer.calls == 0


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"service": "setalgebra", "models": ["async-dispatch-spin"]}, "unknown threading model"),
        ({"service": "setalgebra", "workers": [0]}, r"workers must be .* 1\.\.64"),
        ({"service": "setalgebra", "workers": [65]}, r"workers must be .* 1\.\.64"),
        ({"service": "setalgebra", "loads": []}, "loads must be a non-empty"),
        ({"service": "setalgebra", "loads": [5, 5]}, "twice"),
        ({"service": "setalgebra", "duration_s": 0}, "duration_s must be > 0"),
        ({"service": "setalgebra", "admin": "nohost"}, "admin must be 'host:port'"),
        ({"service": "setalgebra", "turbo": True}, "unknown key"),
        ({"models": ["sync-inline-block"]}, "needs service"),
        ([1, 2], "must be an object"),
    ],
)
def test_bad_specs_are_one_line_input_errors(data: object, match: str) -> None:
    with pytest.raises(InputError, match=match) as exc:
        CotuneSpec.from_json(data)
    assert "\n" not in exc.value.one_line()


def test_spec_round_trips_and_agent_requests_parse() -> None:
    s = spec(admin="127.0.0.1:5000")
    assert CotuneSpec.from_json(s.to_json()) == s
    req = AgentRequest(s, "skylake18", {"rows": []})
    assert AgentRequest.parse(req.to_json()) == req
    assert AgentRequest.parse(None) is None
    with pytest.raises(InputError, match="admin or admin_port_file"):
        AgentRequest.parse({"spec": spec().to_json(), "platform": "p"})
    with pytest.raises(InputError, match="unknown key"):
        AgentRequest.parse({"spec": s.to_json(), "platform": "p", "x": 1})
    # training grid size and host time
    assert s.points() == 2 * (1 + 2)
    assert s.training_s() == pytest.approx(6 * 1.4)


def test_state_describe_fits_the_db_columns() -> None:
    st = ThreadingState("async-dispatch-block", 1, 2, 1, auto_mode=True, measured_qps=950.4)
    assert st.describe("3f9a0c1e") == "auto:3f9a0c1e async-dispatch-block p1 w2 r1 @ 950 qps"
    assert ThreadingState("sync-inline-poll", 1, 0, 0).describe() == "sync-inline-poll p1 w0 r0"
    assert len(ThreadingState("x" * 200).describe()) == 100
    with pytest.raises(HostError, match="malformed threading state"):
        ThreadingState.from_json({"pollers": "many"})
