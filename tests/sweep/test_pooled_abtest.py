"""`musku abtest` on a pool of several pairs runs one comparison pooled over all of them
(musku.abtest.pooled): stored once, with every pair's windows under its hosts' pool indices."""

from __future__ import annotations

from pathlib import Path

from musku.domain import Decision
from musku.experiment import load_experiment
from musku.storage import open_store
from musku.sweep import run_abtest
from tests.cli.test_exit_codes import musku

ROOT = Path(__file__).resolve().parents[2]


def test_an_abtest_on_a_pool_is_pooled_and_stored(tmp_path: Path) -> None:
    exp = load_experiment(ROOT / "experiments" / "web-skylake-fleet16.toml")
    base = exp.baseline_config
    cand = base.with_("cdp", "6:5")
    url = f"sqlite:///{tmp_path}/r.db"
    with open_store(url) as store:
        r = run_abtest(exp, base, cand, store=store, seed=1)
        [rec] = store.experiments()
        [c] = store.comparisons(rec.id)
        rows = store.samples(c.id)
    assert r.decision is Decision.BETTER, r.reason
    assert "pooled over 8 pairs" in r.method
    assert c.result is not None and c.result.decision is Decision.BETTER
    hosts = {row["host"] for row in rows}
    assert len(hosts) == 16  # every pair measured, each host under its own pool index
    assert sum(1 for row in rows if row["role"] == "B") == sum(
        1 for row in rows if row["role"] == "A"
    )
    again = run_abtest(exp, base, cand, seed=1)
    assert (again.estimate, again.samples) == (r.estimate, r.samples)  # seeded: reproducible
    out = tmp_path / "r.html"
    proc = musku("report", "web-skylake-fleet16", "--kind", "abtest", "--db", url, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 10_000
