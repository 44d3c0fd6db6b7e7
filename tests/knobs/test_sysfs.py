"""The generic sysctl/sysfs knob a catalog line defines (``kind = "sysfs"``, musku.knobs.sysfs):
the knob contract on fake trees, the catalog line's validation (one line with file:line, exit
3), its registry target (another process loads it from the ``sysfs:{...}`` text the results
database stores), and the line in knobs/firecracker-vm.toml."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.errors import InputError
from musku.experiment import load_platform
from musku.knob_spec import (
    LineError,
    check_line,
    configure_knob,
    is_knob,
    spec_of,
    target_of,
    unregister_knob,
)
from musku.knobs import load_knob
from musku.knobs.base import KnobError
from musku.knobs.sysfs import ROOTS, check_path
from musku.testing.fakehost import FakeHost, vm_host
from musku.testing.knobs import KnobCase, KnobContract

ROOT = Path(__file__).resolve().parents[2]
SWAPPINESS = "/proc/sys/vm/swappiness"
SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

CATALOG = """\
[platform]
name = "sysfsvm"
vendor = "other"
cores = 2

[knobs.thp]
settings = ["always", "madvise", "never"]

[knobs.{name}]
kind = "sysfs"
{line}

[stock]
thp = "madvise"
"""


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    """Every sysfs knob a test defines is forgotten afterwards (no other test sees it)."""
    yield
    for name in ("swappiness", "shmem_thp", "dirty_ratio", "odd"):
        unregister_knob(name)


def _define(name: str, path: str, settings: list[object]) -> str:
    return configure_knob("sysfs", name, {"path": path, "settings": settings})


# --------------------------------------------------------------------------- the contract

CASES = {
    # a number under /proc/sys, on this VM's captured tree
    "swappiness-vm": ("swappiness", SWAPPINESS, [10, 60], 10, 30, True),
    # a word in the kernel's "a [b] c" format (shmem THP), on a built tree
    "shmem-choice": ("shmem_thp", SHMEM, ["never", "advise"], "advise", "always", True),
    # the attribute is absent: typed unsupported
    "absent": ("dirty_ratio", "/proc/sys/vm/dirty_ratio", [5, 20], 5, None, False),
}


class TestSysfsKnobContract(KnobContract):
    @pytest.fixture(params=sorted(CASES))
    def case(self, request: pytest.FixtureRequest, tmp_path: Path) -> KnobCase:
        name, path, values, target, other, supported = CASES[request.param]
        if request.param == "swappiness-vm":
            host = vm_host(tmp_path / "host")
        else:
            host = FakeHost(tmp_path / "host").thp()
            host.file(SHMEM, "always within_size advise [never] deny force\n")
        return KnobCase(_define(name, path, values), host, target, other, supported)


def test_reads_back_and_refuses_what_the_kernel_refuses(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).thp()
    host.file(SHMEM, "always within_size advise [never] deny force\n")
    knob = load_knob(_define("shmem_thp", SHMEM, ["never", "advise"]), host.fs())
    assert knob.read() == "never"
    knob.apply("advise")
    assert host.read(SHMEM) == "always within_size [advise] never deny force\n"
    before = host.tree()
    with pytest.raises(KnobError, match="shmem_thp"):  # the fake kernel's EINVAL
        knob.apply("sometimes")
    assert host.tree() == before
    with pytest.raises(InputError, match="shmem_thp"):  # not a word: refused before writing
        knob.apply("two words")


# --------------------------------------------------------------------------- the catalog line


def test_the_vm_catalog_defines_swappiness() -> None:
    vm = load_platform("firecracker-vm")
    assert vm.settings["swappiness"] == (10, 60)
    assert "swappiness" not in vm.stock and "swappiness" not in vm.reboot_knobs
    assert target_of("swappiness") == (
        'sysfs:{"name":"swappiness","path":"/proc/sys/vm/swappiness","type":"int"}'
    )
    assert spec_of("swappiness").is_ordered


def test_reboot_true_makes_it_a_reboot_knob(tmp_path: Path) -> None:
    line = f'path = "{SWAPPINESS}"\nsettings = [10, 60]\nreboot = true'
    (tmp_path / "c.toml").write_text(CATALOG.format(name="swappiness", line=line))
    assert load_platform(tmp_path / "c.toml").reboot_knobs == {"swappiness"}


BAD_LINES = [
    # (name, the line after kind = "sysfs", a piece of the message, the line it points at)
    ("swappiness", 'path = "/etc/passwd"\nsettings = [1]', "under /proc/sys or /sys", 11),
    ("swappiness", 'path = "/proc/sys/../etc/x"\nsettings = [1]', "plain absolute", 11),
    ("swappiness", 'path = "/sys/"\nsettings = [1]', "plain absolute", 11),
    ("swappiness", "settings = [1]", "needs 'path'", 10),
    ("swappiness", f'path = "{SWAPPINESS}"\nsettings = []', "non-empty", 12),
    ("swappiness", f'path = "{SWAPPINESS}"', "needs a non-empty 'settings'", 10),
    ("swappiness", f'path = "{SWAPPINESS}"\nsettings = [1, "a"]', "all integers or", 12),
    ("swappiness", f'path = "{SWAPPINESS}"\nsettings = [1.5]', "all integers or", 12),
    ("swappiness", f'path = "{SWAPPINESS}"\nsettings = ["a b"]', "one word", 12),
    ("swappiness", f'path = "{SWAPPINESS}"\nsettings = [10]\nreboot = "no"', "true or false", 13),
    ("shp", f'path = "{SWAPPINESS}"\nsettings = [10]', "'shp' is built in", 9),
    ("Odd-Name", f'path = "{SWAPPINESS}"\nsettings = [10]', "lower-case", 9),
]


@pytest.mark.parametrize(("name", "line", "message", "lineno"), BAD_LINES)
def test_a_bad_line_is_one_line_with_file_and_line(
    tmp_path: Path, name: str, line: str, message: str, lineno: int
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CATALOG.format(name=name, line=line))
    with pytest.raises(InputError) as info:
        load_platform(path)
    text = info.value.one_line()
    assert message in text and f"c.toml:{lineno}:" in text, text
    assert "\n" not in text


def test_a_path_only_for_sysfs_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CATALOG.format(name="shp", line="").replace('kind = "sysfs"', 'path = "/x"'))
    with pytest.raises(InputError, match=r"c.toml:10: \[knobs.shp\] path is only for kind"):
        load_platform(path)
    path.write_text(CATALOG.format(name="shp", line="").replace('"sysfs"', '"sysctl"'))
    with pytest.raises(InputError, match=r"c.toml:10:.*kind must be one of sysfs"):
        load_platform(path)


def test_one_name_one_attribute(tmp_path: Path) -> None:
    _define("swappiness", SWAPPINESS, [10])
    _define("swappiness", SWAPPINESS, [1, 10, 100])  # another platform, other settings: fine
    path = tmp_path / "c.toml"
    line = 'path = "/proc/sys/vm/dirty_ratio"\nsettings = [10]'
    path.write_text(CATALOG.format(name="swappiness", line=line))
    with pytest.raises(InputError, match=r"c.toml:9: .*'swappiness' is already sysfs:"):
        load_platform(path)


def test_check_exits_3_with_one_line(tmp_path: Path) -> None:
    line = 'path = "/dev/mem"\nsettings = [1]'
    (tmp_path / "c.toml").write_text(CATALOG.format(name="swappiness", line=line))
    (tmp_path / "exp.toml").write_text(
        '[experiment]\nname = "x"\n[service]\nname = "s"\nknobs = ["thp"]\n'
        f'[platform]\ncatalog = "{tmp_path / "c.toml"}"\n[metric]\nprimary = "mips"\n'
        '[hosts]\nbackend = "sim"\n'
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("MUSKU_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "musku", "check", str(tmp_path / "exp.toml")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 3, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "c.toml:11:" in err and "under /proc/sys or /sys" in err, err


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/.abcsyproc_-:+ \n\x00é", max_size=40))
def test_check_path_accepts_only_plain_paths_under_the_roots(path: str) -> None:
    try:
        ok = check_path(path)
    except ValueError as exc:
        assert str(exc)
        return
    assert ok == path and path.startswith(ROOTS)
    parts = path.split("/")[1:]
    assert all(p not in ("", ".", "..") for p in parts) and len(parts) >= 2
    assert not any(c.isspace() or c == "\x00" for c in path)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.floats()), max_size=4)
)
def test_settings_are_one_type_or_refused(values: list[object]) -> None:
    try:
        check_line("sysfs", {"path": SWAPPINESS, "settings": values})
    except LineError as exc:
        assert exc.key == "settings" and str(exc)
        return
    ints = all(type(v) is int for v in values)
    words = all(isinstance(v, str) and v and not any(c.isspace() for c in v) for v in values)
    assert values and (ints or words)


# --------------------------------------------------------------------------- the registry


def test_another_process_loads_it_from_its_target() -> None:
    """What the results database's ``knobs`` table stores is enough to load the knob."""
    target = target_of(_define("swappiness", SWAPPINESS, [10, 60]))
    unregister_knob("swappiness")
    assert not is_knob("swappiness")
    code = (
        "import sys\nfrom musku.knob_spec import register_knob, class_of\n"
        "spec = register_knob(sys.argv[1])\n"
        "print(spec.name, spec.kind.value, class_of(spec.name).path)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code, target], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["swappiness", "count", SWAPPINESS]


@pytest.mark.parametrize(
    "definition",
    [
        "sysfs:{",
        'sysfs:{"name":"odd","path":"/etc/shadow","type":"int"}',
        'sysfs:{"name":"odd","path":"/sys/x","type":"float"}',
        'sysfs:{"name":"odd","path":"/sys/x"}',
        'sysfs:{"name":"Odd","path":"/sys/x","type":"int"}',
    ],
)
def test_a_bad_target_is_refused_in_one_line(definition: str) -> None:
    with pytest.raises(InputError) as info:
        spec_of(definition)
    assert "\n" not in info.value.one_line()
