"""The subtree strategy's residual r = b - A x with the solution left on the ranks.

Each rank multiplies its own rows of the permuted matrix P A P^T (its owned columns: A is
symmetric) by the entries of x it owns and by those its rows reach on other ranks, fetched by a
halo exchange planned once (:class:`~hisparse.parallel.HaloExchange`). So neither the solution
nor the residual passes through rank 0 in a repeat: the refinement's correction is solved from
the ranks' own residual rows, and the solution is gathered once, after the timed repeats
(``collect``). Before, every repeat gathered x to rank 0, which measured the residual of all n
rows alone and scattered it back (2000^2 grid, 4 ranks sharing one H200: ``gather`` 47 ms and
``refine`` 199 ms of a 414 ms repeat).

On a nested-dissection tree a rank's rows reach few entries of the others: those of the
separators above its subtrees, and, for a rank owning a separator, the rows next to it.
"""
import numpy as np

from ...distmatrix import OwnedColumns, ghost_columns, renumber_columns
from ...formats import CSRMatrix, index_dtype_for
from ...parallel import HaloExchange, max_over_ranks
from ...threads import in_background, take_into
from .reference import ResidualOperator


def start_residual_warm_up():
    """This process's first residual (:class:`ResidualOperator`'s compiled pass, loaded from
    Numba's cache, and the start of its thread pool), made on a 4 x 4 matrix in a background
    thread; returns the thread (join it before the first refinement). Made in the first
    refinement it cost the timed repeat about a second on every rank of the subtree strategy
    (lap120, 2 ranks: ``refine`` 0.544 s in the median of two repeats, 0.03 s warm); started
    while the process waits (the other ranks for rank 0's analysis, rank 0 for METIS's
    processes) it costs the time to solution nothing."""
    return in_background([first_residual], "hisparse-residual-warm-up")


def first_residual():
    """A residual of a 4 x 4 matrix with the argument types of RankResidual's calls (2-D
    float64 x and b, int32 indices), so that the same compiled specialisation is loaded and
    Numba's thread pool started (:func:`start_residual_warm_up`'s work, or a caller's own)."""
    import scipy.sparse as sp
    square = sp.identity(4, dtype=np.float64, format="csr")
    ResidualOperator(square).residual_error(np.ones((4, 1)), np.ones((4, 1)))


def rank_rows(matrix, perm, iperm, owned):
    """Rows ``owned`` (permuted numbering) of P A P^T, with permuted column ids:
    ``(indptr, indices, data)`` (indices int32 where every column fits). ``matrix`` is A in CSR
    (original numbering, both triangles); ``perm`` new-to-old, ``iperm`` old-to-new. Gathered
    and renamed on the host's threads (each rank its own, from its own copy of A)."""
    rows = CSRMatrix(matrix.indptr, matrix.indices, matrix.data, matrix.shape).rows(
        np.asarray(perm)[np.asarray(owned)])
    indices = take_into(np.empty(rows.nnz, dtype=index_dtype_for(matrix.shape[1])),
                        np.asarray(iperm), rows.indices)
    return rows.indptr.astype(np.int64, copy=False), indices, rows.data


class RankResidual:
    """This rank's rows of r = b - A x and the componentwise backward error over every rank.

    Parameters
    ----------
    comm : mpi4py communicator (or a host transport)
    rows : tuple
        :func:`rank_rows` of this rank's owned columns.
    owned : ndarray of int64
        The permuted columns this rank owns, in the order of its solution rows.
    n : int
        The matrix order.
    b : ndarray, shape (len(owned), nrhs)
        This rank's rows of the permuted right-hand sides.
    """

    def __init__(self, comm, rows, owned, n, b):
        owned = np.asarray(owned, dtype=np.int64)
        indptr, indices, data = rows
        block = CSRMatrix(indptr, indices, data, (len(owned), int(n)))
        position = OwnedColumns(owned, n, contiguous=False)
        self.halo = HaloExchange(comm, owned, ghost_columns(block, position), n)
        self.n_owned = len(owned)
        width = self.n_owned + self.halo.n_ghosts
        # one block over [owned entries, received entries] of x, one product per call: every
        # column renamed to its place there (entries keep their order; no split and merge of
        # the rows into a local and a ghost block, which was most of this set-up)
        place = np.full(int(n), -1, dtype=index_dtype_for(width))
        place[owned] = np.arange(self.n_owned, dtype=place.dtype)
        place[self.halo.ghosts] = np.arange(self.n_owned, width, dtype=place.dtype)
        self.operator = ResidualOperator(renumber_columns(block, place, width).to_scipy())
        self.b = np.asarray(b, dtype=np.float64).reshape(self.n_owned, -1)
        self.comm = comm

    @property
    def ghosts(self):
        """Entries of x this rank receives per right-hand side and residual."""
        return self.halo.n_ghosts

    def __call__(self, x_local):
        """``(r, error)``: this rank's rows of b - A x (float64, shape of ``b``) and the
        largest componentwise backward error of any rank's rows. *Collective.*

        ``x_local``: the solution at this rank's owned columns, shape (len(owned), nrhs)."""
        x_local = np.asarray(x_local, dtype=np.float64).reshape(self.b.shape)
        x = np.empty((self.n_owned + self.halo.n_ghosts, self.b.shape[1]))
        x[:self.n_owned] = x_local
        ghost = np.empty(self.halo.n_ghosts)
        for column in range(self.b.shape[1]):  # the exchange moves one vector at a time
            self.halo(np.ascontiguousarray(x_local[:, column]), ghost)
            x[self.n_owned:, column] = ghost
        residual, error = self.operator.residual_error(x, self.b)
        return residual, float(max_over_ranks(self.comm, error))
