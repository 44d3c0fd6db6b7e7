"""Metric samplers behind one interface (:class:`musku.metrics.base.Sampler`).

``SAMPLERS`` maps a name to ``"module:Class"``; users may give their own ``module:Class``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from musku.errors import InputError
from musku.metrics.base import Sampler
from musku.registry import load

if TYPE_CHECKING:
    from musku.hostfs import HostFS

SAMPLERS: dict[str, str] = {
    "perf": "musku.metrics.perf:PerfSampler",
    "psutil": "musku.metrics.host:PsutilSampler",
    "service": "musku.metrics.service:ServiceSampler",
    "rapl": "musku.metrics.rapl:RaplSampler",
}


def load_sampler(name: str, fs: HostFS, **options: object) -> Sampler:
    """Instantiate sampler ``name`` (an alias or ``module:Class``) on ``fs``."""
    cls = load(name, SAMPLERS, kind="sampler")
    if not (isinstance(cls, type) and issubclass(cls, Sampler)):
        raise InputError(f"sampler {name!r} is not a musku.metrics.base.Sampler")
    return cls(fs, **options)


__all__ = ["SAMPLERS", "load_sampler"]
