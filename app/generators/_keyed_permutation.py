"""The keyed permutation: a Feistel network with cycle walking, every id mapped on its own (NumPy,
compiled or on a GPU, the same bits)."""
from dataclasses import dataclass

import numpy as np

from ..compiled import HAVE_NUMBA, compiled, splitmix64
from ..arrays import array_module



#: :func:`keyed_permutation`'s default rounds and stream
PERMUTATION_ROUNDS, PERMUTATION_STREAM = 4, 1


def keyed_permutation(values, n, seed, rounds=PERMUTATION_ROUNDS, stream=PERMUTATION_STREAM):
    """A pseudo-random bijection of ``[0, n)``, keyed by ``(seed, stream)``, applied to ``values``
    (a NumPy or CuPy array: the result is the same bits either way).

    A balanced Feistel network over the smallest even power of two >= n, with cycle walking back
    into ``[0, n)``: every id is mapped on its own, so ranks permute their ids without an
    ``n``-sized table. (A bijection keeps the multiset of degrees or row lengths, so the
    statistics of what it permutes are those of any other permutation.)
    """
    return _permuted(values, _permutation(n, seed, rounds, stream))


def _permuted(values, params, compiled_walk=HAVE_NUMBA):
    """:func:`keyed_permutation` with its :class:`Permutation` made (a caller permuting many
    arrays with one key makes it once: its keys come from a seed sequence, ~45 us); on the host
    by the compiled walk where ``compiled_walk``, else by NumPy's passes."""
    xp = array_module(values)
    values = xp.asarray(values).astype(xp.int64, copy=False)
    if xp is not np:  # one kernel, each id walking on its own: the same bits
        from ..gpu import device_keyed_permutation
        return device_keyed_permutation(xp, values.astype(xp.uint64), params).view(xp.int64)
    limit, half, mask = params.words()
    keys = params.keys
    values = values.astype(np.uint64)
    if not compiled_walk:
        return _feistel_walk_numpy(values, limit, half, mask, keys).astype(np.int64)
    out = np.empty(len(values), dtype=np.uint64)
    _feistel_walk_host(values, limit, half, mask, keys, out)
    return out.view(np.int64)  # every id < n < 2**63


@dataclass
class Permutation:
    """:func:`keyed_permutation`'s parameters: ids walk until they fall below ``limit``;
    ``shift`` and ``low`` split a word into its halves (``low`` the mask of the lower); ``keys``
    the rounds' keys (uint64)."""

    limit: int
    shift: int
    low: int
    keys: np.ndarray

    def words(self):
        """``(limit, shift, low)`` as uint64 scalars: the walk's operands (compiled code and
        kernels take them so)."""
        return np.uint64(self.limit), np.uint64(self.shift), np.uint64(self.low)


def _permutation(n, seed, rounds=PERMUTATION_ROUNDS, stream=PERMUTATION_STREAM):
    """:func:`keyed_permutation`'s :class:`Permutation`: the network spans the smallest even
    number of bits >= those of ``n - 1`` (at least 2); the rounds' keys come from ``(seed,
    stream)``."""
    bits = max(2, int(n - 1).bit_length())
    bits += bits & 1
    keys = np.random.SeedSequence([seed, stream]).generate_state(rounds, dtype=np.uint64)
    return Permutation(limit=int(n), shift=bits // 2, low=(1 << (bits // 2)) - 1, keys=keys)


def _feistel(x, half, mask, keys):
    """The Feistel network of :func:`keyed_permutation` on a NumPy uint64 array."""
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ (_mix64(right ^ key) & mask)
    return (left << half) | right


def _feistel_walk_numpy(values, n, half, mask, keys):
    """:func:`keyed_permutation` in NumPy array passes: the network on every id, then again on
    those still outside ``[0, n)`` until none is. The reference of the compiled walk, and what
    runs without Numba; its passes over the few ids left shrink to a handful of elements, which
    cost the interpreter more than the arithmetic (an R-MAT edge block of 65,536 ids takes
    about 17)."""
    out = _feistel(values, half, mask, keys)
    outside = np.flatnonzero(out >= n)
    while len(outside):
        out[outside] = _feistel(out[outside], half, mask, keys)
        outside = outside[out[outside] >= n]
    return out


@compiled
def _feistel_walk_host(values, n, half, mask, keys, out):
    """:func:`keyed_permutation` compiled, each id walking on its own (the device kernel's loop):
    the same bits as :func:`_feistel_walk_numpy`, one pass. Runs without the interpreter's lock,
    so the threads that make R-MAT's edge blocks permute at once."""
    for i in range(values.shape[0]):
        out[i] = _feistel_walk_one(values[i], n, half, mask, keys)


@compiled
def _feistel_walk_one(v, n, half, mask, keys):
    """One id's walk through :func:`keyed_permutation`'s network (uint64 operands)."""
    while True:
        left = v >> half
        right = v & mask
        for r in range(keys.shape[0]):
            left, right = right, left ^ (splitmix64(right ^ keys[r]) & mask)
        v = (left << half) | right
        if v < n:
            return v


def _mix64(x):
    """SplitMix64's finaliser: a bijective scramble of 64-bit words (wrapping arithmetic; NumPy
    or CuPy uint64 arrays, or NumPy scalars)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
