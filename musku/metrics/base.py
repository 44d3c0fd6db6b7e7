"""The sampler contract: ``probe -> start -> sample()* -> close``.

A sampler turns some source (perf events, /proc through psutil, a service's stats file, RAPL
energy counters) into rates over the interval since its previous ``sample()``. Kernel paths are
read only through the :class:`~musku.hostfs.HostFS` it is given. ``probe`` never raises for
"unsupported": it returns a typed :class:`~musku.knobs.base.Support` answer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from musku.errors import InputError
from musku.knobs.base import Support

if TYPE_CHECKING:
    from musku.hostfs import HostFS


class Sampler(ABC):
    name: ClassVar[str]

    def __init__(self, fs: HostFS, **options: object) -> None:
        self.fs = fs
        self.options = options

    @abstractmethod
    def probe(self) -> Support:
        """Whether this host has the source, and which mechanism would be used."""

    @abstractmethod
    def start(self) -> None:
        """Take the first reading; the next ``sample()`` covers the time since."""

    @abstractmethod
    def sample(self) -> dict[str, float]:
        """Metrics over the interval since the previous reading (may be empty: no new data)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files/descriptors."""


def option_float(options: dict[str, object], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"sampler option {key} must be a number, not {value!r}")
    return float(value)


__all__ = ["Sampler", "Support", "option_float"]
