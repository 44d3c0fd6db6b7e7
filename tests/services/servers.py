"""Starting and stopping the built C++ servers in end-to-end tests (shared by tests/services)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

SETALGEBRA = ("setalgebra_leaf", "setalgebra_midtier", "setalgebra_gen", "musku_admin",
              "musku_loadgen")  # fmt: skip

LOGS: dict[int, Path] = {}  # server pid -> its stderr log


def start(
    args: list[str], port_file: Path, timeout: float = 120.0
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a server that writes its port to ``--port-file``; wait for it."""
    log = port_file.with_suffix(".log")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*args, "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=err
        )
    LOGS[proc.pid] = log
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{Path(args[0]).name} exited with {proc.returncode}: {log.read_text()}"
            )
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().strip())
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise TimeoutError(f"{args[0]} wrote no port file in {timeout}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server; one we stopped must exit 0 (a sanitizer report at exit fails the test)."""
    if proc.poll() is not None:
        return  # already gone (killed on purpose by the test)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"pid {proc.pid} ignored SIGTERM for 10 s") from None
    log = LOGS.pop(proc.pid, None)
    if log is not None and proc.returncode != 0:
        raise RuntimeError(
            f"server exited with {proc.returncode} at shutdown: {log.read_text()[-3000:]}"
        )


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop every process, then report any unclean exit."""
    errors = []
    for p in procs:
        try:
            stop(p)
        except RuntimeError as e:
            errors.append(str(e))
    if errors:
        raise RuntimeError("; ".join(errors))


def skip_unless_built(*binaries: str) -> None:
    """Skip the calling test module when one of these binaries is not built (services/build,
    or MUSKU_SERVICES_BUILD)."""
    from musku.services import runtime

    try:
        for b in binaries:
            runtime.binary(b)
    except Exception:
        pytest.skip("C++ services not built (scripts/build-services)", allow_module_level=True)


def start_setalgebra(
    d: Path, index: Path, procs: list[subprocess.Popen[bytes]], name: str = ""
) -> Path:
    """A one-leaf Set Algebra on ``index``: the leaf (sync-inline-block), then the mid-tier
    (async-dispatch-block, 1 poller, 2 workers, 1 response thread, up to 4 workers), waited for
    through Health. Appends both to ``procs`` (stop them with stop_all); returns the mid-tier's
    port file."""
    from musku.services import runtime

    prefix = f"{name}-" if name else ""
    leaf, lport = start(
        [str(runtime.binary("setalgebra_leaf")), "--index", str(index), "--shard", "0",
         "--shards", "1", "--threading", "sync-inline-block"],
        d / f"{prefix}leaf.port",
    )  # fmt: skip
    procs.append(leaf)
    port_file = d / f"{prefix}mid.port"
    mid, mport = start(
        [str(runtime.binary("setalgebra_midtier")), "--leaves", f"127.0.0.1:{lport}",
         "--threading", "async-dispatch-block", "--pollers", "1", "--workers", "2",
         "--responders", "1", "--max-workers", "4"],
        port_file,
    )  # fmt: skip
    procs.append(mid)
    runtime.admin(f"127.0.0.1:{mport}", "wait-healthy", "--timeout-ms", "20000")
    return port_file
