"""The service under test in the end-to-end scenario (tests/e2e/test_scenario.py): a small
program, run as its own process on each fake host, that writes the musku-stats/1 file the
agent's service sampler reads (musku/metrics/service.py).

Its request rate depends on its host's knobs as read from the host's tree, the way a real
service's throughput depends on the kernel's settings: ``BASE_QPS`` times the factor of the
bracketed THP mode times ``SHP_FACTOR`` while static huge pages are reserved, with 3 % noise
per step. The factors are constants of this file: this file is the service's *code*. A code
push (the test's ``push``) writes a new build of it, with other constants, and restarts the
process, as a deploy system would; nothing in musku or the agents is told.

Standalone on purpose (no musku import): it starts in a few milliseconds and is the same code
on every host.

    python service.py THP_FILE SHP_FILE STATS_FILE SEED
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time

VERSION = "v1"
BASE_QPS = 2000.0
THP_FACTOR = {"always": 1.3, "madvise": 1.0, "never": 0.8}
SHP_FACTOR = 0.85
STEP_S = 0.01
NOISE = 0.03


def thp_mode(path: str) -> str:
    try:
        with open(path) as f:
            m = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return ""
    return m.group(1) if m else ""


def huge_pages(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def main(argv: list[str]) -> int:
    thp_file, shp_file, stats_file, seed = argv[1], argv[2], argv[3], int(argv[4])
    rng = random.Random(seed)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    tmp = stats_file + ".tmp"
    count, last = 0.0, time.time()
    while not stop:
        now = time.time()
        qps = BASE_QPS * THP_FACTOR.get(thp_mode(thp_file), 1.0)
        if huge_pages(shp_file) > 0:
            qps *= SHP_FACTOR
        count += (now - last) * qps * max(0.0, 1.0 + rng.gauss(0.0, NOISE))
        last = now
        with open(tmp, "w") as f:
            json.dump(
                {
                    "format": "musku-stats/1",
                    "service": "e2e",
                    "version": VERSION,
                    "pid": os.getpid(),
                    "t": now,
                    "counters": {"requests": int(count)},
                },
                f,
            )
        os.replace(tmp, stats_file)
        time.sleep(STEP_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
