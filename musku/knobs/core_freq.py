"""Core frequency cap, in GHz (or ``"turbo"``).

Backends, in order of preference:

* **cpufreq** (intel_pstate, acpi-cpufreq, amd-pstate...): every policy's ``scaling_max_freq``
  is set to the value (``scaling_min_freq`` is lowered too when it would exceed it; the pair is
  always written in an order that never stores min > max). Values must lie within
  ``cpuinfo_min_freq..cpuinfo_max_freq``. ``"turbo"`` enables turbo (intel_pstate ``no_turbo=0``
  or cpufreq ``boost=1``) and lifts the cap to ``cpuinfo_max_freq``; a numeric cap leaves the
  turbo switch as it is (the cap bounds turbo too).
* **msr** (no cpufreq driver, Intel, HWP off): the target ratio (bits 15:8 of IA32_PERF_CTL,
  0x199, x100 MHz) on every online CPU, within MSR_PLATFORM_INFO's max-efficiency..max
  non-turbo ratios. With HWP on (IA32_PM_ENABLE 0x770 bit 0) the CPU ignores IA32_PERF_CTL:
  the probe says so and the knob is unsupported. ``"turbo"`` is not offered on this backend.
"""

from __future__ import annotations

from musku.domain import Value
from musku.hostfs import (
    CPUFREQ,
    INTEL_PSTATE,
    HostFSError,
    msr_path,
)
from musku.knob_spec import Column, Kind, KnobSpec, Msr
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import (
    as_ghz,
    ghz_to_khz,
    khz_to_ghz,
    msr_write,
    opt_str,
    ordered_min_max,
    restore_min_max,
)

NO_TURBO = INTEL_PSTATE + "/no_turbo"
BOOST = CPUFREQ + "/boost"


IA32_PERF_CTL = 0x199
IA32_MISC_ENABLE = 0x1A0
MSR_PLATFORM_INFO = 0xCE
IA32_PM_ENABLE = 0x770
IA32_HWP_CAPABILITIES = 0x771
PERF_CTL_RATIO_MASK = 0xFF00  # bits 15:8 target ratio
PERF_CTL_IDA_DISENGAGE = 1 << 32  # bit 32: turbo (IDA) disengage

SPEC = KnobSpec(
    name="core_freq",
    fake_kernel="musku.testing.kernel.core_freq:RULES",
    resource="core_ghz",
    kind=Kind.GHZ,
    order=10,
    description="core frequency, GHz (or turbo)",
    columns=(Column("core_freq", "float", "number"), Column("core_turbo", "bool", "is:turbo")),
    msrs=(
        Msr(IA32_PERF_CTL, "IA32_PERF_CTL", PERF_CTL_RATIO_MASK | PERF_CTL_IDA_DISENGAGE),
        Msr(IA32_MISC_ENABLE, "IA32_MISC_ENABLE"),  # read: bit 38 turbo disable
        Msr(MSR_PLATFORM_INFO, "MSR_PLATFORM_INFO"),  # read: ratios
        Msr(IA32_PM_ENABLE, "IA32_PM_ENABLE"),  # read: bit 0 HWP enabled
        Msr(IA32_HWP_CAPABILITIES, "IA32_HWP_CAPABILITIES"),
    ),
)


class CoreFreqKnob(KnobBase):
    name = "core_freq"
    spec = SPEC

    # backend selection

    def _policies(self) -> list[str]:
        if not self.fs.is_dir(CPUFREQ):
            return []
        return [
            f"{CPUFREQ}/{d}"
            for d in self.fs.listdir(CPUFREQ)
            if d.startswith("policy") and self.fs.exists(f"{CPUFREQ}/{d}/scaling_max_freq")
        ]

    def backend(self) -> str:
        wanted = opt_str(self.options, "backend", "auto")
        if wanted not in ("auto", "cpufreq", "msr"):
            raise InvalidSetting(f"core_freq: backend must be auto, cpufreq or msr, not {wanted!r}")
        if wanted != "auto":
            return wanted
        return "cpufreq" if self._policies() else "msr"

    def _turbo_files(self) -> list[tuple[str, bool]]:
        """(path, inverted) of the turbo switch(es): intel_pstate ``no_turbo``, the global
        cpufreq ``boost``, or per-policy ``policyN/boost`` (amd-pstate on recent kernels)."""
        if self.fs.exists(NO_TURBO):
            return [(NO_TURBO, True)]
        if self.fs.exists(BOOST):
            return [(BOOST, False)]
        return [(p + "/boost", False) for p in self._policies() if self.fs.exists(p + "/boost")]

    @staticmethod
    def _is_on(data: bytes, inverted: bool) -> bool:
        return (data.strip() == b"1") != inverted

    def _turbo_on(self) -> bool | None:
        files = self._turbo_files()
        if not files:
            return None
        return all(self._is_on(self.fs.read_bytes(p), inv) for p, inv in files)

    # probe

    def probe(self) -> Support:
        if self.backend() == "cpufreq":
            pols = self._policies()
            if not pols:
                return Support(False, "no cpufreq policies (no cpufreq driver loaded)")
            lo = max(self.fs.read_int(p + "/cpuinfo_min_freq") for p in pols)
            hi = min(self.fs.read_int(p + "/cpuinfo_max_freq") for p in pols)
            driver = ""
            if self.fs.exists(pols[0] + "/scaling_driver"):
                driver = self.fs.read_value(pols[0] + "/scaling_driver")
            # a continuous range: settings stay empty (validate() decides), the range is in details
            return Support(
                True,
                backend="cpufreq",
                details={
                    "driver": driver,
                    "min_ghz": khz_to_ghz(lo),
                    "max_ghz": khz_to_ghz(hi),
                    "policies": len(pols),
                    "turbo": self._turbo_on(),
                    "turbo_switch": bool(self._turbo_files()),
                },
            )
        why = self._msr_unsupported()
        if why:
            return Support(False, why)
        lo, hi = self._msr_ratio_range()
        return Support(
            True,
            backend="msr",
            settings=tuple(round(r / 10, 1) for r in range(lo, hi + 1)),
            details={
                "min_ghz": lo / 10,
                "max_ghz": hi / 10,
                "turbo_disabled_by_bios": self._misc_turbo_disabled(),
            },
        )

    def _msr_unsupported(self) -> str:
        if self.fs.cpu_vendor() != "intel":
            return "no cpufreq driver, and IA32_PERF_CTL control is Intel-only"
        cpus = self.fs.online_cpus()
        missing = [c for c in cpus if not self.fs.has_msr(c)]
        if missing:
            return f"no cpufreq driver and no msr device ({msr_path(missing[0])}; modprobe msr)"
        ok, why = self.fs.msr_writes_allowed()
        if not ok:
            return why
        try:
            if self.fs.read_msr(cpus[0], IA32_PM_ENABLE) & 1:
                return "HWP is on (IA32_PM_ENABLE bit 0): the CPU ignores IA32_PERF_CTL"
        except HostFSError:
            pass  # no HWP MSR: a pre-Skylake CPU, PERF_CTL governs
        return ""

    def _msr_ratio_range(self) -> tuple[int, int]:
        info = self.fs.read_msr(self.fs.online_cpus()[0], MSR_PLATFORM_INFO)
        hi = (info >> 8) & 0xFF
        lo = (info >> 40) & 0xFF
        if not 0 < lo <= hi:
            raise KnobError(f"core_freq: implausible MSR_PLATFORM_INFO {info:#x}")
        return lo, hi

    def _misc_turbo_disabled(self) -> bool:
        return bool(self.fs.read_msr(self.fs.online_cpus()[0], IA32_MISC_ENABLE) & (1 << 38))

    # read / validate

    def read(self) -> Value:
        if self.backend() == "cpufreq":
            pols = self._policies()
            maxes = {self.fs.read_int(p + "/scaling_max_freq") for p in pols}
            if len(maxes) != 1:
                return "mixed"
            cur = maxes.pop()
            top = min(self.fs.read_int(p + "/cpuinfo_max_freq") for p in pols)
            if self._turbo_on() and cur >= top:
                return "turbo"
            return khz_to_ghz(cur)
        ratios = {
            (self.fs.read_msr(c, IA32_PERF_CTL) & PERF_CTL_RATIO_MASK) >> 8
            for c in self.fs.online_cpus()
        }
        if len(ratios) != 1:
            return "mixed"
        return round(ratios.pop() / 10, 1)

    def validate(self, value: Value) -> Value:
        support = self.probe()
        if value == "turbo":
            if not support.details.get("turbo_switch"):
                raise InvalidSetting("core_freq: 'turbo' is not available on this host/backend")
            return value
        ghz = as_ghz(value, self.name)
        lo, hi = (
            float(str(support.details.get("min_ghz", 0))),
            float(str(support.details.get("max_ghz", 0))),
        )
        if not lo <= ghz <= hi:
            raise InvalidSetting(
                f"core_freq: {ghz:g} GHz is outside this host's {lo:g}..{hi:g} GHz"
            )
        if support.backend == "msr" and abs(ghz * 10 - round(ghz * 10)) > 1e-6:
            raise InvalidSetting(f"core_freq: {ghz:g} GHz is not a multiple of 100 MHz")
        return round(ghz, 3)

    # plan

    def plan(self, value: Value) -> list[Write]:
        if self.backend() == "msr":
            ratio = int(round(float(value) * 10))
            return [
                msr_write(msr_path(c), IA32_PERF_CTL, ratio << 8, PERF_CTL_RATIO_MASK)
                for c in self.fs.online_cpus()
                if (self.fs.read_msr(c, IA32_PERF_CTL) & PERF_CTL_RATIO_MASK) >> 8 != ratio
            ]
        writes: list[Write] = []
        if value == "turbo":
            for path, inverted in self._turbo_files():
                if not self._is_on(self.fs.read_bytes(path), inverted):
                    writes.append(Write(path, b"0" if inverted else b"1"))
        for p in self._policies():
            cur_min = self.fs.read_int(p + "/scaling_min_freq")
            cur_max = self.fs.read_int(p + "/scaling_max_freq")
            if value == "turbo":
                new_max = self.fs.read_int(p + "/cpuinfo_max_freq")
            else:
                new_max = ghz_to_khz(float(value))
            new_min = min(cur_min, new_max)
            writes += ordered_min_max(
                p + "/scaling_min_freq", p + "/scaling_max_freq", cur_min, cur_max, new_min, new_max
            )
        return writes

    # snapshot / rollback

    def snapshot(self) -> Snapshot:
        if self.backend() == "msr":
            reg = IA32_PERF_CTL
            return Snapshot(
                self.name,
                msrs=tuple(
                    (msr_path(c), reg, PERF_CTL_RATIO_MASK, self.fs.read_msr(c, reg))
                    for c in self.fs.online_cpus()
                ),
            )
        files: list[tuple[str, bytes]] = []
        for path, _ in self._turbo_files():
            files.append((path, self.fs.read_bytes(path)))
        for p in self._policies():
            for name in ("scaling_min_freq", "scaling_max_freq"):
                files.append((f"{p}/{name}", self.fs.read_bytes(f"{p}/{name}")))
        return Snapshot(self.name, tuple(files), extra={"backend": "cpufreq"})

    def rollback(self, snapshot: Snapshot) -> None:
        if snapshot.msrs or snapshot.extra.get("backend") != "cpufreq":
            super().rollback(snapshot)
            return
        saved = dict(snapshot.files)
        switches = [(p, inv) for p, inv in self._turbo_files() if p in saved]
        # turbo was on: switch it back on before restoring a turbo-range ceiling; else after
        turbo_first = bool(switches) and all(self._is_on(saved[p], inv) for p, inv in switches)
        turbo_writes = [Write(p, saved[p].strip()) for p, _ in switches]
        writes: list[Write] = list(turbo_writes) if turbo_first else []
        for p in self._policies():
            writes += restore_min_max(
                self.fs, saved, p + "/scaling_min_freq", p + "/scaling_max_freq"
            )
        if not turbo_first:
            writes += turbo_writes
        writes = [w for w in writes if self.fs.read_bytes(w.path).strip() != w.data]
        self._perform(writes)
