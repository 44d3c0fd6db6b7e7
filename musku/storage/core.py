"""What the results store's repositories share: the engine, its session factories and the
caches (configuration ids, the knobs the ``configurations`` view shows, running comparisons'
metric and hosts), the error guard, and the row helpers several concerns use.

:class:`Core` holds the state, one per open database (:class:`~musku.storage.store.Store`
makes it); each repository (``runs.py``, ``comparisons.py``, ``samples.py``...) is a
:class:`Repository` over the same :class:`Core`, so they share its caches. SQLAlchemy rows
never leave the storage package: repositories return :mod:`musku.domain` values and the frozen
records of :mod:`musku.storage.records`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from musku.domain import Configuration, ExperimentStatus
from musku.errors import DatabaseError, InputError
from musku.knob_spec import BUILTIN, is_knob, register_knob, spec_of, target_of
from musku.storage import convert, views
from musku.storage.engine import display, first_line, reader
from musku.storage.models import (
    ComparisonRow,
    ConfigurationRow,
    ConfigurationSettingRow,
    ExperimentRow,
    HostRow,
    KnobRow,
)
from musku.storage.records import ComparisonStatus, ExperimentRecord, HostRecord

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

P = ParamSpec("P")
R = TypeVar("R")

MAX_ID = 2**63 - 1
"""The largest id a row can have (64-bit integer keys): a larger one names no row."""


def guard(method: Callable[P, R]) -> Callable[P, R]:
    """SQLAlchemy errors -> one-line DatabaseError naming the operation."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except IntegrityError as exc:
            raise DatabaseError(
                f"{method.__name__}: rejected by the database: {first_line(exc)}"
            ) from None
        except SQLAlchemyError as exc:
            raise DatabaseError(f"{method.__name__}: {first_line(exc)}") from None

    return wrapper


class Core:
    """The engine, session factories and caches of one open database, shared by its
    repositories. One Core may be used from one thread at a time (except what says it is
    safe from another thread: it uses the engine only)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.reader_engine = reader(engine)
        self.readers = sessionmaker(self.reader_engine, expire_on_commit=False)
        self.config_ids: dict[str, int] = {}
        self.view_knobs: set[str] = set(BUILTIN)  # knobs the configurations view shows
        self.cmp_meta: dict[int, tuple[str, dict[str, int]]] = {}

    @property
    def url(self) -> str:
        return display(self.engine.url)


class Repository:
    """Base of the repositories: the helpers every concern uses, over a shared :class:`Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    @property
    def engine(self) -> Engine:
        return self.core.engine

    @property
    def dialect(self) -> str:
        return self.core.dialect

    @property
    def url(self) -> str:
        return self.core.url

    @property
    def _reader_engine(self) -> Engine:
        return self.core.reader_engine

    @property
    def _cmp_meta(self) -> dict[int, tuple[str, dict[str, int]]]:
        return self.core.cmp_meta

    def _session(self) -> Session:
        """A session for a write transaction (``with self._session() as s, s.begin():``)."""
        return self.core.sessions()

    def _reader(self) -> Session:
        """A session that only reads (on SQLite its transaction begins deferred)."""
        return self.core.readers()

    def _config_id(self, session: Session, config: Configuration) -> int:
        key = config.key()
        cached = self.core.config_ids.get(key)
        if cached is not None:
            return cached
        found = session.scalar(select(ConfigurationRow.id).where(ConfigurationRow.key == key))
        if found is None:
            try:
                with session.begin_nested():
                    row = ConfigurationRow(**convert.configuration_columns(config))
                    session.add(row)
                    session.flush()
                    found = row.id
                    session.add_all(
                        ConfigurationSettingRow(configuration_id=found, **cols)
                        for cols in convert.configuration_settings(config)
                    )
                    session.flush()
                    self._record_knobs(session, config)
            except IntegrityError:  # another writer inserted it meanwhile
                found = session.scalar(
                    select(ConfigurationRow.id).where(ConfigurationRow.key == key)
                )
                if found is None:
                    raise
            return found  # cached once committed and looked up again, not before
        self.core.config_ids[key] = found
        return found

    def _record_knobs(self, session: Session, config: Configuration) -> None:
        """For a knob of ``config`` stored for the first time: record an out-of-tree knob's
        ``module:Class`` in ``knobs``, and regenerate the analysts' ``configurations`` view
        when it does not show the knob yet."""
        new = [k for k in config.knobs() if k not in self.core.view_knobs]
        if not new:
            return
        for name in new:
            if session.get(KnobRow, name) is None:
                spec = spec_of(name)
                try:
                    with session.begin_nested():
                        session.add(
                            KnobRow(
                                name=name,
                                target=target_of(name),
                                kind=spec.kind.value,
                                description=spec.description,
                            )
                        )
                except IntegrityError:  # another writer recorded it meanwhile
                    pass
        conn = session.connection()
        if not views.covers(views.view_columns(conn), new):
            views.regenerate(conn)
        self.core.view_knobs.update(new)

    def _register_stored_knobs(self, session: Session) -> None:
        """Register the out-of-tree knobs the database's configurations use (``knobs``)."""
        for row in session.scalars(select(KnobRow)):
            if is_knob(row.name):
                continue
            try:
                register_knob(row.target)
            except InputError as exc:
                raise DatabaseError(
                    f"this database's configurations use knob {row.name!r}, which cannot be "
                    f"loaded here: {exc.one_line()}"
                ) from None

    def _configuration_of(self, session: Session, row: ConfigurationRow) -> Configuration:
        try:
            return convert.configuration_from_row(row)
        except KeyError:
            self._register_stored_knobs(session)
        try:
            return convert.configuration_from_row(row)
        except KeyError as exc:
            raise DatabaseError(
                f"configuration {row.id} uses knob {exc.args[0]!r}, which is neither "
                "registered here nor recorded in the database's knobs table"
            ) from None

    def _config_row(self, s: Session, config_id: int) -> ConfigurationRow:
        row = s.get(ConfigurationRow, config_id)
        if row is None:
            raise DatabaseError(f"no configuration with id {config_id}")
        return row

    def _experiment(self, session: Session, exp_id: int) -> ExperimentRow:
        row = session.get(ExperimentRow, exp_id)
        if row is None:
            raise DatabaseError(f"no experiment with id {exp_id}")
        return row

    def _comparison(self, session: Session, cmp_id: int) -> ComparisonRow:
        row = session.get(ComparisonRow, cmp_id)
        if row is None:
            raise DatabaseError(f"no comparison with id {cmp_id}")
        return row

    def _experiment_record(
        self, session: Session, row: ExperimentRow, hosts: Sequence[HostRow] | None = None
    ) -> ExperimentRecord:
        if hosts is None:
            hosts = session.scalars(
                select(HostRow).where(HostRow.experiment_id == row.id).order_by(HostRow.idx)
            ).all()
        created = convert.aware(row.created_at)
        assert created is not None
        return ExperimentRecord(
            id=row.id,
            name=row.name,
            description=row.description,
            service=row.service,
            platform=row.platform,
            mode=row.mode,
            baseline=row.baseline,
            metric=row.metric,
            direction=row.direction,
            status=ExperimentStatus(row.status),
            path=row.path,
            content=row.content,
            created_at=created,
            started_at=convert.aware(row.started_at),
            finished_at=convert.aware(row.finished_at),
            hosts=tuple(
                HostRecord(index=h.idx, name=h.name, backend=h.backend, facts=h.facts)
                for h in hosts
            ),
        )


def locked_experiment(s: Session, exp_id: int) -> ExperimentRow:
    """Experiment ``exp_id``'s row, locked for this transaction (``SELECT ... FOR UPDATE``;
    SQLite's write transaction is IMMEDIATE already)."""
    row = s.scalars(
        select(ExperimentRow).where(ExperimentRow.id == exp_id).with_for_update()
    ).first()
    if row is None:
        raise DatabaseError(f"no experiment with id {exp_id}")
    return row


def abort_measuring(s: Session, cmp_id: int, stamp: Any) -> None:
    """Mark the comparison a queue row was measuring ``aborted``, if it is still running."""
    s.execute(
        update(ComparisonRow)
        .where(
            ComparisonRow.id == cmp_id,
            ComparisonRow.status == ComparisonStatus.RUNNING.value,
        )
        .values(status=ComparisonStatus.ABORTED.value, finished_at=stamp)
        .execution_options(synchronize_session=False)
    )
