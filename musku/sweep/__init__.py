"""Sweeps: the strategies (``[sweep] mode``, registered objects in :mod:`musku.sweep.modes`),
the runner, the soft-SKU generator and the dry-run planner (:mod:`musku.sweep.plan`).

The re-exports below load when first used, so that the experiment loader's lookup of a mode
(:mod:`musku.sweep.modes`) does not import the runner, the tester and the results store.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KnobOutcome": "musku.sweep.runner",
    "Runner": "musku.sweep.runner",
    "SweepReport": "musku.sweep.runner",
    "calibrate_experiment": "musku.sweep.sweep",
    "experiment_run": "musku.sweep.sweep",
    "open_pair": "musku.sweep.sweep",
    "run_abtest": "musku.sweep.sweep",
    "run_sweep": "musku.sweep.sweep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'musku.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
