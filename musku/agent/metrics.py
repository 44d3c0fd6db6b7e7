"""The agent's Prometheus metrics (its own registry: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class AgentMetrics:
    """The counters the agent updates; the agent fills in the gauges before each exposition
    (:meth:`refresh`), so this module knows nothing of the agent."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "musku_agent_requests", "API requests", ["op", "outcome"], registry=r
        )
        self.applies = Counter("musku_agent_applies", "apply requests", ["outcome"], registry=r)
        self.rollbacks = Counter(
            "musku_agent_rollbacks", "experiment/deploy rollbacks", ["reason"], registry=r
        )
        self.lease_expiries = Counter(
            "musku_agent_lease_expiries",
            "experiments reverted because the lease lapsed",
            registry=r,
        )
        self.drift = Counter(
            "musku_agent_drift_samples",
            "samples taken while a knob was changed from outside",
            registry=r,
        )
        self.refused = Counter(
            "musku_agent_refused_connections",
            "connections refused (peer uid / auth)",
            ["why"],
            registry=r,
        )
        self.sample_seconds = Histogram(
            "musku_agent_sample_seconds",
            "time to take one sample",
            buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
            registry=r,
        )
        self.last = Gauge("musku_metric", "latest sampled value", ["metric"], registry=r)
        self.lease_remaining = Gauge(
            "musku_agent_lease_remaining_seconds",
            "seconds left on the experiment lease (-1: none)",
            registry=r,
        )
        self.spool_rows = Gauge(
            "musku_agent_spool_rows", "samples waiting for the controller", registry=r
        )
        self.experiment_active = Gauge(
            "musku_agent_experiment_active", "1 while an experiment runs", registry=r
        )

    def refresh(self, *, lease_remaining: float, spool_rows: int, experiment_active: bool) -> None:
        """The gauges of the agent's state: seconds left on the lease (-1: none), samples
        waiting for the controller, whether an experiment runs."""
        self.lease_remaining.set(lease_remaining)
        self.spool_rows.set(spool_rows)
        self.experiment_active.set(1 if experiment_active else 0)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
