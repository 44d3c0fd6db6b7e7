"""``musku services build | run | bench SERVICE``."""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from musku.errors import MuskuError

app = typer.Typer(help="The μSuite services: build, run, bench.", no_args_is_help=True)


def _fail(e: MuskuError) -> None:
    typer.echo(f"musku: error: {e.one_line()}", err=True)
    raise typer.Exit(int(e.status))


ThreadingOpt = Annotated[
    str,
    typer.Option("--threading", help="auto (needs --table) or MODEL, e.g. async-dispatch-block"),
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Where generated data is cached (MUSKU_DATA_DIR).")
]


def _data_opts(corpus: str, docs: int, terms: int, queries: int) -> dict[str, Any]:
    return {"corpus": corpus, "docs": docs, "terms": terms, "queries": queries}


@app.command()
def build(
    test: Annotated[bool, typer.Option("--test", help="Also run ctest in both builds.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1)] = 2,
) -> None:
    """Build the C++ services (release + ASan/UBSan test build) with ninja."""
    from musku.services import runtime

    try:
        runtime.build(test=test, jobs=jobs)
    except MuskuError as e:
        _fail(e)


@app.command()
def run(
    service: str,
    threading_: ThreadingOpt = "async-dispatch-block",
    pollers: int = 1,
    workers: int = 2,
    responders: int = 1,
    table: Annotated[Path | None, typer.Option(help="Decision table for --threading auto.")] = None,
    shards: int = 2,
    corpus: str = "synth",
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    data_dir: DataDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the addresses as JSON.")] = False,
) -> None:
    """Start SERVICE's tiers, wait for health, print the addresses, run until Ctrl-C/SIGTERM."""
    from musku.services import runtime

    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        runtime.check_service(service)
        if threading_ == "auto" and table is None:
            raise runtime.InputError("--threading auto needs --table PATH (musku tune train)")
        workdir = Path(tempfile.mkdtemp(prefix=f"musku-{service}-"))
        with runtime.deploy(
            service,
            workdir=workdir,
            data_dir=data_dir or runtime.default_data_dir(),
            shards=shards,
            threading=threading_,
            pollers=pollers,
            workers=workers,
            responders=responders,
            table=table if threading_ == "auto" else None,
            data_opts=_data_opts(corpus, docs, terms, queries),
        ) as dep:
            info = {
                "service": service,
                "midtier": dep.midtier.address,
                "leaves": [p.address for p in dep.leaves],
                "load_data": str(dep.load_data),
                "logs": str(workdir),
            }
            if as_json:
                typer.echo(json.dumps(info))
            else:
                typer.echo(
                    f"{service}: mid-tier {info['midtier']}, leaves {', '.join(info['leaves'])}"
                )
                typer.echo(f"logs in {workdir}; Ctrl-C stops")
            sys.stdout.flush()
            stop.wait()
    except MuskuError as e:
        _fail(e)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@app.command()
def bench(
    service: str,
    qps: Annotated[str, typer.Option(help="Open-loop loads, comma-separated.")] = "500,1000,2000",
    duration: Annotated[float, typer.Option(min=0.1)] = 10.0,
    warmup: Annotated[float, typer.Option(min=0.0)] = 2.0,
    closed: Annotated[bool, typer.Option(help="Also a closed-loop saturation run.")] = True,
    concurrency: int = 32,
    threading_: ThreadingOpt = "async-dispatch-block",
    pollers: int = 1,
    workers: int = 2,
    responders: int = 1,
    table: Annotated[Path | None, typer.Option(help="Decision table for --threading auto.")] = None,
    shards: int = 2,
    server_cpus: Annotated[str, typer.Option(help="Pin servers to these CPUs (e.g. '0').")] = "",
    loadgen_cpus: Annotated[str, typer.Option(help="Pin the load generator (e.g. '1').")] = "",
    corpus: str = "synth",
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    data_dir: DataDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Start SERVICE, drive open-loop loads (+ closed-loop saturation), print figures, stop."""
    from musku.services import runtime
    from musku.tune.train import parse_loads

    try:
        runtime.check_service(service)
        loads = parse_loads(qps)
        workdir = Path(tempfile.mkdtemp(prefix=f"musku-bench-{service}-"))
        figures: dict[str, Any] = {"service": service, "open_loop": [], "closed_loop": None}
        lg = runtime.parse_cpus(loadgen_cpus)
        with runtime.deploy(
            service,
            workdir=workdir,
            data_dir=data_dir or runtime.default_data_dir(),
            shards=shards,
            threading=threading_,
            pollers=pollers,
            workers=workers,
            responders=responders,
            table=table if threading_ == "auto" else None,
            server_cpus=runtime.parse_cpus(server_cpus),
            data_opts=_data_opts(corpus, docs, terms, queries),
        ) as dep:
            figures["threading"] = runtime.admin(dep.midtier.address, "get")
            figures["placement"] = dep.placement()
            for q in loads:
                r = runtime.run_load(dep.midtier.address, service, dep.load_data,
                                     runtime.LoadSpec(qps=q, duration_s=duration, warmup_s=warmup),
                                     cpus=lg)  # fmt: skip
                figures["open_loop"].append({"qps": q, **r["total"]})
            if closed:
                r = runtime.run_load(dep.midtier.address, service, dep.load_data,
                                     runtime.LoadSpec(mode="closed", duration_s=duration,
                                                      warmup_s=warmup, concurrency=concurrency),
                                     cpus=lg)  # fmt: skip
                figures["closed_loop"] = r["total"]
            figures["idle_cpu_percent"] = runtime.idle_cpu_percent(dep.midtier.pid, 3.0)
            figures["midtier_stats"] = dep.stats()
            figures["midtier_stats"].pop("buckets", None)
        if as_json:
            typer.echo(json.dumps(figures, indent=2))
            return
        typer.echo(f"{service} ({figures['threading']['model']}, placement {figures['placement']})")
        typer.echo(
            f"{'load':>10} {'achieved':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
            f"{'p99.9 ms':>9} {'errors':>7}"
        )
        rows = list(figures["open_loop"])
        if figures["closed_loop"]:
            rows.append({"qps": "closed", **figures["closed_loop"]})
        for r in rows:
            lat = r["latency_us"]
            q = r["qps"]
            typer.echo(
                f"{q if isinstance(q, str) else f'{q:g}':>10} {r['achieved_qps']:>10.1f} "
                f"{lat['p50'] / 1e3:>8.3f} {lat['p90'] / 1e3:>8.3f} {lat['p99'] / 1e3:>8.3f} "
                f"{lat['p999'] / 1e3:>9.3f} {r['errors']:>7}"
            )
        typer.echo(f"idle mid-tier CPU: {figures['idle_cpu_percent']:.2f} %")
    except MuskuError as e:
        _fail(e)
