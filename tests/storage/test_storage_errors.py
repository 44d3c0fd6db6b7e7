"""Bad input gives one clear line (DatabaseError / SchemaOutOfDate), never a traceback or a
password; importing musku.storage stays cheap."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from musku.errors import DatabaseError, ExitStatus
from musku.storage import current_revision, default_url, open_store, upgrade


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.strip() == text and text
    return text


def test_unreachable_postgresql_hides_password() -> None:
    url = f"postgresql://analyst:s3cr3t-pw@127.0.0.1:{_closed_port()}/results"
    with pytest.raises(DatabaseError) as info:
        open_store(url)
    text = _one_line(info.value)
    assert "s3cr3t-pw" not in text
    assert text.startswith("cannot open database postgresql+psycopg://analyst:***@127.0.0.1:")
    assert info.value.status is ExitStatus.DATABASE
    with pytest.raises(DatabaseError) as again:
        upgrade(url)
    assert "s3cr3t-pw" not in _one_line(again.value)
    with pytest.raises(DatabaseError):
        current_revision(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root:hunter2@db/results", "unsupported database 'mysql'"),
        ("oracle+cx_oracle://u@h/x", "unsupported database 'oracle'"),
        ("postgresql+nosuchdriver://u:hunter2@h/x", "unsupported PostgreSQL driver"),
        ("postgresql+psycopg2://u:hunter2@h/x", "musku uses psycopg 3"),
        ("sqlite+pysqlcipher:///x.db", "unsupported SQLite driver"),
        ("this is not a url", "not a database URL"),
        ("sqlite:////nonexistent-dir-musku/results.db", "cannot open database"),
    ],
)
def test_bad_urls(url: str, expected: str) -> None:
    with pytest.raises(DatabaseError) as info:
        open_store(url)
    text = _one_line(info.value)
    assert expected in text
    assert "hunter2" not in text


def test_default_url_is_a_sqlite_file_in_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MUSKU_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    url = default_url()
    assert url == f"sqlite:///{tmp_path / 'xdg' / 'musku' / 'results.db'}"
    assert (tmp_path / "xdg" / "musku").is_dir()
    with open_store() as store:  # None -> default_url()
        assert store.experiments() == []
    assert (tmp_path / "xdg" / "musku" / "results.db").is_file()
    monkeypatch.setenv("MUSKU_DB", f"sqlite:///{tmp_path / 'env.db'}")
    assert default_url() == f"sqlite:///{tmp_path / 'env.db'}"


def test_importing_storage_does_not_import_sqlalchemy() -> None:
    code = (
        "import sys, musku.storage, musku.storage.records\n"
        "heavy = [m for m in ('sqlalchemy', 'alembic', 'psycopg') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
