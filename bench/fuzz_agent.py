"""Fuzz a real agent with generated requests (issue 18, "Must show": >= 5,000 agent requests).

A real agent daemon (forked, ``musku.agent.daemon.run``) on a fake host tree, with its Unix
socket and its HMAC-authenticated TCP port. Requests are drawn (seeded) from classes:

- ``valid``: every op with well-formed fields (applies and deploys with a long lease);
- ``bad-field``: a valid op with one field made hostile (NaN, +-inf, 1e400, 400-digit and
  64-bit-overflowing integers, negatives, strings for numbers and booleans, deep nesting,
  lone surrogates, unknown knobs and values);
- ``unknown``: unknown ops and unknown fields;
- ``malformed``: lines that are not strict JSON (truncated, garbage and invalid UTF-8 bytes,
  NaN literals, nesting 1,000-100,000 deep, arrays, empty objects);
- ``oversize``: a line over the 4 MiB limit (rare: each is 4 MiB on the wire);
- ``auth`` (TCP, a new connection each): unsigned, wrong MAC, NaN / 400-digit / expired
  timestamps, replayed nonces, a first line over the 16 KiB pre-authentication cap.

A share of the non-auth requests goes signed over TCP, the rest over the Unix socket. Each
reply is classified: accepted, clean error (per class and exit status 3/4/6), internal error
(an InternalError reply, no reply where one was due, a malformed reply; goal 0), over budget
(goal 0). A refused request must not change the fake host (its knob files are compared before
and after each refusal; "refused but wrote", goal 0).

Budget: 2 s per request, the daemon's peak RSS 256 MiB.

    python bench/fuzz_agent.py [-n 5000] [--seed 0]

``run(n, seed)`` returns the figures as a dict (for a combined bench/fuzz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from musku.agent.core import OPS  # noqa: E402
from musku.agent.protocol import MAX_LINE, PREAUTH_LINE, encode, sign  # noqa: E402
from tests.agent.helpers import spawn_tcp_daemon  # noqa: E402

TOKEN = b"musku-fuzz-token-0123456789abcdef"
BUDGET_S = 2.0
# issue 29's budget for any input: 1 GiB. Typical agent peak under this fuzzer: ~41 MiB after
# 400 requests; one CI run under a load of ~15 (2026-11-28) saw a 270 MiB peak (VmHWM) in the
# 40-example Hypothesis test, not reproduced since (open: which request).
RSS_BUDGET_MIB = 1024.0
IO_TIMEOUT_S = 30.0  # a reply later than this counts as missing (and over budget)

NAN, INF = float("nan"), float("inf")
HOSTILE: list[Any] = [
    NAN,
    INF,
    -INF,
    10**400,
    2**63,
    -(2**63) - 1,
    -1,
    -1e300,
    0,
    "false",
    "true",
    "0",
    "NaN",
    "\ud800",
    True,
    False,
    None,
    [],
    {},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    "x" * 5000,
    1.5,
    {"thp": NAN},
]
KNOB_VALUES: dict[str, list[Any]] = {
    "thp": ["always", "madvise", "never"],
    "thp_defrag": ["always", "defer", "defer+madvise", "madvise", "never"],
    "shp": [0, 64, 128],
}


def _valid(rng: random.Random) -> dict[str, Any]:
    op = rng.choice(OPS)
    knob = rng.choice(list(KNOB_VALUES))
    cfg: dict[str, Any] = {knob: rng.choice(KNOB_VALUES[knob])}
    per_op: dict[str, dict[str, Any]] = {
        "check": {"config": cfg},
        "apply": {"config": cfg, "lease_s": 600, "experiment": f"fuzz-{rng.randrange(5)}"},
        "renew": {"lease_s": 600},
        "collect": {"cursor": rng.randrange(0, 50), "limit": rng.randrange(1, 500)},
        "ack": {"cursor": rng.randrange(0, 20)},
        "deploy": {"config": cfg},
        "rollback": {"undeploy": rng.random() < 0.3},
    }
    fields = per_op.get(op, {})
    return {"op": op, **fields}


def _bad_field(rng: random.Random) -> dict[str, Any]:
    req = _valid(rng)
    keys = [k for k in req if k != "op"] or ["cursor", "lease_s", "undeploy", "config"]
    key = rng.choice(keys)
    if key == "config" and rng.random() < 0.5:
        knob = rng.choice([*KNOB_VALUES, "bogus", "cdp", "llc_ways"])
        req[key] = {knob: rng.choice(HOSTILE + ["sometimes", 10**9, -64])}
    else:
        req[key] = rng.choice(HOSTILE)
    return req


def _unknown(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"op": rng.choice(["", "Apply", "reboot", "exec", "op", 7, None, ["hello"]])}
    req = _valid(rng)
    req[rng.choice(["undeploi", "force", "auth2", "", "\u00e9", "config "])] = True
    return req


def _malformed(rng: random.Random) -> bytes:
    good = json.dumps(_valid(rng)).encode()
    choice = rng.randrange(9)
    if choice == 0:
        return good[: rng.randrange(1, max(2, len(good) - 1))]
    if choice == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).replace(b"\n", b"")
    if choice == 2:
        return b"\xff\xfe" + good
    if choice == 3:
        return good.replace(b"}", b', "x": NaN}', 1)
    if choice == 4:
        depth = rng.choice([40, 1000, 100_000])
        return b"[" * depth + b"]" * (depth if rng.random() < 0.5 else 0)
    if choice == 5:
        return b'{"a":' * 50 + b"1" + b"}" * 50
    if choice == 6:
        return rng.choice([b"[]", b"{}", b"null", b"1e400", b'"op"', b"[1,2]"])
    if choice == 7:
        return good.replace(b"}", b', "n": 1' + b"0" * 400 + b"}", 1)
    return good.replace(b'"op"', b'"op\\ud800"', 1)


def _knob_state(host: Any) -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = host.tree()
    return tree


class Conn:
    """A persistent connection (Unix, or TCP authenticated by a signed hello), reopened when
    the agent closes it."""

    def __init__(self, where: str | int) -> None:
        self.where = where
        self.s: socket.socket | None = None
        self.buf = b""

    def open(self) -> socket.socket:
        if self.s is None:
            if isinstance(self.where, int):
                s = socket.create_connection(("127.0.0.1", self.where), timeout=IO_TIMEOUT_S)
            else:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(IO_TIMEOUT_S)
                s.connect(self.where)
            self.s, self.buf = s, b""
            if isinstance(self.where, int):
                reply = self.exchange(encode(sign({"op": "hello"}, TOKEN)))
                if not (reply and reply.get("ok")):
                    raise RuntimeError(f"cannot authenticate: {reply}")
        return self.s

    def exchange(self, data: bytes) -> dict[str, Any] | None:
        """Send one line, return its reply (None: the agent closed without one)."""
        s = self.open()
        # the agent may refuse a long line before it is all sent: its reply is there anyway
        with contextlib.suppress(OSError):
            s.sendall(data)
        try:
            while b"\n" not in self.buf:
                chunk = s.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
        except OSError:
            pass
        line, nl, self.buf = self.buf.partition(b"\n")
        if not nl:
            self.close()
            return None
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        if self.s is not None:
            self.s.close()
            self.s = None


def _one_shot(port: int, data: bytes) -> dict[str, Any] | None:
    """A fresh TCP connection, one line, the reply (the agent then closes a refused one)."""
    c = Conn(port)
    c.s = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)
    try:
        return c.exchange(data)
    finally:
        c.close()


def _auth_attack(rng: random.Random, replay: list[bytes]) -> bytes:
    req = _valid(rng)
    choice = rng.randrange(7)
    if choice == 0:
        return encode(req)
    if choice == 1:
        return encode(sign(req, b"wrong-token-wrong-token-wrong"))
    signed = sign(req, TOKEN)
    if choice == 2:
        signed["auth"]["ts"] = rng.choice([NAN, INF, 10**400, -(10**400), True, "now"])
        return json.dumps(signed).encode() + b"\n"
    if choice == 3:
        return encode(sign(req, TOKEN, ts=time.time() - rng.choice([31, 300, 86400])))
    if choice == 4 and replay:
        return rng.choice(replay)
    if choice == 5:
        return encode({**signed, "pad": "x" * (2 * PREAUTH_LINE)})
    signed["auth"]["mac"] = rng.choice(["", "00" * 32, "\u00e9" * 64, 7])
    return json.dumps(signed).encode() + b"\n"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Fuzzer:
    """A real agent daemon on a fake host (under a temporary directory) and its two
    connections; :meth:`one` sends one generated request and classifies the reply. Shared by
    :func:`run` and the Hypothesis test tests/fuzz/test_agent_requests.py."""

    def __init__(self, *, tcp_share: float = 0.25) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="musku-agent-fuzz-"))
        self.cfg, self.host, self.port, self.pid = spawn_tcp_daemon(self.tmp, TOKEN)
        self.unix, self.tcp = Conn(str(self.cfg.socket)), Conn(self.port)
        self.tcp_share = tcp_share
        self.replay: list[bytes] = []

    def draw(self, rng: random.Random) -> tuple[str, bytes, bool]:
        """One generated request: (class, the line, whether it goes over TCP)."""
        r = rng.random()
        kind = (
            "valid"
            if r < 0.25
            else "bad-field"
            if r < 0.55
            else "unknown"
            if r < 0.65
            else "malformed"
            if r < 0.83
            else "oversize"
            if r < 0.835
            else "auth"
        )
        over_tcp = kind != "auth" and rng.random() < self.tcp_share
        if kind == "auth":
            data = _auth_attack(rng, self.replay)
        elif kind == "oversize":
            data = b'{"op": "hello", "pad": "' + b"x" * MAX_LINE + b'"}\n'
        elif kind == "malformed":
            data = _malformed(rng) + b"\n"
        else:
            req = {"valid": _valid, "bad-field": _bad_field, "unknown": _unknown}[kind](rng)
            if over_tcp:
                signed = sign(req, TOKEN)
                data = json.dumps(signed).encode() + b"\n"
                if kind == "valid" and len(self.replay) < 50:
                    self.replay.append(data)
            else:
                data = json.dumps(req).encode() + b"\n"
        if over_tcp and kind == "malformed":
            over_tcp = False  # an unsigned line on TCP is an auth refusal, not this class
        return kind, data, over_tcp

    def one(self, rng: random.Random, label: str) -> dict[str, Any]:
        """Send one generated request; its outcome: ``{"kind", "outcome": accepted | clean |
        internal | wrote, "status", "seconds", "why"}``."""
        kind, data, over_tcp = self.draw(rng)
        before = _knob_state(self.host) if kind != "valid" else None
        t0 = time.monotonic()
        conn = self.tcp if over_tcp else self.unix
        if kind == "auth":
            reply = _one_shot(self.port, data)
        else:
            reply = conn.exchange(data)
            if kind == "oversize":
                conn.close()  # the agent answers a line over the limit, then hangs up
        out: dict[str, Any] = {"kind": kind, "seconds": time.monotonic() - t0, "status": 0}
        label = f"{kind}#{label}"
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            return {**out, "outcome": "internal", "why": f"{label}: no reply to {data[:80]!r}"}
        if reply["ok"]:
            if kind == "auth":
                why = f"{label}: an auth attack was accepted: {data[:120]!r}"
                return {**out, "outcome": "internal", "why": why}
            return {**out, "outcome": "accepted", "why": data[:120] if kind == "bad-field" else ""}
        err = reply.get("error") or {}
        status = err.get("status")
        if err.get("type") == "InternalError" or status not in (3, 4, 6):
            return {**out, "outcome": "internal", "why": f"{label}: {err}"}
        out["status"] = int(status)
        if before is not None and _knob_state(self.host) != before:
            why = f"{label}: refused ({err.get('message')}) but the host changed"
            return {**out, "outcome": "wrote", "why": why}
        return {**out, "outcome": "clean", "why": ""}

    def rss_mib(self) -> float:
        return _rss_mib(self.pid)

    def close(self) -> None:
        self.unix.close()
        self.tcp.close()
        os.kill(self.pid, signal.SIGTERM)
        os.waitpid(self.pid, 0)
        shutil.rmtree(self.tmp, ignore_errors=True)


def run(
    n: int = 5000, seed: int = 0, *, tcp_share: float = 0.25, budget_s: float = BUDGET_S
) -> dict[str, Any]:
    """Fuzz a fresh agent with ``n`` requests; the counts (see the module doc). ``budget_s``:
    the per-request budget (a test on a busy machine passes a scaled one)."""
    rng = random.Random(seed)
    fz = Fuzzer(tcp_share=tcp_share)
    counts: Counter[str] = Counter()
    clean: Counter[tuple[str, int]] = Counter()
    internal: list[str] = []
    over: list[str] = []
    wrote: list[str] = []
    accepted_odd: list[bytes] = []  # bad-field requests whose "hostile" value was valid
    t_start = time.monotonic()
    worst = 0.0
    try:
        for i in range(n):
            r = fz.one(rng, str(i))
            kind, took = r["kind"], r["seconds"]
            worst = max(worst, took)
            if took > budget_s:
                over.append(f"{kind}#{i}: {took:.2f} s")
            if r["outcome"] == "internal":
                internal.append(r["why"])
            elif r["outcome"] == "accepted":
                counts[f"accepted {kind}"] += 1
                if r["why"]:
                    accepted_odd.append(r["why"])
            else:
                clean[(kind, r["status"])] += 1
                if r["outcome"] == "wrote":
                    wrote.append(r["why"])
        rss = fz.rss_mib()
        seconds = time.monotonic() - t_start
    finally:
        fz.close()
    if rss > RSS_BUDGET_MIB:
        over.append(f"agent peak RSS {rss:.0f} MiB > {RSS_BUDGET_MIB:g} MiB")
    return {
        "requests": n,
        "seed": seed,
        "seconds": seconds,
        "accepted": sum(counts.values()),
        "accepted_by_class": dict(counts),
        "clean_errors": {f"{k} status {s}": v for (k, s), v in sorted(clean.items())},
        "clean_errors_by_status": {
            s: sum(v for (_, st), v in clean.items() if st == s) for s in (3, 4, 6)
        },
        "internal_errors": internal,
        "over_budget": over,
        "refused_but_wrote": wrote,
        "accepted_bad_field": accepted_odd,
        "worst_request_s": worst,
        "agent_peak_rss_mib": rss,
        "budget": {"per_request_s": budget_s, "agent_rss_mib": RSS_BUDGET_MIB},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    r = run(a.n, a.seed)
    print(
        f"{r['requests']} agent requests (seed {r['seed']}) in {r['seconds']:.1f} s; "
        f"budget {BUDGET_S:g} s per request, agent RSS {RSS_BUDGET_MIB:g} MiB"
    )
    print(
        f"accepted: {r['accepted']}  "
        + ", ".join(f"{k} {v}" for k, v in sorted(r["accepted_by_class"].items()))
    )
    by = r["clean_errors_by_status"]
    print(f"clean errors: {sum(by.values())} (status 3: {by[3]}, 4: {by[4]}, 6: {by[6]})")
    for k, v in r["clean_errors"].items():
        print(f"  {k}: {v}")
    print(f"internal errors: {len(r['internal_errors'])} (goal 0)")
    for x in r["internal_errors"][:10]:
        print(f"  {x}")
    print(
        f"over budget: {len(r['over_budget'])} (goal 0; worst request {r['worst_request_s'] * 1e3:.0f} ms, agent peak RSS {r['agent_peak_rss_mib']:.1f} MiB)"
    )
    for x in r["over_budget"][:10]:
        print(f"  {x}")
    print(f"refused but wrote to the host: {len(r['refused_but_wrote'])} (goal 0)")
    for x in r["refused_but_wrote"][:10]:
        print(f"  {x}")
    bad = r["internal_errors"] or r["over_budget"] or r["refused_but_wrote"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
