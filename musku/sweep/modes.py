"""A sweep strategy is one registered object, as a host backend is (docs/architecture.md "How
to add a sweep strategy").

A :class:`Strategy` holds what musku asks of a ``[sweep] mode``: its name, the checks of an
experiment that runs it (refused when the file is loaded, by ``musku check`` and ``musku
sweep`` alike), its plan for ``musku sweep --dry-run`` (how many comparisons at most, and what
they are) and :meth:`Strategy.run`, which drives the runner and returns the soft SKU. The
registry is :data:`musku.registry.STRATEGIES`: the built-ins below are aliases; an
out-of-tree strategy is ``[sweep] mode = "package.module:attr"``, a ``musku.strategies``
entry point or ``STRATEGIES.register(...)``.

This module is light (the experiment loader looks modes up here): each built-in's ``run``
imports its implementation (the runner, the tester, numpy and scipy) when a sweep runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from musku.domain import Configuration
from musku.errors import InputError
from musku.registry import BACKENDS, STRATEGIES
from musku.sweep.limits import EXHAUSTIVE_LIMIT, check_multiarm

if TYPE_CHECKING:
    from musku.experiment import Experiment
    from musku.sweep.runner import KnobOutcome, Runner


class Strategy:
    """One ``[sweep] mode``. Subclass it, set :attr:`name`, implement :meth:`run`."""

    name: str = ""
    groups: bool = False
    """It runs on multi-arm groups of a pool's hosts (not on pairs)."""

    def check(self, experiment: Experiment) -> None:
        """Refuse an experiment this strategy cannot run (InputError, one line)."""

    def plan(self, experiment: Experiment, single: int, validations: int) -> tuple[int, str]:
        """``(most comparisons, what they are)`` for ``--dry-run``: ``single`` is the
        comparisons of one scan of every knob against the baseline."""
        return single + validations, "each knob's settings against the baseline"

    def run(self, runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
        """Drive ``runner``: the best configuration and each knob's outcome."""
        raise NotImplementedError


def cross_product(experiment: Experiment) -> int:
    return math.prod(len(v) for v in experiment.space.values())


class _Builtin(Strategy):
    """A strategy of :mod:`musku.sweep.strategies`: the function :attr:`function` there (a
    subclass renamed keeps its parent's)."""

    function = ""

    def run(self, runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
        # lazy: the runner and the tester (scipy); `check` and `sweep --dry-run` load this
        # module (the strategy objects) and run no sweep
        from musku.sweep import strategies

        run = {
            "independent": strategies.independent,
            "exhaustive": strategies.exhaustive,
            "search": strategies.search,
        }[self.function]
        return run(runner)


class Independent(_Builtin):
    name = function = "independent"

    def plan(self, experiment: Experiment, single: int, validations: int) -> tuple[int, str]:
        return single + validations, (
            "each knob's settings against the baseline (an ordered knob's scan may stop early; "
            "close winners get a run-off and a confirmation), then the soft SKU's validations"
        )


class Exhaustive(_Builtin):
    name = function = "exhaustive"

    def check(self, experiment: Experiment) -> None:
        """Over :data:`EXHAUSTIVE_LIMIT` configurations: refused before anything is recorded
        (the strategy repeats the check for experiments built in code)."""
        size = math.prod(len(experiment.space[k]) for k in experiment.service.knobs)
        if size > EXHAUSTIVE_LIMIT:
            raise InputError(
                f"exhaustive sweep of {experiment.name} would compare {size:,} configurations "
                f'(limit {EXHAUSTIVE_LIMIT}): narrow [platform.settings] or use mode = "search"',
                where=str(experiment.path),
            )

    def plan(self, experiment: Experiment, single: int, validations: int) -> tuple[int, str]:
        total = cross_product(experiment)
        note = f"every configuration of the cross product ({total:,}) against the baseline"
        if total > EXHAUSTIVE_LIMIT:
            note += f"; more than {EXHAUSTIVE_LIMIT}: the sweep refuses it (narrow the space or use search)"
        return total - 1 + validations, note


class Search(_Builtin):
    name = function = "search"

    def plan(self, experiment: Experiment, single: int, validations: int) -> tuple[int, str]:
        rounds = experiment.search_rounds
        return single * (1 + rounds) + validations, (
            f"the independent scan, then up to {rounds} coordinate-descent rounds"
        )


class Multiarm(Independent):
    """The independent sweep with each knob's scan as one multi-arm crossover on a group of
    the pool's hosts (:mod:`musku.sweep.multiarm`)."""

    name = "multiarm"
    groups = True

    def check(self, experiment: Experiment) -> None:
        """The pool the file names can hold a group (its backend's pool), and the metric is
        higher-is-better."""
        names = BACKENDS.get(experiment.hosts.backend).pool_names(experiment)
        check_multiarm(experiment, 2 if names is None else len(names))

    def run(self, runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
        from musku.sweep.multiarm import multiarm  # lazy: numpy, the group designs

        return multiarm(runner)


def strategy_of(experiment: Experiment | str) -> Any:
    """The registered strategy an experiment's ``[sweep] mode`` names (or of that name)."""
    return STRATEGIES.get(experiment if isinstance(experiment, str) else experiment.mode)


__all__ = [
    "EXHAUSTIVE_LIMIT",
    "Exhaustive",
    "Independent",
    "Multiarm",
    "Search",
    "Strategy",
    "check_multiarm",
    "strategy_of",
]
