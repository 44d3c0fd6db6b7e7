"""Names are text, never rich markup (issue 29): a `[threading] service = "[/bold]"` made
`musku check` exit 1 (MarkupError) while `sweep --dry-run` accepted it. Every name the CLI
prints is escaped: the reproducer through the real CLI, and Hypothesis-made names through
the renderers of `check` and `experiments`."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from musku.display import print_check, print_experiment_claims
from musku.summary import check_experiment
from tests.cli.test_exit_codes import musku

ROOT = Path(__file__).resolve().parents[2]

EXP = f"""\
[experiment]
name = "{{name}}"

[service]
name = "setalgebra"
knobs = ["core_count", "thp"]

[platform]
catalog = "skylake18"

[platform.settings]
core_count = [10, 12, 14, 16, 18]

[hosts]
backend = "sim"
model = "{ROOT / "experiments" / "sim" / "midtier-skylake18.toml"}"

[threading]
cotune = true
service = "{{service}}"
"""

MARKUP = st.text(alphabet=st.sampled_from("[]/bold red:link=x@#"), min_size=1, max_size=24).filter(
    lambda s: s.strip() == s
)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    # as musku.display.make_console: no emoji codes (":o:" is a name, not a circle)
    return Console(file=buf, width=400, highlight=False, emoji=False, color_system=None), buf


def test_check_prints_a_markup_service_name(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(EXP.format(name="t[bold]", service="[/bold]"))
    proc = musku("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "t[bold]: setalgebra" in proc.stdout
    assert "co-tuned per configuration: [/bold] mid-tier" in proc.stdout


def test_check_prints_an_emoji_code_name_as_written(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(EXP.format(name=":o:", service=":smile:"))
    proc = musku("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert ":o:: setalgebra" in proc.stdout
    assert "co-tuned per configuration: :smile: mid-tier" in proc.stdout


@settings(max_examples=60, deadline=None)
@given(name=MARKUP, service=MARKUP)
def test_check_renders_any_name_verbatim(name: str, service: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "exp.toml"
        path.write_text(EXP.format(name=name, service=service))
        exp, data = check_experiment(path)
    con, buf = _console()
    print_check(con, exp, data)
    out = buf.getvalue()
    assert f"{name}: setalgebra" in out
    assert f"co-tuned per configuration: {service} mid-tier" in out


@settings(max_examples=60, deadline=None)
@given(name=MARKUP, host=MARKUP, holder=MARKUP)
def test_experiments_table_renders_any_name(name: str, host: str, holder: str) -> None:
    row = {
        "id": 1,
        "name": name,
        "status": "running",
        "hosts": [host],
        "controller": {"id": holder, "heartbeat_age_s": 3.0},
        "queue": {"queued": 1, "claimed": 0, "done": 2},
        "claims": [],
    }
    con, buf = _console()
    print_experiment_claims(con, [row])
    out = buf.getvalue()
    assert name.strip() in out and host.strip() in out and holder.strip() in out


@settings(max_examples=40, deadline=None)
@given(title=MARKUP, cell=MARKUP)
def test_narrow_tables_print_titles_and_cells_as_written(title: str, cell: str) -> None:
    """A table too wide for the console is printed as blocks: its (escaped) title and cells
    come out as written, without the escapes' backslashes."""
    from rich.markup import escape
    from rich.table import Table

    from musku.display import print_table

    buf = io.StringIO()
    con = Console(file=buf, width=30, highlight=False, color_system=None)
    t = Table("a", "b", title=escape(title))
    t.add_row("w" * 40, escape(cell))
    print_table(con, t)
    lines = buf.getvalue().splitlines()
    assert lines[0] == title
    assert f"b: {cell}" in buf.getvalue().replace("\n   ", " ")


def test_narrow_tables_keep_emoji_codes_as_text_on_any_console() -> None:
    """Found by the property above: ``:b:`` came out as an emoji in a narrow table's block
    form (rich's ``Text.from_markup`` replaces emoji codes unless told not to), even on a
    console made without emoji."""
    from rich.table import Table

    from musku.display import print_table

    for emoji in (True, False):
        buf = io.StringIO()
        con = Console(file=buf, width=30, highlight=False, color_system=None, emoji=emoji)
        t = Table("a", "b", title=":b:")
        t.add_row("w" * 40, ":o: :b:")
        print_table(con, t)
        lines = buf.getvalue().splitlines()
        assert lines[0] == ":b:"
        assert "b: :o: :b:" in buf.getvalue().replace("\n   ", " ")
