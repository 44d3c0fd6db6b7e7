"""``musku agent ...``: run the daemon, ask it for its status, relay one request, roll back.

``musku agent rpc`` is what the controller runs over SSH: a fixed command, the request as one
JSON object on stdin (optionally ``"agent_socket": PATH`` to choose the agent), the reply as
one JSON object on stdout. It always prints a reply; an unreachable agent is an error reply.
``musku agent rpc --stream`` serves one request line after another for as long as its stdin
stays open (the controller keeps one such channel per SSH connection).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from musku.errors import HostError, MuskuError
from musku.strict_json import finite

app = typer.Typer(help="The musku agent: runs on every host under test.", no_args_is_help=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="agent configuration (default /etc/musku/agent.toml)"),
]
SocketOpt = Annotated[
    Path | None, typer.Option("--socket", help="agent socket (default: from the config)")
]


def _fail(exc: MuskuError) -> typer.Exit:
    typer.echo(f"musku: error: {exc.one_line()}", err=True)
    return typer.Exit(int(exc.status))


@app.command()
def run(config: ConfigOpt = None) -> None:
    """Run the agent daemon (foreground; systemd unit in agents/musku-agent.service)."""
    # lazy: the daemon loads the knobs, samplers and co-tuner; `musku --help` loads this module
    from musku.agent.config import DEFAULT_CONFIG, load_config
    from musku.agent.daemon import run as run_daemon

    try:
        cfg = load_config(config or DEFAULT_CONFIG)
        raise typer.Exit(run_daemon(cfg))
    except MuskuError as exc:
        raise _fail(exc) from None


@app.command()
def status(
    config: ConfigOpt = None,
    socket: SocketOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show the agent's state: experiment, lease, deployed soft SKU, spool."""
    try:
        # lazy (also below): the agent's wire protocol stays out of `musku --help`
        from musku.agent.client import AgentClient
        from musku.agent.rpc import default_socket

        client = AgentClient(default_socket(config, socket))
        st = client.call("status")
        client.close()
    except MuskuError as exc:
        raise _fail(exc) from None
    if as_json:  # strict JSON: NaN/inf -> null
        typer.echo(json.dumps(finite(st), indent=2, sort_keys=True, allow_nan=False))
        return
    lease = st.get("lease_remaining_s")
    typer.echo(f"experiment:  {st['experiment'] or '-'}")
    typer.echo(f"lease:       {'-' if lease is None else f'{lease:.1f}s left'}")
    owner = st.get("owner")
    if owner:
        typer.echo(
            f"owner:       experiment {owner['experiment']}, "
            f"controller {owner['controller'] or 'anonymous'}"
        )
    typer.echo(f"expected:    {st['expected'] or '-'}")
    typer.echo(f"deployed:    {st['deployed'] or '-'}")
    typer.echo(f"spool:       {st['spool_rows']} rows ({st['spool_dropped']} dropped)")
    typer.echo(f"samplers:    {st['samplers']}")
    for line in st.get("recovered", []):
        typer.echo(f"recovered:   {line}")
    reboot = st.get("reboot") or {}
    if reboot:  # the last reboot-mode apply (docs/agent.md "Reboots")
        what = reboot.get("message") or f"expect cmdline {reboot.get('expect', '')!r}"
        typer.echo(f"reboot:      {reboot.get('state', '?')}: {what}")
    for line in st.get("degraded", []):
        typer.echo(f"DEGRADED:    {line}")


def rpc_once(text: str, default_socket: Path) -> tuple[dict[str, Any], int]:
    """Relay one request; (reply, exit status)."""
    from musku.agent.rpc import relay  # lazy: see status()

    return relay(text, default_socket)


@app.command()
def rpc(
    config: ConfigOpt = None,
    socket: SocketOpt = None,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="serve newline-delimited JSON requests until end of input, one reply line each",
        ),
    ] = False,
) -> None:
    """Read one JSON request on stdin, send it to the local agent, print the JSON reply
    (--stream: one request per line until end of input)."""
    argv: list[str] = []
    if config is not None:
        argv += ["--config", str(config)]
    if socket is not None:
        argv += ["--socket", str(socket)]
    if stream:
        argv.append("--stream")
    from musku.agent.rpc import main as rpc_main  # lazy: see status()

    raise typer.Exit(rpc_main(argv))


@app.command()
def rollback(
    config: ConfigOpt = None,
    socket: SocketOpt = None,
    undeploy: Annotated[
        bool,
        typer.Option(
            "--undeploy", help="also remove the deployed soft SKU (back to pre-musku state)"
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="operator override: roll back even an experiment another controller holds",
        ),
    ] = False,
) -> None:
    """Roll back the running experiment (and with --undeploy the deployed soft SKU).

    Works with the daemon running (through its socket) or stopped (directly on its journal).
    While a controller's lease is live the agent refuses (exit 6, naming the owner) unless
    --force is given; with the daemon stopped nothing holds the lease and it always proceeds."""
    try:
        from musku.agent.client import AgentClient  # lazy: see status()
        from musku.agent.rpc import default_socket

        sock = default_socket(config, socket)
        try:
            client = AgentClient(sock, timeout=300)
            fields: dict[str, Any] = {"override": True} if force else {}
            result = client.call("rollback", undeploy=undeploy, **fields)
            client.close()
        except HostError as exc:
            if "cannot reach" not in exc.message:
                raise
            result = _offline_rollback(config, undeploy)
    except MuskuError as exc:
        raise _fail(exc) from None
    typer.echo(json.dumps(result, sort_keys=True))


def _offline_rollback(config: Path | None, undeploy: bool) -> dict[str, Any]:
    """The daemon is not running: recover its journal here (holding its lock)."""
    # lazy: see run()
    import dataclasses

    from musku.agent.config import DEFAULT_CONFIG, load_config
    from musku.agent.core import Agent
    from musku.agent.daemon import _lock

    # a rollback from the command line never reboots the host (reboot_after_rollback)
    cfg = dataclasses.replace(load_config(config or DEFAULT_CONFIG), reboot_after_rollback=False)
    locks = _lock(cfg)
    agent = Agent(cfg)
    try:
        recovered = agent.recover()
        # the daemon is stopped: no controller can be using the lease (docs/agent.md)
        result = agent.op_rollback({"undeploy": undeploy, "override": True})
        result["recovered"] = recovered
        return result
    finally:
        agent.close(rollback_experiment=True)
        locks.release()


def main() -> None:
    app(prog_name="musku agent")
