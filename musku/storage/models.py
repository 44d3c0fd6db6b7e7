"""SQLAlchemy 2 models of the results database. Only the storage layer imports this module;
everything else sees :mod:`musku.domain` values and :mod:`musku.storage.records`.

The schema is documented for analysts in ``db/README.md``; change it only together with a new
alembic revision in ``musku/storage/migrations/versions/``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
"""JSON on SQLite, JSONB on PostgreSQL (indexable, ``->>`` works the same)."""

TS = DateTime(timezone=True)

EXPERIMENT_STATUSES = ("created", "running", "interrupted", "done", "failed", "aborted")
COMPARISON_STATUSES = ("running", "finished", "aborted")
QUEUE_STATES = ("queued", "claimed", "done")
DECISIONS = (
    "better",
    "worse",
    "no_difference",
    "inconclusive",
    "guardrail",
    "aborted",
    "not_better",
)
SAMPLE_METRIC_COLUMNS = ("mips", "qps", "p99_ms", "qos_violation_rate", "power_w")
"""Metrics with their own column in ``samples``; any other metric goes to ``samples.extra``."""


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ExperimentRow(Base):
    __tablename__ = "experiments"
    __table_args__ = (CheckConstraint(_in("status", EXPERIMENT_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    service: Mapped[str] = mapped_column(String(100), index=True)
    platform: Mapped[str] = mapped_column(String(100), index=True)
    mode: Mapped[str] = mapped_column(String(20))
    baseline: Mapped[str] = mapped_column(String(20))
    metric: Mapped[str] = mapped_column(String(100))
    direction: Mapped[str] = mapped_column(String(10))
    status: Mapped[str] = mapped_column(String(20), default="created")
    path: Mapped[str] = mapped_column(Text)
    content: Mapped[dict[str, Any]] = mapped_column(JSONType)
    resolved: Mapped[dict[str, Any]] = mapped_column(JSONType)
    musku_version: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(TS)
    started_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    # revision 0005: the controller process running it, and its heartbeat (NULL: unclaimed)
    claim_controller: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claim_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claim_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    claim_heartbeat: Mapped[datetime | None] = mapped_column(TS, nullable=True)


class HostRow(Base):
    __tablename__ = "hosts"
    __table_args__ = (UniqueConstraint("experiment_id", "idx", name="uq_hosts_experiment_idx"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    idx: Mapped[int] = mapped_column(SmallInteger)
    name: Mapped[str] = mapped_column(String(255))
    backend: Mapped[str] = mapped_column(String(100))
    facts: Mapped[dict[str, Any]] = mapped_column(JSONType)


class ConfigurationRow(Base):
    """Each distinct configuration once, by its canonical key (revision 0004: the knob values
    moved to :class:`ConfigurationSettingRow`; analysts read the wide view ``configurations``,
    generated from the knob specs by :mod:`musku.storage.views`). The constraint names are
    the ones the table had as ``configurations`` (0001), kept across the rename."""

    __tablename__ = "configuration_keys"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_configurations"),
        UniqueConstraint("key", name="uq_configurations_key"),
    )

    id: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(Text)


class ConfigurationSettingRow(Base):
    """One knob's value in one configuration (Optuna-style generic rows): a new knob needs no
    schema change. ``value`` is the canonical value as text (``repr`` of a float, as in the
    key's JSON); ``number`` the same value as a number, NULL for a name ("turbo", "6:5")."""

    __tablename__ = "configuration_settings"

    configuration_id: Mapped[int] = mapped_column(
        ForeignKey("configuration_keys.id", ondelete="CASCADE"), primary_key=True
    )
    knob: Mapped[str] = mapped_column(String(100), primary_key=True, index=True)
    value: Mapped[str] = mapped_column(Text)
    number: Mapped[float | None] = mapped_column(Float, nullable=True)


class KnobRow(Base):
    """An out-of-tree knob some stored configuration uses (revision 0004): its
    ``module:Class``, so a process reading the database can load its spec."""

    __tablename__ = "knobs"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    target: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))
    description: Mapped[str] = mapped_column(Text, default="")


class ComparisonRow(Base):
    __tablename__ = "comparisons"
    __table_args__ = (CheckConstraint(_in("status", COMPARISON_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    purpose: Mapped[str] = mapped_column(String(100), index=True)
    baseline_id: Mapped[int] = mapped_column(ForeignKey("configuration_keys.id"))
    candidate_id: Mapped[int] = mapped_column(ForeignKey("configuration_keys.id"))
    status: Mapped[str] = mapped_column(String(20), default="running")
    started_at: Mapped[datetime] = mapped_column(TS)
    finished_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    # the pair it ran on (revision 0006): host_a starts on the baseline, host_b on the
    # candidate; the tester swaps them each period (samples.role says who ran what when)
    host_a: Mapped[str | None] = mapped_column(String(255), nullable=True)
    host_b: Mapped[str | None] = mapped_column(String(255), nullable=True)


class SampleRow(Base):
    """One measurement window of one host: the bulk table.

    Clustered on its composite key (``WITHOUT ROWID`` on SQLite), no surrogate id, and no
    foreign key to ``comparisons``: PostgreSQL checks a foreign key with one trigger call per
    inserted row, which cuts COPY throughput about five-fold. The Store checks the comparison
    before inserting and deletes samples together with their comparison."""

    __tablename__ = "samples"
    __table_args__ = (
        CheckConstraint("role IN ('A', 'B')", name="role"),
        {"sqlite_with_rowid": False},
    )

    comparison_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    t: Mapped[float] = mapped_column(Float)
    role: Mapped[str] = mapped_column(String(1))
    period: Mapped[int] = mapped_column(Integer, default=0)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)
    valid: Mapped[bool] = mapped_column(Boolean, default=True)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    mips: Mapped[float | None] = mapped_column(Float, nullable=True)
    qps: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    qos_violation_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


class DecisionRow(Base):
    __tablename__ = "decisions"
    __table_args__ = (CheckConstraint(_in("decision", DECISIONS), name="decision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    comparison_id: Mapped[int] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), unique=True
    )
    decision: Mapped[str] = mapped_column(String(20), index=True)
    estimate: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float] = mapped_column(Float)
    ci_high: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    host_time_s: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    method: Mapped[str] = mapped_column(Text, default="")  # 0003: the HAC method string
    guardrail_values: Mapped[dict[str, Any]] = mapped_column(JSONType)
    threading_a: Mapped[str | None] = mapped_column(String(100), nullable=True)
    threading_b: Mapped[str | None] = mapped_column(String(100), nullable=True)
    decided_at: Mapped[datetime] = mapped_column(TS)
    # 0009: where host_time_s went (musku.domain.TimeBreakdown); NULL: not recorded
    time_measuring_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_warmup_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_switching_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_reboot_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class SoftSkuRow(Base):
    __tablename__ = "soft_skus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    service: Mapped[str] = mapped_column(String(100), index=True)
    platform: Mapped[str] = mapped_column(String(100), index=True)
    configuration_id: Mapped[int] = mapped_column(ForeignKey("configuration_keys.id"))
    created_at: Mapped[datetime] = mapped_column(TS)


class ValidationRow(Base):
    __tablename__ = "validations"
    __table_args__ = (
        CheckConstraint("against IN ('production', 'stock')", name="against"),
        UniqueConstraint("soft_sku_id", "against", name="uq_validations_sku_against"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    soft_sku_id: Mapped[int] = mapped_column(ForeignKey("soft_skus.id", ondelete="CASCADE"))
    against: Mapped[str] = mapped_column(String(20))
    comparison_id: Mapped[int] = mapped_column(ForeignKey("comparisons.id"), index=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"))


class ThreadingTableRow(Base):
    __tablename__ = "threading_tables"
    __table_args__ = (
        Index("ix_threading_tables_lookup", "service", "host", "platform", "config_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service: Mapped[str] = mapped_column(String(100))
    host: Mapped[str] = mapped_column(String(255))
    platform: Mapped[str] = mapped_column(String(100))
    config_key: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(TS)


class PairCalibrationRow(Base):
    """A host pair's measured bias (``musku pair calibrate``): revision 0003."""

    __tablename__ = "pair_calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair: Mapped[str] = mapped_column(String(255), index=True)
    hardware: Mapped[str] = mapped_column(Text)
    metric: Mapped[str] = mapped_column(String(100))
    bias: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float] = mapped_column(Float)
    ci_high: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    taken_at: Mapped[datetime] = mapped_column(TS)
    needs_recalibration: Mapped[bool] = mapped_column(Boolean, default=False)
    note: Mapped[str] = mapped_column(Text, default="")
    # revision 0011: the pair's noise (long-run variance per window, its df, the window)
    noise_lrv: Mapped[float | None] = mapped_column(Float, nullable=True)
    noise_df: Mapped[float | None] = mapped_column(Float, nullable=True)
    window_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # revision 0012: the host bias's slow wander (OU sd and time constant)
    wander_sd: Mapped[float | None] = mapped_column(Float, nullable=True)
    wander_tau_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class ConfigTransientRow(Base):
    """A warm-up transient measured for one configuration on one pair: revision 0003."""

    __tablename__ = "config_transients"
    __table_args__ = (Index("ix_config_transients_lookup", "pair", "hardware", "config_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair: Mapped[str] = mapped_column(String(255))
    hardware: Mapped[str] = mapped_column(Text)
    config_key: Mapped[str] = mapped_column(Text)
    seconds: Mapped[float] = mapped_column(Float)
    measured_at: Mapped[datetime] = mapped_column(TS)


metadata = Base.metadata


class QueueRow(Base):
    """Revision 0007: a sweep's comparison queue (PostgreSQL; docs/cli.md "Workers"). One row
    per comparison a sweep needs (unique per experiment, purpose, baseline and candidate),
    ``queued -> claimed -> done``; a claimer renews ``expires_at`` while it measures, and a
    claim whose ``expires_at`` has passed (a dead controller or worker) is claimed again."""

    __tablename__ = "comparison_queue"
    __table_args__ = (
        CheckConstraint(_in("state", QUEUE_STATES), name="state"),
        UniqueConstraint(
            "experiment_id",
            "purpose",
            "baseline_id",
            "candidate_id",
            name="uq_comparison_queue_comparison",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    purpose: Mapped[str] = mapped_column(String(100))
    baseline_id: Mapped[int] = mapped_column(ForeignKey("configuration_keys.id"))
    candidate_id: Mapped[int] = mapped_column(ForeignKey("configuration_keys.id"))
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(10), default="queued")
    claimed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    comparison_id: Mapped[int | None] = mapped_column(
        ForeignKey("comparisons.id", ondelete="SET NULL"), nullable=True
    )
    enqueued_at: Mapped[datetime] = mapped_column(TS)
    done_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)


DEPLOYMENT_STATUSES = ("canary", "rolling", "deployed", "rolled_back", "failed", "retired")
WATCH_VERDICTS = ("holds", "gone", "lost")


class DeploymentRow(Base):
    """Revision 0008: one rollout of a soft SKU (``musku sku deploy``, docs/rollout.md).
    ``hosts`` in rollout order, the first ``canary_hosts`` of them the canary; ``waves`` the
    rollout's steps as JSON (``[{"hosts": [...], "state": "applied" | "rolled_back",
    "at": ...}, ...]``, the canary first); ``experiment_id`` the run its comparisons are
    recorded under; ``code_version`` what the hosts ran when it was deployed."""

    __tablename__ = "deployments"
    __table_args__ = (CheckConstraint(_in("status", DEPLOYMENT_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    soft_sku_id: Mapped[int] = mapped_column(ForeignKey("soft_skus.id"), index=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    backend: Mapped[str] = mapped_column(String(100))
    hosts: Mapped[list[str]] = mapped_column(JSONType)
    canary_hosts: Mapped[list[str]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(String(20), index=True)
    canary_comparison_id: Mapped[int | None] = mapped_column(
        ForeignKey("comparisons.id", ondelete="SET NULL"), nullable=True
    )
    waves: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    code_version: Mapped[str | None] = mapped_column(String(255), nullable=True)
    controller: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(TS)
    updated_at: Mapped[datetime] = mapped_column(TS)
    finished_at: Mapped[datetime | None] = mapped_column(TS, nullable=True)


class DeploymentWatchRow(Base):
    """Revision 0008: one re-validation of a deployment against production hosts
    (``musku sku watch``): when, at which code version, the comparison and its verdict
    (``holds``: still significantly better; ``gone``: not any more; ``lost``: worse, or a
    guardrail broken)."""

    __tablename__ = "deployment_watches"
    __table_args__ = (CheckConstraint(_in("verdict", WATCH_VERDICTS), name="verdict"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    checked_at: Mapped[datetime] = mapped_column(TS)
    code_version: Mapped[str | None] = mapped_column(String(255), nullable=True)
    comparison_id: Mapped[int | None] = mapped_column(
        ForeignKey("comparisons.id", ondelete="SET NULL"), nullable=True
    )
    verdict: Mapped[str] = mapped_column(String(10))
    reason: Mapped[str] = mapped_column(Text, default="")
