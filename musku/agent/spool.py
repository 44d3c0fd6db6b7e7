"""The agent's metric spool: samples kept on local disk until the controller acknowledges them.

Rows get increasing ids. ``collect(cursor)`` returns the rows with ``id > cursor`` (oldest first)
and the cursor to continue from; it does not change anything, so collecting twice from the same
cursor returns the same rows. ``ack(cursor)`` lets the agent delete rows ``id <= cursor``.
A cap (``max_rows``) bounds the disk used while no controller is collecting: beyond it the
oldest rows go first and the loss is counted (``dropped``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.errors import HostError


@dataclass(frozen=True)
class Row:
    id: int
    t: float  # host wall-clock seconds at the end of the sample
    duration: float
    metrics: dict[str, float]
    valid: bool
    note: str
    config: str  # Configuration.key() the host was verified at ("" = none)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "t": self.t,
            "duration": self.duration,
            "metrics": self.metrics,
            "valid": self.valid,
            "note": self.note,
            "config": self.config,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        return cls(
            int(d["id"]),
            float(d["t"]),
            float(d["duration"]),
            {str(k): float(v) for k, v in dict(d["metrics"]).items()},
            bool(d["valid"]),
            str(d.get("note", "")),
            str(d.get("config", "")),
        )


class Spool:
    def __init__(self, path: str | Path, *, max_rows: int = 1_000_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_rows = max_rows
        self.dropped = 0
        self._lock = threading.Lock()
        self._pending: list[tuple[float, float, str, int, str, str]] = []
        try:
            self._db = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS samples (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " t REAL NOT NULL, duration REAL NOT NULL, metrics TEXT NOT NULL,"
                " valid INTEGER NOT NULL, note TEXT NOT NULL, config TEXT NOT NULL)"
            )
            # kept incrementally: COUNT(*) on a day's worth of rows every flush would cost CPU
            self._count = int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        except sqlite3.Error as exc:
            raise HostError(f"cannot open the metric spool {self.path}: {exc}") from None

    def add(
        self,
        t: float,
        duration: float,
        metrics: dict[str, float],
        *,
        valid: bool = True,
        note: str = "",
        config: str = "",
    ) -> None:
        """Queue one row; :meth:`flush` writes queued rows in one transaction."""
        with self._lock:
            self._pending.append(
                (t, duration, json.dumps(metrics, separators=(",", ":")), int(valid), note, config)
            )

    def flush(self) -> int:
        with self._lock:
            rows, self._pending = self._pending, []
            if not rows:
                return 0
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO samples (t, duration, metrics, valid, note, config)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            self._count += len(rows)
            if self._count > self.max_rows:
                excess = self._count - self.max_rows
                self._count = self.max_rows
                self._db.execute(
                    "DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT ?)",
                    (excess,),
                )
                self.dropped += excess
            self._db.execute("COMMIT")
            return len(rows)

    def collect(self, cursor: int, limit: int = 5000) -> tuple[list[Row], int]:
        """Rows with ``id > cursor`` (at most ``limit``) and the cursor after them."""
        self.flush()
        with self._lock:
            got = self._db.execute(
                "SELECT id, t, duration, metrics, valid, note, config FROM samples"
                " WHERE id > ? ORDER BY id LIMIT ?",
                (cursor, limit),
            ).fetchall()
        rows = [
            Row(
                int(r[0]),
                float(r[1]),
                float(r[2]),
                json.loads(r[3]),
                bool(r[4]),
                str(r[5]),
                str(r[6]),
            )
            for r in got
        ]
        return rows, (rows[-1].id if rows else cursor)

    def ack(self, cursor: int) -> int:
        """Delete rows ``id <= cursor``; returns how many went."""
        with self._lock:
            cur = self._db.execute("DELETE FROM samples WHERE id <= ?", (cursor,))
            self._count -= int(cur.rowcount)
            return int(cur.rowcount)

    def count(self) -> int:
        with self._lock:
            return self._count + len(self._pending)

    def head(self) -> int:
        """The newest row id written so far (0 when none)."""
        self.flush()
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM samples").fetchone()
            seq = self._db.execute(
                "SELECT seq FROM sqlite_sequence WHERE name='samples'"
            ).fetchone()
        return max(int(row[0]), int(seq[0]) if seq else 0)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._db.close()
