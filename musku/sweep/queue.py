"""The comparison queue: several controllers and workers share one sweep (issue 20).

On PostgreSQL a sweep is a queue of comparisons in the results DB (``comparison_queue``,
revision 0007). The strategies are deterministic functions of the answers, so the sweep's
controller does not need to measure what it asks for: :class:`SharedRunner` enqueues each
comparison the strategy needs (with the seed the strategy's order gives it), claims it with
``SELECT ... FOR UPDATE SKIP LOCKED`` and measures it on its own pair, or, when a ``musku
worker`` (:mod:`musku.sweep.worker`) holds it, waits for the answer, measuring other queued
comparisons meanwhile. Claims last a lease renewed by a heartbeat thread; a claim whose lease
ran out (its claimer was SIGKILLed) is claimed again and its half-measured comparison is
aborted and measured again, once. (The pattern of Optuna's RDB storage heartbeats and
procrastinate's job queue.)

The same heartbeat thread watches the experiment's status on every backend: ``musku abort``
makes a running controller stop at its next beat, roll its hosts back and exit with
:class:`Aborted`. SQLite runs one controller per experiment and measures everything itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from musku.abtest import run_comparison
from musku.domain import ComparisonResult, Configuration, Decision, ExperimentStatus
from musku.errors import ExitStatus, Interrupted, MuskuError
from musku.experiment import Experiment
from musku.hosts.base import HostPair
from musku.owner import controller_id
from musku.storage.protocols import ResultStore
from musku.storage.records import QueueItem
from musku.sweep.runner import Progress, Runner

log = logging.getLogger(__name__)

LEASE_S = 60.0
"""How long a queue claim lasts without a heartbeat (``MUSKU_QUEUE_LEASE_S`` overrides it);
claimers renew it every sixth of that, and watch for ``musku abort`` as often."""
POLL_S = 0.5  # how often a waiting controller or an idle worker looks at the queue


def lease_s() -> float:
    """The queue lease: ``MUSKU_QUEUE_LEASE_S`` (seconds, > 0) or :data:`LEASE_S`."""
    raw = os.environ.get("MUSKU_QUEUE_LEASE_S", "")
    try:
        value = float(raw) if raw else LEASE_S
    except ValueError:
        value = LEASE_S
    return value if value > 0 else LEASE_S


class Aborted(MuskuError):
    """The experiment was aborted by an operator (``musku abort``): the run stopped and its
    hosts were rolled back (exit status 130, as any clean stop)."""

    status = ExitStatus.INTERRUPTED


class Watch:
    """The claimer's heartbeat thread: renews its queue claims (PostgreSQL) and, for the
    sweep's controller, its experiment claim, every sixth of the lease; sets ``stop`` when the
    experiment is aborted. Uses the Store's engine only (thread-safe)."""

    def __init__(
        self,
        store: ResultStore,
        exp_id: int,
        claimer: str,
        stop: threading.Event,
        *,
        lease: float,
        shared: bool,
        controller: bool,
    ) -> None:
        self.store, self.exp_id, self.claimer, self.stop = store, exp_id, claimer, stop
        self.lease, self.shared, self.controller = lease, shared, controller
        self.aborted = False
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, name="musku-queue", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._quit.wait(self.lease / 6):
            try:
                if self.shared:
                    self.store.beat_queued(self.claimer, self.lease)
                if self.controller:  # the experiment claim too, as often (ClaimKeeper's beat)
                    self.store.heartbeat(self.exp_id, self.claimer)
                if self.store.status_of(self.exp_id) is ExperimentStatus.ABORTED:
                    self.aborted = True
                    self.stop.set()
                    return
            except MuskuError as exc:  # a DB hiccup: the next beat retries
                log.error("experiment %d: queue heartbeat failed: %s", self.exp_id, exc.one_line())

    def close(self) -> None:
        self._quit.set()
        self._thread.join(timeout=30)


class SharedRunner(Runner):
    """A :class:`Runner` whose comparisons go through the DB queue on PostgreSQL, and which
    stops when the experiment is aborted (every backend). Use :func:`shared_runner`."""

    def __init__(
        self,
        experiment: Experiment,
        pair: HostPair,
        *,
        claimer: str | None = None,
        lease: float | None = None,
        poll_s: float = POLL_S,
        controller: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(experiment, pair, **kwargs)
        self.claimer = claimer or controller_id()
        self.lease = lease if lease is not None else lease_s()
        self.poll_s = poll_s
        self.controller = controller  # False: a worker (holds no experiment claim)
        self.shared = bool(
            self.store is not None and self.experiment_id is not None and self.store.shared
        )
        self.elsewhere = 0  # comparisons answered by another claimer's measurement
        self._watch: Watch | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        if self.store is not None and self.experiment_id is not None and self._watch is None:
            self._watch = Watch(
                self.store,
                self.experiment_id,
                self.claimer,
                self.stop,
                lease=self.lease,
                shared=self.shared,
                controller=self.controller,
            )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self.shared:
            assert self.store is not None and self.experiment_id is not None
            try:
                self.store.release_queued(self.experiment_id, self.claimer)
            except MuskuError as exc:  # its lease runs out on its own
                log.error("queue claims not released: %s", exc.one_line())

    @property
    def aborted(self) -> bool:
        return self._watch is not None and self._watch.aborted

    def _check_aborted(self) -> None:
        """Read the experiment's status now (not at the next beat): raise :class:`Aborted`
        when an operator aborted it."""
        assert self.store is not None and self.experiment_id is not None
        if self.store.status_of(self.experiment_id) is ExperimentStatus.ABORTED:
            if self._watch is not None:
                self._watch.aborted = True
            self.stop.set()
            raise self._stopped("aborted")

    def _stopped(self, text: str) -> MuskuError:
        if self.aborted:
            return Aborted(
                f"experiment {self.experiment_id} ({self.experiment.name}) was aborted "
                "(musku abort): stopped and rolled back"
            )
        return Interrupted(text)

    # ------------------------------------------------------------------ comparisons
    def claim_next(self) -> QueueItem | None:
        """Claim the experiment's oldest claimable queued comparison (a worker's step)."""
        assert self.store is not None and self.experiment_id is not None
        item: QueueItem | None = self.store.claim_queued(
            self.experiment_id, self.claimer, lease_s=self.lease
        )
        return item

    def compare(
        self,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        *,
        futility: float | None = None,
    ) -> ComparisonResult:
        # shared (a queue that workers claim): the row carries no question, so the
        # comparison is two-sided whatever ``futility`` says (docs/abtest.md)
        if not self.shared:
            try:
                return super().compare(purpose, baseline, candidate, futility=futility)
            except Interrupted as exc:
                raise self._stopped(exc.message) from None
        assert self.store is not None and self.experiment_id is not None
        if self.stop.is_set():
            raise self._stopped("stopped before finishing")
        self._counter += 1
        key = (purpose, baseline.key(), candidate.key())
        cached = self.answered(purpose, key)
        if cached is not None:
            return cached
        seed = self.seed * 100_003 + self._counter  # as Runner.compare: whoever measures it
        item_id = self.store.enqueue(self.experiment_id, purpose, baseline, candidate, seed)
        while True:
            if self.stop.is_set():
                raise self._stopped(f"stopped waiting for {purpose}")
            item = self.store.claim_queued(
                self.experiment_id, self.claimer, lease_s=self.lease, prefer=item_id
            )
            if item is not None:
                result = self.measure(item)
                if item.id == item_id and result is not None:
                    self.results.append((purpose, result))
                    self.clock_s += result.host_time_s
                    return result
                continue
            done = self.store.queued_result(item_id)
            if done is not None:
                self.elsewhere += 1
                self._cache[key] = done
                self.results.append((purpose, done))
                self.clock_s += done.host_time_s
                self.progress.comparison_finished(purpose, done, True)
                return done
            self._check_aborted()  # nothing is claimable in an aborted experiment
            self.stop.wait(self.poll_s)

    def measure(self, item: QueueItem) -> ComparisonResult | None:
        """Measure a claimed queue row on this runner's pair and store its result with the row
        (None: another claimer took the row over meanwhile; its result counts)."""
        assert self.store is not None
        store, claimer = self.store, self.claimer
        self.progress.comparison_started(item.purpose, item.baseline, item.candidate)
        cmp_id = store.start_queued(item, claimer, hosts=self.host_names())
        on_window, on_warmup = self.sinks(cmp_id)
        should_stop: Callable[[], bool] = self.stop.is_set
        try:
            result = run_comparison(
                self.pair,
                item.baseline,
                item.candidate,
                self.experiment.spec,
                on_window=on_window,
                on_warmup=on_warmup,
                on_progress=self.progress.comparison_progress,
                should_stop=should_stop,
                seed=item.seed,
                memory=self.memory,
            )
        except BaseException:
            # the pair failed (a pool runs the comparison again on another pair) or a crash:
            # the row goes back to the queue at once, its comparison aborted
            with contextlib.suppress(MuskuError):
                store.release_queued(item.experiment_id, claimer, item_id=item.id)
            raise
        stored = store.finish_queued(item.id, claimer, cmp_id, result)
        if result.decision is Decision.ABORTED:
            raise self._stopped(f"stopped during {item.purpose} ({result.samples} samples kept)")
        if not stored:
            self._check_aborted()  # the abort released the claim
            self.progress.message(
                f"{item.purpose}: another claimer took it over while this one measured; "
                "its result counts"
            )
            return None
        self.measured += 1
        self._cache[(item.purpose, item.baseline.key(), item.candidate.key())] = result
        self.progress.comparison_finished(item.purpose, result, False)
        return result


@contextlib.contextmanager
def shared_runner(
    experiment: Experiment,
    pair: HostPair,
    *,
    store: ResultStore | None,
    experiment_id: int | None,
    progress: Progress | None,
    stop: threading.Event | None,
    seed: int | None,
    pool: Any | None = None,
) -> Iterator[Runner]:
    """The runner a sweep uses (the hook in :func:`musku.sweep.sweep._run_claimed`): a
    :class:`SharedRunner` with its heartbeat thread when there is a store, else a Runner."""
    if store is None or experiment_id is None:
        yield Runner(
            experiment, pair, store=store, experiment_id=experiment_id, progress=progress,
            stop=stop, seed=seed, pool=pool,
        )  # fmt: skip
        return
    runner = SharedRunner(
        experiment,
        pair,
        store=store,
        experiment_id=experiment_id,
        progress=progress,
        stop=stop,
        seed=seed,
        pool=pool,
    )
    runner.start()
    try:
        yield runner
    finally:
        runner.close()


def experiment_rows(store: ResultStore, *, running_only: bool = False) -> list[dict[str, Any]]:
    """``musku experiments``: each experiment with its hosts, status, controller claim
    (holder, heartbeat age), queue claims and queued/claimed/done comparison counts."""
    states = store.queue_states()
    rows: list[dict[str, Any]] = []
    for rec in store.experiments():
        if running_only and rec.status in (
            ExperimentStatus.DONE,
            ExperimentStatus.FAILED,
            ExperimentStatus.ABORTED,
        ):
            continue
        state = states.get(rec.id)
        ctl = state.controller if state is not None else None
        rows.append(
            {
                "id": rec.id,
                "name": rec.name,
                "mode": rec.mode,
                "status": rec.status.value,
                "hosts": [h.name for h in rec.hosts],
                "controller": None
                if ctl is None
                else {
                    "id": ctl.holder,
                    "host": ctl.host,
                    "pid": ctl.pid,
                    "heartbeat_age_s": ctl.heartbeat_age_s,
                },
                "claims": []
                if state is None
                else [
                    {"claimer": c.holder, "heartbeat_age_s": c.heartbeat_age_s}
                    for c in state.claims
                ],
                "queue": dict(state.counts) if state is not None else {},
            }
        )
    return rows
