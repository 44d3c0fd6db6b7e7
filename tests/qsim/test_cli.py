"""``musku qsim``: run, curve, check, exit statuses (through the real CLI and engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.qsim.conftest import MM1

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services


def musku(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_run_json_and_out_file(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = musku("qsim", "run", "experiments/qsim/2tier.toml", "--duration", "0.3", "--qps", "20000",
              "--seed", "4", "--json", "--per-core", "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert json.loads(out.read_text())["latency"] == r["latency"]
    assert set(r["services"]) == {"nginx", "memcached"}
    # three network hops of 65 us, plus work: the mean lies above 195 us and below 400 us
    assert 195 < r["latency"]["mean_us"] < 400
    assert r["latency"]["p50_us"] <= r["latency"]["p99_us"] <= r["latency"]["max_us"]
    assert abs(r["throughput_qps"] - 20000) < 1500
    assert {s["stage"] for s in r["stages"]} >= {"epoll", "socket_read", "proc"}
    assert all(0 <= c["util"] <= 1 for c in r["cores"])
    assert r["threads"] and all(0 <= t["util"] <= 1 for t in r["threads"])
    again = json.loads(musku("qsim", "run", "experiments/qsim/2tier.toml", "--duration", "0.3",
                             "--qps", "20000", "--seed", "4", "--json").stdout)  # fmt: skip
    assert again["latency"] == r["latency"]  # the same seed, the same result


def test_run_table(engine: str) -> None:
    p = musku("qsim", "run", "experiments/qsim/2tier.toml", "--duration", "0.2")
    assert p.returncode == 0, p.stderr
    assert "end-to-end mean" in p.stdout and "memcached" in p.stdout


def test_curve_finds_saturation(engine: str, tmp_path: Path) -> None:
    model = tmp_path / "mm1.toml"
    model.write_text(MM1.format(duration=0.5, qps=1000))
    # capacity is 100,000 req/s (10 us): 50k and 90k are stable, 130k saturates
    p = musku("qsim", "curve", str(model), "--qps", "50000:170000:4", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    pts = res["points"]
    assert [pt["saturated"] for pt in pts] == [False, False, True]  # stopped at the first
    assert res["saturation"]["first_saturated_qps"] == 130000
    assert res["saturation"]["last_stable_qps"] == 90000
    assert 90000 < res["saturation"]["max_throughput_qps"] < 105000
    assert pts[0]["latency"]["mean_us"] < pts[1]["latency"]["mean_us"]
    t = musku("qsim", "curve", str(model), "--qps", "50000:170000:4")
    assert "saturation" in t.stdout and "130000" in t.stdout


def test_saturated_run_stops_and_says(engine: str, tmp_path: Path) -> None:
    model = tmp_path / "mm1.toml"
    model.write_text(MM1.format(duration=100, qps=150000))
    p = musku("qsim", "run", str(model), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["saturated"] and "backlog" in r["stop_reason"]
    assert r["sim_time_s"] < 10  # stopped long before the 100 s asked for


@pytest.mark.parametrize(
    ("args", "status", "text"),
    [
        (["qsim", "run", "nope.toml"], 3, "cannot read model"),
        (["qsim", "curve", "experiments/qsim/2tier.toml", "--qps", "5:1:3"], 3, "0 < A <= B"),
        (["qsim", "run", "experiments/qsim/2tier.toml", "--qps", "-1"], 3, "--qps must be > 0"),
    ],
)
def test_bad_input_exit_status(engine: str, args: list[str], status: int, text: str) -> None:
    p = musku(*args)
    assert p.returncode == status, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("musku: error: ") and text in lines[0]


def test_bad_model_line(tmp_path: Path) -> None:
    model = tmp_path / "bad.toml"
    model.write_text(MM1.format(duration=1, qps=10).replace("cores = 1", "cores = 0"))
    p = musku("qsim", "check", str(model))
    assert p.returncode == 3
    assert f"{model}:8: machines[0].cores" in p.stderr


def test_engine_refuses_malformed_json(engine: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"duration_s": 1, "machines": [{"cores": 0}]}')
    p = subprocess.run([engine, str(bad)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 3 and "machines[0].cores" in p.stderr
    bad.write_text("{not json")
    p = subprocess.run([engine, str(bad)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 3 and "not JSON" in p.stderr
