"""resctrl ``schemata``: a store with an unknown resource or domain, a non-hex,
out-of-range, non-contiguous or too short CBM fails with EINVAL and explains itself in
``info/last_cmd_status``; partial stores merge into the group's schemata."""

from __future__ import annotations

import re

from musku.hostfs import RESCTRL
from musku.testing.fakehost import (
    FakeKernelFS,
    KernelRule,
    einval,
    parse_schemata,
    schemata_text,
)


def _status(kernel: FakeKernelFS, msg: str) -> None:
    kernel.store(RESCTRL + "/info/last_cmd_status", msg + "\n")


def schemata(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    current = parse_schemata(kernel.read_text(path))
    update = parse_schemata(text)
    for res, doms in update.items():
        if res not in current:
            _status(kernel, f"Unknown or unsupported resource name '{res}'")
            raise einval(path)
        info = f"{RESCTRL}/info/{res}"
        full = int(kernel.read_value(info + "/cbm_mask"), 16)
        min_bits = kernel.read_int(info + "/min_cbm_bits")
        for dom, mask_text in doms.items():
            if dom not in current[res]:
                _status(kernel, f"Unknown domain ID {dom}")
                raise einval(path)
            try:
                mask = int(mask_text, 16)
            except ValueError:
                _status(kernel, f"Non-hex character in the mask {mask_text}")
                raise einval(path) from None
            if mask & ~full:
                _status(kernel, f"Mask out of range: {mask_text}")
                raise einval(path)
            bits = bin(mask).count("1")
            low = (mask & -mask).bit_length() - 1 if mask else 0
            if mask and (mask >> low) != (1 << bits) - 1:
                _status(kernel, f"The mask {mask_text} has non-consecutive 1-bits")
                raise einval(path)
            if bits < min_bits:
                _status(kernel, f"Need at least {min_bits} bits in the mask")
                raise einval(path)
    for res, doms in update.items():
        current[res].update(doms)
    kernel.store(
        path,
        schemata_text({r: {d: int(m, 16) for d, m in doms.items()} for r, doms in current.items()}),
    )
    _status(kernel, "ok")


RULES = (
    KernelRule(
        re.escape(RESCTRL) + r"/.+/schemata|" + re.escape(RESCTRL) + "/schemata",
        schemata,
        "resctrl schemata",
    ),
)
