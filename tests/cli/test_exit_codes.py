"""The CLI's bad-input behaviour: one clear line on stderr, a documented exit code, no traceback,
nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def musku(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("MUSKU_DEBUG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        cwd=cwd or ROOT,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("musku: error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


EXP = """
[experiment]
name = "cli-test"
[service]
name = "web"
knobs = ["thp"]
[platform]
catalog = "skylake18"
[hosts]
backend = "sim"
model = "sim/web-skylake18.toml"
"""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[experiment\nname = "x"', "malformed TOML"),
        (EXP.replace('knobs = ["thp"]', 'knobs = ["warp_drive"]'), "unknown knob 'warp_drive'"),
        (EXP.replace('catalog = "skylake18"', 'catalog = "vax11"'), "unknown platform 'vax11'"),
        (EXP + '[production]\nthp = "often"\n', "thp = 'often' is not in the platform's catalog"),
        (EXP + "[statistics]\nconfidence = 2\n", "confidence must be between"),
    ],
)
@pytest.mark.parametrize("command", ["check", "sweep"])
def test_bad_experiment_files(tmp_path: Path, text: str, needle: str, command: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    db = tmp_path / "results.db"
    proc = (
        musku(command, str(path), "--db", f"sqlite:///{db}")
        if command == "sweep"
        else musku(command, str(path))
    )
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert needle in line and str(path) in line
    assert not db.exists()  # nothing written


def test_usage_error_exits_2() -> None:
    proc = musku("sweep")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    proc = musku("no-such-command")
    assert proc.returncode == 2


def test_abtest_rejects_values_outside_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(EXP)
    db = tmp_path / "r.db"
    for arg, needle in [
        ("thp=sometimes", "thp=sometimes is not in platform skylake18's catalog"),
        ("turbo=on", "unknown knob 'turbo'"),
        ("cdp=6-5", "cdp=6-5"),
        ("thp", "expected KNOB=VALUE"),
    ]:
        proc = musku("abtest", str(path), "--set", arg, "--db", f"sqlite:///{db}")
        assert proc.returncode == 3, (arg, proc.stderr)
        assert needle in one_error_line(proc)
    assert not db.exists()


def test_help_and_version_are_quick_and_clean() -> None:
    proc = musku("--help")
    assert proc.returncode == 0 and "sweep" in proc.stdout
    proc = musku("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("musku ")
    # --help must not import the heavy libraries
    code = (
        "import sys; from musku.cli import app; "
        "print(','.join(m for m in ('scipy', 'statsmodels', 'sqlalchemy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
