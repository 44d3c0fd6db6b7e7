"""RAPL package energy through the powercap interface (``intel-rapl:N/energy_uj``).

Sums the package domains (``intel-rapl:N``, not the ``:N:M`` subdomains), handles the counter
wrapping at ``max_energy_range_uj``, and reports ``power_w`` over the interval.
Absent on VMs and most AMD kernels before 5.8: the probe says so.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from musku.hostfs import POWERCAP, HostFSError
from musku.knobs.base import Support
from musku.metrics.base import Sampler

if TYPE_CHECKING:
    from musku.hostfs import HostFS

_PACKAGE = re.compile(r"^intel-rapl:\d+$")


class RaplSampler(Sampler):
    name = "rapl"

    def __init__(self, fs: HostFS, **options: object) -> None:
        super().__init__(fs, **options)
        self._domains: list[tuple[str, int]] = []
        self._last: dict[str, int] = {}
        self._t = 0.0

    def _find(self) -> list[tuple[str, int]]:
        if not self.fs.is_dir(POWERCAP):
            return []
        out = []
        for name in self.fs.listdir(POWERCAP):
            if _PACKAGE.match(name):
                d = f"{POWERCAP}/{name}"
                if self.fs.exists(d + "/energy_uj"):
                    rng = (
                        self.fs.read_int(d + "/max_energy_range_uj")
                        if self.fs.exists(d + "/max_energy_range_uj")
                        else 2**32
                    )
                    out.append((d, rng))
        return out

    def probe(self) -> Support:
        try:
            domains = self._find()
            if not domains:
                return Support(False, f"no RAPL package domains under {POWERCAP}")
            for d, _ in domains:
                self.fs.read_int(d + "/energy_uj")
        except HostFSError as exc:
            return Support(False, f"RAPL unreadable: {exc.message}")
        return Support(True, backend="powercap", details={"domains": [d for d, _ in domains]})

    def _read(self) -> dict[str, int]:
        return {d: self.fs.read_int(d + "/energy_uj") for d, _ in self._domains}

    def start(self) -> None:
        self._domains = self._find()
        self._last = self._read()
        self._t = time.monotonic()

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        cur = self._read()
        dt = now - self._t
        joules = 0.0
        for d, rng in self._domains:
            delta = cur[d] - self._last[d]
            if delta < 0:
                delta += rng  # the counter wrapped
            joules += delta / 1e6
        self._last, self._t = cur, now
        return {"power_w": joules / dt} if dt > 0 and self._domains else {}
