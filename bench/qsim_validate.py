"""Validation of qsim against μqSim, side by side on the same input (docs/qsim.md).

The 2-tier and a 50-leaf fan-out are written as μqSim architecture directories from our own
parameters (``musku.qsim.uqsim.write_example``); each rate of a load sweep runs through μqSim
(``--uqsim PATH``, built from its public source) and, imported with ``musku qsim import-uqsim``,
through qsim, in the same run. Printed: mean and p99 of both and their relative errors, and the
saturation point of each: the first rate whose mean latency exceeds 5x the lowest rate's (the
same rule for both engines; qsim's own detector is shown too).

Not done here (docs/qsim.md, "Not done"): the μSuite services (Set Algebra, HDSearch) measured at
10-90 % of saturation next to models profiled from them (``musku qsim profile``).

    PYTHONPATH=. python bench/qsim_validate.py --uqsim /work/peers/uqsim/microsim [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from musku.qsim.cli import falls_behind
from musku.qsim.engine import simulate
from musku.qsim.model import load, with_overrides
from musku.qsim.uqsim import convert, write_example


def uqsim(path: str, arch: Path, tmp: Path, kqps: float) -> dict[str, float]:
    (tmp / "sched_test").mkdir(exist_ok=True)
    out = subprocess.run([path, str(arch), "100", "65", "expo", f"{kqps:g}"], capture_output=True,
                         text=True, timeout=3600, cwd=tmp, check=True).stdout  # fmt: skip
    vals: dict[str, float] = {}
    for line in out.splitlines():
        if "tail lat" in line:
            vals["p99_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
        if "average lat" in line:
            vals["mean_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
    return vals


def sweep(kind: str, rates: list[float], duration: float, a: Any, tmp: Path, **kw: Any) -> None:
    arch = write_example(tmp / kind, kind, qps=rates[0], duration_s=duration, **kw)
    convert(arch, tmp / f"{kind}.toml")
    doc = load(tmp / f"{kind}.toml").engine
    print(f"\n{kind}: {duration:g} s per rate")
    print(f"{'qps':>8} {'μqSim mean':>11} {'qsim mean':>10} {'err':>7} {'μqSim p99':>10}"
          f" {'qsim p99':>9} {'err':>7}  qsim saturated")  # fmt: skip
    base: dict[str, float] = {}
    sat: dict[str, float | None] = {"μqSim": None, "qsim": None, "qsim detector": None}
    for q in rates:
        u = uqsim(a.uqsim, arch, tmp, q / 1000)
        r = simulate(with_overrides(doc, qps=q, duration_s=duration))
        lat = r["latency"]
        ours = {"mean_us": lat["mean_us"], "p99_us": lat["p99_us"]}
        base = base or {"μqSim": u["mean_us"], "qsim": ours["mean_us"]}
        for name, v in (("μqSim", u), ("qsim", ours)):
            if sat[name] is None and v["mean_us"] > 5 * base[name]:
                sat[name] = q
        flag = r["saturated"] or falls_behind(r, q)
        if flag and sat["qsim detector"] is None:
            sat["qsim detector"] = q
        em = (ours["mean_us"] - u["mean_us"]) / u["mean_us"] * 100
        e99 = (ours["p99_us"] - u["p99_us"]) / u["p99_us"] * 100
        print(f"{q:>8.0f} {u['mean_us']:>11.1f} {ours['mean_us']:>10.1f} {em:>+6.1f}%"
              f" {u['p99_us']:>10.1f} {ours['p99_us']:>9.1f} {e99:>+6.1f}%  "
              f"{'yes: ' + r['stop_reason'] if flag else 'no'}")  # fmt: skip
        if sat["μqSim"] is not None and sat["qsim"] is not None:
            break
    print("saturation (mean > 5x the lowest rate's): " + ", ".join(
        f"{k} {v:.0f}" if v else f"{k} -" for k, v in sat.items()))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uqsim", required=True, help="μqSim binary built from its public source")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        two: list[float] = [20000, 100000, 200000, 220000, 240000, 260000, 280000]
        fan: list[float] = [200, 1000, 2000, 3000, 4000, 4500, 5000, 5500, 6000]
        if a.quick:
            two, fan = two[::2], fan[::2]
        sweep("2tier", two, 0.3 if a.quick else 0.5, a, tmp)
        sweep("fanout", fan, 1.0 if a.quick else 2.0, a, tmp, leaves=50)
    return 0


if __name__ == "__main__":
    sys.exit(main())
