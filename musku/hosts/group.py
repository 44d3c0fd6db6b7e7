"""What a multi-arm scan drives: a group of hosts measured together (:class:`HostGroup`).

Each backend that runs groups implements it (:class:`musku.sim.group.SimGroup`,
:class:`musku.hosts.agent.AgentGroup`); the scan itself is :func:`musku.design.group.run_scan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from musku.domain import Configuration

FloatArray = NDArray[np.float64]


class HostGroup(Protocol):
    """What a multi-arm scan drives: ``n`` hosts, one configuration each, measured together.

    :class:`musku.sim.group.SimGroup` (simulated) and :class:`musku.hosts.agent.AgentGroup` (agent hosts)
    implement it. ``apply`` puts host ``h`` on ``configs[h]`` on every host or on none (a
    failure rolls every host back and raises :class:`~musku.errors.HostError`) and returns the
    seconds it took; ``measure(count)`` returns ``count`` windows of ``tick_s`` seconds of the
    primary metric, shape ``(count, n)``; ``t`` is the group's clock in seconds."""

    n: int
    names: list[str]

    @property
    def t(self) -> float: ...

    @property
    def tick_s(self) -> float: ...

    def apply(self, configs: Sequence[Configuration]) -> float: ...

    def measure(self, count: int) -> FloatArray: ...
