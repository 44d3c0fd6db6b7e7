"""Metric samplers behind one interface (:class:`musku.metrics.base.Sampler`).

``SAMPLERS`` is the samplers' :class:`~musku.registry.Registry`: built-in names are aliases of
``"module:Class"`` strings (nothing imported until used); an agent configuration may name any
``"package.module:Class"``, a ``musku.samplers`` entry point, or a class registered with
``SAMPLERS.register(target)``. A sampler plug-in is its class (the agent builds one per host
with the options of its ``[samplers.NAME]`` table), checked when it is resolved: a
:class:`~musku.metrics.base.Sampler` subclass with a ``name`` and every method the agent calls,
none abstract, its name not taken by another (:class:`~musku.registry.PluginError`, exit 3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from musku.errors import MuskuError
from musku.metrics.base import Sampler
from musku.registry import PluginError, Registry

if TYPE_CHECKING:
    from musku.hostfs import HostFS

SAMPLER_METHODS = ("probe", "start", "sample", "close")
"""What the agent calls on every sampler (:class:`musku.metrics.base.Sampler`)."""

SAMPLERS = Registry(
    "metric sampler",
    {
        "perf": "musku.metrics.perf:PerfSampler",
        "psutil": "musku.metrics.host:PsutilSampler",
        "service": "musku.metrics.service:ServiceSampler",
        "rapl": "musku.metrics.rapl:RaplSampler",
    },
    group="musku.samplers",
    required=SAMPLER_METHODS,
    base=Sampler,
    instantiate=False,
)
"""Metric samplers (an agent configuration's ``[samplers.NAME]``): :mod:`musku.metrics`."""


def sampler_class(name: str) -> type[Sampler]:
    """The sampler class ``name`` (an alias, a registered name or ``module:Class``), loaded
    and checked; one line otherwise (:class:`~musku.errors.InputError`, exit 3)."""
    cls: type[Sampler] = SAMPLERS.get(name)
    return cls


def check_samplers(
    samplers: Iterable[str] | Mapping[str, Mapping[str, object]], fs: HostFS | None = None
) -> None:
    """Resolve and check every sampler an agent configuration names, before the agent runs
    (a plug-in that cannot load is one line naming it, exit 3, not a sampler missing later).
    With ``fs`` and a mapping of options, each is also built with its options (a
    constructor refuses bad ones; it must not touch the host), then dropped."""
    for name in samplers:
        sampler_class(name)
        if fs is not None and isinstance(samplers, Mapping):
            load_sampler(name, fs, **samplers[name]).close()


def load_sampler(name: str, fs: HostFS, **options: object) -> Sampler:
    """Instantiate sampler ``name`` (an alias or ``module:Class``) on ``fs`` with ``options``.
    Its constructor refuses bad options with one line; a plug-in's constructor that fails
    otherwise is one line naming it (:class:`~musku.registry.PluginError`), not a traceback."""
    cls = sampler_class(name)
    try:
        return cls(fs, **options)
    except MuskuError:
        raise
    except Exception as exc:  # a plug-in's own bug: its one line, not a traceback
        raise PluginError(
            f"metric sampler {name!r}: its constructor failed: {type(exc).__name__}: {exc}"
        ) from None


__all__ = ["SAMPLERS", "SAMPLER_METHODS", "check_samplers", "load_sampler", "sampler_class"]
