"""Ids on the command line (issue 29): `musku abort 9223372036854775808` (OverflowError) and
`musku abort ²` (`str.isdigit` accepts it, `int` does not) exited 1; `abort` on a missing DB
file created it. Now one line, exit 3 (5 for the missing DB), nothing created; fuzzed with
Hypothesis against the rule "ASCII digits, 1..2**63-1"."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from musku.cli import MAX_ID, parse_id
from musku.errors import InputError
from musku.storage import open_store
from tests.cli.test_exit_codes import musku, one_error_line


@given(st.text(max_size=30) | st.integers(min_value=-(2**70), max_value=2**70).map(str))
@example("²")
@example("9223372036854775808")
@example("9223372036854775807")
@example("١٢")  # Arabic-Indic digits: int() takes them
@example(" 12")
@example("1_2")
@example("0012")
def test_parse_id_takes_exactly_ascii_digits_in_range(text: str) -> None:
    valid = text.isascii() and text.isdigit() and int(text) <= MAX_ID
    try:
        got = parse_id(text, "experiment")
    except InputError as exc:
        assert not valid, text
        assert "\n" not in exc.one_line()
        assert "give the experiment's id" in exc.one_line()
    else:
        assert valid, text
        assert got == int(text) and 0 <= got <= MAX_ID


@pytest.mark.parametrize("ident", ["9223372036854775808", "²", "1e3", "-0", "0x10"])
def test_abort_refuses_bad_ids_with_one_line(tmp_path: Path, ident: str) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    open_store(url).close()
    proc = musku("abort", "--db", url, "--", ident)
    assert proc.returncode == 3, proc.stderr
    assert "give the experiment's id" in one_error_line(proc)


def test_abort_on_a_missing_db_creates_nothing(tmp_path: Path) -> None:
    proc = musku("abort", "1", "--db", f"sqlite:///{tmp_path}/nope.db")
    assert proc.returncode == 5, proc.stderr
    assert "no musku database" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args", [["sku", "show", "9223372036854775808"], ["results", "9223372036854775808"]]
)
def test_huge_ids_name_nothing(tmp_path: Path, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    open_store(url).close()
    proc = musku(*args, "--db", url)
    assert proc.returncode == 3, proc.stderr
    assert "no " in one_error_line(proc)
