"""Compressed sparse row matrices with validation."""
from dataclasses import dataclass

import numpy as np

from ..arrays import materialized, min_max, repeated_value, sorted_distinct
from ._checks import first_non_finite
from ..compiled import compiled, compiled_parallel, prange
from ..errors import InputError
from ..threads import over_pieces

INT32_MAX = np.iinfo(np.int32).max


def index_dtype_for(max_value, width="auto"):
    """Choose the index dtype able to hold ``max_value``.

    Parameters
    ----------
    max_value : int
        Largest value an index array must hold (e.g. nnz for row pointers).
    width : {"auto", "int32", "int64"}
        ``auto`` picks int32 unless ``max_value`` overflows it.

    Raises
    ------
    InputError
        ``width="int32"`` was forced but ``max_value`` does not fit.
    """
    if width == "int64":
        return np.dtype(np.int64)
    fits = int(max_value) <= INT32_MAX
    if width == "int32" and not fits:
        raise InputError(f"index_width int32 cannot hold {int(max_value)} (> {INT32_MAX}); "
                         f"use index_width: int64 or auto")
    return np.dtype(np.int32 if fits else np.int64)


def row_sums(indptr, terms, dtype=np.float64):
    """``out[i]`` = the sum of ``terms(s, e)`` (an array of the per-entry terms of entries
    ``s .. e - 1``) over row i's entries, in entry order, for the CSR row pointer ``indptr``.

    By nnz-balanced blocks of rows on the process's cores (:func:`hisparse.threads.threaded`:
    NumPy lets the interpreter's lock go, so the gathers and sums run at once, and each block's
    temporaries stay small); a row's sum is the same whichever thread makes it."""
    from ..threads import threaded, usable_cores
    indptr = np.asarray(indptr, dtype=np.int64)
    nrows = len(indptr) - 1
    out = np.zeros(max(nrows, 0), dtype=dtype)
    if nrows <= 0 or indptr[-1] == indptr[0]:
        return out
    cuts = balanced_row_cuts(indptr, min(4 * usable_cores(), int(indptr[-1] - indptr[0])))

    def block(k):
        lo, hi = int(cuts[k]), int(cuts[k + 1])
        first, starts, ends = int(indptr[lo]), indptr[lo:hi], indptr[lo + 1:hi + 1]
        filled = ends > starts  # reduceat gives an empty row its next entry, not 0
        if filled.any():
            out[lo:hi][filled] = np.add.reduceat(terms(first, int(ends[-1])),
                                                 starts[filled] - first, dtype=dtype)

    threaded(block, range(len(cuts) - 1), name="hisparse-rows")
    return out


def rows_sorted(indptr, indices):
    """Whether every row of a CSR matrix (``indptr`` from 0) has strictly increasing column
    indices, hence no duplicates: SciPy's canonical format, checked in pieces on the host's
    threads (:func:`~hisparse.threads.over_pieces`), so the temporaries stay small on large
    inputs."""
    starts = np.asarray(indptr[1:-1], np.int64)

    def piece(low, high):
        low = max(low, 1)  # entry p is compared with entry p - 1
        if high <= low:
            return True
        step = indices[low:high] > indices[low - 1:high - 1]
        # a row's first entry may be below the last one's end
        first = starts[np.searchsorted(starts, low):np.searchsorted(starts, high)]
        step[first - low] = True
        return bool(step.all())
    return all(over_pieces(piece, len(indices), "hisparse-sorted"))


def row_entries(indptr, row_ids):
    """Where the entries of the rows ``row_ids`` (any order) of a CSR ``indptr`` sit: the
    selection's own ``indptr`` (int64) and the positions ``take`` (int64) of its entries, row
    after row, gathered without a Python loop."""
    indptr = np.asarray(indptr)
    row_ids = np.asarray(row_ids, dtype=np.int64)
    starts = indptr[row_ids].astype(np.int64)
    lengths = indptr[row_ids + 1].astype(np.int64) - starts
    selection = np.zeros(len(row_ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=selection[1:])
    offsets = np.arange(selection[-1], dtype=np.int64) - np.repeat(selection[:-1], lengths)
    return selection, np.repeat(starts, lengths) + offsets


def uniform_value(data):
    """The value every entry of ``data`` holds, as a 1-element array of its dtype, or ``None``
    when they differ, when it is not finite (inf times a sum of x differs from the sum of the
    infinite terms where x changes sign), or when ``data`` is empty."""
    data = np.asarray(data)
    if not len(data):
        return None
    one = repeated_value(data)  # one value repeated: no pass over the entries
    low, high = min_max(data) if one is None else (one[0], one[0])
    if low != high or not np.isfinite(low):
        return None
    return np.array([low], dtype=data.dtype)


#: rows of at most this many entries are sorted in place by insertion (no allocation); longer
#: ones by an index sort
_INSERTION_ROW = 16


@compiled
def _sort_row(indices, data, lo, hi):
    """Sort entries ``lo .. hi - 1`` by column, in place (``data`` moves with ``indices``):
    insertion for short rows (no allocation), an index sort for longer ones."""
    if hi - lo <= _INSERTION_ROW:
        for i in range(lo + 1, hi):
            column, value = indices[i], data[i]
            j = i - 1
            while j >= lo and indices[j] > column:
                indices[j + 1] = indices[j]
                data[j + 1] = data[j]
                j -= 1
            indices[j + 1] = column
            data[j + 1] = value
    else:
        order = np.argsort(indices[lo:hi], kind="mergesort")
        indices[lo:hi] = indices[lo:hi][order]
        data[lo:hi] = data[lo:hi][order]


@compiled_parallel
def _renumber_rows_in_blocks(indptr, indices, data, row_ids, new_indptr, new_column, cuts,
                             out_indices, out_data):
    """Row r of the result = row ``row_ids[r]`` of the input, its columns renamed by
    ``new_column`` and sorted; the rows ``cuts[k] .. cuts[k + 1] - 1`` form block k (blocks in
    parallel: nnz-balanced, so a few long rows do not leave one thread with most of the
    work)."""
    for block in prange(len(cuts) - 1):
        for row in range(cuts[block], cuts[block + 1]):
            source, lo, hi = indptr[row_ids[row]], new_indptr[row], new_indptr[row + 1]
            for k in range(hi - lo):
                out_indices[lo + k] = new_column[indices[source + k]]
                out_data[lo + k] = data[source + k]
            _sort_row(out_indices, out_data, lo, hi)


def load_renumber_loops(value_dtype):
    """Make :meth:`CSRMatrix.renumbered`'s compiled pass ready for int32 and int64 column
    indices and ``value_dtype`` values without running it (Numba imported, the pass loaded from
    its disk cache): a thread's work while the input is read. The SpMV plan's degree
    renumbering was a one-rank process's first compiled call once R-MAT's rows were made on the
    GPU (no compiled pass in the read any more), and paid that inside the timed plan: R-MAT 23
    on the 2xH200 host, ``plan_reorder`` 1.32 s with the rows made on the host's threads, 2.04 s
    with them made on the GPU (docs/ops/spmv.md, "Stop 57")."""
    for index_dtype in (np.int32, np.int64):
        indptr = np.array([0, 1], dtype=np.int64)
        indices = np.zeros(1, dtype=index_dtype)
        data = np.ones(1, dtype=value_dtype)
        _renumber_rows_in_blocks.load(indptr, indices, data, indptr[:1], indptr, indices,
                                      indptr, indices.copy(), data.copy())


#: entries per piece of :meth:`CSRMatrix.rows`: its int64 temporaries (a few per entry) stay in
#: the caches, where whole-selection ones were page-faulted in and written to memory
ROW_PIECE = 1 << 18


def balanced_row_cuts(indptr, pieces=None):
    """Boundaries (int64, from 0 to the row count) of at most ``pieces`` blocks of consecutive
    rows holding about equal shares of the entries of the CSR row pointers ``indptr`` (any
    running count serves: SpGEMM's products per row). Default: 8 blocks per core this process
    may use, so a block of long rows does not hold one thread back."""
    from ..threads import usable_cores
    nrows = len(indptr) - 1
    pieces = max(1, min(8 * usable_cores() if pieces is None else int(pieces), nrows))
    targets = np.linspace(indptr[0], indptr[-1], pieces + 1)[1:-1]
    return sorted_distinct(np.concatenate([[0], np.searchsorted(indptr, targets),
                                           [nrows]])).astype(np.int64)


@dataclass
class CSRMatrix:
    """A sparse matrix in CSR form.

    Parameters
    ----------
    indptr : ndarray, shape (m + 1,), int32 or int64
        Row pointers; row ``i`` holds entries ``indptr[i]:indptr[i+1]``.
    indices : ndarray, shape (nnz,), int32 or int64
        Column index of each entry.
    data : ndarray, shape (nnz,), float32 or float64
        Value of each entry.
    shape : tuple of int
        ``(m, n)``.
    symmetric : bool
        True when the matrix is known to be symmetric (all entries are stored in either case).
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple
    symmetric: bool = False

    @property
    def nnz(self):
        return int(self.indptr[-1]) if len(self.indptr) else 0

    @property
    def nrows(self):
        return int(self.shape[0])

    @property
    def ncols(self):
        return int(self.shape[1])

    def row_lengths(self):
        """Entries per row, shape (m,), int64."""
        return np.diff(self.indptr).astype(np.int64)

    def validate(self, name="matrix"):
        """Check the structure and values; raise :class:`InputError` naming what is wrong."""
        if len(self.shape) != 2:
            raise InputError(f"{name}: shape {tuple(self.shape)} is not (rows, columns)")
        m, n = (int(s) for s in self.shape)
        if m < 0 or n < 0:
            raise InputError(f"{name}: negative shape {self.shape}")
        for label, array in (("indptr", self.indptr), ("indices", self.indices),
                             ("data", self.data)):
            if array.ndim != 1:
                raise InputError(f"{name}: {label} must be 1-D, got shape {array.shape}")
        if len(self.indptr) != m + 1:
            raise InputError(f"{name}: indptr has length {len(self.indptr)}, expected m + 1 = "
                             f"{m + 1}")
        if len(self.indices) != len(self.data):
            raise InputError(f"{name}: indices has length {len(self.indices)} but data has "
                             f"{len(self.data)}")
        if self.indptr[0] != 0 or self.indptr[-1] != len(self.indices):
            raise InputError(f"{name}: indptr must start at 0 and end at nnz = "
                             f"{len(self.indices)}, got {self.indptr[0]} .. {self.indptr[-1]}")
        steps = np.diff(self.indptr)
        if len(steps) and steps.min() < 0:
            bad = int(np.argmax(steps < 0))
            raise InputError(f"{name}: indptr decreases at row {bad}")
        if len(self.indices):
            low, high = int(self.indices.min()), int(self.indices.max())
            if low < 0 or high >= n:
                bad = int(np.argmax((self.indices < 0) | (self.indices >= n)))
                row = int(np.searchsorted(self.indptr, bad, side="right") - 1)
                raise InputError(f"{name}: column index {int(self.indices[bad])} out of range "
                                 f"[0, {n}) at entry {bad} (row {row})")
        bad = first_non_finite(name, self.data)
        if bad is not None:
            row = int(np.searchsorted(self.indptr, bad, side="right") - 1)
            raise InputError(f"{name}: value {self.data[bad]} (NaN/Inf) at entry {bad} "
                             f"(row {row}, column {int(self.indices[bad])})")
        return self

    def astype(self, value_dtype=None, index_dtype=None):
        """Return a copy-free (when possible) view with the requested dtypes."""
        data = self.data if value_dtype is None else self.data.astype(value_dtype, copy=False)
        if index_dtype is None:
            indptr, indices = self.indptr, self.indices
        else:
            indptr = self.indptr.astype(index_dtype, copy=False)
            indices = self.indices.astype(index_dtype, copy=False)
        return CSRMatrix(indptr, indices, data, tuple(self.shape), self.symmetric)

    def to_scipy(self):
        """The same matrix as :class:`scipy.sparse.csr_matrix` (shares memory; values that are
        one value repeated become an array: SciPy's kernels would copy them every call)."""
        import scipy.sparse as sp
        return sp.csr_matrix((materialized(self.data), self.indices, self.indptr),
                             shape=self.shape)

    @classmethod
    def from_scipy(cls, matrix, symmetric=False):
        """Build from any SciPy sparse matrix; entries are sorted by column within each row."""
        csr = matrix.tocsr()
        csr.sum_duplicates()
        csr.sort_indices()
        return cls(csr.indptr, csr.indices, csr.data, tuple(csr.shape), symmetric)

    def row_block(self, start, stop):
        """Rows ``start:stop`` as a new CSRMatrix with rebased row pointers (copies)."""
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return CSRMatrix(self.indptr[start:stop + 1] - lo, self.indices[lo:hi].copy(),
                         self.data[lo:hi].copy(), (stop - start, self.ncols), False)

    def rows(self, row_ids):
        """The rows listed in ``row_ids`` (any order) as a new CSRMatrix, each row's entries in
        their order: gathered piece by piece of about :data:`ROW_PIECE` entries (starting at
        row boundaries) on the host's threads (a power-law graph's ghost block, most of a
        rank's entries, is reordered this way in the SpMV plan)."""
        from ..threads import threaded
        row_ids = np.asarray(row_ids, dtype=np.int64)
        old_indptr = np.asarray(self.indptr, dtype=np.int64)
        indptr = np.zeros(len(row_ids) + 1, dtype=np.int64)
        np.cumsum(old_indptr[row_ids + 1] - old_indptr[row_ids], out=indptr[1:])
        total = int(indptr[-1])
        cuts = balanced_row_cuts(indptr, -(-total // ROW_PIECE)) if len(row_ids) else [0]
        indices = np.empty(total, dtype=self.indices.dtype)
        data = np.empty(total, dtype=self.data.dtype)

        def gather(piece):
            low, high = cuts[piece], cuts[piece + 1]
            _, take = row_entries(old_indptr, row_ids[low:high])
            np.take(self.indices, take, out=indices[indptr[low]:indptr[high]])
            np.take(self.data, take, out=data[indptr[low]:indptr[high]])

        threaded(gather, range(len(cuts) - 1), name="hisparse-rows")
        return CSRMatrix(indptr.astype(self.indptr.dtype), indices, data,
                         (len(row_ids), self.ncols), False)

    def renumbered(self, row_ids, new_column):
        """SciPy's ``A[row_ids][:, columns]`` with sorted rows, where ``new_column`` (old ->
        new, a permutation of the columns) is the inverse of ``columns``: the rows listed in
        ``row_ids`` (new -> old), each column ``j`` renamed ``new_column[j]``, then every row
        sorted by its new columns. One compiled pass on every core (Numba's threads), where
        SciPy's two fancy indexings and ``sort_indices`` ran on one."""
        indptr = np.asarray(self.indptr, dtype=np.int64)
        row_ids = np.asarray(row_ids, dtype=np.int64)
        new_indptr = np.zeros(len(row_ids) + 1, dtype=np.int64)
        np.cumsum(indptr[row_ids + 1] - indptr[row_ids], out=new_indptr[1:])
        indices = np.empty(int(new_indptr[-1]), dtype=self.indices.dtype)
        data = np.empty(int(new_indptr[-1]), dtype=self.data.dtype)
        if len(row_ids) and len(indices):  # (one value repeated: the pass reads an array)
            _renumber_rows_in_blocks(indptr, self.indices, materialized(self.data), row_ids,
                                     new_indptr,
                                     np.asarray(new_column, dtype=self.indices.dtype),
                                     balanced_row_cuts(new_indptr), indices, data)
        return CSRMatrix(new_indptr.astype(self.indptr.dtype), indices, data,
                         (len(row_ids), self.ncols), False)
