"""A reboot hook for the tests: a real executable the agent runs as ``[agent] reboot_hook``.

``hook ROOT MARKER MODE``: ``boot`` makes the fake host under ROOT boot what its
/etc/default/grub now configures (proc/cmdline and the kernel's isolated CPUs, as
:meth:`musku.testing.fakehost.FakeHost.reboot`), ``stay`` leaves the old command line (a boot
that ignored the new configuration), ``fail`` exits 1 as a refused ``systemctl reboot`` would.
Except with ``fail``, it then appends a line to MARKER: the test's "power switch" stops the
agent process and starts it again, as the reboot would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = """#!{python}
import sys
from pathlib import Path

root, marker, mode = sys.argv[1:4]
if mode == "fail":
    print("Failed to reboot: access denied", file=sys.stderr)
    sys.exit(1)
if mode == "boot":
    from musku.testing.fakehost import FakeHost

    FakeHost(root).reboot()
with open(marker, "a") as f:
    f.write("reboot\\n")
"""


def write_hook(path: Path) -> Path:
    path.write_text(SCRIPT.format(python=sys.executable))
    os.chmod(path, 0o755)
    return path


def hook_argv(hook: Path, root: Path, marker: Path, mode: str) -> list[str]:
    return [str(hook), str(root), str(marker), mode]


def reboots(marker: Path) -> int:
    return marker.read_text().count("reboot") if marker.exists() else 0
