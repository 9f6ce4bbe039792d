"""What an SpMV engine works on (:class:`SpmvLocal`: a rank's local and ghost blocks of
:mod:`hisparse.distmatrix` with the product's settings), and the degree renumbering of its local
block."""
from dataclasses import dataclass, replace

import numpy as np

from ...formats import CSRMatrix


@dataclass
class SpmvLocal:
    """What an SpMV engine works on.

    Attributes
    ----------
    matrix : CSRMatrix
        Local block, shape ``(local rows, owned x entries)``.
    x : ndarray, shape (owned x entries,)
        The owned entries of the initial x, in local order.
    ghost : CSRMatrix or None
        Ghost block, shape ``(ghost rows, ghosts)``; ``None``: no ghost columns (one rank).
    ghost_rows : ndarray or None
        Local row of each ghost-block row (ascending; index dtype of ``matrix``).
    send_index : ndarray or None
        Positions of x (local order) that the peers need, packed before each exchange.
    sigma : int or None
        CSR5 tile height, the same on every rank; ``None`` for format ``csr``.
    ghost_threads_per_row : int
        CSR-vector lanes per ghost row (from the global mean ghost row length).
    chained : bool
        Square A: products chain like a solver's, x <- A x / ||A x||.
    uniform : ndarray or None
        The one value every nonzero of ``matrix`` and ``ghost`` holds (a 1-element array of its
        dtype), on every rank alike, when the GPU engines keep it instead of the values arrays.
    """

    matrix: CSRMatrix
    x: np.ndarray
    ghost: CSRMatrix = None
    ghost_rows: np.ndarray = None
    send_index: np.ndarray = None
    sigma: int = None
    ghost_threads_per_row: int = 1
    chained: bool = False
    uniform: np.ndarray = None

    def __post_init__(self):
        index = self.matrix.indices.dtype
        if self.ghost is None:
            self.ghost = CSRMatrix(np.zeros(1, self.matrix.indptr.dtype), np.zeros(0, index),
                                   np.zeros(0, self.matrix.data.dtype), (0, 0))
        if self.ghost_rows is None:
            self.ghost_rows = np.zeros(0, index)
        if self.send_index is None:
            self.send_index = np.zeros(0, index)


def reorder_local(local, by_degree):
    """``local`` with its local block's rows and columns renumbered so that long rows and
    much-used x entries come first, and the renumbering of the rows (``new -> old``), or
    ``(local, None)`` when ``by_degree`` is false.

    Why: on power-law matrices (R-MAT, web and social graphs) the gathers of x dominate a
    product; numbering the heavily used columns first packs their x entries into few cache
    lines, which the warps then share (measured on R-MAT scale 21, H100: 0.33 -> 0.275 ms per
    CSR5 product). Square chained blocks get one symmetric renumbering (x's local entries must
    stay y's); rectangular ones renumber rows by length and columns by use. The ghost block keeps
    its columns; its rows follow the new row numbers (ascending again), and the halo's send
    positions follow the new column numbers. The operation puts y back in the original row order
    (:func:`restore_rows`).
    """
    if not by_degree:
        return local, None
    matrix = local.matrix
    lengths = np.diff(matrix.indptr)
    rows = np.argsort(-lengths, kind="stable")  # new -> old
    if local.chained:
        columns = rows
    else:
        uses = np.bincount(matrix.indices, minlength=matrix.ncols)
        columns = np.argsort(-uses, kind="stable")
    index = matrix.indices.dtype
    new_row = np.empty_like(rows)
    new_row[rows] = np.arange(len(rows))
    new_column = np.empty_like(columns)
    new_column[columns] = np.arange(len(columns))
    block = matrix.renumbered(rows, new_column)
    ghost, ghost_rows = local.ghost, new_row[local.ghost_rows.astype(np.int64)]
    if ghost.nrows:
        order = np.argsort(ghost_rows, kind="stable")
        ghost = ghost.rows(order)
        ghost_rows = ghost_rows[order]
    send_index = new_column[local.send_index.astype(np.int64)]
    return replace(local, matrix=block, x=local.x[columns], ghost=ghost,
                   ghost_rows=ghost_rows.astype(index), send_index=send_index.astype(index)), rows
