"""`musku sweep FILE --dry-run`: the plan, host checks with nothing applied, a host-time
estimate, and nothing written to the results DB."""

from __future__ import annotations

from pathlib import Path

from musku.storage import open_store
from musku.strict_json import loads_strict
from tests.cli.test_exit_codes import ROOT, musku, one_error_line


def _counts(url: str) -> tuple[int, int]:
    with open_store(url) as store:
        exps = store.experiments()
        return len(exps), sum(len(store.comparisons(e.id)) for e in exps)


def test_dry_run_plans_checks_estimates_and_writes_nothing(
    toy_db: tuple[str, Path], tmp_path: Path
) -> None:
    url, exp = toy_db
    before = _counts(url)
    proc = musku("sweep", str(exp), "--dry-run", "--json", "--db", url)
    assert proc.returncode == 0, proc.stderr
    d = loads_strict(proc.stdout)
    assert _counts(url) == before  # no experiment row, no comparison
    assert d["applied"] is False and d["db_rows_written"] == 0
    plan = d["plan"]
    assert [k["knob"] for k in plan["knobs"]] == ["core_count", "thp", "shp"]
    assert (
        plan["comparisons_planned"]
        == sum(k["comparisons"] for k in plan["knobs"]) + plan["validations"]
    )
    assert d["hosts"]["backend"] == "sim" and d["hosts"]["ok"]
    # the estimate comes from the finished toy run in the DB
    est = d["host_time"]
    assert "latest finished run of toy" in est["source"]
    with open_store(url) as store:
        rec = store.find_experiment("toy")
        assert rec is not None
        done = [c.result.host_time_s for c in store.comparisons(rec.id) if c.result]
    assert est["per_comparison_s"] > 0 and est["total_s"] <= est["bound_s"]
    assert min(done) <= est["per_comparison_s"] <= max(done)

    # without a DB: no file created, the estimate from the model
    fresh = tmp_path / "none.db"
    proc = musku("sweep", str(exp), "--dry-run", "--json", "--db", f"sqlite:///{fresh}")
    assert proc.returncode == 0, proc.stderr
    est = loads_strict(proc.stdout)["host_time"]
    assert "model" in est["source"] and 0 < est["total_s"] <= est["bound_s"]
    assert not fresh.exists()
    text = musku("sweep", str(exp), "--dry-run", "--db", f"sqlite:///{fresh}").stdout
    assert "nothing applied" in text and "host time: about" in text


def test_dry_run_on_unreachable_agents_is_one_line_exit_6(tmp_path: Path) -> None:
    exp = tmp_path / "agents.toml"
    sim = '[hosts]\nbackend = "sim"\nmodel = "sim/web-skylake18.toml"'
    agents = (
        f'[hosts]\nbackend = "agent"\nhosts = [{{ name = "a", socket = "{tmp_path}/a.sock" }}, '
        f'{{ name = "b", socket = "{tmp_path}/b.sock" }}]'
    )
    text = (ROOT / "experiments" / "web-skylake.toml").read_text()
    assert sim in text
    exp.write_text(text.replace(sim, agents))
    proc = musku("sweep", str(exp), "--dry-run", "--db", f"sqlite:///{tmp_path}/r.db")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert "host check failed" in line and "a:" in line and "b:" in line
    assert not (tmp_path / "r.db").exists()


def test_dry_run_on_a_pool_gives_its_pairs_and_a_host_clock_estimate(tmp_path: Path) -> None:
    """A simulated fleet: the pool as the sweep pairs it (an odd one's idle host named), and
    the host-clock to the soft SKU, which more pairs shorten; one pair has no pool."""
    text = (ROOT / "experiments" / "web-skylake.toml").read_text()
    model = (ROOT / "experiments" / "sim" / "web-skylake18.toml").resolve()
    text = text.replace('model = "sim/web-skylake18.toml"', f'model = "{model}"')
    out = {}
    for n in (2, 7, 16):
        path = tmp_path / f"web-{n}.toml"
        path.write_text(text.replace("[hosts]\n", f"[hosts]\nfleet = {n}\n") if n > 2 else text)
        proc = musku("sweep", str(path), "--dry-run", "--json", "--db", "sqlite://")
        assert proc.returncode == 0, proc.stderr
        out[n] = loads_strict(proc.stdout)
    assert out[2]["pool"] is None and "clock_s" not in out[2]["host_time"]
    assert out[7]["pool"] == {
        "hosts": 7, "pairs": 3, "first": "sim-000", "last": "sim-006", "idle": "sim-006"
    }  # fmt: skip
    assert out[16]["pool"]["pairs"] == 8 and out[16]["pool"]["idle"] is None
    total = out[16]["host_time"]["total_s"]
    assert out[16]["host_time"]["clock_s"] < out[7]["host_time"]["clock_s"] < total
    proc = musku("sweep", str(tmp_path / "web-16.toml"), "--dry-run", "--db", "sqlite://")
    assert "pool: 16 hosts (sim-000 .. sim-015), 8 pairs" in " ".join(proc.stdout.split())
