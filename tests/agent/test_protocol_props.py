"""Property tests of the agent protocol (Hypothesis, issue 18): a generated request either
succeeds or gets one clean error reply (status 3, 4 or 6, never an InternalError), within a
time budget, and a refused request writes nothing to the host (the fake host tree is compared
byte for byte). The same through the real server: every line gets exactly one reply line and
the connection stays usable.

Budget: 5 s per request on a loaded 2-core machine (an agent answers these in milliseconds).
Examples are derandomized (the same every run: no flake); bench/fuzz_agent.py draws new ones.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.agent.core import FIELDS, OPS, Agent
from musku.agent.protocol import decode_request
from musku.domain import KNOBS
from musku.errors import InputError
from musku.testing.fakehost import FakeHost
from tests.agent.helpers import make_agent

BUDGET_S = 5.0
PROPS = settings(
    max_examples=150,
    deadline=None,  # the budget is asserted per request below (a loaded CI machine)
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**400, -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["false", "true", "NaN", "\ud800", "never", "always", "1e400"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
KNOB_VALUES = st.sampled_from(["never", "always", "madvise", "on", "off", 0, 64, 128, -1, 2**40])
CONFIGS = JSON | st.dictionaries(
    st.sampled_from([*KNOBS, "bogus"]), KNOB_VALUES | SCALARS, max_size=3
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "config": CONFIGS,
    "lease_s": st.floats(min_value=0.5, max_value=3600) | JSON,
    "experiment": st.text(max_size=30) | JSON,
    "threading": JSON,
    "cursor": st.integers(min_value=0, max_value=50) | JSON,
    "ack": st.integers(min_value=0, max_value=50) | JSON,
    "limit": st.integers(min_value=1, max_value=500) | JSON,
    "undeploy": st.booleans() | JSON,
    "controller": st.sampled_from(["", "ctl-a", "ctl-b"]) | JSON,
    "override": st.booleans() | JSON,
}


def _request(op: str) -> st.SearchStrategy[dict[str, Any]]:
    base = st.fixed_dictionaries(
        {"op": st.just(op)}, optional={f: FIELD_VALUES[f] for f in sorted(FIELDS[op])}
    )
    extra = st.dictionaries(st.text(max_size=8), JSON, max_size=2)
    return st.one_of(base, st.tuples(base, extra).map(lambda t: {**t[1], **t[0]}))


REQUESTS = st.sampled_from(OPS).flatmap(_request) | st.dictionaries(
    st.text(max_size=8), JSON, max_size=3
).map(lambda d: {"op": d.pop("op", None), **d} if d else d)


@pytest.fixture(scope="module")
def agent_on_fake_host(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Agent, FakeHost]]:
    agent, host = make_agent(tmp_path_factory.mktemp("props"))
    for _ in range(5):
        agent.sample_once()
    try:
        yield agent, host
    finally:
        agent.close()


def _check_reply(reply: Any) -> None:
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if not reply["ok"]:
        err = reply["error"]
        assert err["type"] != "InternalError", err
        assert err["status"] in (3, 4, 6), err
        assert isinstance(err["message"], str) and "\n" not in err["message"], err


@PROPS
@given(req=REQUESTS)
def test_a_request_succeeds_or_is_refused_cleanly(
    agent_on_fake_host: tuple[Agent, FakeHost], req: dict[str, Any]
) -> None:
    agent, host = agent_on_fake_host
    line = json.dumps(req, allow_nan=True).encode()  # what a client could put on the wire
    before = host.tree()
    t0 = time.monotonic()
    try:
        decoded = decode_request(line)
    except InputError as exc:
        assert exc.status == 3
        return
    reply = agent.handle(decoded)
    assert time.monotonic() - t0 < BUDGET_S
    _check_reply(reply)
    if not reply["ok"]:
        assert host.tree() == before, f"a refused {req!r} wrote to the host"
    # back to the baseline for the next example (an apply or deploy may have succeeded)
    assert agent.handle({"op": "rollback", "undeploy": True})["ok"]


@PROPS
@given(
    data=st.binary(max_size=200)
    | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | JSON.map(lambda v: json.dumps(v, allow_nan=True).encode())
)
def test_decoding_raises_only_input_errors(data: bytes) -> None:
    try:
        req = decode_request(data)
    except InputError as exc:
        assert exc.status == 3 and "\n" not in exc.one_line()
    else:
        assert isinstance(req, dict)
        json.dumps(req, allow_nan=False).encode()  # strict JSON all the way down


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Agent, FakeHost]]:
    from musku.agent.server import Listeners

    agent, host = make_agent(tmp_path_factory.mktemp("props-served"))
    ls = Listeners(agent)
    ls.start()
    try:
        yield agent, host
    finally:
        ls.stop()
        agent.close()


def _lines(s: socket.socket, f: Any, data: bytes) -> dict[str, Any]:
    s.sendall(data)
    line = f.readline()
    assert line.endswith(b"\n"), f"no reply line to {data[:80]!r}"
    reply: dict[str, Any] = json.loads(line)
    return reply


@settings(PROPS, max_examples=80)
@given(
    line=REQUESTS.map(lambda r: json.dumps(r, allow_nan=True).encode())
    | st.binary(max_size=100).filter(lambda b: b"\n" not in b and b.strip())
)
def test_the_server_answers_every_line_and_stays_usable(
    served: tuple[Agent, FakeHost], line: bytes
) -> None:
    agent, host = served
    before = host.tree()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(BUDGET_S)
        s.connect(str(agent.config.socket))
        with s.makefile("rb") as f:
            reply = _lines(s, f, line + b"\n")
            _check_reply(reply)
            if not reply["ok"]:
                assert host.tree() == before
            assert _lines(s, f, b'{"op": "hello"}\n')["ok"]  # the connection is still sane
            assert _lines(s, f, b'{"op": "rollback", "undeploy": true}\n')["ok"]
