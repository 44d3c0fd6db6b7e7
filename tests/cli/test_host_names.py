"""Host lists are normalised before duplicates are checked (issue 29): `web-1`, `WEB-1`,
`web-1.`, ` web-1` and `web-1:22` passed as distinct hosts, so a host was paired with itself
(and `:22` reached fabric, whose raw ValueError exited 6). Now they are one host (refused as
listed twice, exit 3), a port is parsed or refused with one line; fuzzed with Hypothesis."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from musku.errors import InputError
from musku.schema.document import Refusal
from musku.schema.hosts import AgentOptions, parse_options, split_host
from tests.cli.test_exit_codes import musku, one_error_line

ROOT = Path(__file__).resolve().parents[2]

EXP = """\
[experiment]
name = "hosts"
[service]
name = "web"
knobs = ["thp"]
[platform]
catalog = "skylake18"
[hosts]
backend = "agent"
hosts = [{hosts}]
"""


def _check(tmp_path: Path, hosts: str) -> tuple[int, str, str]:
    path = tmp_path / "exp.toml"
    path.write_text(EXP.format(hosts=hosts))
    proc = musku("check", str(path))
    return (
        proc.returncode,
        proc.stdout,
        proc.stderr if proc.returncode == 0 else one_error_line(proc),
    )


@pytest.mark.parametrize("other", ["WEB-1", "web-1.", " web-1", "web-1:22", "Web-1.:22"])
def test_spellings_of_one_host_are_refused_as_listed_twice(tmp_path: Path, other: str) -> None:
    code, _, err = _check(tmp_path, f'"web-1", "{other}"')
    assert code == 3, err
    assert "host 'web-1' is listed twice" in err


def test_a_table_and_a_name_of_one_endpoint_are_one_host(tmp_path: Path) -> None:
    code, _, err = _check(tmp_path, '"web-1", { name = "front", host = "WEB-1.", port = 22 }')
    assert code == 3, err
    assert "is listed twice" in err


@pytest.mark.parametrize(
    ("hosts", "needle"),
    [
        ('"web-1:x", "web-2"', "the port must be a number in 1..65535"),
        ('"web-1:0", "web-2"', "the port must be a number in 1..65535"),
        ('"web 1", "web-2"', "is not a host name"),
        ('"", "web-2"', "must not be empty"),
        ('"[::1", "web-2"', "not an address"),
    ],
)
def test_bad_hosts_are_one_line(tmp_path: Path, hosts: str, needle: str) -> None:
    code, _, err = _check(tmp_path, hosts)
    assert code == 3, err
    assert needle in err


def test_a_port_is_parsed(tmp_path: Path) -> None:
    code, out, err = _check(tmp_path, '"web-1:2222", "WEB-2."')
    assert code == 0, err
    opts = parse_options(AgentOptions, {"hosts": ["web-1:2222", "WEB-2."]})
    assert [h if isinstance(h, str) else (h.name, h.host, h.port) for h in opts.hosts] == [
        ("web-1", "web-1", 2222),
        "web-2",
    ]


LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
NAME = st.lists(LABEL, min_size=1, max_size=3).map(".".join)


@st.composite
def spelling(draw: st.DrawFn, name: str) -> str:
    """``name`` as a user might write it: any case, a trailing dot, spaces, the SSH port."""
    text = "".join(c.upper() if draw(st.booleans()) else c for c in name)
    if draw(st.booleans()):
        text += "."
    if draw(st.booleans()):
        text += ":22"
    return draw(st.sampled_from(["", " ", "\t"])) + text + draw(st.sampled_from(["", " "]))


@given(st.data(), NAME)
def test_every_spelling_normalises_to_the_name(data: st.DataObject, name: str) -> None:
    text = data.draw(spelling(name))
    host, port = split_host(text)
    assert host == name
    assert port in (None, 22)


@given(st.data(), NAME, NAME)
def test_two_spellings_are_one_host_and_two_names_two(data: st.DataObject, a: str, b: str) -> None:
    first, second = data.draw(spelling(a)), data.draw(spelling(b))
    if a == b:
        with pytest.raises(InputError, match="is listed twice"):
            parse_options(AgentOptions, {"hosts": [first, second]})
    else:
        opts = parse_options(AgentOptions, {"hosts": [first, second]})
        assert len(opts.hosts) == 2


@given(st.text(max_size=40))
def test_any_text_is_a_host_or_one_refusal(text: str) -> None:
    try:
        host, port = split_host(text)
    except Refusal as exc:
        assert "\n" not in str(exc)
    else:
        assert host == host.strip().lower() and not host.endswith(".")
        assert host and not any(c.isspace() for c in host)
        assert port is None or 0 < port < 65536


@pytest.mark.parametrize(
    ("hosts", "needle"),
    [("web-1,WEB-1.", "host 'web-1' is listed twice"), ("web-1:22,b", "give the host's name")],
)
def test_deploy_hosts_are_normalised_before_the_db(tmp_path: Path, hosts: str, needle: str) -> None:
    proc = musku("sku", "deploy", "1", "--hosts", hosts, "--db", f"sqlite:///{tmp_path}/r.db")
    assert proc.returncode == 3, proc.stderr
    assert needle in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []  # refused before the DB is opened
