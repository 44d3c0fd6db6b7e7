"""The agent's crash-safe journal (SQLite, WAL, ``synchronous=FULL``).

What it records, always *before* the write it protects:

- ``originals``: the pristine state of each knob the first time musku touches it (a knob
  :class:`~musku.knobs.base.Snapshot`); ``rollback --undeploy`` returns the host to it.
- ``steps``: every write of the open *transaction* (an experiment, or a deploy in progress):
  the knob, the snapshot taken just before the write, and the value written. Rolling the steps
  back in reverse order returns every knob to the state it had before the transaction.
- ``state``: the deployed soft SKU (kept across restarts: TuneD issue #416) and the open
  transaction's kind.

Life cycle of a transaction (documented transitions)::

    none --begin(experiment|deploy)--> open --commit--> none   (deploy: SKU recorded)
                                        open --rollback--> none
    on start: open --(recovery) rollback--> none

A transaction still open when the agent starts is unfinished: it is rolled back.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.errors import HostError

SCHEMA_VERSION = 1


class TxKind(enum.Enum):
    EXPERIMENT = "experiment"
    DEPLOY = "deploy"


@dataclass(frozen=True)
class Step:
    seq: int
    knob: str
    snapshot: dict[str, Any]
    value: Any
    done: bool


class Journal:
    """One agent's journal. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._create()
        except sqlite3.Error as exc:
            raise HostError(f"cannot open the agent journal {self.path}: {exc}") from None

    def _create(self) -> None:
        with self._lock:
            self._db.executescript(
                """
                CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS originals (
                    knob TEXT PRIMARY KEY, seq INTEGER NOT NULL, snapshot TEXT NOT NULL,
                    taken_at REAL NOT NULL);
                CREATE TABLE IF NOT EXISTS steps (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT, knob TEXT NOT NULL,
                    snapshot TEXT NOT NULL, value TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0);
                """
            )
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise HostError(
                    f"agent journal {self.path} has schema {row[0]}, this musku uses "
                    f"{SCHEMA_VERSION}; roll back with the musku that wrote it first"
                )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # meta -------------------------------------------------------------------------------

    def _get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set(self, key: str, value: str | None) -> None:
        if value is None:
            self._db.execute("DELETE FROM meta WHERE key=?", (key,))
        else:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def open_tx(self) -> TxKind | None:
        with self._lock:
            v = self._get("tx")
            return TxKind(v) if v else None

    def tx_info(self) -> dict[str, Any]:
        with self._lock:
            v = self._get("tx_info")
            return json.loads(v) if v else {}

    def deployed(self) -> dict[str, Any] | None:
        with self._lock:
            v = self._get("deployed")
            return json.loads(v) if v else None

    def begin(self, kind: TxKind, info: dict[str, Any] | None = None) -> None:
        with self._lock:
            if self.open_tx() is not None:
                raise HostError(f"a {self.open_tx().value} transaction is already open")  # type: ignore[union-attr]
            self._db.execute("BEGIN IMMEDIATE")
            self._set("tx", kind.value)
            self._set("tx_info", json.dumps(info or {}))
            self._db.execute("COMMIT")

    def set_tx_info(self, info: dict[str, Any]) -> None:
        with self._lock:
            self._set("tx_info", json.dumps(info))

    # steps ------------------------------------------------------------------------------

    def record_step(self, knob: str, snapshot: dict[str, Any], value: Any) -> int:
        """Persist (fsync) the snapshot before the write; also the knob's original, once."""
        with self._lock:
            if self.open_tx() is None:
                raise HostError("internal: write outside a transaction")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO steps (knob, snapshot, value, done) VALUES (?, ?, ?, 0)",
                    (knob, json.dumps(snapshot), json.dumps(value)),
                )
                seq = int(cur.lastrowid or 0)
                self._db.execute(
                    "INSERT OR IGNORE INTO originals VALUES (?, ?, ?, ?)",
                    (knob, seq, json.dumps(snapshot), time.time()),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return seq

    def mark_done(self, seq: int) -> None:
        with self._lock:
            self._db.execute("UPDATE steps SET done=1 WHERE seq=?", (seq,))

    def steps(self, after: int = 0) -> list[Step]:
        """Steps of the open transaction with ``seq > after``, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, knob, snapshot, value, done FROM steps WHERE seq > ? ORDER BY seq",
                (after,),
            ).fetchall()
        return [
            Step(int(r[0]), str(r[1]), json.loads(r[2]), json.loads(r[3]), bool(r[4])) for r in rows
        ]

    def last_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM steps").fetchone()
            return int(row[0])

    def forget_step(self, seq: int) -> None:
        """A step has been rolled back (restored on the host): drop it."""
        with self._lock:
            self._db.execute("DELETE FROM steps WHERE seq=?", (seq,))

    def close_tx(self, *, deployed: dict[str, Any] | None | bool = False) -> None:
        """End the open transaction (steps dropped). ``deployed``: a dict records the new soft
        SKU, ``None`` clears it, ``False`` leaves it as is. One atomic commit."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM steps")
                self._set("tx", None)
                self._set("tx_info", None)
                if deployed is not False:
                    self._set("deployed", json.dumps(deployed) if deployed is not None else None)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # originals --------------------------------------------------------------------------

    def originals(self) -> list[tuple[str, dict[str, Any]]]:
        """(knob, pristine snapshot), in the order musku first touched them."""
        with self._lock:
            rows = self._db.execute("SELECT knob, snapshot FROM originals ORDER BY seq").fetchall()
        return [(str(r[0]), json.loads(r[1])) for r in rows]

    def forget_originals(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM originals")
