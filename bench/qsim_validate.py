"""Validation of qsim against the real μSuite services and against μqSim (docs/qsim.md).

**The services** (default): each of Set Algebra and HDSearch is deployed as ``musku services``
deploys it (servers pinned to ``--server-cpus``, the load generator to ``--loadgen-cpus``),
profiled at a low rate (``musku qsim profile``'s measurement and model, same deployment), then
measured in the same run: closed-loop saturation (``--users`` users) and open-loop p50/p99 at
10-90 % of that saturation and at it, each next to the model's prediction at the same rate (the
model's saturation: the same closed loop, simulated). Printed: the errors, and whether the
issue's goals hold below 80 % of saturation (saturation +-10 %, p50 +-15 %, p99 +-25 %).

    PYTHONPATH=. python bench/qsim_validate.py [--services setalgebra,hdsearch] [--quick]

**μqSim** (``--uqsim PATH``): the 2-tier and a 50-leaf fan-out are written as μqSim architecture directories from our own
parameters (``musku.qsim.uqsim.write_example``); each rate of a load sweep runs through μqSim
(``--uqsim PATH``, built from its public source) and, imported with ``musku qsim import-uqsim``,
through qsim, in the same run. Printed: mean and p99 of both and their relative errors, and the
saturation point of each: the first rate whose mean latency exceeds 5x the lowest rate's (the
same rule for both engines; qsim's own detector is shown too).

    PYTHONPATH=. python bench/qsim_validate.py --uqsim /work/peers/uqsim/microsim [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
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


FRACTIONS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
GOALS = {"saturation": 10.0, "p50": 15.0, "p99": 25.0}  # +- %, below 80 % of saturation
SERVICE_QPS = {"setalgebra": 100.0, "hdsearch": 50.0}  # the profiled low rate


def _err(model: float, real: float) -> float:
    return (model - real) / real * 100 if real > 0 else float("nan")


def _closed(doc: dict[str, Any], users: int, duration: float) -> dict[str, Any]:
    out = with_overrides(doc, duration_s=duration)
    out["client"] = {"kind": "closed", "users": users, "think_us": 0.0, "connections": users}
    return out


def validate_service(service: str, a: Any, tmp: Path) -> dict[str, Any]:
    """Profile, then real vs model at each load; prints the table; returns the figures."""
    from musku.qsim.profile import (
        cpu_share,
        fitted_cpu_per_request_us,
        measure_deployment,
        process_cpu_s,
        with_share,
        write_model,
    )
    from musku.services import runtime

    cpus = runtime.parse_cpus(a.server_cpus)
    lg = runtime.parse_cpus(a.loadgen_cpus)
    out: dict[str, Any] = {"service": service, "points": []}
    with runtime.deploy(service, workdir=tmp / service, data_dir=a.data_dir
                        or runtime.default_data_dir(), server_cpus=cpus) as dep:  # fmt: skip
        prof = measure_deployment(dep, qps=SERVICE_QPS[service], duration_s=a.profile_s,
                                  threading="async-dispatch-block", pools=(1, 2, 1),
                                  server_cpus=cpus, loadgen_cpus=lg, nice=a.nice)  # fmt: skip
        model_path = tmp / f"{service}.toml"
        fit = write_model(prof, model_path)
        doc = load(model_path).engine
        spec = runtime.LoadSpec(mode="closed", duration_s=a.duration, warmup_s=1.0,
                                concurrency=a.users)  # fmt: skip
        fixed = fit.fixed_cpu_share
        probe = cpu_share(cpus or [0], nice=a.nice)
        tiers = [dep.midtier, *dep.leaves]
        s0 = [runtime.admin(t.address, "stats", "--reset") for t in tiers]
        t0 = time.monotonic()
        real_sat = float(runtime.run_load(dep.midtier.address, service, dep.load_data, spec,
                                          cpus=lg)["total"]["achieved_qps"])  # fmt: skip
        wall = time.monotonic() - t0
        s1 = [runtime.admin(t.address, "stats") for t in tiers]
        used = sum(process_cpu_s(y) - process_cpu_s(x) for x, y in zip(s0, s1, strict=True))
        served = int(s1[0]["requests"])
        # the share of the server CPUs the servers got while they wanted all of it
        got = min(1.0, used / wall / max(1, len(cpus or [0])))
        real_cpu = used / max(1, served) * 1e6
        whole = float(simulate(_closed(doc, a.users, 10.0))["throughput_qps"])
        at_probe = float(simulate(_closed(with_share(doc, probe, fixed), a.users, 10.0))
                         ["throughput_qps"])  # fmt: skip
        sim = simulate(_closed(with_share(doc, got, fixed), a.users, 10.0))
        model_sat = float(sim["throughput_qps"])
        model_cpu = fitted_cpu_per_request_us(prof, fit, real_sat)
        share = got if a.share else 1.0
        if not a.share:
            model_sat = whole
        out.update(real_saturation=real_sat, model_saturation=model_sat, share_got=got,
                   share_probe=probe, model_saturation_whole_core=whole,
                   model_saturation_probe=at_probe, real_cpu_per_request_at_saturation_us=real_cpu,
                   model_cpu_per_request_at_saturation_us=model_cpu,
                   background_pct=prof.background_cpu_pct, fit=fit.__dict__)  # fmt: skip
        bg = "?" if prof.background_cpu_pct is None else f"{prof.background_cpu_pct:.0f} %"
        print(f"\n{service}: servers on CPU {a.server_cpus}, load generator on CPU "
              f"{a.loadgen_cpus} (both nice {a.nice}); other processes kept the server CPU {bg} "
              f"busy while profiling at {prof.qps:g} QPS")  # fmt: skip
        print(f"  profile: CPU per request {sum([prof.midtier.cpu_per_request_us] + [t.cpu_per_request_us for t in prof.leaves]):.0f} us at {prof.qps:g} QPS, "
              f"{prof.cpu_per_request_high_us:.0f} us at {prof.qps_high:.0f} QPS; fixed "
              f"{fit.fixed_cpu_share * 100:.1f} % of a core while loaded")  # fmt: skip
        print(f"  closed loop ({a.users} users): the servers got {got * 100:.0f} % of the server "
              f"CPU (a spinning probe just before: {probe * 100:.0f} %), {real_cpu:.0f} us of "
              f"CPU per request; the model at {real_sat:.0f} QPS: {model_cpu:.0f} us "
              f"({_err(model_cpu, real_cpu):+.1f} %)")  # fmt: skip
        print(f"  saturation: real {real_sat:.0f} QPS; model on the share the servers got "
              f"{model_sat if a.share else 0:.0f} QPS ({_err(model_sat, real_sat):+.1f} %), on "
              f"the probe's share {at_probe:.0f} QPS ({_err(at_probe, real_sat):+.1f} %), on a "
              f"whole core {whole:.0f} QPS ({_err(whole, real_sat):+.1f} %)")  # fmt: skip
        print(f"  {'':>13} {'':>9} {'model on the share got':^40} | "
              f"{'model on a whole core':^36}")  # fmt: skip
        print(f"  {'load':>5} {'qps':>7} {'real p50':>9} {'p50':>10} {'err':>8} "
              f"{'real p99':>9} {'p99':>10} {'err':>8} | {'p50':>8} {'err':>8} {'p99':>8} "
              f"{'err':>8}  (ms)")  # fmt: skip
        fr = FRACTIONS[::3] + [1.0] if a.quick else FRACTIONS
        for f in sorted(set(fr)):
            q = max(1.0, f * real_sat)
            spec = runtime.LoadSpec(qps=q, duration_s=a.duration, warmup_s=1.0)
            r = runtime.run_load(dep.midtier.address, service, dep.load_data, spec, cpus=lg)
            dep.check_alive()
            lat = r["total"]["latency_us"]
            dur = max(10.0, 20000 / q)
            m = simulate(with_overrides(with_share(doc, share, fixed), qps=q, duration_s=dur))
            w = simulate(with_overrides(doc, qps=q, duration_s=dur))  # a whole core
            ml, wl = m["latency"], w["latency"]
            pt = {"fraction": f, "qps": q, "share": share, "real_p50_us": float(lat["p50"]),
                  "real_p99_us": float(lat["p99"]), "model_p50_us": ml["p50_us"],
                  "model_p99_us": ml["p99_us"], "whole_p50_us": wl["p50_us"],
                  "whole_p99_us": wl["p99_us"], "errors": int(r["total"].get("errors", 0)),
                  "model_saturated": bool(m["saturated"]) or falls_behind(m, q)}  # fmt: skip
            for k in ("model", "whole"):
                for pc in ("p50", "p99"):
                    pt[f"err_{pc}" if k == "model" else f"whole_err_{pc}"] = _err(
                        pt[f"{k}_{pc}_us"], pt[f"real_{pc}_us"])  # fmt: skip
            out["points"].append(pt)
            print(f"  {f * 100:>4.0f}% {q:>7.0f} {pt['real_p50_us'] / 1e3:>9.2f} "
                  f"{pt['model_p50_us'] / 1e3:>10.2f} {pt['err_p50']:>+7.1f}% "
                  f"{pt['real_p99_us'] / 1e3:>9.2f} {pt['model_p99_us'] / 1e3:>10.2f} "
                  f"{pt['err_p99']:>+7.1f}% | {pt['whole_p50_us'] / 1e3:>8.2f} "
                  f"{pt['whole_err_p50']:>+7.1f}% {pt['whole_p99_us'] / 1e3:>8.2f} "
                  f"{pt['whole_err_p99']:>+7.1f}%"
                  + ("  model saturated" if pt["model_saturated"] else "")
                  + (f"  {pt['errors']} errors" if pt["errors"] else ""))  # fmt: skip
    below = [p for p in out["points"] if p["fraction"] < 0.8 - 1e-9]
    for label, pre, sat in (("the share the servers got", "", out["model_saturation"]),
                            ("a whole core", "whole_", out["model_saturation_whole_core"])):  # fmt: skip
        worst = {
            "saturation": abs(_err(sat, out["real_saturation"])),
            "p50": max(abs(p[f"{pre}err_p50"]) for p in below),
            "p99": max(abs(p[f"{pre}err_p99"]) for p in below),
        }
        out[f"worst_below_80_{pre or 'share_'}"] = worst
        print(f"  below 80 % of saturation, model on {label}, worst |error|: " + ", ".join(
            f"{k} {v:.1f} % (goal {GOALS[k]:.0f}: {'met' if v <= GOALS[k] else 'NOT met'})"
            for k, v in worst.items()))  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uqsim", help="μqSim binary built from its public source: compare with it")
    ap.add_argument("--services", default="setalgebra,hdsearch")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--loadgen-cpus", default="1")
    ap.add_argument("--nice", type=int, default=-10,
                    help="nice value of this bench, so of the servers and the load generator")  # fmt: skip
    ap.add_argument("--users", type=int, default=32, help="closed-loop users for saturation")
    ap.add_argument("--no-share", dest="share", action="store_false",
                    help="model a whole server core (default: the share the servers got "
                         "in the closed loop)")  # fmt: skip
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per real point")
    ap.add_argument("--profile-s", type=float, default=8.0)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not a.uqsim:
        import os

        if a.nice:  # the load generator and the servers inherit it (the machine is shared)
            os.setpriority(os.PRIO_PROCESS, 0, a.nice)

        print(f"qsim against the real services; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs at the start (a shared machine: other builds and tests "
              "run beside this)")  # fmt: skip
        with tempfile.TemporaryDirectory() as td:
            res = [validate_service(s.strip(), a, Path(td)) for s in a.services.split(",")
                   if s.strip()]  # fmt: skip
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
        if a.json:
            import json

            a.json.write_text(json.dumps(res, indent=2) + "\n")
        return 0
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
