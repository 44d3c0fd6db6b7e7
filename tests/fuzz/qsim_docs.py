"""Generated qsim model files for the property test (tests/fuzz/test_qsim_models.py) and
bench/fuzz.py: the shipped 2-tier model (experiments/qsim/2tier.toml) with an empirical
histogram, a fan-out path and a closed-loop-ready client, mutated by the same seeded generator
as every other input kind (tests/experiment/generators.py: hostile values, wrong types,
unknown and missing keys, deep nesting, huge numbers, markup, device and ``..`` paths, byte
damage).

:func:`check_qsim` runs a document the way a user does, in this process: ``musku qsim check``,
then, when it is accepted, ``musku qsim run`` of a short window (``--duration 0.01``) under a
small engine budget (``--cpu-limit 5 --memory-limit 512``). The outcome is accepted (both
exit 0), clean (one ``musku: error:`` line, exit 3; a run over its budget is clean too),
internal (anything else), or ``parity`` (``check`` accepted what ``run`` then refused as a bad
model: ``check`` must accept exactly what ``run`` runs).
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUDGET_CPU_S = 10.0
"""Most CPU seconds (this thread's and the engine's) one model may cost: check and a run."""
# -q: a run over 2 s of wall time (one stopped by its budget on a busy machine) would show
# progress lines on stderr before its one error line (docs/qsim.md "Progress")
ENGINE_ARGS = ["--duration", "0.01", "--cpu-limit", "5", "--memory-limit", "512", "--json", "-q"]


def qsim_base() -> dict[str, Any]:
    doc = tomllib.loads((ROOT / "experiments" / "qsim" / "2tier.toml").read_text())
    doc["run"].update(duration_s=0.05, warmup_s=0.005)
    doc["services"][1]["stages"][2]["time"] = {"dist": "empirical", "file": "h.csv"}
    doc["services"].append(
        {
            "name": "leaf",
            "execution": "simple",
            "instances": 4,
            "machines": ["back"],
            "stages": [{"name": "work", "time": {"dist": "const", "mean_us": 20}}],
        }
    )
    doc["paths"].append(
        {
            "name": "search",
            "weight": 0.5,
            "nodes": [
                {"name": "root", "service": "nginx", "stages": ["epoll"], "children": ["fan"]},
                {"name": "fan", "service": "leaf", "copies": 4, "children": ["merge"]},
                {"name": "merge", "service": "nginx", "stages": ["proc"], "gather": True},
            ],
        }
    )
    doc["client"] = {"kind": "open", "qps": 2000.0, "connections": 16}
    return doc


def prepare(d: Path) -> None:
    """The side files a generated model may name (beside it)."""
    (d / "h.csv").write_text("# value_us,weight\n5,3\n9,2\n40,1\n")


def _main(args: list[str]) -> tuple[int, str, str]:
    from musku.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.pop("MUSKU_DEBUG", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            else:
                code = 0
    finally:
        if old is not None:
            os.environ["MUSKU_DEBUG"] = old
    return code, out.getvalue(), err.getvalue()


def _refusal(code: int, err: str) -> tuple[str, str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    message = lines[-1][:300] if lines else ""
    if code == 3 and len(lines) == 1 and lines[0].startswith("musku: error: "):
        return "clean", message
    return "internal", f"exit {code}: {err[-300:]}"


def check_qsim(text: str, d: Path, *, run: bool = True) -> tuple[str, int, float, str]:
    """(outcome, status, CPU seconds, message) of one generated model (module doc)."""
    path = d / "gen-qsim.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    cpu0 = time.thread_time()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, _, err = _main(["qsim", "check", str(path)])
    outcome, status, message = "accepted", code, ""
    if code != 0:
        outcome, message = _refusal(code, err)
    elif run:
        code, out, err = _main(["qsim", "run", str(path), *ENGINE_ARGS])
        status = code
        if code != 0:
            outcome, message = _refusal(code, err)
            if outcome == "clean" and "budget" not in message and "of memory" not in message:
                outcome = "parity"  # check said OK, the run refused the model
        elif '"latency"' not in out:
            outcome, message = "internal", f"no result: {out[:200]!r}"
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.thread_time() - cpu0
    cpu += (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    return outcome, status, cpu, message


def engine_peak_rss_mib() -> float:
    """The largest engine process's peak RSS so far (every waited-for child)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
