"""Planned collectives: each is set up once from the layout of the data (who owns which rows),
then every call is one collective on arrays of that layout (as mpi4py-fft plans its transfers).

Engines never see a communicator; an operation's ``run_once`` composes engine steps with these
objects. Every collective here moves host (NumPy) buffers through MPI; a device transport can
stand behind the same interface (the call signatures take and return arrays, never a comm).
"""
import numpy as np

from ._mpi import gather_arrays


def _mpi_type(dtype):
    from mpi4py import MPI
    return MPI._typedict[np.dtype(dtype).char]


class RowAllGather:
    """All-gather of row blocks: rank r owns ``counts[r]`` consecutive rows starting at
    ``offsets[r]`` of a ``(n_rows, width)`` array; after the call every rank holds all of it.

    Parameters
    ----------
    comm : mpi4py communicator
    offset, count : int
        This rank's first row and row count.
    width : int
        Columns per row (the same on every rank).

    Notes
    -----
    The rank's own block is read from ``full[offset:offset + count]``: an engine writes its rows
    in place, then calls the collective, so no separate send buffer is needed.
    """

    def __init__(self, comm, offset, count, width=1):
        self.comm, self.width = comm, int(width)
        self.offset, self.count = int(offset), int(count)
        blocks = comm.allgather((self.offset, self.count)) if comm.size > 1 else \
            [(self.offset, self.count)]
        self.offsets = np.array([b[0] for b in blocks], dtype=np.int64)
        self.counts = np.array([b[1] for b in blocks], dtype=np.int64)

    @property
    def trivial(self):
        """One rank: nothing to exchange."""
        return self.comm.size == 1

    def __call__(self, full):
        """Fill every rank's ``full`` (C-contiguous, shape ``(rows, width)``) in place."""
        if self.trivial:
            return full
        from mpi4py import MPI
        kind = _mpi_type(full.dtype)
        counts = (self.counts * self.width).tolist()
        displs = (self.offsets * self.width).tolist()
        flat = full.reshape(-1)
        self.comm.Allgatherv(MPI.IN_PLACE, [flat, (counts, displs), kind])
        return full


class AllReduce:
    """Sum (or max/min) of same-shaped arrays over the ranks, in place."""

    def __init__(self, comm, op="sum"):
        self.comm, self.op_name = comm, op

    def _op(self):
        from mpi4py import MPI
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[self.op_name]

    def __call__(self, array):
        """Reduce ``array`` (NumPy, contiguous) in place on every rank and return it."""
        if self.comm.size == 1:
            return array
        from mpi4py import MPI
        self.comm.Allreduce(MPI.IN_PLACE, [array, _mpi_type(array.dtype)], op=self._op())
        return array

    def scalar(self, value):
        """Reduce one Python number."""
        if self.comm.size == 1:
            return value
        from mpi4py import MPI
        return self.comm.allreduce(value, op=self._op())


class RowGather:
    """Gather of distributed rows to rank 0 in global row order.

    Parameters
    ----------
    comm : mpi4py communicator
    rows : ndarray of int
        The global rows this rank holds, in the order of its local arrays.
    n_rows : int
        Global row count.
    """

    def __init__(self, comm, rows, n_rows):
        self.comm, self.n_rows = comm, int(n_rows)
        self.rows = np.asarray(rows)
        self.contiguous = bool(len(self.rows) == 0 or
                               (self.rows[-1] - self.rows[0] + 1 == len(self.rows)))

    def __call__(self, local):
        """Rank 0: the ``(n_rows, ...)`` array; other ranks: ``None``."""
        if self.comm.size == 1 and len(self.rows) == self.n_rows:
            return local if np.array_equal(self.rows, np.arange(self.n_rows)) else \
                self._place([{"rows": self.rows, "values": local}], local)
        pieces = gather_arrays(self.comm, {"rows": self.rows, "values": local})
        if self.comm.rank != 0:
            return None
        return self._place(pieces, local)

    def _place(self, pieces, like):
        out = np.empty((self.n_rows,) + like.shape[1:], dtype=like.dtype)
        for piece in pieces:
            out[piece["rows"]] = piece["values"]
        return out


def gather_parts(comm, part):
    """Every rank's dict of arrays, in rank order, on rank 0 (``None`` elsewhere): for results
    whose parts differ in shape (a CSR block per rank)."""
    return gather_arrays(comm, part)


def max_over_ranks(comm, value):
    """The largest of one number over the ranks (e.g. the slowest rank's setup time)."""
    return max(comm.allgather(value)) if comm.size > 1 else value
