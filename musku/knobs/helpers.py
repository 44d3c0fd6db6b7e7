"""Helpers for knob authors: option parsing, the kernel's ``a [b] c`` format, MSR writes, min/max
attribute pairs, GHz conversions. Public, like :class:`musku.knobs.base.KnobBase`: an
out-of-tree knob uses them as the built-ins do."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from musku.domain import Value
from musku.errors import InputError
from musku.hostfs import HostFS
from musku.knobs.base import InvalidSetting, Write


def msr_write(path: str, reg: int, value: int, mask: int) -> Write:
    return Write(path=path, data=struct.pack("<Q", value), msr=reg, mask=mask)


def bracketed(text: str) -> tuple[str, list[str]]:
    """Parse the kernel's ``a [b] c`` choice format -> (active, choices)."""
    words = text.split()
    active = ""
    choices = []
    for w in words:
        if w.startswith("[") and w.endswith("]"):
            w = w[1:-1]
            active = w
        choices.append(w)
    return active, choices


def opt_str(options: dict[str, object], key: str, default: str) -> str:
    v = options.get(key, default)
    if not isinstance(v, str):
        raise InputError(f"knob option {key!r} must be a string, not {v!r}")
    return v


def opt_bool(options: dict[str, object], key: str, default: bool) -> bool:
    v = options.get(key, default)
    if not isinstance(v, bool):
        raise InputError(f"knob option {key!r} must be true or false, not {v!r}")
    return v


def opt_argv(options: dict[str, object], key: str, default: Sequence[str]) -> list[str]:
    """An argv list option (never a shell string)."""
    v = options.get(key, list(default))
    if isinstance(v, str) or not isinstance(v, list | tuple):
        raise InputError(
            f"knob option {key!r} must be an argv list such as ['systemctl', 'reboot']"
        )
    if not all(isinstance(a, str) and a for a in v):
        raise InputError(f"knob option {key!r}: every argument must be a non-empty string")
    return [str(a) for a in v]


def choose(value: Value, allowed: Sequence[str], knob: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidSetting(f"{knob}: {value!r} is not one of {', '.join(allowed)} on this host")
    return value


def ordered_min_max(
    min_path: str, max_path: str, cur_min: int, cur_max: int, new_min: int, new_max: int
) -> list[Write]:
    """Writes taking a (min, max) attribute pair to new values without ever storing
    min > max (the kernel refuses that): lower the floor first when the new ceiling is below
    the current floor, else raise/lower the ceiling first."""
    writes: list[Write] = []
    pair_min = [Write(min_path, str(new_min).encode())] if new_min != cur_min else []
    pair_max = [Write(max_path, str(new_max).encode())] if new_max != cur_max else []
    writes = pair_min + pair_max if new_max < cur_min else pair_max + pair_min
    return writes


def restore_min_max(
    fs: HostFS, saved: Mapping[str, str | bytes], min_path: str, max_path: str
) -> list[Write]:
    """:func:`ordered_min_max` back to a snapshot's values (none when the snapshot lacks the
    pair)."""
    if min_path not in saved or max_path not in saved:
        return []
    return ordered_min_max(
        min_path,
        max_path,
        fs.read_int(min_path),
        fs.read_int(max_path),
        int(saved[min_path].strip()),
        int(saved[max_path].strip()),
    )


def ghz_to_khz(value: float) -> int:
    return int(round(value * 1_000_000))


def khz_to_ghz(khz: int) -> float:
    return round(khz / 1_000_000, 3)


def as_ghz(value: Value, knob: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSetting(f"{knob}: takes a frequency in GHz, not {value!r}")
    if not 0 < value < 100:
        raise InvalidSetting(f"{knob}: {value!r} GHz is not a plausible frequency")
    return float(value)
