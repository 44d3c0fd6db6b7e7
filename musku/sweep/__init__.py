"""Sweeps (independent | exhaustive | search) and the soft-SKU generator."""

from musku.sweep.runner import KnobOutcome, Runner, SweepReport
from musku.sweep.sweep import open_pair, run_sweep

__all__ = ["KnobOutcome", "Runner", "SweepReport", "open_pair", "run_sweep"]
