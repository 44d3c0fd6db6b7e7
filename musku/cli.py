"""The ``musku`` command line (typer + rich).

Exit codes are those of :class:`musku.errors.ExitStatus` (documented in docs/cli.md); every
user-caused error prints one line ``musku: error: ...`` and no traceback. Heavy modules
(scipy, statsmodels, sqlalchemy) are imported inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import importlib
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from musku import __version__
from musku.errors import HostError, InputError, Interrupted, MuskuError, UsageError, guarded
from musku.knob_spec import coerce_setting
from musku.strict_json import finite
from musku.text import hours, interval, pct

if TYPE_CHECKING:
    from musku.storage.protocols import ComparisonStore, ResultStore


app = typer.Typer(
    name="musku",
    help="Production A/B tuning of server soft SKUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich mode shows a `<bool>` placeholder on flags
)
db_app = typer.Typer(help="Results database.", no_args_is_help=True)
sku_app = typer.Typer(help="Soft SKUs in the results database.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(sku_app, name="sku")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"musku {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Production A/B tuning of server soft SKUs."""


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="MUSKU_DB",
        help="Results DB URL (sqlite:///file.db, postgresql+psycopg://...). "
        "Default: an SQLite file in the user's data directory.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
KindOption = Annotated[
    str,
    typer.Option(
        "--kind",
        help="Which kind of run a name means: sweep, abtest, deploy, watch or calibrate "
        "(the latest finished one of that name).",
    ),
]


def _mount_optional(module: str, name: str, help_text: str) -> None:
    """Mount a component's sub-app (knobs, agent, services, tune) when it is installed."""
    try:
        sub = importlib.import_module(module).app
    except ImportError:
        return
    app.add_typer(sub, name=name, help=help_text)


_mount_optional("musku.knobs.cli", "knobs", "Knobs on this host: probe what can be tuned.")
_mount_optional("musku.agent.cli", "agent", "The per-host agent daemon.")
_mount_optional("musku.services.cli", "services", "The μSuite services: build, run, bench.")
_mount_optional("musku.tune.cli", "tune", "Threading auto-tuner: train decision tables.")
_mount_optional("musku.qsim.cli", "qsim", "Queueing-network simulation of microservice graphs.")


# ---------------------------------------------------------------------------- helpers


def _console(stderr: bool = False) -> Any:
    from musku.display import make_console  # lazy: rich loads only for commands that print

    return make_console(stderr=stderr)


def _print_json(data: Any) -> None:
    """Strict JSON: NaN and +-Infinity are written as null (docs/cli.md)."""
    sys.stdout.write(json.dumps(finite(data), indent=2, allow_nan=False) + "\n")


def _open_store(url: str | None, *, read_only: bool = False, create: bool = True) -> ResultStore:
    """The results DB; ``read_only`` for commands that only read (nothing created, migrated
    or written: a read-only file or directory serves them)."""
    from musku.storage import open_store  # lazy: SQLAlchemy and alembic (~0.2 s)

    return open_store(url, read_only=read_only, create=create)


class _StopFlag:
    """SIGINT/SIGTERM only set a flag; the sweep stops at the next window and keeps its data."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> threading.Event:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self.event

    def _handle(self, signum: int, frame: object) -> None:
        if self.event.is_set():  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------------------- sweep


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="Experiment file (TOML).")],
    db: DbOption = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue the latest unfinished run of this experiment."),
    ] = False,
    seed: Annotated[int | None, typer.Option(help="Override the experiment's seed.")] = None,
    json_out: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Show the planned comparisons, check the hosts (nothing applied) and estimate "
            "the host time; write nothing.",
        ),
    ] = False,
    take_over_agents: Annotated[
        bool,
        typer.Option(
            "--take-over-agents",
            help="Operator override: take the hosts' agents over even if another experiment "
            "or controller holds their lease (its experiment is rolled back).",
        ),
    ] = False,
    claim_stale: Annotated[
        float,
        typer.Option(
            "--claim-stale",
            min=1.0,
            help="Seconds without a heartbeat after which another controller's claim on the "
            "experiment counts as dead and is taken over.",
        ),
    ] = 60.0,
) -> None:
    """Sweep the experiment's knobs, compose the soft SKU, validate it, store everything."""
    # lazy (here and in every command): the experiment model, numpy/scipy (sweep), rich
    # (display), SQLAlchemy (storage) and matplotlib (report) load only for the command that
    # needs them, so `musku --help` stays instant
    from musku.display import LiveProgress
    from musku.experiment import load_experiment
    from musku.hosts.backend import backend_of
    from musku.summary import check_host_files
    from musku.sweep import run_sweep

    experiment = load_experiment(file)
    _check_seed(seed)
    check_host_files(experiment)  # a refusal writes nothing: not even a failed run
    if dry_run:
        _dry_run(experiment, db, json_out)
        return
    store = _open_store(db)
    started = time.monotonic()
    try:
        with _StopFlag() as stop, LiveProgress(enabled=not quiet and not json_out) as progress:
            try:
                if take_over_agents:
                    experiment = backend_of(experiment).taking_over(experiment)
                report = run_sweep(
                    experiment,
                    store=store,
                    resume=resume,
                    progress=progress,
                    stop=stop,
                    seed=seed,
                    claim_stale_s=claim_stale,
                )
            except Interrupted as exc:
                raise Interrupted(
                    f"{exc.message}; measurements kept: continue with `musku sweep {file} --resume`"
                ) from None
        effect = _run_effect(store, report.experiment_id)
    finally:
        store.close()
    wall = time.monotonic() - started
    if json_out:
        data = report.to_dict()
        data["wall_time_s"] = wall
        data["calibration_effect"] = effect.to_dict()
        _print_json(data)
        return
    from musku.display import print_report  # lazy: rich

    print_report(_console(), report, wall)
    if effect.text():
        typer.echo(effect.text())


def _run_effect(store: ComparisonStore, run_id: int | None) -> Any:
    """What the pair calibration did to run ``run_id``'s stored comparisons (issue 32): the
    same figures `musku results NAME` shows later."""
    from musku.abtest.calibration import CalibrationEffect

    comps = store.comparisons(run_id) if run_id is not None else []
    return CalibrationEffect.of([c.result for c in comps if c.result is not None])


def _existing_store(url: str | None) -> ResultStore | None:
    """The results DB if it exists at this musku's schema, else None; never creates one."""
    from musku.storage import current_revision, default_url, head_revision, open_store  # lazy

    url = url or default_url()
    try:
        if current_revision(url) != head_revision():
            return None
        return open_store(url, create=False)
    except MuskuError:
        return None


def _dry_run(experiment: Any, db: str | None, json_out: bool) -> None:
    from musku.sweep.plan import dry_run  # lazy: the sweep's planning (numpy)

    store = _existing_store(db)
    try:
        data = dry_run(experiment, store)
    finally:
        if store is not None:
            store.close()
    if json_out:
        _print_json(data)
    else:
        from musku.display import print_dry_run  # lazy: rich

        print_dry_run(_console(), data)
    hosts = data["hosts"]
    if not hosts["ok"]:
        bad = [h for h in hosts.get("hosts", []) if not h.get("ok", True)]
        what = hosts.get("error") or "; ".join(
            f"{h['name']}: {h.get('error') or 'refused a planned setting'}" for h in bad
        )
        raise HostError(f"dry run: host check failed: {what}")


@app.command()
def abtest(
    file: Annotated[
        Path, typer.Argument(help="Experiment file (TOML): hosts, metric, statistics.")
    ],
    candidate: Annotated[
        list[str],
        typer.Option(
            "--set", "-s", help="Candidate setting KNOB=VALUE (repeatable), over the baseline."
        ),
    ],
    baseline: Annotated[
        str,
        typer.Option(help="Baseline: 'production', 'stock', or KNOB=VALUE,... over production."),
    ] = "production",
    db: DbOption = None,
    seed: Annotated[int | None, typer.Option(help="Override the experiment's seed.")] = None,
    json_out: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
) -> None:
    """Run one A/B comparison: A keeps the baseline, B gets the candidate."""
    from musku.display import LiveProgress  # lazy: see sweep()
    from musku.experiment import load_experiment
    from musku.sweep import run_abtest
    from musku.sweep.jsonforms import result_dict

    experiment = load_experiment(file)
    _check_seed(seed)
    base = _parse_baseline(experiment, baseline)
    cand = _apply_overrides(experiment, base, candidate)
    store = _open_store(db)
    try:
        with _StopFlag() as stop, LiveProgress(enabled=not quiet and not json_out) as progress:
            result = run_abtest(
                experiment, base, cand, store=store, progress=progress, stop=stop, seed=seed
            )
    finally:
        store.close()
    if json_out:
        _print_json(result_dict(result))
        return
    from musku.display import print_result  # lazy: rich

    print_result(_console(), result)


def _check_seed(seed: int | None) -> None:
    """``--seed`` within the experiment file's limits (0..2**63-1)."""
    from musku.experiment import MAX_SEED  # lazy: the experiment model

    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InputError(f"--seed must be in 0..{MAX_SEED}, not {seed}")


pair_app = typer.Typer(help="The host pair: calibration of its bias.", no_args_is_help=True)
app.add_typer(pair_app, name="pair")


@pair_app.command("calibrate")
def pair_calibrate(
    file: Annotated[Path, typer.Argument(help="Experiment file (TOML): hosts, metric.")],
    db: DbOption = None,
    seed: Annotated[int | None, typer.Option(help="Override the experiment's seed.")] = None,
    precision: Annotated[
        float, typer.Option(help="Stop when the bias is known to +- this (relative).")
    ] = 0.0025,
    json_out: JsonOption = False,
) -> None:
    """Measure the pair's host bias (an A/A on the baseline) and store it in the results DB."""
    from rich.markup import escape  # lazy: see sweep()

    from musku.experiment import load_experiment
    from musku.summary import check_host_files
    from musku.sweep import calibrate_experiment

    if not 0.0 < precision < 0.5:
        raise InputError(f"--precision {precision!r} must be in (0, 0.5)")
    experiment = load_experiment(file)
    _check_seed(seed)
    check_host_files(experiment)
    store = _open_store(db)
    try:
        with _StopFlag() as stop:
            cal, result = calibrate_experiment(
                experiment, store, seed=seed, precision=precision, should_stop=stop.is_set
            )
    finally:
        store.close()
    if cal is None:
        raise HostError(f"pair calibration measured no bias: {result.reason}")
    if json_out:
        _print_json({**cal.__dict__, "bound": cal.bound, "reason": result.reason})
        return
    _console().print(
        f"pair {escape(str(cal.pair))}: host 1 vs host 0 bias {pct(cal.bias)} "
        f"{interval(cal.ci_low, cal.ci_high)}, bound ±{cal.bound * 100:.2f} %, "
        f"{cal.samples:,} samples, {hours(result.host_time_s)} of host time; stored (id {cal.id})"
    )
    # how much of the interval is the host bias's slow wander (CalibrationRule's detail)
    wander = next(
        (p for p in result.reason.split("; ") if "of which the host bias's wander" in p), ""
    )
    if wander:
        _console().print(f"  interval {escape(wander.partition(', ')[2])}")
    wd = cal.wander()
    if wd is not None:
        _console().print(
            f"  wander: the host bias moves with sd {wd[0] * 100:.2f} % over tau "
            f"{wd[1] / 60:.0f} min (measured); comparisons on this pair use it where it is "
            "larger than the rule's prior (between-period variance, two periods per role "
            "order when a period lasts tau or more)"
        )
    if cal.noise_df > 0:
        _console().print(
            f"  noise: long-run variance {cal.noise_lrv:.3g} per {cal.window_s:g} s window "
            f"({cal.noise_df:.0f} df), pooled by comparisons with rule option calibrated_noise"
        )


def _parse_pairs(text: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text:
        for part in item.split(","):
            if not part.strip():
                continue
            knob, sep, value = part.partition("=")
            if not sep:
                raise InputError(f"expected KNOB=VALUE, got {part!r}")
            out[knob.strip()] = value.strip()
    return out


def _coerce(experiment: Any, knob: str, raw: str) -> Any:
    return coerce_setting(experiment.platform, knob, raw)


def _apply_overrides(experiment: Any, base: Any, items: list[str]) -> Any:
    config = base
    for knob, raw in _parse_pairs(items).items():
        config = config.with_(knob, _coerce(experiment, knob, raw))
    return config


def _parse_baseline(experiment: Any, text: str) -> Any:
    if text == "production":
        return experiment.production
    if text == "stock":
        return experiment.stock
    return _apply_overrides(experiment, experiment.production, [text])


# ---------------------------------------------------------------------------- read commands


@app.command()
def schema(
    kind: Annotated[
        str,
        typer.Argument(
            help="experiment, catalog, sim-model, agent-config, qsim-model, or hosts-BACKEND "
            "(hosts-sim, hosts-agent, hosts-local, hosts-qsim)."
        ),
    ],
) -> None:
    """Print the JSON Schema of an input file kind (for editors: docs/cli.md)."""
    from musku.schema import json_schema, kinds

    if kind not in kinds():
        raise UsageError(f"unknown schema kind {kind!r} (kinds: {', '.join(kinds())})")
    typer.echo(json.dumps(json_schema(kind), indent=2))


@app.command()
def check(
    file: Annotated[Path, typer.Argument(help="Experiment file (TOML).")],
    json_out: JsonOption = False,
) -> None:
    """Validate an experiment file and summarise what a sweep would do."""
    from musku.display import print_check  # lazy: rich, for the commands that print tables
    from musku.summary import check_experiment  # lazy: the experiment model and its parsers

    exp, data = check_experiment(file)
    if json_out:
        _print_json(data)
        return
    print_check(_console(), exp, data)


@app.command()
def platforms(json_out: JsonOption = False) -> None:
    """List the platform knob catalogs musku knows (knobs/*.toml)."""
    from musku.experiment import available_platforms, load_platform  # lazy: see sweep()

    rows = [load_platform(n) for n in available_platforms()]
    if json_out:
        _print_json(
            [
                {
                    "name": p.name,
                    "vendor": p.vendor,
                    "cores": p.cores,
                    "llc_ways": p.llc_ways,
                    "description": p.description,
                    "knobs": {k: list(v) for k, v in p.settings.items()},
                    "stock": p.stock.as_dict(),
                }
                for p in rows
            ]
        )
        return
    from rich.markup import escape  # lazy: rich
    from rich.table import Table

    t = Table("platform", "vendor", "cores", "LLC ways", "knobs", "description")
    for p in rows:
        t.add_row(
            *(escape(x) for x in (p.name, p.vendor, str(p.cores), str(p.llc_ways))),
            ", ".join(p.settings),
            escape(p.description),
        )
    _console().print(t)


@app.command()
def results(
    experiment: Annotated[
        str | None, typer.Argument(help="Experiment name or id; omit to list all.")
    ] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Export the experiment's --table as csv, parquet or json (streamed).",
        ),
    ] = None,
    table: Annotated[
        str | None,
        typer.Option("--table", help="With --format: comparisons (default), decisions or samples."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="With --format: the file (default: standard output)."),
    ] = None,
    kind: KindOption = "sweep",
) -> None:
    """Experiments, their comparisons and soft SKUs from the results DB; or, with --format,
    an experiment's comparisons, decisions or samples as CSV, Parquet or JSON."""
    from musku.display import print_comparisons, print_experiments  # lazy: see sweep()

    if fmt is not None or output is not None or table is not None:
        from musku.outputs import check_target
        from musku.report import export  # lazy: pyarrow for parquet

        if fmt is None:
            given = "-o FILE" if output is not None else f"--table {table}"
            raise InputError(f"{given} needs --format csv|parquet|json")
        if fmt not in export.FORMATS:
            raise InputError(f"--format {fmt!r}: choose one of {', '.join(export.FORMATS)}")
        if table is not None and table not in export.TABLES:
            raise InputError(f"--table {table!r}: choose one of {', '.join(export.TABLES)}")
        if experiment is None:
            raise InputError(
                "--format exports one experiment: `musku results EXPERIMENT --format ...`"
            )
        if output is not None:
            check_target(output)  # before any work: a device, FIFO, link or directory refused
    table = table or "comparisons"
    store = _open_store(db, read_only=True)
    try:
        if fmt is not None:
            from musku.report import export  # lazy: pyarrow for parquet
            from musku.report.data import find

            found = find(store, experiment or "", kind)
            rows = export.write(store, found.record.id, table, fmt, output)
            typer.echo(found.note, err=True)
            if output is not None and str(output) != "-":
                typer.echo(f"wrote {rows:,} {table} rows to {output}", err=True)
            return
        if experiment is None:
            exps = store.experiments()
            if json_out:
                _print_json([e.to_dict() for e in exps])
            else:
                print_experiments(_console(), exps)
            return
        from musku.storage.lookup import find_run
        from musku.summary import time_totals

        found = find_run(store, experiment, kind)
        rec = found.record
        comps = store.comparisons(rec.id)
        skus = [s for s in store.softskus() if getattr(s, "experiment_id", None) == rec.id]
        from musku.abtest.calibration import calibrations_used, describe

        effect = _run_effect(store, rec.id)
        cals = calibrations_used(store, rec, comps) if effect.early else []
        if json_out:
            _print_json(
                {
                    "run": found.to_dict(),
                    "experiment": rec.to_dict(),
                    "comparisons": [c.to_dict() for c in comps],
                    "soft_skus": [s.to_dict() for s in skus],
                    "calibration": {
                        **effect.to_dict(),
                        "calibrations": [
                            {
                                "id": c.id,
                                "pair": c.pair,
                                "bias": c.bias,
                                "ci_low": c.ci_low,
                                "ci_high": c.ci_high,
                                "bound": c.bound,
                                "samples": c.samples,
                                "taken_at": c.taken_at.isoformat(),
                            }
                            for c in cals
                        ],  # fmt: skip
                    },
                    "time": time_totals([c.result for c in comps if c.result is not None]),
                }
            )
            return
        typer.echo(found.note, err=True)
        print_comparisons(_console(), rec, comps, skus)
        for cal in cals:
            typer.echo(f"used {describe(cal)}")
        if effect.early:
            typer.echo(effect.text())
    finally:
        store.close()


@sku_app.command("show")
def sku_show(
    sku_id: Annotated[int | None, typer.Argument(help="Soft SKU id; omit to list.")] = None,
    service: Annotated[str | None, typer.Option(help="Only this service.")] = None,
    platform: Annotated[str | None, typer.Option(help="Only this platform.")] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show a soft SKU (its settings and validated gains), or list them."""
    from musku.display import print_sku, print_skus  # lazy: see sweep()

    store = _open_store(db, read_only=True)
    try:
        if sku_id is None:
            skus = store.softskus(service=service, platform=platform)
            if json_out:
                _print_json([s.to_dict() for s in skus])
            else:
                print_skus(_console(), skus)
            return
        rec = store.softsku(sku_id)
        if rec is None:
            raise InputError(f"no soft SKU with id {sku_id}")
        if json_out:
            _print_json(rec.to_dict())
        else:
            print_sku(_console(), rec)
    finally:
        store.close()


@sku_app.command("diff")
def sku_diff(
    first: Annotated[int, typer.Argument(help="Soft SKU id.")],
    second: Annotated[int, typer.Argument(help="Soft SKU id.")],
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Knob-by-knob difference between two soft SKUs."""
    from musku.display import print_sku_diff  # lazy: rich, for the commands that print tables
    from musku.summary import sku_diff  # lazy: the experiment model and its parsers

    store = _open_store(db, read_only=True)
    try:
        diff = sku_diff(store, first, second)
    finally:
        store.close()
    if json_out:
        _print_json(diff.to_dict())
        return
    print_sku_diff(_console(), diff)


# ---------------------------------------------------------------------------- rollout


def _host_list(values: list[str]) -> list[str]:
    """``--hosts a,b --hosts c`` -> ``[a, b, c]`` (empty names dropped), each normalised as
    the experiment file's hosts are (``WEB-1.`` is ``web-1``), so duplicates are seen."""
    from musku.schema.document import Refusal  # lazy: pydantic
    from musku.schema.hosts import split_host

    out = []
    for h in (h for v in values for h in v.split(",") if h.strip()):
        try:
            name, port = split_host(h, "--hosts:")
        except Refusal as exc:
            raise InputError(str(exc)) from None
        if port is not None:
            raise InputError(f"--hosts: {h.strip()!r}: give the host's name (its port belongs "
                             "in the experiment file's [hosts])")  # fmt: skip
        out.append(name)
    return out


def _check_deployable(store: ResultStore, sku_id: int) -> None:
    """A soft SKU of an aborted experiment is not deployable: one line, exit 3."""
    from musku.domain import ExperimentStatus

    rec = store.softsku(sku_id)
    if rec is None:
        return  # experiment_for says so
    exp = store.experiment(rec.experiment_id)
    if exp.status is ExperimentStatus.ABORTED:
        raise InputError(
            f"soft SKU {sku_id} comes from experiment {exp.id} ({exp.name}), which was "
            "aborted: not deployable (sweep again)"
        )


@sku_app.command("deploy")
def sku_deploy(
    sku_id: Annotated[int, typer.Argument(help="Soft SKU id (musku sku show).")],
    hosts: Annotated[
        list[str],
        typer.Option("--hosts", help="Hosts to deploy on, in order: a,b,c (repeatable)."),
    ],
    canary: Annotated[int, typer.Option(help="How many of the first hosts are canaries.")] = 1,
    canary_time: Annotated[
        float | None,
        typer.Option(
            "--canary-time",
            help="Host seconds of measurement the canary A/B may take at most, warm-ups "
            "aside (default: the experiment's sample cap).",
        ),
    ] = None,
    wave_size: Annotated[int, typer.Option("--wave-size", help="Hosts per wave.")] = 1,
    experiment_file: Annotated[
        Path | None,
        typer.Option(
            "--experiment",
            help="Experiment file (hosts, metric, guardrails, statistics); default: the one "
            "that found the soft SKU.",
        ),
    ] = None,
    code_version: Annotated[
        str | None,
        typer.Option(
            "--code-version", help="The service's code version the hosts run (agent hosts)."
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the experiment's seed.")] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
) -> None:
    """Deploy a soft SKU: canary A/B against production hosts, then waves, each read back;
    rolled back on a loss, a guardrail or a failure (docs/rollout.md)."""
    from musku.display import LiveProgress  # lazy: see sweep()
    from musku.rollout.deploy import check_request, deploy_sku, experiment_for

    _check_seed(seed)
    names = _host_list(hosts)
    check_request(names, canary, wave_size)  # refused before the DB is opened
    store = _open_store(db)
    try:
        _check_deployable(store, sku_id)
        experiment = experiment_for(store, sku_id, experiment_file)
        with _StopFlag() as stop, LiveProgress(enabled=not quiet and not json_out) as progress:
            report = deploy_sku(
                store,
                experiment,
                sku_id,
                names,
                canary=canary,
                canary_time_s=canary_time,
                wave_size=wave_size,
                seed=seed,
                code_version=code_version,
                progress=progress,
                stop=stop,
            )
    finally:
        store.close()
    if json_out:
        _print_json(report.to_dict())
        return
    for c in report.canary:
        typer.echo(
            f"canary {c['host']} against {c['production']}: {c['decision']} "
            f"{pct(c['estimate'])} (comparison {c['comparison_id']})"
        )
    for n, wave in enumerate(report.waves, start=1):
        typer.echo(f"wave {n}: {', '.join(wave)} (read back)")
    typer.echo(
        f"deployment {report.deployment_id}: soft SKU {report.soft_sku_id} "
        f"{report.status.value} on {len(names)} host(s)"
    )


@sku_app.command("deployments")
def sku_deployments(
    live: Annotated[bool, typer.Option("--live", help="Only canary, rolling, deployed.")] = False,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Deployments of soft SKUs with their status, hosts and latest re-validation."""
    store = _open_store(db, read_only=True)
    try:
        rows = [(d, store.watches(d.id)) for d in store.deployments(live=live)]
    finally:
        store.close()
    if json_out:
        _print_json([{**d.to_dict(), "watches": [w.to_dict() for w in ws]} for d, ws in rows])
        return
    for d, ws in rows:
        last = f"; last watch {ws[-1].verdict} at code {ws[-1].code_version}" if ws else ""
        reason = f" ({d.reason})" if d.reason else ""
        typer.echo(
            f"deployment {d.id}: soft SKU {d.soft_sku_id} {d.status.value}{reason} on "
            f"{', '.join(d.hosts)} (canary {', '.join(d.canary_hosts)}){last}"
        )


@sku_app.command("rollback")
def sku_rollback(
    deployment: Annotated[int, typer.Argument(help="Deployment id (musku sku deployments).")],
    experiment_file: Annotated[
        Path | None,
        typer.Option(
            "--experiment", help="Experiment file with its hosts; default: the deployment's."
        ),
    ] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Put every host of a deployment back at its baseline and end it (rolled_back), so its
    hosts are free for another deployment (docs/rollout.md)."""
    from musku.rollout.deploy import rollback_deployment

    store = _open_store(db)
    try:
        dep = rollback_deployment(store, deployment, experiment_file=experiment_file)
    finally:
        store.close()
    if json_out:
        _print_json(dep.to_dict())
        return
    typer.echo(
        f"deployment {dep.id}: soft SKU {dep.soft_sku_id} {dep.status.value} on "
        f"{', '.join(dep.hosts)} ({dep.reason})"
    )


@sku_app.command("retire")
def sku_retire(
    deployment: Annotated[int, typer.Argument(help="Deployment id (musku sku deployments).")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, kept with the deployment (e.g. 'superseded').")
    ] = "",
    experiment_file: Annotated[
        Path | None,
        typer.Option(
            "--experiment", help="Experiment file with its hosts; default: the deployment's."
        ),
    ] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """End a deployed deployment as planned: its hosts back at production and free for
    another deployment, the row retired (not a verdict on the soft SKU: that is rollback;
    docs/rollout.md)."""
    from musku.rollout.deploy import retire_deployment

    store = _open_store(db)
    try:
        dep = retire_deployment(store, deployment, reason=reason, experiment_file=experiment_file)
    finally:
        store.close()
    if json_out:
        _print_json(dep.to_dict())
        return
    typer.echo(
        f"deployment {dep.id}: soft SKU {dep.soft_sku_id} {dep.status.value} on "
        f"{', '.join(dep.hosts)} ({dep.reason})"
    )


@sku_app.command("watch")
def sku_watch(
    file: Annotated[Path, typer.Argument(help="Experiment file: the hosts and statistics.")],
    once: Annotated[
        bool, typer.Option("--once", help="Re-validate every deployment once and exit.")
    ] = False,
    every: Annotated[
        float,
        typer.Option("--every", min=1.0, help="Re-validate each deployment every this many s."),
    ] = 86400.0,
    poll: Annotated[
        float,
        typer.Option("--poll", min=0.1, help="Check for a code push every this many seconds."),
    ] = 60.0,
    check_time: Annotated[
        float | None,
        typer.Option("--check-time", help="Host seconds one re-validation may take at most."),
    ] = None,
    code_version: Annotated[
        str | None,
        typer.Option(
            "--code-version",
            help="The service's code version the hosts run now (agent hosts; the sim "
            "backend reports its model's digest).",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the experiment's seed.")] = None,
    db: DbOption = None,
    json_out: JsonOption = False,
) -> None:
    """Re-validate deployed soft SKUs against production hosts, periodically and after code
    pushes; exit 7 when one's advantage is gone (docs/rollout.md)."""
    from musku.errors import AdvantageGone
    from musku.experiment import load_experiment
    from musku.rollout.deploy import check_time as check_budget
    from musku.rollout.deploy import watch, watch_round

    experiment = load_experiment(file)
    _check_seed(seed)
    check_budget(check_time, "--check-time")

    def show(results: list[Any]) -> None:
        if json_out:
            _print_json([r.to_dict() for r in results])
            return
        for r in results:
            typer.echo(
                f"deployment {r.deployment_id}: {r.verdict}{' (FLAGGED)' if r.flagged else ''}"
                f" -- {r.reason} [code {r.code_version or '?'}, comparison {r.comparison_id}]"
            )

    kwargs: dict[str, Any] = {
        "check_time_s": check_time,
        "seed": seed,
        "code_version": code_version,
    }
    store = _open_store(db)
    try:
        with _StopFlag() as stop:
            if once:
                results = watch_round(store, experiment, force=True, stop=stop, **kwargs)
                show(results)
                flagged = [r for r in results if r.flagged]
            else:
                flagged = watch(
                    store, experiment, every_s=every, poll_s=poll, stop=stop, on_round=show,
                    **kwargs,
                )  # fmt: skip
    finally:
        store.close()
    if flagged:
        ids = ", ".join(sorted({str(r.deployment_id) for r in flagged}))
        raise AdvantageGone(f"advantage gone: deployment(s) {ids} (verdicts above)")


# ---------------------------------------------------------------------------- report


@app.command()
def report(
    experiment: Annotated[
        str | None,
        typer.Argument(help="Run name or id (a name: its latest finished sweep, or --kind)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="HTML file to write (default report.html); with --format png|svg, the "
            "directory for the figures (default EXPERIMENT-figures).",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", help="html: one self-contained file; png or svg: the figures alone."
        ),
    ] = "html",
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option("--compare", metavar="ID1 ID2", help="Two experiments side by side."),
    ] = None,
    db: DbOption = None,
    kind: KindOption = "sweep",
    figure: Annotated[
        list[str] | None,
        typer.Option(
            "--figure",
            metavar="NAME",
            help="Also draw this registered figure or 'package.module:Class' "
            "(repeatable; docs/architecture.md 'How to add a report figure').",
        ),
    ] = None,
) -> None:
    """The paper's figures of an experiment as one HTML file (no network needed to view it)."""
    from musku.report import data as report_data  # lazy: matplotlib, numpy
    from musku.report.figure import select
    from musku.report.html import FORMATS, check_output, write_figures, write_report

    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if compare is not None and experiment is not None:
        raise InputError("give EXPERIMENT or --compare ID1 ID2, not both")
    refs = list(compare) if compare is not None else [experiment] if experiment else []
    if not refs:
        raise InputError("which experiment? `musku report EXPERIMENT` (`musku results` lists them)")
    figures = select(figure or ())  # plug-ins loaded and checked before the DB is read
    if fmt == "html":
        out = output if output is not None else Path("report.html")
        check_output(out)
    store = _open_store(db, read_only=True)
    try:
        sides = [report_data.load(store, ref, kind=kind) for ref in refs]
    finally:
        store.close()
    started = time.monotonic()
    if fmt == "html":
        write_report(sides, out, version=__version__, figures=figures)
        for side in sides:
            typer.echo(side.run_note, err=True)
        if str(out) == "-":  # standard output: the report is the output
            return
        typer.echo(
            f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {time.monotonic() - started:.1f} s)"
        )
        return
    name = "-vs-".join(d.experiment.name for d in sides)
    out_dir = output if output is not None else Path(f"{name}-figures")
    paths = write_figures(sides, out_dir, fmt, figures)
    for side in sides:
        typer.echo(side.run_note, err=True)
    typer.echo(f"wrote {len(paths)} {fmt} figures to {out_dir}/")


# ---------------------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Bring the results DB to this musku's schema (creates it when absent)."""
    from musku.storage import default_url, upgrade  # lazy: SQLAlchemy, alembic

    url = db or default_url()
    before, after = upgrade(url)
    if before == after:
        typer.echo(f"database already at revision {after}")
    else:
        typer.echo(f"database upgraded from {before or 'empty'} to {after}")


@db_app.command("status")
def db_status(db: DbOption = None, json_out: JsonOption = False) -> None:
    """The results DB's URL and schema revision against this musku's."""
    from musku.storage import current_revision, default_url, head_revision  # lazy: SQLAlchemy

    url = db or default_url()
    cur, head = current_revision(url), head_revision()
    data = {"url": _redact(url), "revision": cur, "head": head, "up_to_date": cur == head}
    if json_out:
        _print_json(data)
        return
    state = "up to date" if cur == head else "needs `musku db upgrade`"
    typer.echo(f"{data['url']}: revision {cur or 'none'} (head {head}) -- {state}")


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# ---------------------------------------------------------------------------- queue (issue 20)


@app.command()
def worker(
    target: Annotated[
        str,
        typer.Argument(
            metavar="FILE_OR_ID", help="Experiment file (its latest run in the DB), or a run's id."
        ),
    ],
    db: DbOption = None,
    json_out: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
    claim_stale: Annotated[
        float,
        typer.Option(
            "--claim-stale",
            min=1.0,
            help="Seconds without a heartbeat after which the sweep's controller counts as "
            "dead and this worker takes the sweep over.",
        ),
    ] = 60.0,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over/--no-take-over",
            help="Finish the sweep as its controller when the controller is dead.",
        ),
    ] = True,
) -> None:
    """Measure a running sweep's queued comparisons on this experiment file's hosts until the
    sweep ends (PostgreSQL; docs/cli.md "Workers")."""
    from musku.display import LiveProgress  # lazy: see sweep()
    from musku.sweep.worker import run_worker

    store = _open_store(db)
    try:
        with _StopFlag() as stop, LiveProgress(enabled=not quiet and not json_out) as progress:
            report = run_worker(
                target,
                store,
                stop=stop,
                progress=progress,
                claim_stale_s=claim_stale,
                take_over=take_over,
            )
    finally:
        store.close()
    if json_out:
        _print_json(report.to_dict())
        return
    took = " (took the sweep over from its dead controller)" if report.took_over else ""
    typer.echo(
        f"worker: measured {report.measured} comparison(s) of experiment "
        f"{report.experiment_id} ({report.experiment}), now {report.status}{took}"
    )


@app.command()
def experiments(
    db: DbOption = None,
    json_out: JsonOption = False,
    running: Annotated[
        bool, typer.Option("--running", help="Only unfinished experiments.")
    ] = False,
) -> None:
    """Experiments with their hosts, status, claims (controller, heartbeat age) and queued /
    claimed / done comparisons."""
    from musku.sweep.queue import experiment_rows

    store = _open_store(db, read_only=True)
    try:
        rows = experiment_rows(store, running_only=running)
    finally:
        store.close()
    if json_out:
        _print_json(rows)
        return
    from musku.display import print_experiment_claims  # lazy: rich

    print_experiment_claims(_console(), rows)


@app.command()
def abort(
    ident: Annotated[
        str, typer.Argument(metavar="ID", help="The experiment's id (musku experiments).")
    ],
    db: DbOption = None,
    claim_stale: Annotated[
        float,
        typer.Option(
            "--claim-stale",
            min=1.0,
            help="A controller whose heartbeat is older than this is dead: its claim is "
            "released and its running comparisons aborted here.",
        ),
    ] = 60.0,
) -> None:
    """Stop an experiment cleanly: status aborted, claims released; its running controller
    stops at its next heartbeat and rolls its hosts back."""
    from musku.domain import ExperimentStatus
    from musku.storage import InvalidTransition

    exp_id = parse_id(ident, "experiment")
    store = _open_store(db, create=False)
    try:
        rec = store.find_experiment(exp_id)
        if rec is None:
            raise InputError(f"no experiment with id {ident} in {store.url}")
        if rec.status in (ExperimentStatus.DONE, ExperimentStatus.FAILED, ExperimentStatus.ABORTED):
            raise InputError(
                f"experiment {rec.id} ({rec.name}) is already {rec.status.value}: nothing to abort"
            )
        held = store.queue_states([rec.id])[rec.id].controller
        try:
            store.abort_experiment(rec.id, stale_s=claim_stale)
        except InvalidTransition as exc:  # finished meanwhile, or its soft SKU is stored
            raise InputError(exc.message) from None
    finally:
        store.close()
    live = held is not None and (held.heartbeat_age_s or 0.0) <= claim_stale
    tail = (
        f"its controller {held.holder} stops at its next heartbeat and rolls its hosts back"
        if live and held is not None
        else "no live controller held it"
    )
    typer.echo(f"experiment {rec.id} ({rec.name}) aborted: {tail}")


MAX_ID = 2**63 - 1  # the DB's BIGINT ids


def parse_id(text: str, what: str) -> int:
    """A database id given on the command line: ASCII digits only (``str.isdigit`` takes
    ``²``), within the DB's 64-bit ids; else one line, exit 3."""
    digits = re.fullmatch(r"[0-9]+", text) is not None
    if not digits or len(text.lstrip("0")) > 19 or int(text) > MAX_ID:
        raise InputError(
            f"{text[:40]!r}: give the {what}'s id, a whole number 1..{MAX_ID} "
            "(musku experiments lists them)"
        )
    return int(text)


# ---------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    """Run the app, map errors to exit codes, never a traceback (:func:`musku.entry.guarded`).

    Usage errors are click's own (exit 2); musku's errors are one line with their status.
    """
    args = sys.argv[1:] if argv is None else argv
    if args[:2] == ["agent", "rpc"]:  # the controller's SSH hot path: skip typer's start-up
        from musku.agent.rpc import main as rpc_main  # lazy: this path loads nothing else

        sys.exit(rpc_main(args[2:]))

    def _app() -> None:
        app(args=argv, prog_name="musku")  # standalone: exits through SystemExit

    guarded(_app)
