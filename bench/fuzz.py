"""Fuzz every input file kind musku reads (issue 18, "Must show": >= 5,000 experiment files;
issue 29: >= 10,000 inputs across all kinds, qsim models included), and, through
bench/fuzz_agent.py when it is present, >= 5,000 agent requests.

Documents come from the generators of the property tests (tests/experiment/generators.py):
valid documents mutated (hostile values, wrong types, unknown and missing keys, deep nesting,
huge numbers, markup, device paths) and sometimes damaged as text (truncation, stray bytes,
a pathological line, a 50,000-part dotted key, 4,500-digit integers). Experiment files go
through ``musku check`` in this process (the exit status a user would see); an accepted sim
experiment's hosts are then opened as ``musku sweep`` opens them (check must not accept what
sweep refuses). Catalogs, simulator models and agent configurations go through their loaders.

qsim models (tests/fuzz/qsim_docs.py: the 2-tier model with a histogram and a fan-out, mutated
by the same generator) go through ``musku qsim check`` and, when accepted, ``musku qsim run``
of a 10 ms window under an engine budget of 5 CPU seconds and 512 MiB (a run over it is a clean
error); ``check`` accepting what ``run`` refuses counts as "check OK but run refused" (goal 0).
Their budget is 10 CPU seconds per model (this thread's and the engine's) and 1 GiB peak RSS
for the largest engine process. They need the engine (``$MUSKU_QSIM`` or the services' build);
without it they are skipped, and the table says so.

Printed per kind: accepted / clean errors per exit status / internal errors (goal 0) / over
budget (goal 0: a document over budget is timed once more, and counts if it is over twice) /
check-accepted-but-sweep-refused (goal 0). Budgets: 2 CPU seconds per document
(tests/experiment/generators.BUDGET_S), 400 MiB peak RSS for the process.

    PYTHONPATH=. python bench/fuzz.py [-n 5000] [--seed 0] [--other 1000] [--qsim 1000]
        [--agent 5000]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.experiment.generators import (  # noqa: E402
    BASES,
    BUDGET_S,
    RSS_BUDGET_MIB,
    Workdir,
    check_document,
    draw,
    peak_rss_mib,
    warm_up,
)


def _sweep_opens(path: Path) -> str:
    """'' if ``musku sweep`` would get past loading and opening the hosts, else why not."""
    from musku.errors import MuskuError
    from musku.experiment import load_experiment
    from musku.sweep.sweep import open_pair

    try:
        exp = load_experiment(path)
        if exp.hosts.backend != "sim":
            return ""  # real hosts are not opened by a fuzzer
        open_pair(exp).close()
    except MuskuError as exc:
        return exc.one_line()
    except Exception as exc:  # noqa: BLE001
        return f"internal: {type(exc).__name__}: {exc}"
    return ""


def fuzz_kind(kind: str, n: int, seed: int, work: Workdir) -> dict[str, Any]:
    base = BASES[kind]()
    rng = random.Random(f"{seed}:{kind}")
    clean: collections.Counter[int] = collections.Counter()
    accepted = 0
    internal: list[str] = []
    over: list[str] = []
    parity: list[str] = []
    worst = 0.0
    slow_once = 0
    started = time.perf_counter()
    for i in range(n):
        text = draw(rng, base)
        outcome, status, seconds, message = check_document(kind, text, work)
        if seconds > BUDGET_S:  # once more: a busy machine stalls a process for seconds
            slow_once += 1
            seconds = min(seconds, check_document(kind, text, work)[2])
        worst = max(worst, seconds)
        if seconds > BUDGET_S:
            over.append(f"#{i} {seconds:.2f} s {message[:120]}")
        if outcome == "accepted":
            accepted += 1
            if kind == "experiment":
                why = _sweep_opens(work.dir / "exp.toml")
                if why:
                    parity.append(f"#{i} {why[:160]}")
        elif outcome == "clean":
            clean[status] += 1
        else:
            internal.append(f"#{i} {message[:200]}")
    return {
        "kind": kind,
        "documents": n,
        "accepted": accepted,
        "clean": dict(sorted(clean.items())),
        "internal": internal,
        "over_budget": over,
        "over_budget_first_try": slow_once,
        "check_ok_sweep_refused": parity,
        "worst_s": worst,
        "seconds": time.perf_counter() - started,
    }


def fuzz_qsim(n: int, seed: int, d: Path) -> dict[str, Any]:
    """``n`` generated qsim models through check and a short run (the module doc)."""
    from tests.experiment.generators import draw
    from tests.fuzz.qsim_docs import BUDGET_CPU_S, check_qsim, prepare, qsim_base

    prepare(d)
    base = qsim_base()
    rng = random.Random(f"{seed}:qsim-model")
    clean: collections.Counter[int] = collections.Counter()
    accepted, ran = 0, 0
    internal: list[str] = []
    over: list[str] = []
    parity: list[str] = []
    worst = 0.0
    budget_refusals = 0
    started = time.perf_counter()
    for i in range(n):
        text = draw(rng, base)
        outcome, status, cpu, message = check_qsim(text, d)
        worst = max(worst, cpu)
        if cpu > BUDGET_CPU_S:
            over.append(f"#{i} {cpu:.2f} CPU s {message[:120]}")
        if outcome == "accepted":
            accepted += 1
            ran += 1
        elif outcome == "clean":
            clean[status] += 1
            budget_refusals += "budget" in message or "of memory" in message
        elif outcome == "parity":
            parity.append(f"#{i} {message[:200]}")
        else:
            internal.append(f"#{i} {message[:200]}")
    return {
        "kind": "qsim-model",
        "documents": n,
        "accepted": accepted,
        "clean": dict(sorted(clean.items())),
        "internal": internal,
        "over_budget": over,
        "over_budget_first_try": len(over),
        "check_ok_sweep_refused": parity,
        "budget_refusals": budget_refusals,
        "worst_s": worst,
        "seconds": time.perf_counter() - started,
    }


def _engine_built() -> str:
    from musku.errors import UnsupportedError
    from musku.qsim.engine import binary

    try:
        binary()
    except UnsupportedError as exc:
        return exc.one_line()
    return ""


def _agent_half(n: int, seed: int) -> dict[str, Any] | None:
    """bench/fuzz_agent.py's ``run(n, seed)`` (written alongside the agent server), if here."""
    path = ROOT / "bench" / "fuzz_agent.py"
    if not path.exists() or n <= 0:
        return None
    spec = importlib.util.spec_from_file_location("fuzz_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result: dict[str, Any] = module.run(n, seed)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5000, help="experiment files")
    ap.add_argument("--other", type=int, default=1000, help="documents of each other kind")
    ap.add_argument("--qsim", type=int, default=1000, help="qsim models (0: skip)")
    ap.add_argument("--agent", type=int, default=5000, help="agent requests (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="musku-fuzz-") as d:
        work = Workdir(Path(d))
        warm_up(work)
        print(f"budgets: {BUDGET_S:g} CPU s per document, {RSS_BUDGET_MIB} MiB peak RSS")
        results = []
        total = 0
        for kind in BASES:
            n = args.n if kind == "experiment" else args.other
            results.append(fuzz_kind(kind, n, args.seed, work))
        missing = _engine_built()
        if args.qsim > 0 and not missing:
            qdir = Path(d) / "qsim"
            qdir.mkdir()
            results.append(fuzz_qsim(args.qsim, args.seed, qdir))
        elif args.qsim > 0:
            print(f"qsim models: skipped, the engine is not built ({missing})")
        for r in results:
            kind = r["kind"]
            total += r["documents"]
            clean = ", ".join(f"status {s}: {c}" for s, c in r["clean"].items()) or "none"
            print(
                f"{kind:13} {r['documents']:6} documents in {r['seconds']:6.1f} s: "
                f"accepted {r['accepted']}, clean errors {sum(r['clean'].values())} ({clean}), "
                f"internal errors {len(r['internal'])} (goal 0), "
                f"over budget {len(r['over_budget'])} (goal 0; "
                f"{r['over_budget_first_try']} over at the first try), "
                f"check OK but {'run' if kind == 'qsim-model' else 'sweep'} refused "
                f"{len(r['check_ok_sweep_refused'])} (goal 0); "
                f"slowest {r['worst_s'] * 1000:.0f} ms"
                + (
                    f" CPU (engine included; {r['budget_refusals']} runs over the engine budget)"
                    if kind == "qsim-model"
                    else ""
                )
            )
            for key in ("internal", "over_budget", "check_ok_sweep_refused"):
                for line in r[key][:10]:
                    print(f"    {key}: {line}")
                bad += len(r[key])
    rss = peak_rss_mib()
    print(f"peak RSS {rss:.0f} MiB (budget {RSS_BUDGET_MIB} MiB)")
    bad += rss > RSS_BUDGET_MIB
    if args.qsim > 0:
        from tests.fuzz.qsim_docs import engine_peak_rss_mib

        engine_rss = engine_peak_rss_mib()
        print(f"largest child (engine) peak RSS {engine_rss:.0f} MiB (budget 1024 MiB)")
        bad += engine_rss > 1024
    agent = _agent_half(args.agent, args.seed)
    if agent is None:
        print("agent requests: bench/fuzz_agent.py not present (run it on its own)")
    else:
        by = agent.get("clean_errors_by_status", {})
        print(
            f"agent requests {agent['requests']}: accepted {agent['accepted']}, clean errors "
            f"{sum(by.values())} ({', '.join(f'status {k}: {v}' for k, v in by.items())}), "
            f"internal errors {len(agent['internal_errors'])} (goal 0), "
            f"over budget {len(agent['over_budget'])} (goal 0)"
        )
        bad += len(agent["internal_errors"]) + len(agent["over_budget"])
        total += agent["requests"]
    print(f"{total:,} generated inputs in all")
    print("(measured on a 2-core VM shared with other work: times are upper bounds)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
