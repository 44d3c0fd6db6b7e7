"""Generated input documents for the property tests (tests/experiment/test_input_properties.py)
and bench/fuzz.py: every file kind musku reads (experiment files, platform catalogs, simulator
models, the agent's configuration), each drawn from a valid document by seeded mutations
(hostile values, wrong types, unknown and missing keys, deep nesting, huge numbers, markup,
non-ASCII digits, device paths, pathological lines, byte damage).

Generators take a ``random.Random`` so the bench can draw thousands quickly and reproducibly;
the property tests wrap them with ``hypothesis.strategies.randoms``.

Each ``check_*`` function loads one document the way musku does and classifies the outcome:
``("accepted", 0)``, ``("clean", status)`` for a MuskuError, ``("internal", 1)`` for anything
else, with the time taken; a document is "over budget" beyond :data:`BUDGET_S` seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.timing import slowdown

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 2.0
"""Most CPU seconds loading or checking one generated document may take (the shipped documents
take well under 0.1 s). CPU time of the checking thread, not wall time: what a hostile input
can make musku spend, which a busy machine does not inflate (at load 20 on 2 CPUs a 1 s check
takes 10 s of wall time). A document that blocks instead of computing is caught by
:data:`STALL_S`."""
STALL_S = 60.0
"""Wall seconds after which a check counts as stalled (blocked on a device, a FIFO, a lock),
an internal error; scaled by the machine's slowdown (tests/timing.py)."""
RSS_BUDGET_MIB = 400
"""Peak RSS of the whole fuzzing process (Python, numpy, scipy, sqlalchemy, rich included)."""

HOSTILE: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    1,
    -(2**63),
    2**63 - 1,
    10**18,
    1e308,
    1e-300,
    -0.0,
    0.5,
    True,
    False,
    "",
    " ",
    "yes",
    "off",
    "12:0",
    "6:5",
    "\u0666:\u0665",
    "\u0661\u0662",
    "x[/bold]y",
    "[/]",
    "[bold]",
    "a" * 201,
    "a" * 300,
    "a" * 5000,
    "/dev/zero",
    "/dev/null",
    "/proc/self/fd/0",
    "/",
    "..",
    "../../../../etc/passwd",
    "nul\x00byte",
    "\t\n\r",
    "émoji \U0001f600",
    "turbo",
    "splits",
    "always",
    "sim",
    "agent",
    "local",
    "os:system",
    [],
    [math.inf],
    [math.nan, 1],
    [-1],
    [0, 0],
    ["a"],
    [[1]],
    list(range(50)),
    {},
    {"x": 1},
    {"nested": {"deeper": [1, {"a": "b"}]}},
]


def hostile(rng: random.Random) -> Any:
    """A value from the pool, or a deeply nested or huge one now and then."""
    roll = rng.random()
    if roll < 0.05:
        depth = rng.choice([20, 40, 100, 200])  # deeper: as text, in damage()
        v: Any = 1
        for _ in range(depth):
            v = [v] if rng.random() < 0.5 else {"k": v}
        return v
    if roll < 0.08:
        return rng.choice([10**50, -(10**80), 2**64])  # past 64 bits
    if roll < 0.1:
        return "".join(rng.choice("[]/ x.:=\"'\\#") for _ in range(rng.randint(1, 200)))
    return copy.deepcopy(rng.choice(HOSTILE))  # never mutate the pool itself


# --------------------------------------------------------------------------- TOML writing


def _quote(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _key(k: str) -> str:
    return k if k and all(c.isascii() and (c.isalnum() or c in "_-") for c in k) else _quote(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    """A document as TOML: top-level scalars first, then one ``[table]`` per dict (nested
    dicts inline) and ``[[array]]`` for lists of dicts."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict | list)]
    for k, v in doc.items():
        if isinstance(v, list) and not (v and all(isinstance(x, dict) for x in v)):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"\n[{_key(k)}]")
            lines.extend(f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items())
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                lines.append(f"\n[[{_key(k)}]]")
                lines.extend(f"{_key(kk)} = {_value(vv)}" for kk, vv in item.items())
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- mutation


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if len(prefix) > 8:  # never mutate inside a deep generated value
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def mutate(rng: random.Random, base: dict[str, Any]) -> dict[str, Any]:
    """1-3 structural mutations of a copy of ``base``."""
    doc = json.loads(json.dumps(base))  # deep copy (base holds no NaN)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(doc)
        if not paths:
            break
        path = rng.choice(paths)
        parent = _parent(doc, path)
        kind = rng.random()
        if kind < 0.6:
            parent[path[-1]] = hostile(rng)
        elif kind < 0.75 and isinstance(parent, dict):
            del parent[path[-1]]
        elif kind < 0.9:
            target = parent if isinstance(parent, dict) else doc
            name = rng.choice(["foo", "x[/]", "seed", "ways", "model", "a" * 250, "é"])
            target[name] = hostile(rng)
        else:
            if isinstance(parent, list):
                parent.extend([parent[path[-1]]] * rng.choice([1, 5, 100]))
            else:
                parent[path[-1]] = [parent[path[-1]]]
    return doc


def damage(rng: random.Random, text: str) -> str:
    """Text-level damage: truncation, a flipped byte, a pathological line or key."""
    roll = rng.random()
    if roll < 0.3:
        return text[: rng.randrange(len(text) + 1)]
    if roll < 0.5:
        i = rng.randrange(len(text) + 1)
        return (
            text[:i]
            + rng.choice(["[", "]", '"', "=", "\n", "\\", "\x00", "\ud7ff", "{"])
            + text[i:]
        )
    if roll < 0.65:
        line = "[" + " " * rng.choice([10, 1000, 4000]) + "x"
        return text + f'\nnote = """\n{line}\n"""\n'
    if roll < 0.8:
        key = ".".join(["a"] * rng.choice([10, 40, 5000, 50000]))
        return text + f"\n{key} = 1\n"
    if roll < 0.9:
        return text + "\nbig = " + "9" * rng.choice([19, 100, 4299, 4500]) + "\n"
    return "[" * rng.choice([100, 600]) + "\n" + text


def draw(rng: random.Random, base: dict[str, Any]) -> str:
    """One generated document: a mutated valid one, sometimes also damaged as text."""
    text = to_toml(mutate(rng, base) if rng.random() < 0.9 else base)
    if rng.random() < 0.3:
        text = damage(rng, text)
    return text


# --------------------------------------------------------------------------- the file kinds


def _toml_file(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


def _toy_model() -> dict[str, Any]:
    import tomllib

    from tests.fixtures.toy import MODEL

    return tomllib.loads(MODEL)


def _toy_experiment() -> dict[str, Any]:
    import tomllib

    from tests.fixtures.toy import EXPERIMENT

    doc = tomllib.loads(EXPERIMENT.format(name="fuzz", mode="independent"))
    doc["hosts"]["model"] = "model.toml"
    return doc


BASES: dict[str, Callable[[], dict[str, Any]]] = {
    "experiment": _toy_experiment,
    "catalog": lambda: _toml_file(ROOT / "knobs" / "skylake18.toml"),
    "vm-catalog": lambda: _toml_file(ROOT / "knobs" / "firecracker-vm.toml"),
    "sim-model": _toy_model,
    "agent-config": lambda: _toml_file(ROOT / "agents" / "agent.toml"),
}


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


class Workdir:
    """A directory holding the valid side files a generated document may refer to."""

    def __init__(self, d: Path) -> None:
        from tests.fixtures.toy import MODEL

        self.dir = d
        (d / "model.toml").write_text(MODEL)
        (d / "cat.toml").write_text((ROOT / "knobs" / "firecracker-vm.toml").read_text())


def check_document(kind: str, text: str, work: Workdir) -> tuple[str, int, float, str]:
    """Load one generated document of ``kind`` as musku does. Returns (outcome, status,
    seconds, message); outcome is accepted | clean | internal. ``experiment`` goes through the
    CLI's ``check`` (in this process), so the exit status is the one a user would see."""
    from musku.errors import MuskuError

    name = {"experiment": "exp.toml", "sim-model": "gen-model.toml"}.get(kind, "gen.toml")
    path = work.dir / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = _tree(work.dir)
    started, cpu_started = time.perf_counter(), time.thread_time()
    outcome, status, message = "accepted", 0, ""
    try:
        if kind == "experiment":
            status = _cli_check(path)
            outcome = "accepted" if status == 0 else "internal" if status == 1 else "clean"
        elif kind in ("catalog", "vm-catalog"):
            from musku.experiment import load_platform

            load_platform(path)
        elif kind == "sim-model":
            from musku.sim.model import SimModel

            SimModel.load(path, space=None)
        elif kind == "agent-config":
            from musku.agent.config import load_config

            load_config(path)
        else:
            raise KeyError(kind)
    except MuskuError as exc:
        outcome, status, message = "clean", int(exc.status), exc.one_line()
    except Exception as exc:  # noqa: BLE001 - the point is to catch every internal error
        outcome, status, message = "internal", 1, f"{type(exc).__name__}: {exc}"[:300]
    seconds = time.thread_time() - cpu_started
    wall = time.perf_counter() - started
    if wall > STALL_S * slowdown():
        outcome, status = "internal", 1
        message = f"stalled: {wall:.0f} s wall for {seconds:.2f} s CPU; {message}"[:300]
    after = _tree(work.dir)
    after.pop(name, None)
    before.pop(name, None)
    if after != before:
        outcome, message = "internal", f"wrote files: {sorted(set(after) ^ set(before))}"
    return outcome, status, seconds, message


def _cli_check(path: Path) -> int:
    """``musku check PATH`` in this process; its exit status."""
    from musku.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.pop("MUSKU_DEBUG", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(["check", str(path)])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            else:
                code = 0
    finally:
        if old is not None:
            os.environ["MUSKU_DEBUG"] = old
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    if code not in (0, 1) and (len(lines) != 1 or "Traceback" in err.getvalue()):
        return 1  # a refusal must be exactly one line
    return code


def warm_up(work: Workdir) -> None:
    """Import what the loaders import (scipy through musku.sim: seconds on a busy machine),
    so that the first document's time is its own."""
    for kind, base in BASES.items():
        check_document(kind, to_toml(base()), work)


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
