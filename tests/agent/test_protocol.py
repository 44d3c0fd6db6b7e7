"""Strict request decoding and field validation (issue 18): NaN/inf/huge numbers, deep nesting,
string booleans, bad cursors and unknown fields are bad requests (status 3), never internal
errors, never a write to the host; HMAC freshness cannot be bypassed with NaN."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from musku.agent.protocol import MAX_DEPTH, Verifier, decode_request, sign
from musku.errors import InputError
from tests.agent.helpers import THP, make_agent

TOKEN = b"0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"op": "hello", "x": NaN}', "NaN"),
        (b'{"op": "hello", "x": -Infinity}', "Infinity"),
        (b'{"op": "hello", "x": 1e400}', "overflows"),
        (b'{"op": "hello", "x": ' + b"9" * 400 + b"}", "64 bits"),
        (b'{"op": "hello", "x": 9223372036854775808}', "64 bits"),
        (b"[" * 100_000, "nested deeper"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper"),
        (b'{"op": "hello", "x": "\\ud800"}', "not valid Unicode"),
        (b'{"op": "hello", "\\udfff": 1}', "not valid Unicode"),
        (b"\xff\xfe{}", "malformed JSON"),
        (b"[1, 2]", "a request is a JSON object"),
        (b"{oops", "malformed JSON"),
    ],
)
def test_decode_refuses_what_is_not_strict_json(line: bytes, why: str) -> None:
    with pytest.raises(InputError, match=why):
        decode_request(line)


def test_decode_accepts_the_edges() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH - 1):
        deep = {"a": deep}
    import json

    assert decode_request(json.dumps({"op": "x", "d": deep}).encode())["op"] == "x"
    req = decode_request(b'{"c": 9223372036854775807, "f": 1.5e300, "s": "\\u00e9"}')
    assert req == {"c": 2**63 - 1, "f": 1.5e300, "s": "é"}


@pytest.mark.parametrize(
    "ts",
    [math.nan, math.inf, -math.inf, 10**400, -(10**400), True, 1e300, "1700000000"],
    ids=["nan", "inf", "-inf", "400-digits", "-400-digits", "bool", "1e300", "text"],
)
def test_hmac_timestamp_must_be_a_real_time(ts: object) -> None:
    """NaN compared false with the window (so it passed as fresh, replayable forever); a
    400-digit int raised OverflowError (a traceback, the connection dropped)."""
    v = Verifier(TOKEN)
    req = sign({"op": "status"}, TOKEN)
    req["auth"]["ts"] = ts  # the MAC is over the ts as sent: make it match
    import hashlib
    import hmac

    from musku.agent.protocol import canonical

    nonce = req["auth"]["nonce"]
    req["auth"]["mac"] = hmac.new(
        TOKEN, f"{ts!r}:{nonce}:".encode() + canonical({"op": "status"}), hashlib.sha256
    ).hexdigest()
    with pytest.raises(InputError, match="malformed authentication|expired"):
        v.check(req)


def test_hmac_still_accepts_fresh_and_refuses_oddities() -> None:
    v = Verifier(TOKEN)
    assert v.check(sign({"op": "status"}, TOKEN)) == {"op": "status"}
    assert v.check(sign({"op": "status"}, TOKEN, ts=int(time.time()))) == {"op": "status"}
    bad = sign({"op": "status"}, TOKEN)
    bad["auth"]["mac"] = "é" * 64  # compare_digest raised TypeError on non-ASCII text
    with pytest.raises(InputError, match="malformed"):
        v.check(bad)


def _err(reply: dict) -> dict:
    assert reply["ok"] is False, reply
    return reply["error"]


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, [], {}])
def test_undeploy_must_be_a_json_boolean(tmp_path: Path, value: object) -> None:
    """``{"undeploy": "false"}`` undeployed (bool("false") is True)."""
    agent, host = make_agent(tmp_path)
    try:
        assert agent.handle({"op": "deploy", "config": {"thp": "never"}})["ok"]
        e = _err(agent.handle({"op": "rollback", "undeploy": value}))
        assert e["status"] == 3 and "undeploy must be true or false" in e["message"]
        assert "[never]" in host.read(THP)
        assert agent.handle({"op": "status"})["result"]["deployed"] == {"thp": "never"}
        assert agent.handle({"op": "rollback", "undeploy": False})["ok"]
        assert "[never]" in host.read(THP)
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("req", "why"),
    [
        ({"op": "collect", "cursor": math.nan}, "cursor must be an integer"),
        ({"op": "collect", "cursor": math.inf}, "cursor must be an integer"),
        ({"op": "collect", "cursor": 10**30}, r"cursor must be an integer in 0\.\."),
        ({"op": "collect", "cursor": -1}, r"cursor must be an integer in 0\.\."),
        ({"op": "collect", "cursor": 2.5}, "cursor must be an integer"),
        ({"op": "collect", "limit": math.nan}, "limit must be an integer"),
        ({"op": "collect", "limit": 10**30}, "limit must be an integer in 1..100000"),
        ({"op": "collect", "cursor": 3, "ack": math.nan}, "ack must be an integer"),
        ({"op": "collect", "cursor": 3, "ack": 10**30}, "ack must be an integer"),
        ({"op": "ack", "cursor": math.nan}, "cursor must be an integer"),
        ({"op": "ack", "cursor": 10**400}, "cursor must be an integer in"),
        ({"op": "ack", "cursor": -5}, "cursor must be an integer in"),
        ({"op": "ack", "cursor": True}, "cursor must be an integer"),
        ({"op": "apply", "config": {"thp": "never"}, "lease_s": math.nan}, "finite"),
        ({"op": "apply", "config": {"thp": "never"}, "lease_s": 10**400}, "finite"),
        ({"op": "renew", "lease_s": math.inf}, "finite"),
        ({"op": "apply", "config": {"thp": "never"}, "experiment": 7}, "experiment must be"),
        ({"op": "apply", "config": {"thp": "never"}, "experiment": "x" * 201}, "at most 200"),
        ({"op": "rollback", "undeploi": True}, r"unknown field\(s\) 'undeploi'"),
        ({"op": "status", "verbose": 1}, "unknown field"),
    ],
)
def test_bad_fields_are_bad_requests(tmp_path: Path, req: dict, why: str) -> None:
    """NaN and huge cursors gave InternalError (exit-code class 1); now status 3."""
    agent, host = make_agent(tmp_path)
    try:
        agent.sample_once()
        before = host.tree()
        e = _err(agent.handle(req))
        assert e["type"] == "InputError" and e["status"] == 3, e
        assert re.search(why, e["message"]), e["message"]
        assert host.tree() == before
        assert agent.handle({"op": "collect", "cursor": 0})["ok"]  # still sane
    finally:
        agent.close()
