"""Co-tuning end to end over REAL SSH: an sshd on loopback, two agent daemons (each on its own
fake host tree for the knobs) and two REAL Set Algebra deployments (leaf + mid-tier each), one
per host, each host's mid-tier named in ``[hosts]`` (``midtier_admin_port_file``). An apply
through ``open_pair`` trains each host's threading table on its own mid-tier and puts it on
``auto``; the pair reports what each side runs; restore puts both mid-tiers back on the
threading they had. Bad per-host mid-tier addresses are one-line input errors before any host
is touched."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.agent.cotune import AdminEndpoint
from musku.domain import Configuration
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.services import runtime
from musku.tune.cotune import ThreadingState
from tests.agent.helpers import THP, config, fake_host, spawn_daemon
from tests.fixtures.sshd import agent_hosts_toml, needs_sshd
from tests.services import servers

pytestmark = [*needs_sshd, pytest.mark.slow, pytest.mark.services]

servers.skip_unless_built(*servers.SETALGEBRA)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Path], Path]]:
    """Two one-leaf Set Algebra deployments on a small index: (their mid-tiers' port files,
    the queries)."""
    d = tmp_path_factory.mktemp("sa-ssh")
    index, queries = runtime.setalgebra_data(d / "data", docs=5000, terms=300, queries=200, seed=5)
    procs, port_files = [], []
    try:
        for name in ("a", "b"):
            port_files.append(servers.start_setalgebra(d, index, procs, name))
        yield port_files, queries
    finally:
        servers.stop_all(procs)


def running(s: ThreadingState) -> tuple:
    return s.model, s.pollers, s.workers, s.responders, s.auto_mode


def _experiment(tmp: Path, sshd: dict, hosts: list[dict], queries: Path) -> Path:
    p = tmp / "exp.toml"
    p.write_text(
        '[experiment]\nname = "ssh-cotune"\n[service]\nname = "setalgebra"\nknobs = ["thp"]\n'
        '[platform]\ncatalog = "firecracker-vm"\n[metric]\nprimary = "qps"\n'
        + agent_hosts_toml(sshd, hosts, sshd["dir"] / "known_hosts", lease_s=30)
        + "[threading]\ncotune = true\nloads = [150]\nworkers = [1]\n"
        'models = ["sync-inline-block", "async-dispatch-block"]\n'
        f"duration_s = 0.5\nwarmup_s = 0.1\nload_data = {json.dumps(str(queries))}\n"
    )
    return p


def test_each_host_cotunes_its_own_midtier_over_ssh(
    tmp_path: Path, sshd: dict, deployments: tuple[list[Path], Path]
) -> None:
    from musku.hosts.agent import open_pair

    port_files, queries = deployments
    mids = [AdminEndpoint(admin_port_file=str(p)) for p in port_files]
    # host b's mid-tier starts on another threading than a's: restore must give each its own
    mids[1].set_fixed(ThreadingState("sync-dispatch-block", 1, 1, 0))
    start = [m.get() for m in mids]
    assert start[0] != start[1] and not any(s.auto_mode for s in start)

    agents, hosts_opt = [], []
    for name, port_file in zip(("a", "b"), port_files, strict=True):
        host = fake_host(tmp_path / name / "host")
        # the files a request names are read beneath the agent's host root (issue 29): each
        # host's mid-tier port file and the load data, at host paths inside its fake root
        (host.root / "run/sa").mkdir(parents=True)
        (host.root / "run/sa/midtier.port").write_text(port_file.read_text())
        (host.root / "srv").mkdir()
        (host.root / "srv/queries.txt").write_bytes(queries.read_bytes())
        cfg = config(tmp_path / name, sample_interval_s=0.1)
        agents.append((spawn_daemon(cfg, host), host))
        hosts_opt.append({"name": f"host-{name}", "host": "127.0.0.1", "port": sshd["port"],
                          "socket": str(cfg.socket),
                          "midtier_admin_port_file": "/run/sa/midtier.port"})  # fmt: skip
    before = [h.tree() for _, h in agents]
    exp = load_experiment(_experiment(tmp_path, sshd, hosts_opt, Path("/srv/queries.txt")))
    try:
        pair = open_pair(exp)
        try:
            base, cand = Configuration.of({"thp": "madvise"}), Configuration.of({"thp": "never"})
            pair.apply((base, cand))
            assert "[never]" in agents[1][1].read(THP) and "[madvise]" in agents[0][1].read(THP)
            ta, tb = pair.threading()
            assert ta.startswith("auto:") and tb.startswith("auto:"), (ta, tb)
            now = [m.get() for m in mids]
            assert all(s.auto_mode for s in now)
            # each host trained its own table, for its own configuration, on its own mid-tier
            tables = [json.loads(Path(s.table).read_text()) for s in now]
            assert now[0].table != now[1].table
            assert [t["config_key"] for t in tables] == [base.key(), cand.key()]
            for s, t in zip(now, tables, strict=True):
                assert str(tmp_path) in s.table and t["cpus"] == os.cpu_count()
            pair.restore()
            assert pair.threading() == ("", "")
            # each back on what it ran before (the last table loaded stays named, unused)
            assert [running(m.get()) for m in mids] == [running(s) for s in start]
            assert [h.tree() for _, h in agents] == before
        finally:
            pair.close()
    finally:
        for pid, _ in agents:
            os.kill(pid, 15)
            os.waitpid(pid, 0)


@pytest.mark.parametrize(
    ("entry", "cotune", "match"),
    [
        ({"midtier_admin": "no-port"}, True, r"\[hosts\] x: midtier_admin must be 'host:port'"),
        ({"midtier_admin": "h:1", "midtier_admin_port_file": "/p"}, True, "not both"),
        ({"midtier_admin_port_file": ""}, True, "must be a non-empty string"),
        ({"midtier_admin": "h:1"}, False, "are for co-tuning"),
    ],
)
def test_bad_per_host_midtier_addresses(
    tmp_path: Path, sshd: dict, entry: dict, cotune: bool, match: str
) -> None:
    from musku.hosts.agent import open_pair

    hosts = [{"name": n, "host": "127.0.0.1", "port": sshd["port"], "socket": f"/nonexistent-{n}"}
             for n in ("x", "y")]  # fmt: skip
    hosts[0].update(entry)
    hosts[1]["midtier_admin"] = "127.0.0.1:2"
    path = _experiment(tmp_path, sshd, hosts, tmp_path / "q.txt")
    if not cotune:
        path.write_text(path.read_text().replace("cotune = true", "cotune = false"))
    with pytest.raises(InputError, match=match) as exc:
        open_pair(load_experiment(path))  # refused before connecting to any host
    assert "\n" not in exc.value.one_line()
