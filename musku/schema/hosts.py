"""Each built-in host backend's ``[hosts]`` options, declared as a model.

Each backend names its model as ``Backend.options`` (:mod:`musku.hosts.backend`); ``musku
check`` validates an experiment's ``[hosts]`` table against it without opening a connection,
so it refuses what ``musku sweep`` would; ``musku schema hosts-<backend>`` prints the model as
a JSON Schema. The backends' factories read the same options when they open the hosts. The
built-in models live here, below the experiment module that checks them; an out-of-tree
backend declares its own :class:`HostOptions` subclass beside its code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BeforeValidator, Field, model_validator

from musku.inputfiles import MAX_PATH_CHARS
from musku.schema.document import Check, Document, Refusal, Strict, bounds


def _number(lo: float, hi: float, *, open_ends: bool = False) -> Check:
    """A finite number in [lo, hi] (or (lo, hi)), refused in the backends' words."""

    def check(value: Any) -> Any:
        ok = not isinstance(value, bool) and isinstance(value, int | float) and lo <= value <= hi
        if ok and open_ends:
            ok = lo < value < hi
        if not ok:  # NaN fails both comparisons
            span = f"({lo:g}, {hi:g})" if open_ends else f"[{lo:g}, {hi:g}]"
            raise Refusal(f"{{at}} must be a number in {span}")
        return value

    if open_ends:
        return Check(check, exclusiveMinimum=lo, exclusiveMaximum=hi)
    return Check(check, minimum=lo, maximum=hi)


def _file_name(value: Any) -> Any:
    if not isinstance(value, str) or not value or len(value) > MAX_PATH_CHARS or "\0" in value:
        raise Refusal(f"{{at}} must be a file name of 1..{MAX_PATH_CHARS} characters")
    return value


FileName = Annotated[
    str, BeforeValidator(_file_name), bounds(minLength=1, maxLength=MAX_PATH_CHARS)
]
"""A file name given in ``[hosts]`` (relative to the experiment file, or ``~``-expanded)."""


class HostOptions(Strict):
    """Options every backend's ``[hosts]`` table shares: the backend's name."""

    # an unknown option: {key}, {backend}, {allowed} (sorted) or {declared} (in order);
    # "": the common wording
    UNKNOWN: ClassVar[str] = ""
    BACKEND: ClassVar[str] = ""

    backend: str

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise Refusal("{table} must be a table", here=True)
        allowed = [k for k in cls.key_names() if k != "backend"]
        if "fleet" in data and "fleet" not in allowed:
            raise Refusal(
                f"[hosts] fleet: the {cls.BACKEND or 'given'} backend cannot have a fleet "
                '(fleet = N is for backend = "sim"; agents list their hosts in hosts = [...])',
                key="fleet",
            )
        for key in data:
            if key not in allowed and key != "backend":
                declared = ", ".join(k for k in cls.model_fields if k != "backend")
                message = cls.UNKNOWN or (
                    "[hosts] unknown option '{key}' for the {backend} backend "
                    "(allowed: backend, {allowed})"
                )
                raise Refusal(
                    message.format(
                        key=key, backend=cls.BACKEND, allowed=", ".join(allowed), declared=declared
                    ),
                    key=str(key),
                )
        cls.shape(data)
        return data


def _model_named(data: Any, refusal: str) -> Any:
    """A simulator backend's options name their model file (``model = "..."``): else refused
    with the backend's own one-line message, at the ``[hosts]`` table."""
    if isinstance(data, dict) and not isinstance(data.get("model"), str):
        raise Refusal(refusal, line_key="hosts")
    return data


MAX_FLEET = 100_000


def _fleet_size(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refusal("[hosts] fleet must be a whole number of hosts (>= 2)")
    if value < 2:
        raise Refusal(
            f"[hosts] fleet = {value}: a pool needs at least 2 hosts (one pair) to compare on"
        )
    if value > MAX_FLEET:
        raise Refusal(f"[hosts] fleet = {value}: at most {MAX_FLEET:,} simulated hosts")
    return value


class SimOptions(HostOptions):
    """``backend = "sim"``: simulated hosts (docs/sim.md)."""

    BACKEND: ClassVar[str] = "sim"
    backend: Literal["sim"] = "sim"
    model: FileName = Field(description="the simulator model file, relative to the experiment")
    host_bias: Annotated[float, _number(-0.5, 0.5, open_ends=True)] | None = Field(
        None, description="override the model's host bias (relative; hosts[1] faster)"
    )
    noise_scale: Annotated[float, _number(0.0, 100.0)] = 1.0
    fleet: Annotated[int, BeforeValidator(_fleet_size), bounds(minimum=2)] | None = Field(
        None, description="a pool of N simulated hosts, paired (docs/fleet.md); default: one pair"
    )
    bias_sd: Annotated[float, _number(0.0, 0.1)] | None = Field(
        None, description="a fleet's per-host bias spread (default: the model's |host_bias|)"
    )

    @model_validator(mode="before")
    @classmethod
    def _needs_model(cls, data: Any) -> Any:
        return _model_named(data, "[hosts] backend 'sim' needs model = \"path/to/model.toml\"")

    @model_validator(mode="after")
    def _fleet_bias(self) -> SimOptions:
        if self.fleet is not None and self.host_bias is not None:
            raise Refusal(
                "[hosts] host_bias is one pair's bias: a fleet draws each host's bias "
                "(give bias_sd instead)",
                key="host_bias",
            )
        if self.bias_sd is not None and self.bias_sd >= 0.1:
            raise Refusal("[hosts] bias_sd must be in [0, 0.1)", key="bias_sd")
        return self


class AgentHostEntry(Strict):
    """One host of the agent backend, as a table."""

    name: str = ""
    host: str = ""
    port: Annotated[int, bounds(minimum=1, maximum=65535)] | None = Field(
        default=None, description="default: ssh_port"
    )
    user: str = Field(default="", description="default: ssh_user")
    socket: str = ""
    midtier_admin: str = ""
    midtier_admin_port_file: str = ""


_HOST_CHARS = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")
_IPV6 = re.compile(r"[0-9a-f:.]+(?:%[a-z0-9_.-]+)?")


def split_host(text: str, what: str = "[hosts]") -> tuple[str, int | None]:
    """A host as written -> ``(canonical name, port or None)``: surrounding whitespace
    dropped, lower case (DNS names are case-insensitive), one trailing dot (the root)
    dropped; ``name:port`` and ``[v6-address]:port`` split with the port checked
    (1..65535), a bare IPv6 address kept whole. So ``web-1``, ``WEB-1``, ``web-1.``,
    `` web-1`` and ``web-1:22`` are one host. Anything else (empty, inner whitespace,
    control characters, a port that is not a number) is one line (:class:`Refusal`)."""
    if not isinstance(text, str):
        raise Refusal(f"{what} a host must be a string, not {type(text).__name__}")
    raw = text.strip().lower()
    shown = text if len(text) <= 80 else text[:80] + "..."
    port: int | None = None
    if raw.startswith("["):  # [v6]:port or [v6]
        end = raw.find("]")
        host, rest = raw[1:end], raw[end + 1 :] if end > 0 else ""
        if end < 0 or _IPV6.fullmatch(host) is None or (rest and not rest.startswith(":")):
            raise Refusal(f"{what} host {shown!r}: not an address ([v6-address]:port)")
        if rest:
            port = _port(rest[1:], shown, what)
        return host, port
    if raw.count(":") == 1:
        raw, _, tail = raw.partition(":")
        port = _port(tail, shown, what)
    elif raw.count(":") > 1:  # a bare IPv6 address: no port (write [addr]:port)
        if _IPV6.fullmatch(raw) is None:
            raise Refusal(f"{what} host {shown!r}: not an IPv6 address")
        return raw, None
    if raw.endswith("."):
        raw = raw[:-1]
    if len(raw) > 255:  # hosts.name is a VARCHAR(255)
        raise Refusal(f"{what} a host name is longer than 255 characters")
    if _HOST_CHARS.fullmatch(raw) is None or ".." in raw:
        raise Refusal(
            f"{what} host {shown!r} is not a host name (letters, digits, '-', '_', '.'; "
            "an optional :port)"
        )
    return raw, port


def _port(text: str, shown: str, what: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise Refusal(f"{what} host {shown!r}: the port must be a number in 1..65535")
    return int(text)


def _agent_host(value: Any) -> Any:
    """A host is a name or a table; refused with the agent backend's messages. A name is
    normalised (:func:`split_host`); ``name:port`` becomes the table ``{name, host, port}``."""
    if isinstance(value, str):
        if not value.strip():
            raise Refusal("[hosts] a host name must not be empty")
        name, port = split_host(value)
        return name if port is None else {"name": name, "host": name, "port": port}
    if not isinstance(value, dict):
        raise Refusal("[hosts] each host is a name or a table {name, host, socket, ...}")
    extra = set(value) - set(AgentHostEntry.key_names())
    if extra:
        raise Refusal(f"[hosts] unknown host key(s): {', '.join(sorted(extra))}")
    host, sock = value.get("host", ""), value.get("socket", "")
    if not host and not sock:
        raise Refusal('[hosts] each host needs host = "address" or socket = "path"')
    name = value.get("name") or host or sock
    port = value.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise Refusal(f"[hosts] {name}: port must be an integer in 1..65535")
    given = [k for k in ("midtier_admin", "midtier_admin_port_file") if k in value]
    for key in given:
        if not isinstance(value[key], str) or not value[key]:
            raise Refusal(f"[hosts] {name}: {key} must be a non-empty string")
    if len(given) > 1:
        raise Refusal(f"[hosts] {name}: give midtier_admin or midtier_admin_port_file, not both")
    for key in ("name", "host", "user", "socket"):
        if not isinstance(value.get(key, ""), str):
            raise Refusal(f"[hosts] {name}: {key} must be a string")
    if host:
        canon, in_host = split_host(host)
        if in_host is not None and "port" in value and value["port"] != in_host:
            raise Refusal(f"[hosts] {name}: host {host!r} and port = {value['port']} disagree")
        value = {**value, "host": canon}
        if in_host is not None:
            value["port"] = in_host
    if "name" in value:
        value = {**value, "name": value["name"].strip()}
    return value


def _two_hosts(value: Any) -> Any:
    """At least two hosts: two are one pair, more a pool of pairs (docs/fleet.md)."""
    if not isinstance(value, list) or len(value) < 2:
        raise Refusal(
            "[hosts] the agent backend needs hosts = [at least two hosts] (a pool needs a pair)",
            line_key="hosts",
        )
    return value


def host_name(entry: str | AgentHostEntry) -> str:
    """The name a host of the agent backend goes by (its table's name, host or socket)."""
    if isinstance(entry, str):
        return entry
    return entry.name or entry.host or entry.socket


class AgentOptions(HostOptions):
    """``backend = "agent"``: real hosts running ``musku agent`` (docs/agent.md): two are one
    pair, more are a pool of pairs (docs/fleet.md)."""

    BACKEND: ClassVar[str] = "agent"
    backend: Literal["agent"] = "agent"
    hosts: Annotated[
        list[Annotated[str | AgentHostEntry, BeforeValidator(_agent_host)]],
        BeforeValidator(_two_hosts),
        bounds(minItems=2, description="two or more host names or host tables (a pool)"),
    ]
    ssh_user: str = "root"
    ssh_port: Annotated[int, bounds(minimum=1, maximum=65535)] = 22
    remote_command: Annotated[list[Annotated[str, bounds(minLength=1)]], bounds(minItems=1)] = [
        "musku",
        "agent",
        "rpc",
    ]
    identity_file: FileName | None = None
    known_hosts: FileName | None = None
    connect_timeout_s: Annotated[float, _number(0.1, 600.0)] = 10.0
    lease_s: Annotated[float, _number(1.0, 3600.0)] = 30.0
    reboot_timeout_s: Annotated[float, _number(1.0, 86400.0)] = Field(
        default=900.0, description="reboot-mode knobs: how long a host may take to come back"
    )
    rpc_timeout_s: Annotated[float, _number(0.1, 3600.0)] = Field(
        default=30.0,
        description="how long a request other than apply/deploy/rollback may go unanswered "
        "before the link counts as lost",
    )
    take_over: bool = Field(
        default=False,
        description="the operator's override: take the agents over even if another experiment "
        "or controller holds their lease (its experiment is rolled back); "
        "`musku sweep --take-over-agents` sets it",
    )
    reconnect_timeout_s: Annotated[float, _number(0.0, 86400.0)] = Field(
        default=600.0,
        description="a lost link: how long a comparison waits for it to come back (the "
        "comparison is interrupted and starts again), after which the pair counts as failed",
    )

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        _two_hosts(data.get("hosts"))
        user, port = data.get("ssh_user", "root"), data.get("ssh_port", 22)
        if not isinstance(user, str) or isinstance(port, bool) or not isinstance(port, int):
            raise Refusal(
                "[hosts] ssh_user must be a string and ssh_port an integer",
                key="ssh_user" if not isinstance(user, str) else "ssh_port",
            )
        if not 0 < port < 65536:
            raise Refusal("[hosts] ssh_port must be an integer in 1..65535", key="ssh_port")
        cmd = data.get("remote_command", ["musku"])
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) and c for c in cmd):
            raise Refusal("[hosts] remote_command must be a list of strings", key="remote_command")

    @model_validator(mode="after")
    def _names(self) -> AgentOptions:
        """No host twice: names compared without case or a trailing dot, and endpoints
        (address and port, with the agent's socket there if one is named, or a local socket
        path) compared too, so a host is never paired with itself under two spellings. Two
        agents behind one sshd on distinct sockets are two endpoints (one machine running a
        daemon per fake host root, as the tests and a staging box do)."""
        names = [host_name(h) for h in self.hosts]
        seen: dict[Any, str] = {}
        for h, n in zip(self.hosts, names, strict=True):
            keys: list[Any] = [("name", n.strip().lower().rstrip("."))]
            if isinstance(h, str):
                keys.append(("ssh", h, self.ssh_port, ""))
            elif h.host:
                port = self.ssh_port if h.port is None else h.port
                sock = os.path.normpath(h.socket) if h.socket else ""
                keys.append(("ssh", h.host, port, sock))
            else:
                keys.append(("socket", os.path.normpath(h.socket)))
            for key in keys:
                if key in seen:
                    also = f" (as {seen[key]!r})" if seen[key] != n else ""
                    raise Refusal(f"[hosts] host {n!r} is listed twice{also}", line_key="hosts")
                seen[key] = n
        if any(len(n) > 255 for n in names):  # hosts.name is a VARCHAR(255)
            raise Refusal("[hosts] a host name is longer than 255 characters", line_key="hosts")
        return self


def _workload(value: Any) -> Any:
    if value not in ("builtin", "none"):
        raise Refusal("[hosts] workload must be 'builtin' or 'none' (a service already running)")
    return value


def _flag(value: Any) -> Any:
    if not isinstance(value, bool):
        raise Refusal("{at} must be true or false")
    return value


class LocalOptions(HostOptions):
    """``backend = "local"``: one real host, A and B alternated in windows (switchback)."""

    BACKEND: ClassVar[str] = "local"
    backend: Literal["local"] = "local"
    settle_s: Annotated[float, _number(0.0, 600.0)] = 1.0
    lease_s: Annotated[float, _number(1.0, 3600.0)] = 30.0
    socket: FileName | None = None
    state_dir: FileName | None = None
    workload: Annotated[Literal["builtin", "none"], BeforeValidator(_workload)] = "builtin"
    stats_file: FileName | None = None
    arena_mib: Annotated[float, _number(8, 1 << 20)] = 256
    madvise: Annotated[bool, BeforeValidator(_flag)] = False
    agent_sample_interval_s: Annotated[float, _number(0.01, 10.0)] = 0.1
    lock_wait_s: Annotated[float, _number(0.0, 3600.0)] = 20.0

    @model_validator(mode="after")
    def _stats(self) -> LocalOptions:
        if self.workload == "none" and not self.stats_file:
            raise Refusal(
                "[hosts] workload = 'none' needs the service's stats_file", key="workload"
            )
        return self


def _at_least_zero(value: Any) -> Any:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value < 1e300
    if not ok:
        raise Refusal(f"{{at}} must be a number >= 0, not {value!r}")
    return value


NonNegative = Annotated[float, BeforeValidator(_at_least_zero), bounds(minimum=0)]


class QsimOptions(HostOptions):
    """``backend = "qsim"``: a pair of hosts simulated by the queueing simulator (docs/qsim.md)."""

    BACKEND: ClassVar[str] = "qsim"
    UNKNOWN: ClassVar[str] = "[hosts] unknown qsim option(s) {key} (allowed: {declared})"
    backend: Literal["qsim"] = "qsim"
    model: FileName = Field(description="the qsim model file, relative to the experiment")
    qps: NonNegative | None = None
    sim_seconds: NonNegative = 1.0
    noise: NonNegative = 0.02
    host_bias: NonNegative = 0.0
    qos_ms: NonNegative = 1.0
    uncore_scale: NonNegative = 0.1

    @model_validator(mode="before")
    @classmethod
    def _needs_model(cls, data: Any) -> Any:
        return _model_named(data, '[hosts] backend "qsim" needs model = "path/to/model.toml"')


OptionsT = TypeVar("OptionsT", bound=HostOptions)


def parse_options(
    model: type[OptionsT], options: Mapping[str, Any], where: str | None = None
) -> OptionsT:
    """A backend's ``[hosts]`` options (without ``backend``) as its model; refused in the
    same words ``musku check`` uses, naming ``where`` (the experiment file) if given."""
    return Document.of({}, where).validate(
        model, {**options, "backend": model.BACKEND}, prefix=("hosts",)
    )
