"""The agent's API: Unix socket permissions and SO_PEERCRED, HMAC-authenticated TCP,
malformed input, Prometheus exposition, the rpc relay."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.agent.client import AgentClient
from musku.agent.protocol import sign
from musku.agent.server import Listeners
from musku.errors import HostError
from tests.agent.helpers import THP, make_agent

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (socket owner, setuid)")


@pytest.fixture
def served() -> Iterator[tuple]:
    # a world-traversable directory so that 'nobody' can reach the socket file
    d = Path(tempfile.mkdtemp(prefix="musku-agent-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    token = d / "token"
    token.write_bytes(b"0123456789abcdef0123456789abcdef")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    port = ports[0]
    agent, host = make_agent(
        d,
        config={
            "tcp_listen": f"127.0.0.1:{port}",
            "token_file": token,
            "prometheus_listen": f"127.0.0.1:{ports[1]}",
        },
    )
    ls = Listeners(agent)
    ls.start()
    try:
        yield agent, host, d, port, token.read_bytes()
    finally:
        ls.stop()
        agent.close()
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def _as_nobody(fn) -> dict:  # type: ignore[no-untyped-def]
    """Run fn() in a forked child as uid nobody; returns what it reported."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = fn()
        except BaseException as exc:  # noqa: BLE001
            out = {"exception": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_socket_is_root_only(served: tuple) -> None:
    agent, _, d, _, _ = served
    st = os.stat(agent.config.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_other_user_cannot_connect(served: tuple) -> None:
    agent, host, _, _, _ = served
    path = str(agent.config.socket)

    def attempt() -> dict:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
        except PermissionError as exc:
            s.close()
            return {"refused": "connect", "errno": exc.errno}
        s.sendall(b'{"op":"apply","config":{"thp":"never"},"lease_s":5}\n')
        return {"reply": s.makefile().readline()}

    out = _as_nobody(attempt)
    assert out == {"refused": "connect", "errno": 13}
    assert "[madvise]" in host.read(THP)


def test_peer_uid_checked_even_if_mode_loosened(served: tuple) -> None:
    agent, host, _, _, _ = served
    os.chmod(agent.config.socket, 0o666)  # an operator's mistake
    path = str(agent.config.socket)

    def attempt() -> dict:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        # the agent answers the connection itself with a refusal and hangs up
        f = s.makefile()
        reply = json.loads(f.readline())
        try:
            s.sendall(b'{"op":"apply","config":{"thp":"never"},"lease_s":5}\n')
            more = f.readline()
        except OSError:
            more = ""
        f.close()
        s.close()
        return {"reply": reply, "more": more}

    out = _as_nobody(attempt)
    assert out["more"] == ""
    assert out["reply"]["ok"] is False
    assert "uid 65534" in out["reply"]["error"]["message"]
    assert "[madvise]" in host.read(THP)
    assert agent.metrics.refused.labels(why="uid")._value.get() == 1


def test_root_client_works_and_malformed_input_keeps_daemon_running(served: tuple) -> None:
    agent, host, _, _, _ = served
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(agent.config.socket))
    f = s.makefile("rwb")
    for bad in (b"{not json\n", b"[1,2]\n", b'{"op": 7}\n'):
        f.write(bad)
        f.flush()
        reply = json.loads(f.readline())
        assert reply["ok"] is False and reply["error"]["status"] == 3
    f.close()
    s.close()
    c = AgentClient(agent.config.socket)
    assert c.call("hello")["protocol"] == 1
    c.call("apply", config={"thp": "never"}, lease_s=30)
    assert "[never]" in host.read(THP)
    text = c.call("metrics")["text"]
    assert 'musku_agent_applies_total{outcome="ok"} 1.0' in text
    assert "musku_agent_lease_remaining_seconds" in text
    c.call("rollback")
    c.close()


def test_tcp_requires_valid_hmac(served: tuple) -> None:
    agent, host, _, port, token = served

    def send(obj: object) -> dict:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(json.dumps(obj).encode() + b"\n")
            with s.makefile() as f:
                return json.loads(f.readline())

    req = {"op": "apply", "config": {"thp": "never"}, "lease_s": 5}
    assert "authentication required" in send(req)["error"]["message"]
    assert (
        "authentication failed" in send(sign(req, b"wrong-token-wrong-token"))["error"]["message"]
    )
    signed = sign(req, token)
    tampered = {**signed, "config": {"thp": "always"}}
    assert "authentication failed" in send(tampered)["error"]["message"]
    old = sign(req, token, ts=time.time() - 300)
    assert "expired" in send(old)["error"]["message"]
    assert "[madvise]" in host.read(THP)
    assert send(signed)["ok"] is True
    assert "[never]" in host.read(THP)
    assert "replayed" in send(signed)["error"]["message"]
    c = AgentClient(tcp=f"127.0.0.1:{port}", token=token)
    c.call("rollback")
    c.close()
    assert "[madvise]" in host.read(THP)


def test_rpc_relay(served: tuple) -> None:
    from musku.agent.cli import rpc_once

    agent, _, _, _, _ = served
    reply, code = rpc_once('{"op": "status"}', agent.config.socket)
    assert code == 0 and reply["ok"] and reply["result"]["experiment"] == ""
    reply, code = rpc_once("{oops", agent.config.socket)
    assert code == 3 and "malformed JSON" in reply["error"]["message"]
    reply, code = rpc_once('{"op": "status"}', Path("/nonexistent/agent.sock"))
    assert code == 6 and "cannot reach" in reply["error"]["message"]


def test_concurrent_clients(served: tuple) -> None:
    agent, _, _, _, _ = served
    errors: list[str] = []

    def worker() -> None:
        c = AgentClient(agent.config.socket)
        try:
            for _ in range(20):
                c.call("status")
        except HostError as exc:
            errors.append(str(exc))
        finally:
            c.close()

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


def test_prometheus_http_endpoint(served: tuple) -> None:
    import urllib.request

    agent, _, _, _, _ = served
    agent.sample_once()
    url = f"http://{agent.config.prometheus_listen}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    assert "musku_agent_sample_seconds_count 1.0" in text


def test_cli_status_and_rollback(served: tuple) -> None:
    from typer.testing import CliRunner

    from musku.agent.cli import app

    agent, host, _, _, _ = served
    c = AgentClient(agent.config.socket)
    c.call("apply", config={"thp": "never"}, lease_s=30)
    c.close()
    runner = CliRunner()
    res = runner.invoke(app, ["status", "--json", "--socket", str(agent.config.socket)])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert st["expected"] == {"thp": "never"} and st["lease_remaining_s"] > 0
    res = runner.invoke(app, ["status", "--socket", str(agent.config.socket)])
    assert "lease:" in res.output and "thp" in res.output
    res = runner.invoke(app, ["rollback", "--socket", str(agent.config.socket)])
    assert res.exit_code == 0 and json.loads(res.output)["rolled_back"] == 1
    assert "[madvise]" in host.read(THP)
    res = runner.invoke(app, ["run", "--config", "/nonexistent/agent.toml"])
    assert res.exit_code == 3 and "no such file" in res.output
