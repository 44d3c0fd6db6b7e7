"""Validation of qsim against the real μSuite services and against μqSim (docs/qsim.md).

**The services** (default): each of Set Algebra and HDSearch is deployed once as ``musku
services`` deploys it (servers pinned to ``--server-cpus``, the load generator to
``--loadgen-cpus``) and measured in ``--rounds`` rounds (default 3), each interleaving the profile
(``musku qsim profile``'s low, higher and closed-loop windows, and its model), the real closed
loop (saturation; the capacity the servers got, from their own CPU time in /proc/PID/stat), and
the real open-loop p50/p99 at 10-100 % of that round's saturation, each next to the model on that
round's capacity (and on a whole core). Printed: per round a line, then medians and 95 % t
intervals over rounds of the real and model figures and of the errors, and whether the issue's
goals hold below 80 % of saturation (saturation +-10 %, p50 +-15 %, p99 +-25 %), judged on the
intervals. ``--quiet-host``: the defaults for a quiet multi-core host (no nice, 5 rounds, 10 s
points).

    PYTHONPATH=. python bench/qsim_validate.py [--services setalgebra,hdsearch] [--rounds 3]
        [--quick] [--nice N | --quiet-host --server-cpus 2 --loadgen-cpus 4-7] [--json F]

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
import math
import os
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


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Median over rounds and a 95 % t interval of the mean (mean +- t(n-1) sd / sqrt n); one
    round: no interval (both ends the value). NaNs (a saturated model point) are left out."""
    import statistics

    from scipy.stats import t

    v = [x for x in xs if not math.isnan(x)]
    if not v:
        return (float("nan"),) * 3
    med = statistics.median(v)
    if len(v) < 2:
        return med, med, med
    half = float(t.ppf(0.975, len(v) - 1)) * statistics.stdev(v) / math.sqrt(len(v))
    m = statistics.fmean(v)
    return med, m - half, m + half


def fmt_iv(iv: tuple[float, float, float], spec: str = ".0f", sign: bool = False) -> str:
    med, lo, hi = iv
    f = ("+" if sign else "") + spec
    return f"{med:{f}} [{lo:{f}}, {hi:{f}}]"


def verdict(iv: tuple[float, float, float], goal: float) -> str:
    """'met' when the whole interval of the error is within +-goal, 'NOT met' when it lies
    wholly outside, else 'undecided' (the rounds disagree)."""
    _, lo, hi = iv
    if -goal <= lo and hi <= goal:
        return "met"
    if lo > goal or hi < -goal:
        return "NOT met"
    return "undecided"


def _servers(dep: Any) -> list[Any]:
    return [dep.midtier, *dep.leaves]


def one_round(service: str, a: Any, tmp: Path, dep: Any, rnd: int) -> dict[str, Any]:
    """One round, interleaved in one deployment: the profile (low, high, deep windows) and its
    model; the real closed loop, with the capacity the servers got measured from their own CPU
    time (/proc/PID/stat over the wall time); the real open-loop points at fractions of that
    round's saturation, each next to the model on that round's capacity (and on a whole core)."""
    from musku.hostfs import HostFS
    from musku.qsim.profile import (
        context_switches,
        fitted_cpu_per_request_us,
        measure_deployment,
        model_cpu_per_request_us,
        model_wakeups_per_visit,
        proc_cpu_s,
        with_share,
        write_model,
    )
    from musku.services import runtime

    fs = HostFS(read_only=True)
    cpus = runtime.parse_cpus(a.server_cpus)
    lg = runtime.parse_cpus(a.loadgen_cpus)
    ncores = max(1, len(cpus or [0]))
    prof = measure_deployment(dep, qps=SERVICE_QPS[service], duration_s=a.profile_s,
                              threading="async-dispatch-block", pools=(1, 2, 1),
                              server_cpus=cpus, loadgen_cpus=lg, nice=a.nice,
                              deep_users=a.users, fs=fs)  # fmt: skip
    model_path = tmp / f"{service}-r{rnd}.toml"
    fit = write_model(prof, model_path)
    doc = load(model_path).engine
    fixed = fit.fixed_cpu_share
    tiers = _servers(dep)
    # the real closed loop: saturation, and the capacity the servers got (their own CPU time)
    spec = runtime.LoadSpec(mode="closed", duration_s=a.duration, warmup_s=1.0,
                            concurrency=a.users)  # fmt: skip
    for t in tiers:
        runtime.admin(t.address, "stats", "--reset")
    c0 = [proc_cpu_s(fs, t.pid) for t in tiers]
    w0 = [context_switches(fs, t.pid) for t in tiers]
    t0 = time.monotonic()
    real_sat = float(runtime.run_load(dep.midtier.address, service, dep.load_data, spec,
                                      cpus=lg)["total"]["achieved_qps"])  # fmt: skip
    wall = time.monotonic() - t0
    c1 = [proc_cpu_s(fs, t.pid) for t in tiers]
    w1 = [context_switches(fs, t.pid) for t in tiers]
    s1 = [runtime.admin(t.address, "stats") for t in tiers]
    dep.check_alive()
    used = sum(y - x for x, y in zip(c0, c1, strict=True))
    served = max(1, int(s1[0]["requests"]))
    real_cpu = used / served * 1e6
    # the capacity the servers got: their CPU per request (CPU time and requests over the same
    # span) times the rate the load generator measured in its window. Their CPU time over the
    # whole wall time would count the load generator's start (servers idle) as capacity lost.
    got = min(1.0, real_cpu * real_sat / 1e6 / ncores)
    sw = [(y - x) / max(1, int(st["requests"])) for x, y, st in zip(w0, w1, s1, strict=True)]
    sw_mid, sw_leaf = sw[0], sum(sw[1:]) / max(1, len(sw) - 1)
    whole_sim = simulate(_closed(doc, a.users, 10.0))
    whole = float(whole_sim["throughput_qps"])
    model_sat = float(simulate(_closed(with_share(doc, got, fixed), a.users, 10.0))
                      ["throughput_qps"])  # fmt: skip
    rec: dict[str, Any] = {
        "round": rnd, "profile_cpu_low_us": sum(prof.points[0].cpu_us),
        "profile_points": [q.__dict__ for q in prof.points], "fit": fit.__dict__,
        "share_got": got, "cpu_over_wall": used / wall / ncores, "real_saturation": real_sat,
        "model_saturation": model_sat,
        "whole_saturation": whole, "real_cpu_us": real_cpu,
        "model_cpu_us": model_cpu_per_request_us(whole_sim),
        "fit_cpu_us": fitted_cpu_per_request_us(prof, fit, real_sat, (sw_mid, sw_leaf)),
        "switches_mid": sw_mid, "switches_leaf": sw_leaf,
        "switches_low_mid": prof.points[0].switches[0],
        "switches_low_leaf": sum(prof.points[0].switches[1:]) / max(1, len(tiers) - 1),
        "model_wakeups_per_visit": model_wakeups_per_visit(doc, whole_sim),
        "background_pct": prof.background_cpu_pct, "points": [],
    }  # fmt: skip
    fr = FRACTIONS[::3] + [1.0] if a.quick else FRACTIONS
    for f in sorted(set(fr)):
        q = max(1.0, f * real_sat)
        spec = runtime.LoadSpec(qps=q, duration_s=a.duration, warmup_s=1.0)
        r = runtime.run_load(dep.midtier.address, service, dep.load_data, spec, cpus=lg)
        dep.check_alive()
        lat = r["total"]["latency_us"]
        dur = max(5.0, 10000 / q)
        m = simulate(with_overrides(with_share(doc, got, fixed), qps=q, duration_s=dur))
        w = simulate(with_overrides(doc, qps=q, duration_s=dur))
        sat = bool(m["saturated"]) or falls_behind(m, q)
        pt = {"fraction": f, "qps": q, "real_p50_us": float(lat["p50"]),
              "real_p99_us": float(lat["p99"]), "model_saturated": sat,
              "model_p50_us": float("nan") if sat else m["latency"]["p50_us"],
              "model_p99_us": float("nan") if sat else m["latency"]["p99_us"],
              "whole_p50_us": w["latency"]["p50_us"], "whole_p99_us": w["latency"]["p99_us"],
              "errors": int(r["total"].get("errors", 0))}  # fmt: skip
        rec["points"].append(pt)
    print(f"  round {rnd + 1}: capacity got {got * 100:.0f} %, saturation real {real_sat:.0f} / "
          f"model {model_sat:.0f} QPS, CPU per request real {real_cpu:.0f} / model "
          f"{rec['model_cpu_us']:.0f} us; wake-ups there per low-rate one: servers mid "
          f"{sw_mid / max(1e-9, rec['switches_low_mid']):.2f} leaf "
          f"{sw_leaf / max(1e-9, rec['switches_low_leaf']):.2f}, model "
          f"{rec['model_wakeups_per_visit']:.2f}", flush=True)  # fmt: skip
    return rec


def summarise(service: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and 95 % t intervals over rounds; the errors per round, then their interval."""

    def iv(key: str, scale: float = 1.0) -> tuple[float, float, float]:
        return interval([r[key] * scale for r in rounds])

    def err_iv(mkey: str, rkey: str) -> tuple[float, float, float]:
        return interval([_err(r[mkey], r[rkey]) for r in rounds])

    out: dict[str, Any] = {"service": service, "rounds": len(rounds), "per_round": rounds}
    out["share_got"] = iv("share_got", 100)
    out["saturation"] = {k: iv(k) for k in ("real_saturation", "model_saturation",
                                            "whole_saturation")}  # fmt: skip
    out["saturation_err"] = err_iv("model_saturation", "real_saturation")
    out["whole_saturation_err"] = err_iv("whole_saturation", "real_saturation")
    out["cpu"] = {k: iv(k) for k in ("real_cpu_us", "model_cpu_us", "fit_cpu_us")}
    out["cpu_err"] = err_iv("model_cpu_us", "real_cpu_us")
    out["fit_cpu_err"] = err_iv("fit_cpu_us", "real_cpu_us")
    out["switches"] = {k: iv(k) for k in ("switches_mid", "switches_leaf")}
    out["wakeup_ratio"] = {
        "mid": interval([r["switches_mid"] / max(1e-9, r["switches_low_mid"]) for r in rounds]),
        "leaf": interval([r["switches_leaf"] / max(1e-9, r["switches_low_leaf"]) for r in rounds]),
        "model": iv("model_wakeups_per_visit"),
    }
    pts = []
    for i, first in enumerate(rounds[0]["points"]):
        per = [r["points"][i] for r in rounds if i < len(r["points"])]
        row: dict[str, Any] = {"fraction": first["fraction"],
                               "qps": interval([p["qps"] for p in per]),
                               "model_saturated_rounds": sum(p["model_saturated"] for p in per)}  # fmt: skip
        for pc in ("p50", "p99"):
            for k in ("real", "model", "whole"):
                row[f"{k}_{pc}"] = interval([p[f"{k}_{pc}_us"] / 1e3 for p in per])
            row[f"err_{pc}"] = interval([_err(p[f"model_{pc}_us"], p[f"real_{pc}_us"])
                                         for p in per])  # fmt: skip
            row[f"whole_err_{pc}"] = interval([_err(p[f"whole_{pc}_us"], p[f"real_{pc}_us"])
                                               for p in per])  # fmt: skip
        pts.append(row)
    out["points"] = pts
    return out


def print_summary(s: dict[str, Any]) -> None:
    n = s["rounds"]
    print(f"\n{s['service']}: {n} rounds; median [95 % t interval of the mean] over rounds")
    sat = s["saturation"]
    print(f"  capacity the servers got in the closed loop (their CPU time / wall): "
          f"{fmt_iv(s['share_got'])} % of the server CPU")  # fmt: skip
    print(f"  saturation: real {fmt_iv(sat['real_saturation'])} QPS; model on the capacity "
          f"got {fmt_iv(sat['model_saturation'])} (error {fmt_iv(s['saturation_err'], '.1f', True)}"
          f" %); on a whole core {fmt_iv(sat['whole_saturation'])} "
          f"({fmt_iv(s['whole_saturation_err'], '.1f', True)} %)")  # fmt: skip
    cpu = s["cpu"]
    print(f"  CPU per request at saturation: real {fmt_iv(cpu['real_cpu_us'])} us; model "
          f"{fmt_iv(cpu['model_cpu_us'])} ({fmt_iv(s['cpu_err'], '.1f', True)} %); the fit with "
          f"the switches measured there {fmt_iv(cpu['fit_cpu_us'])} "
          f"({fmt_iv(s['fit_cpu_err'], '.1f', True)} %)")  # fmt: skip
    sw = s["switches"]
    wr = s["wakeup_ratio"]
    print(f"  context switches per request there: mid-tier {fmt_iv(sw['switches_mid'], '.2f')}, "
          f"a leaf {fmt_iv(sw['switches_leaf'], '.2f')}; per the profile's low-rate one: "
          f"mid-tier {fmt_iv(wr['mid'], '.2f')}, leaf {fmt_iv(wr['leaf'], '.2f')}; the model's "
          f"wake-ups per visit {fmt_iv(wr['model'], '.2f')}")  # fmt: skip
    print("  (ms; model = on the capacity the servers got that round; err = per-round error)")
    print(f"  {'load':>4} {'qps':>6} | {'real p50':>18} {'model p50':>18} {'err %':>20} | "
          f"{'real p99':>20} {'model p99':>20} {'err %':>20} | whole-core err % p50, p99")  # fmt: skip
    for p in s["points"]:
        sat_note = (f"  model saturated in {p['model_saturated_rounds']}/{n}"
                    if p["model_saturated_rounds"] else "")  # fmt: skip
        print(f"  {p['fraction'] * 100:>3.0f}% {p['qps'][0]:>6.0f} | "
              f"{fmt_iv(p['real_p50'], '.2f'):>18} {fmt_iv(p['model_p50'], '.2f'):>18} "
              f"{fmt_iv(p['err_p50'], '.0f', True):>20} | {fmt_iv(p['real_p99'], '.1f'):>20} "
              f"{fmt_iv(p['model_p99'], '.1f'):>20} {fmt_iv(p['err_p99'], '.0f', True):>20} | "
              f"{p['whole_err_p50'][0]:+.0f}, {p['whole_err_p99'][0]:+.0f}{sat_note}")  # fmt: skip
    below = [p for p in s["points"] if p["fraction"] < 0.8 - 1e-9]
    for label, pre, serr in (("the capacity got", "", s["saturation_err"]),
                             ("a whole core", "whole_", s["whole_saturation_err"])):  # fmt: skip
        parts = [f"saturation {fmt_iv(serr, '.1f', True)} % ({verdict(serr, GOALS['saturation'])})"]
        for pc in ("p50", "p99"):
            ivs = [p[f"{pre}err_{pc}"] for p in below if not math.isnan(p[f"{pre}err_{pc}"][0])]
            if not ivs:
                parts.append(f"{pc}: no unsaturated point")
                continue
            worst = max(ivs, key=lambda v: abs(v[0]))
            vs = [verdict(v, GOALS[pc]) for v in ivs]
            v = "NOT met" if "NOT met" in vs else "undecided" if "undecided" in vs else "met"
            parts.append(f"{pc} worst {fmt_iv(worst, '.1f', True)} % (goal {GOALS[pc]:.0f}: {v})")
        s[f"goals_{pre or 'share_'}"] = parts
        print(f"  below 80 % of saturation, model on {label}: " + "; ".join(parts))


def validate_service(service: str, a: Any, tmp: Path) -> dict[str, Any]:
    """One deployment; ``a.rounds`` rounds, each the profile and the real points interleaved."""
    from musku.services import runtime

    cpus = runtime.parse_cpus(a.server_cpus)
    print(f"\n{service}: servers on CPU {a.server_cpus}, load generator on CPU {a.loadgen_cpus} "
          f"(nice {a.nice}); {a.rounds} rounds, {a.duration:g} s per real point, profile "
          f"{a.profile_s:g} s; load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    with runtime.deploy(service, workdir=tmp / service, data_dir=a.data_dir
                        or runtime.default_data_dir(), server_cpus=cpus) as dep:  # fmt: skip
        rounds = [one_round(service, a, tmp, dep, r) for r in range(a.rounds)]
    s = summarise(service, rounds)
    print_summary(s)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uqsim", help="μqSim binary built from its public source: compare with it")
    ap.add_argument("--services", default="setalgebra,hdsearch")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--loadgen-cpus", default="1")
    ap.add_argument("--quiet-host", action="store_true",
                    help="a quiet multi-core host: no nice, 5 rounds of 10 s points, a 10 s "
                         "profile (each still overridable)")  # fmt: skip
    ap.add_argument("--nice", type=int, default=None,
                    help="nice value of this bench, so of the servers and the load generator "
                         "(default -10 on a shared machine, 0 with --quiet-host)")  # fmt: skip
    ap.add_argument("--users", type=int, default=32, help="closed-loop users for saturation")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per service, each the profile and the real points interleaved "
                         "(default 3, 5 with --quiet-host)")  # fmt: skip
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per real point (default 4, 10 with --quiet-host)",
    )
    ap.add_argument(
        "--profile-s",
        type=float,
        default=None,
        help="seconds of the profile's low-rate window (default 8, 10 quiet)",
    )
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--quick", action="store_true", help="4 loads instead of 10")
    a = ap.parse_args(argv)
    q = a.quiet_host
    a.nice = a.nice if a.nice is not None else (0 if q else -10)
    a.rounds = a.rounds if a.rounds is not None else (5 if q else 3)
    a.duration = a.duration if a.duration is not None else (10.0 if q else 4.0)
    a.profile_s = a.profile_s if a.profile_s is not None else (10.0 if q else 8.0)
    if not a.uqsim:
        bad = [f"--{k} must be positive" for k, v in (("rounds", a.rounds), ("duration",
               a.duration), ("profile-s", a.profile_s), ("users", a.users)) if not v > 0]  # fmt: skip
        if bad:
            print(f"qsim_validate: {bad[0]}", file=sys.stderr)
            return 2
        if a.nice:  # the load generator and the servers inherit it (the machine is shared)
            os.setpriority(os.PRIO_PROCESS, 0, a.nice)
        load = os.getloadavg()[0]
        ncpu = os.cpu_count() or 1
        print(f"qsim against the real services; load average {load:.1f} on {ncpu} CPUs at the "
              f"start" + (" (a quiet host)" if q else " (a shared machine: other builds and "
                          "tests run beside this)"))  # fmt: skip
        if q and load > 0.25 * ncpu:
            print(f"warning: --quiet-host, but the load average is {load:.1f} on {ncpu} CPUs")
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
