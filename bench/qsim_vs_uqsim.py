"""μqSim's own example architectures, imported, side by side with μqSim (docs/qsim.md,
"Importing μqSim"): mean and p99 per architecture and load, both engines in the same run on the
same machine, in alternating rounds; qsim's p50 and the saturation point of each.

    python bench/qsim_vs_uqsim.py [--uqsim PATH] [--mirror GITDIR] [--arch NAME ...]
                                  [--duration S] [--rounds N] [--engines uqsim,qsim] [--log FILE]

Without ``--uqsim``, μqSim is built from the mirror's source with ``g++ -std=c++11 -O2`` into a
temporary directory. Each architecture's files come from the mirror (μqSim's repository has no
licence: nothing of it is copied into musku). μqSim runs a copy of the directory whose
``client.json`` holds one epoch of ``--duration`` seconds at the rate (its monitor interval
beyond the end, so it never waits for a power-manager decision); qsim runs the imported model
at the same rate and duration (``--duration`` or long enough for ``--min-requests``). μqSim
prints its mean and p99 only (no p50). Saturation: the
lowest rate whose mean exceeds 5x the lowest rate's (the rule of bench/qsim_validate.py).
qsim runs the paths and code paths with the shares μqSim's draw gives them (first choice +1
point, last -1: ``uqsim_choice``), unless ``--written-weights``.

Each row gives the mean over the rounds with its 95 % Student t interval over rounds (each
μqSim run is seeded from the clock, each qsim run with seed = round + 1, so rounds are
independent). The μqSim built here also prints its p50 and p99.9 (a print added after its own
p99 print, the same sorted vector, nothing else changed); a ``--uqsim`` binary that does not print
them shows "-". ``--log FILE`` appends one JSON line per run (engine, architecture, rate,
duration, round, figures), so long runs can be split over several invocations (``--engines``)
and summarised together (``--summarise FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from musku.qsim.engine import simulate  # noqa: E402
from musku.qsim.model import load, with_overrides  # noqa: E402
from musku.qsim.uqsim import convert  # noqa: E402

MIRROR = "/work/.mirror/zyqCSL+uqsim-power-management-beta/repo/.git"

# rates (req/s) per architecture: low, middle, near the client.json's own rate
RATES: dict[str, list[float]] = {
    "architecture/2tier/json": [20000, 60000, 80000],
    "architecture/3tier/json": [500, 1500, 3500],
    "architecture/nginx_fanout/json": [2000, 6000, 10000],
    "architecture/fannout_synthetic_50/json": [1000, 4000, 8000],
    "architecture/thrift_helloworld/json": [20000, 50000, 80000],
    "architecture/thrift_app/json": [300, 900, 1500],
    "architecture/fanout_2tier": [20000, 60000, 100000],
}


def git(mirror: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True,
                          check=True, timeout=120).stdout  # fmt: skip


def extract(mirror: str, path: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    tar = git(mirror, "archive", "HEAD", path)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True, timeout=120)
    return dest / path


# μqSim's Thread::enqueue walks a request back past every queued request whose time is not
# earlier than its own, so a batch's requests (all of one time) enter the next stage newest first
# (docs/qsim.md "Near saturation"); with <= they keep their order.
TIE = "(*itr)->waitReq() && (*itr)->time < j->time) ) {"
TIE_FIFO = "(*itr)->waitReq() && (*itr)->time <= j->time) ) {"


# After μqSim's p99 print (client.cc, Client::show), one more line with p50, p99 and p99.9 from the
# same records (JobTimeRecords' sorted vector, at index floor(q n), as its own p99).
SHOW = "\t\tTime avg_lat = respTimeRecords->getAvgLat();"
STATS = (
    '\t\tfor(double q: {0.5, 0.99, 0.999}) std::cout << "STATS q=" << q << " ns=" << '
    "respTimeRecords->getPctLat(q) << std::endl;\n"
)
PCT_DECL = "\t\tTime getTailLat();"
PCT_DEF = (
    "\nTime\nJobTimeRecords::getPctLat(double q) {\n\tif(jobComplTime.size() == 0)\n"
    "\t\treturn INVALID_TIME;\n\tstd::sort(jobComplTime.begin(), jobComplTime.end());\n"
    "\treturn jobComplTime[size_t(q * jobComplTime.size())];\n}\n"
)


def patch(path: Path, old: str, new: str) -> None:
    text = path.read_bytes().decode()
    if text.count(old) != 1:
        raise RuntimeError(f"μqSim's {path.name}: the line to patch is not there")
    path.write_bytes(text.replace(old, new).encode())


def build(mirror: str, tmp: Path, fifo_ties: bool = False) -> str:
    src = extract(mirror, "src", tmp / "uqsim")
    patch(src / "client.cc", SHOW, STATS + SHOW)
    patch(src / "job.hh", PCT_DECL, PCT_DECL + "\n\t\tTime getPctLat(double q);")
    (src / "job.cc").write_bytes((src / "job.cc").read_bytes() + PCT_DEF.encode())
    if fifo_ties:
        patch(src / "thread.cc", TIE, TIE_FIFO)
    extract(mirror, "jsoncpp", tmp / "uqsim")
    exe = tmp / "microsim"
    cc = sorted(str(p) for p in src.glob("*.cc"))
    subprocess.run(["g++", "-std=c++11", "-O2", "-w", *cc,
                    str(tmp / "uqsim" / "jsoncpp" / "jsoncpp.cpp"), "-o", str(exe)],
                   check=True, timeout=3600)  # fmt: skip
    return str(exe)


def uqsim(exe: str, arch: Path, work: Path, qps: float, duration: float) -> dict[str, float]:
    """One μqSim run: a copy of ``arch`` whose client runs ``qps`` for ``duration`` s."""
    run = work / "arch"
    subprocess.run(["rm", "-rf", str(run)], check=True)
    subprocess.run(["cp", "-r", str(arch), str(run)], check=True)
    (run / "client.json").write_text(json.dumps({
        "monitor_interval_sec": duration * 100, "epoch_qps": [int(qps)],
        "epoch_end_sec": [duration]}))  # fmt: skip
    (work / "sched_test").mkdir(exist_ok=True)
    t0 = os.times()
    p = subprocess.run([exe, str(run), "100", "65", "expo", "0"], capture_output=True,
                       text=True, timeout=7200, cwd=work)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"μqSim exits with status {p.returncode} on {arch.name}")
    out = p.stdout
    t1 = os.times()
    vals: dict[str, float] = {"cpu_s": t1.children_user - t0.children_user}
    for line in out.splitlines():
        if "tail lat" in line:
            vals["p99_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
        if "average lat" in line:
            vals["mean_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
        if line.endswith(tuple("0123456789")) and " cpu util = " in line:
            name, util = line.split(" cpu util = ")
            if not name.startswith("net_stack"):  # μqSim does not count its stacks' time (0)
                vals[f"util_{name}"] = float(util)
        if line.startswith("STATS q="):
            q, ns = (f.split("=")[1] for f in line.split()[1:3])
            vals[{"0.5": "p50_us", "0.99": "p99_us", "0.999": "p999_us"}[q]] = float(ns) / 1000
    return vals


def qsim(
    model: Path, qps: float, duration: float, seed: int, in_order: bool = False
) -> dict[str, Any]:
    doc = with_overrides(load(model).engine, qps=qps, duration_s=duration, seed=seed)
    if in_order:  # the engine's plain order, not μqSim's (docs/qsim.md "Near saturation")
        for svc in doc["services"]:
            for st in svc["stages"]:
                st.pop("handoff", None)
    r = simulate(doc)
    lat = r["latency"]
    return {"mean_us": lat["mean_us"], "p50_us": lat["p50_us"], "p99_us": lat["p99_us"],
            "p999_us": lat.get("p999_us", float("nan")),
            "saturated": bool(r.get("saturated")),
            **{f"util_{k}": v["thread_util"] for k, v in r.get("services", {}).items()
               if not k.startswith("net_")}}  # fmt: skip


nan = float("nan")
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def ci(xs: list[float]) -> tuple[float, float]:
    """Mean over runs and the half-width of its 95 % Student t interval (nan for one run)."""
    xs = [x for x in xs if x == x]
    if not xs:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5


def fmt(xs: list[float]) -> str:
    m, h = ci(xs)
    if m != m:
        return "-"
    return f"{m:.0f}" if h != h else f"{m:.0f} ({m - h:.0f}-{m + h:.0f})"


def saturation(rates: list[float], means: list[float]) -> str:
    for q, m in zip(rates, means, strict=True):
        if m > 5 * means[0]:
            return f"{q:g}"
    return f"> {rates[-1]:g}"


def summarise(runs: list[dict[str, Any]]) -> None:
    """The per-rate table over every logged run: mean [95 % t interval over runs] per engine."""
    keys = sorted({(r["arch"], r["qps"]) for r in runs})
    print(f"{'architecture':<22} {'qps':>7} {'runs':>5}  {'':<6} {'mean us':<20} {'p50 us':<20}"
          f" {'p99 us':<22} {'p99.9 us':<22}")  # fmt: skip
    for arch, q in keys:
        by = {e: [r for r in runs if (r["arch"], r["qps"], r["engine"]) == (arch, q, e)]
              for e in ("uqsim", "qsim")}  # fmt: skip
        for e, rs in by.items():
            if not rs:
                continue
            name = "μqSim" if e == "uqsim" else "qsim"
            cols = [fmt([r.get(k, float("nan")) for r in rs])
                    for k in ("mean_us", "p50_us", "p99_us", "p999_us")]  # fmt: skip
            dur = sorted({r["duration_s"] for r in rs})
            utils = sorted({k for r in rs for k in r if k.startswith("util_")})
            util = ", ".join(f"{k[5:]} {ci([r.get(k, nan) for r in rs])[0]:.4f} +- {ci([r.get(k, nan) for r in rs])[1]:.4f}"
                             for k in utils)  # fmt: skip
            print(f"{arch.removeprefix('architecture/'):<22} {q:>7g} {len(rs):>5}  {name:<6}"
                  f" {cols[0]:<20} {cols[1]:<20} {cols[2]:<22} {cols[3]:<22}"
                  f" {','.join(f'{d:g}' for d in dur)} s")  # fmt: skip
            if util:
                print(f"{'':<36} utilisation: {util}")
        if by["uqsim"] and by["qsim"]:
            ratio = [ci([r[k] for r in by["qsim"]])[0] / ci([r[k] for r in by["uqsim"]])[0] - 1
                     for k in ("mean_us", "p99_us")]  # fmt: skip
            print(
                f"{'':<22} {'':>7} {'':>5}  qsim vs μqSim: mean {ratio[0]:+.1%}, p99 {ratio[1]:+.1%}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uqsim", help="μqSim binary (default: build it from the mirror)")
    ap.add_argument("--mirror", default=os.environ.get("MUSKU_UQSIM_MIRROR", MIRROR))
    ap.add_argument("--arch", action="append", help="architecture path(s) (default: all below)")
    ap.add_argument("--rates", help="comma-separated rates for every --arch (default: per arch)")
    ap.add_argument(
        "--duration", type=float, default=1.0, help="simulated seconds per run, at least"
    )
    ap.add_argument(
        "--min-requests",
        type=float,
        default=10000,
        help="run long enough for this many requests (low rates, rare slow paths)",
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--uqsim-fifo-ties",
        action="store_true",
        help="when building μqSim: a batch's requests first come, first served (<= in Thread::enqueue)",
    )
    ap.add_argument(
        "--in-order",
        action="store_true",
        help="qsim hands a finished batch on in batch order, not in μqSim's (handoff)",
    )
    ap.add_argument(
        "--written-weights",
        action="store_true",
        help="qsim with the written path weights, not the shares μqSim's draw gives",
    )
    ap.add_argument("--engines", default="uqsim,qsim", help="run only these (uqsim, qsim)")
    ap.add_argument("--log", help="append one JSON line per run to this file")
    ap.add_argument("--seed0", type=int, default=1, help="qsim's first seed (round r: seed0 + r)")
    ap.add_argument("--summarise", metavar="LOG", help="print the table of a --log file and exit")
    a = ap.parse_args()
    if a.summarise:
        summarise([json.loads(x) for x in Path(a.summarise).read_text().splitlines() if x.strip()])
        return
    engines = set(a.engines.split(","))
    archs = a.arch or list(RATES)
    with tempfile.TemporaryDirectory(prefix="qsim-vs-uqsim-") as t:
        tmp = Path(t)
        exe = (
            str(Path(a.uqsim).resolve())
            if a.uqsim
            else ("" if "uqsim" not in engines else build(a.mirror, tmp, a.uqsim_fifo_ties))
        )
        logged: list[dict[str, Any]] = []
        print(f"μqSim: {exe}; runs of {a.duration:g} simulated s or {a.min_requests:g} requests "
              f"(the longer), {a.rounds} alternating rounds, medians")  # fmt: skip
        print(f"{'architecture':<40} {'qps':>7} {'μqSim mean':>10} {'qsim mean':>9} {'err':>7}"
              f" {'qsim p50':>8} {'μqSim p99':>9} {'qsim p99':>8} {'err':>7}")  # fmt: skip
        table = []
        for arch in archs:
            d = extract(a.mirror, arch, tmp / "src")
            model = tmp / (arch.replace("/", "_") + ".toml")
            convert(d, model, as_uqsim_draws=not a.written_weights)
            rates = [float(x) for x in a.rates.split(",")] if a.rates else RATES.get(arch, [1000.0])
            um: list[float] = []
            qm: list[float] = []
            try:
                if "uqsim" in engines:
                    uqsim(exe, d, tmp, rates[0], 0.01)
            except RuntimeError as e:  # e.g. fanout_2tier: μqSim's own later layout
                print(f"{arch.removeprefix('architecture/'):<40} {e}", flush=True)
                continue
            for q in rates:
                dur = max(a.duration, a.min_requests / q)
                u: list[dict[str, float]] = []
                s: list[dict[str, Any]] = []
                for rnd in range(a.rounds):  # alternate which engine goes first
                    for first in ("uqsim", "qsim") if rnd % 2 == 0 else ("qsim", "uqsim"):
                        if first not in engines:
                            continue
                        if first == "uqsim":
                            u.append(uqsim(exe, d, tmp, q, dur))
                        else:
                            s.append(qsim(model, q, dur, a.seed0 + rnd, a.in_order))
                        rec = {"engine": first, "arch": arch, "qps": q, "duration_s": dur,
                               "round": rnd, **(u[-1] if first == "uqsim" else s[-1])}  # fmt: skip
                        logged.append(rec)
                        if a.log:
                            with open(a.log, "a") as f:
                                f.write(json.dumps(rec) + "\n")
                if not (u and s):
                    continue
                row = {k: statistics.median(x[k] for x in u) for k in ("mean_us", "p99_us")}
                qrow = {
                    k: statistics.median(x[k] for x in s) for k in ("mean_us", "p50_us", "p99_us")
                }
                um.append(row["mean_us"])
                qm.append(qrow["mean_us"])
                err_m = qrow["mean_us"] / row["mean_us"] - 1
                err_p = qrow["p99_us"] / row["p99_us"] - 1
                up = sorted(x["p99_us"] for x in u)
                sp = sorted(x["p99_us"] for x in s)
                print(f"{arch.removeprefix('architecture/'):<40} {q:>7g} {row['mean_us']:>10.1f}"
                      f" {qrow['mean_us']:>9.1f} {err_m:>+7.1%} {qrow['p50_us']:>8.1f}"
                      f" {row['p99_us']:>9.1f} {qrow['p99_us']:>8.1f} {err_p:>+7.1%}"
                      f"  μqSim p99 {up[0]:.0f}-{up[-1]:.0f}, qsim {sp[0]:.0f}-{sp[-1]:.0f}",
                      flush=True)  # fmt: skip
            if um and qm:
                table.append((arch, saturation(rates, um), saturation(rates, qm)))
        if table:
            print("\nsaturation (mean > 5x the lowest rate's):")
        for arch, su, sq in table:
            print(f"  {arch.removeprefix('architecture/'):<40} μqSim {su:>8}  qsim {sq:>8}")
        if a.rounds > 1:
            print(f"\nmean over runs (95 % t interval over {a.rounds} runs):")
            summarise(logged)


if __name__ == "__main__":
    main()
