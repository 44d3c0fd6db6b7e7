"""Outputs (`-o`, exports, figure directories) never clobber what is not a regular file: a
device, a FIFO, a symbolic link or a directory is refused with one line (exit 3) and left as it
was; `-` is standard output; a regular file or a new path is written atomically
(musku/outputs.py). Issue 29: as root, `-o /dev/full` replaced the device with a file."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from musku import outputs
from musku.errors import InputError
from tests.cli.test_exit_codes import musku, one_error_line

ExportArgs = Callable[[str, Path], list[str]]


def _report(url: str, out: Path) -> list[str]:
    return ["report", "toy", "-o", str(out), "--db", url]


def _export(url: str, out: Path) -> list[str]:
    return ["results", "toy", "--format", "csv", "--table", "samples", "-o", str(out), "--db", url]


def _figures(url: str, out: Path) -> list[str]:
    return ["report", "toy", "--format", "svg", "-o", str(out), "--db", url]


def _device(tmp_path: Path) -> Path:
    """A character device node like /dev/full (1, 7), made in the test's directory so the
    test never risks the machine's own; skipped where mknod is not allowed."""
    dev = tmp_path / "full"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod not permitted here")
    return dev


def _snapshot(path: Path) -> tuple[int, int, str | None]:
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return st.st_mode, st.st_ino, link


@pytest.mark.parametrize("command", [_report, _export], ids=["report", "export"])
@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "device", "dev-null"])
def test_non_regular_targets_are_refused_and_left_alone(
    toy_db: tuple[str, Path], tmp_path: Path, command: ExportArgs, kind: str
) -> None:
    url, _ = toy_db
    target = tmp_path / "target"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(victim)  # like /dev/stdout -> /proc/self/fd/1
    elif kind == "directory":
        target.mkdir()
    elif kind == "device":
        target = _device(tmp_path)
    else:
        target = Path("/dev/null")  # a real char device that is safe to target
    before = _snapshot(target)
    proc = musku(*command(url, target))
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert str(target) in line and "it is a" in line, line
    assert _snapshot(target) == before  # not replaced by a regular file
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_figure_directory_must_be_a_directory(
    toy_db: tuple[str, Path], tmp_path: Path, kind: str
) -> None:
    url, _ = toy_db
    target = tmp_path / "figs"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real").mkdir()
        target.symlink_to(tmp_path / "real")
    else:
        target = _device(tmp_path)
    before = _snapshot(target)
    proc = musku(*_figures(url, target))
    assert proc.returncode == 3, proc.stderr
    assert "not a directory" in one_error_line(proc)
    assert _snapshot(target) == before


def test_figure_file_inside_the_directory_is_not_clobbered(
    toy_db: tuple[str, Path], tmp_path: Path
) -> None:
    """A FIFO planted where a figure goes (`host-time.svg`) is refused, not opened (which
    would hang) nor replaced."""
    url, _ = toy_db
    figs = tmp_path / "figs"
    figs.mkdir()
    os.mkfifo(figs / "host-time.svg")
    proc = musku(*_figures(url, figs))
    assert proc.returncode == 3, proc.stderr
    assert "host-time.svg: it is a FIFO" in one_error_line(proc)
    assert stat.S_ISFIFO(os.lstat(figs / "host-time.svg").st_mode)


def test_dash_is_standard_output(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    cwd = Path(__file__).resolve().parents[2]  # where `musku` runs (tests/cli: ROOT)
    proc = musku(*_export(url, Path("-")))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("comparison_id,")
    assert proc.stdout.count("\n") > 10
    assert not (cwd / "-").exists()
    proc = musku(*_report(url, Path("-")))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().lower().startswith("<!doctype html>")
    assert proc.stdout.rstrip().endswith("</html>")
    assert not (cwd / "-").exists()


def test_regular_file_and_new_path_are_written(toy_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = toy_db
    old = tmp_path / "old.csv"
    old.write_text("stale\n")
    for out in (old, tmp_path / "new.csv"):
        proc = musku(*_export(url, out))
        assert proc.returncode == 0, proc.stderr
        assert out.read_text().startswith("comparison_id,")
        assert stat.S_ISREG(os.lstat(out).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.csv", "old.csv"]


def test_target_swapped_during_the_work_is_not_replaced(tmp_path: Path) -> None:
    """The check before the rename: a regular file replaced by a FIFO while the body ran
    stays a FIFO, and no temporary file is left."""
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def body(f: IO[bytes]) -> int:
        out.unlink()
        os.mkfifo(out)
        return f.write(b"new")

    with pytest.raises(InputError, match="it is a FIFO"):
        outputs.write_atomic(out, body)
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_failed_body_leaves_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def body(f: IO[bytes]) -> int:
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="No space left on device"):
        outputs.write_atomic(out, body)
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


@pytest.mark.parametrize("name", ["a\0b", "missing-dir/x"])
def test_unwritable_names_are_one_line(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="cannot write"):
        outputs.check_target(tmp_path / name)


def test_tune_table_output_is_checked_before_training(tmp_path: Path) -> None:
    """`musku tune train --out` (minutes of training) and the table writer itself."""
    from musku.tune.table import write_table

    fifo = tmp_path / "table.json"
    os.mkfifo(fifo)
    proc = musku("tune", "train", "setalgebra", "--out", str(fifo))
    assert proc.returncode == 3, proc.stderr
    assert "it is a FIFO" in one_error_line(proc)
    with pytest.raises(InputError, match="it is a FIFO"):
        write_table({"format": "x"}, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    write_table({"format": "x"}, tmp_path / "new" / "t.json")  # a new path: made
    assert (tmp_path / "new" / "t.json").read_text().startswith("{")
