#!/usr/bin/env python3
"""Issue 17 before and after: the redesign (knob specs, schema layer, contract suites, layers)
must not make musku slower. Times both trees in one run, in alternating rounds.

    python bench/architecture.py [--before aabb9d6] [--after HEAD] [--rounds 5]
        [--experiment experiments/web-broadwell.toml] [--seed 1]

Each side is a temporary detached ``git worktree`` under /tmp (removed at the end), run with
``PYTHONPATH`` at that tree and this interpreter (the shared venv). Per round, before then
after (the order alternates between rounds, so that a trend in the machine's load falls on
both):

- ``sweep``: ``musku sweep EXPERIMENT --seed S --db sqlite:///...`` (simulated hosts, a new
  SQLite file each run): wall time and the child's CPU time (user + system);
- ``check``: ``musku check`` on every shipped experiment file (``experiments/*.toml``), summed;
- ``import``: ``import musku.cli``, cumulative microseconds from ``python -X importtime``
  (best of 3 per round) and the process's wall time;
- ``ingest``: ``bench/db_ingest.py`` of that tree on SQLite (its bulk rate, as seconds per
  100,000 sample rows).

Each figure is printed as after/before: the ratio of the best rounds and a bootstrap 95 %
interval of the ratio of medians. Verdict: ``regression`` when the best-rounds ratio is above
1.10 and the interval lies wholly above 1.0; ``noise?`` when the ratio is above 1.10 but the
interval reaches 1.0; else ``ok``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 1.10


@dataclass
class Side:
    name: str
    rev: str
    tree: Path
    figures: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, set[str]] = field(default_factory=dict)

    def add(self, figure: str, value: float) -> None:
        self.figures.setdefault(figure, []).append(value)

    def note(self, what: str, value: str) -> None:
        self.notes.setdefault(what, set()).add(value)


def run(side: Side, args: list[str], *, cwd: Path | None = None) -> tuple[float, float, str, int]:
    """(wall s, child CPU s, stdout, exit code) of ``python ARGS`` on ``side``'s tree."""
    env = dict(os.environ, PYTHONPATH=str(side.tree), MUSKU_DB="sqlite:///:memory:")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd or side.tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout + proc.stderr, proc.returncode


def round_of(side: Side, experiment: str, seed: int, tmp: Path) -> None:
    # (a) the sweep
    db = tmp / f"{side.name}-sweep.db"
    db.unlink(missing_ok=True)
    wall, cpu, out, rc = run(
        side,
        [
            "-m",
            "musku",
            "sweep",
            experiment,
            "--seed",
            str(seed),
            "--db",
            f"sqlite:///{db}",
            "--json",
        ],
    )
    if rc != 0:
        raise SystemExit(f"{side.name}: musku sweep exited {rc}: {out.strip()[-400:]}")
    rep = json.loads(out[out.index("{") :])
    side.add("sweep wall s", wall)
    side.add("sweep CPU s", cpu)
    side.note("sweep comparisons", str(rep["comparisons"]))
    side.note("soft SKU", json.dumps(rep["best"], sort_keys=True))
    # (b) musku check on every shipped experiment file
    total = 0.0
    for path in sorted((side.tree / "experiments").glob("*.toml")):
        wall, _, out, rc = run(side, ["-m", "musku", "check", str(path), "--json"])
        total += wall
        side.note(f"check {path.name} exit", str(rc))
    side.add("check all s", total)
    # (c) import time of musku.cli
    best_us, best_wall = float("inf"), float("inf")
    for _ in range(3):
        wall, _, out, rc = run(side, ["-X", "importtime", "-c", "import musku.cli"])
        m = re.search(r"\|\s*(\d+)\s*\|\s*musku\.cli\s*$", out, re.M)
        if rc != 0 or m is None:
            raise SystemExit(f"{side.name}: import musku.cli failed: {out.strip()[-400:]}")
        best_us, best_wall = min(best_us, float(m.group(1))), min(best_wall, wall)
    side.add("import musku.cli ms", best_us / 1000.0)
    side.add("python -c import wall s", best_wall)
    # (d) results-DB ingest, the tree's own bench script
    wall, _, out, rc = run(
        side,
        [
            str(side.tree / "bench" / "db_ingest.py"),
            "--rows",
            "50000",
            "--naive-rows",
            "2000",
            "--repeat",
            "1",
            "--no-postgres",
            "--json",
        ],
    )
    if rc != 0:  # a tree whose script is broken (say, a moved fixture): no ingest figure
        side.note("ingest", f"exited {rc}: {out.strip().splitlines()[-1][:160]}")
        return
    side.note("ingest", "ran")
    rows = json.loads(out[out.index("[") :])
    side.add("ingest s/100k rows", 100_000 / rows[0]["bulk_median"])


def bootstrap(after: list[float], before: list[float], n: int = 4000) -> tuple[float, float]:
    """95 % interval of median(after)/median(before), resampling each side's rounds."""
    rng = random.Random(17)
    ratios = sorted(
        statistics.median(rng.choices(after, k=len(after)))
        / statistics.median(rng.choices(before, k=len(before)))
        for _ in range(n)
    )
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def verdict(ratio: float, lo: float) -> str:
    if ratio > THRESHOLD and lo > 1.0:
        return "regression"
    if ratio > THRESHOLD:
        return "noise?"
    return "ok"


def table(before: Side, after: Side) -> str:
    lines = [
        "| figure | before (best / median) | after (best / median) | after/before best "
        "| 95 % CI of median ratio | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fig, b in before.figures.items():
        a = after.figures.get(fig)
        if a is None:
            continue  # measured on one side only (see the notes)
        ratio = min(a) / min(b)
        lo, hi = bootstrap(a, b)
        lines.append(
            f"| {fig} | {min(b):.3f} / {statistics.median(b):.3f} "
            f"| {min(a):.3f} / {statistics.median(a):.3f} | {ratio:.3f} "
            f"| [{lo:.3f}, {hi:.3f}] | {verdict(ratio, lo)} |"
        )
    return "\n".join(lines)


def worktree(rev: str, tmp: Path, name: str) -> Path:
    path = tmp / name
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="aabb9d6", help="revision before issue 17")
    ap.add_argument("--after", default="HEAD", help="revision after it")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--experiment", default="experiments/web-broadwell.toml")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="also print every round's figures")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="musku-arch-bench-"))
    trees: list[Path] = []
    try:
        sides = []
        for name, rev in (("before", args.before), ("after", args.after)):
            trees.append(worktree(rev, tmp, name))
            sha = subprocess.run(
                ["git", "-C", str(trees[-1]), "rev-parse", "--short", "HEAD"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            sides.append(Side(name, sha, trees[-1]))
        before, after = sides
        load0 = os.getloadavg()[0]
        start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        for r in range(args.rounds):
            order = (before, after) if r % 2 == 0 else (after, before)
            for side in order:
                round_of(side, args.experiment, args.seed, tmp)
            print(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", flush=True)
        print(
            f"\n{start}, {args.rounds} alternating rounds, before {before.rev} vs after "
            f"{after.rev}, {os.cpu_count()} CPUs, load average {load0:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end; sweep: {args.experiment} --seed {args.seed}\n"
        )
        print(table(before, after))
        print()
        for what in before.notes:
            b, a = sorted(before.notes[what]), sorted(after.notes.get(what, set()))
            same = "same" if a == b else "DIFFERS"
            print(f"{what}: {same}; before {', '.join(b)}; after {', '.join(a)}")
        if args.json:
            print(json.dumps({s.name: s.figures for s in sides}, indent=1))
    finally:
        for path in trees:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
