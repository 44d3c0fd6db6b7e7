"""Uncore (mesh/LLC/ring) frequency, in GHz: pinned by setting its min and max limits equal.

* **sysfs** (``intel_uncore_frequency`` driver): every ``package_XX_die_XX`` (or TPMI
  ``uncoreXX``) directory's ``min_freq_khz``/``max_freq_khz``, within its
  ``initial_min_freq_khz..initial_max_freq_khz``; the pair is written in an order that never
  stores min > max.
* **msr** (Intel, no driver): MSR_UNCORE_RATIO_LIMIT (0x620; bits 6:0 max ratio, 14:8 min
  ratio, x100 MHz) on one CPU of each package. The allowed range is the register's content when
  probed (its power-on value on a host musku has not changed, since rollback restores it) unless
  option ``range_ghz = [lo, hi]`` gives it.
* AMD: the Infinity Fabric clock is not settable at run time: typed unsupported.

``read`` returns the current ceiling (``max``), so an unpinned stock host reads as its maximum.
"""

from __future__ import annotations

from musku.domain import Value
from musku.hostfs import (
    INTEL_UNCORE,
    HostFSError,
    cpu_dir,
    msr_path,
)
from musku.knob_spec import Column, Kind, KnobSpec, Msr
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import (
    as_ghz,
    ghz_to_khz,
    khz_to_ghz,
    msr_write,
    ordered_min_max,
    restore_min_max,
)

MSR_UNCORE_RATIO_LIMIT = 0x620
UNCORE_RATIO_MASK = 0x7F7F  # bits 6:0 max ratio, 14:8 min ratio

SPEC = KnobSpec(
    name="uncore_freq",
    fake_kernel="musku.testing.kernel.uncore_freq:RULES",
    resource="uncore_ghz",
    kind=Kind.GHZ,
    order=20,
    description="uncore (LLC, memory controller) frequency, GHz",
    columns=(
        Column("uncore_freq", "float", "number"),
        Column("uncore_turbo", "bool", "is:turbo"),
    ),
    msrs=(Msr(MSR_UNCORE_RATIO_LIMIT, "MSR_UNCORE_RATIO_LIMIT", UNCORE_RATIO_MASK),),
)


class UncoreFreqKnob(KnobBase):
    name = "uncore_freq"
    spec = SPEC

    def _domains(self) -> list[str]:
        if not self.fs.is_dir(INTEL_UNCORE):
            return []
        return [
            f"{INTEL_UNCORE}/{d}"
            for d in self.fs.listdir(INTEL_UNCORE)
            if (d.startswith("package_") or d.startswith("uncore"))
            and self.fs.exists(f"{INTEL_UNCORE}/{d}/max_freq_khz")
        ]

    def _package_cpus(self) -> list[int]:
        """One online CPU per package (the MSR is package-scoped)."""
        seen: dict[int, int] = {}
        for cpu in self.fs.online_cpus():
            p = cpu_dir(cpu) + "/topology/physical_package_id"
            pkg = self.fs.read_int(p) if self.fs.exists(p) else 0
            seen.setdefault(pkg, cpu)
        return sorted(seen.values())

    def backend(self) -> str:
        return "sysfs" if self._domains() else "msr"

    def probe(self) -> Support:
        if self.fs.cpu_vendor() == "amd":
            return Support(
                False, "AMD: the Infinity Fabric (uncore) clock is not settable at run time"
            )
        if self.fs.cpu_vendor() != "intel":
            return Support(False, "uncore frequency control is Intel-only")
        doms = self._domains()
        if doms:
            lo = max(self.fs.read_int(d + "/initial_min_freq_khz") for d in doms)
            hi = min(self.fs.read_int(d + "/initial_max_freq_khz") for d in doms)
            return Support(
                True,
                backend="sysfs",
                details={
                    "min_ghz": khz_to_ghz(lo),
                    "max_ghz": khz_to_ghz(hi),
                    "domains": len(doms),
                },
            )
        cpus = self._package_cpus()
        missing = [c for c in cpus if not self.fs.has_msr(c)]
        if missing:
            return Support(
                False,
                "no intel_uncore_frequency driver and no msr device "
                f"({msr_path(missing[0])}; modprobe msr)",
            )
        ok, why = self.fs.msr_writes_allowed()
        if not ok:
            return Support(False, why)
        try:
            lo, hi = self._msr_range()
        except (HostFSError, KnobError) as exc:
            return Support(False, exc.one_line())
        return Support(
            True,
            backend="msr",
            settings=tuple(round(r / 10, 1) for r in range(lo, hi + 1)),
            details={"min_ghz": lo / 10, "max_ghz": hi / 10, "packages": len(cpus)},
        )

    def _msr_range(self) -> tuple[int, int]:
        opt = self.options.get("range_ghz")
        if opt is not None:
            if not (isinstance(opt, list | tuple) and len(opt) == 2):
                raise InvalidSetting("uncore_freq: range_ghz must be [lo, hi]")
            lo_g, hi_g = (as_ghz(v, self.name) for v in opt)
            return int(round(lo_g * 10)), int(round(hi_g * 10))
        los, his = [], []
        for cpu in self._package_cpus():
            v = self.fs.read_msr(cpu, MSR_UNCORE_RATIO_LIMIT)
            his.append(v & 0x7F)
            los.append((v >> 8) & 0x7F)
        lo, hi = max(los), min(his)
        if not 0 < lo <= hi:
            raise KnobError(f"uncore_freq: implausible MSR 0x620 ratios {lo}..{hi}")
        return lo, hi

    def read(self) -> Value:
        if self.backend() == "sysfs":
            maxes = {self.fs.read_int(d + "/max_freq_khz") for d in self._domains()}
            return khz_to_ghz(maxes.pop()) if len(maxes) == 1 else "mixed"
        his = {self.fs.read_msr(c, MSR_UNCORE_RATIO_LIMIT) & 0x7F for c in self._package_cpus()}
        return round(his.pop() / 10, 1) if len(his) == 1 else "mixed"

    def validate(self, value: Value) -> Value:
        support = self.probe()
        ghz = as_ghz(value, self.name)
        lo = float(str(support.details.get("min_ghz", 0)))
        hi = float(str(support.details.get("max_ghz", 0)))
        if not lo <= ghz <= hi:
            raise InvalidSetting(
                f"uncore_freq: {ghz:g} GHz is outside this host's {lo:g}..{hi:g} GHz"
            )
        if support.backend == "msr" and abs(ghz * 10 - round(ghz * 10)) > 1e-6:
            raise InvalidSetting(f"uncore_freq: {ghz:g} GHz is not a multiple of 100 MHz")
        return round(ghz, 3)

    def plan(self, value: Value) -> list[Write]:
        if self.backend() == "sysfs":
            khz = ghz_to_khz(float(value))
            writes: list[Write] = []
            for d in self._domains():
                writes += ordered_min_max(
                    d + "/min_freq_khz",
                    d + "/max_freq_khz",
                    self.fs.read_int(d + "/min_freq_khz"),
                    self.fs.read_int(d + "/max_freq_khz"),
                    khz,
                    khz,
                )
            return writes
        ratio = int(round(float(value) * 10))
        field = (ratio << 8) | ratio
        return [
            msr_write(msr_path(c), MSR_UNCORE_RATIO_LIMIT, field, UNCORE_RATIO_MASK)
            for c in self._package_cpus()
            if self.fs.read_msr(c, MSR_UNCORE_RATIO_LIMIT) & UNCORE_RATIO_MASK != field
        ]

    def snapshot(self) -> Snapshot:
        if self.backend() == "sysfs":
            files = []
            for d in self._domains():
                for name in ("min_freq_khz", "max_freq_khz"):
                    files.append((f"{d}/{name}", self.fs.read_bytes(f"{d}/{name}")))
            return Snapshot(self.name, tuple(files), extra={"backend": "sysfs"})
        return Snapshot(
            self.name,
            msrs=tuple(
                (
                    msr_path(c),
                    MSR_UNCORE_RATIO_LIMIT,
                    UNCORE_RATIO_MASK,
                    self.fs.read_msr(c, MSR_UNCORE_RATIO_LIMIT),
                )
                for c in self._package_cpus()
            ),
        )

    def rollback(self, snapshot: Snapshot) -> None:
        if snapshot.extra.get("backend") != "sysfs":
            super().rollback(snapshot)
            return
        saved = dict(snapshot.files)
        writes: list[Write] = []
        for d in self._domains():
            writes += restore_min_max(self.fs, saved, d + "/min_freq_khz", d + "/max_freq_khz")
        self._perform(writes)
