"""``musku services build | run | bench SERVICE`` (setalgebra, hdsearch, recommend, router).

``run`` and ``bench`` take the same deployment options (:func:`_deploy_options`, added to both by
:func:`_with_deploy_options`), checked before anything starts. Errors are one line with their
exit status (docs/cli.md): 3 bad input (unknown service or option, missing data file),
4 not built / memcached not installed, 6 a tier failed (did not start, died, answered nothing).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from musku.errors import HostError, InputError, MuskuError
from musku.strict_json import finite  # NaN/inf -> null

app = typer.Typer(help="The μSuite services: build, run, bench.", no_args_is_help=True)


def _fail(e: MuskuError) -> None:
    typer.echo(f"musku: error: {e.one_line()}", err=True)
    raise typer.Exit(int(e.status))


ServiceArg = Annotated[
    str, typer.Argument(help="setalgebra, hdsearch, recommend or router.", show_default=False)
]


# ---- the deployment options of run and bench -------------------------------------------------


@dataclass(frozen=True)
class DeployOptions:
    """What ``run`` and ``bench`` were told about the deployment, as given."""

    threading: str
    pollers: int
    workers: int
    responders: int
    table: Path | None
    leaf_transport: str
    shards: int
    server_cpus: str
    opts: list[str]
    legacy: dict[str, Any]  # setalgebra's --corpus/--docs/--terms/--queries (= --opt KEY=VALUE)
    data_dir: Path | None

    def deploy_kwargs(self, service: str) -> dict[str, Any]:
        """Check everything (InputError, before anything starts) and build ``runtime.deploy``'s
        keyword arguments (all but ``workdir``)."""
        # lazy (here and in each command): the services' modules load numpy for the datasets;
        # `musku --help` loads this module
        from musku.services import deployments, runtime

        rec = deployments.recipe(service)
        data_opts = deployments.parse_opts(service, self.opts)
        for key, value in self.legacy.items():
            if value is None:
                continue
            if service != "setalgebra":
                raise InputError(
                    f"--{key} is a setalgebra option; for {service} use --opt KEY=VALUE"
                )
            data_opts[key] = value
        rec.resolve(data_opts)  # type errors now, not after a start
        if self.shards < 1:
            raise InputError("--shards must be >= 1")
        if self.threading == "auto" and self.table is None:
            raise InputError("--threading auto needs --table PATH (musku tune train)")
        if self.leaf_transport not in runtime.LEAF_TRANSPORTS:
            raise InputError(
                f"unknown leaf transport {self.leaf_transport!r}; one of "
                + ", ".join(runtime.LEAF_TRANSPORTS)
            )
        if self.threading != "auto" and self.threading not in runtime.THREADING_MODELS:
            raise InputError(
                f"unknown threading model {self.threading!r}; auto or one of "
                + ", ".join(runtime.THREADING_MODELS)
            )
        return {
            "data_dir": self.data_dir or runtime.default_data_dir(),
            "shards": self.shards,
            "threading": self.threading,
            "pollers": self.pollers,
            "workers": self.workers,
            "responders": self.responders,
            "table": self.table if self.threading == "auto" else None,
            "leaf_transport": self.leaf_transport,
            "server_cpus": runtime.parse_cpus(self.server_cpus),
            "data_opts": data_opts,
        }


def _deploy_options(
    *,
    threading_: Annotated[
        str,
        typer.Option(
            "--threading", help="Mid-tier model, e.g. async-dispatch-block; auto needs --table."
        ),
    ] = "async-dispatch-block",
    pollers: Annotated[int, typer.Option(min=1, help="Mid-tier poller threads.")] = 1,
    workers: Annotated[int, typer.Option(min=1, help="Mid-tier worker threads.")] = 2,
    responders: Annotated[int, typer.Option(min=1, help="Mid-tier response threads.")] = 1,
    table: Annotated[
        Path | None, typer.Option(help="Decision table for --threading auto (musku tune train).")
    ] = None,
    leaf_transport: Annotated[
        str,
        typer.Option(
            help="Mid-tier -> leaf calls: unary (one RPC each, μSuite's design) or batch "
            "(a stream per leaf; calls queued during a write share the next message)."
        ),
    ] = "unary",
    shards: Annotated[int, typer.Option(help="Leaves (router: each with its own memcached).")] = 2,
    server_cpus: Annotated[str, typer.Option(help="Pin the servers to these CPUs, e.g. 0.")] = "",
    opt: Annotated[
        list[str] | None,
        typer.Option(
            "--opt",
            "-o",
            help="Service option KEY=VALUE (repeatable), e.g. hdsearch source=synthetic, "
            "recommend source=synthetic, router zipf=0.5; see services/README.md.",
        ),
    ] = None,
    corpus: Annotated[str | None, typer.Option(help="setalgebra: synth or wordnet.")] = None,
    docs: Annotated[int | None, typer.Option(help="setalgebra: documents (synth).")] = None,
    terms: Annotated[int | None, typer.Option(help="setalgebra: vocabulary (synth).")] = None,
    queries: Annotated[int | None, typer.Option(help="setalgebra: queries generated.")] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Where generated data is cached (MUSKU_DATA_DIR)."),
    ] = None,
) -> DeployOptions:
    legacy = {"corpus": corpus, "docs": docs, "terms": terms, "queries": queries}
    return DeployOptions(threading_, pollers, workers, responders, table, leaf_transport, shards,
                         server_cpus, list(opt or []), legacy, data_dir)  # fmt: skip


def _with_deploy_options(
    command: Callable[..., None],
) -> Callable[..., None]:
    """Give ``command`` the options of :func:`_deploy_options` (after its own); it receives
    them as one ``deploy: DeployOptions`` argument. typer reads the merged signature."""
    shared = inspect.signature(_deploy_options, eval_str=True).parameters
    own = inspect.signature(command, eval_str=True).parameters
    assert "deploy" in own and not set(shared) & set(own), "clashing option names"
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in own.items()
              if n != "deploy"] + list(shared.values())  # fmt: skip

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        deploy = _deploy_options(**{n: kwargs.pop(n) for n in shared})
        command(deploy=deploy, **kwargs)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


# ---- commands ---------------------------------------------------------------------------------


@app.command()
def build(
    test: Annotated[bool, typer.Option("--test", help="Also run ctest.")] = False,
    asan: Annotated[
        bool, typer.Option(help="Also the ASan/UBSan test build (services/build-asan).")
    ] = True,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1)] = 2,
) -> None:
    """Build the C++ services with CMake + ninja (release into services/build, or into
    $MUSKU_SERVICES_BUILD when set; the ASan/UBSan test build unless --no-asan)."""
    from musku.services import runtime  # lazy: see deploy_kwargs

    try:
        where = runtime.build(test=test, jobs=jobs, asan=asan)
    except MuskuError as e:
        _fail(e)
        return
    typer.echo(f"built: {where}")


@app.command()
@_with_deploy_options
def run(
    service: ServiceArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the addresses as JSON.")] = False,
    *,
    deploy: DeployOptions,
) -> None:
    """Start SERVICE's tiers, wait for health, print the addresses, run until Ctrl-C/SIGTERM
    (or until a tier dies: exit 6)."""
    from musku.services import runtime  # lazy: see deploy_kwargs

    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        kwargs = deploy.deploy_kwargs(service)
        workdir = Path(tempfile.mkdtemp(prefix=f"musku-{service}-"))
        with runtime.deploy(service, workdir=workdir, **kwargs) as dep:
            info = {
                "service": service,
                "midtier": dep.midtier.address,
                "leaves": [p.address for p in dep.leaves],
                "backends": [p.address for p in dep.backends],
                "load_data": str(dep.load_data),
                "placement": dep.placement(),
                "logs": str(workdir),
            }
            if as_json:
                typer.echo(json.dumps(finite(info), allow_nan=False))
            else:
                typer.echo(
                    f"{service}: mid-tier {info['midtier']}, leaves {', '.join(info['leaves'])}"
                    + (f", memcached {', '.join(info['backends'])}" if dep.backends else "")
                )
                typer.echo(f"load: musku_loadgen --target {info['midtier']} --service {service} "
                           f"--data {info['load_data']}")  # fmt: skip
                typer.echo(f"logs in {workdir}; Ctrl-C stops")
            sys.stdout.flush()
            while not stop.wait(0.5):
                dep.check_alive()
    except MuskuError as e:
        _fail(e)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@app.command()
@_with_deploy_options
def bench(
    service: ServiceArg,
    qps: Annotated[
        str,
        typer.Option(
            help="Open-loop loads: QPS or % of the closed-loop saturation, e.g. 500,1000."
        ),
    ] = "20%,50%,80%",
    duration: Annotated[float, typer.Option(min=0.1, help="Seconds measured per load.")] = 10.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Unmeasured seconds before each.")] = 2.0,
    closed: Annotated[bool, typer.Option(help="Closed-loop saturation run (implied by %).")] = True,
    concurrency: Annotated[int, typer.Option(min=1, help="Closed-loop outstanding requests.")] = 32,
    idle_seconds: Annotated[
        float, typer.Option(min=0.0, help="Measure the idle mid-tier's CPU this long (0: skip).")
    ] = 3.0,
    loadgen_cpus: Annotated[str, typer.Option(help="Pin the load generator, e.g. 1.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    *,
    deploy: DeployOptions,
) -> None:
    """Start SERVICE, measure closed-loop saturation and open-loop loads, print figures, stop."""
    from musku.services import runtime  # lazy: see deploy_kwargs

    try:
        kwargs = deploy.deploy_kwargs(service)
        loads = runtime.parse_load_list(qps)
        lg = runtime.parse_cpus(loadgen_cpus)
        workdir = Path(tempfile.mkdtemp(prefix=f"musku-bench-{service}-"))
        figures: dict[str, Any] = {"service": service}
        with runtime.deploy(service, workdir=workdir, **kwargs) as dep:
            figures["threading"] = runtime.admin(dep.midtier.address, "get")
            figures["placement"] = {
                **dep.placement(),
                "loadgen": sorted(lg) if lg else list(range(os.cpu_count() or 1)),
            }
            figures.update(runtime.measure(dep, loads, duration_s=duration, warmup_s=warmup,
                                           concurrency=concurrency, closed=closed,
                                           loadgen_cpus=lg))  # fmt: skip
            if idle_seconds > 0:
                figures["idle_cpu_percent"] = runtime.idle_cpu_percent(
                    dep.midtier.pid, idle_seconds
                )
            figures["midtier_stats"] = dep.stats()
            figures["midtier_stats"].pop("buckets", None)
            figures["logs"] = str(workdir)
        figures["exit_codes"] = dep.exit_codes
    except MuskuError as e:
        _fail(e)
        return
    if as_json:
        typer.echo(json.dumps(finite(figures), indent=2, allow_nan=False))
    else:
        _print_bench(figures)
    unclean = {k: v for k, v in figures["exit_codes"].items() if v != 0}
    if unclean:  # the figures stand, but a tier did not shut down cleanly: say so
        _fail(HostError(f"unclean exit at shutdown {unclean} (logs in {figures['logs']})"))


def _print_bench(figures: dict[str, Any]) -> None:
    typer.echo(f"{figures['service']} ({figures['threading']['model']})")
    typer.echo(
        "placement: " + ", ".join(f"{k} CPU {_cpus(v)}" for k, v in figures["placement"].items())
    )
    typer.echo(
        f"{'load':>14} {'achieved':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'p99.9 ms':>9} {'errors':>7}"
    )
    rows = []
    if figures["closed_loop"]:
        c = figures["closed_loop"]
        rows.append((f"closed x{c['concurrency']}", c))
    for r in figures["open_loop"]:
        label = f"{r['qps']:.0f}" + (f" ({r['fraction'] * 100:.0f}%)" if r["fraction"] else "")
        rows.append((label, r))
    for label, r in rows:
        lat = r["latency_us"]
        typer.echo(
            f"{label:>14} {r['achieved_qps']:>10.1f} {lat['p50'] / 1e3:>8.3f} "
            f"{lat['p90'] / 1e3:>8.3f} {lat['p99'] / 1e3:>8.3f} {lat['p999'] / 1e3:>9.3f} "
            f"{r['errors']:>7}"
        )
    if "idle_cpu_percent" in figures:
        typer.echo(f"idle mid-tier CPU: {figures['idle_cpu_percent']:.2f} %")


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus) if cpus else "?"
