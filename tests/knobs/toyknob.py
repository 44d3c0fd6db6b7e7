"""An out-of-tree knob, as a vendor would write one outside the musku package: the block
device read-ahead, ``/sys/block/<dev>/queue/read_ahead_kb`` (KiB, a non-negative integer).

Named ``"tests.knobs.toyknob:ReadaheadKnob"`` wherever musku takes a knob name; its spec
(``SPEC``) tells musku the rest: a count, ordered (a unimodal scan walks it), one integer
column ``readahead`` in the analysts' ``configurations`` view, and the fake kernel's rule for
its attribute (``KERNEL_RULES``). Nothing in musku names it.
"""

from __future__ import annotations

import re

from musku.domain import Value
from musku.knob_spec import Kind, KnobSpec
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import opt_str
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval

TARGET = "tests.knobs.toyknob:ReadaheadKnob"

SPEC = KnobSpec(
    name="readahead",
    kind=Kind.COUNT,
    order=200,  # after the built-ins
    description="block device read-ahead, KiB",
    low=0,
    high=1 << 20,
    fake_kernel="tests.knobs.toyknob:KERNEL_RULES",
)

PAGE_KB = 4


def read_ahead_store(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    """The block layer's ``read_ahead_kb`` store: a decimal number of KiB (else EINVAL),
    kept in pages, so it reads back rounded down to a multiple of the page size."""
    if not text.isdigit():
        raise einval(path)
    kernel.store(path, f"{int(text) // PAGE_KB * PAGE_KB}\n")


KERNEL_RULES = (
    KernelRule(r"/sys/block/[^/]+/queue/read_ahead_kb", read_ahead_store, "read_ahead_kb"),
)


class ReadaheadKnob(KnobBase):
    name = "readahead"
    spec = SPEC

    @property
    def path(self) -> str:
        dev = opt_str(self.options, "device", "vda")
        if "/" in dev or dev in ("", ".", ".."):
            raise InvalidSetting(f"readahead: device {dev!r} is not a block device name")
        return f"/sys/block/{dev}/queue/read_ahead_kb"

    def probe(self) -> Support:
        if not self.fs.exists(self.path):
            return Support(False, f"no {self.path}: no such block device")
        return Support(True, backend="sysfs", details={"read_ahead_kb": self.read()})

    def read(self) -> Value:
        text = self.fs.read_text(self.path).strip()
        if not text.isdigit():
            raise KnobError(f"readahead: {self.path} holds {text!r}, not a number of KiB")
        return int(text)

    def validate(self, value: Value) -> Value:
        try:
            return SPEC.check(value, cores=0, ways=0)
        except (TypeError, ValueError) as exc:
            raise InvalidSetting(f"readahead: {exc}") from None

    def plan(self, value: Value) -> list[Write]:
        if self.read() == value:
            return []
        return [Write(self.path, f"{value}\n".encode())]

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, ((self.path, self.fs.read_bytes(self.path)),))
