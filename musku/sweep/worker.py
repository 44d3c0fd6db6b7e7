"""``musku worker``: measure a running sweep's queued comparisons on this process's own hosts.

A worker shares one experiment with its controller (``musku sweep``) and other workers through
the PostgreSQL comparison queue (:mod:`musku.sweep.queue`): it claims queued comparisons
(``SELECT ... FOR UPDATE SKIP LOCKED``), measures each on the pair its experiment file names,
and stores the result with the row, so each comparison runs once whoever measures it. It ends
when the experiment does. When the experiment's controller is dead (its claim's heartbeat is
older than ``claim_stale_s``, the experiment still ``running``), the worker takes the sweep
over as its controller (``musku sweep --resume``'s path) and finishes it from the DB.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.domain import ExperimentStatus
from musku.errors import InputError
from musku.experiment import Experiment, load_experiment
from musku.owner import controller_id
from musku.storage.protocols import QueueStore, ResultStore
from musku.sweep.queue import POLL_S, SharedRunner, lease_s
from musku.sweep.runner import NullProgress, Progress, SweepReport
from musku.sweep.sweep import CLAIM_STALE_S, open_pair, run_sweep

FINISHED = (ExperimentStatus.DONE, ExperimentStatus.FAILED, ExperimentStatus.ABORTED)


@dataclass
class WorkerReport:
    experiment_id: int
    experiment: str
    measured: int = 0  # comparisons this worker measured and stored
    status: str = ""  # the experiment's status when the worker ended
    took_over: bool = False  # the worker finished the sweep as its controller
    takeover_s: float | None = None  # from the controller's last heartbeat to the takeover
    sweep: SweepReport | None = None
    comparisons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment_id": self.experiment_id,
            "experiment": self.experiment,
            "measured": self.measured,
            "status": self.status,
            "took_over": self.took_over,
            "takeover_s": self.takeover_s,
            "comparisons": self.comparisons,
            "sweep": self.sweep.to_dict() if self.sweep is not None else None,
        }


def resolve(target: str, store: ResultStore) -> tuple[Experiment, int]:
    """``EXPERIMENT_FILE_OR_ID`` -> (experiment, id): a file names the latest run of its
    experiment in the DB; an id names a run, whose stored file path is loaded."""
    path = Path(target)
    if path.suffix == ".toml" or path.exists():
        experiment = load_experiment(path)
        rec = store.find_experiment(experiment.name)
        if rec is None:
            raise InputError(
                f"no run of experiment {experiment.name!r} in {store.url}: start it with "
                f"`musku sweep {target} --db ...` first"
            )
        return experiment, rec.id
    try:
        ident = int(target)
    except ValueError:
        raise InputError(f"{target}: neither an experiment file nor an experiment id") from None
    rec = store.find_experiment(ident)
    if rec is None:
        raise InputError(f"no experiment with id {ident} in {store.url}")
    if not Path(rec.path).is_file():
        raise InputError(
            f"experiment {ident}'s file {rec.path} is not here: give the experiment file instead"
        )
    return load_experiment(Path(rec.path)), rec.id


def _controller_age(store: QueueStore, exp_id: int) -> float | None:
    """Seconds since the experiment's controller last beat (None: no controller holds it)."""
    state = store.queue_states([exp_id])[exp_id]
    if state.controller is None:
        return None
    age: float | None = state.controller.heartbeat_age_s
    return age if age is not None else float("inf")


def run_worker(
    target: str,
    store: ResultStore,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
    claim_stale_s: float = CLAIM_STALE_S,
    take_over: bool = True,
    poll_s: float = POLL_S,
) -> WorkerReport:
    """Claim and measure the experiment's queued comparisons until it ends (see the module)."""
    store.need_queue()
    stop = stop or threading.Event()
    progress = progress or NullProgress()
    experiment, exp_id = resolve(target, store)
    report = WorkerReport(experiment_id=exp_id, experiment=experiment.name)
    pair = open_pair(experiment)
    closed = False
    runner = SharedRunner(
        experiment,
        pair,
        store=store,
        experiment_id=exp_id,
        progress=progress,
        stop=stop,
        claimer=controller_id(),
        lease=lease_s(),
        poll_s=poll_s,
        controller=False,
    )
    runner.start()
    try:
        pair.use_store(store)
        while not stop.is_set():
            status = store.status_of(exp_id)
            if status in FINISHED:
                break
            if status is ExperimentStatus.RUNNING:
                item = runner.claim_next()
                if item is not None:
                    if runner.measure(item) is not None:
                        report.comparisons.append(item.purpose)
                    continue
            age = _controller_age(store, exp_id)
            if status is ExperimentStatus.INTERRUPTED and age is None:
                break  # its controller stopped it (Ctrl-C): nothing to share until a --resume
            if (
                take_over
                and status is ExperimentStatus.RUNNING
                and (age is None or age > claim_stale_s)
            ):
                runner.close()
                pair.restore()
                pair.close()
                closed = True
                report.takeover_s = age
                progress.message(
                    f"experiment {exp_id}: its controller is gone (heartbeat "
                    f"{'never' if age is None else f'{age:.0f}s ago'}): taking the sweep over"
                )
                started = time.monotonic()
                report.sweep = run_sweep(
                    experiment,
                    store=store,
                    resume=True,
                    progress=progress,
                    stop=stop,
                    claim_stale_s=claim_stale_s,
                )
                report.took_over = True
                progress.message(f"sweep finished {time.monotonic() - started:.1f}s after takeover")
                break
            stop.wait(poll_s)
        if stop.is_set() and not report.took_over:
            raise runner._stopped("worker stopped")
    finally:
        if not closed:
            runner.close()
            pair.restore()
            pair.close()
    report.measured = runner.measured
    report.status = store.status_of(exp_id).value
    return report
