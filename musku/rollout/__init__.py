"""Rolling soft SKUs out to hosts and watching them (``musku sku deploy | watch``,
docs/rollout.md): :mod:`musku.rollout.fleet` the hosts, :mod:`musku.rollout.deploy` the
workflows."""

from musku.rollout.deploy import (
    DeployReport,
    WatchResult,
    deploy_sku,
    retire_deployment,
    rollback_deployment,
    watch,
    watch_round,
)

__all__ = [
    "DeployReport",
    "WatchResult",
    "deploy_sku",
    "retire_deployment",
    "rollback_deployment",
    "watch",
    "watch_round",
]
