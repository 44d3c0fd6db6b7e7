"""The fleet workflow end to end on real agent daemons, through the real CLI (issue 32 item 9).

Four real agent daemons (``musku.agent.daemon.run``, forked by tests/agent/helpers.py), each on
its own fake host tree with its own service process (tests/e2e/service.py: its request rate
depends on its tree's THP mode and huge pages, read by the agent's service sampler). Hosts a,
b and c are reached on their Unix sockets; host d through a real sshd in a network namespace
of its own, behind a veth pair (as tests/hosts/test_partition.py). Every step is
``python -m musku`` in a subprocess, as an operator runs it:

1. ``musku sweep`` of a pool of the four hosts (two pairs) over ``thp`` and ``shp``: the soft
   SKU is ``thp = "always"`` (30 % more requests; ``never`` and huge pages cost);
2. ``musku report``: the HTML is written, its figures are not empty;
3. ``musku sku deploy SKU --hosts b,c,d --canary 1 --wave-size 1``: canary b A/B-tested
   against production host a (better), then the waves [c], [d] (d over SSH), read back;
4. ``musku sku watch --once``: the advantage holds, exit 0;
5. a **code push**: a new build of the service program on every host (the same program, other
   constants: THP ``always`` now costs it 25 %), each service process restarted;
6. ``musku sku watch --once`` exits 7 naming the deployment;
7. ``musku sku rollback N``: every host's tree hashes as before the sweep (every file, its
   bytes and mode; every directory and link).

``MUSKU_E2E_CPU_HOG=N`` starts N busy-looping processes for the whole test (``N = 0``, the
default: none; ``cores``: one per CPU): the scenario must pass on a machine that busy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import musku
from musku.hostfs import HUGEPAGES_DIR, THP_DIR
from musku.storage import open_store
from musku.storage.store import Store
from tests.agent.helpers import config, fake_host, spawn_daemon
from tests.fixtures.sshd import needs_sshd, run_sshd
from tests.hosts.test_partition import _namespace
from tests.timing import slowdown, wait_for

pytestmark = [
    *needs_sshd,
    pytest.mark.skipif(shutil.which("ip") is None, reason="no iproute2"),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

NAMES = ("a", "b", "c", "d")  # d: over SSH, in a network namespace
SSH_HOST = "d"
SERVICE = Path(__file__).with_name("service.py")
WORKTREE = Path(musku.__file__).resolve().parent.parent
THP_FILE = THP_DIR + "/enabled"
SHP_FILE = HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages"
# the code push: the service's next build, in which THP "always" costs requests
PUSH = {"VERSION": '"v2"', "THP_FACTOR": '{"always": 0.75, "madvise": 1.0, "never": 0.8}'}


def tree_hashes(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root``: (mode, sha256 of a file's bytes / a link's target / "" for
    a directory)."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                digest = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                digest = ""
            out[str(p.relative_to(root))] = (st.st_mode, digest)
    return out


def build(version: dict[str, str]) -> str:
    """The service program's source with ``version``'s constants (a build of it)."""
    text = SERVICE.read_text()
    for name, value in version.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", text, count=1, flags=re.M)
        assert n == 1, name
    return text


@dataclass
class Host:
    name: str
    dir: Path
    root: Path
    socket: Path
    pid: int = 0
    service: subprocess.Popen[bytes] | None = None
    seed: int = 0

    @property
    def app(self) -> Path:
        return self.dir / "app" / "service.py"

    @property
    def stats(self) -> Path:
        return self.dir / "stats.json"

    def start_service(self, *, wait: bool = True) -> None:
        """Start the service build in ``app`` (and wait for its first stats)."""
        self.service = subprocess.Popen(
            [
                sys.executable,
                str(self.app),
                str(self.root) + THP_FILE,
                str(self.root) + SHP_FILE,
                str(self.stats),
                str(self.seed),
            ]
        )
        if wait:
            self.wait_service()

    def wait_service(self) -> None:
        """Wait until the running service process has written its stats."""
        assert self.service is not None
        pid = self.service.pid

        def up() -> bool:
            try:
                return bool(json.loads(self.stats.read_text())["pid"] == pid)
            except (OSError, ValueError, KeyError):
                return False

        wait_for(up, 20, poll=0.05, what=f"{self.name}'s service")

    def stop_service(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            self.service.wait(30)

    def version(self) -> str:
        return str(json.loads(self.stats.read_text())["version"])

    def thp(self) -> str:
        m = re.search(r"\[(\w+)\]", (self.root / THP_FILE.lstrip("/")).read_text())
        return m.group(1) if m else ""


@dataclass
class Scenario:
    tmp: Path
    k: float  # how much slower than an idle machine to allow for
    hosts: dict[str, Host] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # the CLI process's CPU seconds

    @property
    def db(self) -> str:
        return f"sqlite:///{self.tmp / 'results.db'}"

    def musku(self, step: str, *args: str, expect: int = 0, timeout: float = 300) -> str:
        """``python -m musku ARGS`` as an operator runs it: exit ``expect``, never a traceback;
        its standard output."""
        t0, cpu0 = time.monotonic(), _children_cpu()
        r = subprocess.run(
            [sys.executable, "-m", "musku", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.tmp,
            timeout=timeout * self.k,
        )
        self.times[step] = time.monotonic() - t0
        self.cpu[step] = _children_cpu() - cpu0
        print(f"e2e: {step}: exit {r.returncode} in {self.times[step]:.1f} s", file=sys.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == expect, (args, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        return r.stdout

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        store = open_store(self.db)
        try:
            yield store
        finally:
            store.close()

    def trees(self) -> dict[str, dict[str, tuple[int, str]]]:
        return {n: tree_hashes(h.root) for n, h in self.hosts.items()}

    def modes(self) -> dict[str, str]:
        return {n: h.thp() for n, h in self.hosts.items()}

    def push(self, version: dict[str, str]) -> None:
        """A code push: the service's new build on every host, each process restarted."""
        t0 = time.monotonic()
        text = build(version)
        for h in self.hosts.values():
            tmp = h.app.with_suffix(".new")
            tmp.write_text(text)
            os.replace(tmp, h.app)
            h.stop_service()
        for h in self.hosts.values():
            h.start_service(wait=False)
        for h in self.hosts.values():
            h.wait_service()
        self.times["push"] = time.monotonic() - t0


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (a finished CLI run included)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu_hog() -> int:
    raw = os.environ.get("MUSKU_E2E_CPU_HOG", "0").strip()
    if raw == "cores":
        return len(os.sched_getaffinity(0))
    try:
        return max(0, int(raw))
    except ValueError:
        raise ValueError(f"MUSKU_E2E_CPU_HOG must be a number or 'cores', not {raw!r}") from None


@contextlib.contextmanager
def _hog(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU (nice 0, like any other busy tenant)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _experiment(s: Scenario, server: dict[str, Any], address: str) -> Path:
    def entry(h: Host) -> str:
        fields = {"name": h.name, "socket": str(h.socket)}
        if h.name == SSH_HOST:
            fields |= {"host": address, "port": server["port"]}
        return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items()) + "}"

    k = s.k
    remote = ["env", f"PYTHONPATH={WORKTREE}", sys.executable, "-m", "musku.agent", "rpc"]
    path = s.tmp / "e2e-fleet.toml"
    path.write_text(
        '[experiment]\nname = "e2e-fleet"\n'
        '[service]\nname = "e2e"\nknobs = ["thp", "shp"]\nuses_shp = true\n'
        '[platform]\ncatalog = "firecracker-vm"\n[platform.settings]\nshp = [0, 64]\n'
        '[production]\nthp = "madvise"\nshp = 0\n'
        '[metric]\nprimary = "qps"\ndirection = "higher"\n'
        "[statistics]\nconfidence = 0.95\nmin_effect = 0.05\nwarmup_s = 0.2\n"
        "sample_interval_s = 0.05\nsample_cap = 120\nseed = 11\n"
        '[hosts]\nbackend = "agent"\n'
        f"hosts = [{', '.join(entry(h) for h in s.hosts.values())}]\n"
        f"identity_file = {json.dumps(str(server['dir'] / 'client_key'))}\n"
        f"known_hosts = {json.dumps(str(server['dir'] / 'known_hosts'))}\n"
        f"remote_command = {json.dumps(remote)}\n"
        # renewals and round trips are slower on a busy machine (docs/agent.md timeouts)
        f"lease_s = {10 * k:.1f}\nrpc_timeout_s = {30 * k:.1f}\n"
        f"connect_timeout_s = {10 * k:.1f}\n"
    )
    return path


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[tuple[Scenario, Path]]:
    hogs = _cpu_hog()
    cpus = len(os.sched_getaffinity(0))
    # the load average lags a hog started now: count the hog in from the start
    k = max(slowdown(), (os.getloadavg()[0] + hogs) / cpus, 1.0)
    s = Scenario(tmp_path, k)
    s.env = {**os.environ, "PYTHONPATH": str(WORKTREE), "MUSKU_DB": s.db}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_hog(hogs))
        ns = stack.enter_context(_namespace())
        server = stack.enter_context(
            run_sshd(
                tmp_path / "sshd",
                address=ns["address"],
                port=2222,
                wrap=["ip", "netns", "exec", ns["ns"]],
            )
        )
        for i, name in enumerate(NAMES):
            d = tmp_path / name
            fake = fake_host(d / "host")
            cfg = config(
                d,
                sample_interval_s=0.01,
                samplers={"service": {"stats_file": str(d / "stats.json")}},
            )
            h = Host(name, d, fake.root, cfg.socket, seed=i)
            h.pid = spawn_daemon(cfg, fake, timeout=20 * k)
            stack.callback(_reap, h.pid)
            h.app.parent.mkdir()
            h.app.write_text(build({}))
            s.hosts[name] = h
        for h in s.hosts.values():
            h.start_service(wait=False)
            stack.callback(h.stop_service)
        for h in s.hosts.values():
            h.wait_service()
        yield s, _experiment(s, server, ns["address"])


def _reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_sweep_report_deploy_watch_push_rollback(scenario: tuple[Scenario, Path]) -> None:
    s, exp = scenario
    before = s.trees()
    assert s.modes() == dict.fromkeys(NAMES, "madvise")

    # 1. the pool sweep: two pairs, (a, b) and (c, d); d's agent over SSH
    sweep = json.loads(s.musku("sweep", "sweep", str(exp), "--json", timeout=600))
    sku = sweep["soft_sku"]
    assert sku is not None and sku["configuration"]["thp"] == "always", sweep
    assert sku["configuration"].get("shp", 0) == 0, sku
    with s.store() as store:  # its id (the sweep's output gives the settings)
        (listed,) = store.softskus()
    assert listed.to_dict()["configuration"] == sku["configuration"], listed
    sku_id = listed.id
    assert s.trees() == before  # every host put back after the sweep

    # 2. the report of the pool sweep
    out = s.musku("report", "report", "e2e-fleet", "-o", "report.html")
    html = (s.tmp / "report.html").read_text()
    assert "wrote report.html" in out
    figures = re.findall(r'<img src="data:image/(?:svg\+xml|png);base64,([A-Za-z0-9+/=]+)"', html)
    assert len(figures) >= 3 and min(len(f) for f in figures) > 1000, len(figures)
    assert 'data-knob="thp"' in html and 'data-knob="shp"' in html

    # 3. deploy: canary b against production a, then the waves [c], [d] (d over SSH)
    dep = json.loads(
        s.musku(
            "deploy",
            "sku", "deploy", str(sku_id), "--hosts", "b,c,d", "--canary", "1",
            "--wave-size", "1", "--canary-time", "10", "--code-version", "v1", "--json",
        )
    )  # fmt: skip
    assert dep["status"] == "deployed", dep
    (canary,) = dep["canary"]
    assert canary["host"] == "b" and canary["production"] == "a"
    assert canary["decision"] == "better", canary
    assert dep["waves"] == [["c"], ["d"]]
    assert s.modes() == {"a": "madvise", "b": "always", "c": "always", "d": "always"}
    dep_id = int(dep["deployment_id"])

    # 4. the watch: still better than production host a
    watch = ["sku", "watch", str(exp), "--once", "--check-time", "10", "--json"]
    (held,) = json.loads(s.musku("watch holds", *watch, "--code-version", "v1"))
    assert held["deployment_id"] == dep_id and held["verdict"] == "holds", held

    # 5. the code push: the service's next build on every host, restarted
    s.push(PUSH)
    assert {h.version() for h in s.hosts.values()} == {"v2"}

    # 6. the watch sees the advantage gone: exit 7
    out = s.musku("watch flags", *watch, "--code-version", "v2", expect=7)
    (flagged,) = json.loads(out)
    assert flagged["deployment_id"] == dep_id and flagged["flagged"], flagged
    assert flagged["verdict"] in ("lost", "gone") and flagged["code_version"] == "v2"
    assert s.modes() == {"a": "madvise", "b": "always", "c": "always", "d": "always"}

    # 7. rollback: every host's tree as before the sweep, byte for byte
    back = json.loads(s.musku("rollback", "sku", "rollback", str(dep_id), "--json"))
    assert back["status"] == "rolled_back", back
    assert s.modes() == dict.fromkeys(NAMES, "madvise")
    after = s.trees()
    for name in NAMES:
        assert after[name] == before[name], name
    with s.store() as store:
        (d,) = store.deployments()
        watches = store.watches(d.id)
    assert d.status.value == "rolled_back" and d.applied_hosts() == ()
    assert [w.verdict for w in watches] == ["holds", flagged["verdict"]]
    assert [w.code_version for w in watches] == ["v1", "v2"]
    print(  # the figures (pytest -s): docs/fleet.md "End to end on real agents"
        "e2e: "
        + ", ".join(
            f"{step} {t:.1f} s ({s.cpu.get(step, 0.0):.1f} s CPU)" for step, t in s.times.items()
        )
        + f"; slowdown {s.k:.1f}, load {os.getloadavg()[0]:.1f}, CPU hog {_cpu_hog()}"
    )
