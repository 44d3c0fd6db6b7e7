"""``agent busy`` over the production path: the controller's SshLink runs ``musku agent rpc``
through a real sshd, the relay meets an agent daemon whose one client slot is held, and the
busy reply comes back as AgentBusy (not LinkDown, not a relay failure). The link retries it with
back-off within its rpc timeout: while the slot stays taken that ends in one HostError line;
once the connection holding it goes idle, the agent closes it and the controller is served."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from musku.agent.rpc import relay
from musku.errors import HostError, LinkDown
from musku.hosts.agent import SshLink
from tests.agent.helpers import config, fake_host, spawn_daemon
from tests.fixtures.sshd import needs_sshd
from tests.timing import scaled

pytestmark = [*needs_sshd, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _hold(sock: Path, stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """A connection that takes the agent's only slot and keeps it busy (a request every
    0.2 s, under the idle timeout) until ``stop``; then it idles and is closed by the agent."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(scaled(30))
    s.connect(str(sock))
    s.sendall(b'{"op": "hello"}\n')
    s.recv(65536)

    def ping() -> None:
        while not stop.wait(0.2):
            s.sendall(b'{"op": "hello"}\n')
            s.recv(65536)

    t = threading.Thread(target=ping, daemon=True)
    t.start()
    return s, t


def test_busy_through_ssh_and_the_relay(tmp_path: Path, sshd: dict) -> None:
    host = fake_host(tmp_path / "host")
    cfg = config(tmp_path, max_clients=1, idle_timeout_s=1.0)
    pid = spawn_daemon(cfg, host, timeout=scaled(30))
    stop = threading.Event()
    try:
        held, pinger = _hold(cfg.socket, stop)
        # the relay itself (what sshd runs): the busy reply, relayed as it is
        reply, code = relay('{"op": "status"}', cfg.socket)
        assert code == 0 and reply["error"]["type"] == "AgentBusy", reply

        def link(budget: float) -> SshLink:
            return SshLink(
                "127.0.0.1",
                port=sshd["port"],
                identity_file=str(sshd["dir"] / "client_key"),
                known_hosts=str(sshd["dir"] / "known_hosts"),
                # this checkout's relay, whatever musku the remote python would import
                remote_command=[
                    "env",
                    f"PYTHONPATH={ROOT}",
                    sys.executable,
                    "-m",
                    "musku.agent",
                    "rpc",
                ],  # fmt: skip
                agent_socket=str(cfg.socket),
                timeout=scaled(60),
                rpc_timeout=budget,
            )

        short = link(scaled(4))  # each try is an SSH exec of the relay: ~0.3-1.5 s here
        with pytest.raises(HostError) as exc:
            short.call("status")
        short.close()
        assert not isinstance(exc.value, LinkDown), exc.value
        line = exc.value.one_line()
        assert "agent busy (every connection slot taken) for" in line and "\n" not in line

        stop.set()  # the holder goes idle: the agent closes it after 1 s
        pinger.join(scaled(10))
        patient = link(scaled(30))
        t0 = time.monotonic()
        assert patient.call("status")["experiment"] == ""
        assert time.monotonic() - t0 < scaled(20)
        patient.close()
        held.close()
    finally:
        stop.set()
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
