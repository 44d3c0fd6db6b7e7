"""THP's ``enabled``/``defrag`` (and every ``transparent_hugepage`` choice attribute): a store
takes one offered word, else EINVAL, and reads back in the ``a [b] c`` format."""

from __future__ import annotations

import re

from musku.hostfs import THP_DIR
from musku.testing.fakehost import FakeKernelFS, KernelRule, einval


def choice(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
    choices = [w.strip("[]") for w in kernel.read_text(path).split()]
    if text not in choices:
        raise einval(path)
    kernel.store(path, " ".join(f"[{c}]" if c == text else c for c in choices) + "\n")


RULES = (KernelRule(re.escape(THP_DIR) + r"/.+", choice, "thp choice"),)
