"""Service-reported figures: QPS, latency percentiles, QoS violations.

The service (the built-in workload ``musku.workload``, or a μSuite service) keeps a stats file
(JSON, replaced atomically with rename) of *cumulative* counters and a cumulative latency
histogram; the sampler differences two readings, so percentiles are those of the interval, not
since the service started::

    {"format": "musku-stats/1", "service": "hdsearch", "pid": 1234,
     "t": 1732200000.25,                      # service wall clock at this snapshot
     "counters": {"requests": 123456, "ops": 7890123, "qos_violations": 12},
     "latency_us": {"bounds": [1, 2, 4, ...],  # bucket upper bounds, increasing
                    "counts": [0, 3, 40, ...]}} # cumulative count per bucket

Metrics: ``qps`` (requests/s), ``ops`` (ops/s; the workload's memory operations), ``ops_cpu``
(ops per CPU-second of the service, when it reports a ``cpu_s`` counter: on a host shared with
other work, the time the service waits for a CPU does not dilute it),
``p50_ms``/``p95_ms``/``p99_ms`` (bucket upper bound where the interval's quantile falls),
``qos_violation_rate`` (violations / requests in the interval). A file that has not advanced
since the previous reading yields no metrics (no data, not zero).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from musku.errors import InputError
from musku.knobs.base import Support
from musku.metrics.base import Sampler

if TYPE_CHECKING:
    from musku.hostfs import HostFS

FORMAT = "musku-stats/1"
QUANTILES = {"p50_ms": 0.50, "p95_ms": 0.95, "p99_ms": 0.99}


def read_stats(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


def quantile_from_hist(bounds: list[float], counts: list[float], q: float) -> float | None:
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    acc = 0.0
    for bound, c in zip(bounds, counts, strict=True):
        acc += c
        if acc >= rank:
            return float(bound)
    return float(bounds[-1])


class ServiceSampler(Sampler):
    name = "service"

    def __init__(self, fs: HostFS, **options: object) -> None:
        super().__init__(fs, **options)
        path = options.get("stats_file")
        if not isinstance(path, str) or not path:
            raise InputError('the service sampler needs stats_file = "/path/to/stats.json"')
        self.path = Path(path)
        self._last: dict[str, Any] | None = None

    def probe(self) -> Support:
        # the service may start after the agent: a missing file is "no data yet"
        if not self.path.parent.is_dir():
            return Support(False, f"no directory for the stats file {self.path}")
        present = read_stats(self.path) is not None
        details = {"path": str(self.path), "present": present}
        return Support(True, backend="stats-file", details=details)

    def start(self) -> None:
        self._last = read_stats(self.path)

    def sample(self) -> dict[str, float]:
        cur = read_stats(self.path)
        prev, self._last = self._last, cur if cur is not None else self._last
        if cur is None or prev is None:
            return {}
        if cur.get("pid") != prev.get("pid"):
            return {}  # the service restarted: counters started over
        dt = float(cur.get("t", 0.0)) - float(prev.get("t", 0.0))
        if dt <= 0:
            if cur is not None:
                self._last = prev
            return {}
        c1, c0 = dict(cur.get("counters", {})), dict(prev.get("counters", {}))
        out: dict[str, float] = {}
        d = {k: float(c1[k]) - float(c0.get(k, 0.0)) for k in c1}
        if "requests" in d:
            out["qps"] = d["requests"] / dt
        if "ops" in d:
            out["ops"] = d["ops"] / dt
            if d.get("cpu_s", 0.0) > 0:  # the service's own CPU time: ops per CPU-second
                out["ops_cpu"] = d["ops"] / d["cpu_s"]
        if "qos_violations" in d and d.get("requests", 0.0) > 0:
            out["qos_violation_rate"] = d["qos_violations"] / d["requests"]
        h1, h0 = cur.get("latency_us"), prev.get("latency_us")
        if isinstance(h1, dict) and isinstance(h0, dict) and h1.get("bounds") == h0.get("bounds"):
            bounds = [float(b) for b in h1["bounds"]]
            counts = [float(a) - float(b) for a, b in zip(h1["counts"], h0["counts"], strict=True)]
            for name, q in QUANTILES.items():
                v = quantile_from_hist(bounds, counts, q)
                if v is not None:
                    out[name] = v / 1000.0
        return out
