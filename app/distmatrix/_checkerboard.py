"""The two-dimensional (checkerboard) distribution of a row-distributed matrix for y = A x
(Boman, Devine & Rajamanickam, SC'13).

The vector entries keep their one-dimensional owners (rank ``q`` owns a range of rows of y and
a range of x). The ranks form a grid of ``grid_rows x grid_cols`` (rank ``r`` at grid row
``r // grid_cols``, grid column ``r % grid_cols``), and entry ``(i, j)`` goes to the rank in the
grid row of row ``i``'s owner and the grid column of x entry ``j``'s owner. So a rank needs x
entries only from the ranks of its grid column (the *expand*: at most ``grid_rows - 1`` peers)
and holds partial sums of rows only for the ranks of its grid row, which it sends to their
owners after its product (the *fold*: at most ``grid_cols - 1`` peers). On a scale-free graph
the row blocks' halo reaches every other rank; the grid's two steps reach ``grid_rows +
grid_cols - 2`` of them, and on many ranks move fewer entries (``jobs/spmv_2d_volume.py``).

A rank's entries form a block over its *extended rows*: its own rows (all of them, in order),
then the *foreign* rows it holds partial sums of, ascending (grouped by owner, as the fold's
:class:`~hisparse.parallel.HaloExchange` orders them), with global column ids; the row blocks'
split into local and ghost blocks applies to it unchanged.
"""
import math

import numpy as np

from ..arrays import sorted_distinct
from ..errors import LayoutError
from ..formats import CSRMatrix
from ..partition import group_by_owner
from ..threads import searchsorted_into
from ._row_blocks import _each_piece, entries_by_key


def processor_grid(size):
    """``(grid_rows, grid_cols)`` of ``size`` ranks: the most square grid with ``grid_rows <=
    grid_cols`` (a prime count gives one grid row: every rank's own columns, all fold)."""
    rows = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
    return rows, size // rows


def _range_of(ids, what):
    """``(first, count)`` of ``ids`` when they are consecutive ascending integers."""
    ids = np.asarray(ids, dtype=np.int64)
    first = int(ids[0]) if len(ids) else 0
    if len(ids) and int(ids[-1]) - first != len(ids) - 1:
        raise LayoutError(f"partition.strategy checkerboard needs each rank's {what} to be one "
                          f"range (the nnz_balanced or row_blocks row split)")
    return first, len(ids)


class Checkerboard:
    """Where the entries of every rank's rows go on the grid, and the moves that take them there.

    Parameters
    ----------
    comm : mpi4py communicator
    rows : ndarray of int64
        This rank's rows (one range; the ranks' ranges ascend with the rank).
    owned : ndarray of int64
        The x entries this rank owns (one range).

    *Collective* (one all-gather of the ranges).
    """

    def __init__(self, comm, rows, owned):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.grid_rows, self.grid_cols = processor_grid(self.size)
        mine = _range_of(rows, "rows") + _range_of(owned, "x entries")
        ranges = np.array(comm.allgather(mine), dtype=np.int64).reshape(self.size, 4)
        # the ranks' ranges follow each other in rank order: each starts where the ones before
        # end (an empty range too: an even split of fewer x entries than ranks leaves some)
        self.x_starts = np.concatenate([[0], np.cumsum(ranges[:-1, 3])])
        self.first_row = int(mine[0])
        # the first rank of this rank's grid row: every entry of its rows stays in that row
        self.row_base = (self.rank // self.grid_cols) * self.grid_cols

    @property
    def shape(self):
        """``"ROWSxCOLS"`` of the grid."""
        return f"{self.grid_rows}x{self.grid_cols}"

    def x_owner(self, columns):
        """The rank owning each x entry of ``columns`` (searched on the host's threads: a
        rank's entries are tens of millions on a large graph)."""
        found = searchsorted_into(np.empty(len(columns), dtype=np.int64), self.x_starts,
                                  columns, side="right")
        return np.subtract(found, 1, out=found)

    def destination(self, columns):
        """The rank that holds an entry of this rank's rows in column ``columns`` (int64)."""
        owner = self.x_owner(columns)
        np.remainder(owner, self.grid_cols, out=owner)
        return np.add(owner, self.row_base, out=owner)

    def volumes(self, block, ghosts, remote):
        """``(expand, fold)``: the x entries this rank would receive per product on the grid and
        the partial sums it would send, where ``block`` holds its rows (row blocks), ``ghosts``
        their columns owned elsewhere and ``remote`` the positions of those entries
        (:func:`~hisparse.distmatrix.locate_entries`). An entry whose x entry this rank owns
        stays here, so only the remote entries and the ghost columns are looked at: a stencil's
        few cost nothing. *Collective*: each candidate column goes to the rank that would hold
        it (an all-to-all of at most the row blocks' halo)."""
        from ..parallel import alltoall_concatenated
        ghosts = np.asarray(ghosts, dtype=np.int64)
        where = self.destination(ghosts)
        wanted = self.x_owner(ghosts) != where  # x entries the holder would not own: its expand
        columns = ghosts[wanted]
        order, cuts = group_by_owner(where[wanted], self.size)
        received, _ = alltoall_concatenated(self.comm, [
            {"columns": columns[order[cuts[d]:cuts[d + 1]]]} for d in range(self.size)])
        expand = len(sorted_distinct(received["columns"]))
        return expand, self._fold_count(block, np.asarray(remote, dtype=np.int64))

    def _fold_count(self, block, remote):
        """The distinct (row, holder) pairs of ``block``'s remote entries whose holder is
        another rank: a byte per row and grid column marked by the entries, piece by piece on
        the host's threads (R-MAT 23 at 4 ranks: 24.6M remote entries a rank). The remote
        entries' rows come from a search per row in ``remote`` (a search per entry in the row
        pointers cost 3x more)."""
        cols, own = self.grid_cols, self.rank % self.grid_cols
        per_row = np.diff(np.searchsorted(remote, np.asarray(block.indptr, dtype=np.int64)))
        entry_rows = np.repeat(np.arange(block.nrows, dtype=np.int64), per_row)
        marked = np.zeros(block.nrows * cols, dtype=bool)

        def mark(_, start, stop):  # every piece writes True: any order gives the same table
            # one thread's piece, searched in place: the threaded search of all the remote
            # entries' columns at once (x_owner) took 2.7x as long (24.6M entries, 2 cores)
            holder = (np.searchsorted(self.x_starts, block.indices[remote[start:stop]],
                                      side="right") - 1) % cols
            foreign = holder != own
            marked[entry_rows[start:stop][foreign] * cols + holder[foreign]] = True
        _each_piece(mark, len(remote))
        return int(np.count_nonzero(marked))

    def redistribute(self, block):
        """Every entry of this rank's rows (``block``, CSR over its own rows, global columns)
        sent to its holder; returns ``(extended, foreign)``: the block of the entries this rank
        holds over its extended rows (its own, then ``foreign``, the rows of others it holds
        entries of, ascending), global columns. *Collective* (an all-to-all within each grid
        row)."""
        from ..parallel import alltoall_arrays
        own_rows = np.arange(self.first_row, self.first_row + block.nrows, dtype=np.int64)
        parts = entries_by_key(block, own_rows, self.destination(np.asarray(block.indices)),
                               self.size)
        received = alltoall_arrays(self.comm, [
            {"rows": rows, "lengths": np.diff(np.asarray(part.indptr, dtype=np.int64)),
             "indices": part.indices, "data": part.data} for part, rows in parts])
        own = received[self.rank]
        others = [part for source, part in enumerate(received) if source != self.rank]
        foreign = np.concatenate([part["rows"] for part in others]).astype(np.int64) \
            if others else np.zeros(0, np.int64)
        lengths = np.zeros(block.nrows + len(foreign), dtype=np.int64)
        lengths[np.asarray(own["rows"], dtype=np.int64) - self.first_row] = own["lengths"]
        if others:
            lengths[block.nrows:] = np.concatenate([part["lengths"] for part in others])
        indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        pieces = [own] + others
        indices = np.concatenate([part["indices"] for part in pieces])
        data = np.concatenate([part["data"] for part in pieces])
        pointer = block.indptr.dtype if int(indptr[-1]) < np.iinfo(block.indptr.dtype).max \
            else np.dtype(np.int64)
        return CSRMatrix(indptr.astype(pointer), indices.astype(block.indices.dtype, copy=False),
                         data, (len(lengths), block.ncols)), foreign


def fold_block(send_index, n_rows, value_dtype, index_dtype):
    """The fold's sum on the rows' owner as a product: ``(fold, fold_rows)``, where the fold
    exchange delivers, for each received position ``k``, a partial sum of owned row
    ``send_index[k]`` (rows repeat, once per sending rank), and ``y[fold_rows] += fold @
    received`` adds them (each row's terms in the senders' order: the same bits every run).
    ``fold`` has one row per distinct target row, its columns are received positions, its
    values 1."""
    send_index = np.asarray(send_index, dtype=np.int64)
    if len(send_index) and (send_index.min() < 0 or send_index.max() >= n_rows):
        raise ValueError("fold_block: a target row lies outside the owned rows")
    order = np.argsort(send_index, kind="stable")
    rows, counts = np.unique(send_index[order], return_counts=True)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    fold = CSRMatrix(indptr.astype(index_dtype), order.astype(index_dtype),
                     np.ones(len(order), dtype=value_dtype), (len(rows), len(send_index)))
    return fold, rows.astype(index_dtype)
