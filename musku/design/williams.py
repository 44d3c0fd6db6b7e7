"""Williams designs: Latin squares balanced for first-order carry-over.

A design for ``n`` arms is a ``periods x hosts`` matrix of arm indices (0 = the baseline):

- ``n`` even: one Williams square, ``n`` periods. Row ``i`` (host ``i``) of the square is
  ``(s_j + i) mod n`` with the base sequence ``s = 0, 1, n-1, 2, n-2, ...``.
- ``n`` odd: no single square is carry-over balanced, so the square is followed by its mirror
  image (each host's sequence reversed), ``2 n`` periods (Williams 1949).

Every host runs every arm once per square and every period runs every arm once, so a fixed
host bias and a period (load) effect cancel from any contrast of arm means; every ordered pair
of distinct arms follows each other equally often inside the squares (once per square for even ``n``), so a
first-order carry-over left by the previous arm is balanced too. Across square boundaries the
rotation simply repeats: for odd ``n`` a host's sequence is ``a..z | z..a | a..z ...``, so the
boundaries repeat an arm (no switch, no warm-up to discard); for even ``n`` the wrap-around
switch is outside the balance (its warm-up is discarded like every other).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from musku.errors import InputError

IntArray = NDArray[np.int64]


def base_sequence(n: int) -> list[int]:
    """``0, 1, n-1, 2, n-2, ...``: successive differences take every non-zero value mod ``n``
    once (for even ``n``), which is what balances the carry-over."""
    seq = [0]
    lo, hi = 1, n - 1
    take_lo = True
    while len(seq) < n:
        if take_lo:
            seq.append(lo)
            lo += 1
        else:
            seq.append(hi)
            hi -= 1
        take_lo = not take_lo
    return seq


def williams(n: int) -> IntArray:
    """The Williams design for ``n >= 2`` arms as a ``(periods, n)`` matrix: entry ``[p, h]``
    is the arm host ``h`` runs in period ``p`` (``n`` periods for even ``n``, ``2 n`` for odd)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InputError(f"a Williams design needs an integer number of arms >= 2, not {n!r}")
    s = np.array(base_sequence(n), dtype=np.int64)
    square = (s[None, :] + np.arange(n, dtype=np.int64)[:, None]) % n  # rows = hosts
    if n % 2 == 0:
        return square.T.copy()
    return np.concatenate([square, square[:, ::-1]], axis=1).T.copy()


def squares(design: IntArray) -> list[IntArray]:
    """The design's Latin squares (each ``n x n``, periods x hosts)."""
    n = design.shape[1]
    return [design[i : i + n] for i in range(0, design.shape[0], n)]


def successions(design: IntArray) -> dict[tuple[int, int], int]:
    """How often each ordered pair ``(a, b)`` of arms occurs as successive periods of one host,
    counted inside the squares (the pairs the carry-over balance is about)."""
    counts: dict[tuple[int, int], int] = {}
    for sq in squares(design):
        for p in range(sq.shape[0] - 1):
            for h in range(sq.shape[1]):
                key = (int(sq[p, h]), int(sq[p + 1, h]))
                counts[key] = counts.get(key, 0) + 1
    return counts
