"""The results store: everything the sweep, the CLI and the threading auto-tuner write and read.

:func:`open_store` opens (and creates or checks the schema of) a database and returns a
:class:`Store`: a façade over one repository per concern (``runs.py``, ``claims.py``,
``comparisons.py``, ``samples.py``, ``queue.py``, ``skus.py``, ``tables.py``,
``calibrations.py``, ``deployments.py``) sharing one :class:`~musku.storage.core.Core`. Callers
annotate with the protocols of :mod:`musku.storage.protocols` they use.

Every method takes and returns :mod:`musku.domain` values or the frozen records of
:mod:`musku.storage.records`; SQLAlchemy rows never leave the storage package. Every database
failure becomes a one-line :class:`~musku.errors.DatabaseError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from musku.domain import (
    ComparisonResult,
    Configuration,
    DeploymentStatus,
    ExperimentStatus,
    SoftSku,
)
from musku.errors import DatabaseError
from musku.storage.calibrations import Calibrations, StoredTransients
from musku.storage.claims import ClaimHeld, Claims
from musku.storage.comparisons import Comparisons
from musku.storage.core import MAX_ID, Core, Repository
from musku.storage.deployments import DeploymentConflict, Deployments
from musku.storage.engine import connect_error, display, make_engine, parse_url, reader
from musku.storage.migrate import (
    check,
    head_revision,
    lock_schema,
    migration_lock,
    revision_of,
    upgrade_connection,
    upgrade_engine,
)
from musku.storage.queue import Queue
from musku.storage.records import (
    ComparisonRecord,
    DeploymentRecord,
    ExperimentRecord,
    InvalidTransition,
    QueueItem,
    QueueState,
    SoftSkuRecord,
    ThreadingTableRecord,
    WatchRecord,
)
from musku.storage.runs import Runs
from musku.storage.samples import Samples
from musku.storage.skus import SoftSkus
from musku.storage.tables import ThreadingTables
from musku.storage.urls import default_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from musku.domain import PairCalibration
    from musku.experiment import Experiment
    from musku.storage import protocols


def open_store(url: str | None = None, *, create: bool = True, read_only: bool = False) -> Store:
    """Open the results database at ``url`` (default: :func:`musku.storage.urls.default_url`).

    A new, empty database is created at the newest schema when ``create``; a database at an
    older (or newer) schema revision raises :class:`~musku.errors.SchemaOutOfDate`.

    ``read_only``: for commands that only read. Nothing is created, migrated or written (an
    SQLite file is opened read-only, so a read-only file or directory serves them); a missing
    or empty database is a :class:`~musku.errors.DatabaseError`."""
    explicit = url is not None
    url = url if url is not None else default_url()
    engine = make_engine(url, read_only=read_only)
    hint = display(engine.url) if explicit else None
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    missing = path not in (None, "", ":memory:") and not os.path.exists(str(path))
    if missing and (not create or read_only):  # connecting would create the file
        engine.dispose()
        raise DatabaseError(
            f"no musku database at {display(engine.url)}: no such file (a sweep or "
            "`musku db upgrade` creates one)"
        )
    try:
        with reader(engine).begin() as conn:
            rev = revision_of(conn) if not read_only else check(conn, hint)
        if read_only and rev is None:
            raise DatabaseError(
                f"no musku database at {display(engine.url)} (it is empty): a sweep creates one"
            )
        if rev != head_revision():
            # new, older, newer or foreign: decide under the lock, so that of several musku
            # processes opening a brand-new database at once exactly one creates the schema
            with migration_lock(engine), engine.begin() as conn:
                lock_schema(conn)
                if check(conn, hint) is None:
                    if not create:
                        raise DatabaseError(
                            f"no musku database at {display(engine.url)}: run "
                            "`musku db upgrade` to create one"
                        )
                    upgrade_connection(conn)
    except OSError as exc:
        engine.dispose()
        raise DatabaseError(f"cannot create {display(engine.url)}: {exc}") from None
    except DatabaseError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise connect_error(engine, exc) from None
    return Store(engine)


class Store(Repository):
    """Results of experiments. Create with :func:`open_store`; ``close()`` when done (or use
    it as a context manager). One Store may be used from one thread at a time.

    A façade: each method is its concern's repository's (the module named above its
    section), all over one shared :class:`~musku.storage.core.Core`; it implements every
    protocol of :mod:`musku.storage.protocols` (:class:`~musku.storage.protocols.ResultStore`)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(Core(engine))
        self._comparisons = Comparisons(self.core)
        self._calibrations = Calibrations(self.core)
        self._tables = ThreadingTables(self.core)
        self._deployments = Deployments(self.core)
        self._skus = SoftSkus(self.core)
        self._samples = Samples(self.core)
        self._queue = Queue(self.core, self._comparisons)
        self._claims = Claims(self.core)
        self._runs = Runs(self.core, self._comparisons)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ runs.py

    def create_experiment(self, experiment: Experiment, *, mode: str | None = None) -> int:
        return self._runs.create_experiment(experiment, mode=mode)

    def find_experiment(self, name_or_id: str | int) -> ExperimentRecord | None:
        return self._runs.find_experiment(name_or_id)

    def runs_named(self, name: str) -> list[tuple[int, str, ExperimentStatus]]:
        return self._runs.runs_named(name)

    def experiment(self, exp_id: int) -> ExperimentRecord:
        return self._runs.experiment(exp_id)

    def experiments(self) -> list[ExperimentRecord]:
        return self._runs.experiments()

    def delete_experiment(self, exp_id: int) -> None:
        return self._runs.delete_experiment(exp_id)

    def set_status(self, exp_id: int, status: ExperimentStatus) -> None:
        return self._runs.set_status(exp_id, status)

    def resume(self, exp_id: int) -> int:
        return self._runs.resume(exp_id)

    def add_hosts(self, exp_id: int, describe: Mapping[str, Any]) -> None:
        return self._runs.add_hosts(exp_id, describe)

    def experiment_meta(self, exp_id: int) -> dict[str, Any]:
        return self._runs.experiment_meta(exp_id)

    # ------------------------------------------------------------------ claims.py

    def claim(
        self, exp_id: int, controller: str, host: str, pid: int, *, stale_s: float = 60.0
    ) -> None:
        return self._claims.claim(exp_id, controller, host, pid, stale_s=stale_s)

    def heartbeat(self, exp_id: int, controller: str) -> bool:
        return self._claims.heartbeat(exp_id, controller)

    def release(self, exp_id: int, controller: str) -> None:
        return self._claims.release(exp_id, controller)

    def status_of(self, exp_id: int) -> ExperimentStatus:
        return self._claims.status_of(exp_id)

    def abort_experiment(self, exp_id: int, *, stale_s: float = 60.0) -> ExperimentRecord:
        return self._claims.abort_experiment(exp_id, stale_s=stale_s)

    # ------------------------------------------------------------------ comparisons.py

    def start_comparison(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        *,
        hosts: tuple[str, str] | None = None,
    ) -> int:
        return self._comparisons.start_comparison(exp_id, purpose, baseline, candidate, hosts=hosts)

    def comparison_hosts(self, exp_id: int) -> dict[int, tuple[str | None, str | None]]:
        return self._comparisons.comparison_hosts(exp_id)

    def finish_comparison(self, cmp_id: int, result: ComparisonResult) -> None:
        return self._comparisons.finish_comparison(cmp_id, result)

    def abort_running(self, exp_id: int, *, only: int | None = None) -> int:
        return self._comparisons.abort_running(exp_id, only=only)

    def comparisons(self, exp_id: int) -> list[ComparisonRecord]:
        return self._comparisons.comparisons(exp_id)

    def completed(self, exp_id: int) -> list[tuple[str, ComparisonResult]]:
        return self._comparisons.completed(exp_id)

    def decision_rows(self, exp_id: int) -> list[dict[str, Any]]:
        return self._comparisons.decision_rows(exp_id)

    def comparison_id_of(self, exp_id: int, purpose: str) -> int | None:
        return self._comparisons.comparison_id_of(exp_id, purpose)

    # ------------------------------------------------------------------ samples.py

    def add_samples(self, cmp_id: int, rows: Sequence[Mapping[str, Any]]) -> int:
        return self._samples.add_samples(cmp_id, rows)

    def mark_warmup(
        self, cmp_id: int, seqs: Sequence[int], *, hosts: Sequence[int] | None = None
    ) -> int:
        return self._samples.mark_warmup(cmp_id, seqs, hosts=hosts)

    def samples(self, cmp_id: int) -> list[dict[str, Any]]:
        return self._samples.samples(cmp_id)

    def sample_batches(
        self,
        exp_id: int,
        *,
        comparison_ids: Sequence[int] | None = None,
        columns: Sequence[str] | None = None,
        batch_rows: int = 50_000,
    ) -> Iterator[list[tuple[Any, ...]]]:
        return self._samples.sample_batches(
            exp_id, comparison_ids=comparison_ids, columns=columns, batch_rows=batch_rows
        )

    # ------------------------------------------------------------------ queue.py

    @property
    def shared(self) -> bool:
        return self._queue.shared

    def need_queue(self) -> None:
        return self._queue.need_queue()

    _need_queue = need_queue  # its name before the split (musku.sweep.worker)

    def enqueue(
        self,
        exp_id: int,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        seed: int,
    ) -> int:
        return self._queue.enqueue(exp_id, purpose, baseline, candidate, seed)

    def claim_queued(
        self, exp_id: int, claimer: str, *, lease_s: float, prefer: int | None = None
    ) -> QueueItem | None:
        return self._queue.claim_queued(exp_id, claimer, lease_s=lease_s, prefer=prefer)

    def start_queued(
        self, item: QueueItem, claimer: str, *, hosts: tuple[str, str] | None = None
    ) -> int:
        return self._queue.start_queued(item, claimer, hosts=hosts)

    def finish_queued(
        self, item_id: int, claimer: str, cmp_id: int, result: ComparisonResult
    ) -> bool:
        return self._queue.finish_queued(item_id, claimer, cmp_id, result)

    def queued_result(self, item_id: int) -> ComparisonResult | None:
        return self._queue.queued_result(item_id)

    def beat_queued(self, claimer: str, lease_s: float) -> int:
        return self._queue.beat_queued(claimer, lease_s)

    def release_queued(self, exp_id: int, claimer: str, *, item_id: int | None = None) -> int:
        return self._queue.release_queued(exp_id, claimer, item_id=item_id)

    def queue_states(self, exp_ids: Sequence[int] | None = None) -> dict[int, QueueState]:
        return self._queue.queue_states(exp_ids)

    # ------------------------------------------------------------------ skus.py

    def save_softsku(self, exp_id: int, sku: SoftSku) -> int:
        return self._skus.save_softsku(exp_id, sku)

    def softskus(
        self,
        service: str | None = None,
        platform: str | None = None,
        *,
        include_aborted: bool = False,
    ) -> list[SoftSkuRecord]:
        return self._skus.softskus(service, platform, include_aborted=include_aborted)

    def softsku(self, sku_id: int) -> SoftSkuRecord | None:
        return self._skus.softsku(sku_id)

    # ------------------------------------------------------------------ tables.py

    def save_threading_table(
        self,
        service: str,
        host: str,
        platform: str,
        config_key: str | Configuration,
        table: Mapping[str, Any],
    ) -> int:
        return self._tables.save_threading_table(service, host, platform, config_key, table)

    def threading_table(
        self, service: str, host: str, platform: str, config_key: str | Configuration
    ) -> dict[str, Any] | None:
        return self._tables.threading_table(service, host, platform, config_key)

    def threading_tables(
        self, service: str | None = None, platform: str | None = None
    ) -> list[ThreadingTableRecord]:
        return self._tables.threading_tables(service, platform)

    # ------------------------------------------------------------------ calibrations.py

    def save_calibration(self, cal: PairCalibration) -> int:
        return self._calibrations.save_calibration(cal)

    def calibration(self, pair: str) -> PairCalibration | None:
        return self._calibrations.calibration(pair)

    def calibration_before(self, pair: str, when: datetime) -> PairCalibration | None:
        return self._calibrations.calibration_before(pair, when)

    def mark_recalibration(self, pair: str, note: str) -> bool:
        return self._calibrations.mark_recalibration(pair, note)

    def save_transient(self, pair: str, hardware: str, config_key: str, seconds: float) -> int:
        return self._calibrations.save_transient(pair, hardware, config_key, seconds)

    def transient(self, pair: str, hardware: str, config_key: str) -> float | None:
        return self._calibrations.transient(pair, hardware, config_key)

    def transients(self, pair: str, hardware: str) -> StoredTransients:
        return self._calibrations.transients(pair, hardware)

    # ------------------------------------------------------------------ deployments.py

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
        return self._deployments.create_deployment(
            soft_sku_id,
            experiment_id,
            backend=backend,
            hosts=hosts,
            canary_hosts=canary_hosts,
            controller=controller,
            code_version=code_version,
        )

    def update_deployment(
        self,
        dep_id: int,
        *,
        status: DeploymentStatus | None = None,
        canary_comparison_id: int | None = None,
        waves: Sequence[Mapping[str, Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        return self._deployments.update_deployment(
            dep_id,
            status=status,
            canary_comparison_id=canary_comparison_id,
            waves=waves,
            reason=reason,
        )

    def deployment(self, dep_id: int) -> DeploymentRecord | None:
        return self._deployments.deployment(dep_id)

    def deployments(
        self, *, live: bool = False, soft_sku_id: int | None = None
    ) -> list[DeploymentRecord]:
        return self._deployments.deployments(live=live, soft_sku_id=soft_sku_id)

    def add_watch(
        self,
        dep_id: int,
        *,
        verdict: str,
        code_version: str | None,
        comparison_id: int | None,
        reason: str = "",
    ) -> int:
        return self._deployments.add_watch(
            dep_id,
            verdict=verdict,
            code_version=code_version,
            comparison_id=comparison_id,
            reason=reason,
        )

    def watches(self, dep_id: int) -> list[WatchRecord]:
        return self._deployments.watches(dep_id)


def upgrade(url: str | None = None) -> tuple[str | None, str]:
    """Create or upgrade the database at ``url`` to the newest schema: (from, to)."""
    engine = make_engine(url if url is not None else default_url())
    try:
        return upgrade_engine(engine)
    finally:
        engine.dispose()


def current_revision(url: str | None = None) -> str | None:
    """The schema revision of the database at ``url`` (None: no musku schema there)."""
    url = url if url is not None else default_url()
    parsed = parse_url(url)
    database = parsed.database
    if (
        parsed.get_backend_name() == "sqlite"
        and database not in (None, "", ":memory:")
        and not Path(str(database)).exists()
    ):
        return None  # do not create an empty file just by looking
    engine = make_engine(url)
    try:
        with reader(engine).connect() as conn:
            return revision_of(conn)
    except SQLAlchemyError as exc:
        raise connect_error(engine, exc) from None
    finally:
        engine.dispose()


__all__ = [
    "ClaimHeld",
    "DeploymentConflict",
    "InvalidTransition",
    "MAX_ID",
    "Store",
    "StoredTransients",
    "current_revision",
    "open_store",
    "upgrade",
]


if TYPE_CHECKING:  # mypy checks that the façade and each repository implement their protocols

    def _implements(store: Store, core: Core) -> None:
        comparisons = Comparisons(core)
        everything: protocols.ResultStore = store
        runs: protocols.RunStore = Runs(core, comparisons)
        claims: protocols.ClaimStore = Claims(core)
        compared: protocols.ComparisonStore = comparisons
        samples: protocols.SampleStore = Samples(core)
        queue: protocols.QueueStore = Queue(core, comparisons)
        skus: protocols.SkuStore = SoftSkus(core)
        tables: protocols.TableStore = ThreadingTables(core)
        calibrations: protocols.CalibrationStore = Calibrations(core)
        deployments: protocols.DeploymentStore = Deployments(core)
        del everything, runs, claims, compared, samples, queue, skus, tables, calibrations
        del deployments
