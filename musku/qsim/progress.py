"""Progress of ``musku qsim run | curve`` on stderr (docs/qsim.md "Progress").

Nothing is shown for the first :data:`AFTER_S` seconds (``$MUSKU_QSIM_PROGRESS_AFTER_S``), so a
short run prints only its result.
After that: a rich progress bar with an ETA when stderr is a terminal, otherwise one plain line
every :data:`EVERY_S` seconds (``qsim: 42 % (simulated 4.2 of 10 s), 12 s elapsed, ETA 17 s``).
The ETA is the elapsed wall time scaled by what is left (a curve weighs each rate by the
requests it simulates, its rate times its duration): on a machine whose load changes it is an
estimate, and a curve that stops at saturation ends earlier than its ETA said.
"""

from __future__ import annotations

import _thread  # threading costs the quick path ~0.005 CPU-s to import, for one lock
import math
import os
import sys
import time

from musku.errors import InputError

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import IO, Any

AFTER_S = 2.0
"""Runs shorter than this show no progress."""
EVERY_S = 5.0
"""Seconds between two plain progress lines (stderr not a terminal)."""
AFTER_ENV = "MUSKU_QSIM_PROGRESS_AFTER_S"
"""Overrides :data:`AFTER_S` (0: from the start; scripts and tests)."""


def after_s_from_env() -> float:
    """:data:`AFTER_S`, or ``$MUSKU_QSIM_PROGRESS_AFTER_S`` (a number >= 0)."""
    raw = os.environ.get(AFTER_ENV, "")
    if raw == "":
        return AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"{AFTER_ENV} must be a number of seconds >= 0, not {raw!r}")
    return value


def eta_s(elapsed_s: float, fraction: float) -> float | None:
    """Seconds left if the rest goes as fast as what is done: None before anything is done."""
    if fraction <= 0.0:
        return None
    return max(0.0, elapsed_s * (1.0 - fraction) / fraction)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Thread-safe sink of a run's progress: :meth:`update` with the fraction done overall.

    ``enabled`` False (``-q``) shows nothing. ``stream`` defaults to stderr; ``tty`` to whether
    it is a terminal, where ``bar_factory`` (the CLI's rich bar: this module draws nothing
    itself, docs/architecture.md "Layers") draws a bar."""

    def __init__(
        self,
        title: str,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        after_s: float = AFTER_S,
        every_s: float = EVERY_S,
        clock: Any = time.monotonic,
        bar_factory: Any = None,
    ) -> None:
        self.title = title
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.after_s = after_s
        self.every_s = every_s
        self.clock = clock
        self.bar_factory = bar_factory  # (stream, title) -> object with update() and stop()
        self.started = clock()
        self.fraction = 0.0
        self.detail = ""
        self.lines = 0  # plain lines written
        self._next_line = self.started + after_s
        self._lock = _thread.allocate_lock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def update(self, fraction: float, detail: str = "") -> None:
        if not self.enabled:
            return
        with self._lock:
            self.fraction = min(1.0, max(self.fraction, fraction))  # never goes back
            self.detail = detail
            now = self.clock()
            elapsed = now - self.started
            if elapsed < self.after_s:
                return
            if self.tty:
                self._show_bar()
            elif now >= self._next_line:
                self._next_line = now + self.every_s
                self.lines += 1
                self.stream.write(self.line(elapsed) + "\n")
                self.stream.flush()

    def line(self, elapsed_s: float) -> str:
        """The plain progress line."""
        left = eta_s(elapsed_s, self.fraction)
        eta = "ETA unknown" if left is None else f"ETA {_clock(left)}"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{self.title}: {self.fraction * 100:.0f} %{detail}, {_clock(elapsed_s)} elapsed, {eta}"
        )

    def _show_bar(self) -> None:
        if self._bar is None:
            if self.bar_factory is None:
                self.tty = False  # no bar to draw: plain lines
                return
            self._bar = self.bar_factory(self.stream, self.title)
        self._bar.update(self.fraction, f"{self.title} {self.detail}".strip())


class CurveProgress:
    """A curve's progress: each rate's run weighs its requests (rate x duration), so the
    overall fraction is the work done over the work of every rate."""

    def __init__(self, sink: Progress, rates: list[float]) -> None:
        self.sink = sink
        self.rates = rates
        self.total = sum(rates) or 1.0
        self.done = 0.0
        self.index = 0

    def start(self, index: int) -> None:
        self.index = index
        self.done = sum(self.rates[:index])
        self.sink.update(self.done / self.total, self._detail())

    def __call__(self, fraction: float, detail: str) -> None:
        here = self.rates[self.index] * fraction
        self.sink.update((self.done + here) / self.total, self._detail())

    def _detail(self) -> str:
        return f"rate {self.index + 1} of {len(self.rates)}: {self.rates[self.index]:.0f} req/s"
