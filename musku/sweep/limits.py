"""What the built-in sweep strategies refuse, shared by their registered objects
(:mod:`musku.sweep.modes`, at load time) and their runs (:mod:`musku.sweep.strategies`,
:mod:`musku.sweep.multiarm`, again for experiments built in code)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from musku.domain import Direction
from musku.errors import InputError

if TYPE_CHECKING:
    from musku.experiment import Experiment

EXHAUSTIVE_LIMIT = 512
"""Exhaustive sweeps larger than this are refused (narrow [platform.settings] or use search)."""


def check_multiarm(exp: Experiment, n_hosts: int) -> None:
    """A multiarm sweep needs a pool of >= 3 hosts (a group: the baseline and >= 2 settings,
    one host per arm of a Williams rotation) and a higher-is-better primary metric (the group
    runner maximises); the strategy checks the pool it got again (musku.sweep.multiarm)."""
    if n_hosts < 3:
        raise InputError(
            f'[sweep] mode = "multiarm" runs each knob\'s scan on a group of >= 3 hosts '
            f"(the baseline and >= 2 settings, one host per arm of a Williams rotation); "
            f"this pool has {n_hosts}: a single pair cannot hold a group. Set [hosts] fleet = N "
            "(sim) or list N >= 3 agent hosts",
            where=str(exp.path),
        )
    if exp.spec.direction is not Direction.HIGHER:
        raise InputError(
            f'[sweep] mode = "multiarm" scans a higher-is-better primary metric, '
            f"not {exp.spec.metric!r} (direction = lower)",
            where=str(exp.path),
        )
