"""What the generators share: the threads that build rows and make blocks, the bucketed sort of
edge keys, the band rows of stencil and band matrices, the narrowing of a whole matrix's
indices and the checks of the registry's parameters."""
import numpy as np

from ..threads import threaded
from ..formats import CSRMatrix
from ..arrays import distinct_of_sorted, sorted_distinct


#: keys below which :func:`_sorted_unique_keys` sorts in one piece
_BUCKET_SORT_MIN = 1 << 22


def _sorted_unique_keys(keys, key_range):
    """:func:`~hisparse.arrays.sorted_distinct` of ``keys`` (int64 in ``[0, key_range)``),
    sorted in buckets of the key range on the host's threads: the buckets' keys are gathered
    apart (a stable sort of small bucket numbers, NumPy's radix sort), each bucket sorted and
    de-duplicated on its own thread, and the buckets laid end to end are sorted because the
    ranges are. One sort of all
    of R-MAT 23's 134M edge keys took most of the one-rank generation."""
    from ..threads import usable_cores
    cores = usable_cores()
    if len(keys) < _BUCKET_SORT_MIN or cores < 4:  # too few keys or cores to repay the pass
        return sorted_distinct(keys)
    buckets = min(4 * cores, 1024)
    width = -(-int(key_range) // buckets)
    bucket = (keys // width).astype(np.int16)
    order = np.argsort(bucket, kind="stable")
    starts = np.searchsorted(bucket[order], np.arange(buckets + 1, dtype=np.int16))
    grouped = keys[order]
    del order, bucket
    parts = [None] * buckets

    def sort_bucket(index):
        part = grouped[starts[index]:starts[index + 1]]
        part.sort()
        parts[index] = distinct_of_sorted(part)
    threaded(sort_bucket, range(buckets), name="hisparse-sort")
    return np.concatenate(parts)


def _probability(value):
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


#: Rows of a stencil or band matrix built per step (temporaries of a few MB per worker).
_ROW_CHUNK = 1 << 15
#: Most threads that build a band matrix's rows at once (beyond that the steps wait on memory).
_MAX_BUILD_WORKERS = 32


def _each_chunk(count, work):
    """``work(lo, hi)`` over the consecutive chunks of ``count`` rows, by a pool of threads when
    there are several chunks: NumPy releases the GIL in its array operations, so the chunks are
    built at once on as many cores as the process may use (at most :data:`_MAX_BUILD_WORKERS`).
    Each chunk writes its own slices of preallocated arrays, so the result does not depend on
    the number of threads."""
    _threaded(lambda lo: work(lo, min(lo + _ROW_CHUNK, count)), range(0, count, _ROW_CHUNK))


def _threaded(work, items):
    """:func:`~hisparse.threads.threaded` with at most :data:`_MAX_BUILD_WORKERS` threads."""
    threaded(work, items, _MAX_BUILD_WORKERS, "hisparse-generate")



class _BandRows:
    """Rows of a matrix whose row ``i`` holds columns ``i + shift`` for a fixed list of shifts,
    each present where a validity test passes (stencils on a grid, Trefethen's power-of-two
    bands): any set of rows is built without the others, so ranks make their own rows.

    Shift 0 (the diagonal) is present in every row and holds ``diagonal(rows)``; every other
    present entry holds ``off_diagonal``. ``pattern(rows)`` gives the present entries, a bool
    array ``(len(rows), len(shifts))``, and where each row's diagonal entry falls among them;
    ``count(rows)`` the entries of each row (int64), without the mask."""

    def __init__(self, nrows, shifts, pattern, count, diagonal, off_diagonal):
        self.nrows, self.shifts = int(nrows), np.asarray(shifts, dtype=np.int64)
        self.pattern, self.count = pattern, count
        self.diagonal, self.off_diagonal = diagonal, float(off_diagonal)

    def lengths(self, rows):
        """Entries of each row in ``rows`` (int64)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(len(rows), dtype=np.int64)

        def count(lo, hi):
            out[lo:hi] = self.count(rows[lo:hi])

        _each_chunk(len(rows), count)
        return out

    def build(self, rows, ncols, lengths=None):
        """The rows ``rows`` (ascending) as a CSRMatrix of shape ``(len(rows), ncols)``, columns
        sorted; int64 row pointers, int32 columns when they fit. Chunks of rows are built by
        threads straight into the result's arrays (:func:`_each_chunk`). ``lengths``: the
        rows' :meth:`lengths` when the caller has them already."""
        rows = np.asarray(rows, dtype=np.int64)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(self.lengths(rows) if lengths is None else lengths, out=indptr[1:])
        limit = np.iinfo(np.int32).max
        column_dtype = np.int32 if ncols <= limit else np.int64
        # Candidate columns in the narrow dtype too when every row number fits it: the present
        # ones are columns (they fit); absent ones may wrap, but the mask drops them.
        candidate_dtype = column_dtype if self.nrows <= limit else np.int64
        shifts = self.shifts.astype(candidate_dtype)
        indices = np.empty(int(indptr[-1]), dtype=column_dtype)
        data = np.empty(int(indptr[-1]), dtype=np.float64)

        def fill(lo, hi):
            chunk = rows[lo:hi]
            mask, diagonal_slot = self.pattern(chunk)
            start, stop = indptr[lo], indptr[hi]
            indices[start:stop] = (chunk.astype(candidate_dtype)[:, None] + shifts)[mask]
            values = data[start:stop]
            values.fill(self.off_diagonal)
            values[indptr[lo:hi] - start + diagonal_slot] = self.diagonal(chunk)

        _each_chunk(len(rows), fill)
        return CSRMatrix(indptr, indices, data, (len(rows), int(ncols)))


def _whole(matrix, symmetric=False):
    """A generated whole matrix, its index arrays in the narrowest dtype that holds them."""
    limit = np.iinfo(np.int32).max
    indptr = matrix.indptr.astype(np.int32 if matrix.nnz <= limit else np.int64, copy=False)
    indices = matrix.indices.astype(np.int32 if matrix.ncols <= limit else np.int64, copy=False)
    return CSRMatrix(indptr, indices, matrix.data, matrix.shape, symmetric)
