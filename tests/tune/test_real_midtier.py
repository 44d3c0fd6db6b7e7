"""Co-tuning a real Set Algebra mid-tier through ``musku_admin`` (:class:`AdminEndpoint`) and
``musku_loadgen`` (:class:`ServiceTrainer`): train, load, find in the cache, retrain a corrupt
table; bad tables, unknown models and impossible pools refused with the mid-tier still
serving its current threading; a failed training puts the previous threading back.

Needs the built services (services/build); skipped cleanly when they are absent."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from musku.agent.cotune import AdminEndpoint, ServiceTrainer
from musku.domain import Configuration
from musku.errors import HostError, InputError
from musku.services import runtime
from musku.tune.cotune import CoTuner, TableCache, ThreadingState, describe
from tests.services import servers
from tests.tune.fakes import spec

pytestmark = pytest.mark.services

servers.skip_unless_built(*servers.SETALGEBRA)

CFG = Configuration.of(thp="always")


@pytest.fixture(scope="module")
def midtier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A one-leaf Set Algebra on a small index: (the mid-tier's port file, the queries)."""
    d = tmp_path_factory.mktemp("sa-cotune")
    index, queries = runtime.setalgebra_data(d / "data", docs=5000, terms=300, queries=200, seed=3)
    procs = []
    try:
        port_file = servers.start_setalgebra(d, index, procs)
        yield port_file, queries
    finally:
        servers.stop_all(procs)


def test_cotune_a_real_midtier(midtier: tuple[Path, Path], tmp_path: Path) -> None:
    port_file, queries = midtier
    ep = AdminEndpoint(admin_port_file=str(port_file))
    start = ep.get()
    assert (start.model, start.workers, start.max_workers) == ("async-dispatch-block", 2, 4)
    s = spec(loads=(150.0,), workers=(1,), duration_s=0.5, warmup_s=0.1, load_data=str(queries),
             admin_port_file=str(port_file))  # fmt: skip
    tuner = CoTuner(s, ep, ServiceTrainer(), TableCache(tmp_path / "tables"), "local")

    # impossible pools for this mid-tier (--max-workers 4): refused before anything changes
    too_big = CoTuner(replace(s, workers=(8,)), ep, ServiceTrainer(), TableCache(tmp_path / "x"),
                      "local")  # fmt: skip
    with pytest.raises(InputError, match="impossible pool sizes"):
        too_big.cotune(CFG)
    assert ep.get() == start

    # trained on the running mid-tier, then loaded: auto on the table file
    r = tuner.cotune(CFG)
    assert r.source == "trained" and r.seconds > 0
    now = ep.get()
    assert now.auto_mode and now.table == r.path and now.model in s.models
    assert describe(ep).split(" @ ")[0] == r.threading.split(" @ ")[0]
    table = json.loads(Path(r.path).read_text())
    assert table["cpus"] == os.cpu_count() and table["config_key"] == CFG.key()
    assert tuner.cotune(CFG).source == "cache"

    # bad input over the Admin RPC: a clear error, the mid-tier keeps its current threading
    bad = tmp_path / "corrupt.json"
    bad.write_text('{"format": "musku-threading-table/1", "rows": [')
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**table, "cpus": (os.cpu_count() or 1) + 7}))
    for path, why in ((bad, "corrupt"), (stale, "stale")):
        with pytest.raises(InputError, match=why):
            ep.set_auto(path)
        assert ep.get().table == r.path and ep.get().auto_mode
    with pytest.raises(InputError, match="unknown|model"):
        ep.set_fixed(ThreadingState("async-dispatch-spin", 1, 2, 1))
    with pytest.raises(InputError):
        ep.set_fixed(ThreadingState("async-dispatch-block", 1, 9, 1))  # beyond --max-workers
    assert ep.get().table == r.path and ep.get().auto_mode

    # a corrupt cached table: dropped, retrained, loaded
    Path(r.path).write_text("{not json")
    r2 = tuner.cotune(CFG)
    assert r2.source == "trained" and tuner.trainings == 2 and ep.get().table == r2.path

    # a failed training (the load generator's data is gone): the previous threading again
    before = ep.get()
    broken = CoTuner(replace(s, load_data=str(tmp_path / "gone.txt")), ep, ServiceTrainer(),
                     TableCache(tmp_path / "y"), "local")  # fmt: skip
    with pytest.raises(HostError, match="does not exist.*again"):
        broken.cotune(CFG.with_("thp", "never"))
    after = ep.get()
    assert after.auto_mode and after.table == before.table and after.model == before.model
