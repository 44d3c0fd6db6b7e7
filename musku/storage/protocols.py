"""The results store's interfaces: one typed :class:`~typing.Protocol` per concern.

Callers annotate with the protocols they use rather than with the concrete
:class:`~musku.storage.store.Store` (which implements them all): a function that only reads
comparisons and samples takes a :class:`ComparisonStore` and :class:`SampleStore` (or a
protocol that derives from both), so a reader and mypy can see what it touches, and another
store (a fake, a remote one) can stand in for it. :class:`ResultStore` is all of them with the
open database's own attributes. The shared contract suite
(:class:`musku.testing.storage.StorageContract`) checks them on SQLite and PostgreSQL.

Each protocol is implemented by one repository module of this package; cheap to import
(no SQLAlchemy): what the signatures name beyond the domain and the records is imported for
type checking only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from musku.domain import (
    ComparisonResult,
    Configuration,
    DeploymentStatus,
    ExperimentStatus,
    SoftSku,
)
from musku.storage.records import (
    ComparisonRecord,
    DeploymentRecord,
    ExperimentRecord,
    QueueItem,
    QueueState,
    SoftSkuRecord,
    ThreadingTableRecord,
    WatchRecord,
)

if TYPE_CHECKING:
    from musku.domain import PairCalibration
    from musku.experiment import Experiment


class RunStore(Protocol):
    """Runs of experiments (``experiments`` rows): creating and finding them, their life cycle
    (``created -> running -> done | failed``, resume), their hosts and what the report reads of
    them. Implemented by :class:`musku.storage.runs.Runs`."""

    def create_experiment(self, experiment: Experiment, *, mode: str | None = None) -> int:
        """Record a new experiment (status ``created``); returns its id. ``mode`` overrides the
        file's sweep mode for runs that are not sweeps (``abtest``)."""

    def find_experiment(self, name_or_id: str | int) -> ExperimentRecord | None:
        """The latest experiment of that name, else the experiment with that id."""

    def runs_named(self, name: str) -> list[tuple[int, str, ExperimentStatus]]:
        """(id, mode, status) of every run (``experiments`` row) of that name, oldest first:
        what :func:`musku.storage.lookup.find_run` chooses from."""

    def experiment(self, exp_id: int) -> ExperimentRecord: ...

    def experiments(self) -> list[ExperimentRecord]: ...

    def delete_experiment(self, exp_id: int) -> None:
        """Delete an experiment with its hosts, comparisons, samples, decisions and soft SKUs.
        Configurations stay (they are shared)."""

    def set_status(self, exp_id: int, status: ExperimentStatus) -> None:
        """Move an experiment along ``created -> running -> (interrupted -> running)* -> done |
        failed``; any other change raises :class:`InvalidTransition`."""

    def resume(self, exp_id: int) -> int:
        """Continue an experiment for ``--resume``: ``interrupted -> running``, or, for one a
        crashed run left ``running``, ``running -> interrupted -> running``; comparisons that
        run left ``running`` become ``aborted``. Returns how many were aborted. A done or failed
        experiment is final (:class:`InvalidTransition`): start a new run instead."""

    def add_hosts(self, exp_id: int, describe: Mapping[str, Any]) -> None:
        """Record the pair's hosts from ``HostPair.describe()``: ``{"hosts": [name | {name,
        ...facts}], "backend": ..., other shared facts}``. Calling it again (on resume) updates
        the rows by host index."""

    def experiment_meta(self, exp_id: int) -> dict[str, Any]:
        """What the report needs beyond the record: ``resolved`` (space, stock, production,
        statistics...) and ``musku_version`` of the musku that created the row."""


class ClaimStore(Protocol):
    """Which controller runs an experiment (docs/cli.md "Several controllers"): its claim,
    heartbeat and release, the status a heartbeat thread reads, and ``musku abort``, which takes
    a run from its controller. Implemented by :class:`musku.storage.claims.Claims`."""

    def claim(
        self, exp_id: int, controller: str, host: str, pid: int, *, stale_s: float = 60.0
    ) -> None:
        """Claim experiment ``exp_id`` for this controller (docs/cli.md "Several controllers")."""

    def heartbeat(self, exp_id: int, controller: str) -> bool:
        """Refresh this controller's claim; False when it no longer holds it (taken over). Safe
        from another thread: it uses the engine only, not this Store's sessions."""

    def release(self, exp_id: int, controller: str) -> None:
        """Give the claim up (the end of a run); a claim another controller took is left alone."""

    def status_of(self, exp_id: int) -> ExperimentStatus:
        """The experiment's status, read from another thread (the engine only)."""

    def abort_experiment(self, exp_id: int, *, stale_s: float = 60.0) -> ExperimentRecord:
        """``musku abort``: the experiment becomes ``aborted`` (final) and its queue claims are
        released (rows back to ``queued``; nobody claims them again). A live controller
        (heartbeat younger than ``stale_s``) notices at its next heartbeat, stops, aborts the
        comparison it is measuring, rolls its hosts back and releases its claim; a dead one's
        claim is released here and the comparisons it left ``running`` are aborted. A finished
        experiment (done, failed, aborted), or one whose soft SKU is stored already (the abort
        came after its last comparison), raises :class:`InvalidTransition`: an abort is refused
        or wins cleanly, never "aborted" with a soft SKU (:meth:`save_softsku`)."""


class ComparisonStore(Protocol):
    """An experiment's comparisons (pairs of configurations measured against each other) and
    their decisions. Implemented by :class:`musku.storage.comparisons.Comparisons`."""

    def start_comparison(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        *,
        hosts: tuple[str, str] | None = None,
    ) -> int:
        """A new ``running`` comparison; ``purpose`` is e.g. 'knob:cdp', 'exhaustive', 'search',
        'validate:production', 'validate:stock'; ``hosts`` the pair it runs on (``host_a``
        starts on the baseline)."""

    def comparison_hosts(self, exp_id: int) -> dict[int, tuple[str | None, str | None]]:
        """Comparison id -> the pair of hosts it ran on (``(host_a, host_b)``; ``None`` for a
        comparison stored before revision 0006)."""

    def finish_comparison(self, cmp_id: int, result: ComparisonResult) -> None:
        """Record the decision; the comparison becomes ``finished`` (``aborted`` when the
        decision is ABORTED)."""

    def abort_running(self, exp_id: int, *, only: int | None = None) -> int:
        """Mark comparisons a crashed run left ``running`` as ``aborted`` (call on resume),
        except those a live claimer of the comparison queue is measuring; ``only``: just that
        comparison (a pool's failed pair, whoever claims it). Returns how many."""

    def comparisons(self, exp_id: int) -> list[ComparisonRecord]:
        """Every comparison of an experiment, oldest first, with decisions and sample counts."""

    def completed(self, exp_id: int) -> list[tuple[str, ComparisonResult]]:
        """(purpose, result) of every finished, non-aborted comparison, oldest first: what a
        resumed sweep does not need to measure again."""

    def decision_rows(self, exp_id: int) -> list[dict[str, Any]]:
        """One flat row per decision of the experiment (for exports): comparison id and purpose,
        both configurations' keys, and every ``decisions`` column."""

    def comparison_id_of(self, exp_id: int, purpose: str) -> int | None:
        """The newest finished comparison of experiment ``exp_id`` with that purpose."""


class SampleStore(Protocol):
    """Measurement windows of running comparisons: bulk ingest (binary COPY on PostgreSQL),
    warm- up marks, and reading them back (whole or streamed in batches). Implemented by
    :class:`musku.storage.samples.Samples`."""

    def add_samples(self, cmp_id: int, rows: Sequence[Mapping[str, Any]]) -> int:
        """Bulk-insert measurement windows: ``{seq, t, host, role, period, warmup, valid,
        metrics: {name: value}}`` each (host = index in the pair, or its name). Uses COPY on
        PostgreSQL and one executemany on SQLite. Returns the number of rows stored."""

    def mark_warmup(
        self, cmp_id: int, seqs: Sequence[int], *, hosts: Sequence[int] | None = None
    ) -> int:
        """Set ``warmup`` on the windows ``seqs`` (both hosts, or only ``hosts``: one pair of a
        comparison pooled over several) of a running comparison: the A/B driver's windows that
        went out as steady and were dropped later as warm-up (a longer transient measured at a
        later swap). Returns the number of rows changed."""

    def samples(self, cmp_id: int) -> list[dict[str, Any]]:
        """A comparison's samples in ``(host, seq)`` order, shaped like ``add_samples`` rows
        (plus ``value``, the experiment's primary metric)."""

    def sample_batches(
        self,
        exp_id: int,
        *,
        comparison_ids: Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        batch_rows: int = 50_000,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """An experiment's samples (or those of ``comparison_ids``) as lists of at most
        ``batch_rows`` tuples of ``columns`` (default: every column of ``samples``), in
        ``(comparison_id, seq, host)`` order -- the primary key's, so nothing is sorted."""


class QueueStore(Protocol):
    """The comparison queue (revision 0007, PostgreSQL only): several controllers and ``musku
    worker`` processes share a sweep's comparisons through ``SELECT ... FOR UPDATE SKIP LOCKED``
    claims with leases. Implemented by :class:`musku.storage.queue.Queue`."""

    @property
    def shared(self) -> bool:
        """True on PostgreSQL: several controllers and ``musku worker`` processes share a sweep
        through the comparison queue. SQLite runs one controller per experiment."""

    def need_queue(self) -> None:
        """Raise :class:`~musku.errors.UnsupportedError` (one line) unless the queue is
        :attr:`shared` (PostgreSQL)."""

    def enqueue(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        seed: int,
    ) -> int:
        """The queue row of this comparison of the experiment, added ``queued`` if it is not
        there yet (``INSERT ... ON CONFLICT DO NOTHING``): several controllers asking for the
        same comparison get the same row. Returns its id."""

    def claim_queued(
        self, exp_id: int, claimer: str, *, lease_s: float, prefer: int | None = None
    ) -> QueueItem | None:
        """Claim one comparison of a running experiment's queue for ``claimer`` (``prefer``
        first when it is claimable), or None: a ``queued`` row, or a ``claimed`` one whose claim
        expired (its claimer died: the comparison it left half-measured is aborted and measured
        again). ``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent claimers never wait on each
        other nor get the same row. The claim lasts ``lease_s``; renew it with
        :meth:`beat_queued`."""

    def start_queued(
        self, item: QueueItem, claimer: str, *, hosts: tuple[str, str] | None = None
    ) -> int:
        """Start measuring a claimed queue row on ``hosts``: a new ``running`` comparison,
        linked to the row (so a claimer taking the row over after this one dies aborts it).
        Returns its id."""

    def finish_queued(
        self, item_id: int, claimer: str, cmp_id: int, result: ComparisonResult
    ) -> bool:
        """Record a claimed row's result in one transaction with the row becoming ``done``: True
        when stored. A claim another claimer took over in the meantime (this one was presumed
        dead), or an ABORTED result (a stop), stores no decision: the comparison is aborted and,
        if the row is still this claimer's, the row goes back to ``queued``."""

    def queued_result(self, item_id: int) -> ComparisonResult | None:
        """The result of a ``done`` queue row (whoever measured it), else None."""

    def beat_queued(self, claimer: str, lease_s: float) -> int:
        """Renew every claim ``claimer`` holds for another ``lease_s``; returns how many it
        holds. Safe from another thread (the engine only, as :meth:`heartbeat`)."""

    def release_queued(self, exp_id: int, claimer: str, *, item_id: int | None = None) -> int:
        """Give back the claims ``claimer`` holds on the experiment's queue (a stop;
        ``item_id``: that row only, its pair failed): the rows become ``queued`` again,
        comparisons it was measuring ``aborted``. Returns how many."""

    def queue_states(self, exp_ids: Sequence[int] | None = None) -> dict[int, QueueState]:
        """Each experiment's controller claim, queue counts by state and live queue claims
        (``musku experiments``); all experiments when ``exp_ids`` is None."""


class SkuStore(Protocol):
    """Soft SKUs composed by a sweep, with the validation comparisons that back them.
    Implemented by :class:`musku.storage.skus.SoftSkus`."""

    def save_softsku(self, exp_id: int, sku: SoftSku) -> int:
        """Store a composed soft SKU with its validations; returns its id."""

    def softskus(
        self,
        service: str | None = None,
        platform: str | None = None,
        *,
        include_aborted: bool = False,
    ) -> list[SoftSkuRecord]:
        """Soft SKUs, oldest first, optionally of one service and/or platform. Those of an
        aborted experiment are not deployable and left out unless ``include_aborted``."""

    def softsku(self, sku_id: int) -> SoftSkuRecord | None: ...


class TableStore(Protocol):
    """Threading tables trained by ``musku.tune`` (co-tuning), looked up per service, host,
    platform and configuration. Implemented by :class:`musku.storage.tables.ThreadingTables`."""

    def save_threading_table(
        self,
        service: str,
        host: str,
        platform: str,
        config_key: str | Configuration,
        table: Mapping[str, Any],
    ) -> int:
        """Store a threading table trained by ``musku.tune``; the newest one wins on lookup."""

    def threading_table(
        self, service: str, host: str, platform: str, config_key: str | Configuration
    ) -> dict[str, Any] | None:
        """The newest threading table for exactly this service, host, platform and
        configuration; None if none was trained."""

    def threading_tables(
        self, service: str | None = None, platform: str | None = None
    ) -> list[ThreadingTableRecord]: ...


class CalibrationStore(Protocol):
    """Pair calibrations (``musku pair calibrate``) and the per-configuration warm-up transients
    remembered for a pair. Implemented by :class:`musku.storage.calibrations.Calibrations`."""

    def save_calibration(self, cal: PairCalibration) -> int:
        """Store a pair calibration (``musku pair calibrate``); the newest one of a pair is the
        one in force."""

    def calibration(self, pair: str) -> PairCalibration | None:
        """The newest calibration of ``pair`` (None: never calibrated)."""

    def calibration_before(self, pair: str, when: datetime) -> PairCalibration | None:
        """The calibration of ``pair`` in force at ``when``: the newest taken by then (what a
        run that started then used; ``musku results NAME``)."""

    def mark_recalibration(self, pair: str, note: str) -> bool:
        """Flag the newest calibration of ``pair`` as needing a new one (a comparison's bias
        estimate breached its bound). False when the pair has none."""

    def save_transient(self, pair: str, hardware: str, config_key: str, seconds: float) -> int: ...

    def transient(self, pair: str, hardware: str, config_key: str) -> float | None:
        """The warm-up transient (s) remembered for a configuration on a pair: the median of its
        three newest measurements, so one spurious long detection does not stick (None: never
        measured)."""

    def transients(self, pair: str, hardware: str) -> MutableMapping[str, float]:
        """A mapping config key -> transient seconds backed by this store (for
        :class:`musku.abtest.calibration.PairMemory`)."""


class DeploymentStore(Protocol):
    """Deployments of soft SKUs (``musku sku deploy``, revision 0008): their life cycle, waves
    and re-validations (watches). Implemented by :class:`musku.storage.deployments.Deployments`."""

    def create_deployment(
        self,
        soft_sku_id: int,
        experiment_id: int,
        *,
        backend: str,
        hosts: Sequence[str],
        canary_hosts: Sequence[str],
        controller: str,
        code_version: str | None = None,
    ) -> int:
        """Record a new deployment (status ``canary``); returns its id. Refused with
        :class:`DeploymentConflict` (one line, exit 3) when a host is in another live deployment
        (``canary``, ``rolling`` or ``deployed``) of the same backend; the check and the insert
        are one transaction (on PostgreSQL under a lock on the table)."""

    def update_deployment(
        self,
        dep_id: int,
        *,
        status: DeploymentStatus | None = None,
        canary_comparison_id: int | None = None,
        waves: Sequence[Mapping[str, Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        """Change a deployment: its status along :data:`DEPLOYMENT_TRANSITIONS` (any other
        change raises :class:`InvalidTransition`), its canary comparison, waves, reason."""

    def deployment(self, dep_id: int) -> DeploymentRecord | None: ...

    def deployments(
        self, *, live: bool = False, soft_sku_id: int | None = None
    ) -> list[DeploymentRecord]:
        """Deployments, oldest first; ``live``: only ``canary``, ``rolling`` and ``deployed``."""

    def add_watch(
        self,
        dep_id: int,
        *,
        verdict: str,
        code_version: str | None,
        comparison_id: int | None,
        reason: str = "",
    ) -> int:
        """Record one re-validation of deployment ``dep_id``; returns its id."""

    def watches(self, dep_id: int) -> list[WatchRecord]:
        """Deployment ``dep_id``'s re-validations, oldest first."""


class ResultStore(
    RunStore,
    ClaimStore,
    ComparisonStore,
    SampleStore,
    QueueStore,
    SkuStore,
    TableStore,
    CalibrationStore,
    DeploymentStore,
    Protocol,
):
    """The whole results store (what :func:`musku.storage.open_store` returns): every concern,
    the database's display URL and ``close``. Annotate with it only where a caller uses most
    concerns (a sweep, a CLI command); otherwise with the concerns it uses."""

    @property
    def url(self) -> str:
        """The database's URL, password hidden (for messages)."""

    def close(self) -> None: ...
