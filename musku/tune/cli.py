"""``musku tune train SERVICE``: measure every threading configuration over a grid of loads on
this host, keep the best per load, write the decision table (JSON) and store it in the DB."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from musku.errors import MuskuError
from musku.strict_json import finite

app = typer.Typer(help="Threading auto-tuner: train decision tables.", no_args_is_help=True)


def _fail(e: MuskuError) -> None:
    typer.echo(f"musku: error: {e.one_line()}", err=True)
    raise typer.Exit(int(e.status))


@app.callback()
def _root() -> None:
    """Threading auto-tuner (μTune)."""


@app.command()
def train(
    service: str,
    loads: Annotated[str, typer.Option(help="Offered loads (QPS), comma-separated.")] = (
        "20,100,500,1000,2000"
    ),
    models: Annotated[
        str, typer.Option(help="'all' or comma-separated models to consider.")
    ] = "all",
    duration: Annotated[float, typer.Option(min=0.1, help="Seconds measured per point.")] = 3.0,
    warmup: Annotated[float, typer.Option(min=0.0)] = 0.5,
    min_samples: Annotated[
        int, typer.Option(min=0, help="Requests per point at least (low loads run longer).")
    ] = 300,
    rounds: Annotated[
        int,
        typer.Option(min=1, help="Measurements of each load's closest contenders (worst counts)."),
    ] = 3,
    out: Annotated[
        Path | None, typer.Option(help="Table path (default DATA_DIR/tables/SERVICE-HOST.json).")
    ] = None,
    db: Annotated[
        str | None, typer.Option("--db", envvar="MUSKU_DB", help="Results DB URL.")
    ] = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="Only write the file.")] = False,
    platform: Annotated[str, typer.Option(help="Platform name stored with the table.")] = "local",
    config_key: Annotated[
        str, typer.Option(help="Soft-SKU configuration key in force ('{}' = stock).")
    ] = "{}",
    server_cpus: Annotated[str, typer.Option(help="Pin servers to these CPUs.")] = "",
    loadgen_cpus: Annotated[str, typer.Option(help="Pin the load generator.")] = "",
    leaf_transport: Annotated[
        str,
        typer.Option(
            help="The mid-tier's leaf transport, unary or batch (the table holds for it)."
        ),
    ] = "unary",
    shards: int = 2,
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    data_dir: Annotated[Path | None, typer.Option("--data-dir")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """Train SERVICE's threading decision table on this host."""
    from musku.services import runtime  # lazy: keeps `musku --help` from loading the services
    from musku.tune import train as tr  # lazy: numpy, scipy

    def progress(step: tr.TrainingStep) -> None:
        """One line a point on stderr: where the training is, the point, the time left."""
        p = step.point
        typer.echo(
            f"[{step.done:>{len(str(step.total))}}/{step.total}] {step.qps:>7g} QPS  "
            f"{step.key:<36} p99 {p['p99_us'] / 1e3:8.3f} ms  achieved "
            f"{p['achieved_qps']:8.1f}  errors {p['errors']}  "
            f"ETA {tr.format_duration(step.eta_s)}",
            err=True,
        )

    if out is not None and (out.exists() or out.is_symlink() or str(out) == "-"):
        from musku.outputs import check_target  # a missing directory is created later

        check_target(out, stdout_ok=False)  # a device, FIFO, link: before minutes of training
    try:
        runtime.check_service(service)
        load_list, candidates = tr.parse_loads(loads), tr.parse_models(models)
        planned = tr.planned_points(load_list, candidates, duration_s=duration, warmup_s=warmup,
                                    min_samples=min_samples, rounds=rounds,
                                    contenders=tr.CONTENDERS)  # fmt: skip
        typer.echo(
            f"training {service}: {len(planned)} points ({len(load_list)} loads x "
            f"{len(candidates)} configurations"
            + (f", {rounds - 1} more round(s) of each load's best" if rounds > 1 else "")
            + f"), about {tr.format_duration(sum(planned))} of measurement plus start-up",
            err=True,
        )
        run = tr.ServiceTraining(
            service,
            load_list,
            candidates,
            duration_s=duration,
            warmup_s=warmup,
            min_samples=min_samples,
            rounds=rounds,
            out=out,
            platform=platform,
            config_key=config_key,
            server_cpus=runtime.parse_cpus(server_cpus),
            loadgen_cpus=runtime.parse_cpus(loadgen_cpus),
            leaf_transport=leaf_transport,
            shards=shards,
            data_opts={"docs": docs, "terms": terms, "queries": queries},
            data_dir=data_dir,
        )
        done = tr.train_service(run, store=not no_db, db=db,
                                on_step=None if as_json else progress)  # fmt: skip
        table, path, stored = done.table, done.path, done.db_id
        if as_json:
            shown = {"path": str(path), "db_id": stored, "table": table}
            typer.echo(json.dumps(finite(shown), indent=2, allow_nan=False))
            return
        typer.echo(f"decision table for {service} on {table['host']} ({os.cpu_count()} CPUs):")
        for r in table["rows"]:
            bound = "inf" if r["max_qps"] >= 1e11 else f"{r['max_qps']:.0f}"
            typer.echo(
                f"  load <= {bound:>7} QPS: {r['model']:<22} pollers={r['pollers']} "
                f"workers={r['workers']} responders={r['responders']}"
            )
        typer.echo(f"written to {path}" + (f"; stored in the DB (id {stored})" if stored else ""))
    except MuskuError as e:
        _fail(e)
