"""HostFS confinement (issue 29): every open resolves beneath the root in one atomic step
(``openat2`` here, the descriptor walk where the kernel lacks it: both are tested), so a
directory swapped for a symbolic link while musku writes never moves a write out of the root;
paths a request names take no link at any component; FIFOs and devices are refused unopened;
reads are capped and errors quote no content; a NUL byte is a clean InputError."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.errors import InputError
from musku.hostfs import THP_DIR, HostFS, HostFSError
from tests.timing import scaled

THP_ENABLED = THP_DIR + "/enabled"
SECRET = "root-only-secret-4242"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> str:
    if request.param == "openat2" and HostFS("/").resolver != "openat2":
        pytest.skip("this kernel has no openat2")
    return str(request.param)


def _fs(root: Path, resolver: str) -> HostFS:
    fs = HostFS(root, openat2=resolver == "openat2")
    assert fs.resolver == resolver
    return fs


def _tree(tmp: Path) -> tuple[Path, Path]:
    """A host root with THP's directory and, outside it, a look-alike directory."""
    root, outside = tmp / "root", tmp / "outside"
    (root / THP_DIR[1:]).mkdir(parents=True)
    (root / THP_ENABLED[1:]).write_text("always [madvise] never\n")
    (outside / "transparent_hugepage").mkdir(parents=True)
    (outside / "transparent_hugepage/enabled").write_text(SECRET + "\n")
    return root, outside


SWAPPER = """
import os, sys
directory, target = sys.argv[1], sys.argv[2]
link, aside = directory + ".link", directory + ".aside"
while not os.path.exists(sys.argv[3]):
    os.symlink(target, link)
    os.rename(directory, aside)
    os.rename(link, directory)  # now a link out of the root
    os.rename(directory, link)
    os.rename(aside, directory)  # the real directory again
    os.unlink(link)
"""


@contextlib.contextmanager
def swapping(directory: Path, target: Path) -> Iterator[None]:
    """A separate process swaps ``directory`` for a symbolic link to ``target`` and back, as
    fast as it can, while the body runs."""
    stop = directory.parent / "stop-swapping"
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(directory), str(target), str(stop)])
    try:
        yield
    finally:
        stop.touch()
        proc.wait(timeout=60)
        stop.unlink()
    assert proc.returncode == 0 and directory.is_dir() and not directory.is_symlink()


@pytest.mark.parametrize("relative", [False, True])
def test_a_directory_swapped_for_a_link_mid_write_never_leads_out(
    tmp_path: Path, resolver: str, relative: bool
) -> None:
    """Before: only the last component was O_NOFOLLOW; swapping a middle directory for a link
    during writes landed 42 writes outside the root in 1.75 s."""
    root, outside = _tree(tmp_path)
    fs = _fs(root, resolver)
    thp = root / THP_DIR[1:]
    target = outside / "transparent_hugepage"
    link_target = Path(os.path.relpath(target, thp.parent)) if relative else target
    written = refused = 0
    with swapping(thp, link_target):
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline or not (written and refused):
            try:
                fs.write_text(THP_ENABLED, "never")
                written += 1
            except HostFSError:
                refused += 1
            try:
                fs.atomic_replace(THP_ENABLED, b"replaced\n", backup=True)
                written += 1
            except HostFSError:
                refused += 1
            try:
                fs.mkdir(THP_DIR + "/made")
                fs.rmdir(THP_DIR + "/made")
            except HostFSError:
                refused += 1
            try:
                assert SECRET not in fs.read_text(THP_ENABLED)
            except HostFSError:
                refused += 1
            if time.monotonic() > deadline + scaled(60):  # the swapper never got to run
                break
    assert written > 0 and refused > 0, (written, refused)  # the race really ran
    assert (target / "enabled").read_text() == SECRET + "\n"
    assert sorted(p.name for p in target.iterdir()) == ["enabled"]
    assert sorted(p.name for p in outside.iterdir()) == ["transparent_hugepage"]


def test_strict_paths_refuse_a_link_at_any_component(tmp_path: Path, resolver: str) -> None:
    root, outside = _tree(tmp_path)
    fs = _fs(root, resolver)
    (root / "run").mkdir()
    (root / "run/port").write_text("4242\n")
    (root / "run/inside-link").symlink_to("port")  # even a link inside the root
    (root / "srv").symlink_to("run")
    (root / "etc").mkdir()
    (root / "etc/out").symlink_to(outside / "transparent_hugepage/enabled")
    assert fs.read_text("/run/port", strict=True) == "4242\n"
    for path in ("/run/inside-link", "/srv/port", "/etc/out"):
        with pytest.raises(HostFSError, match="symbolic link") as exc:
            fs.read_bytes(path, strict=True)
        assert SECRET not in str(exc.value)
    assert fs.read_text("/srv/port") == "4242\n"  # kernel paths: links inside the root work
    with pytest.raises(HostFSError):
        fs.read_text("/etc/out")  # ... and never out of it


def test_fifos_devices_and_directories_are_refused_unopened(tmp_path: Path, resolver: str) -> None:
    root, _ = _tree(tmp_path)
    fs = _fs(root, resolver)
    os.mkfifo(root / "fifo")  # opening it for reading would block forever
    (root / "dev").mkdir()
    for path, kind in (("/fifo", "FIFO"), ("/dev", "directory")):
        t0 = time.monotonic()
        for strict in (False, True):
            with pytest.raises(HostFSError, match=kind):
                fs.read_bytes(path, strict=strict)
        with pytest.raises(HostFSError, match=kind):
            fs.write_bytes(path, b"x")
        assert time.monotonic() - t0 < scaled(10)
    real = HostFS("/", openat2=resolver == "openat2")
    for dev in ("/dev/zero", "/dev/null"):
        with pytest.raises(HostFSError, match="device"):
            real.read_bytes(dev, strict=True)
        with pytest.raises(HostFSError, match="device"):
            real.open_regular(dev)


def test_reads_are_capped_and_quote_nothing(tmp_path: Path, resolver: str) -> None:
    root, _ = _tree(tmp_path)
    fs = _fs(root, resolver)
    (root / "big").write_text(SECRET * 100)
    with pytest.raises(HostFSError, match="larger than 64 bytes") as exc:
        fs.read_bytes("/big", limit=64)
    assert SECRET not in str(exc.value)
    assert fs.read_bytes("/big", limit=len(SECRET) * 100) == SECRET.encode() * 100
    (root / "num").write_text(SECRET * 10)
    with pytest.raises(HostFSError) as exc2:
        fs.read_int("/num")
    assert SECRET * 2 not in str(exc2.value)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=30).map(lambda s: "/" + s))
def test_any_host_path_is_a_clean_answer(
    tmp_path_factory: pytest.TempPathFactory, path: str
) -> None:
    """A NUL byte, '..', odd characters: an InputError or a HostFSError, never ValueError (a
    NUL byte was an uncaught ValueError) and never a file outside the root."""
    root = tmp_path_factory.mktemp("r")
    for openat2 in (True, False):
        fs = HostFS(root, openat2=openat2)
        for op in (fs.read_bytes, fs.exists, fs.listdir, fs.is_symlink):
            with contextlib.suppress(InputError, HostFSError):
                op(path)
        with contextlib.suppress(InputError, HostFSError):
            fs.write_bytes(path, b"1")
    assert [p.name for p in root.iterdir()] == []


def test_nul_byte_is_an_input_error(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    for op in (fs.read_bytes, fs.exists, fs.listdir, fs.mkdir):
        with pytest.raises(InputError, match="NUL"):
            op("/sys/a\0b")
    with pytest.raises(InputError, match="NUL"):
        fs.atomic_replace("/etc/\0", b"")
