"""CPU cost of the agent sampling at 10 Hz, against an idle baseline process in the same run.

Starts a real agent daemon on this host (``python -m musku.agent run``; state in a temp dir; it
only samples: perf events, psutil host figures, a service stats file) and, next to it, a baseline
process that merely wakes up at the same 10 Hz. Measures both processes' CPU time (user+system,
from /proc via psutil) over the same period and prints the agent's share of one core.

    python bench/agent_overhead.py [--seconds 30] [--hz 10]

Target: the agent below 1 % of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IDLE = "import time\nwhile True:\n    time.sleep({period})\n"


def cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="musku-overhead-"))
    stats = tmp / "stats.json"
    stats.write_text(
        json.dumps(
            {"format": "musku-stats/1", "pid": 1, "t": time.time(), "counters": {"requests": 0}}
        )
    )
    cfg = tmp / "agent.toml"
    cfg.write_text(
        f"[agent]\nstate_dir = {str(tmp / 'state')!r}\nsocket = {str(tmp / 'agent.sock')!r}\n"
        f"sample_interval_s = {1.0 / a.hz!r}\nlog_level = 'warning'\n"
        f"[samplers.perf]\n[samplers.psutil]\n[samplers.service]\nstats_file = {str(stats)!r}\n"
    )
    agent = subprocess.Popen([sys.executable, "-m", "musku.agent", "run", "--config", str(cfg)])
    idle = subprocess.Popen([sys.executable, "-c", IDLE.format(period=1.0 / a.hz)])
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "agent.sock").exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                print("agent did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        time.sleep(a.warmup)  # start-up (imports, first probes) is not the steady state
        a0, i0, t0 = cpu(agent.pid), cpu(idle.pid), time.monotonic()
        time.sleep(a.seconds)
        a1, i1, t1 = cpu(agent.pid), cpu(idle.pid), time.monotonic()
        # rows actually sampled in the period (the spool proves the agent was sampling)
        from musku.agent.client import AgentClient

        c = AgentClient(tmp / "agent.sock")
        st = c.call("status")
        hello = c.call("hello")
        c.close()
    finally:
        for proc in (agent, idle):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    wall = t1 - t0
    agent_pct = 100 * (a1 - a0) / wall
    idle_pct = 100 * (i1 - i0) / wall
    print(f"period                 {wall:.1f} s at {a.hz:g} Hz")
    print(f"samplers               {hello['samplers']}")
    print(f"spool rows             {st['spool_rows']} (expected ~{int((wall + a.warmup) * a.hz)})")
    print(f"agent CPU              {agent_pct:.3f} % of one core")
    print(f"idle baseline CPU      {idle_pct:.3f} % of one core (a process waking at {a.hz:g} Hz)")
    print(f"agent minus baseline   {agent_pct - idle_pct:.3f} % of one core")
    ok = agent_pct < 1.0
    print(f"target < 1 %           {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
