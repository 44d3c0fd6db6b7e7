"""Soft SKUs composed by a sweep, with the validation comparisons that back them. A repository of
the results store (:mod:`musku.storage.core`); the :class:`~musku.storage.store.Store` façade
composes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from musku.domain import ComparisonResult, ExperimentStatus, SoftSku
from musku.storage import convert
from musku.storage.core import MAX_ID, Repository, guard, locked_experiment
from musku.storage.models import (
    ComparisonRow,
    ConfigurationRow,
    DecisionRow,
    ExperimentRow,
    SoftSkuRow,
    ValidationRow,
)
from musku.storage.records import ComparisonStatus, InvalidTransition, SoftSkuRecord


class SoftSkus(Repository):
    """Soft SKUs composed by a sweep, with the validation comparisons that back them."""

    def _validation_ids(
        self, s: Session, exp_id: int, against: str, result: ComparisonResult
    ) -> tuple[int, int]:
        """(comparison id, decision id) of the validation comparison that produced
        ``result``; recorded now if the sweep did not store it as a comparison."""
        base_id = self._config_id(s, result.baseline)
        cand_id = self._config_id(s, result.candidate)
        # the comparison that measured it: same configurations and decision, preferably of
        # purpose validate:<against> (when stock == production one comparison serves both)
        candidates = s.execute(
            select(ComparisonRow.id, DecisionRow.id, ComparisonRow.purpose, DecisionRow.estimate)
            .join(DecisionRow, DecisionRow.comparison_id == ComparisonRow.id)
            .where(
                ComparisonRow.experiment_id == exp_id,
                ComparisonRow.baseline_id == base_id,
                ComparisonRow.candidate_id == cand_id,
                ComparisonRow.status == ComparisonStatus.FINISHED.value,
                DecisionRow.decision == result.decision.value,
            )
            .order_by(ComparisonRow.id.desc())
        ).all()
        matching = [c for c in candidates if c[3] == result.estimate]
        matching.sort(key=lambda c: c[2] != f"validate:{against}")  # stable: newest first
        found = matching[0] if matching else None
        if found is not None:
            return int(found[0]), int(found[1])
        stamp = convert.now()
        cmp = ComparisonRow(
            experiment_id=exp_id,
            purpose=f"validate:{against}",
            baseline_id=base_id,
            candidate_id=cand_id,
            status=(
                ComparisonStatus.FINISHED.value
                if result.decision.final
                else ComparisonStatus.ABORTED.value
            ),
            started_at=stamp,
            finished_at=stamp,
        )
        s.add(cmp)
        s.flush()
        dec = DecisionRow(
            comparison_id=cmp.id, decided_at=stamp, **convert.decision_columns(result)
        )
        s.add(dec)
        s.flush()
        return cmp.id, dec.id

    @guard
    def save_softsku(self, exp_id: int, sku: SoftSku) -> int:
        """Store a composed soft SKU with its validations; returns its id.

        Idempotent: the same soft SKU (service, platform, configuration) of an experiment is
        stored once. A run resumed after a kill that came after the SKU was stored (before
        the run was marked done) composes the same one from its stored comparisons and gets
        the stored row back, its validations those of this run, never a second row.
        Serialised with ``musku abort`` on the experiment's row lock: an experiment already
        aborted gets no soft SKU (:class:`InvalidTransition`), and one that has its soft SKU
        can no longer be aborted (:meth:`abort_experiment`)."""
        with self._session() as s, s.begin():
            exp = locked_experiment(s, exp_id)
            if exp.status == ExperimentStatus.ABORTED.value:
                raise InvalidTransition(
                    f"experiment {exp_id} ({exp.name}) was aborted (musku abort) before its "
                    "soft SKU was stored: none stored"
                )
            config_id = self._config_id(s, sku.configuration)
            existing = s.scalars(
                select(SoftSkuRow)
                .where(
                    SoftSkuRow.experiment_id == exp_id,
                    SoftSkuRow.configuration_id == config_id,
                    SoftSkuRow.service == sku.service,
                    SoftSkuRow.platform == sku.platform,
                )
                .order_by(SoftSkuRow.id)
            ).first()
            if existing is not None:
                s.execute(delete(ValidationRow).where(ValidationRow.soft_sku_id == existing.id))
                self._add_validations(s, exp_id, existing.id, sku)
                return existing.id
            row = SoftSkuRow(
                experiment_id=exp_id,
                service=sku.service,
                platform=sku.platform,
                configuration_id=config_id,
                created_at=convert.now(),
            )
            s.add(row)
            s.flush()
            self._add_validations(s, exp_id, row.id, sku)
            return row.id

    def _add_validations(self, s: Session, exp_id: int, sku_id: int, sku: SoftSku) -> None:
        for against, result in (("production", sku.vs_production), ("stock", sku.vs_stock)):
            if result is None:
                continue
            cmp_id, dec_id = self._validation_ids(s, exp_id, against, result)
            s.add(
                ValidationRow(
                    soft_sku_id=sku_id,
                    against=against,
                    comparison_id=cmp_id,
                    decision_id=dec_id,
                )
            )

    def _softsku_records(self, s: Session, rows: Sequence[SoftSkuRow]) -> list[SoftSkuRecord]:
        if not rows:
            return []
        sku_ids = [r.id for r in rows]
        vals = s.execute(
            select(ValidationRow, DecisionRow, ComparisonRow)
            .join(DecisionRow, DecisionRow.id == ValidationRow.decision_id)
            .join(ComparisonRow, ComparisonRow.id == ValidationRow.comparison_id)
            .where(ValidationRow.soft_sku_id.in_(sku_ids))
        ).all()
        config_ids = {r.configuration_id for r in rows}
        for _, _, cmp_row in vals:
            config_ids |= {cmp_row.baseline_id, cmp_row.candidate_id}
        configs = {
            r.id: self._configuration_of(s, r)
            for r in s.scalars(select(ConfigurationRow).where(ConfigurationRow.id.in_(config_ids)))
        }
        by_sku: dict[int, dict[str, ComparisonResult]] = {}
        for val, dec, cmp in vals:
            by_sku.setdefault(val.soft_sku_id, {})[val.against] = convert.result_from_rows(
                configs[cmp.baseline_id], configs[cmp.candidate_id], dec
            )
        out = []
        for r in rows:
            v = by_sku.get(r.id, {})
            created = convert.aware(r.created_at)
            assert created is not None
            out.append(
                SoftSkuRecord(
                    id=r.id,
                    experiment_id=r.experiment_id,
                    created_at=created,
                    sku=SoftSku(
                        service=r.service,
                        platform=r.platform,
                        configuration=configs[r.configuration_id],
                        vs_production=v.get("production"),
                        vs_stock=v.get("stock"),
                    ),
                )
            )
        return out

    @guard
    def softskus(
        self,
        service: str | None = None,
        platform: str | None = None,
        *,
        include_aborted: bool = False,
    ) -> list[SoftSkuRecord]:
        """Soft SKUs, oldest first, optionally of one service and/or platform. Those of an
        aborted experiment are not deployable and left out unless ``include_aborted``."""
        q = select(SoftSkuRow).order_by(SoftSkuRow.id)
        if not include_aborted:
            q = q.join(ExperimentRow, ExperimentRow.id == SoftSkuRow.experiment_id).where(
                ExperimentRow.status != ExperimentStatus.ABORTED.value
            )
        if service is not None:
            q = q.where(SoftSkuRow.service == service)
        if platform is not None:
            q = q.where(SoftSkuRow.platform == platform)
        with self._reader() as s:
            return self._softsku_records(s, s.scalars(q).all())

    @guard
    def softsku(self, sku_id: int) -> SoftSkuRecord | None:
        if not 0 < sku_id <= MAX_ID:  # beyond the DB's ids: the driver would overflow
            return None
        with self._reader() as s:
            row = s.get(SoftSkuRow, sku_id)
            return self._softsku_records(s, [row])[0] if row is not None else None
