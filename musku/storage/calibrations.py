"""Pair calibrations (``musku pair calibrate``) and the per-configuration warm-up transients
remembered for a pair. A repository of the results store (:mod:`musku.storage.core`); the
:class:`~musku.storage.store.Store` façade composes it.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select

from musku.storage import convert
from musku.storage.core import Repository, guard
from musku.storage.models import ConfigTransientRow, PairCalibrationRow

if TYPE_CHECKING:
    from musku.domain import PairCalibration


class Calibrations(Repository):
    """Pair calibrations (``musku pair calibrate``) and the per-configuration warm-up transients
    remembered for a pair."""

    @guard
    def save_calibration(self, cal: PairCalibration) -> int:
        """Store a pair calibration (``musku pair calibrate``); the newest one of a pair is
        the one in force."""
        with self._session() as s, s.begin():
            row = PairCalibrationRow(**convert.calibration_columns(cal))
            s.add(row)
            s.flush()
            return row.id

    @guard
    def calibration(self, pair: str) -> PairCalibration | None:
        """The newest calibration of ``pair`` (None: never calibrated)."""
        with self._session() as s:
            row = s.scalars(
                select(PairCalibrationRow)
                .where(PairCalibrationRow.pair == pair)
                .order_by(PairCalibrationRow.id.desc())
                .limit(1)
            ).first()
            return convert.calibration_from_row(row) if row is not None else None

    @guard
    def calibration_before(self, pair: str, when: datetime) -> PairCalibration | None:
        """The calibration of ``pair`` in force at ``when``: the newest taken by then (what a
        run that started then used; ``musku results NAME``)."""
        with self._session() as s:
            row = s.scalars(
                select(PairCalibrationRow)
                .where(PairCalibrationRow.pair == pair, PairCalibrationRow.taken_at <= when)
                .order_by(PairCalibrationRow.id.desc())
                .limit(1)
            ).first()
            return convert.calibration_from_row(row) if row is not None else None

    @guard
    def mark_recalibration(self, pair: str, note: str) -> bool:
        """Flag the newest calibration of ``pair`` as needing a new one (a comparison's bias
        estimate breached its bound). False when the pair has none."""
        with self._session() as s, s.begin():
            row = s.scalars(
                select(PairCalibrationRow)
                .where(PairCalibrationRow.pair == pair)
                .order_by(PairCalibrationRow.id.desc())
                .limit(1)
            ).first()
            if row is None:
                return False
            row.needs_recalibration = True
            row.note = note[:2000]
            return True

    @guard
    def save_transient(self, pair: str, hardware: str, config_key: str, seconds: float) -> int:
        with self._session() as s, s.begin():
            row = ConfigTransientRow(
                pair=pair,
                hardware=hardware,
                config_key=config_key,
                seconds=float(seconds),
                measured_at=convert.now(),
            )
            s.add(row)
            s.flush()
            return row.id

    @guard
    def transient(self, pair: str, hardware: str, config_key: str) -> float | None:
        """The warm-up transient (s) remembered for a configuration on a pair: the median of
        its three newest measurements, so one spurious long detection does not stick (None:
        never measured)."""
        with self._session() as s:
            vals = s.scalars(
                select(ConfigTransientRow.seconds)
                .where(
                    ConfigTransientRow.pair == pair,
                    ConfigTransientRow.hardware == hardware,
                    ConfigTransientRow.config_key == config_key,
                )
                .order_by(ConfigTransientRow.id.desc())
                .limit(3)
            ).all()
            return float(sorted(vals)[len(vals) // 2]) if vals else None

    def transients(self, pair: str, hardware: str) -> StoredTransients:
        """A mapping config key -> transient seconds backed by this store (for
        :class:`musku.abtest.calibration.PairMemory`)."""
        return StoredTransients(self, pair, hardware)


class StoredTransients(MutableMapping[str, float]):
    """Per-configuration warm-up transients of one pair, read from and written to a store."""

    def __init__(self, store: Calibrations, pair: str, hardware: str) -> None:
        self.store, self.pair, self.hardware = store, pair, hardware
        self._cache: dict[str, float] = {}

    def __getitem__(self, key: str) -> float:
        if key not in self._cache:
            got = self.store.transient(self.pair, self.hardware, key)
            if got is None:
                raise KeyError(key)
            self._cache[key] = got
        return self._cache[key]

    def __setitem__(self, key: str, value: float) -> None:
        self.store.save_transient(self.pair, self.hardware, key, value)
        self._cache[key] = float(value)

    def __delitem__(self, key: str) -> None:
        raise TypeError("measured transients are kept (the median of the newest three counts)")

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._cache))

    def __len__(self) -> int:
        return len(self._cache)
