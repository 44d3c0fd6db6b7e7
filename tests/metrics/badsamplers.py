"""Sampler plug-ins the registry refuses when an agent configuration names them (one line
naming the plug-in, exit 3, before the agent runs): tests/metrics/test_out_of_tree_sampler.py."""

from __future__ import annotations

from typing import ClassVar

from musku.knobs.base import Support
from musku.metrics.base import Sampler


class Twice(Sampler):
    """Takes the built-in ``perf`` sampler's name."""

    name: ClassVar[str] = "perf"

    def probe(self) -> Support:
        return Support(True)

    def start(self) -> None:
        pass

    def sample(self) -> dict[str, float]:
        return {}


class NoSample(Sampler):  # abstract on purpose: no sample()
    name: ClassVar[str] = "no_sample"

    def probe(self) -> Support:
        return Support(True)

    def start(self) -> None:
        pass


class NotASampler:
    """Has the methods, but is not a musku.metrics.base.Sampler."""

    name = "duck"

    def probe(self) -> Support:
        return Support(True)

    def start(self) -> None:
        pass

    def sample(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class Exploding(Twice):
    """Its constructor fails with a plain exception (a plug-in's own bug)."""

    name: ClassVar[str] = "exploding"

    def __init__(self, fs: object, **options: object) -> None:
        raise ZeroDivisionError("division by zero")
