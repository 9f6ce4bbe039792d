"""What an SpMV engine works on (:class:`SpmvLocal`: a rank's local and ghost blocks of
:mod:`hisparse.distmatrix` with the product's settings), the degree renumbering of its local
block, and the CSR-vector kernel's lanes per row (here, where the plan and the GPU engines both
import it)."""
from dataclasses import dataclass, replace

import numpy as np

from ...arrays import count_values, inverse_permutation, order_by_count
from ...distmatrix import renumber_columns
from ...formats import CSRMatrix


def threads_per_row(mean_row_length):
    """Lanes per row for the CSR-vector kernel: the power of two nearest the mean row length."""
    if mean_row_length <= 1:
        return 1
    return int(min(32, 2 ** round(np.log2(mean_row_length))))


@dataclass
class SpmvLocal:
    """What an SpMV engine works on.

    The engine keeps x in one buffer, ``x_all`` (``x_length`` entries): the owned entries at
    ``x_offset`` and the entries the exchange brings from ``ghost_offset`` on. Point to point:
    ``[owned | ghosts]`` (offsets 0 and the owned count); all-gather: all of x in rank order,
    each rank's entries in its local order (the ghost block's columns are then positions in it,
    ``ghost_offset`` 0).

    Attributes
    ----------
    matrix : CSRMatrix
        Local block, shape ``(local rows, owned x entries)``; with ``merged``, every entry of
        the rank's rows, shape ``(local rows, x_length)``, columns positions in ``x_all``.
    x : ndarray, shape (owned x entries,)
        The owned entries of the initial x, in local order.
    ghost : CSRMatrix or None
        Ghost block, columns positions in ``x_all[ghost_offset:]``; ``None``: no ghost columns
        (one rank, or ``merged``).
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
    ghost_sigma : int or None
        CSR5 tile height of the ghost block; ``None``: the ghost block runs CSR-vector.
    merged : bool
        ``matrix`` holds the ghost entries too: one product after the exchange.
    x_offset, ghost_offset, x_length : int
        The layout of ``x_all`` (above); ``None``: point to point (``[owned | ghosts]``).
    x_ids : ndarray of int64 or None
        Global index of each owned x entry, in local order (the all-gather's layout).
    ghost_parts : list or None
        The ghost block cut by the rank its columns come from (``[(block, rows), ...]``, one
        per rank, :func:`~hisparse.distmatrix.split_column_ranges`), when the exchange runs in
        rounds and each part multiplies as soon as its rank's entries arrive; ``None``: the
        ghost block multiplies whole after the exchange.
    n_rows : int or None
        The rows of y this rank owns: the first ``n_rows`` rows of ``matrix``. Under the
        checkerboard (``partition.strategy``) the blocks' further rows are *foreign*: partial
        sums of other ranks' rows, sent to them after each product (the fold); ``None``: all
        of ``matrix``'s rows.
    fold : CSRMatrix or None
        The fold's sum (:func:`~hisparse.distmatrix.fold_block`): ``y[fold_rows] += fold @
        received`` adds the partial sums the other ranks send for this rank's rows; ``None``:
        no fold (row blocks).
    fold_rows : ndarray or None
        The owned row of each row of ``fold``.
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
    ghost_sigma: int = None
    merged: bool = False
    x_offset: int = 0
    ghost_offset: int = None
    x_length: int = None
    x_ids: np.ndarray = None
    ghost_parts: list = None
    n_rows: int = None
    fold: CSRMatrix = None
    fold_rows: np.ndarray = None

    def __post_init__(self):
        index = self.matrix.indices.dtype
        if self.ghost is None:
            self.ghost = CSRMatrix(np.zeros(1, self.matrix.indptr.dtype), np.zeros(0, index),
                                   np.zeros(0, self.matrix.data.dtype), (0, 0))
        if self.ghost_rows is None:
            self.ghost_rows = np.zeros(0, index)
        if self.send_index is None:
            self.send_index = np.zeros(0, index)
        if self.ghost_offset is None:
            self.ghost_offset = len(self.x)
        if self.x_length is None:
            self.x_length = max(self.x_offset + len(self.x), self.ghost_offset + self.ghost.ncols)
        if self.n_rows is None:
            self.n_rows = self.matrix.nrows

    @property
    def foreign_rows(self):
        """Rows of ``matrix`` after the owned ones (the checkerboard's partial sums)."""
        return self.matrix.nrows - self.n_rows


def ghost_rows_in_order(ghost, ghost_rows, rows, new_row, device_rows=None, new_column=None):
    """The ghost block with its rows in the new row order (``rows``: new -> old local row,
    ``new_row`` its inverse) and their new row numbers, ascending: the order read off the
    renumbering itself (no sort of the ghost rows), the rows moved by ``device_rows.rows``
    where it can (:class:`hisparse.gpu.RowsOnDevice`), else on the host's threads
    (:meth:`CSRMatrix.rows`). ``new_column``: the ghost columns renamed on the way
    (:func:`~hisparse.distmatrix.renumber_columns`' ``new_column``)."""
    if not ghost.nrows:
        return ghost, new_row[ghost_rows.astype(np.int64)]
    ghost_of_row = np.full(len(rows), -1, dtype=np.int64)  # ghost-block row of each local row
    ghost_of_row[ghost_rows.astype(np.int64)] = np.arange(ghost.nrows, dtype=np.int64)
    order = ghost_of_row[rows]
    order = order[order >= 0]
    moved = None if device_rows is None else device_rows.rows(ghost, order, new_column)
    if moved is None:
        moved = ghost.rows(order)
        if new_column is not None:
            moved = renumber_columns(moved, new_column, ghost.ncols)
    return moved, new_row[ghost_rows[order].astype(np.int64)]


def degree_order(counts, entries, device_rows=None):
    """``(order, inverse)``: :func:`~hisparse.arrays.order_by_count` of ``counts`` (most first,
    ties in index order) and its inverse permutation, int64; made by ``device_rows`` where it
    takes a block of ``entries`` entries (:meth:`hisparse.gpu.RowsOnDevice.degree_order`),
    else on the host."""
    made = None if device_rows is None else device_rows.degree_order(counts, entries)
    if made is not None:
        return made
    order = order_by_count(counts).astype(np.int64, copy=False)
    return order, inverse_permutation(order)


def use_order(values, size, device_rows=None):
    """:func:`degree_order` of the uses of ``0 .. size - 1`` in ``values`` (a block's columns):
    most used first; counted and ordered by ``device_rows`` where it takes them
    (:meth:`hisparse.gpu.RowsOnDevice.use_order`), else on the host."""
    made = None if device_rows is None else device_rows.use_order(values, size)
    if made is not None:
        return made
    return degree_order(count_values(values, size), len(values))


def reorder_local(local, by_degree, device_rows=None, ghost_columns=None):
    """``local`` with its local block's rows and columns renumbered so that long rows and
    much-used x entries come first, and the renumbering of the rows (``new -> old``), or
    ``(local, None)`` when ``by_degree`` is false. ``device_rows``
    (:class:`hisparse.gpu.RowsOnDevice`): the blocks' rows moved on the GPU where it can, the
    same blocks as the host's passes make (those run where it does not, and without it).

    Why: on power-law matrices (R-MAT, web and social graphs) the gathers of x dominate a
    product; numbering the heavily used columns first packs their x entries into few cache
    lines, which the warps then share (measured on R-MAT scale 21, H100: 0.33 -> 0.275 ms per
    CSR5 product). Square chained blocks get one symmetric renumbering (x's local entries must
    stay y's); rectangular ones renumber rows by length and columns by use. The ghost block keeps
    its columns; its rows follow the new row numbers (ascending again), and the halo's send
    positions follow the new column numbers. Foreign rows (the checkerboard's) keep their places
    after the owned ones (the fold sends them as they lie), and the fold's target rows follow
    the new row numbers. The operation puts y back in the original row order
    (:func:`restore_rows`); the renumbering returned is that of the owned rows.
    ``ghost_columns``: the ghost block's columns renamed too (``new_column`` of
    :func:`~hisparse.distmatrix.renumber_columns`: the halo's receive order) in the pass that
    moves its rows; ``by_degree`` must then be true.
    """
    if not by_degree:
        if ghost_columns is not None:
            raise ValueError("reorder_local: the ghost columns are renamed in the degree "
                             "renumbering, and there is none")
        return local, None
    matrix, owned = local.matrix, local.n_rows
    owned_rows, new_owned = degree_order(np.diff(matrix.indptr)[:owned], matrix.nnz,
                                         device_rows)
    foreign = np.arange(owned, matrix.nrows, dtype=np.int64)  # keep their places
    rows = np.concatenate([owned_rows, foreign])  # new -> old
    new_row = np.concatenate([new_owned, foreign])
    if local.chained:
        columns, new_column = owned_rows, new_owned
    else:
        columns, new_column = use_order(matrix.indices, matrix.ncols, device_rows)
    index = matrix.indices.dtype
    block = None if device_rows is None else device_rows.renumbered(matrix, rows, new_column)
    if block is None:
        block = matrix.renumbered(rows, new_column)
    ghost, ghost_rows = ghost_rows_in_order(local.ghost, local.ghost_rows, rows, new_row,
                                            device_rows, ghost_columns)
    send_index = new_column[local.send_index.astype(np.int64)]
    x_ids = None if local.x_ids is None else local.x_ids[columns]
    fold_rows = None if local.fold_rows is None else \
        new_row[local.fold_rows.astype(np.int64)].astype(local.fold_rows.dtype)
    return replace(local, matrix=block, x=local.x[columns], ghost=ghost,
                   ghost_rows=ghost_rows.astype(index), send_index=send_index.astype(index),
                   x_ids=x_ids, fold_rows=fold_rows), rows[:owned]
