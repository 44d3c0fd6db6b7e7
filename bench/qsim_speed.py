"""Speed of the qsim engine: simulated requests and events per CPU-second (docs/qsim.md).

Models: a 2-tier service (web front end with an epoll loop -> cache with a batching poll, a
socket read, a lookup and a send, each machine's network stack explicit) and a fan-out of
``--leaves`` leaves. Both are written as μqSim architecture directories from our own parameters
and imported with ``musku qsim import-uqsim``, so with ``--uqsim PATH`` (a μqSim binary built from
its public source) the *same* input runs through μqSim too, side by side in the same run. A
third model is the plain fan-out (no network stacks) the issue's "100,000 requests through a
1,000-leaf fan-out" goal is measured on. CPU time is the child process's user + system time
(os.wait4), whole process: parsing, set-up and simulation. Memory: the engine's own peak RSS
(VmHWM, which the engine reports; a parent's wait4 maxrss would carry the Python parent's size
over fork and exec) for the 2-tier model at 1x and 10x the requests (bounded by the live state,
it should not grow).

The engine's progress reporting (``--progress``, one look at the clock every 65,536 events)
is priced on the 2-tier model: CPU with it over CPU without it, and with ``--baseline-engine``
against an engine built without it. The CLI's own overhead is ``musku qsim run`` on a
100-request model minus the engine alone on the same document (docs/qsim.md "Speed").

    PYTHONPATH=. python bench/qsim_speed.py [--uqsim /work/peers/uqsim/microsim] [--quick]
        [--rounds N] [--baseline-engine PATH] [--only cli|progress|ratio] [--baseline-tree PATH]

``--only ratio`` prints the per-round ratios of requests per CPU-second, this engine over μqSim
(``--uqsim``) and over a baseline engine binary (``--baseline-engine``), on the imported 2-tier
and fan-out, the three run in alternating rounds (``--rounds``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from musku.qsim.engine import binary
from musku.qsim.model import load, with_overrides
from musku.qsim.uqsim import convert, write_example

PLAIN_FANOUT = """\
[run]
duration_s = 1e6
warmup_s = 0.01
max_live_requests = 1000000
max_live_jobs = 100000000

[network]
latency_us = 20

[[machines]]
name = "m"
cores = 4

[[services]]
name = "root"
execution = "simple"
threads = 64
  [[services.stages]]
  name = "fan"
  time = {{ dist = "const", mean_us = 5 }}

[[services]]
name = "leaf"
execution = "simple"
instances = {leaves}
  [[services.stages]]
  name = "work"
  time = {{ dist = "exp", mean_us = 100 }}

[[paths]]
  [[paths.nodes]]
  name = "root"
  service = "root"
  children = ["leaf"]
  [[paths.nodes]]
  name = "leaf"
  service = "leaf"
  copies = {leaves}
  children = ["join"]
  [[paths.nodes]]
  name = "join"
  service = "root"
  gather = true

[client]
qps = 4000
"""


def run_timed(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[str, float, int]:
    """stdout, CPU seconds (user + sys) and peak RSS (KiB) of one child (wait4: its own, with
    the children it waited for)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} failed ({proc.returncode}): {err.read().decode()[-500:]}"
            )
        return out.read().decode(), ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def ours(doc: dict[str, Any], tmp: Path, name: str) -> dict[str, Any]:
    f = tmp / f"{name}.json"
    f.write_text(json.dumps(doc))
    out, cpu, rss = run_timed([str(binary()), str(f)])
    r: dict[str, Any] = json.loads(out)
    r["proc_cpu_s"] = cpu
    r["rss_kib"] = r.get("peak_rss_kib") or rss
    return r


def uqsim(path: str, arch: Path, tmp: Path) -> dict[str, Any]:
    (tmp / "sched_test").mkdir(exist_ok=True)
    out, cpu, rss = run_timed([path, str(arch), "100", "65", "expo", "0"], cwd=tmp)
    vals: dict[str, Any] = {"proc_cpu_s": cpu, "rss_kib": rss}
    for line in out.splitlines():
        if line.startswith("numTotal"):
            vals["requests"] = int(line.split("=")[1])
        if "tail lat" in line:
            vals["p99_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
        if "average lat" in line:
            vals["mean_us"] = float(line.split("=")[1].split("ms")[0]) * 1000
    return vals


TINY = """\
[run]
duration_s = 0.1
warmup_s = 0.01
seed = 3

[[machines]]
name = "m"
cores = 1

[[services]]
name = "server"
execution = "simple"
  [[services.stages]]
  name = "work"
  time = { dist = "exp", mean_us = 10 }

[[paths]]
  [[paths.nodes]]
  name = "only"
  service = "server"

[client]
qps = 1000
"""


CONSOLE_SCRIPT = "import sys; from musku.entry import main; sys.argv[0] = 'musku'; main()"
"""What pip's ``musku`` console script runs (``python -m musku`` adds runpy's imports)."""


def cli_overhead(
    tmp: Path, rounds: int, baseline_tree: str | None = None
) -> tuple[tuple[float, float, float], tuple[float, float, float] | None]:
    """The ``musku qsim run`` CLI's own CPU time on a tiny model (100 requests): the whole
    command (Python and the engine, wait4) minus the engine alone on the same document, in
    alternating rounds; (median overhead, lowest, highest) CPU-s, for this tree and, when
    ``baseline_tree`` (a checkout of an earlier commit) is given, for that one in the same
    rounds."""
    model = tmp / "tiny.toml"
    model.write_text(TINY)
    (tmp / "tiny.json").write_text(json.dumps(load(model).engine))
    cli = [
        sys.executable,
        "-c",
        CONSOLE_SCRIPT,
        "qsim",
        "run",
        str(model),
        "--format",
        "json",
        "-q",
    ]
    # as installed: compiled bytecode cached (here under tmp), so no round compiles musku's
    # sources (PYTHONDONTWRITEBYTECODE=1 would make every call pay for that)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    env["MUSKU_CACHE_DIR"] = str(tmp / "cache")
    trees = {"this": dict(env, PYTHONPATH=str(Path(__file__).resolve().parents[1]))}
    if baseline_tree:
        trees["baseline"] = dict(env, PYTHONPATH=baseline_tree)
    for e in trees.values():
        run_timed(cli, cwd=tmp, env=e)  # warms the bytecode and model caches (cwd: not a tree)
    diffs: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(rounds):
        _, alone, _ = run_timed([str(binary()), str(tmp / "tiny.json")])
        for k, e in trees.items():
            _, whole, _ = run_timed(cli, cwd=tmp, env=e)
            diffs[k].append(whole - alone)
    out = {k: (sorted(v)[len(v) // 2], min(v), max(v)) for k, v in diffs.items()}
    return out["this"], out.get("baseline")


def progress_cost(doc: dict[str, Any], tmp: Path, rounds: int, baseline: str | None) -> str:
    """CPU of the engine on ``doc`` with ``--progress`` (a line every 0.25 s) against without
    it, and against a ``baseline`` engine binary (e.g. one built before progress reporting),
    alternating rounds; medians of the per-round ratios."""
    f = tmp / "progress.json"
    f.write_text(json.dumps(doc))
    plain = [str(binary()), str(f)]
    on: list[float] = []
    base: list[float] = []
    for _ in range(rounds):
        _, off_s, _ = run_timed(plain)
        _, on_s, _ = run_timed([*plain, "--progress"])
        on.append(on_s / off_s)
        if baseline:
            _, b_s, _ = run_timed([baseline, str(f)])
            base.append(off_s / b_s)
    on.sort()
    text = (
        f"progress reporting: engine CPU with --progress / without, median of {rounds} rounds "
        f"{on[len(on) // 2]:.3f} (range {on[0]:.3f}-{on[-1]:.3f})"
    )
    if base:
        base.sort()
        text += (
            f"; this engine without --progress / {baseline}: {base[len(base) // 2]:.3f} "
            f"(range {base[0]:.3f}-{base[-1]:.3f})"
        )
    return text


def ratios(a: argparse.Namespace, tmp: Path) -> list[str]:
    """The issue's speed figure: this engine's requests per CPU-second over μqSim's on the same
    imported 2-tier and fan-out, in alternating rounds (this engine, μqSim, then the baseline
    engine if given), so that the machine's load moves all of them alike; per-round ratios."""
    dur = a.requests / a.qps
    arch2 = write_example(tmp / "2tier", "2tier", qps=a.qps, duration_s=dur)
    convert(arch2, tmp / "2tier.toml")
    f2 = tmp / "r2tier.json"
    f2.write_text(json.dumps(load(tmp / "2tier.toml").engine))
    nf, fq = a.uqsim_fanout_requests, 500.0
    archf = write_example(tmp / "fan", "fanout", qps=fq, duration_s=nf / fq, leaves=a.leaves)
    convert(archf, tmp / "fan.toml")
    ff = tmp / "rfan.json"
    ff.write_text(json.dumps(load(tmp / "fan.toml").engine))
    lines = []
    for name, doc, arch in (("2-tier (imported)", f2, arch2),
                            (f"{a.leaves}-leaf fan-out (imported)", ff, archf)):  # fmt: skip
        vs_u: list[float] = []
        vs_b: list[float] = []
        base_u: list[float] = []  # the baseline engine over μqSim, the same round
        for _ in range(a.rounds):
            out, cpu, _ = run_timed([str(binary()), str(doc)])
            ours_rate = json.loads(out)["completed"] / cpu
            u_rate = 0.0
            if a.uqsim:
                u = uqsim(a.uqsim, arch, tmp)
                u_rate = u["requests"] / u["proc_cpu_s"]
                vs_u.append(ours_rate / u_rate)
            if a.baseline_engine:
                out, cpu, _ = run_timed([a.baseline_engine, str(doc)])
                b_rate = json.loads(out)["completed"] / cpu
                vs_b.append(ours_rate / b_rate)
                if u_rate:
                    base_u.append(b_rate / u_rate)
        for what, v in (
            ("μqSim", vs_u),
            (a.baseline_engine, vs_b),
            (f"μqSim, for {a.baseline_engine}", base_u),
        ):
            if v:
                v.sort()
                who = "the baseline" if what.startswith("μqSim, for") else "this engine"
                lines.append(f"{name}: {who} / {what}, requests per CPU-s, "
                             f"{a.rounds} rounds: median {v[len(v) // 2]:.2f}x "
                             f"(range {v[0]:.2f}-{v[-1]:.2f}; {', '.join(f'{x:.2f}' for x in v)})")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uqsim", help="μqSim binary (built from its public source) to compare with")
    ap.add_argument("--requests", type=int, default=200_000, help="2-tier requests")
    ap.add_argument("--qps", type=float, default=20_000, help="2-tier load")
    ap.add_argument("--leaves", type=int, default=1000)
    ap.add_argument("--fanout-requests", type=int, default=100_000, help="plain fan-out requests")
    ap.add_argument("--uqsim-fanout-requests", type=int, default=400)
    ap.add_argument("--quick", action="store_true", help="a tenth of the requests")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the CLI and progress lines")
    ap.add_argument(
        "--baseline-engine",
        help="an engine binary to compare with (the progress check's cost; --only ratio)",
    )
    ap.add_argument(
        "--baseline-tree",
        help="a checkout of an earlier commit: its CLI overhead measured in the same rounds",
    )
    ap.add_argument(
        "--only",
        choices=("cli", "progress", "ratio"),
        help="only the CLI overhead line, the progress cost line, or the per-round speed ratios "
        "against --uqsim and --baseline-engine",
    )
    a = ap.parse_args()
    if a.only:
        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td)
            if a.only == "ratio":
                if a.quick:
                    a.requests //= 10
                for line in ratios(a, tmp):
                    print(line)
            elif a.only == "cli":
                (med, lo, hi), base = cli_overhead(tmp, a.rounds, a.baseline_tree)
                print(f"CLI overhead of musku qsim run (tiny model): {med:.3f} CPU-s median of "
                      f"{a.rounds} rounds (range {lo:.3f}-{hi:.3f}; goal <= 0.1)")  # fmt: skip
                if base is not None:
                    print(f"  baseline {a.baseline_tree}, same rounds: {base[0]:.3f} CPU-s "
                          f"(range {base[1]:.3f}-{base[2]:.3f}); this / baseline "
                          f"{med / base[0]:.2f}")  # fmt: skip
            else:
                arch = write_example(
                    tmp / "2tier", "2tier", qps=a.qps, duration_s=a.requests / a.qps
                )
                convert(arch, tmp / "2tier.toml")
                doc = load(tmp / "2tier.toml").engine
                print(progress_cost(doc, tmp, a.rounds, a.baseline_engine))
            print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return 0
    if a.quick:
        a.requests //= 10
        a.fanout_requests //= 10
    rows: list[tuple[str, str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        # --- 2-tier, side by side
        dur = a.requests / a.qps
        arch = write_example(tmp / "2tier", "2tier", qps=a.qps, duration_s=dur)
        convert(arch, tmp / "2tier.toml")
        doc = load(tmp / "2tier.toml").engine
        r = ours(doc, tmp, "2tier")
        n = r["completed"]
        rows.append(("2-tier (imported)", "qsim", f"{n}", f"{n / r['proc_cpu_s']:,.0f}",
                     f"{r['events'] / r['proc_cpu_s']:,.0f}",
                     f"{r['latency']['mean_us']:.1f} / {r['latency']['p99_us']:.1f}"))  # fmt: skip
        ours_2t = n / r["proc_cpu_s"]
        rss1 = r["rss_kib"]
        r10 = ours(with_overrides(doc, duration_s=dur * 10), tmp, "2tier10")
        rss10 = r10["rss_kib"]
        if a.uqsim:
            u = uqsim(a.uqsim, arch, tmp)
            rows.append(("2-tier (imported)", "μqSim", f"{u.get('requests')}",
                         f"{u['requests'] / u['proc_cpu_s']:,.0f}", "-",
                         f"{u.get('mean_us', 0):.1f} / {u.get('p99_us', 0):.1f}"))  # fmt: skip
            rows.append(
                (
                    "2-tier",
                    "ratio",
                    "",
                    f"{ours_2t / (u['requests'] / u['proc_cpu_s']):.1f}x",
                    "",
                    "",
                )
            )
        # --- fan-out through network stacks, side by side (few requests: μqSim is slow here)
        nf = a.uqsim_fanout_requests
        fq = 500.0
        arch = write_example(tmp / "fan", "fanout", qps=fq, duration_s=nf / fq, leaves=a.leaves)
        convert(arch, tmp / "fan.toml")
        fdoc = load(tmp / "fan.toml").engine
        rf = ours(fdoc, tmp, "fan")
        rows.append((f"{a.leaves}-leaf fan-out (imported)", "qsim", f"{rf['completed']}",
                     f"{rf['completed'] / rf['proc_cpu_s']:,.1f}", f"{rf['events'] / rf['proc_cpu_s']:,.0f}",
                     f"{rf['latency']['mean_us']:.0f} / {rf['latency']['p99_us']:.0f}"))  # fmt: skip
        if a.uqsim:
            u = uqsim(a.uqsim, arch, tmp)
            rows.append((f"{a.leaves}-leaf fan-out (imported)", "μqSim", f"{u.get('requests')}",
                         f"{u['requests'] / u['proc_cpu_s']:,.1f}", "-",
                         f"{u.get('mean_us', 0):.0f} / {u.get('p99_us', 0):.0f}"))  # fmt: skip
            ratio = (rf["completed"] / rf["proc_cpu_s"]) / (u["requests"] / u["proc_cpu_s"])
            rows.append((f"{a.leaves}-leaf fan-out", "ratio", "", f"{ratio:.1f}x", "", ""))
        # --- the plain fan-out goal
        (tmp / "plain.toml").write_text(PLAIN_FANOUT.format(leaves=a.leaves))
        pdoc = load(tmp / "plain.toml").engine
        pdoc["max_requests"] = a.fanout_requests
        rp = ours(pdoc, tmp, "plain")
        rows.append((f"{a.leaves}-leaf fan-out (plain)", "qsim", f"{rp['completed']}",
                     f"{rp['completed'] / rp['proc_cpu_s']:,.0f}", f"{rp['events'] / rp['proc_cpu_s']:,.0f}",
                     f"{rp['latency']['mean_us']:.0f} / {rp['latency']['p99_us']:.0f}"))  # fmt: skip
        progress_line = progress_cost(doc, tmp, a.rounds, a.baseline_engine)
        cli_line, _ = cli_overhead(tmp, a.rounds)
    w = [34, 6, 9, 16, 14, 20]
    head = ("model", "engine", "requests", "requests/CPU-s", "events/CPU-s", "mean / p99 (us)")
    print("  ".join(h.ljust(x) for h, x in zip(head, w, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(x) for c, x in zip(row, w, strict=True)))
    print(f"\n{a.fanout_requests} requests through the plain {a.leaves}-leaf fan-out: "
          f"{rp['proc_cpu_s']:.1f} CPU-s (goal < 10 s)")  # fmt: skip
    print(f"peak RSS, 2-tier: {rss1 / 1024:.1f} MiB at {n} requests, {rss10 / 1024:.1f} MiB at "
          f"{r10['completed']} (x{rss10 / rss1:.2f}; bounded by the live state)")  # fmt: skip
    print(progress_line)
    print(f"CLI overhead of musku qsim run (tiny model): {cli_line[0]:.3f} CPU-s median of "
          f"{a.rounds} rounds (range {cli_line[1]:.3f}-{cli_line[2]:.3f}; goal <= 0.1)")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
