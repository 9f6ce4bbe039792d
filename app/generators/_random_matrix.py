"""Random matrices: rows made in fixed-size blocks, each from its own seeded stream."""
import numpy as np

from ..formats import CSRMatrix
from ._common import _whole
from ._keyed_permutation import keyed_permutation


# -- random matrices: rows made in fixed-size blocks, each from its own seeded stream -------------

#: Rows per random-matrix block: block ``b`` draws its columns and values from the stream seeded
#: by ``(seed, 0, b)``, so the matrix of a seed is the same whichever ranks make which blocks.
RANDOM_ROW_BLOCK = 1 << 14


def random_matrix_blocks(rows):
    """How many row blocks a random matrix of ``rows`` rows has."""
    return -(-int(rows) // RANDOM_ROW_BLOCK)


def random_matrix_rows(rows, cols=None, nnz_per_row=8, seed=0, power_law=0.0, blocks=None):
    """Row blocks ``blocks`` (a range; default all) of :func:`random_matrix`'s matrix: a
    CSRMatrix of the rows ``blocks.start * RANDOM_ROW_BLOCK`` up to the end of the last block."""
    cols = cols or rows
    blocks = range(random_matrix_blocks(rows)) if blocks is None else blocks
    first = min(blocks.start * RANDOM_ROW_BLOCK, rows)
    stop = min(blocks.stop * RANDOM_ROW_BLOCK, rows) if len(blocks) else first
    row_ids = np.arange(first, stop, dtype=np.int64)
    lengths = _random_row_lengths(row_ids, rows, cols, nnz_per_row, seed, power_law)
    pieces = []
    for block in blocks:
        lo, hi = block * RANDOM_ROW_BLOCK - first, min((block + 1) * RANDOM_ROW_BLOCK, rows) - first
        rng = np.random.default_rng([seed, 0, block])
        count = int(lengths[lo:hi].sum())
        local_rows = np.repeat(np.arange(hi - lo, dtype=np.int64), lengths[lo:hi])
        columns = rng.integers(0, cols, size=count, dtype=np.int64)
        values = rng.uniform(-1.0, 1.0, size=count)
        pieces.append(_summed_rows(local_rows, columns, values, hi - lo, cols))
    return _stack_rows(pieces, cols)


def _random_row_lengths(row_ids, rows, cols, nnz_per_row, seed, power_law):
    """Entries drawn for each row in ``row_ids``: ``nnz_per_row``, or (``power_law`` > 0) a
    Zipf-like law, the weight of rank k = (k + 1) ** -power_law given to row
    :func:`keyed_permutation` (k) -- the mean kept near ``nnz_per_row``."""
    if power_law <= 0:
        return np.full(len(row_ids), min(nnz_per_row, cols), dtype=np.int64)
    total = 0.0
    for lo in range(0, rows, 1 << 20):  # the weights' sum in bounded pieces, the same everywhere
        total += float((np.arange(lo + 1, min(lo + (1 << 20), rows) + 1, dtype=np.float64)
                        ** (-power_law)).sum())
    zipf_rank = keyed_permutation(row_ids, rows, seed)
    weights = (zipf_rank + 1.0) ** (-power_law)
    lengths = np.maximum(1, np.round(weights / (total / rows) * nnz_per_row)).astype(np.int64)
    return np.minimum(lengths, cols)


def _summed_rows(local_rows, columns, values, nrows, ncols):
    """CSR of ``nrows`` rows from (row, column, value) triplets: columns sorted, duplicates
    summed."""
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    matrix = sp.coo_matrix((values, (local_rows, columns)), shape=(nrows, ncols)).tocsr()
    matrix.sum_duplicates()
    matrix.sort_indices()
    return CSRMatrix(matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64),
                     matrix.data, (nrows, ncols))


def _stack_rows(pieces, ncols):
    """Row blocks one after the other as one CSRMatrix (int64 indices)."""
    if not pieces:
        return CSRMatrix(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), (0, ncols))
    lengths = np.concatenate([np.diff(p.indptr) for p in pieces])
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return CSRMatrix(indptr, np.concatenate([p.indices for p in pieces]),
                     np.concatenate([p.data for p in pieces]), (len(lengths), int(ncols)))


def random_matrix(rows, cols=None, nnz_per_row=8, seed=0, power_law=0.0):
    """Random-column matrix: ``nnz_per_row`` entries per row at uniform random columns.

    Values are uniform in [-1, 1); entries falling on one column are summed. ``power_law`` > 0
    draws row lengths from a Zipf-like law with that exponent instead
    (mean kept near ``nnz_per_row``), giving irregular rows. Rows are made in blocks of
    :data:`RANDOM_ROW_BLOCK`, each from its own seeded stream (:func:`random_matrix_rows`).
    """
    return _whole(random_matrix_rows(rows, cols, nnz_per_row, seed, power_law))
