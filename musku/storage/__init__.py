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
    from musku.storage.store import Store

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


def open_store(url: str | None = None, *, create: bool = True, read_only: bool = False) -> Store:
    """Open the results DB (see :func:`musku.storage.store.open_store`)."""
    # lazy: SQLAlchemy; importing musku.storage stays cheap
    from musku.storage.store import open_store as _open

    return _open(url, create=create, read_only=read_only)


def upgrade(url: str | None = None) -> tuple[str | None, str]:
    """Create or upgrade the DB at ``url`` to this musku's schema: ``(from_rev, to_rev)``."""
    # lazy: SQLAlchemy; importing musku.storage stays cheap
    from musku.storage.store import upgrade as _upgrade

    return _upgrade(url)


def current_revision(url: str | None = None) -> str | None:
    """The DB's schema revision (None when it has no musku schema yet)."""
    # lazy: SQLAlchemy; importing musku.storage stays cheap
    from musku.storage.store import current_revision as _current

    return _current(url)


def head_revision() -> str:
    """The schema revision this musku needs."""
    # lazy: SQLAlchemy; importing musku.storage stays cheap
    from musku.storage.migrate import head_revision as _head

    return _head()


def __getattr__(name: str) -> object:
    if name == "Store":
        # lazy: SQLAlchemy; importing musku.storage stays cheap
        from musku.storage.store import Store

        return Store
    raise AttributeError(name)
