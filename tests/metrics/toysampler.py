"""An out-of-tree metric sampler, as a user would write one outside musku: open file handles
from the kernel's ``/proc/sys/fs/file-nr`` (``allocated  free  max``), read through the
:class:`~musku.hostfs.HostFS` it is given, so it runs on a fake host tree. Nothing in musku
names it: an agent configuration turns it on with ``[samplers."tests.metrics.toysampler:
FileHandles"]`` (tests/metrics/test_out_of_tree_sampler.py)."""

from __future__ import annotations

from typing import ClassVar

from musku.errors import InputError
from musku.hostfs import HostFS
from musku.knobs.base import Support
from musku.metrics.base import Sampler

TARGET = "tests.metrics.toysampler:FileHandles"
FILE_NR = "/proc/sys/fs/file-nr"


class FileHandles(Sampler):
    name: ClassVar[str] = "file_handles"

    def __init__(self, fs: HostFS, **options: object) -> None:
        unknown = set(options) - {"scale"}
        if unknown:
            raise InputError(f"sampler file_handles: unknown option {sorted(unknown)[0]!r}")
        super().__init__(fs, **options)
        scale = options.get("scale", 1.0)
        if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
            raise InputError("sampler file_handles: scale must be a number > 0")
        self.scale = float(scale)

    def probe(self) -> Support:
        if not self.fs.is_file(FILE_NR):
            return Support(False, f"{FILE_NR} is missing")
        return Support(True, backend="procfs")

    def _read(self) -> int:
        return int(self.fs.read_text(FILE_NR).split()[0])

    def start(self) -> None:
        self._read()

    def sample(self) -> dict[str, float]:
        return {"open_files": self._read() * self.scale}
