"""Where the results database is by default: ``$MUSKU_DB``, else a SQLite file in the user
data directory. Below :mod:`musku.storage.store` (which opens it) and re-exported by the
package, so that the store does not import its own package."""

from __future__ import annotations

import os
from pathlib import Path

ENV_URL = "MUSKU_DB"
"""Environment variable overriding the default database URL."""


def default_path() -> Path:
    import platformdirs  # lazy: 30 ms, and importing musku.storage stays cheap

    return Path(platformdirs.user_data_dir("musku")) / "results.db"


def default_url() -> str:
    """``$MUSKU_DB`` if set, else ``sqlite:///<user data dir>/musku/results.db`` (the
    directory is created)."""
    env = os.environ.get(ENV_URL)
    if env:
        return env
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"
