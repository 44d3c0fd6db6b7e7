"""Runs of experiments (``experiments`` rows): creating and finding them, their life cycle
(``created -> running -> done | failed``, resume), their hosts and what the report reads of
them. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, or_, select

from musku import __version__
from musku.domain import ExperimentStatus
from musku.errors import DatabaseError
from musku.storage import convert
from musku.storage.comparisons import Comparisons
from musku.storage.core import MAX_ID, Core, Repository, guard, locked_experiment
from musku.storage.models import (
    ComparisonRow,
    DecisionRow,
    DeploymentRow,
    DeploymentWatchRow,
    ExperimentRow,
    HostRow,
    QueueRow,
    SampleRow,
    SoftSkuRow,
    ValidationRow,
)
from musku.storage.records import EXPERIMENT_TRANSITIONS, ExperimentRecord, InvalidTransition

if TYPE_CHECKING:
    from musku.experiment import Experiment


class Runs(Repository):
    """Runs of experiments (``experiments`` rows): creating and finding them, their life cycle
    (``created -> running -> done | failed``, resume), their hosts and what the report
    reads of them."""

    def __init__(self, core: Core, comparisons: Comparisons) -> None:
        super().__init__(core)
        self._comparisons = comparisons

    @guard
    def create_experiment(self, experiment: Experiment, *, mode: str | None = None) -> int:
        """Record a new experiment (status ``created``); returns its id. ``mode`` overrides
        the file's sweep mode for runs that are not sweeps (``abtest``)."""
        resolved = {
            "space": {k: list(v) for k, v in experiment.space.items()},
            "stock": experiment.stock.as_dict(),
            "production": experiment.production.as_dict(),
            "guardrails": [
                {"metric": g.metric, "op": g.op, "limit": g.limit}
                for g in experiment.spec.guardrails
            ],
            "statistics": {
                "confidence": experiment.stats.confidence,
                "min_effect": experiment.stats.min_effect,
                "warmup_s": experiment.stats.warmup_s,
                "sample_interval_s": experiment.stats.sample_interval_s,
                "sample_cap": experiment.stats.sample_cap,
                "seed": experiment.stats.seed,
            },
            "reboot_knobs": sorted(experiment.spec.reboot_knobs),
            "search_rounds": experiment.search_rounds,
            "hosts": {"backend": experiment.hosts.backend, **dict(experiment.hosts.options)},
            "service_knobs": list(experiment.service.knobs),
        }
        with self._session() as s, s.begin():
            row = ExperimentRow(
                name=experiment.name,
                description=experiment.description,
                service=experiment.service.name,
                platform=experiment.platform.name,
                mode=mode or experiment.mode.value,
                baseline=experiment.baseline,
                metric=experiment.spec.metric,
                direction=experiment.spec.direction.value,
                status=ExperimentStatus.CREATED.value,
                path=str(experiment.path),
                content=convert.jsonable(dict(experiment.raw)),
                resolved=convert.jsonable(resolved),
                musku_version=__version__,
                created_at=convert.now(),
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def find_experiment(self, name_or_id: str | int) -> ExperimentRecord | None:
        """The latest experiment of that name, else the experiment with that id."""
        with self._reader() as s:
            row = None
            if isinstance(name_or_id, str):
                row = s.scalars(
                    select(ExperimentRow)
                    .where(ExperimentRow.name == name_or_id)
                    .order_by(ExperimentRow.id.desc())
                    .limit(1)
                ).first()
            if row is None:
                if isinstance(name_or_id, str) and not (
                    name_or_id.isascii() and name_or_id.isdigit()
                ):
                    return None  # int() would take " 12", "1_2", "١٢" or fail on "²"
                ident = int(name_or_id)
                if not 0 < ident <= MAX_ID:  # beyond the DB's ids: the driver would overflow
                    return None
                row = s.get(ExperimentRow, ident)
            return self._experiment_record(s, row) if row is not None else None

    @guard
    def runs_named(self, name: str) -> list[tuple[int, str, ExperimentStatus]]:
        """(id, mode, status) of every run (``experiments`` row) of that name, oldest first:
        what :func:`musku.storage.lookup.find_run` chooses from."""
        with self._reader() as s:
            rows = s.execute(
                select(ExperimentRow.id, ExperimentRow.mode, ExperimentRow.status)
                .where(ExperimentRow.name == name)
                .order_by(ExperimentRow.id)
            ).all()
            return [(int(i), str(m), ExperimentStatus(st)) for i, m, st in rows]

    @guard
    def experiment(self, exp_id: int) -> ExperimentRecord:
        with self._reader() as s:
            return self._experiment_record(s, self._experiment(s, exp_id))

    @guard
    def experiments(self) -> list[ExperimentRecord]:
        with self._reader() as s:
            rows = s.scalars(select(ExperimentRow).order_by(ExperimentRow.id)).all()
            hosts: dict[int, list[HostRow]] = {}
            for h in s.scalars(select(HostRow).order_by(HostRow.experiment_id, HostRow.idx)):
                hosts.setdefault(h.experiment_id, []).append(h)
            return [self._experiment_record(s, r, hosts.get(r.id, [])) for r in rows]

    @guard
    def delete_experiment(self, exp_id: int) -> None:
        """Delete an experiment with its hosts, comparisons, samples, decisions and soft SKUs.
        Configurations stay (they are shared)."""

        with self._session() as s, s.begin():
            self._experiment(s, exp_id)
            cmp_ids = select(ComparisonRow.id).where(ComparisonRow.experiment_id == exp_id)
            s.execute(delete(SampleRow).where(SampleRow.comparison_id.in_(cmp_ids)))
            sku_ids = select(SoftSkuRow.id).where(SoftSkuRow.experiment_id == exp_id)
            dep_ids = select(DeploymentRow.id).where(
                or_(DeploymentRow.experiment_id == exp_id, DeploymentRow.soft_sku_id.in_(sku_ids))
            )
            s.execute(
                delete(DeploymentWatchRow).where(DeploymentWatchRow.deployment_id.in_(dep_ids))
            )
            s.execute(delete(DeploymentRow).where(DeploymentRow.id.in_(dep_ids)))
            s.execute(delete(ValidationRow).where(ValidationRow.soft_sku_id.in_(sku_ids)))
            s.execute(delete(SoftSkuRow).where(SoftSkuRow.experiment_id == exp_id))
            s.execute(delete(DecisionRow).where(DecisionRow.comparison_id.in_(cmp_ids)))
            s.execute(delete(QueueRow).where(QueueRow.experiment_id == exp_id))
            s.execute(delete(ComparisonRow).where(ComparisonRow.experiment_id == exp_id))
            s.execute(delete(HostRow).where(HostRow.experiment_id == exp_id))
            s.execute(delete(ExperimentRow).where(ExperimentRow.id == exp_id))
        self._cmp_meta.clear()

    @guard
    def set_status(self, exp_id: int, status: ExperimentStatus) -> None:
        """Move an experiment along ``created -> running -> (interrupted -> running)* ->
        done | failed``; any other change raises :class:`InvalidTransition`."""
        with self._session() as s, s.begin():
            row = locked_experiment(s, exp_id)
            current = ExperimentStatus(row.status)
            if current is ExperimentStatus.ABORTED:
                return  # an operator's `musku abort` wins over the run's own ending
            allowed = EXPERIMENT_TRANSITIONS[current]
            if status not in allowed:
                choices = ", ".join(sorted(a.value for a in allowed)) or "none: it is final"
                raise InvalidTransition(
                    f"experiment {exp_id} ({row.name}) is {current.value}; it cannot become "
                    f"{status.value} (allowed: {choices})"
                )
            row.status = status.value
            stamp = convert.now()
            if status is ExperimentStatus.RUNNING and row.started_at is None:
                row.started_at = stamp
            if status in (ExperimentStatus.DONE, ExperimentStatus.FAILED):
                row.finished_at = stamp

    @guard
    def resume(self, exp_id: int) -> int:
        """Continue an experiment for ``--resume``: ``interrupted -> running``, or, for one a
        crashed run left ``running``, ``running -> interrupted -> running``; comparisons that
        run left ``running`` become ``aborted``. Returns how many were aborted. A done or
        failed experiment is final (:class:`InvalidTransition`): start a new run instead."""
        rec = self.experiment(exp_id)
        if rec.status is ExperimentStatus.RUNNING:
            self.set_status(exp_id, ExperimentStatus.INTERRUPTED)
        elif rec.status is not ExperimentStatus.INTERRUPTED:
            raise InvalidTransition(
                f"experiment {exp_id} ({rec.name}) is {rec.status.value}: only an interrupted "
                "(or crashed) run can be resumed; start a new run instead"
            )
        aborted = self._comparisons.abort_running(exp_id)
        self.set_status(exp_id, ExperimentStatus.RUNNING)
        return aborted

    @guard
    def add_hosts(self, exp_id: int, describe: Mapping[str, Any]) -> None:
        """Record the pair's hosts from ``HostPair.describe()``: ``{"hosts": [name | {name,
        ...facts}], "backend": ..., other shared facts}``. Calling it again (on resume)
        updates the rows by host index."""
        hosts = describe.get("hosts", [])
        if not isinstance(hosts, Sequence) or isinstance(hosts, str):
            raise DatabaseError("add_hosts: describe()['hosts'] must be a list")
        shared = {k: v for k, v in describe.items() if k not in ("hosts", "backend")}
        with self._session() as s, s.begin():
            exp = self._experiment(s, exp_id)
            default_backend = str(
                describe.get("backend") or exp.resolved.get("hosts", {}).get("backend", "")
            )
            existing = {
                h.idx: h for h in s.scalars(select(HostRow).where(HostRow.experiment_id == exp_id))
            }
            for i, h in enumerate(hosts):
                if isinstance(h, Mapping):
                    name = str(h.get("name", f"host{i}"))
                    backend = str(h.get("backend", default_backend))
                    facts = {
                        **shared,
                        **{k: v for k, v in h.items() if k not in ("name", "backend")},
                    }
                else:
                    name, backend, facts = str(h), default_backend, dict(shared)
                facts = convert.jsonable(facts)
                row = existing.get(i)
                if row is None:
                    s.add(
                        HostRow(
                            experiment_id=exp_id, idx=i, name=name, backend=backend, facts=facts
                        )
                    )
                else:
                    row.name, row.backend, row.facts = name, backend, facts
        self._cmp_meta.clear()

    @guard
    def experiment_meta(self, exp_id: int) -> dict[str, Any]:
        """What the report needs beyond the record: ``resolved`` (space, stock, production,
        statistics...) and ``musku_version`` of the musku that created the row."""
        with self._session() as s:
            row = self._experiment(s, exp_id)
            return {"resolved": dict(row.resolved or {}), "musku_version": row.musku_version}
