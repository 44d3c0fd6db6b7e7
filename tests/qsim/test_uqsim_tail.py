"""μqSim's own 2-tier near saturation (docs/qsim.md "Near saturation", issue 34 item 4): why
190 kQPS has no p99 to compare.

nginx binds each of the client's 100 connections to one of its 8 threads (μqSim: first come,
round-robin; qsim: ``conn mod 8``), so four threads serve 13 connections and four 12. A thread's
capacity follows from the model's own numbers: each request visits nginx twice, each visit one
``proc_req`` draw (μqSim's table, mean 19.747 us) and its share of an epoll batch, which costs
the least per job when every one of the thread's 13 connections is ready (round(0.38 (13 - 7) +
3.8) = 6 us for 13 jobs). That bounds a 13-connection thread at 24,742 req/s, i.e. a client rate
of 190,323 req/s: at 190 kQPS those four threads are critically loaded (rho >= 0.998 even with
perfect batching; batches are smaller in practice, so above 1), the four others at 0.94, and the
run's p99 grows with its length and moves by tens of percent between seeds in either engine.

μqSim's repository has no licence: its files are read from a git mirror
(``$MUSKU_UQSIM_MIRROR``) and the tests skip without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from musku.qsim.engine import simulate
from musku.qsim.model import load, with_overrides
from musku.qsim.uqsim import convert

MIRROR = Path(
    os.environ.get(
        "MUSKU_UQSIM_MIRROR", "/work/.mirror/zyqCSL+uqsim-power-management-beta/repo/.git"
    )
)
ARCH = "architecture/2tier/json"


@pytest.fixture
def two_tier(tmp_path: Path) -> Path:
    """μqSim's 2-tier, imported as bench/qsim_vs_uqsim.py imports it (μqSim's draw shares)."""
    if shutil.which("git") is None or not MIRROR.is_dir():
        pytest.skip(f"no μqSim mirror at {MIRROR} (set MUSKU_UQSIM_MIRROR)")
    tar = subprocess.run(["git", f"--git-dir={MIRROR}", "archive", "HEAD", ARCH],
                         capture_output=True, timeout=60)  # fmt: skip
    if tar.returncode != 0:
        pytest.skip(f"the mirror has no {ARCH}")
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar.stdout, check=True, timeout=60)
    out = tmp_path / "2tier.toml"
    convert(src / ARCH, out, as_uqsim_draws=True)
    return out


def busiest_thread_capacity(model: Path) -> tuple[int, float]:
    """(connections of the busiest nginx thread, the client rate at which it saturates)."""
    doc: dict[str, Any] = tomllib.loads(model.read_text())
    nginx = next(s for s in doc["services"] if s["name"] == "nginx")
    conns = int(doc["client"]["connections"])
    per_thread = [0] * int(nginx["instances"])
    for c in range(conns):  # lb = "connection": conn mod instances
        per_thread[c % len(per_thread)] += 1
    most = max(per_thread)
    stages = {s["name"]: s for s in nginx["stages"]}
    rows = [float(x) for x in (model.parent / stages["proc_req"]["time"]["file"]).read_text()
            .splitlines() if x.strip() and not x.startswith("#")]  # fmt: skip
    proc_us = sum(rows) / len(rows)
    epoll_us = dict((int(n), float(us)) for n, us in stages["epoll"]["time"]["bytes_table"])[most]
    visits = sum(1 for p in doc["paths"] for n in p["nodes"] if n["service"] == "nginx")
    work_us = visits * (proc_us + epoll_us / most)
    return most, 1e6 / work_us * conns / most


def test_busiest_nginx_thread_saturates_at_190k(two_tier: Path) -> None:
    most, cap = busiest_thread_capacity(two_tier)
    assert most == 13
    assert cap == pytest.approx(190_323, abs=50)
    assert 190_000 / cap > 0.998


@pytest.mark.services
@pytest.mark.slow
def test_190k_is_critical_for_the_busiest_threads_180k_is_not(engine: str, two_tier: Path) -> None:
    def nginx_utils(qps: float) -> tuple[list[float], dict[str, Any]]:
        doc = with_overrides(load(two_tier).engine, qps=qps, duration_s=1.0, seed=1)
        r = simulate(doc)
        return [t["util"] for t in r["threads"] if t["service"] == "nginx"], r

    at190, r190 = nginx_utils(190_000)
    at180, r180 = nginx_utils(180_000)
    # 13-connection threads (conn mod 8 < 4) and 12-connection ones
    assert sum(at190[:4]) / 4 > 0.985 and max(at190[4:]) < 0.96
    assert sum(at180[:4]) / 4 < 0.97 and max(at180[4:]) < 0.92
    # near a critical load the tail is a backlog, not a steady-state figure
    assert r190["latency"]["p99_us"] > 5 * r180["latency"]["p99_us"]
