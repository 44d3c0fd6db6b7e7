"""The SSH transport's long-lived channel (``musku agent rpc --stream``) over a REAL sshd on
loopback, to a real agent daemon on a fake host tree: many requests over one channel (the host
starts ONE relay process, counted by a wrapper that logs each start), a relay killed between
and during requests (replaced, the requests answered), a relay that never answers (LinkDown
within the deadline), hostile relays (one HostError line, no traceback), an older relay
without ``--stream`` (one exec per request from then on), and the stream relay's own checks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.agent.protocol import MAX_LINE
from musku.agent.rpc import BANNER, StreamRelay
from musku.errors import HostError, LinkDown
from musku.hosts.agent import SshLink
from tests.agent.helpers import config, fake_host, spawn_daemon
from tests.fixtures.sshd import needs_sshd, run_sshd
from tests.timing import scaled

pytestmark = needs_sshd
ROOT = Path(__file__).resolve().parents[2]
RELAY = [sys.executable, "-m", "musku.agent", "rpc"]
SAY_BANNER = f"echo '{json.dumps(BANNER)}'"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real agent daemon on a fake host tree; its socket."""
    tmp = tmp_path_factory.mktemp("agent")
    cfg = config(tmp, sample_interval_s=0.2)
    pid = spawn_daemon(cfg, fake_host(tmp / "host"), timeout=scaled(30))
    try:
        yield cfg.socket
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def _wrapper(tmp: Path, body: str) -> list[str]:
    """A remote command: a shell script that logs its pid and arguments, then runs ``body``
    (``"$@"``: the arguments the link added, e.g. ``--stream``)."""
    script = tmp / f"relay-{time.monotonic_ns()}.sh"
    script.write_text(f'#!/bin/sh\necho "$$ $*" >> {tmp / "starts.log"}\n{body}\n')
    script.chmod(0o755)
    return [str(script)]


def _real_relay(tmp: Path) -> list[str]:
    return _wrapper(tmp, f'PYTHONPATH={ROOT} exec {" ".join(RELAY)} "$@"')


def _starts(tmp: Path) -> list[str]:
    log = tmp / "starts.log"
    return log.read_text().splitlines() if log.exists() else []


def _link(sshd: dict, command: list[str], sock: Path | None, **kw: object) -> SshLink:
    opts: dict = {"timeout": scaled(60), "rpc_timeout": scaled(30), **kw}
    return SshLink(
        "127.0.0.1",
        port=sshd["port"],
        identity_file=str(sshd["dir"] / "client_key"),
        known_hosts=str(sshd["dir"] / "known_hosts"),
        remote_command=command,
        agent_socket=str(sock) if sock else None,
        **opts,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("n", [60])
def test_many_requests_one_relay(tmp_path: Path, sshd: dict, agent: Path, n: int) -> None:
    link = _link(sshd, _real_relay(tmp_path), agent)
    try:
        for i in range(n):
            st = link.call("status" if i % 2 else "hello")
            assert isinstance(st, dict) and ("experiment" in st or "time" in st), st
        starts = _starts(tmp_path)
        assert len(starts) == 1 and starts[0].endswith(" --stream"), starts
        assert link.channels == 1
        pid = int(starts[0].split()[0])
        assert _alive(pid)  # the relay lives on between requests ...
    finally:
        link.close()
    deadline = time.monotonic() + scaled(10)
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # ... and ends with the link (end of its input)


@pytest.mark.slow
def test_one_shot_mode_is_one_process_per_request(tmp_path: Path, sshd: dict, agent: Path) -> None:
    link = _link(sshd, _real_relay(tmp_path), agent, stream=False)
    try:
        for _ in range(3):
            assert "experiment" in link.call("status")
    finally:
        link.close()
    starts = _starts(tmp_path)
    assert len(starts) == 3 and not any("--stream" in s for s in starts), starts


@pytest.mark.slow
def test_relay_killed_between_and_during_requests(tmp_path: Path, sshd: dict, agent: Path) -> None:
    link = _link(sshd, _real_relay(tmp_path), agent)
    try:
        assert "time" in link.call("hello")
        first = int(_starts(tmp_path)[0].split()[0])
        os.kill(first, signal.SIGKILL)  # between requests: the next one gets a new relay
        deadline = time.monotonic() + scaled(10)
        while _alive(first) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "experiment" in link.call("status")
        assert len(_starts(tmp_path)) == 2 and link.channels == 2
        # during a sweep: a thread keeps requesting while the relay is killed under it
        answered, errors = [], []
        stop = threading.Event()

        def sweep() -> None:
            while not stop.is_set():
                try:
                    answered.append(link.call("collect", cursor=0, limit=50))
                except HostError as exc:  # pragma: no cover - reported by the assert below
                    errors.append(exc.one_line())

        t = threading.Thread(target=sweep, daemon=True)
        t.start()
        while len(answered) < 5 and t.is_alive():
            time.sleep(0.01)
        second = int(_starts(tmp_path)[1].split()[0])
        before = len(answered)
        os.kill(second, signal.SIGKILL)
        deadline = time.monotonic() + scaled(20)
        while len(answered) < before + 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        t.join(scaled(30))
        assert not errors, errors
        assert len(answered) >= before + 20
        assert len(_starts(tmp_path)) == 3 and link.channels == 3  # one new relay, no more
    finally:
        link.close()


@pytest.mark.slow
def test_silent_relay_is_link_down_within_the_deadline(tmp_path: Path, sshd: dict) -> None:
    # reads every request, never answers: a hung agent or a cut link look the same
    link = _link(
        sshd, _wrapper(tmp_path, f"{SAY_BANNER}; exec cat > /dev/null"), None, rpc_timeout=1.0
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(LinkDown, match=r"no answer in 1s"):
            link.call("status")
        took = time.monotonic() - t0
        assert 1.0 <= took < scaled(15), took
        assert len(_starts(tmp_path)) == 1  # not sent twice: it may still be running
        # the link is usable again: the next request opens a new connection and relay
        with pytest.raises(LinkDown):
            link.call("status")
        assert len(_starts(tmp_path)) == 2
    finally:
        link.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "match"),
    [
        (
            f"{SAY_BANNER}; while read l; do echo 'not json {{'; done",
            "malformed reply from the relay: 'not json {'",
        ),
        (
            f"{SAY_BANNER}; while read l; do echo '[1, 2]'; done",
            r"malformed reply from the relay \(not an object",
        ),
        (
            f"""{SAY_BANNER}; while read l; do echo '{{"no": "ok"}}'; done""",
            "malformed reply from the agent",
        ),
        ("echo 'hello, I am a shell'; cat", "is not a stream relay: 'hello, I am a shell'"),
        ("echo boom >&2; exit 7", "exited 7 without a reply: boom"),
        (f"{SAY_BANNER}; read l; echo bang >&2; exit 9", "exited 9 without a reply: bang"),
    ],
)
def test_hostile_relay_is_one_host_error_line(
    tmp_path: Path, sshd: dict, body: str, match: str
) -> None:
    link = _link(sshd, _wrapper(tmp_path, body), None, rpc_timeout=scaled(10))
    try:
        with pytest.raises(HostError, match=match) as exc:
            link.call("status")
        assert not isinstance(exc.value, LinkDown)
        assert "\n" not in exc.value.one_line()
    finally:
        link.close()


@pytest.mark.slow
def test_relay_without_stream_falls_back_to_one_exec_per_request(
    tmp_path: Path, sshd: dict, agent: Path
) -> None:
    # an older musku: refuses --stream as an unexpected argument (its exact reply), else serves
    old = (
        'for a; do [ "$a" = --stream ] && { echo \'{"ok":false,"error":{"type":"InputError",'
        '"status":3,"message":"musku agent rpc: unexpected argument \'"\'"\'--stream\'"\'"\'"}}\';'
        " exit 3; }; done\n"
        f"PYTHONPATH={ROOT} exec {' '.join(RELAY)}"
    )
    link = _link(sshd, _wrapper(tmp_path, old), agent)
    try:
        for _ in range(3):
            assert "experiment" in link.call("status")
        assert not link.stream
    finally:
        link.close()
    starts = _starts(tmp_path)
    assert len(starts) == 4 and starts[0].endswith("--stream"), starts  # refused, then 3 execs


def test_stream_relay_checks_every_line(agent: Path) -> None:
    """The relay itself (what sshd runs), on pipes: bad lines get an error reply each and the
    stream goes on; an over-long line is refused and skipped; the order of replies holds."""
    lines = [
        b'{"op": "hello"}\n',
        b"{oops\n",
        b"\n",
        b'{"op": "status", "agent_socket": 5}\n',
        b'{"op": "status", "n": NaN}\n',
        b"x" * (MAX_LINE + 10) + b"\n",
        b'{"op": "status"}\n',
        b'{"op": "status", "agent_socket": "/nonexistent/agent.sock"}\n',
        b'{"op": "hello"}',  # the last line may lack its newline
    ]
    out = io.BytesIO()
    relay = StreamRelay(agent)
    assert relay.run(io.BytesIO(b"".join(lines)), out) == 0
    banner, *replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert banner == BANNER
    assert len(replies) == 8 == relay.served
    assert replies[0]["ok"] and "time" in replies[0]["result"]
    assert replies[1]["error"]["status"] == 3 and "on the stream" in replies[1]["error"]["message"]
    assert replies[2]["error"]["message"] == "agent_socket must be a path"
    assert replies[3]["error"]["status"] == 3
    assert "longer than" in replies[4]["error"]["message"]
    assert replies[5]["ok"] and "experiment" in replies[5]["result"]
    assert replies[6]["error"]["type"] == "LinkDown"
    assert replies[7]["ok"] and "time" in replies[7]["result"]


def test_stream_relay_process_ends_at_end_of_input(agent: Path) -> None:
    """``python -m musku.agent rpc --stream`` as a process: replies flushed one by one (the
    second request is written only after the first reply came), status 0 at end of input."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*RELAY, "--stream", "--socket", str(agent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert json.loads(proc.stdout.readline()) == BANNER  # before any request
        for op in ("hello", "status"):
            proc.stdin.write(json.dumps({"op": op}).encode() + b"\n")
            proc.stdin.flush()
            reply = json.loads(proc.stdout.readline())
            assert reply["ok"], reply
        proc.stdin.close()
        assert proc.wait(scaled(30)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


_LINE = st.one_of(
    st.just(b'{"op": "hello"}'),
    st.binary(max_size=64).map(lambda b: b.replace(b"\n", b" ")),
    st.text(max_size=40).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
    st.builds(
        lambda k, v: json.dumps({"op": "hello", k: v}).encode(),
        st.text(max_size=8),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_LINE, max_size=8))
def test_stream_relay_one_reply_per_line_in_order(agent: Path, lines: list[bytes]) -> None:
    """Whatever the lines: one JSON object reply per non-blank line, in order (a plain hello
    is answered with the agent's clock, anything else may be refused), nothing raised."""
    out = io.BytesIO()
    StreamRelay(agent).run(io.BytesIO(b"\n".join(lines) + b"\n"), out)
    banner, *replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert banner == BANNER
    asked = [ln for ln in lines if ln.strip()]
    assert len(replies) == len(asked)
    for line, reply in zip(asked, replies, strict=True):
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        if line == b'{"op": "hello"}':
            assert reply["ok"] and "time" in reply["result"], reply
        if not reply["ok"]:
            assert "\n" not in reply["error"]["message"]


@contextlib.contextmanager
def _forced(tmp: Path, command: str) -> Iterator[dict]:
    """An sshd whose key is restricted to ``command`` (authorized_keys ``command=``, as
    agents/README.md suggests): sshd runs it whatever the client asks for."""
    with run_sshd(tmp / "sshd") as srv:
        keys = srv["dir"] / "authorized_keys"
        keys.write_text(f'command="{command}",no-pty ' + keys.read_text())
        yield srv


@pytest.mark.slow
def test_forced_command_streams(tmp_path: Path, agent: Path) -> None:
    """A key forced to plain ``musku agent rpc``: the relay streams because the client asked
    for ``--stream`` (SSH_ORIGINAL_COMMAND), one relay process for all requests."""
    forced = _real_relay(tmp_path)[0]  # no arguments: sshd runs exactly this
    with _forced(tmp_path, forced) as srv:
        link = _link(srv, ["musku", "agent", "rpc"], agent)
        try:
            for _ in range(5):
                assert "experiment" in link.call("status")
            assert link.stream and link.channels == 1
        finally:
            link.close()
    assert len(_starts(tmp_path)) == 1


@pytest.mark.slow
def test_forced_one_shot_relay_falls_back(tmp_path: Path, agent: Path) -> None:
    """A key forced to an older one-shot relay (it reads its input to the end and knows no
    SSH_ORIGINAL_COMMAND): no banner within the request's deadline, the link ends the input,
    the relay's error reply shows it is one-shot, and the link execs per request from then."""
    old = _wrapper(
        tmp_path, f"unset SSH_ORIGINAL_COMMAND; PYTHONPATH={ROOT} exec {' '.join(RELAY)}"
    )[0]
    with _forced(tmp_path, old) as srv:
        link = _link(srv, ["musku", "agent", "rpc"], agent, rpc_timeout=scaled(3))
        try:
            for _ in range(3):
                assert "experiment" in link.call("status")
            assert not link.stream
        finally:
            link.close()
    assert len(_starts(tmp_path)) == 4  # the one that got no request, then one per request


@pytest.mark.slow
def test_threads_share_one_link(tmp_path: Path, sshd: dict, agent: Path) -> None:
    """8 threads calling one link at once (a pair's windows and its lease keeper do): every
    call gets its own reply (hello carries the agent's clock, status its experiment), one
    relay for all of them."""
    link = _link(sshd, _real_relay(tmp_path), agent)
    got: list[tuple[str, dict]] = []
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(10):
            op = ("hello", "status")[(k + i) % 2]
            try:
                got.append((op, link.call(op)))
            except HostError as exc:  # pragma: no cover - reported by the assert below
                errors.append(exc.one_line())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(scaled(120))
    finally:
        link.close()
    assert not errors, errors
    assert len(got) == 80
    for op, res in got:  # no reply went to another caller
        assert ("time" in res) if op == "hello" else ("experiment" in res and "time" not in res)
    assert len(_starts(tmp_path)) == 1 and link.channels == 1 and link.requests == 80
