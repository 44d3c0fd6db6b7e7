"""The agent's configuration file (``/etc/musku/agent.toml``, docs/agent.md), declared as a model.

:func:`musku.agent.config.parse_config` validates a document with :class:`AgentConfigFile` and
builds the :class:`~musku.agent.config.AgentConfig` the daemon runs with; a check that needs
two keys (``default_lease_s`` within ``max_lease_s``, ``tcp_listen`` with a ``token_file``)
is a model validator here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from musku.inputfiles import MAX_PATH_CHARS
from musku.schema.document import Check, Refusal, Strict

LOG_LEVELS = ("debug", "info", "warning", "error")


def _between(lo: float, hi: float) -> Check:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refusal(f"{{at}} must be a number, not {value!r}")
        if not lo <= float(value) <= hi:  # NaN fails too
            raise Refusal(f"{{at}} must be between {lo:g} and {hi:g}")
        return float(value)

    return Check(check, minimum=lo, maximum=hi)


def _path(value: Any) -> Any:
    if not isinstance(value, str) or not value or "\0" in value or len(value) > MAX_PATH_CHARS:
        raise Refusal("{at} must be a path")
    return value


def _uids(value: Any) -> Any:
    ok = isinstance(value, list) and all(
        isinstance(u, int) and not isinstance(u, bool) and 0 <= u < 2**32 - 1 for u in value
    )
    if not ok:
        raise Refusal("{at} must be a list of uids")
    return value


def _listen(value: Any) -> Any:
    port = value.rpartition(":")[2] if isinstance(value, str) else ""
    if value and not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
        raise Refusal(f"{{at}} must be 'host:port', not {value!r}")
    return value


def _check(ok: Callable[[Any], bool], message: str) -> Check:
    def check(value: Any) -> Any:
        if not ok(value):
            raise Refusal(message)
        return value

    return Check(check)


def _argv(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(a, str) and a and "\0" not in a and len(a) <= MAX_PATH_CHARS for a in value
    )


Path_ = Annotated[str, Check(_path, minLength=1, maxLength=MAX_PATH_CHARS)]
OptionalPath = Annotated[str, Check(lambda v: v if v == "" else _path(v), maxLength=MAX_PATH_CHARS)]
"""A path that may be left empty (``""``: not given)."""
Listen = Annotated[str, Check(_listen, pattern=r"^(.*:[0-9]{1,5})?$")]


class AgentTable(Strict):
    """``[agent]``: the daemon's own settings."""

    UNKNOWN: ClassVar[str] = "{table} unknown key '{key}' (allowed: {allowed})"

    root: Annotated[
        str,
        _check(lambda v: isinstance(v, str) and v.startswith("/"), "{at} must be an absolute path"),
    ] = "/"
    state_dir: Path_ = "/var/lib/musku-agent"
    socket: Path_ = "/run/musku/agent.sock"
    allowed_uids: Annotated[list[int], Check(_uids)] = [0]
    sample_interval_s: Annotated[float, _between(0.01, 60.0)] = 0.1
    default_lease_s: Annotated[float, _between(0.1, 7 * 86400.0)] = 60.0
    max_lease_s: Annotated[float, _between(1.0, 7 * 86400.0)] = 3600.0
    spool_max_rows: Annotated[
        int,
        _check(
            lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= 100,
            "{at} must be an integer >= 100",
        ),
        Check(lambda v: v, minimum=100, maximum=10**9),
        _check(lambda v: not isinstance(v, int) or v <= 10**9, "{at} must be at most 1000000000"),
    ] = 1_000_000
    tcp_listen: Listen = Field(
        default="", description="host:port: only with token_file (HMAC-authenticated requests)"
    )
    token_file: OptionalPath | None = None
    prometheus_listen: Listen = Field(default="", description="host:port of /metrics, optional")
    log_level: Annotated[
        str,
        _check(lambda v: v in LOG_LEVELS, "{at} must be debug, info, warning or error"),
        Check(lambda v: v, enum=list(LOG_LEVELS)),
    ] = "info"
    threading_tables: OptionalPath | None = None
    reboot_hook: Annotated[
        list[str],
        _check(_argv, '{at} must be a command as a list of strings, e.g. ["systemctl", "reboot"]'),
    ] = Field(default_factory=list, description="argv run to reboot for reboot-mode knobs")
    reboot_hook_timeout_s: Annotated[float, _between(1.0, 3600.0)] = 120.0
    reboot_delay_s: Annotated[float, _between(0.0, 600.0)] = 1.0
    reboot_after_rollback: Annotated[
        bool, _check(lambda v: isinstance(v, bool), "{at} must be true or false")
    ] = False
    # the API server's client slots and deadlines (docs/agent.md "Server limits")
    max_clients: Annotated[
        int,
        _check(
            lambda v: not isinstance(v, bool) and isinstance(v, int) and 1 <= v <= 4096,
            "{at} must be an integer between 1 and 4096",
        ),
        Check(lambda v: v, minimum=1, maximum=4096),
    ] = 64
    idle_timeout_s: Annotated[float, _between(1.0, 3600.0)] = 15.0
    line_deadline_s: Annotated[float, _between(1.0, 600.0)] = 10.0

    @model_validator(mode="after")
    def _together(self) -> AgentTable:
        if self.tcp_listen and not self.token_file:
            raise Refusal(
                "[agent] tcp_listen needs token_file: the TCP API only serves authenticated "
                "requests",
                key="tcp_listen",
            )
        if self.default_lease_s > self.max_lease_s:
            raise Refusal(
                f"[agent] default_lease_s must be between 0.1 and {self.max_lease_s:g}",
                key="default_lease_s",
            )
        return self


def _tables(name: str) -> Check:
    def check(value: Any) -> Any:
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise Refusal(f"[{name}.NAME] entries must be tables")
        return value

    return Check(check)


def _default_samplers() -> dict[str, dict[str, Any]]:
    return {"perf": {}, "psutil": {}}


class AgentConfigFile(Strict):
    """The agent's configuration file."""

    UNKNOWN: ClassVar[str] = "unknown table [{key}] (allowed: agent, samplers, knobs)"

    agent: AgentTable = AgentTable()
    samplers: Annotated[dict[str, dict[str, Any]], _tables("samplers")] = Field(
        default_factory=_default_samplers,
        description="sampler name -> its options",
    )
    knobs: Annotated[dict[str, dict[str, Any]], _tables("knobs")] = Field(
        default_factory=dict, description="knob name -> its options"
    )
