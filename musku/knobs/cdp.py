"""L3 code/data prioritisation (Intel RDT CDP) through resctrl.

Needs resctrl mounted with ``-o cdp`` (``info/L3CODE`` and ``info/L3DATA`` exist). The service
runs in a resctrl group (option ``group``, default ``"musku"``; ``mkdir`` creates its
``schemata``); option ``tasks`` (a list of thread ids) moves threads into it when musku creates
it (otherwise the agent or the service manager places them).

Value ``"D:C"``: D ways for data, C ways for code, as two contiguous, non-overlapping capacity
bit masks (data at the low end of ``cbm_mask``, code at the high end), on every L3 domain. Each
side needs at least ``min_cbm_bits`` ways and ``D + C`` is the number of ways of ``cbm_mask``
(every split the SoftSKU paper sweeps, from ``1:N-1`` to ``N-1:1``).
``shareable_bits`` (ways other agents such as I/O may also use) are reported by ``probe``.
When the kernel refuses a schemata store, ``info/last_cmd_status`` says why and is reported.

``"off"``: the group is removed (its tasks return to the default group, which keeps full masks)
or, with ``remove_when_off=False``, given full masks on both sides.
"""

from __future__ import annotations

import re

from musku.domain import Value
from musku.errors import InputError
from musku.hostfs import RESCTRL, HostFSError
from musku.knob_spec import Kind, KnobSpec
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import opt_bool, opt_str

INFO = RESCTRL + "/info"
_RESERVED = {
    "info",
    "mon_groups",
    "mon_data",
    "tasks",
    "cpus",
    "cpus_list",
    "schemata",
    "mode",
    "size",
}


def _popcount(x: int) -> int:
    return bin(x).count("1")


def parse_schemata(text: str) -> dict[str, dict[int, int]]:
    """``L3CODE:0=7ff;1=7ff`` lines -> {resource: {domain: mask}} (other resources kept)."""
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        res, _, body = line.partition(":")
        doms: dict[int, int] = {}
        for item in body.split(";"):
            d, _, m = item.partition("=")
            d, m = d.strip(), m.strip()
            if d.isdigit() and re.fullmatch(r"[0-9a-fA-F]+", m):
                doms[int(d)] = int(m, 16)
        out[res.strip()] = doms
    return out


SPEC = KnobSpec(
    name="cdp",
    fake_kernel="musku.testing.kernel.cdp:RULES",
    kind=Kind.WAYS,
    order=40,
    description="code/data prioritisation: 'off' or DATA:CODE LLC ways",
)


class CdpKnob(KnobBase):
    name = "cdp"
    spec = SPEC

    @property
    def group(self) -> str:
        g = opt_str(self.options, "group", "musku")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", g) or g in _RESERVED or g.startswith("."):
            raise InputError(f"cdp: bad resctrl group name {g!r}")
        return f"{RESCTRL}/{g}"

    def probe(self) -> Support:
        if not self.fs.exists(INFO):
            reason = "no resctrl mounted at " + RESCTRL
            if not ({"rdt_a", "cat_l3"} & self.fs.cpu_flags()):
                reason = "no resctrl: CPU has no RDT cache allocation (cat_l3)"
            return Support(False, reason)
        if not (self.fs.exists(INFO + "/L3CODE") and self.fs.exists(INFO + "/L3DATA")):
            if self.fs.cpu_vendor() == "amd" or "cdp_l3" not in self.fs.cpu_flags():
                return Support(False, "no CDP: this CPU has no L3 code/data prioritisation")
            return Support(False, "no CDP: resctrl is mounted without -o cdp (remount with it)")
        try:
            ways, low, min_bits, shareable = self._geometry()
        except HostFSError as exc:
            return Support(False, exc.one_line())
        settings: list[Value] = ["off"]
        settings += [f"{d}:{ways - d}" for d in range(min_bits, ways - min_bits + 1)]
        return Support(
            True,
            backend="resctrl",
            settings=tuple(settings),
            details={
                "ways": ways,
                "min_cbm_bits": min_bits,
                "shareable_bits": hex(shareable),
                "domains": self._domains(),
                "group": self.group,
            },
        )

    def _geometry(self) -> tuple[int, int, int, int]:
        """(ways, lowest usable bit, min_cbm_bits, shareable bits) over L3CODE and L3DATA."""
        masks, mins, share = [], [], 0
        for res in ("L3CODE", "L3DATA"):
            masks.append(int(self.fs.read_value(f"{INFO}/{res}/cbm_mask"), 16))
            mins.append(self.fs.read_int(f"{INFO}/{res}/min_cbm_bits"))
            if self.fs.exists(f"{INFO}/{res}/shareable_bits"):
                share |= int(self.fs.read_value(f"{INFO}/{res}/shareable_bits"), 16)
        full = masks[0] & masks[1]
        if not full:
            raise KnobError("cdp: empty cbm_mask")
        low = (full & -full).bit_length() - 1
        return _popcount(full), low, max(mins), share

    def _domains(self) -> list[int]:
        root = parse_schemata(self.fs.read_text(RESCTRL + "/schemata"))
        return sorted(root.get("L3CODE", {}) or root.get("L3DATA", {}))

    def _masks(self, value: str) -> tuple[int, int]:
        """(data mask, code mask) for ``value`` ("off" -> full masks)."""
        ways, low, _, _ = self._geometry()
        full = ((1 << ways) - 1) << low
        if value == "off":
            return full, full
        d, c = (int(x) for x in value.split(":"))
        return ((1 << d) - 1) << low, ((1 << c) - 1) << (low + ways - c)

    def read(self) -> Value:
        if not self.fs.exists(self.group + "/schemata"):
            return "off"
        sch = parse_schemata(self.fs.read_text(self.group + "/schemata"))
        data = set(sch.get("L3DATA", {}).values())
        code = set(sch.get("L3CODE", {}).values())
        if len(data) != 1 or len(code) != 1:
            return "mixed"
        full_d, full_c = self._masks("off")
        dm, cm = data.pop(), code.pop()
        if dm == full_d and cm == full_c:
            return "off"
        return f"{_popcount(dm)}:{_popcount(cm)}"

    def validate(self, value: Value) -> Value:
        if value == "off":
            return value
        if not isinstance(value, str) or not re.fullmatch(r"\d+:\d+", value):
            raise InvalidSetting(f"cdp: takes 'off' or 'DATA:CODE' ways, not {value!r}")
        ways, _, min_bits, _ = self._geometry()
        d, c = (int(x) for x in value.split(":"))
        if d < min_bits or c < min_bits:
            raise InvalidSetting(f"cdp: {value}: each side needs at least {min_bits} way(s)")
        if d + c != ways:
            raise InvalidSetting(
                f"cdp: {value}: a split must give all {ways} ways of this L3 ({d}+{c} != {ways})"
            )
        return f"{d}:{c}"

    def _schemata_for(self, value: str) -> bytes:
        dm, cm = self._masks(value)
        doms = self._domains()
        data = ";".join(f"{d}={dm:x}" for d in doms)
        code = ";".join(f"{d}={cm:x}" for d in doms)
        return f"L3DATA:{data}\nL3CODE:{code}\n".encode()

    def plan(self, value: Value) -> list[Write]:
        value = str(value)
        exists = self.fs.exists(self.group + "/schemata")
        remove = opt_bool(self.options, "remove_when_off", True)
        if value == "off" and remove:
            return [Write(self.group, b"", op="rmdir")] if exists else []
        if value == "off" and not exists:
            return []
        if exists and self.read() == value:
            return []
        writes: list[Write] = []
        if not exists:
            writes.append(Write(self.group, b"", op="mkdir"))
        writes.append(Write(self.group + "/schemata", self._schemata_for(value)))
        if not exists:
            writes += [Write(self.group + "/tasks", str(t).encode()) for t in self._tasks()]
        return writes

    def _tasks(self) -> list[int]:
        tasks = self.options.get("tasks", [])
        if not isinstance(tasks, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tasks
        ):
            raise InputError("cdp: option tasks must be a list of thread ids")
        return [int(t) for t in tasks]

    def refused(self, w: Write, exc: HostFSError) -> KnobError:
        status = ""
        if self.fs.exists(INFO + "/last_cmd_status"):
            status = self.fs.read_value(INFO + "/last_cmd_status")
        why = f" (last_cmd_status: {status})" if status and status != "ok" else ""
        return KnobError(f"cdp: {exc.message}{why}")

    def snapshot(self) -> Snapshot:
        existed = self.fs.exists(self.group + "/schemata")
        files = (
            ((self.group + "/schemata", self.fs.read_bytes(self.group + "/schemata")),)
            if (existed)
            else ()
        )
        return Snapshot(self.name, files, extra={"group": self.group, "existed": existed})

    def rollback_extra_before(self, snapshot: Snapshot) -> None:
        group = str(snapshot.extra.get("group", self.group))
        if snapshot.extra.get("existed") and not self.fs.exists(group):
            try:
                self.fs.mkdir(group)  # re-create; the files loop restores its schemata
            except HostFSError as exc:
                raise KnobError(f"cdp: cannot re-create {group}: {exc.message}") from None

    def rollback_extra_after(self, snapshot: Snapshot) -> None:
        group = str(snapshot.extra.get("group", self.group))
        if not snapshot.extra.get("existed") and self.fs.exists(group):
            try:
                self.fs.rmdir(group)
            except HostFSError as exc:
                raise KnobError(f"cdp: cannot remove {group}: {exc.message}") from None
