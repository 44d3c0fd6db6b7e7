"""``python -m musku.workload``: run the built-in memory workload until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from musku.errors import MuskuError
from musku.hostfs import HostFS
from musku.workload.core import Workload, WorkloadOptions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m musku.workload", description=__doc__)
    p.add_argument("--stats", required=True, type=Path, help="stats file (musku-stats/1 JSON)")
    p.add_argument("--arena-mib", type=int, default=256)
    p.add_argument("--batch", type=int, default=1 << 16)
    p.add_argument("--no-hugetlb", action="store_true", help="never use static huge pages")
    p.add_argument("--madvise", action="store_true", help="MADV_HUGEPAGE on the arena")
    p.add_argument("--duration", type=float, default=0.0, help="seconds (0 = until stopped)")
    p.add_argument("--root", default="/", help="host root for reading THP/huge page state")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--watch-interval", type=float, default=0.2, help="seconds between checks")
    a = p.parse_args(argv)
    try:
        w = Workload(
            WorkloadOptions(
                stats_file=a.stats,
                arena_mib=a.arena_mib,
                batch=a.batch,
                hugetlb=not a.no_hugetlb,
                madvise=a.madvise,
                duration_s=a.duration,
                seed=a.seed,
                watch_interval_s=a.watch_interval,
            ),
            HostFS(a.root),
        )
    except MuskuError as exc:
        print(f"musku-workload: error: {exc.one_line()}", file=sys.stderr)
        return int(exc.status)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        w.stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        w.run()
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
