"""Trefethen matrices: primes on the diagonal, ones at power-of-two distances (band rows)."""
import numpy as np

from ._common import _BandRows, _whole


def _primes(count):
    """The first ``count`` primes, int64."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    limit = max(16, int(count * (np.log(count) + np.log(np.log(count + 2)) + 2)))
    sieve = np.ones(limit + 1, dtype=bool)
    sieve[:2] = False
    for p in range(2, int(limit ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = False
    return np.flatnonzero(sieve)[:count].astype(np.int64)


def _trefethen_band(n):
    """:class:`_BandRows` of Trefethen_n: the ``i``-th prime on the diagonal, ones at
    ``|i - j| = 2**k``."""
    steps = np.array([1 << k for k in range(max(int(n - 1).bit_length(), 0)) if (1 << k) < n],
                     dtype=np.int64)
    shifts = np.concatenate([-steps[::-1], [0], steps])
    primes = _primes(n).astype(np.float64)

    def below(rows):  # present entries left of the diagonal: the steps 2**k <= row
        return np.searchsorted(steps, rows, side="right")

    def pattern(rows):
        moved = rows[:, None] + shifts[None, :]
        return (moved >= 0) & (moved < n), below(rows)

    def count(rows):
        return 1 + below(rows) + below(n - 1 - rows)

    return _BandRows(n, shifts, pattern, count, lambda rows: primes[rows], 1.0)


def trefethen(n):
    """Trefethen_n: primes 2, 3, 5, ... on the diagonal and ones where ``|i - j|`` is a power of 2.

    SPD; ``inv(A)[0, 0]`` of Trefethen_20000 is 0.7250783462684011... (SIAM 100-digit problem 7).
    """
    band = _trefethen_band(n)
    return _whole(band.build(np.arange(n, dtype=np.int64), n), symmetric=True)
