"""The verification's Y = X x_n v on the host, in plain NumPy (float64), and the matching of Y's
fibers with it: every nonzero keyed by its coordinates outside mode n, value x v[i_n] summed
per key."""
import numpy as np

from ...formats import linear_fiber_keys

#: fiber positions (the product of the other modes' sizes) up to which the reference sums into a
#: dense array over every position (linear in nnz, no sort), per nonzero and in all; beyond,
#: it sorts the keys. The dense arrays cost 9 bytes a position (a flag and a float64 sum): at
#: most 36 bytes a nonzero, about the COO tensor's own 32, where a bound on positions alone let
#: a sparse tensor's reference take 0.9 GB for 6M nonzeros (rank 0 of a 4-rank run, verifying:
#: 1.39 GB against 0.28 GB on the other ranks).
DENSE_POSITIONS_PER_NONZERO = 4
DENSE_POSITIONS = 5e8


def fiber_sums(indices, values, shape, mode, vector):
    """Y of the COO tensor ``(indices, values)`` of ``shape`` times ``vector`` along ``mode``.

    Returns
    -------
    coords : ndarray, (nfibers, order - 1), int64
        The non-empty fibers' coordinates outside ``mode``, sorted lexicographically.
    values : ndarray of float64
    """
    other = [m for m in range(len(shape)) if m != mode]
    dims = [shape[m] for m in other]
    coords = tuple(indices[:, m] for m in other)  # column views: no copy of the indices
    products = values.astype(np.float64) * np.asarray(vector, np.float64)[indices[:, mode]]
    size = float(np.prod([float(d) for d in dims]))
    if size <= min(DENSE_POSITIONS, DENSE_POSITIONS_PER_NONZERO * max(len(values), 1)):
        keys = np.ravel_multi_index(coords, dims)
        # Which fibers hold a nonzero: a byte per fiber position, not bincount's int64 counts
        # (several times faster: docs/ops/sptv.md).
        occupied = np.zeros(int(size), dtype=bool)
        occupied[keys] = True
        present = np.flatnonzero(occupied)
        del occupied
        sums = np.bincount(keys, weights=products, minlength=int(size))[present]
        fiber_coords = np.stack(np.unravel_index(present, dims), axis=1).astype(np.int64)
        return fiber_coords.reshape(-1, len(other)), sums
    if size < 2.0 ** 62:
        keys = np.ravel_multi_index(coords, dims)
        unique, inverse = np.unique(keys, return_inverse=True)
        fiber_coords = np.stack(np.unravel_index(unique, dims), axis=1).astype(np.int64)
    else:
        fiber_coords, inverse = np.unique(np.stack(coords, axis=1), axis=0, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=products, minlength=len(fiber_coords))
    return fiber_coords.reshape(-1, len(other)), sums


def lexicographic_order(coords, dims):
    """The permutation sorting the rows of ``coords`` lexicographically, or None when they are
    sorted already (one rank's Y is, and the ranks' parts follow each other by blocks): by
    their linear keys when those fit int64 (a check, else one argsort), else ``lexsort``."""
    if len(coords) < 2:
        return None
    keys = linear_fiber_keys(coords, dims)
    if keys is None:
        return np.lexsort(coords.T[::-1])
    if bool(np.all(keys[1:] > keys[:-1])):
        return None
    return np.argsort(keys, kind="stable")


def rows_in(sorted_coords, coords, dims):
    """Position of each row of ``coords`` in the lexicographically sorted ``sorted_coords``
    (``-1`` where absent)."""
    keys, wanted = linear_fiber_keys(sorted_coords, dims), linear_fiber_keys(coords, dims)
    if keys is not None:
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        found = keys[at] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)
        return np.where(found, at, -1)
    # Keys could overflow int64: number the distinct rows of both sets instead.
    _, inverse = np.unique(np.concatenate([sorted_coords, coords]), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    position = np.full(inverse.max() + 1 if len(inverse) else 0, -1, dtype=np.int64)
    position[inverse[:len(sorted_coords)]] = np.arange(len(sorted_coords))
    return position[inverse[len(sorted_coords):]]
