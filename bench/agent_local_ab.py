"""Whole real A/B comparisons on this machine: switchback through the local backend (an agent
and the built-in memory workload), decided by musku.abtest, the host restored after each.

    python bench/agent_local_ab.py                      # THP madvise -> always, once
    python bench/agent_local_ab.py --knob shp --runs 5  # SHP 0 -> 128, five times
    python bench/agent_local_ab.py --aa --runs 20       # A/A: THP madvise vs madvise, SHP 0 vs 0
    python bench/agent_local_ab.py --socket /run/musku/agent.sock  # through a running agent

Statistics and host options come from experiments/local-vm.toml (flags override them). Each
run prints one line: decision, estimate and interval, windows, minutes, and whether THP
(enabled, defrag) and nr_hugepages read back byte for byte as before; ``--jsonl FILE`` appends
the same as JSON. Exit status 1 when a run left the host changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS: dict[str, tuple[Any, Any]] = {"thp": ("madvise", "always"), "shp": (0, 128)}


def host_state() -> dict[str, bytes]:
    """The bytes of every file the two knobs write (the huge page pool through sysfs: a
    read of /proc/sys/vm/nr_hugepages with HostFS's large buffer fails with ENOMEM)."""
    from musku.hostfs import HUGEPAGES_DIR, THP_DIR, HostFS

    fs = HostFS("/")
    paths = [
        THP_DIR + "/enabled",
        THP_DIR + "/defrag",
        HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages",
    ]
    return {p: fs.read_bytes(p) for p in paths if fs.exists(p)}


def one_run(args: argparse.Namespace, knob: str, seed: int) -> dict[str, Any]:
    from musku.abtest import run_comparison
    from musku.domain import Configuration
    from musku.experiment import load_experiment
    from musku.hosts.local import open_pair

    e = load_experiment(ROOT / "experiments" / "local-vm.toml")
    opts = dict(e.hosts.options)
    for key, value in (
        ("settle_s", args.settle),
        ("arena_mib", args.arena_mib),
        ("socket", args.socket),
        ("state_dir", args.state_dir),
    ):
        if value is not None:
            opts[key] = value
    e = dataclasses.replace(e, hosts=dataclasses.replace(e.hosts, options=opts))
    st = e.spec.stats
    st = dataclasses.replace(
        st,
        sample_interval_s=args.interval or st.sample_interval_s,
        sample_cap=args.cap or st.sample_cap,
        seed=seed,
    )
    spec = dataclasses.replace(e.spec, stats=st)
    a, b = SETTINGS[knob]
    base = Configuration.of({knob: a})
    cand = Configuration.of({knob: a if args.aa else b})
    before = host_state()
    t0 = time.monotonic()
    pair = open_pair(e, seed=seed)
    try:
        r = run_comparison(pair, base, cand, spec)
        pair.restore()
    finally:
        pair.close()
    wall = time.monotonic() - t0
    after = host_state()
    finite = math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
    return {
        "knob": knob,
        "A": str(base),
        "B": str(cand),
        "seed": seed,
        "decision": r.decision.value,
        "estimate": r.estimate,
        "ci_low": r.ci_low if finite else None,
        "ci_high": r.ci_high if finite else None,
        "covers_0": (r.ci_low <= 0.0 <= r.ci_high) if finite else None,
        "windows": r.samples,
        "minutes": wall / 60.0,
        "switches": pair.switches,
        "restored": after == before,
        "reason": r.reason,
        "via": args.socket or "private agent",
    }


def line(row: dict[str, Any]) -> str:
    if row["ci_low"] is None:
        iv = "no interval"
    else:
        iv = f"[{100 * row['ci_low']:+.2f}, {100 * row['ci_high']:+.2f}] %"
    return (
        f"{row['knob']:4} {row['A']:>12} -> {row['B']:<12} {row['decision']:14} "
        f"{100 * row['estimate']:+7.2f} % {iv:24} n={row['windows']:<4} "
        f"{row['minutes']:5.1f} min  {'restored' if row['restored'] else 'NOT RESTORED'}"
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--knob", choices=["thp", "shp", "both"], default=None)
    p.add_argument("--aa", action="store_true", help="A/A: the baseline against itself")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--interval", type=float, default=None)
    p.add_argument("--settle", type=float, default=None)
    p.add_argument("--cap", type=int, default=None)
    p.add_argument("--arena-mib", type=int, default=None)
    p.add_argument("--socket", default=None, help="a running agent's Unix socket")
    p.add_argument("--state-dir", default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jsonl", type=Path, default=None, help="append each run as JSON")
    a = p.parse_args()
    knobs = ["thp", "shp"] if (a.knob or ("both" if a.aa else "thp")) == "both" else [a.knob]
    ok = True
    for i in range(a.runs):
        for knob in knobs:
            row = one_run(a, knob, a.seed + i)
            print(line(row), flush=True)
            ok &= bool(row["restored"])
            if a.jsonl is not None:
                with a.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
