"""Read commands serve a read-only results DB (issue 29): `results`, `report`, `experiments`,
`sku show`, exports open SQLite read-only and never migrate, create or write. Made real
although the tests run as root (who may write a 0444 file): the commands run as `nobody` on a
0444 file in a 0555 directory, and as root on a file and directory made immutable
(`chattr +i`). And a command that writes (`abort`) refuses a missing DB file without creating
it."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_exit_codes import musku, one_error_line

ROOT = Path(__file__).resolve().parents[2]

READERS = [
    ["results"],
    ["results", "toy"],
    ["results", "toy", "--json"],
    ["experiments"],
    ["sku", "show"],
    ["sku", "deployments"],
    ["results", "toy", "--format", "csv", "--table", "decisions"],
]


@pytest.fixture
def ro_dir(toy_db: tuple[str, Path]) -> Iterator[Path]:
    """A world-readable directory (outside pytest's 0700 tree) holding a WAL-mode copy of the
    toy DB; made writable again and removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="musku-ro-"))
    src = sqlite3.connect(toy_db[0].removeprefix("sqlite:///"))
    dst = sqlite3.connect(d / "results.db")
    src.backup(dst)
    dst.execute("PRAGMA journal_mode=WAL")
    src.close()
    dst.close()
    (d / "out").mkdir()
    os.chmod(d / "out", 0o777)
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        subprocess.run(["chattr", "-i", str(d / "results.db"), str(d)], capture_output=True)
        os.chmod(d, 0o755)
        shutil.rmtree(d)


def _state(d: Path) -> tuple[list[str], str]:
    names = sorted(p.name for p in d.iterdir())
    return names, hashlib.sha256((d / "results.db").read_bytes()).hexdigest()


def _as_nobody() -> list[str]:
    if os.geteuid() != 0:
        return []  # not root: the modes alone make the file read-only
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv not installed")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _run(prefix: list[str], d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MUSKU_DEBUG", "MUSKU_DB", "PYTHONPATH")
    }
    env.update(HOME=str(d / "out"), MPLCONFIGDIR=str(d / "out"), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [*prefix, sys.executable, "-m", "musku", *args, "--db", f"sqlite:///{d}/results.db"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def _check_readers(prefix: list[str], d: Path) -> None:
    before = _state(d)
    for args in READERS:
        proc = _run(prefix, d, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "error" not in proc.stderr, (args, proc.stderr)
    proc = _run(prefix, d, "results", "toy", "--format", "json")
    assert proc.returncode == 0 and proc.stdout.startswith("["), proc.stderr
    proc = _run(prefix, d, "report", "toy", "-o", str(d / "out" / "r.html"))
    assert proc.returncode == 0, proc.stderr
    assert (d / "out" / "r.html").read_text().rstrip().endswith("</html>")
    assert _state(d) == before  # no -wal, -shm or journal left, not a byte changed


def test_read_only_file_and_directory_serve_readers(ro_dir: Path) -> None:
    prefix = _as_nobody()
    os.chmod(ro_dir / "results.db", 0o444)
    os.chmod(ro_dir, 0o555)
    _check_readers(prefix, ro_dir)
    # a writer gets one line, exit 5, and writes nothing
    before = _state(ro_dir)
    proc = _run(prefix, ro_dir, "abort", "1")
    assert proc.returncode == 5, proc.stderr
    assert "readonly" in one_error_line(proc)
    assert _state(ro_dir) == before


def test_immutable_file_and_directory_serve_readers_as_root(ro_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root")
    proc = subprocess.run(
        ["chattr", "+i", str(ro_dir / "results.db"), str(ro_dir)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"chattr +i unsupported here: {proc.stderr.strip()}")
    _check_readers([], ro_dir)


def test_readers_on_a_missing_db_create_nothing(tmp_path: Path) -> None:
    for args in (["results"], ["experiments"], ["sku", "show"], ["abort", "1"]):
        proc = musku(*args, "--db", f"sqlite:///{tmp_path}/none.db")
        assert proc.returncode == 5, (args, proc.stderr)
        assert "no musku database" in one_error_line(proc)
        assert list(tmp_path.iterdir()) == []
