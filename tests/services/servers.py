"""Starting and stopping the built C++ servers in end-to-end tests (shared by tests/services)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

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
