"""The ``qsim`` host backend (``[hosts] backend = "qsim"``): a pair of hosts simulated by the
queueing simulator (:mod:`musku.qsim.hosts`, docs/qsim.md)."""

from __future__ import annotations

from musku.experiment import Experiment
from musku.hosts.backend import Backend
from musku.qsim.hosts import QsimPair, open_pair
from musku.schema.hosts import QsimOptions


class QsimBackend(Backend):
    """One pair, each host's windows run by the queueing model."""

    name = "qsim"
    options = QsimOptions

    def open_pair(self, experiment: Experiment, *, seed: int = 0) -> QsimPair:
        return open_pair(experiment, seed=seed)
