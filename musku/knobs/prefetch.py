"""Hardware prefetchers, by MSR on every online CPU (a SET bit DISABLES a prefetcher).

Intel, ``MSR_MISC_FEATURE_CONTROL`` (0x1A4; Intel's "Disclosure of H/W prefetcher control on some
Intel processors"): bit 0 L2 hardware (streamer), bit 1 L2 adjacent cache line, bit 2 DCU (L1D
next-line), bit 3 DCU IP (L1D stride). The SoftSKU paper's five configurations name the
prefetchers left ENABLED.

AMD Family 19h (Zen 3/4), ``PrefetchControl`` (MSR C000_0108, AMD PPR for Family 19h): bit 0
L1Stream, bit 1 L1Stride, bit 2 L1Region, bit 3 L2Stream, bit 5 UpDown (L2 up/down); bit 4 is
reserved and bits 6+ (aggressiveness profile on Zen 4) are never touched.

Only the bits above are written (read-modify-write through the HostFS MSR allow-list).
"""

from __future__ import annotations

from musku.domain import Value
from musku.hostfs import msr_path
from musku.knob_spec import Kind, KnobSpec, Msr
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import msr_write

L2_HW, L2_ADJ, DCU, DCU_IP = 1 << 0, 1 << 1, 1 << 2, 1 << 3
L1_STREAM, L1_STRIDE, L1_REGION, L2_STREAM, L2_UPDOWN = 1, 2, 4, 8, 32

# configuration -> DISABLE bits
INTEL_CONFIGS: dict[str, int] = {
    "all_on": 0,
    "all_off": L2_HW | L2_ADJ | DCU | DCU_IP,
    "dcu_dcuip": L2_HW | L2_ADJ,  # only DCU and DCU IP enabled
    "dcu": L2_HW | L2_ADJ | DCU_IP,  # only DCU enabled
    "l2hw_dcu": L2_ADJ | DCU_IP,  # only L2 hardware and DCU enabled
}
AMD_CONFIGS: dict[str, int] = {
    "all_on": 0,
    "all_off": L1_STREAM | L1_STRIDE | L1_REGION | L2_STREAM | L2_UPDOWN,
    "l1_only": L2_STREAM | L2_UPDOWN,
    "l2_only": L1_STREAM | L1_STRIDE | L1_REGION,
}


MSR_MISC_FEATURE_CONTROL = 0x1A4
AMD_PREFETCH_CONTROL = 0xC0000108
INTEL_PREFETCH_MASK = 0xF  # bits 0-3 (a set bit disables)
AMD_PREFETCH_MASK = 0x2F  # bits 0,1,2,3,5 (a set bit disables)

SPEC = KnobSpec(
    name="prefetch",
    kind=Kind.CHOICE,
    order=50,
    description="a named prefetcher configuration from the platform catalog",
    msrs=(
        Msr(MSR_MISC_FEATURE_CONTROL, "MSR_MISC_FEATURE_CONTROL", INTEL_PREFETCH_MASK),
        Msr(AMD_PREFETCH_CONTROL, "AMD PrefetchControl", AMD_PREFETCH_MASK),
    ),
)


class PrefetchKnob(KnobBase):
    name = "prefetch"
    spec = SPEC

    def _table(self) -> tuple[int, int, dict[str, int]] | None:
        vendor = self.fs.cpu_vendor()
        if vendor == "intel":
            return MSR_MISC_FEATURE_CONTROL, INTEL_PREFETCH_MASK, INTEL_CONFIGS
        if vendor == "amd":
            return AMD_PREFETCH_CONTROL, AMD_PREFETCH_MASK, AMD_CONFIGS
        return None

    def probe(self) -> Support:
        table = self._table()
        if table is None:
            return Support(False, "prefetcher control is known for Intel and AMD CPUs only")
        reg, _, configs = table
        cpus = self.fs.online_cpus()
        missing = [c for c in cpus if not self.fs.has_msr(c)]
        if missing:
            return Support(False, f"no msr device ({msr_path(missing[0])}; modprobe msr)")
        ok, why = self.fs.msr_writes_allowed()
        if not ok:
            return Support(False, why)
        return Support(
            True,
            backend="msr",
            settings=tuple(configs),
            details={"msr": hex(reg), "cpus": len(cpus)},
        )

    def _require(self) -> tuple[int, int, dict[str, int]]:
        table = self._table()
        if table is None:
            raise KnobError("prefetch: unsupported CPU vendor")
        return table

    def read(self) -> Value:
        reg, mask, configs = self._require()
        values = {self.fs.read_msr(c, reg) & mask for c in self.fs.online_cpus()}
        if len(values) != 1:
            return "mixed"
        bits = values.pop()
        for name, disable in configs.items():
            if disable == bits:
                return name
        return f"custom:{bits:#x}"

    def validate(self, value: Value) -> Value:
        _, _, configs = self._require()
        if not isinstance(value, str) or value not in configs:
            raise InvalidSetting(
                f"prefetch: {value!r} is not one of {', '.join(configs)} on this CPU"
            )
        return value

    def plan(self, value: Value) -> list[Write]:
        reg, mask, configs = self._require()
        bits = configs[str(value)]
        return [
            msr_write(msr_path(c), reg, bits, mask)
            for c in self.fs.online_cpus()
            if self.fs.read_msr(c, reg) & mask != bits
        ]

    def snapshot(self) -> Snapshot:
        reg, mask, _ = self._require()
        msrs = tuple(
            (msr_path(c), reg, mask, self.fs.read_msr(c, reg)) for c in self.fs.online_cpus()
        )
        return Snapshot(self.name, msrs=msrs)
