"""Small frozen records the :class:`~musku.storage.store.Store` returns, and the JSON forms of
domain objects. Nothing here imports SQLAlchemy, so the CLI can use these at start-up.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    DeploymentStatus,
    ExperimentStatus,
    SoftSku,
    TimeBreakdown,
    run_kind,
)
from musku.errors import DatabaseError
from musku.text import interval_note


class InvalidTransition(DatabaseError):
    """A status change the documented life cycle does not allow."""


class ComparisonStatus(enum.Enum):
    """running -> finished | aborted. ``aborted`` = the decision was ABORTED, or the comparison
    was left ``running`` by a crashed run and closed by :meth:`Store.abort_running`."""

    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


EXPERIMENT_TRANSITIONS: Mapping[ExperimentStatus, frozenset[ExperimentStatus]] = {
    ExperimentStatus.CREATED: frozenset({ExperimentStatus.RUNNING, ExperimentStatus.ABORTED}),
    ExperimentStatus.RUNNING: frozenset(
        {
            ExperimentStatus.INTERRUPTED,
            ExperimentStatus.DONE,
            ExperimentStatus.FAILED,
            ExperimentStatus.ABORTED,
        }
    ),
    ExperimentStatus.INTERRUPTED: frozenset({ExperimentStatus.RUNNING, ExperimentStatus.ABORTED}),
    ExperimentStatus.DONE: frozenset(),
    ExperimentStatus.FAILED: frozenset(),
    ExperimentStatus.ABORTED: frozenset(),
}
"""Allowed experiment status changes:
``created -> running -> (interrupted -> running)* -> done | failed``, and ``aborted`` (by
``musku abort``) from any unfinished status."""


DEPLOYMENT_TRANSITIONS: Mapping[DeploymentStatus, frozenset[DeploymentStatus]] = {
    DeploymentStatus.CANARY: frozenset(
        {DeploymentStatus.ROLLING, DeploymentStatus.ROLLED_BACK, DeploymentStatus.FAILED}
    ),
    DeploymentStatus.ROLLING: frozenset(
        {DeploymentStatus.DEPLOYED, DeploymentStatus.ROLLED_BACK, DeploymentStatus.FAILED}
    ),
    # `musku sku rollback`: an operator puts a deployed soft SKU's hosts back;
    # `musku sku retire`: an operator ends a deployment as planned (hosts back, released)
    DeploymentStatus.DEPLOYED: frozenset(
        {DeploymentStatus.ROLLED_BACK, DeploymentStatus.RETIRED, DeploymentStatus.FAILED}
    ),
    DeploymentStatus.ROLLED_BACK: frozenset(),
    DeploymentStatus.FAILED: frozenset(),
    DeploymentStatus.RETIRED: frozenset(),
}
"""Allowed deployment status changes: ``canary -> rolling -> deployed``; ``rolled_back`` or
``failed`` from ``canary``, ``rolling`` or ``deployed``; ``retired`` from ``deployed``."""


def _ts(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def configuration_to_dict(config: Configuration) -> dict[str, Any]:
    return dict(config.as_dict())


def result_to_dict(result: ComparisonResult) -> dict[str, Any]:
    """JSON form of a :class:`~musku.domain.ComparisonResult`."""
    return {
        "baseline": configuration_to_dict(result.baseline),
        "candidate": configuration_to_dict(result.candidate),
        "decision": result.decision.value,
        "estimate": result.estimate,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        # why the interval's ends are null in JSON (unbounded: no interval yet), else None
        "interval_note": interval_note(result.ci_low, result.ci_high, result.reason),
        "samples": result.samples,
        "host_time_s": result.host_time_s,
        "reason": result.reason,
        "guardrail_values": dict(result.guardrail_values),
        "threading": dict(result.threading),
        "method": result.method,
        "time": result.time.as_dict() if result.time is not None else None,
    }


def result_from_dict(data: Mapping[str, Any]) -> ComparisonResult:
    """Inverse of :func:`result_to_dict`."""
    return ComparisonResult(
        baseline=Configuration.of(data["baseline"]),
        candidate=Configuration.of(data["candidate"]),
        decision=Decision(data["decision"]),
        estimate=float(data["estimate"]),
        ci_low=float(data["ci_low"]),
        ci_high=float(data["ci_high"]),
        samples=int(data["samples"]),
        host_time_s=float(data["host_time_s"]),
        reason=str(data.get("reason", "")),
        guardrail_values={str(k): float(v) for k, v in data.get("guardrail_values", {}).items()},
        threading={str(k): str(v) for k, v in data.get("threading", {}).items()},
        method=str(data.get("method", "")),
        time=TimeBreakdown.from_dict(data["time"]) if isinstance(data.get("time"), dict) else None,
    )


def softsku_to_dict(sku: SoftSku) -> dict[str, Any]:
    return {
        "service": sku.service,
        "platform": sku.platform,
        "configuration": configuration_to_dict(sku.configuration),
        "vs_production": result_to_dict(sku.vs_production) if sku.vs_production else None,
        "vs_stock": result_to_dict(sku.vs_stock) if sku.vs_stock else None,
    }


@dataclass(frozen=True)
class HostRecord:
    index: int
    name: str
    backend: str
    facts: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "backend": self.backend,
            "facts": dict(self.facts),
        }


@dataclass(frozen=True)
class ExperimentRecord:
    """One row of ``experiments`` (plus its hosts)."""

    id: int
    name: str
    description: str
    service: str
    platform: str
    mode: str
    baseline: str
    metric: str
    direction: str
    status: ExperimentStatus
    path: str
    content: Mapping[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    hosts: tuple[HostRecord, ...] = ()

    @property
    def kind(self) -> str:
        """sweep, abtest, deploy, watch or calibrate (:data:`musku.domain.RUN_KINDS`)."""
        return run_kind(self.mode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "service": self.service,
            "platform": self.platform,
            "mode": self.mode,
            "baseline": self.baseline,
            "metric": self.metric,
            "direction": self.direction,
            "status": self.status.value,
            "path": self.path,
            "content": dict(self.content),
            "created_at": _ts(self.created_at),
            "started_at": _ts(self.started_at),
            "finished_at": _ts(self.finished_at),
            "hosts": [h.to_dict() for h in self.hosts],
        }


@dataclass(frozen=True)
class ComparisonRecord:
    """One row of ``comparisons`` with its decision (``result``), when it has one."""

    id: int
    experiment_id: int
    purpose: str
    baseline: Configuration
    candidate: Configuration
    status: ComparisonStatus
    started_at: datetime
    finished_at: datetime | None
    result: ComparisonResult | None
    sample_count: int = 0
    hosts: tuple[str, str] | None = None  # the pair it ran on (revision 0006)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "experiment_id": self.experiment_id,
            "purpose": self.purpose,
            "baseline": configuration_to_dict(self.baseline),
            "candidate": configuration_to_dict(self.candidate),
            "status": self.status.value,
            "started_at": _ts(self.started_at),
            "finished_at": _ts(self.finished_at),
            "result": result_to_dict(self.result) if self.result else None,
            "sample_count": self.sample_count,
            "hosts": list(self.hosts) if self.hosts else None,
        }


@dataclass(frozen=True)
class SoftSkuRecord:
    id: int
    experiment_id: int
    created_at: datetime
    sku: SoftSku

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "experiment_id": self.experiment_id,
            "created_at": _ts(self.created_at),
            **softsku_to_dict(self.sku),
        }


@dataclass(frozen=True)
class ThreadingTableRecord:
    id: int
    service: str
    host: str
    platform: str
    config_key: str
    table: Mapping[str, Any]
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "service": self.service,
            "host": self.host,
            "platform": self.platform,
            "config_key": self.config_key,
            "table": dict(self.table),
            "created_at": _ts(self.created_at),
        }


@dataclass(frozen=True)
class QueueItem:
    """A claimed row of the comparison queue (revision 0007): what to measure, with the seed
    the sweep's strategy gave it; ``attempts`` counts its claims (2+: a claimer died)."""

    id: int
    experiment_id: int
    purpose: str
    baseline: Configuration
    candidate: Configuration
    seed: int
    attempts: int


@dataclass(frozen=True)
class ClaimInfo:
    """Who holds a claim (an experiment's controller, or a queued comparison's claimer) and
    how old its heartbeat is, in seconds (None: never beat)."""

    holder: str
    host: str | None
    pid: int | None
    heartbeat_age_s: float | None


@dataclass(frozen=True)
class QueueState:
    """An experiment's claims for ``musku experiments``: its controller (None: unclaimed),
    its queued comparisons by state, and the claimers of the claimed ones."""

    controller: ClaimInfo | None
    counts: Mapping[str, int]
    claims: tuple[ClaimInfo, ...]


@dataclass(frozen=True)
class DeploymentRecord:
    """One row of ``deployments`` (revision 0008; docs/rollout.md)."""

    id: int
    soft_sku_id: int
    experiment_id: int
    backend: str
    hosts: tuple[str, ...]
    canary_hosts: tuple[str, ...]
    status: DeploymentStatus
    canary_comparison_id: int | None
    waves: tuple[Mapping[str, Any], ...]
    code_version: str | None
    controller: str
    reason: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    def applied_hosts(self) -> tuple[str, ...]:
        """Hosts a wave (the canary included) applied the soft SKU to and did not roll back."""
        out: list[str] = []
        for wave in self.waves:
            if wave.get("state") == "applied":
                out.extend(str(h) for h in wave.get("hosts", []))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "soft_sku_id": self.soft_sku_id,
            "experiment_id": self.experiment_id,
            "backend": self.backend,
            "hosts": list(self.hosts),
            "canary_hosts": list(self.canary_hosts),
            "status": self.status.value,
            "canary_comparison_id": self.canary_comparison_id,
            "waves": [dict(w) for w in self.waves],
            "code_version": self.code_version,
            "controller": self.controller,
            "reason": self.reason,
            "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at),
            "finished_at": _ts(self.finished_at),
        }


@dataclass(frozen=True)
class WatchRecord:
    """One re-validation of a deployment (``deployment_watches``, revision 0008)."""

    id: int
    deployment_id: int
    checked_at: datetime
    code_version: str | None
    comparison_id: int | None
    verdict: str  # "holds" | "gone" | "lost"
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "deployment_id": self.deployment_id,
            "checked_at": _ts(self.checked_at),
            "code_version": self.code_version,
            "comparison_id": self.comparison_id,
            "verdict": self.verdict,
            "reason": self.reason,
        }
