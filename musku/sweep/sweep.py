"""``musku sweep``: experiment file -> host pair -> strategy -> soft SKU -> results DB."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from musku.abtest.calibrate import calibrate_pair
from musku.abtest.calibration import PairCalibration
from musku.abtest.periods import summary as period_summary
from musku.domain import (
    ComparisonResult,
    Configuration,
    ExperimentStatus,
    TimeBreakdown,
    run_kind,
)
from musku.errors import HostError, InputError, Interrupted, MuskuError
from musku.experiment import Experiment
from musku.hosts.backend import backend_of
from musku.hosts.base import HostPair
from musku.hosts.pool import Locked, open_pool
from musku.owner import controller_id
from musku.storage.protocols import ClaimStore, ResultStore, RunStore
from musku.storage.records import InvalidTransition
from musku.sweep.modes import strategy_of
from musku.sweep.predicted import scan_gains
from musku.sweep.queue import Aborted, shared_runner
from musku.sweep.runner import Progress, Runner, SweepReport
from musku.sweep.schedule import estimate_clock

log = logging.getLogger(__name__)

CLAIM_STALE_S = 60.0  # a claim whose heartbeat is older than this is taken over
HEARTBEAT_S = 10.0  # how often a running controller renews its claim


class ClaimKeeper:
    """Heartbeats this controller's claim on an experiment from a thread (the Store's engine
    only: the runner keeps the Store's sessions), and releases it at the end."""

    def __init__(self, store: ClaimStore, exp_id: int, controller: str, every_s: float) -> None:
        self.store, self.exp_id, self.controller, self.every_s = store, exp_id, controller, every_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="musku-claim", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                if not self.store.heartbeat(self.exp_id, self.controller):
                    self.lost = True
                    log.error("experiment %d: another controller took the claim over", self.exp_id)
                    return
            except MuskuError as exc:  # a DB hiccup: the next beat retries
                log.error("experiment %d: heartbeat failed: %s", self.exp_id, exc.one_line())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if not self.lost:
            try:
                self.store.release(self.exp_id, self.controller)
            except MuskuError as exc:  # it goes stale on its own
                log.error("experiment %d: claim not released: %s", self.exp_id, exc.one_line())


def claim_experiment(store: ClaimStore, exp_id: int, stale_s: float) -> None:
    """Claim experiment ``exp_id`` for this process's controller (:meth:`Store.claim`)."""
    store.claim(exp_id, controller_id(), socket.gethostname(), os.getpid(), stale_s=stale_s)


def resumable(store: RunStore, experiment: Experiment, mode: str | None) -> Any:
    """The run ``--resume`` continues: the latest run of the experiment's name and kind (a
    sweep: :func:`musku.domain.run_kind`) when it is interrupted or was left running, None when
    there is none. Refused (one line, exit 3; nothing written) when that run is finished,
    failed or aborted: resuming it would measure nothing, and a new run is what a fresh
    ``musku sweep FILE`` starts."""
    kind = run_kind(mode or experiment.mode)
    runs = [r for r in store.runs_named(experiment.name) if run_kind(r[1]) == kind]
    if not runs:
        return None
    run_id, _, status = runs[-1]
    if status in (ExperimentStatus.INTERRUPTED, ExperimentStatus.RUNNING):
        return store.experiment(run_id)
    raise InputError(
        f"nothing to resume: the latest {kind} of {experiment.name!r} (run {run_id}) is "
        f"{status.value}; `musku sweep {experiment.path}` starts a new run"
    )


def open_pair(experiment: Experiment, *, seed: int | None = None) -> HostPair:
    """Open the experiment's host pair through the backend registry."""
    return backend_of(experiment).open_pair(
        experiment, seed=experiment.stats.seed if seed is None else seed
    )


@contextlib.contextmanager
def experiment_run(
    experiment: Experiment,
    *,
    store: ResultStore | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    seed: int | None = None,
    mode: str | None = None,
    claim_stale_s: float = CLAIM_STALE_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> Iterator[Runner]:
    """One run of an experiment on its host pair: the life cycle every command shares.

    Records the run (or, with ``resume``, continues the latest unfinished one of the same
    name), opens the pair, yields a :class:`Runner`, and on the way out puts the hosts back
    and marks the run done; interrupted on Ctrl-C or a host failure (what was measured is
    kept for ``--resume``); failed on anything else.

    The run is claimed for this controller in the DB and heartbeated every ``heartbeat_s``:
    a run another live controller holds (heartbeat younger than ``claim_stale_s``) is refused
    with :class:`~musku.storage.store.ClaimHeld` before anything changes; a stale claim (a
    crashed controller) is taken over.
    """
    if seed is not None and seed != experiment.stats.seed:
        # the run's seed is recorded as its statistics' seed (the report's rerun line)
        spec = experiment.spec
        stats = dataclasses.replace(spec.stats, seed=seed)
        experiment = dataclasses.replace(experiment, spec=dataclasses.replace(spec, stats=stats))
    exp_id = None
    keeper: ClaimKeeper | None = None
    if store is not None:
        previous = resumable(store, experiment, mode) if resume else None
        if previous is not None and ExperimentStatus(previous.status) in (
            ExperimentStatus.INTERRUPTED,
            ExperimentStatus.RUNNING,  # a crashed run: its open comparisons become aborted
        ):
            exp_id = previous.id
            claim_experiment(
                store, exp_id, claim_stale_s
            )  # first: a live controller's run is not ours
            try:
                store.resume(exp_id)
            except BaseException:
                store.release(exp_id, controller_id())
                raise
        else:
            # a new run is an experiment row of its own: runs of one file may go on side by side
            if progress is not None and resume:
                progress.message(f"nothing to resume for {experiment.name}: starting a new run")
            exp_id = store.create_experiment(experiment, mode=mode)
            claim_experiment(store, exp_id, claim_stale_s)
            store.set_status(exp_id, ExperimentStatus.RUNNING)
        keeper = ClaimKeeper(store, exp_id, controller_id(), heartbeat_s)
    try:
        yield from _run_claimed(experiment, store, exp_id, progress, stop, seed)
    finally:
        if keeper is not None:
            keeper.close()


def _run_claimed(
    experiment: Experiment,
    store: ResultStore | None,
    exp_id: int | None,
    progress: Progress | None,
    stop: threading.Event | None,
    seed: int | None,
) -> Iterator[Runner]:

    def mark(status: ExperimentStatus) -> None:
        if store is not None and exp_id is not None:
            store.set_status(exp_id, status)

    run_seed = experiment.stats.seed if seed is None else seed
    try:
        pool = open_pool(experiment, seed=run_seed, open_pair=lambda e, s: open_pair(e, seed=s))
    except MuskuError as exc:
        # hosts unreachable: resumable later
        mark(
            ExperimentStatus.INTERRUPTED if isinstance(exc, HostError) else ExperimentStatus.FAILED
        )
        raise
    try:
        if store is not None:
            pool.use_store(store)  # co-tuning looks threading tables up there and saves them
        if store is not None and exp_id is not None:
            store.add_hosts(exp_id, pool.describe())
        if progress is not None and len(pool) > 1:
            idle = f"; {', '.join(pool.idle)} idles (odd pool)" if pool.idle else ""
            failed = f"; {len(pool.failed)} pair(s) unreachable" if pool.failed else ""
            progress.message(f"pool of {len(pool.names)} hosts: {len(pool)} pairs{idle}{failed}")
        shared = len(pool) > 1  # the pool's threads share the store and the display
        live = pool.live()
        if progress is not None and len(pool.names) > 2 and len(live) == 1:
            # a pool asked for, one pair to run it on: said once, then today's sweep
            progress.message(
                f"pool of {len(pool.names)} hosts has one usable pair "
                f"({'+'.join(pool.host_names(live[0]))}): pooling degenerates to that pair's "
                "own tests, one comparison at a time"
            )
        # --- queue hook (issue 20): the DB comparison queue and `musku abort` (sweep/queue.py)
        with shared_runner(
            experiment,
            pool.pairs[live[0]],
            store=Locked(store) if shared and store is not None else store,
            experiment_id=exp_id,
            progress=Locked(progress) if shared and progress is not None else progress,
            stop=stop,
            seed=seed,
            pool=pool if shared else None,
        ) as runner:
            yield runner
        mark(ExperimentStatus.DONE)
        pool.restore()
    except (Interrupted, HostError):
        # a stop, not a verdict on the experiment: what was measured is kept for --resume
        mark(ExperimentStatus.INTERRUPTED)
        pool.restore()
        raise
    except BaseException:
        mark(ExperimentStatus.FAILED)
        pool.restore()
        raise
    finally:
        pool.close()


def run_sweep(
    experiment: Experiment,
    *,
    store: ResultStore | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    seed: int | None = None,
    claim_stale_s: float = CLAIM_STALE_S,
) -> SweepReport:
    """Run the experiment's sweep and generate its soft SKU.

    With ``store``, everything is recorded as it happens; ``resume`` continues the latest
    unfinished run of an experiment of the same name. On Ctrl-C (``stop`` set) the
    experiment is marked interrupted and :class:`Interrupted` is raised; what was measured
    stays in the database.
    """
    strategy = strategy_of(experiment).run
    if experiment.order_by == "prediction":  # before the run is recorded: no model, exit 3
        if progress is not None:
            progress.message(
                f"{experiment.name}: predicting each setting's gain to order the scans"
            )
        scan_gains(experiment)
    with experiment_run(
        experiment,
        store=store,
        resume=resume,
        progress=progress,
        stop=stop,
        seed=seed,
        claim_stale_s=claim_stale_s,
    ) as runner:
        pairs = len(runner.pool.live()) if runner.pool is not None else 1
        expected = estimate_clock(experiment, pairs)
        best, outcomes = strategy(runner)
        sku = runner.generate_softsku(best)
        if store is not None and runner.experiment_id is not None:
            _save_softsku(store, runner.experiment_id, experiment.name, sku)
    time, missing = TimeBreakdown.total(r for _, r in runner.results)
    return SweepReport(
        experiment=experiment.name,
        mode=experiment.mode,
        baseline=experiment.baseline_config,
        best=best,
        knobs=outcomes,
        sku=sku,
        comparisons=len(runner.results),
        measured=runner.measured,
        host_time_s=runner.host_time(),
        experiment_id=runner.experiment_id,
        clock_s=runner.clock_s,
        pairs=len(runner.pool) if runner.pool is not None else 1,
        host_hours=runner.host_seconds / 3600.0,
        time=time,
        time_missing=missing,
        estimate_clock_s=expected,
        periods=period_summary(experiment.stats.period, (r for _, r in runner.results)),
        timeline=list(runner.timeline),
    )


def _save_softsku(store: ResultStore, exp_id: int, name: str, sku: Any) -> None:
    """Store the run's soft SKU (idempotent on resume). ``musku abort`` that came first wins:
    no soft SKU, the run stops as aborted (:class:`Aborted`, exit 130)."""
    try:
        store.save_softsku(exp_id, sku)
    except InvalidTransition:
        if store.status_of(exp_id) is not ExperimentStatus.ABORTED:
            raise
        raise Aborted(
            f"experiment {exp_id} ({name}) was aborted (musku abort) after its last "
            "comparison: no soft SKU stored; hosts rolled back"
        ) from None


def run_abtest(
    experiment: Experiment,
    baseline: Configuration,
    candidate: Configuration,
    *,
    store: ResultStore | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    seed: int | None = None,
) -> ComparisonResult:
    """One A/B comparison on the experiment's hosts, recorded as a run of its own; on a
    pool of several pairs, on all of them at once (pooled, :mod:`musku.abtest.pooled`)."""
    with experiment_run(
        experiment, store=store, progress=progress, stop=stop, seed=seed, mode="abtest"
    ) as runner:
        return runner.compare_pooled("abtest", baseline, candidate)


def calibrate_experiment(
    experiment: Experiment,
    store: ResultStore | None,
    *,
    seed: int | None = None,
    precision: float = 0.0025,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[PairCalibration | None, Any]:
    """``musku pair calibrate``: open the experiment's pair, run the A/A on its baseline
    configuration, store the calibration (when one could be measured), put the hosts back."""
    pair = open_pair(experiment, seed=seed)
    try:
        if store is not None:
            pair.use_store(store)
        cal, result = calibrate_pair(
            pair,
            experiment.baseline_config,
            experiment.spec,
            precision=precision,
            seed=seed,
            should_stop=should_stop,
        )
        if cal is not None and store is not None:
            cal = dataclasses.replace(cal, id=store.save_calibration(cal))
        pair.restore()
        return cal, result
    finally:
        pair.close()
