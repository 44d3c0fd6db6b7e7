"""The four services as the workload under test, deployed from Python (``runtime.deploy``) and
through ``musku services run | bench``: real figures, nothing left running, one-line errors.

Needs the built services (scripts/build-services; ``$MUSKU_SERVICES_BUILD`` for another build)
and, for Router, Debian's memcached; skipped with the reason otherwise. Small data sets keep
each test to a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from musku.cli import app
from musku.errors import HostError, InputError
from musku.services import deployments, runtime
from musku.services.latency import Latencies

REPO = Path(__file__).resolve().parents[2]

# Per service: options for a small, quick deployment (synthetic data, cached under data_dir).
SMALL: dict[str, dict[str, Any]] = {
    "setalgebra": {"docs": 20_000, "terms": 500, "queries": 300, "seed": 3},
    "hdsearch": {"source": "synthetic", "n": 3000, "dim": 32, "nq": 100},
    "recommend": {"source": "synthetic", "users": 200, "items": 120, "iterations": 10},
    "router": {"records": 300, "operations": 5000, "memcached_mb": 16},
}


def _missing(service: str) -> str | None:
    """Why ``service`` cannot be deployed here, or None."""
    try:
        rec = deployments.recipe(service)
        for b in (*rec.binaries, "musku_admin", "musku_loadgen"):
            runtime.binary(b)
        if rec.backend == "memcached":
            runtime.memcached_binary()
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return str(e)
    return None


def _need(service: str) -> None:
    why = _missing(service)
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the module: each small data set is generated once."""
    return tmp_path_factory.mktemp("data")


def _our_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Every process the test started is gone at its end."""
    before = _our_children()
    yield
    left = {p.pid: p.name() for p in psutil.Process().children(recursive=True)}
    left = {pid: name for pid, name in left.items() if pid not in before}
    assert not left, f"processes left running: {left}"


# ---- deploy + load + stop, per service --------------------------------------------------------


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.parametrize("service", deployments.SERVICES)
def test_deploy_measure_stop(
    service: str, tmp_path: Path, data_dir: Path, no_leftovers: None
) -> None:
    _need(service)
    procs: list[runtime.Proc] = []
    with runtime.deploy(service, workdir=tmp_path / "w", data_dir=data_dir, shards=2,
                        data_opts=SMALL[service]) as dep:  # fmt: skip
        procs = [dep.midtier, *dep.leaves, *dep.backends]
        assert len(dep.leaves) == 2
        assert len(dep.backends) == (2 if service == "router" else 0)
        assert all(p.popen.poll() is None for p in procs)
        res = runtime.measure(dep, runtime.parse_load_list("50%"), duration_s=0.6,
                              warmup_s=0.2, concurrency=8)  # fmt: skip
        sat, closed, (open_,) = res["saturation_qps"], res["closed_loop"], res["open_loop"]
        assert sat > 0 and closed["ok"] > 0 and closed["errors"] == 0, closed
        assert open_["fraction"] == 0.5 and open_["qps"] == pytest.approx(sat / 2)
        assert open_["achieved_qps"] > 0 and open_["ok"] > 0 and open_["errors"] == 0, open_
        assert 0 < open_["latency_us"]["p50"] <= open_["latency_us"]["p99"]
        # the load generator's buckets give back its own quantiles (and count every request)
        lat = Latencies.of(open_)
        assert lat.n == open_["ok"] + open_["errors"]
        for q, key in ((0.5, "p50"), (0.99, "p99")):
            assert lat.quantile(q) == pytest.approx(open_["latency_us"][key], rel=0.017)
        stats = dep.stats()
        assert stats, "the mid-tier answers its Admin stats"
        if service == "router":  # a real memcached behind each leaf saw the YCSB load
            mc = [runtime.memcached_stats(p.address) for p in dep.backends]
            assert sum(m["cmd_set"] for m in mc) >= SMALL["router"]["records"]  # load phase
            assert sum(m["get_hits"] for m in mc) > 0  # gets find the loaded keys
            assert sum(m["get_misses"] for m in mc) == 0
    assert procs and all(p.popen.returncode is not None for p in procs)
    assert dep.exit_codes == {p.name: 0 for p in procs}, dep.exit_codes
    assert dep.stop() == dep.exit_codes  # idempotent


@pytest.mark.services
def test_failed_start_stops_what_did_start(
    tmp_path: Path, data_dir: Path, no_leftovers: None
) -> None:
    """Router: memcached0 starts, then leaf0 refuses its flags: the error names leaf0, and
    memcached0 is stopped too."""
    _need("router")
    with (
        pytest.raises(HostError, match="leaf0 exited with status"),
        runtime.deploy(
            "router",
            workdir=tmp_path,
            data_dir=data_dir,
            data_opts=SMALL["router"],
            leaf_threading="no-such-model",
            start_timeout_s=20,
        ),
    ):
        pytest.fail("deployed with a bad leaf flag")


@pytest.mark.services
def test_leaf_down_is_a_host_error_naming_it(
    tmp_path: Path, data_dir: Path, no_leftovers: None
) -> None:
    _need("setalgebra")
    with runtime.deploy("setalgebra", workdir=tmp_path, data_dir=data_dir,
                        data_opts=SMALL["setalgebra"]) as dep:  # fmt: skip
        dep.leaves[1].popen.kill()
        dep.leaves[1].popen.wait()
        with pytest.raises(HostError, match="leaf1 was killed by signal 9"):
            runtime.measure(dep, [runtime.Load(qps=50)], duration_s=0.3, warmup_s=0.0)
    assert dep.exit_codes["leaf1"] == -signal.SIGKILL
    assert all(code == 0 for name, code in dep.exit_codes.items() if name != "leaf1")


def test_bad_options_are_input_errors_before_anything_starts(tmp_path: Path) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("nosuch", {}, "unknown service 'nosuch'"),
        ("hdsearch", {"nosuch": 1}, "hdsearch has no option 'nosuch'"),
        ("router", {"records": "many"}, "option records wants int"),
        ("recommend", {"ratings": tmp_path / "none.bin"}, "does not exist"),
    ]
    for service, opts, msg in cases:
        with (
            pytest.raises(InputError, match=msg),
            runtime.deploy(service, workdir=tmp_path / "w", data_dir=tmp_path, data_opts=opts),
        ):
            pytest.fail("deployed")
    assert not (tmp_path / "w").exists()  # nothing was set up


def test_load_lists() -> None:
    loads = runtime.parse_load_list("20%, 1000,80%")
    assert loads == [runtime.Load(fraction=0.2), runtime.Load(qps=1000.0),
                     runtime.Load(fraction=0.8)]  # fmt: skip
    assert [x.resolve(5000.0) for x in loads] == [1000.0, 1000.0, 4000.0]
    for bad in ("", "fast", "0", "-5%", "nan"):
        with pytest.raises(InputError):
            runtime.parse_load_list(bad)


def test_opts_are_typed_per_service() -> None:
    assert deployments.parse_opts("router", ["zipf=0.5", "read-proportion=0.95"]) == {
        "zipf": 0.5,
        "read_proportion": 0.95,
    }
    assert deployments.parse_opts("hdsearch", ["n=1e4"]) == {"n": 10_000}
    for service, pairs in (("hdsearch", ["n=1.5"]), ("router", ["zipf"]), ("router", ["=1"])):
        with pytest.raises(InputError):
            deployments.parse_opts(service, pairs)


# ---- the command line -------------------------------------------------------------------------

runner = CliRunner()


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("musku: error: "), stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "status", "needle"),
    [
        (["bench", "nosuch"], 3, "unknown service 'nosuch'; one of: setalgebra, hdsearch"),
        (["run", "hdsearch", "--opt", "nosuch=1"], 3, "hdsearch has no option 'nosuch'"),
        (["bench", "router", "-o", "zipf"], 3, "--opt wants KEY=VALUE"),
        (["bench", "router", "-o", "records=x"], 3, "option records wants int"),
        (
            ["bench", "hdsearch", "-o", "vectors=/no/such.bin", "-o", "query_file=/no/q.bin"],
            3,
            "vectors file /no/such.bin does not exist",
        ),  # fmt: skip
        (["bench", "router", "--docs", "5"], 3, "--docs is a setalgebra option"),
        (["run", "router", "--threading", "fast"], 3, "unknown threading model 'fast'"),
        (["bench", "router", "--threading", "auto"], 3, "--threading auto needs --table"),
        (["bench", "router", "--shards", "0"], 3, "--shards must be >= 1"),
        (["bench", "router", "--qps", "0"], 3, "loads must be positive"),
        (["bench", "router", "--server-cpus", "a"], 3, "CPU lists are comma-separated"),
    ],
)
def test_cli_bad_input(args: list[str], status: int, needle: str) -> None:
    r = runner.invoke(app, ["services", *args])
    assert r.exit_code == status, (r.stdout, r.stderr)
    assert needle in _one_error_line(r.stderr)
    assert r.stdout == ""


def test_cli_not_built_is_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSKU_SERVICES_BUILD", str(tmp_path / "nobuild"))
    r = runner.invoke(app, ["services", "bench", "router", "--data-dir", str(tmp_path)])
    assert r.exit_code == 4
    assert "is not built" in _one_error_line(r.stderr)


def test_cli_unknown_flag_is_a_usage_error() -> None:
    r = runner.invoke(app, ["services", "bench", "router", "--no-such-flag"])
    assert r.exit_code == 2
    assert "No such option" in r.stderr


@pytest.mark.services
@pytest.mark.slow
def test_cli_bench_json(tmp_path: Path, data_dir: Path, no_leftovers: None) -> None:
    """The real entry point (a subprocess): saturation + three loads, JSON, exit 0."""
    _need("router")
    opts = [x for k, v in SMALL["router"].items() for x in ("-o", f"{k}={v}")]
    cp = subprocess.run(
        [sys.executable, "-m", "musku", "services", "bench", "router", "--json",
         "--duration", "0.5", "--warmup", "0.1", "--concurrency", "8", "--idle-seconds", "0",
         "--data-dir", str(data_dir), *opts],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"},
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    fig = json.loads(cp.stdout)
    assert fig["service"] == "router" and fig["saturation_qps"] > 0
    assert [o["fraction"] for o in fig["open_loop"]] == [0.2, 0.5, 0.8]
    for o in [fig["closed_loop"], *fig["open_loop"]]:
        assert o["achieved_qps"] > 0 and o["errors"] == 0, o
        assert set(o["methods"]) == {"/musku.router.Router/Get", "/musku.router.Router/Set"}
    assert set(fig["exit_codes"]) == {"midtier", "leaf0", "leaf1", "memcached0", "memcached1"}
    assert not any(fig["exit_codes"].values())


@contextlib.contextmanager
def _musku_run(data_dir: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``musku services run router --json`` in a subprocess, up: (process, its JSON line)."""
    with subprocess.Popen(
        [sys.executable, "-m", "musku", "services", "run", "router", "--json",
         "--data-dir", str(data_dir), "-o", "records=100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    ) as p:  # fmt: skip
        try:
            assert p.stdout is not None
            yield p, json.loads(p.stdout.readline())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.services
def test_cli_run_stops_everything_on_sigterm(
    tmp_path: Path, data_dir: Path, no_leftovers: None
) -> None:
    _need("router")
    with _musku_run(data_dir) as (p, info):
        tiers = [c.pid for c in psutil.Process(p.pid).children()]
        assert len(tiers) == 5, info  # mid-tier, 2 leaves, 2 memcacheds
        assert runtime.admin(info["midtier"], "health") is not None
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert not any(psutil.pid_exists(pid) for pid in tiers)


@pytest.mark.services
def test_cli_run_exits_6_when_a_tier_dies(
    tmp_path: Path, data_dir: Path, no_leftovers: None
) -> None:
    _need("router")
    with _musku_run(data_dir) as (p, _info):
        mc = [c for c in psutil.Process(p.pid).children() if c.name() == "memcached"]
        mc[0].kill()
        _, err = p.communicate(timeout=30)
        assert p.returncode == 6
        assert "memcached0 was killed by signal 9" in _one_error_line(err)
