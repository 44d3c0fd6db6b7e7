"""The README's "Using it" list, run top to bottom on a fresh copy of the repository.

The commands are read from README.md (the first ``sh`` block under "## Using it"), not copied
here: a line added to the README runs here too, and one this file has no expectation for fails
the test (so nothing is skipped silently). Each runs with ``sh -c`` in a fresh copy of the
repository's tracked files (what ``git clone`` gives, with the working tree's edits), with
``musku`` on ``PATH`` running that copy's package, and a fresh ``HOME`` (so the default results
DB, ``~/.local/share/musku/results.db``, starts empty), in the README's order: the later
commands use what the earlier ones stored (``sku deploy 1`` the first sweep's soft SKU).

Expected: exit 0, or the refusal the README's comment names (``--resume`` of a finished sweep:
exit 3; a README comment saying "refused" that this file does not expect fails the test).
Explicitly handled:

- ``musku agent run`` runs until stopped: it is started, asked ``musku agent status`` with the
  same configuration until it answers, then stopped with SIGTERM (exit 0 expected). The copy's
  ``agents/agent.toml`` gets a temporary ``root`` (an empty host tree), ``state_dir`` and
  ``socket``: the README's (``/``, ``/var/lib/musku-agent``, ``/run/musku/agent.sock``) are
  this machine's real agent's, and one agent per host root is the rule (another one running
  here makes the README's refuse with exit 6, "another agent is running on host root /").
- ``services bench``, ``tune train``, ``qsim run`` need the C++ services: a fresh clone has no
  build, so they exit 4 with the one-line "is not built" refusal, unless
  ``$MUSKU_SERVICES_BUILD`` names a build holding their binaries: then they must exit 0.
  Which of the two happened is printed (``-s``).

Whole list: about 3-4 minutes on an idle 2-core machine (the two sweeps and the report are
most of it; see the table this test prints with ``-s``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.timing import scaled

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(900))]


@dataclass(frozen=True)
class Command:
    line: int  # in README.md
    text: str  # the shell command
    comment: str  # the README's comment after it


def readme_commands(text: str) -> list[Command]:
    """The ``musku ...`` lines of the first ``sh`` block under "## Using it"."""
    lines = text.splitlines()
    try:
        start = lines.index("## Using it")
    except ValueError:
        raise AssertionError("README.md has no '## Using it' section") from None
    block = next(i for i in range(start, len(lines)) if lines[i].strip() == "```sh")
    out = []
    for i in range(block + 1, len(lines)):
        if lines[i].strip() == "```":
            break
        parts = re.split(r"\s#\s", lines[i] + " ", maxsplit=1)  # " # ": the comment
        cmd, comment = parts[0], parts[1] if len(parts) > 1 else ""
        if cmd.strip():
            out.append(Command(i + 1, cmd.strip(), comment.strip()))
    return out


def test_readme_commands_are_parsed_from_the_using_it_block() -> None:
    cmds = readme_commands(README.read_text())
    assert cmds and all(c.text.startswith("musku ") for c in cmds), cmds
    assert cmds[0].text == "musku check experiments/web-skylake.toml"
    assert any(c.text.endswith("--resume") and "exit 3" in c.comment for c in cmds)


# ------------------------------------------------------------------------------ the run


@dataclass
class Env:
    repo: Path  # the fresh copy; the commands' working directory
    env: dict[str, str]
    log: list[str]

    def run(self, cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", cmd], cwd=self.repo, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _fresh_copy(dest: Path) -> None:
    """The repository's tracked files as the working tree has them (a fresh clone's content:
    no build directory, no virtualenv, no results DB)."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the working tree is not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name, follow_symlinks=False)


def _musku_bin(tmp: Path) -> Path:
    """A directory with ``musku``: the virtualenv's entry point when there is one (its
    ``PYTHONPATH`` makes it run the copy), else a script running ``python -m musku``."""
    venv = Path(sys.executable).parent
    if (venv / "musku").is_file():
        return venv
    bindir = tmp / "bin"
    bindir.mkdir()
    script = bindir / "musku"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m musku "$@"\n')
    script.chmod(0o755)
    return bindir


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("readme")
    repo, home = tmp / "repo", tmp / "home"
    repo.mkdir()
    home.mkdir()
    _fresh_copy(repo)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MUSKU_", "XDG_")) and k != "PYTHONPATH"}  # fmt: skip
    if os.environ.get("MUSKU_SERVICES_BUILD"):  # the C++ build is not part of a clone
        env["MUSKU_SERVICES_BUILD"] = os.environ["MUSKU_SERVICES_BUILD"]
    env.update(HOME=str(home), PYTHONPATH=str(repo), COLUMNS="120",
               PATH=f"{_musku_bin(tmp)}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    fresh = Env(repo, env, [])
    # the commands run the copy's package, not this checkout's
    cp = fresh.run("musku --version", scaled(60))
    assert cp.returncode == 0, cp.stderr
    where = subprocess.run([sys.executable, "-c", "import musku; print(musku.__file__)"],
                           cwd=home, env=env, capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    assert where == str(repo / "musku" / "__init__.py")
    yield fresh
    print("\n".join(fresh.log))


# ------------------------------------------------------------------------ expectations


def _ok(fresh: Env, c: Command) -> str:
    cp = fresh.run(c.text, scaled(240))
    assert cp.returncode == 0, f"README.md:{c.line}: {c.text}: exit {cp.returncode}\n{cp.stderr}"
    for out in re.findall(r"(?:-o|>)\s+(\S+)", c.text):  # what it was asked to write
        assert (fresh.repo / out).stat().st_size > 0, f"{c.text}: {out} is empty"
    return "exit 0"


def _refused(status: int, words: str) -> Callable[[Env, Command], str]:
    def check(fresh: Env, c: Command) -> str:
        assert f"exit {status}" in c.comment, f"README.md:{c.line} should say 'exit {status}'"
        cp = fresh.run(c.text, scaled(240))
        assert cp.returncode == status, f"{c.text}: exit {cp.returncode}\n{cp.stderr}"
        err = cp.stderr.strip().splitlines()
        assert len(err) == 1 and words in err[0], cp.stderr  # one line, no traceback
        return f"exit {status} (refused: {err[0]})"

    return check


def _schema(fresh: Env, c: Command) -> str:
    _ok(fresh, c)
    schema = json.loads((fresh.repo / "experiment.schema.json").read_text())
    assert schema.get("type") == "object" and "properties" in schema
    return "exit 0 (a JSON Schema)"


def _agent_run(fresh: Env, c: Command) -> str:
    """Start it, wait until ``musku agent status`` (same configuration) answers, SIGTERM."""
    cfg = fresh.repo / "agents" / "agent.toml"
    state, root = fresh.repo / "agent-state", fresh.repo / "agent-root"
    root.mkdir()  # an empty host tree: every knob and sampler says "unavailable", typed
    text = cfg.read_text()
    for key, value in (("root", root), ("state_dir", state), ("socket", state / "agent.sock")):
        text, n = re.subn(rf'(?m)^{key} = "[^"]*"', f'{key} = "{value}"', text)
        assert n == 1, f"agents/agent.toml has no {key} line"
    cfg.write_text(text)
    log = (fresh.repo / "agent.log").open("w")
    proc = subprocess.Popen(["sh", "-c", f"exec {c.text}"], cwd=fresh.repo, env=fresh.env,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + scaled(60)
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            status = fresh.run("musku agent status --config agents/agent.toml --json", scaled(30))
            if status.returncode == 0:
                break
            time.sleep(0.5)
        assert proc.poll() is None, (fresh.repo / "agent.log").read_text()
        assert status is not None and status.returncode == 0, status and status.stderr
        json.loads(status.stdout)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert rc == 0, (fresh.repo / "agent.log").read_text()
    return "answered `musku agent status`, exit 0 on SIGTERM"


SETALGEBRA = ("setalgebra/setalgebra_leaf", "setalgebra/setalgebra_midtier",
              "setalgebra/setalgebra_gen", "loadgen/musku_loadgen",
              "framework/musku_admin")  # fmt: skip


def _built(*paths: str) -> bool:
    """The C++ binaries built where musku looks for them (the copy has no build directory:
    ``$MUSKU_SERVICES_BUILD`` when set, as the commands see it)."""
    build = os.environ.get("MUSKU_SERVICES_BUILD")
    if not build:
        return False
    return all((Path(build) / p).is_file() for p in paths)


def _needs_build(*paths: str) -> Callable[[Env, Command], str]:
    def check(fresh: Env, c: Command) -> str:
        if _built(*paths):
            return _ok(fresh, c) + " (C++ services built)"
        cp = fresh.run(c.text, scaled(120))
        assert cp.returncode == 4, f"{c.text}: exit {cp.returncode}\n{cp.stderr}"
        last = cp.stderr.strip().splitlines()[-1]
        assert "is not built" in last and last.endswith("or scripts/build-services"), cp.stderr
        assert "Traceback" not in cp.stderr
        return "exit 4: not built here (the documented refusal)"

    return check


EXPECT: dict[str, Callable[[Env, Command], str]] = {
    "musku sweep experiments/web-skylake.toml --resume": _refused(3, "nothing to resume"),
    "musku schema experiment": _schema,
    "musku agent run": _agent_run,
    "musku services bench": _needs_build(*SETALGEBRA),
    "musku tune train": _needs_build(*SETALGEBRA),
    "musku qsim run": _needs_build("qsim/musku_qsim"),
}


def _expectation(c: Command) -> Callable[[Env, Command], str]:
    prefixes = [p for p in EXPECT if c.text.startswith(p)]
    if prefixes:
        return EXPECT[max(prefixes, key=len)]
    # a refusal the README promises must be expected here, not run as "exit 0"
    assert "refused" not in c.comment, f"README.md:{c.line}: no expectation for {c.text!r}"
    return _ok


def test_the_using_it_list_runs_top_to_bottom_on_a_fresh_copy(fresh: Env) -> None:
    cmds = readme_commands(README.read_text())
    used = {p for c in cmds for p in EXPECT if c.text.startswith(p)}
    assert used == set(EXPECT), f"README.md no longer has {set(EXPECT) - used}"
    t0 = time.monotonic()
    for c in cmds:
        start = time.monotonic()
        outcome = _expectation(c)(fresh, c)
        fresh.log.append(f"{time.monotonic() - start:6.1f} s  {c.text}: {outcome}")
    fresh.log.append(f"{time.monotonic() - t0:6.1f} s  the whole list ({len(cmds)} commands)")
