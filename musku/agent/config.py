"""The agent's configuration file (TOML; example in ``agents/agent.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.errors import InputError

DEFAULT_CONFIG = "/etc/musku/agent.toml"
DEFAULT_SOCKET = "/run/musku/agent.sock"
DEFAULT_STATE_DIR = "/var/lib/musku-agent"


@dataclass(frozen=True)
class AgentConfig:
    root: str = "/"
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    socket: Path = Path(DEFAULT_SOCKET)
    allowed_uids: tuple[int, ...] = (0,)
    sample_interval_s: float = 0.1
    default_lease_s: float = 60.0
    max_lease_s: float = 3600.0
    spool_max_rows: int = 1_000_000
    tcp_listen: str = ""  # "host:port": only with token_file (HMAC-authenticated requests)
    token_file: Path | None = None
    prometheus_listen: str = ""  # "127.0.0.1:9478": optional HTTP exposition
    log_level: str = "info"
    samplers: dict[str, dict[str, Any]] = field(default_factory=lambda: {"perf": {}, "psutil": {}})
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None
    # co-tuning's threading tables; the mid-tier loads them, so its user must be able to read
    # them (state_dir is 0700): None = state_dir/threading-tables
    threading_tables: Path | None = None

    @property
    def table_dir(self) -> Path:
        return self.threading_tables or self.state_dir / "threading-tables"


_AGENT_KEYS = {
    "root",
    "state_dir",
    "socket",
    "allowed_uids",
    "sample_interval_s",
    "default_lease_s",
    "max_lease_s",
    "spool_max_rows",
    "tcp_listen",
    "token_file",
    "prometheus_listen",
    "log_level",
    "threading_tables",
}


def _num(where: str, key: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"[agent] {key} must be a number, not {value!r}", where=where)
    if not lo <= float(value) <= hi:
        raise InputError(f"[agent] {key} must be between {lo:g} and {hi:g}", where=where)
    return float(value)


def parse_config(
    data: dict[str, Any], *, where: str = "agent config", base: Path | None = None
) -> AgentConfig:
    for key in data:
        if key not in ("agent", "samplers", "knobs"):
            raise InputError(
                f"unknown table [{key}] (allowed: agent, samplers, knobs)", where=where
            )
    agent = data.get("agent", {})
    if not isinstance(agent, dict):
        raise InputError("[agent] must be a table", where=where)
    for key in agent:
        if key not in _AGENT_KEYS:
            raise InputError(
                f"[agent] unknown key {key!r} (allowed: {', '.join(sorted(_AGENT_KEYS))})",
                where=where,
            )

    def path(key: str, default: str) -> Path:
        v = agent.get(key, default)
        if not isinstance(v, str) or not v or "\0" in v or len(v) > 4096:
            raise InputError(f"[agent] {key} must be a path", where=where)
        p = Path(v)
        return p if p.is_absolute() or base is None else base / p

    uids = agent.get("allowed_uids", [0])
    if not isinstance(uids, list) or not all(
        isinstance(u, int) and not isinstance(u, bool) and 0 <= u < 2**32 - 1 for u in uids
    ):
        raise InputError("[agent] allowed_uids must be a list of uids", where=where)
    tcp = agent.get("tcp_listen", "")
    token = agent.get("token_file")
    if tcp and not token:
        raise InputError(
            "[agent] tcp_listen needs token_file: the TCP API only serves authenticated requests",
            where=where,
        )
    for key in ("tcp_listen", "prometheus_listen"):
        v = agent.get(key, "")
        port = v.rpartition(":")[2] if isinstance(v, str) else ""
        if v and not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
            raise InputError(f"[agent] {key} must be 'host:port', not {v!r}", where=where)
    level = agent.get("log_level", "info")
    if level not in ("debug", "info", "warning", "error"):
        raise InputError("[agent] log_level must be debug, info, warning or error", where=where)
    tables: dict[str, dict[str, dict[str, Any]]] = {}
    for name in ("samplers", "knobs"):
        t = data.get(name, {"perf": {}, "psutil": {}} if name == "samplers" else {})
        if not isinstance(t, dict) or not all(isinstance(v, dict) for v in t.values()):
            raise InputError(f"[{name}.NAME] entries must be tables", where=where)
        tables[name] = {str(k): dict(v) for k, v in t.items()}
    root = agent.get("root", "/")
    if not isinstance(root, str) or not root.startswith("/"):
        raise InputError("[agent] root must be an absolute path", where=where)
    max_lease = _num(where, "max_lease_s", agent.get("max_lease_s", 3600.0), 1.0, 7 * 86400.0)
    rows = agent.get("spool_max_rows", 1_000_000)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 100:
        raise InputError("[agent] spool_max_rows must be an integer >= 100", where=where)
    if rows > 10**9:
        raise InputError("[agent] spool_max_rows must be at most 1000000000", where=where)
    return AgentConfig(
        root=root,
        state_dir=path("state_dir", DEFAULT_STATE_DIR),
        socket=path("socket", DEFAULT_SOCKET),
        allowed_uids=tuple(sorted({0, *uids})),
        sample_interval_s=_num(
            where, "sample_interval_s", agent.get("sample_interval_s", 0.1), 0.01, 60.0
        ),
        default_lease_s=_num(
            where, "default_lease_s", agent.get("default_lease_s", 60.0), 0.1, max_lease
        ),
        max_lease_s=max_lease,
        spool_max_rows=rows,
        tcp_listen=str(tcp),
        token_file=path("token_file", "x") if token else None,
        prometheus_listen=str(agent.get("prometheus_listen", "")),
        log_level=str(level),
        threading_tables=path("threading_tables", "x") if agent.get("threading_tables") else None,
        samplers=tables["samplers"],
        knobs=tables["knobs"],
    )


def load_config(path: str | Path) -> AgentConfig:
    from musku.inputfiles import parse_toml, read_text

    p = Path(path)
    data = parse_toml(read_text(p), str(p))
    cfg = parse_config(data, where=str(p), base=p.parent.resolve())
    return AgentConfig(**{**cfg.__dict__, "path": p.resolve()})
