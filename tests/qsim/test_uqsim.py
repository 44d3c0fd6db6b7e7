"""Importing μqSim architecture directories (fixtures: μqSim-format files we write ourselves)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from musku.errors import InputError
from musku.qsim.engine import simulate
from musku.qsim.model import load, with_overrides
from musku.qsim.uqsim import convert, write_example


def test_2tier_rules_become_data(tmp_path: Path) -> None:
    d = write_example(tmp_path / "u", "2tier", qps=1000, duration_s=1)
    out = tmp_path / "m.toml"
    assert convert(d, out) == []
    m = load(out)
    svc = {s.name: s for s in m.model.services}
    # one network stack per machine (μqSim's), named after it
    assert set(svc) == {"web", "cache", "net_host0", "net_host1"}
    poll = svc["web"].stages[0]
    assert poll.queue == "epoll" and poll.time.bytes_table is not None
    table = dict(poll.time.bytes_table)
    assert table[1] == 2 and table[7] == 4 and table[20] == 9  # round(0.38 (n - 7) + 3.8)
    read = svc["cache"].stages[1]
    assert read.queue == "socket" and read.time.bytes_per_job == 7
    # μqSim's order for a batch's jobs at the next stage, on its batching stages only
    handoff = {(n, st.name): st.handoff for n in ("web", "cache") for st in svc[n].stages}
    assert {k for k, v in handoff.items() if v == "uqsim"} == {
        ("web", poll.name),
        ("cache", svc["cache"].stages[0].name),
        ("cache", read.name),
    }
    assert svc["net_host0"].irq and [s.name for s in svc["net_host0"].stages][1] == "tx_remote"
    nodes = m.model.paths[0].nodes
    assert [n.name for n in nodes] == [
        "rx0",
        "n0",
        "tx0_1",
        "rx1",
        "n1",
        "tx1_2",
        "rx2",
        "n2",
        "tx2",
    ]
    assert m.model.network.latency_us == 50 and m.model.client.epochs is not None


def test_fanout_leaves_folded(tmp_path: Path) -> None:
    d = write_example(tmp_path / "u", "fanout", qps=100, duration_s=1, leaves=7)
    out = tmp_path / "m.toml"
    convert(d, out, qps=250)
    m = load(out)
    leaf = next(s for s in m.model.services if s.name == "leaf")
    assert leaf.instances == 7 and leaf.machines == [f"host{i}" for i in range(1, 8)]
    # μqSim sends one message per leaf: the copies start at the dispatcher's network stack
    tx = next(n for n in m.model.paths[0].nodes if n.name.startswith("tx0_"))
    rx = next(n for n in m.model.paths[0].nodes if n.name == "rx1")
    assert (tx.copies, tx.children, rx.copies) == (7, ["rx1"], 1)
    assert m.model.client.qps == 250


def test_not_a_uqsim_dir(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no graph.json"):
        convert(tmp_path, tmp_path / "m.toml")
    d = write_example(tmp_path / "u", "2tier", qps=1000, duration_s=1)
    (d / "path.json").write_text("[{")
    with pytest.raises(InputError) as ei:
        convert(d, tmp_path / "m.toml")
    assert ei.value.where is not None and ei.value.where.endswith("path.json:1")


@pytest.mark.services
def test_imported_zero_load_latency(engine: str, tmp_path: Path) -> None:
    """At 200 req/s nothing queues: the mean is the sum of the hops and the stages' means."""
    d = write_example(tmp_path / "u", "fanout", qps=200, duration_s=5, leaves=3)
    out = tmp_path / "m.toml"
    convert(d, out)
    r = simulate(with_overrides(load(out).engine, duration_s=20))
    # client hop 0.065 + rx 3.5 + split 2 + tx 0.9 + 50 + max of 3 x (rx 3.5 + exp(200) + tx 0.9)
    # + 50 back to the client; E[max of 3 exp(200)] = 200 (1 + 1/2 + 1/3)
    expect = 0.065 + 3.5 + 2 + 0.9 + 50 + 3.5 + 0.9 + 200 * (1 + 1 / 2 + 1 / 3) + 50
    assert r["latency"]["mean_us"] == pytest.approx(expect, rel=0.05)
    assert r["services"]["leaf"]["count"] == 3 * r["latency"]["count"]


UQSIM = os.environ.get("MUSKU_UQSIM")


@pytest.mark.services
@pytest.mark.skipif(not UQSIM, reason="set MUSKU_UQSIM to a μqSim binary built from its source")
def test_side_by_side_with_uqsim(engine: str, tmp_path: Path) -> None:
    """Same directory through μqSim and through us: mean within 5 %, p99 within 10 %."""
    assert UQSIM is not None
    d = write_example(tmp_path / "u", "2tier", qps=20000, duration_s=3)
    (tmp_path / "sched_test").mkdir()
    p = subprocess.run([UQSIM, str(d), "100", "65", "expo", "0"], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    vals = {}
    for line in p.stdout.splitlines():
        if "tail lat" in line or "average lat" in line:
            vals["p99" if "tail" in line else "mean"] = (
                float(line.split("=")[1].split("ms")[0]) * 1000
            )
    out = tmp_path / "m.toml"
    convert(d, out)
    r = simulate(load(out).engine)
    assert r["latency"]["mean_us"] == pytest.approx(vals["mean"], rel=0.05)
    assert r["latency"]["p99_us"] == pytest.approx(vals["p99"], rel=0.10)
    json.dumps(vals)
