"""The schema layer (musku/schema): ``musku schema KIND`` prints a JSON Schema that accepts the
shipped files and refuses a misspelt key; ``musku check`` refuses each built-in backend's bad
``[hosts]`` options in one line, exit 3, without opening a connection; generated documents of
every kind either validate or give one clean ``file:line`` error through the models."""

from __future__ import annotations

import contextlib
import io
import json
import random
import socket
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.cli import main
from musku.errors import InputError
from musku.registry import BACKENDS
from musku.schema import json_schema, kinds, model_of
from musku.schema.document import Document
from musku.schema.tomlpos import Positions
from tests.experiment.generators import BASES, draw
from tests.fixtures.toy import EXPERIMENT, MODEL
from tests.timing import slowdown

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    """``musku ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _kind_of(path: Path) -> str:
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    if "experiment" in doc:
        return "experiment"
    if "model" in doc or "reference" in doc:
        return "sim-model"
    return "qsim-model"


SHIPPED = [
    *((p, _kind_of(p)) for p in sorted((ROOT / "experiments").rglob("*.toml"))),
    *((p, "catalog") for p in sorted((ROOT / "knobs").glob("*.toml"))),
    (ROOT / "agents" / "agent.toml", "agent-config"),
]


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for kind in kinds():
        code, stdout, stderr = run("schema", kind)
        assert code == 0 and not stderr, (kind, stderr)
        out[kind] = json.loads(stdout)
    return out


def test_every_kind_prints_a_valid_json_schema(schemas: dict[str, dict[str, Any]]) -> None:
    assert {"experiment", "catalog", "sim-model", "agent-config", "qsim-model"} <= set(schemas)
    assert {f"hosts-{b}" for b in BACKENDS.names()} <= set(schemas)
    for kind, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"].endswith("2020-12/schema"), kind
        assert schema["type"] == "object", kind


def test_an_unknown_kind_is_a_usage_error() -> None:
    code, stdout, stderr = run("schema", "experiments")
    assert code == 2 and not stdout
    assert stderr.count("\n") == 1 and "unknown schema kind 'experiments'" in stderr


@pytest.mark.parametrize(("path", "kind"), SHIPPED, ids=[f"{p.name}" for p, _ in SHIPPED])
def test_the_schemas_accept_the_shipped_files(
    schemas: dict[str, dict[str, Any]], path: Path, kind: str
) -> None:
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    jsonschema.validate(doc, schemas[kind])


@pytest.mark.parametrize(
    ("kind", "path", "where"),
    [
        ("experiment", "experiments/web-skylake.toml", ("statistics",)),
        ("experiment", "experiments/web-skylake.toml", ("hosts",)),
        ("experiment", "experiments/local-vm.toml", ("hosts",)),
        ("catalog", "knobs/skylake18.toml", ("knobs", "thp")),
        ("sim-model", "experiments/sim/web-skylake18.toml", ("noise",)),
        ("agent-config", "agents/agent.toml", ("agent",)),
        ("qsim-model", "experiments/qsim/2tier.toml", ("run",)),
    ],
)
def test_the_schemas_refuse_a_misspelt_key(
    schemas: dict[str, dict[str, Any]], kind: str, path: str, where: tuple[str, ...]
) -> None:
    doc = tomllib.loads((ROOT / path).read_text(encoding="utf-8"))
    table = doc
    for part in where:
        table = table.setdefault(part, {})
    table["sampel_cap"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schemas[kind])


# --------------------------------------------------------------------------- [hosts] options

TOY_HOSTS = '[hosts]\nbackend = "sim"\nmodel = "toy-model.toml"\n'
AGENT = '[hosts]\nbackend = "agent"\nhosts = ["host-a", "host-b"]\n'
LOCAL = '[hosts]\nbackend = "local"\n'
QSIM = '[hosts]\nbackend = "qsim"\nmodel = "qsim.toml"\n'

HOSTS_CASES = [
    # (the [hosts] table, the refusal it must give)
    (TOY_HOSTS + 'noise_scale = "high"\n', "[hosts] noise_scale must be a number in [0, 100]"),
    (TOY_HOSTS + "seed = 3\n", "[hosts] unknown option 'seed' for the sim backend"),
    (TOY_HOSTS + "host_bias = 0.5\n", "[hosts] host_bias must be a number in (-0.5, 0.5)"),
    (TOY_HOSTS.replace('model = "toy-model.toml"', "model = 3"), "backend 'sim' needs model"),
    (AGENT + 'ssh_port = "22"\n', "[hosts] ssh_user must be a string and ssh_port an integer"),
    (AGENT + "lease = 30\n", "[hosts] unknown option 'lease' for the agent backend"),
    (AGENT + "connect_timeout_s = 0\n", "[hosts] connect_timeout_s must be a number in [0.1, 600]"),
    (AGENT + "ssh_port = 70000\n", "[hosts] ssh_port must be an integer in 1..65535"),
    (AGENT.replace('"host-b"', '{ name = "b", port = 0, host = "b" }'), "b: port must be"),
    (AGENT.replace('"host-b"', '"host-a"'), "is listed twice"),
    (AGENT.replace('["host-a", "host-b"]', '["host-a"]'), "needs hosts = [at least two hosts]"),
    (AGENT + "remote_command = []\n", "[hosts] remote_command must be a list of strings"),
    (LOCAL + "madvise = 1\n", "[hosts] madvise must be true or false"),
    (LOCAL + "settle = 1\n", "[hosts] unknown option 'settle' for the local backend"),
    (LOCAL + "lease_s = 0.5\n", "[hosts] lease_s must be a number in [1, 3600]"),
    (LOCAL + "arena_mib = nan\n", "[hosts] arena_mib must be a number in [8, 1.04858e+06]"),
    (LOCAL + 'workload = "nginx"\n', "[hosts] workload must be 'builtin' or 'none'"),
    (QSIM + 'qps = "lots"\n', "[hosts] qps must be a number >= 0, not 'lots'"),
    (QSIM + "noise = -0.1\n", "[hosts] noise must be a number >= 0, not -0.1"),
    (QSIM + "speed = 2\n", "[hosts] unknown qsim option(s) speed (allowed: model, qps,"),
    (QSIM.replace('model = "qsim.toml"\n', ""), 'backend "qsim" needs model'),
]


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record (and refuse) every attempt to open a connection."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.mark.parametrize(("hosts", "needle"), HOSTS_CASES, ids=[n for _, n in HOSTS_CASES])
def test_check_refuses_bad_hosts_options_without_connecting(
    tmp_path: Path, no_connections: list[Any], hosts: str, needle: str
) -> None:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    text = EXPERIMENT.format(name="hosts", mode="independent").replace(TOY_HOSTS, hosts)
    assert hosts in text
    path = tmp_path / "exp.toml"
    path.write_text(text)
    code, _, stderr = run("check", str(path))
    lines = stderr.splitlines()
    assert code == 3, stderr
    assert len(lines) == 1 and needle in lines[0], stderr
    assert lines[0].startswith(f"musku: error: {path}:"), stderr  # file:line
    assert no_connections == []


@pytest.mark.parametrize("hosts", [TOY_HOSTS, AGENT, LOCAL, QSIM])
def test_good_hosts_options_pass_the_check_without_connecting(
    tmp_path: Path, no_connections: list[Any], hosts: str
) -> None:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    text = EXPERIMENT.format(name="hosts", mode="independent").replace(TOY_HOSTS, hosts)
    path = tmp_path / "exp.toml"
    path.write_text(text)
    code, stdout, stderr = run("check", str(path), "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["hosts"]["backend"] == tomllib.loads(hosts)["hosts"]["backend"]
    assert no_connections == []


# --------------------------------------------------------------------------- properties

HOST_BASES: dict[str, dict[str, Any]] = {
    "hosts-sim": {"backend": "sim", "model": "m.toml", "host_bias": 0.01, "noise_scale": 1.0},
    "hosts-agent": {
        "backend": "agent",
        "hosts": ["a", {"name": "b", "host": "10.0.0.2", "port": 2222}],
        "ssh_user": "root",
        "lease_s": 30,
        "remote_command": ["musku", "agent", "rpc"],
    },
    "hosts-local": {"backend": "local", "settle_s": 1.0, "workload": "builtin", "madvise": True},
    "hosts-qsim": {"backend": "qsim", "model": "q.toml", "qps": 100.0, "noise": 0.02},
}
MODEL_BASES = {
    "experiment": "experiment",
    "catalog": "catalog",
    "vm-catalog": "catalog",
    "sim-model": "sim-model",
    "agent-config": "agent-config",
}
PROPERTY_KINDS = sorted([*MODEL_BASES, *HOST_BASES])


@pytest.mark.parametrize("kind", PROPERTY_KINDS)
def test_generated_documents_validate_or_give_one_clean_error(tmp_path: Path, kind: str) -> None:
    """Through the models alone (no platform, no sim model file): a generated document either
    validates, or is refused with one InputError of one line naming the file."""
    if kind in HOST_BASES:
        base = {"hosts": HOST_BASES[kind]}
        model = model_of(kind)
    else:
        base = BASES[kind]()
        model = model_of(MODEL_BASES[kind])
    path = tmp_path / "doc.toml"

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def prop(seed: int) -> None:
        text = draw(random.Random(seed), base)
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            doc = Document.read(path)
            if kind in HOST_BASES:
                hosts = doc.data.get("hosts")
                doc.validate(model, hosts, prefix=("hosts",))
            else:
                doc.validate(model)
        except InputError as exc:
            line = exc.one_line()
            assert "\n" not in line and line.startswith(str(path)), line
            assert "{at}" not in line and "{table}" not in line and "{name}" not in line, line

    prop()


def test_json_schema_of_every_kind_is_json() -> None:
    for kind in kinds():
        assert json.loads(json.dumps(json_schema(kind))) == json_schema(kind)


def test_line_numbers_take_linear_time_on_pathological_lines() -> None:
    """A line of ``[`` and spaces made the old regular expressions backtrack cubically (10 s
    for 1,000 spaces); 200,000 must now take well under a second."""
    n = 200_000
    text = f'x = 1\nnote = """\n[{" " * n}x\n"""\n[{" " * n}= 1\nk{" " * n}y\n[[a]]\nb = 2\n'
    started = time.perf_counter()
    pos = Positions(text)
    assert time.perf_counter() - started < 1.0 * slowdown()
    assert pos.line(("a", 0, "b")) == 8 and pos.line(("x",)) == 1
