"""One controller process driving many simulated pairs at once (issue 20, item 1).

The Web/Skylake experiment's sim model as a fleet (``[hosts] fleet = 2 x pairs``), opened by
:func:`musku.hosts.pool.open_pool`, driven by the sweep's own concurrent controller
(:meth:`musku.sweep.runner.Runner.map`: one thread per pair, each pair's tasks in order). Each
pair's task is ``--windows`` paired measurement windows of ``--window-s`` host seconds, taken
in pieces of ``--piece`` windows as the A/B tester takes them (``pair.windows``), and between
pieces it applies a configuration change to one host as a comparison's swap would.

Printed for the large fleet (``--pairs``, default 1,000) and a small baseline (``--baseline``,
default 10) measured in the same run, and their ratio:

- wall time of the whole drive, and per fleet window (all pairs one window further);
- controller CPU (user + system of this process) per pair-window;
- the most pairs in flight at once (threads inside a pair's task at the same moment): every
  task first waits on a barrier of all the pairs, so the whole fleet is in flight together.

Usage: ``python bench/pool.py [--pairs 1000] [--baseline 10] [--windows 30]``. On a shared,
busy machine the wall times move with the load; CPU per window moves less.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "web-skylake.toml"


def _fleet_experiment(pairs: int) -> Any:
    from musku.experiment import load_experiment

    exp = load_experiment(EXPERIMENT)
    hosts = dataclasses.replace(exp.hosts, options={**exp.hosts.options, "fleet": 2 * pairs})
    return dataclasses.replace(exp, hosts=hosts)


def drive(pairs: int, windows: int, window_s: float, piece: int, seed: int) -> dict[str, float]:
    from musku.hosts.pool import open_pool
    from musku.sweep.runner import Runner

    exp = _fleet_experiment(pairs)
    t_open = time.perf_counter()
    pool = open_pool(exp, seed=seed)
    opened_s = time.perf_counter() - t_open
    assert len(pool) == pairs
    base = exp.baseline_config
    knob = exp.service.knobs[0]
    other = next(v for v in exp.space[knob] if v != base[knob])
    flip = base.with_(knob, other)
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    # every pair's task first waits for all the others: the whole fleet is in flight at once
    # (as when every pair is mid-comparison), then each takes its windows
    together = threading.Barrier(pairs, timeout=600)

    def task(lane: Runner, i: int) -> int:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            together.wait()
            done = 0
            swap = False
            while done < windows:
                k = min(piece, windows - done)
                lane.pair.windows(window_s, k)
                done += k
                swap = not swap
                lane.pair.apply((base, flip) if swap else (flip, base))
            return done
        finally:
            with lock:
                state["now"] -= 1

    runner = Runner(exp, pool.pairs[0], pool=pool, seed=seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        counts = runner.map(task, list(range(pairs)), tag="bench")
    finally:
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        pool.close()
    total = sum(counts)
    assert total == pairs * windows
    return {
        "pairs": pairs,
        "open_s": opened_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "wall_per_fleet_window_ms": 1000 * wall / windows,
        "cpu_per_pair_window_us": 1e6 * cpu / total,
        "in_flight": state["most"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--baseline", type=int, default=10)
    ap.add_argument("--windows", type=int, default=30, help="windows per pair")
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--piece", type=int, default=10, help="windows per pair.windows() call")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.pairs < 1 or a.baseline < 1 or a.windows < 1 or a.piece < 1:
        ap.error("--pairs, --baseline, --windows and --piece must be >= 1")
    print(
        f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.windows} windows of "
        f"{a.window_s:g} s per pair, {a.piece} per call, a swap between calls"
    )
    rows = [drive(n, a.windows, a.window_s, a.piece, a.seed) for n in (a.baseline, a.pairs)]
    print(
        f"{'pairs':>6} {'open s':>8} {'wall s':>8} {'CPU s':>8} {'wall/fleet window':>18} "
        f"{'CPU/pair-window':>16} {'in flight':>10}"
    )
    for r in rows:
        print(
            f"{r['pairs']:>6} {r['open_s']:>8.2f} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} "
            f"{r['wall_per_fleet_window_ms']:>15.1f} ms {r['cpu_per_pair_window_us']:>13.0f} us "
            f"{r['in_flight']:>10}"
        )
    small, big = rows
    print(
        f"ratio {big['pairs'] / small['pairs']:.0f}x pairs: wall {big['wall_s'] / small['wall_s']:.1f}x, "
        f"CPU per pair-window {big['cpu_per_pair_window_us'] / small['cpu_per_pair_window_us']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
