"""The results database: SQLAlchemy 2 models, alembic migrations shipped in the package, and
the :class:`~musku.storage.store.Store` the sweep, the CLI and the threading auto-tuner use.

SQLite (default: a file in the user data directory) or PostgreSQL, by URL. Importing this
package is cheap: SQLAlchemy and alembic load on first use, so ``musku --help`` stays instant.

    from musku.storage import open_store, upgrade, default_url, current_revision
    store = open_store(url)          # creates a new DB at head; refuses an out-of-date one
    exp_id = store.create_experiment(experiment)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from musku.storage.records import (
    EXPERIMENT_TRANSITIONS,
    ComparisonRecord,
    ComparisonStatus,
    ExperimentRecord,
    HostRecord,
    InvalidTransition,
    SoftSkuRecord,
    ThreadingTableRecord,
    result_from_dict,
    result_to_dict,
    softsku_to_dict,
)
from musku.storage.urls import ENV_URL, default_path, default_url

if TYPE_CHECKING:
    from musku.storage.migrate import head_revision
    from musku.storage.store import Store, current_revision, open_store, upgrade

__all__ = [
    "ENV_URL",
    "EXPERIMENT_TRANSITIONS",
    "ComparisonRecord",
    "ComparisonStatus",
    "ExperimentRecord",
    "HostRecord",
    "InvalidTransition",
    "SoftSkuRecord",
    "Store",
    "ThreadingTableRecord",
    "current_revision",
    "default_path",
    "default_url",
    "head_revision",
    "open_store",
    "result_from_dict",
    "result_to_dict",
    "softsku_to_dict",
    "upgrade",
]


_LAZY = frozenset({"Store", "open_store", "upgrade", "current_revision", "head_revision"})
"""Names served by :mod:`musku.storage.store` on first use (PEP 562): the store, opening,
upgrading and the schema revisions."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        # lazy: SQLAlchemy and alembic (~0.2 s); importing musku.storage stays cheap (the agent's
        # start and `musku --help` load this package, not the store)
        from musku.storage import store

        value: object = getattr(store, name)
        globals()[name] = value  # the next look-up is a plain attribute
        return value
    raise AttributeError(f"module 'musku.storage' has no attribute {name!r}")
