"""Running a normalised model through the C++ engine (``musku_qsim``, built from services/qsim)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from musku.errors import InputError, MuskuError, UnsupportedError

BINARY = "qsim/musku_qsim"


def binary() -> Path:
    """The engine binary ($MUSKU_QSIM overrides; else the services' release build)."""
    env = os.environ.get("MUSKU_QSIM")
    if env:
        p = Path(env)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise UnsupportedError(f"MUSKU_QSIM={env} is not an executable file")
        return p
    from musku.services.runtime import binary as services_binary

    return services_binary(BINARY)


def simulate(doc: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
    """Run one normalised model document; the engine's result document."""
    try:
        proc = subprocess.run(
            [str(binary()), "-"],
            input=json.dumps(doc).encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise MuskuError(f"the simulation took longer than {timeout} s") from None
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    if proc.returncode == 3:
        raise InputError(err[-1] if err else "the engine refused the model")
    if proc.returncode != 0:
        raise MuskuError(
            f"musku_qsim exited with status {proc.returncode}: {err[-1] if err else ''}"
        )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result
