"""Transparent huge pages: ``transparent_hugepage/enabled`` and ``defrag``.

Both attributes read back in the kernel's choice format (``always [madvise] never``); a store
takes one bare word. The knob value is the ``enabled`` mode (``always | madvise | never``).
``defrag`` follows it by default (option ``defrag="follow"``); ``defrag="keep"`` leaves it alone,
and any mode the kernel lists (``defer``, ``defer+madvise``...) pins it to that mode.
"""

from __future__ import annotations

from musku.domain import Value
from musku.hostfs import THP_DIR
from musku.knob_spec import Kind, KnobSpec
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import bracketed, opt_str

MODES = ("always", "madvise", "never")
ENABLED = THP_DIR + "/enabled"
DEFRAG = THP_DIR + "/defrag"


SPEC = KnobSpec(
    name="thp",
    fake_kernel="musku.testing.kernel.thp:RULES",
    kind=Kind.CHOICE,
    order=60,
    description="transparent huge pages: always, madvise or never",
)


class ThpKnob(KnobBase):
    name = "thp"
    spec = SPEC

    @property
    def defrag_policy(self) -> str:
        return opt_str(self.options, "defrag", "follow")

    def probe(self) -> Support:
        if not self.fs.exists(ENABLED):
            return Support(False, f"no {ENABLED}: kernel built without CONFIG_TRANSPARENT_HUGEPAGE")
        active, choices = bracketed(self.fs.read_text(ENABLED))
        if not active:
            return Support(False, f"{ENABLED} is not in the kernel's '[active]' format")
        settings = tuple(m for m in MODES if m in choices)
        details: dict[str, object] = {"enabled": active}
        if self.fs.exists(DEFRAG):
            details["defrag"] = bracketed(self.fs.read_text(DEFRAG))[0]
            policy = self.defrag_policy
            if policy not in ("follow", "keep"):
                _, dchoices = bracketed(self.fs.read_text(DEFRAG))
                if policy not in dchoices:
                    return Support(
                        False,
                        f"defrag option {policy!r} is not offered by this kernel "
                        f"({', '.join(dchoices)})",
                    )
        return Support(True, backend="sysfs", details=details, settings=settings)

    def read(self) -> Value:
        active, _ = bracketed(self.fs.read_text(ENABLED))
        if not active:
            raise KnobError(f"thp: cannot parse {ENABLED}")
        return active

    def validate(self, value: Value) -> Value:
        support = self.probe()
        allowed = support.settings if support.supported else MODES
        if not isinstance(value, str) or value not in allowed:
            raise InvalidSetting(
                f"thp: {value!r} is not one of {', '.join(str(a) for a in allowed)}"
            )
        return value

    def _defrag_target(self, value: str) -> str | None:
        policy = self.defrag_policy
        if policy == "keep" or not self.fs.exists(DEFRAG):
            return None
        return value if policy == "follow" else policy

    def plan(self, value: Value) -> list[Write]:
        value = str(value)
        writes: list[Write] = []
        if self.read() != value:
            writes.append(Write(ENABLED, value.encode()))
        target = self._defrag_target(value)
        if target is not None and bracketed(self.fs.read_text(DEFRAG))[0] != target:
            writes.append(Write(DEFRAG, target.encode()))
        return writes

    def snapshot(self) -> Snapshot:
        files = [(ENABLED, self.fs.read_bytes(ENABLED))]
        if self.fs.exists(DEFRAG):
            files.append((DEFRAG, self.fs.read_bytes(DEFRAG)))
        return Snapshot(self.name, tuple(files))

    def restore_data(self, path: str, original: bytes) -> bytes:
        active, _ = bracketed(original.decode(errors="replace"))
        if not active:
            raise KnobError(f"thp: saved {path} has no [active] mode: cannot restore")
        return active.encode()
