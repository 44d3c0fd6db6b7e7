"""``musku sweep``: experiment file -> host pair -> strategy -> soft SKU -> results DB."""

from __future__ import annotations

import threading
from typing import Any

from musku.domain import ExperimentStatus
from musku.errors import HostError, Interrupted, MuskuError
from musku.experiment import Experiment
from musku.hosts.base import BACKENDS, HostPair
from musku.registry import load
from musku.sweep.runner import Progress, Runner, SweepReport


def open_pair(experiment: Experiment, *, seed: int | None = None) -> HostPair:
    """Open the experiment's host pair through the backend registry."""
    factory = load(experiment.hosts.backend, BACKENDS, kind="host backend")
    pair: HostPair = factory(experiment, seed=experiment.stats.seed if seed is None else seed)
    return pair


def run_sweep(
    experiment: Experiment,
    *,
    store: Any | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    seed: int | None = None,
) -> SweepReport:
    """Run the experiment's sweep and generate its soft SKU.

    With ``store``, everything is recorded as it happens; ``resume`` continues the latest
    unfinished run of an experiment of the same name. On Ctrl-C (``stop`` set) the
    experiment is marked interrupted and :class:`Interrupted` is raised; what was measured
    stays in the database.
    """
    from musku.registry import load as load_strategy
    from musku.sweep.strategies import STRATEGIES

    strategy = load_strategy(experiment.mode.value, STRATEGIES, kind="sweep mode")
    exp_id = None
    if store is not None:
        previous = store.find_experiment(experiment.name) if resume else None
        if previous is not None and ExperimentStatus(previous.status) in (
            ExperimentStatus.INTERRUPTED,
            ExperimentStatus.RUNNING,  # a crashed run: its open comparisons become aborted
        ):
            exp_id = previous.id
            store.resume(exp_id)
        else:
            if progress is not None and resume:
                progress.message(f"nothing to resume for {experiment.name}: starting a new run")
            exp_id = store.create_experiment(experiment)
            store.set_status(exp_id, ExperimentStatus.RUNNING)

    try:
        pair = open_pair(experiment, seed=seed)
    except MuskuError as exc:
        if store is not None and exp_id is not None:
            stopped = isinstance(exc, HostError)  # hosts unreachable: resumable later
            store.set_status(
                exp_id, ExperimentStatus.INTERRUPTED if stopped else ExperimentStatus.FAILED
            )
        raise
    try:
        if store is not None and exp_id is not None:
            store.add_hosts(exp_id, pair.describe())
        runner = Runner(
            experiment,
            pair,
            store=store,
            experiment_id=exp_id,
            progress=progress,
            stop=stop,
            seed=seed,
        )
        best, outcomes = strategy(runner)
        sku = runner.generate_softsku(best)
        if store is not None and exp_id is not None:
            store.save_softsku(exp_id, sku)
            store.set_status(exp_id, ExperimentStatus.DONE)
        pair.restore()
    except (Interrupted, HostError):
        # a stop, not a verdict on the experiment: what was measured is kept for --resume
        if store is not None and exp_id is not None:
            store.set_status(exp_id, ExperimentStatus.INTERRUPTED)
        pair.restore()
        raise
    except BaseException:
        if store is not None and exp_id is not None:
            store.set_status(exp_id, ExperimentStatus.FAILED)
        pair.restore()
        raise
    finally:
        pair.close()
    return SweepReport(
        experiment=experiment.name,
        mode=experiment.mode.value,
        baseline=experiment.baseline_config,
        best=best,
        knobs=outcomes,
        sku=sku,
        comparisons=len(runner.results),
        measured=runner.measured,
        host_time_s=runner.host_time(),
        experiment_id=exp_id,
    )
