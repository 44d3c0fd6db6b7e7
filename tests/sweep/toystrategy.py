"""A sweep strategy from outside the musku package: ``first-better`` walks each knob's settings
in the catalog's order and keeps the first one measured significantly better than the
baseline (no run-offs). musku's code names it nowhere: it plugs in as ``[sweep] mode =
"tests.sweep.toystrategy:FirstBetter"`` (docs/architecture.md "How to add a sweep strategy";
tests/sweep/test_out_of_tree_strategy.py)."""

from __future__ import annotations

from typing import Any

from musku.domain import Configuration, Decision
from musku.errors import InputError
from musku.sweep.modes import Strategy
from musku.sweep.runner import KnobOutcome, Runner

TARGET = "tests.sweep.toystrategy:FirstBetter"


class FirstBetter(Strategy):
    name = "first-better"

    def check(self, experiment: Any) -> None:
        if len(experiment.service.knobs) > 8:
            raise InputError("first-better scans at most 8 knobs", where=str(experiment.path))

    def plan(self, experiment: Any, single: int, validations: int) -> tuple[int, str]:
        return single + validations, "each knob's settings in order until one is better"

    def run(self, runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
        exp = runner.experiment
        base = exp.baseline_config
        best = base
        outcomes = []
        for knob in exp.service.knobs:
            o = KnobOutcome(knob=knob, baseline_value=base[knob], best_value=base[knob])
            for value in exp.space[knob]:
                if value == base[knob]:
                    continue
                result = runner.compare(f"knob:{knob}", base, base.with_(knob, value))
                o.results.append(result)
                if result.decision is Decision.BETTER:
                    o.best_value = value
                    best = best.with_(knob, value)
                    break
            outcomes.append(o)
        return best, outcomes


class Unnamed:
    """Refused at load: no name, no methods."""
