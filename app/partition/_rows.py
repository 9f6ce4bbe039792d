"""Row partitions of a CSR matrix over ranks."""
from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError

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


def _check(nrows, nparts):
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
    _check(nrows, nparts)
    # Weight = nnz + rows: a row costs a little even when empty (its y entry is written).
    weight = indptr + np.arange(nrows + 1, dtype=np.int64)
    targets = weight[-1] * np.arange(1, nparts, dtype=np.float64) / nparts
    cuts = np.searchsorted(weight, targets, side="left").astype(np.int64)
    bounds = np.concatenate([[0], cuts, [nrows]])
    # Force strictly increasing bounds so that every rank owns at least one row.
    for k in range(1, nparts):
        bounds[k] = min(max(bounds[k], bounds[k - 1] + 1), nrows - (nparts - k))
    return bounds


def row_modulo(nrows, nparts):
    """Rank ``r`` owns rows ``r, r + nparts, r + 2 nparts, ...`` (the SpGEMM seed's layout)."""
    _check(nrows, nparts)
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
        _check(nrows, nparts)
        bounds = np.linspace(0, nrows, nparts + 1).round().astype(np.int64)
    elif strategy == "row_modulo":
        return RowPartition(strategy, row_modulo(nrows, nparts))
    else:
        raise ValueError(f"unknown row partition strategy {strategy!r}")
    rows = [np.arange(bounds[r], bounds[r + 1], dtype=np.int64) for r in range(nparts)]
    return RowPartition(strategy, rows, bounds)
