"""Whole real A/B comparisons on this machine: switchback through the local backend (an agent
and the built-in memory workload), decided by musku.abtest, the host restored after each.

    python bench/agent_local_ab.py                      # THP madvise -> always, once
    python bench/agent_local_ab.py --knob shp --runs 5  # SHP 0 -> 128, five times
    python bench/agent_local_ab.py --aa --runs 20       # A/A: THP madvise vs madvise, SHP 0 vs 0
    python bench/agent_local_ab.py --socket /run/musku/agent.sock  # through a running agent

Statistics and host options come from experiments/local-vm.toml (flags override them). Each
run prints one line: decision, estimate and interval, windows, minutes, and whether THP
(enabled, defrag) and nr_hugepages read back byte for byte as before; ``--jsonl FILE`` appends
the same as JSON. At the end, one summary line per knob: runs, decisions, and for an A/A the
false-positive rate (better or worse) with its Clopper-Pearson 95 % interval, the largest
|estimate| and how many intervals covered 0. ``--load FILE...`` prints that summary from saved
``--jsonl`` files (several chunks merged) without running anything.

Each run first waits until no agent owns the real host (the lock every agent on "/" and the
real-host tests take: /run/lock/musku-agent.lock); the run's agent then holds it, and a run
whose agent lost the race to another one is retried. The private agent's state lives in a
fresh temporary directory unless ``--state-dir`` names one.

Exit status 1 when a run left the host changed; 3 when --load finds nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
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


def wait_for_host(timeout: float) -> None:
    """Wait until no agent (nor a real-host test) holds this machine's host lock, then let go:
    the run's own agent takes it (an flock cannot be handed to another process)."""
    from musku.agent.daemon import _flock, _Locks, host_lock_path
    from musku.errors import HostError

    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = _flock(host_lock_path("/"), "host root /")
        except HostError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        _Locks([fd]).release()
        return


def _lost_race(exc: BaseException) -> bool:
    return "another agent is running" in str(exc)


def one_run(args: argparse.Namespace, knob: str, seed: int) -> dict[str, Any]:
    """One comparison; retried (host state read again) while its agent loses the host lock
    to another agent started between our wait and its start."""
    from musku.errors import HostError

    for attempt in range(args.lock_tries):
        if not args.socket:
            wait_for_host(args.lock_timeout)
        try:
            return _one_run(args, knob, seed)
        except HostError as exc:
            if not _lost_race(exc) or attempt + 1 == args.lock_tries:
                raise
            print(f"# the host lock was taken first ({exc}); waiting", file=sys.stderr)
    raise AssertionError("unreachable")


def _one_run(args: argparse.Namespace, knob: str, seed: int) -> dict[str, Any]:
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
        ("state_dir", args.state_dir or tempfile.mkdtemp(prefix="musku-ab-")),
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


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = 1 - conf
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (knob, A, B): runs, decisions; for an A/A (A == B) the false-positive
    rate with its Clopper-Pearson 95 % interval, the largest |estimate| and the coverage of 0."""
    out = []
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["knob"], r["A"], r["B"], r.get("via", "")), []).append(r)
    for (knob, a, b, via), rs in groups.items():
        n = len(rs)
        counts: dict[str, int] = {}
        for r in rs:
            counts[r["decision"]] = counts.get(r["decision"], 0) + 1
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        restored = sum(bool(r["restored"]) for r in rs)
        mins = sum(r["minutes"] for r in rs)
        head = f"{knob} {a} vs {b} via {via}: {n} runs ({decisions}); restored {restored}/{n}"
        if a == b:
            fp = sum(r["decision"] in ("better", "worse") for r in rs)
            lo, hi = clopper_pearson(fp, n)
            with_iv = [r for r in rs if r["covers_0"] is not None]
            cov = sum(bool(r["covers_0"]) for r in with_iv)
            big = max(abs(r["estimate"]) for r in rs)
            head += (
                f"; false positives {fp}/{n} = {100 * fp / n:.1f} % "
                f"[CP 95 % {100 * lo:.1f}, {100 * hi:.1f}]; max |estimate| {100 * big:.1f} %; "
                f"interval covers 0 in {cov}/{len(with_iv)}"
            )
        out.append(head + f"; {mins:.1f} min in all")
    return out


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
    p.add_argument("--load", type=Path, nargs="+", default=None, help="summarise saved runs")
    p.add_argument("--lock-timeout", type=float, default=1800.0, help="wait for the host lock")
    p.add_argument("--lock-tries", type=int, default=5)
    a = p.parse_args()
    if a.load:
        saved = [json.loads(ln) for f in a.load for ln in f.read_text().splitlines() if ln.strip()]
        for ln in summary(saved):
            print(ln)
        return 0 if saved else 3
    knobs = ["thp", "shp"] if (a.knob or ("both" if a.aa else "thp")) == "both" else [a.knob]
    ok = True
    rows = []
    for i in range(a.runs):
        for knob in knobs:
            row = one_run(a, knob, a.seed + i)
            print(line(row), flush=True)
            ok &= bool(row["restored"])
            rows.append(row)
            if a.jsonl is not None:
                with a.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    for ln in summary(rows):
        print(ln, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
