"""A whole real A/B comparison on this machine: THP never (A) vs always (B), switchback through
the local backend (private agent + built-in memory workload), decided by musku.abtest.

    python bench/agent_local_ab.py [--interval 0.4] [--settle 0.3] [--cap 200] [--arena-mib 256]

Prints the decision, the estimate and its interval, the windows used, the wall time, and the
THP state before/after (must be equal: the host is restored).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from musku.abtest import run_comparison
    from musku.domain import Configuration, StatsSettings
    from musku.experiment import load_experiment
    from musku.hostfs import THP_DIR, HostFS
    from musku.hosts.local import open_pair

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--interval", type=float, default=0.4)
    p.add_argument("--settle", type=float, default=0.3)
    p.add_argument("--cap", type=int, default=200)
    p.add_argument("--arena-mib", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    fs = HostFS("/")
    before = fs.read_bytes(THP_DIR + "/enabled")
    e = load_experiment(ROOT / "experiments" / "local-vm.toml")
    opts = {**e.hosts.options, "settle_s": a.settle, "arena_mib": a.arena_mib}
    e = dataclasses.replace(e, hosts=dataclasses.replace(e.hosts, options=opts))
    spec = dataclasses.replace(
        e.spec,
        stats=StatsSettings(
            confidence=0.95,
            min_effect=0.03,
            warmup_s=1.0,
            sample_interval_s=a.interval,
            sample_cap=a.cap,
            seed=a.seed,
        ),
    )
    base, cand = Configuration.of({"thp": "never"}), Configuration.of({"thp": "always"})
    t0 = time.monotonic()
    pair = open_pair(e, seed=a.seed)
    try:
        r = run_comparison(pair, base, cand, spec)
        pair.restore()
    finally:
        pair.close()
    wall = time.monotonic() - t0
    after = fs.read_bytes(THP_DIR + "/enabled")
    print(f"A = {base}   B = {cand}   metric = {spec.metric}")
    print(f"decision        {r.decision.value}  ({r.reason})")
    lo, hi = 100 * r.ci_low, 100 * r.ci_high
    print(f"estimate        {100 * r.estimate:+.2f} %  [{lo:+.2f}, {hi:+.2f}]")
    print(f"windows         {r.samples} per arm (method {r.method})")
    print(f"wall time       {wall:.0f} s, {pair.switches} switches")
    print(f"THP before      {before.decode().strip()}")
    verdict = "restored" if after == before else "NOT RESTORED"
    print(f"THP after       {after.decode().strip()}  ({verdict})")
    return 0 if after == before else 1


if __name__ == "__main__":
    sys.exit(main())
