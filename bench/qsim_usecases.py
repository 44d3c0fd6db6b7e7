"""qsim use case: tail at scale (docs/qsim.md, "Use cases").

A root fans out to N leaves (N = 5 .. 1,000) and waits for all of them. Each leaf answer takes
exp(1 ms), except that with probability p (0.1 .. 10 %) it is 10x slower, exp(10 ms): the leaf's
time is an empirical histogram of that mixture (a file written here, 0.02 ms bins). One
closed-loop user, so nothing queues and the end-to-end time is the maximum of N leaf times:

    P(request touches a slow leaf) = 1 - (1 - p)^N
    P(latency > t) = 1 - F(t)^N,  F(t) = (1 - p)(1 - e^{-t}) + p (1 - e^{-t/10})   (t in ms)

For each (N, p) the script prints the closed form's p99 next to the simulated one, and, at the
threshold t* that N fast leaves exceed only 0.1 % of the time, the fraction of requests above
it: simulated next to 1 - F(t*)^N (which 1 - (1 - p)^N bounds from above).

    PYTHONPATH=. python bench/qsim_usecases.py [--requests 20000] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from musku.qsim.engine import simulate
from musku.qsim.model import load

MODEL = """\
[run]
duration_s = 1e6
warmup_s = 0.001
seed = {seed}
max_requests = {requests}

[[machines]]
name = "m"
cores = 1

[[services]]
name = "root"
execution = "simple"
  [[services.stages]]
  name = "fan"
  time = {{ dist = "const", mean_us = 0 }}

[[services]]
name = "leaf"
execution = "simple"
instances = {n}
  [[services.stages]]
  name = "work"
  time = {{ dist = "empirical", file = "{hist}" }}

[[paths]]
  [[paths.nodes]]
  name = "root"
  service = "root"
  children = ["leaf"]
  [[paths.nodes]]
  name = "leaf"
  service = "leaf"
  copies = {n}
  children = ["join"]
  [[paths.nodes]]
  name = "join"
  service = "root"
  gather = true

[client]
kind = "closed"
users = 1
"""

BIN_MS = 0.02
MAX_MS = 200.0


def leaf_cdf(t: float, p: float) -> float:
    return (1 - p) * (1 - math.exp(-t)) + p * (1 - math.exp(-t / 10))


def write_hist(path: Path, p: float) -> None:
    rows = []
    t = 0.0
    while t < MAX_MS:
        w = leaf_cdf(t + BIN_MS, p) - leaf_cdf(t, p)
        rows.append(f"{(t + BIN_MS / 2) * 1000:.1f},{w:.12g}")
        t += BIN_MS
    path.write_text("\n".join(rows) + "\n")


def quantile_of_max(q: float, n: int, p: float) -> float:
    """t (ms) with F(t)^n = q, by bisection."""
    lo, hi = 0.0, MAX_MS
    for _ in range(80):
        mid = (lo + hi) / 2
        if leaf_cdf(mid, p) ** n < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="fewer configurations and requests")
    a = ap.parse_args()
    fanouts = [5, 50, 500] if a.quick else [5, 10, 50, 100, 500, 1000]
    probs = [0.001, 0.01, 0.1]
    print(f"{'N':>5} {'p':>6} {'1-(1-p)^N':>10} {'p99 model':>10} {'p99 sim':>9} {'err':>7}"
          f"  {'t* (ms)':>8} {'P(>t*) closed':>14} {'P(>t*) sim':>11}")  # fmt: skip
    worst = 0.0
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for n in fanouts:
            reqs = a.requests if n <= 100 else max(2000, a.requests // 4)
            if a.quick:
                reqs //= 4
            for p in probs:
                hist = tmp / f"leaf_{p}.csv"
                if not hist.exists():
                    write_hist(hist, p)
                f = tmp / f"m_{n}_{p}.toml"
                f.write_text(MODEL.format(seed=n, requests=reqs, n=n, hist=hist.name))
                doc = load(f).engine
                r = simulate(doc)
                p99 = r["latency"]["p99_us"] / 1000
                p99_cf = quantile_of_max(0.99, n, p)
                err = (p99 - p99_cf) / p99_cf
                worst = max(worst, abs(err))
                # threshold the fast leaves alone exceed 0.1 % of the time
                tstar = -math.log(1 - 0.999 ** (1 / n))
                closed = 1 - leaf_cdf(tstar, p) ** n
                sim = _fraction_above(r["latency_buckets"], tstar * 1000)
                print(f"{n:>5} {p:>6.3f} {1 - (1 - p) ** n:>10.4f} {p99_cf:>10.2f} {p99:>9.2f}"
                      f" {err * 100:>+6.1f}%  {tstar:>8.2f} {closed:>14.4f} {sim:>11.4f}")  # fmt: skip
    print(f"\nworst p99 error against the closed form: {worst * 100:.1f} % "
          f"(histogram bins {BIN_MS} ms; p99 from {a.requests} requests or a quarter for N > 100)")  # fmt: skip
    return 0


def _fraction_above(buckets: list[list[float]], t_us: float) -> float:
    """Fraction of requests slower than t_us, from the engine's latency histogram."""
    total = sum(c for _, c in buckets)
    return sum(c for ub, c in buckets if ub > t_us) / total


if __name__ == "__main__":
    sys.exit(main())
