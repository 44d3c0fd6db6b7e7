"""Where the built C++ services are: the build directory and each binary's path in it."""

from __future__ import annotations

import os
from pathlib import Path

from musku.errors import UnsupportedError

REPO = Path(__file__).resolve().parents[2]
SERVICES_SRC = REPO / "services"


def build_dir() -> Path:
    """Release build directory (``MUSKU_SERVICES_BUILD`` overrides services/build)."""
    env = os.environ.get("MUSKU_SERVICES_BUILD")
    return Path(env) if env else SERVICES_SRC / "build"


_BINARIES = {
    "musku_admin": "framework/musku_admin",
    "musku_loadgen": "loadgen/musku_loadgen",
    "setalgebra_leaf": "setalgebra/setalgebra_leaf",
    "setalgebra_midtier": "setalgebra/setalgebra_midtier",
    "setalgebra_gen": "setalgebra/setalgebra_gen",
    "hdsearch_lsh_bench": "hdsearch/hdsearch_lsh_bench",
    "setalgebra_client": "setalgebra/setalgebra_client",
    **{
        f"{svc}_{part}": f"{svc}/{svc}_{part}"
        for svc in ("hdsearch", "router", "recommend")
        for part in ("leaf", "midtier", "client")
    },
}


def binary(name: str) -> Path:
    """Path of a built binary; UnsupportedError with the fix if it is not built."""
    rel = _BINARIES.get(name, name)
    path = build_dir() / rel
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UnsupportedError(
            f"{name} is not built ({path} missing): run `musku services build` "
            "or scripts/build-services"
        )
    return path
