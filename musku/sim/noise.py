"""The simulators' AR(1) noise filter, with scipy imported on first use.

``scipy.signal`` costs about 1 CPU-s to import (its array-API back-end machinery), 40 % of a
``musku check`` process; every CLI command that loads the sim backend paid it, whether it ran
a simulation or not (check, dry runs, results, report...), and the test suite runs hundreds of
them. Only a simulation's windows need it."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def ar1(coef: float, e: npt.NDArray[Any], state: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``x[t] = coef * x[t-1] + e[t]`` along axis 0, continuing from ``x[-1] = state`` (one
    column per host): ``scipy.signal.lfilter([1], [1, -coef], e, axis=0, zi=coef * state)``."""
    from scipy.signal import lfilter  # lazy: ~1 CPU-s to import, see the module's docstring

    x, _ = lfilter([1.0], [1.0, -coef], e, axis=0, zi=(coef * state)[None, :])
    return np.asarray(x, dtype=float)
