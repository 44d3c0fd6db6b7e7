"""Active physical core count.

The value is a number of physical cores N; the active CPUs are every hardware thread of the
first N cores (cores ordered by their lowest CPU number, so the core of cpu0 is always active).

Two modes (option ``mode``: ``"reboot"``, ``"live"``, or ``"auto"`` = reboot where
``/etc/default/grub`` exists, else live):

* **reboot** (the SoftSKU paper's method): the other cores go on the kernel command line as
  ``isolcpus=`` inside ``GRUB_CMDLINE_LINUX`` of ``/etc/default/grub``. The file is edited only
  when it has exactly one, plainly quoted ``GRUB_CMDLINE_LINUX`` (no shell expansion), replaced
  atomically after a backup (``/etc/default/grub.musku.bak``), then ``update_command``
  (default ``["update-grub"]`` on a real root) regenerates the boot configuration. The reboot
  itself is the agent's decision: :meth:`CoreCountKnob.reboot` runs ``reboot_command`` (an argv
  list, default ``["systemctl", "reboot"]``). ``verify`` passes only after the reboot, when
  the booted command line and the kernel's list of isolated CPUs show the configured set.
* **live**, for services that cannot take a reboot: the service's cpuset cgroup (option
  ``cgroup``, relative to the cpuset hierarchy: v1's cpuset mount or the v2 unified root;
  ``create_cgroup=True`` creates it) is given the active CPUs, and/or
  (``hotplug=True``, the default when no cgroup is named) the other CPUs are taken offline
  through ``cpuN/online``. cpu0 is never taken offline.
"""

from __future__ import annotations

import re
import shlex
import subprocess

from musku.domain import Value
from musku.errors import InputError
from musku.hostfs import (
    CGROUP_ROOT,
    CGROUP_V1_CPUSET,
    GRUB_DEFAULT,
    GRUB_DEFAULT_D,
    PROC_CMDLINE,
    SYS_CPU,
    HostFSError,
    cpu_dir,
    format_cpulist,
    parse_cpulist,
)
from musku.knob_spec import Kind, KnobSpec
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import opt_argv, opt_bool, opt_str

_CMDLINE_KEY = "GRUB_CMDLINE_LINUX"


class GrubFormatError(InputError):
    """/etc/default/grub is in a shape musku will not edit (nothing was written)."""


def parse_grub_cmdline(text: str) -> tuple[int, str, str]:
    """Find the one ``GRUB_CMDLINE_LINUX="..."`` line: (line index, quote char, value).

    Refuses a missing or duplicated assignment, unbalanced quotes, and values with shell
    expansions (``$``, backquotes) or escapes that musku cannot edit faithfully.
    """
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if re.match(rf"^\s*{_CMDLINE_KEY}=", line)]
    if not hits:
        raise GrubFormatError(f"{GRUB_DEFAULT} has no {_CMDLINE_KEY}= line")
    if len(hits) > 1:
        raise GrubFormatError(
            f"{GRUB_DEFAULT} sets {_CMDLINE_KEY} {len(hits)} times (lines "
            f"{', '.join(str(i + 1) for i in hits)}): edit it by hand to one assignment"
        )
    i = hits[0]
    rhs = lines[i].split("=", 1)[1].strip()
    m = re.fullmatch(r'"([^"\\$`]*)"|\'([^\']*)\'', rhs)
    if not m:
        raise GrubFormatError(
            f"{GRUB_DEFAULT}:{i + 1}: {_CMDLINE_KEY} is not one plainly quoted string "
            f"(unbalanced quotes, escapes or shell expansions): {rhs!r}"
        )
    if m.group(1) is not None:
        return i, '"', m.group(1)
    return i, "'", m.group(2)


def isolcpus_of(cmdline: str) -> list[int] | None:
    """The CPUs of an ``isolcpus=[flags,]list`` word of a command line (None when absent)."""
    for word in cmdline.split():
        if word.startswith("isolcpus="):
            parts = [p for p in word.split("=", 1)[1].split(",") if p and not p[0].isalpha()]
            try:
                return parse_cpulist(",".join(parts))
            except ValueError:
                raise GrubFormatError(f"cannot parse the CPU list of {word!r}") from None
    return None


def set_isolcpus(cmdline: str, cpus: list[int]) -> str:
    """``cmdline`` with its isolcpus word replaced (flags kept), added, or removed if empty."""
    words = cmdline.split()
    flags: list[str] = []
    out: list[str] = []
    for w in words:
        if w.startswith("isolcpus="):
            flags = [p for p in w.split("=", 1)[1].split(",") if p and p[0].isalpha()]
        else:
            out.append(w)
    if cpus:
        out.append("isolcpus=" + ",".join([*flags, format_cpulist(cpus)]))
    return " ".join(out)


SPEC = KnobSpec(
    name="core_count",
    fake_kernel="musku.testing.kernel.core_count:RULES",
    resource="cores",
    kind=Kind.COUNT,
    order=30,
    description="active physical cores",
    low=1,
    high_is_cores=True,
    live_mechanism=True,
)


class CoreCountKnob(KnobBase):
    name = "core_count"
    spec = SPEC

    # options

    @property
    def mode(self) -> str:
        mode = opt_str(self.options, "mode", "auto")
        if mode not in ("auto", "reboot", "live"):
            raise InputError(f"core_count: mode must be auto, reboot or live, not {mode!r}")
        if mode == "auto":
            return "reboot" if self.fs.exists(GRUB_DEFAULT) else "live"
        return mode

    @property
    def cgroup(self) -> str | None:
        cg = self.options.get("cgroup")
        if cg is None:
            return None
        if not isinstance(cg, str) or not cg.strip("/"):
            raise InputError("core_count: cgroup must be a cgroup path such as 'musku/svc'")
        parts = cg.strip("/").split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise InputError(f"core_count: bad cgroup path {cg!r}")
        return "/".join(parts)

    @property
    def hotplug(self) -> bool:
        return opt_bool(self.options, "hotplug", self.cgroup is None)

    def _cgroup_dir(self) -> tuple[str, int] | None:
        cg = self.cgroup
        if cg is None:
            return None
        version = opt_str(self.options, "cgroup_version", "auto")
        if version == "auto":
            version = "1" if self.fs.exists(CGROUP_V1_CPUSET + "/cpuset.cpus") else "2"
        if version == "1":
            return f"{CGROUP_V1_CPUSET}/{cg}", 1
        if version == "2":
            return f"{CGROUP_ROOT}/{cg}", 2
        raise InputError(f"core_count: cgroup_version must be auto, 1 or 2, not {version!r}")

    # topology

    def cores(self) -> list[list[int]]:
        """Physical cores (lists of their CPUs), ordered by lowest CPU number."""
        by_core: dict[tuple[int, int], list[int]] = {}
        for cpu in self.fs.present_cpus():
            topo = cpu_dir(cpu) + "/topology"
            if self.fs.exists(topo + "/core_id"):
                key = (
                    self.fs.read_int(topo + "/physical_package_id"),
                    self.fs.read_int(topo + "/core_id"),
                )
            else:
                key = (0, cpu)
            by_core.setdefault(key, []).append(cpu)
        return sorted((sorted(c) for c in by_core.values()), key=lambda c: c[0])

    def active_cpus(self, n: int) -> list[int]:
        return sorted(cpu for core in self.cores()[:n] for cpu in core)

    def _count(self, cpus: set[int]) -> int:
        return sum(1 for core in self.cores() if set(core) & cpus)

    # contract

    def probe(self) -> Support:
        if not self.fs.exists(SYS_CPU + "/present"):
            return Support(False, f"no {SYS_CPU}/present")
        ncores = len(self.cores())
        settings = tuple(range(1, ncores + 1))
        if self.mode == "reboot":
            if not self.fs.exists(GRUB_DEFAULT):
                return Support(False, f"reboot mode needs {GRUB_DEFAULT} (GRUB)")
            if self.fs.is_symlink(GRUB_DEFAULT):
                return Support(False, f"{GRUB_DEFAULT} is a symbolic link: musku will not edit it")
            try:
                parse_grub_cmdline(self.fs.read_text(GRUB_DEFAULT))
            except GrubFormatError as exc:
                return Support(False, exc.one_line())
            override = self._grub_override()
            if override:
                return Support(
                    False,
                    f"{override} also sets {_CMDLINE_KEY} (sourced after {GRUB_DEFAULT}): "
                    "musku will not edit a command line it does not own",
                )
            return Support(
                True, backend="isolcpus", settings=settings, reboot=True, details={"cores": ncores}
            )
        details: dict[str, object] = {"cores": ncores}
        backends = []
        cg = self._cgroup_dir()
        if cg is not None:
            path, version = cg
            parent = path.rsplit("/", 1)[0]
            if version == 1 and not self.fs.exists(CGROUP_V1_CPUSET + "/cpuset.cpus"):
                return Support(False, "no cpuset cgroup v1 hierarchy mounted")
            if version == 2:
                if not self.fs.exists(CGROUP_ROOT + "/cgroup.controllers"):
                    return Support(False, "no cgroup v2 hierarchy mounted")
                ctl = parent + "/cgroup.subtree_control"
                if not self.fs.exists(ctl) or "cpuset" not in self.fs.read_text(ctl).split():
                    return Support(
                        False,
                        f"cpuset controller not enabled for {self.cgroup!r} "
                        "(add +cpuset to its parent's cgroup.subtree_control)",
                    )
            if not self.fs.exists(path):
                if not opt_bool(self.options, "create_cgroup", False):
                    return Support(False, f"cgroup {self.cgroup!r} does not exist")
                if not self.fs.exists(parent):
                    return Support(False, f"parent cgroup of {self.cgroup!r} does not exist")
            backends.append(f"cpuset-v{version}")
            details["cgroup"] = path
        if self.hotplug:
            hot = [c for c in self.fs.present_cpus() if self.fs.exists(cpu_dir(c) + "/online")]
            if not hot:
                return Support(False, "CPU hotplug unavailable (no cpuN/online files)")
            backends.append("hotplug")
            # a core can only go offline if all its CPUs are hot-pluggable (cpu0's core never)
            details["hotplug_cpus"] = format_cpulist(hot)
        if not backends:
            return Support(False, "live mode needs a cgroup or hotplug=True")
        return Support(True, backend="+".join(backends), settings=settings, details=details)

    def read(self) -> Value:
        if self.mode == "reboot":
            isolated = set(self.fs.read_cpulist(SYS_CPU + "/isolated"))
            online = set(self.fs.online_cpus())
            return self._count(online - isolated)
        cg = self._cgroup_dir()
        if cg is not None and self.fs.exists(cg[0] + "/cpuset.cpus"):
            cpus = self._cgroup_cpus(cg[0])
            if cpus:
                return self._count(set(cpus))
        return self._count(set(self.fs.online_cpus()))

    def _cgroup_cpus(self, path: str) -> list[int]:
        return self.fs.read_cpulist(path + "/cpuset.cpus")

    def validate(self, value: Value) -> Value:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetting(f"core_count: takes a number of cores, not {value!r}")
        ncores = len(self.cores())
        if not 1 <= value <= ncores:
            raise InvalidSetting(f"core_count: {value} is outside 1..{ncores} on this host")
        if self.mode == "live" and self.hotplug:
            hot = {c for c in self.fs.present_cpus() if self.fs.exists(cpu_dir(c) + "/online")}
            for core in self.cores()[value:]:
                if 0 in core or not set(core) <= hot:
                    raise InvalidSetting(
                        f"core_count: cannot offline CPUs {format_cpulist(core)}"
                        " (not hot-pluggable)"
                    )
        return value

    def plan(self, value: Value) -> list[Write]:
        n = int(value)
        active = self.active_cpus(n)
        if self.mode == "reboot":
            return self._plan_grub(active)
        return self._plan_live(active)

    def _desired_isolated(self, active: list[int]) -> list[int]:
        return sorted(set(self.fs.present_cpus()) - set(active))

    def _plan_grub(self, active: list[int]) -> list[Write]:
        text = self.fs.read_text(GRUB_DEFAULT)
        i, quote, value = parse_grub_cmdline(text)
        isolated = self._desired_isolated(active)
        if (isolcpus_of(value) or []) == isolated:
            return []
        new_value = set_isolcpus(value, isolated)
        lines = text.split("\n")
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i] = f"{indent}{_CMDLINE_KEY}={quote}{new_value}{quote}"
        return [Write(GRUB_DEFAULT, "\n".join(lines).encode(), op="replace")]

    def _plan_live(self, active: list[int]) -> list[Write]:
        want = set(active)
        online_now = set(self.fs.online_cpus())
        bring_up: list[Write] = []
        take_down: list[Write] = []
        if self.hotplug:
            for cpu in self.fs.present_cpus():
                path = cpu_dir(cpu) + "/online"
                if cpu == 0 or not self.fs.exists(path):
                    continue
                if cpu in want and cpu not in online_now:
                    bring_up.append(Write(path, b"1"))
                elif cpu not in want and cpu in online_now:
                    take_down.append(Write(path, b"0"))
        cgroup_writes: list[Write] = []
        cg = self._cgroup_dir()
        if cg is not None:
            path, version = cg
            cpus_file = path + ("/cpuset.cpus")
            if not self.fs.exists(path):
                cgroup_writes.append(Write(path, b"", op="mkdir"))
                if version == 1:
                    parent = path.rsplit("/", 1)[0]
                    mems = self.fs.read_value(parent + "/cpuset.mems")
                    cgroup_writes.append(Write(path + "/cpuset.mems", mems.encode()))
                cgroup_writes.append(Write(cpus_file, format_cpulist(active).encode()))
            elif set(self._cgroup_cpus(path)) != want:
                cgroup_writes.append(Write(cpus_file, format_cpulist(active).encode()))
        # grow: CPUs online before the cgroup may use them; shrink: cgroup first, then offline
        return bring_up + cgroup_writes + take_down

    def verify(self, value: Value) -> bool:
        value = self.validate(value)
        if self.plan(value):
            return False
        if self.mode == "reboot":
            isolated = self._desired_isolated(self.active_cpus(int(value)))
            running = self.fs.read_cpulist(SYS_CPU + "/isolated")
            booted = isolcpus_of(self.fs.read_text(PROC_CMDLINE)) or []
            return running == isolated and booted == isolated
        return True

    def _grub_override(self) -> str:
        """A grub.d snippet that assigns GRUB_CMDLINE_LINUX (it would win over our edit)."""
        if not self.fs.is_dir(GRUB_DEFAULT_D):
            return ""
        for name in self.fs.listdir(GRUB_DEFAULT_D):
            path = f"{GRUB_DEFAULT_D}/{name}"
            if name.endswith(".cfg") and self.fs.is_file(path):
                text = self.fs.read_text(path)
                if re.search(rf"^\s*{_CMDLINE_KEY}=", text, re.M):
                    return path
        return ""

    def pending_reboot(self) -> bool:
        """Reboot mode: the configured command line is not the one the kernel booted with."""
        if self.mode != "reboot":
            return False
        _, _, value = parse_grub_cmdline(self.fs.read_text(GRUB_DEFAULT))
        booted = isolcpus_of(self.fs.read_text(PROC_CMDLINE)) or []
        return (isolcpus_of(value) or []) != booted

    def snapshot(self) -> Snapshot:
        files: list[tuple[str, bytes]] = []
        extra: dict[str, object] = {"mode": self.mode}
        if self.mode == "reboot":
            files.append((GRUB_DEFAULT, self.fs.read_bytes(GRUB_DEFAULT)))
            return Snapshot(self.name, tuple(files), extra=extra)
        cg = self._cgroup_dir()
        if cg is not None:
            existed = self.fs.exists(cg[0])
            extra["cgroup"] = cg[0]
            extra["cgroup_created"] = not existed
            if existed:
                files.append((cg[0] + "/cpuset.cpus", self.fs.read_bytes(cg[0] + "/cpuset.cpus")))
        if self.hotplug:
            for cpu in self.fs.present_cpus():
                path = cpu_dir(cpu) + "/online"
                if cpu != 0 and self.fs.exists(path):
                    files.append((path, self.fs.read_bytes(path)))
        return Snapshot(self.name, tuple(files), extra=extra)

    def restore_is_replace(self, path: str) -> bool:
        return path == GRUB_DEFAULT

    def restore_data(self, path: str, original: bytes) -> bytes:
        if path == GRUB_DEFAULT:
            return original
        return original.strip() or b"\n"

    def rollback_extra_after(self, snapshot: Snapshot) -> None:
        created = snapshot.extra.get("cgroup_created")
        path = snapshot.extra.get("cgroup")
        if created and isinstance(path, str) and self.fs.exists(path):
            try:
                self.fs.rmdir(path)
            except HostFSError as exc:
                raise KnobError(f"core_count: cannot remove cgroup {path}: {exc.message}") from None

    def _perform(self, writes: list[Write]) -> None:
        super()._perform(writes)
        if any(w.path == GRUB_DEFAULT for w in writes):
            self._run("update_command", self._default_update())

    def rollback(self, snapshot: Snapshot) -> None:
        grub_before = self.fs.read_bytes(GRUB_DEFAULT) if self.fs.exists(GRUB_DEFAULT) else None
        super().rollback(snapshot)
        if grub_before is not None and self.fs.read_bytes(GRUB_DEFAULT) != grub_before:
            self._run("update_command", self._default_update())

    def _default_update(self) -> list[str]:
        return ["update-grub"] if str(self.fs.root) == "/" else []

    def reboot(self) -> None:
        """Run the configured reboot hook (argv list, no shell)."""
        self._run("reboot_command", ["systemctl", "reboot"])

    def _run(self, option: str, default: list[str]) -> None:
        argv = opt_argv(self.options, option, default)
        if not argv:
            return
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KnobError(f"core_count: {shlex.join(argv)} failed: {exc}") from None
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise KnobError(f"core_count: {shlex.join(argv)} exited {proc.returncode}: {last[0]}")
