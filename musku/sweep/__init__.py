"""Sweeps (independent | exhaustive | search) and the soft-SKU generator."""

from musku.sweep.runner import KnobOutcome, Runner, SweepReport
from musku.sweep.sweep import calibrate_experiment, experiment_run, open_pair, run_abtest, run_sweep

__all__ = [
    "KnobOutcome",
    "Runner",
    "SweepReport",
    "calibrate_experiment",
    "experiment_run",
    "open_pair",
    "run_abtest",
    "run_sweep",
]
