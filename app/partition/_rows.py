"""Row partitions of a CSR matrix over ranks."""
from dataclasses import dataclass

import numpy as np

from ..arrays import count_values
from ..compiled import HAVE_NUMBA, compiled, compiled_parallel, prange
from ..errors import LayoutError
from ..threads import threaded, usable_cores

ROW_STRATEGIES = ("nnz_balanced", "row_modulo", "row_blocks")


@dataclass
class RowPartition:
    """The rows each rank owns.

    Attributes
    ----------
    strategy : str
    rows : list of ndarray, int64
        ``rows[r]`` are the global row ids of rank ``r``, ascending.
    bounds : ndarray, shape (nparts + 1,), int64, or None
        For contiguous strategies, rank ``r`` owns ``bounds[r]:bounds[r+1]``.
    """

    strategy: str
    rows: list
    bounds: object = None

    @property
    def contiguous(self):
        return self.bounds is not None

    def nnz_per_part(self, indptr):
        lengths = np.diff(np.asarray(indptr, dtype=np.int64))
        return np.array([int(lengths[r].sum()) for r in self.rows], dtype=np.int64)


def check_rows(nrows, nparts):
    """Raise :class:`LayoutError` when ``nrows`` rows cannot give each of ``nparts`` ranks one."""
    if nrows == 0:
        raise LayoutError("the matrix has no rows: there is nothing to split over the ranks")
    if nparts > nrows:
        raise LayoutError(f"more ranks ({nparts}) than rows ({nrows}); run with at most {nrows} "
                          f"ranks")


def nnz_balanced_blocks(indptr, nparts):
    """Contiguous row blocks with about ``nnz / nparts`` entries each.

    Boundaries are placed where the running entry count crosses ``k * nnz / nparts`` (counting
    each row once more, so runs of empty rows are spread too), and every part gets at least one
    row.

    Parameters
    ----------
    indptr : ndarray, shape (m + 1,)
    nparts : int

    Returns
    -------
    ndarray, shape (nparts + 1,), int64
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    nrows = len(indptr) - 1
    check_rows(nrows, nparts)
    targets = balance_targets(int(indptr[-1]), nrows, nparts)
    return bounds_from_cuts(weight_counts(indptr[:-1], 0, targets), nrows, nparts)


def balance_targets(nnz, nrows, nparts):
    """Where the nnz-balanced boundaries fall on the row weight ``indptr[i] + i``: ``k / nparts``
    of the total weight ``nnz + nrows``, ``k = 1 .. nparts - 1`` (float64, the same on every
    rank)."""
    return float(nnz + nrows) * np.arange(1, nparts, dtype=np.float64) / nparts


def weight_counts(indptr_slice, first_row, targets):
    """How many rows of a slice of ``indptr`` lie below each target weight.

    The weight of row ``i`` is ``indptr[i] + i``: a row costs a little even when empty (its y
    entry is written). Summed over slices that cover rows ``0 .. m-1`` once each, the counts are
    ``np.searchsorted(weight, targets, side="left")`` over the whole array: the cut rows of
    :func:`bounds_from_cuts`. This is how ranks that each hold a slice of ``indptr`` (read by
    part, or a generator's rows) find the same boundaries without gathering it.

    Parameters
    ----------
    indptr_slice : ndarray
        ``indptr[first_row : first_row + len]`` (global entry offsets).
    first_row : int
    targets : ndarray of float64
        From :func:`balance_targets`.

    Returns
    -------
    ndarray of int64, shape (len(targets),)
    """
    weight = np.asarray(indptr_slice, dtype=np.int64) + \
        np.arange(first_row, first_row + len(indptr_slice), dtype=np.int64)
    return np.searchsorted(weight, targets, side="left").astype(np.int64)


def bounds_from_cuts(cuts, nrows, nparts):
    """Row bounds ``(nparts + 1,)`` from the interior cut rows, forced strictly increasing so that
    every rank owns at least one row."""
    bounds = np.concatenate([[0], np.asarray(cuts, dtype=np.int64), [nrows]]).astype(np.int64)
    for k in range(1, nparts):
        bounds[k] = min(max(bounds[k], bounds[k - 1] + 1), nrows - (nparts - k))
    return bounds


def equal_blocks(nrows, nparts):
    """Bounds of ``row_blocks``: equal row counts per rank."""
    check_rows(nrows, nparts)
    return np.linspace(0, nrows, nparts + 1).round().astype(np.int64)


def row_modulo(nrows, nparts):
    """Rank ``r`` owns rows ``r, r + nparts, r + 2 nparts, ...`` (the SpGEMM seed's layout)."""
    check_rows(nrows, nparts)
    return [np.arange(r, nrows, nparts, dtype=np.int64) for r in range(nparts)]


def partition_rows(indptr, nparts, strategy):
    """Partition the rows of a CSR matrix.

    Parameters
    ----------
    indptr : ndarray, shape (m + 1,)
    nparts : int
    strategy : {"nnz_balanced", "row_modulo", "row_blocks"}
        ``row_blocks`` is equal row counts per rank.

    Returns
    -------
    RowPartition
    """
    nrows = len(indptr) - 1
    if strategy == "nnz_balanced":
        bounds = nnz_balanced_blocks(indptr, nparts)
    elif strategy == "row_blocks":
        bounds = equal_blocks(nrows, nparts)
    elif strategy == "row_modulo":
        return RowPartition(strategy, row_modulo(nrows, nparts))
    else:
        raise ValueError(f"unknown row partition strategy {strategy!r}")
    rows = [np.arange(bounds[r], bounds[r + 1], dtype=np.int64) for r in range(nparts)]
    return RowPartition(strategy, rows, bounds)


#: items from which :func:`group_by_owner` sorts pieces of the items on the host's threads and
#: places each piece's groups (below, or on one core, one sort: the placing pass costs more than
#: it saves without threads)
GROUP_PIECE = 1 << 22


def group_by_owner(owner, nparts):
    """Items grouped by the rank that owns them, each group in the items' own order (a stable
    sort): ``(order, cuts)`` with rank ``r``'s items at ``order[cuts[r]:cuts[r + 1]]``.
    ``owner`` is a NumPy or CuPy array of ranks; ``order`` stays in its array module, ``cuts``
    (int64, ``nparts + 1``) is on the host. The one grouping every redistribution uses before
    its all-to-all or scatter."""
    if isinstance(owner, np.ndarray):
        if len(owner) > GROUP_PIECE and usable_cores() > 1:
            return _group_in_pieces(owner, nparts)
        order = np.argsort(_narrow(owner, nparts), kind="stable")
        counts = np.bincount(owner, minlength=nparts)
    else:  # CuPy: its argsort is a stable radix sort
        import cupy
        order = cupy.argsort(owner)
        counts = count_values(owner, nparts).get()
    cuts = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(counts[:nparts], out=cuts[1:])
    return order, cuts


def _narrow(owner, nparts):
    """``owner`` as uint8 or uint16 where the ranks fit: NumPy's stable sort is a radix sort on
    integers of at most 16 bits, 4-5x faster than its merge sort on int64 (33M items in 4
    groups: 0.36 against 1.56 s)."""
    narrow = np.uint8 if nparts <= 1 << 8 else np.uint16 if nparts <= 1 << 16 else None
    return owner.astype(narrow, copy=False) if narrow else owner


def _group_in_pieces(owner, nparts):
    """:func:`group_by_owner` for many items: each piece of :data:`GROUP_PIECE` items sorted on
    its own thread, then each piece's groups copied to their places (a group's pieces in piece
    order, so the grouping is the one stable sort of all the items). A rank's 33M entries of
    R-MAT 23 grouped by holder: 0.9 s on one core."""
    bounds = list(range(0, len(owner), GROUP_PIECE)) + [len(owner)]
    spans = list(zip(bounds[:-1], bounds[1:]))
    sorted_pieces = [None] * len(spans)
    counts = np.zeros((len(spans), nparts), dtype=np.int64)

    def sort(piece):
        start, stop = spans[piece]
        sorted_pieces[piece] = np.argsort(_narrow(owner[start:stop], nparts), kind="stable")
        counts[piece] = np.bincount(owner[start:stop], minlength=nparts)[:nparts]
    threaded(sort, range(len(spans)), name="hisparse-group")
    cuts = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(counts.sum(axis=0), out=cuts[1:])
    # where piece i's items of rank r go: after the lower ranks and the earlier pieces' items
    places = cuts[:-1] + np.cumsum(counts, axis=0) - counts
    order = np.empty(len(owner), dtype=np.int64)

    def place(piece):
        start = spans[piece][0]
        within = np.concatenate([[0], np.cumsum(counts[piece])])
        for rank in np.flatnonzero(counts[piece]):
            here = places[piece, rank]
            order[here:here + counts[piece, rank]] = \
                sorted_pieces[piece][within[rank]:within[rank + 1]] + start
    threaded(place, range(len(spans)), name="hisparse-group")
    return order, cuts


def split_by_owner(owner, nparts, *arrays):
    """``arrays`` (indexed by item) split by the rank owning each item (:func:`group_by_owner`):
    a list of ``nparts`` tuples, rank ``r``'s items of every array, in their own order."""
    order, cuts = group_by_owner(owner, nparts)
    parts = []
    for r in range(nparts):
        take = order[cuts[r]:cuts[r + 1]]
        parts.append(tuple(array[take] for array in arrays))
    return parts


#: pairs from which :func:`group_pairs` places them on the host's threads (compiled); fewer
#: take :func:`group_by_owner`'s stable sort and two gathers
GROUP_PAIRS_COMPILED_MIN = 1 << 20


def owners_of(keys, bounds=None, nparts=None):
    """The part owning each key: part ``p`` owns ``bounds[p]:bounds[p + 1]`` (ascending), or,
    without ``bounds``, the keys equal to ``p`` modulo ``nparts`` (``row_modulo``)."""
    keys = np.asarray(keys)
    return keys % nparts if bounds is None else np.searchsorted(bounds, keys, side="right") - 1


def group_pairs(keys, values, bounds=None, nparts=None):
    """``(keys, values, cuts)``: the pairs grouped by the part that owns each key, part ``p``'s
    at ``cuts[p]:cuts[p + 1]`` in their own order (what :func:`group_by_owner` and two gathers
    give); the parts own the keys by :func:`owners_of`'s rule (``bounds`` covering the keys).

    From :data:`GROUP_PAIRS_COMPILED_MIN` pairs the pairs are counted by chunk and part, and
    each chunk's placed at once, on the host's threads (Numba): R-MAT 23's edges at 2 ranks,
    67M a rank, took 1.3 s by owner search, stable sort and gathers on 16 cores.
    """
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    modulo = bounds is None
    parts = int(nparts) if modulo else len(bounds) - 1
    if not (HAVE_NUMBA and len(keys) >= GROUP_PAIRS_COMPILED_MIN):
        order, cuts = group_by_owner(owners_of(keys, bounds, parts), parts)
        return keys[order], values[order], cuts
    bounds = np.zeros(1, np.int64) if modulo else np.asarray(bounds, dtype=np.int64)
    chunks = max(1, min(8 * usable_cores(), -(-len(keys) // (1 << 16))))
    chunk_cuts = np.linspace(0, len(keys), chunks + 1).astype(np.int64)
    counts = np.zeros((chunks, parts), dtype=np.int64)
    _count_by_part(keys, chunk_cuts, bounds, parts, modulo, counts)
    # place[c, p]: where chunk c's pairs of part p go, after the lower parts' pairs and the
    # earlier chunks' of part p
    flat = np.zeros(chunks * parts + 1, dtype=np.int64)
    np.cumsum(counts.T.ravel(), out=flat[1:])
    cuts = np.append(flat[:-1:chunks], len(keys)).astype(np.int64)
    place = flat[:-1].reshape(parts, chunks).T.copy()
    grouped_keys, grouped_values = np.empty_like(keys), np.empty_like(values)
    _place_by_part(keys, values, chunk_cuts, bounds, parts, modulo, place, grouped_keys,
                   grouped_values)
    return grouped_keys, grouped_values, cuts


@compiled
def _part_of(key, bounds, parts, modulo):
    """The part owning ``key`` (:func:`owners_of`' rule, compiled)."""
    if modulo:
        return key % parts
    low, high = 0, parts  # the last p with bounds[p] <= key
    while high - low > 1:
        middle = (low + high) // 2
        if bounds[middle] <= key:
            low = middle
        else:
            high = middle
    return low


@compiled_parallel
def _count_by_part(keys, chunk_cuts, bounds, parts, modulo, counts):
    """counts[c, p]: the keys of chunk c that part p owns."""
    for chunk in prange(len(chunk_cuts) - 1):
        for item in range(chunk_cuts[chunk], chunk_cuts[chunk + 1]):
            counts[chunk, _part_of(keys[item], bounds, parts, modulo)] += 1


@compiled_parallel
def _place_by_part(keys, values, chunk_cuts, bounds, parts, modulo, place, grouped_keys,
                   grouped_values):
    """Each chunk's pairs to their part's places (``place``, advanced as they are used)."""
    for chunk in prange(len(chunk_cuts) - 1):
        for item in range(chunk_cuts[chunk], chunk_cuts[chunk + 1]):
            key = keys[item]
            part = _part_of(key, bounds, parts, modulo)
            at = place[chunk, part]
            grouped_keys[at] = key
            grouped_values[at] = values[item]
            place[chunk, part] = at + 1
