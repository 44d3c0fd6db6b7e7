"""Every built-in sampler passes :class:`musku.testing.samplers.SamplerContract`: perf and
psutil on this machine's real ``/`` (whatever it supports: a VM without a PMU falls back to
software events; without permission perf is a typed refusal), psutil refused on a fake tree,
the service sampler on a stats file that advances, RAPL on a fake powercap tree and on this
machine (a VM has none: a typed refusal)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from musku.hostfs import HostFS
from musku.metrics.rapl import POWERCAP
from musku.testing.samplers import SamplerCase, SamplerContract


def _stats(path: Path, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "format": "musku-stats/1",
                "pid": 7,
                "t": 100.0 + step,
                "counters": {"requests": 1000 * step, "ops": 5000 * step, "qos_violations": step},
                "latency_us": {"bounds": [100, 200, 400], "counts": [500 * step, 500 * step, 0]},
            }
        )
    )
    tmp.replace(path)


def _service(tmp_path: Path) -> SamplerCase:
    stats = tmp_path / "stats.json"
    steps = itertools.count(1)
    _stats(stats, 0)
    return SamplerCase(
        "service",
        HostFS(tmp_path),
        {"stats_file": str(stats)},
        supported=True,
        advance=lambda: _stats(stats, next(steps)),
    )


def _rapl_tree(tmp_path: Path) -> SamplerCase:
    d = tmp_path / POWERCAP.lstrip("/") / "intel-rapl:0"
    d.mkdir(parents=True)
    (d / "max_energy_range_uj").write_text("1000000000\n")
    energy = itertools.count(1_000_000, 2_000_000)
    (d / "energy_uj").write_text(f"{next(energy)}\n")

    def advance() -> None:
        (d / "energy_uj").write_text(f"{next(energy)}\n")

    return SamplerCase("rapl", HostFS(tmp_path), supported=True, advance=advance)


CASES = {
    "perf-here": lambda tmp: SamplerCase("perf", HostFS("/")),
    "perf-bad-scope": lambda tmp: SamplerCase("perf", HostFS("/"), {"scope": "nope"}, False),
    "psutil-here": lambda tmp: SamplerCase("psutil", HostFS("/"), supported=True),
    "psutil-fake-tree": lambda tmp: SamplerCase("psutil", HostFS(tmp), supported=False),
    "service": _service,
    "service-no-dir": lambda tmp: SamplerCase(
        "service", HostFS(tmp), {"stats_file": str(tmp / "gone" / "s.json")}, supported=False
    ),
    "rapl-here": lambda tmp: SamplerCase("rapl", HostFS("/")),
    "rapl-fake-tree": _rapl_tree,
    "rapl-empty-tree": lambda tmp: SamplerCase("rapl", HostFS(tmp), supported=False),
}


class TestBuiltinSamplers(SamplerContract):
    @pytest.fixture(params=sorted(CASES))
    def case(self, request: pytest.FixtureRequest, tmp_path: Path) -> SamplerCase:
        host = tmp_path / "host"
        host.mkdir()
        made: SamplerCase = CASES[request.param](host)
        return made
