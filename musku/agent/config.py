"""The agent's configuration file (TOML; example in ``agents/agent.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.errors import InputError
from musku.inputfiles import MAX_PATH_CHARS, parse_toml, read_text

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
    # reboot-mode knobs (musku/agent/reboot.py): the argv that reboots this host, how long it
    # may run, and whether a boot that failed verification is rolled back with another reboot
    reboot_hook: tuple[str, ...] = ()
    reboot_hook_timeout_s: float = 120.0
    reboot_delay_s: float = 1.0
    reboot_after_rollback: bool = False
    # the API server (musku/agent/server.py ServerLimits): client slots, idle and line deadlines
    max_clients: int = 64
    idle_timeout_s: float = 15.0
    line_deadline_s: float = 10.0

    @property
    def table_dir(self) -> Path:
        return self.threading_tables or self.state_dir / "threading-tables"


def parse_config(
    data: dict[str, Any], *, where: str = "agent config", base: Path | None = None
) -> AgentConfig:
    """A parsed configuration document, validated by
    :class:`~musku.schema.agentconfig.AgentConfigFile`; relative paths are taken from
    ``base``."""
    return _config(data, where, None, base)


def load_config(path: str | Path) -> AgentConfig:
    p = Path(path)
    text = read_text(p)
    cfg = _config(parse_toml(text, str(p)), str(p), text, p.parent.resolve())
    return AgentConfig(**{**cfg.__dict__, "path": p.resolve()})


def socket_of(path: str | Path) -> Path:
    """The agent socket a configuration file names, without validating the rest of it:
    ``musku agent rpc`` (one process per SSH request) needs only this and must start fast;
    the daemon validates the whole file when it starts."""
    p = Path(path)
    data = parse_toml(read_text(p), str(p))
    agent = data.get("agent", {})
    sock = agent.get("socket", DEFAULT_SOCKET) if isinstance(agent, dict) else DEFAULT_SOCKET
    if not isinstance(sock, str) or not sock or "\0" in sock or len(sock) > MAX_PATH_CHARS:
        raise InputError("[agent] socket must be a path", where=str(p))
    s = Path(sock)
    return s if s.is_absolute() else p.parent.resolve() / s


def _config(data: dict[str, Any], where: str, text: str | None, base: Path | None) -> AgentConfig:
    # The schema (pydantic) is imported here, not at module level: `musku agent rpc` imports
    # this module for DEFAULT_SOCKET / socket_of on every SSH request, and importing pydantic
    # would triple its start-up time.
    from musku.schema.agentconfig import AgentConfigFile
    from musku.schema.document import Document

    doc = Document.of(data, where) if text is None else Document(Path(where), text, data)
    f = doc.validate(AgentConfigFile)
    agent = f.agent

    def path(v: str) -> Path:
        p = Path(v)
        return p if p.is_absolute() or base is None else base / p

    return AgentConfig(
        root=agent.root,
        state_dir=path(agent.state_dir),
        socket=path(agent.socket),
        allowed_uids=tuple(sorted({0, *agent.allowed_uids})),
        sample_interval_s=agent.sample_interval_s,
        default_lease_s=agent.default_lease_s,
        max_lease_s=agent.max_lease_s,
        spool_max_rows=agent.spool_max_rows,
        tcp_listen=agent.tcp_listen,
        token_file=path(agent.token_file) if agent.token_file else None,
        prometheus_listen=agent.prometheus_listen,
        log_level=agent.log_level,
        threading_tables=path(agent.threading_tables) if agent.threading_tables else None,
        reboot_hook=tuple(agent.reboot_hook),
        reboot_hook_timeout_s=agent.reboot_hook_timeout_s,
        reboot_delay_s=agent.reboot_delay_s,
        reboot_after_rollback=agent.reboot_after_rollback,
        max_clients=agent.max_clients,
        idle_timeout_s=agent.idle_timeout_s,
        line_deadline_s=agent.line_deadline_s,
        samplers={str(k): dict(v) for k, v in f.samplers.items()},
        knobs={str(k): dict(v) for k, v in f.knobs.items()},
    )
