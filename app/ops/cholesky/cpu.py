"""CPU engine of the supernodal Cholesky: the reference factorization and solve on the host
(NumPy/SciPy LAPACK), and the functions it is made of (the tests use them directly).

Both engines work on the plan of :mod:`.symbolic`: one value array holds every supernode's dense
panel (column-major, ``nrows[s] x ncols[s]``, the supernode's own columns first). The
factorization is right-looking: a supernode is factored (potrf on its diagonal block, trsm below
it), then its update ``C = L21 L21^T`` is subtracted from its ancestors' panels through the
relative indices of the plan ("modify"). No MPI: the engine takes the plan, A's values and the
right-hand sides, and returns the solution in the permuted numbering.
"""
import numpy as np
import scipy.linalg
import scipy.linalg.blas
from scipy.linalg import lapack

from ...errors import HisparseError
from .. import Engine
from .reference import residual_error


class NotPositiveDefinite(HisparseError):
    """A pivot of the factorization was not positive.

    Attributes
    ----------
    column : int
        The column in the original (unpermuted) numbering.
    permuted_column : int
        The column in the factorization's (permuted) numbering.
    """

    def __init__(self, column, permuted_column, detail=""):
        self.column, self.permuted_column = int(column), int(permuted_column)
        super().__init__(f"cholesky: matrix is not positive definite: the pivot of column "
                         f"{self.column} (original numbering; column {self.permuted_column} "
                         f"after fill-reducing reordering) is not positive{detail}")


def assemble_values(sym, values, dtype=np.float64):
    """The value array with A's entries in place and zeros elsewhere, shape (panel values,)."""
    lx = np.zeros(int(sym.panel_offset[-1]), dtype=dtype)
    np.add.at(lx, sym.a_dest, values[sym.a_source])
    return lx


def _panel(sym, lx, s):
    """Supernode ``s``'s panel as a (nrows, ncols) Fortran-ordered view of ``lx``."""
    nr = int(sym.nrows[s])
    nc = int(sym.starts[s + 1] - sym.starts[s])
    off = int(sym.panel_offset[s])
    return lx[off:off + nr * nc].reshape(nc, nr).T


def factor_cpu(sym, values, dtype=np.float64):
    """Supernodal right-looking Cholesky on the host (the reference path).

    Parameters
    ----------
    sym : SymbolicFactor
    values : ndarray, shape (nnz,)
        A's CSR data, in the order of the matrix given to the analysis.

    Returns
    -------
    ndarray, shape (panel values,)
        The factor's value array (lower triangles of the diagonal blocks are meaningful).

    Raises
    ------
    NotPositiveDefinite
    """
    lx = assemble_values(sym, values, dtype)
    potrf = lapack.get_lapack_funcs("potrf", dtype=lx.dtype)
    trsm = scipy.linalg.blas.get_blas_funcs("trsm", dtype=lx.dtype)
    for s in range(sym.nsuper):
        panel = _panel(sym, lx, s)
        nc = panel.shape[1]
        first = int(sym.starts[s])
        diag, info = potrf(panel[:nc], lower=1, clean=0, overwrite_a=0)
        if info != 0:
            column = first + (info - 1 if info > 0 else 0)
            raise NotPositiveDefinite(sym.perm[column], column)
        panel[:nc] = diag
        m = panel.shape[0] - nc
        if m == 0:
            continue
        # L21 = A21 L11^{-T} (BLAS trsm: right side, lower, transposed)
        below = trsm(1.0, diag, panel[nc:], side=1, lower=1, trans_a=1)
        panel[nc:] = below
        update = below @ below.T
        b0 = int(sym.below_offset[s])
        col_base = sym.col_base[b0:b0 + m]
        col_rel = sym.col_rel[b0:b0 + m]
        # Scatter-subtract (modify) the lower part of the update, in column chunks of about
        # 4M entries to bound the index arrays.
        j0 = 0
        while j0 < m:
            j1 = j0 + 1
            while j1 < m and (j1 - j0 + 1) * (m - j0) <= 4_000_000:
                j1 += 1
            jj, ii = np.meshgrid(np.arange(j0, j1), np.arange(j0, m))
            keep = ii >= jj
            ii, jj = ii[keep], jj[keep]
            lx[col_base[jj] + sym.rel[col_rel[jj] + ii]] -= update[ii, jj]
            j0 = j1
    return lx


def logdet_of_diagonal(diagonal):
    """log det A = 2 sum log L_jj from the factor's diagonal (summed in float64)."""
    return 2.0 * float(np.sum(np.log(diagonal.astype(np.float64))))


def logdet(sym, lx):
    """log det A of the factor's value array ``lx``."""
    return logdet_of_diagonal(lx[sym.diag_pos])


def solve_cpu(sym, lx, rhs):
    """Solve L L^T x = b in the permuted numbering.

    Parameters
    ----------
    rhs : ndarray, shape (n, k)
        Right-hand sides, permuted (row j = original row perm[j]).

    Returns
    -------
    ndarray, shape (n, k)
    """
    x = np.array(rhs, dtype=lx.dtype, copy=True, order="C")
    for s in range(sym.nsuper):
        panel = _panel(sym, lx, s)
        nc = panel.shape[1]
        f = int(sym.starts[s])
        x[f:f + nc] = scipy.linalg.solve_triangular(panel[:nc], x[f:f + nc], lower=True)
        if panel.shape[0] > nc:
            below = sym.supernode_rows(s)[nc:]
            x[below] -= panel[nc:] @ x[f:f + nc]
    for s in range(sym.nsuper - 1, -1, -1):
        panel = _panel(sym, lx, s)
        nc = panel.shape[1]
        f = int(sym.starts[s])
        if panel.shape[0] > nc:
            below = sym.supernode_rows(s)[nc:]
            x[f:f + nc] -= panel[nc:].T @ x[below]
        x[f:f + nc] = scipy.linalg.solve_triangular(panel[:nc], x[f:f + nc], lower=True,
                                                    trans="T")
    return x


def factor_to_sparse(sym, lx):
    """The factor as a SciPy CSC lower-triangular matrix (permuted numbering), for tests."""
    import scipy.sparse as sp
    rows, cols, vals = [], [], []
    for s in range(sym.nsuper):
        panel = _panel(sym, lx, s)
        nc = panel.shape[1]
        f = int(sym.starts[s])
        r = sym.supernode_rows(s)
        for k in range(nc):
            rows.append(r[k:])
            cols.append(np.full(len(r) - k, f + k))
            vals.append(panel[k:, k])
    return sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(sym.n, sym.n))


class CpuFactorEngine(Engine):
    """Supernodal factorization and solve on the host (:func:`factor_cpu`, :func:`solve_cpu`).

    The steps are those of the GPU engine (``load``, ``factor``, ``solve``, ``solution``), so the
    operation composes one sequence for both; nothing moves between memories here.

    Parameters
    ----------
    ctx : EngineContext
    local : CholeskyLocal
        ``sym`` (the :class:`~.symbolic.SymbolicFactor`) and ``matrix`` (A's pattern, for the
        refinement's residual; None: no refinement).
    params : dict
        ``operation.params``.
    """

    #: No device stream: the phases are timed by wall clock.
    stream = None

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.sym = local.sym
        self.matrix = local.matrix
        self.dtype = np.dtype(ctx.value_dtype)
        self.values = self.b = self.lx = self.x = None
        self.r = None
        self.error = float("nan")

    def load(self, values, b):
        """Take A's CSR data and the right-hand sides ``b`` (n, nrhs), original numbering."""
        self.values, self.b = values, b

    def factor(self):
        """Assemble and factor; returns log det A.

        Raises
        ------
        NotPositiveDefinite
        """
        self.lx = factor_cpu(self.sym, self.values, self.dtype)
        return logdet(self.sym, self.lx)

    def solve(self):
        """L L^T x = b in the permuted numbering."""
        sym = self.sym
        self.x = solve_cpu(sym, self.lx, self.b[sym.perm].astype(self.dtype))

    # -- iterative refinement (composed by the operation: see op.refine) ---------------------
    def residual(self):
        """r = b - A x of the current solution (float64, permuted numbering) and its
        componentwise backward error (:meth:`backward_error`)."""
        if self.matrix is None:
            raise HisparseError("cholesky: refinement needs the matrix's pattern (local.matrix)")
        import scipy.sparse as sp
        sym, pattern = self.sym, self.matrix
        a = sp.csr_matrix((self.values, pattern.indices, pattern.indptr), shape=pattern.shape)
        x = np.empty(self.x.shape, dtype=np.float64)
        x[sym.perm] = self.x
        residual, self.error = residual_error(a, x, self.b.astype(np.float64))
        self.r = residual[sym.perm].astype(self.dtype)

    def backward_error(self):
        """The backward error measured by the last :meth:`residual`."""
        return self.error

    def correct(self):
        """Solve A d = r (r from :meth:`residual`) and add d to the solution."""
        self.x += solve_cpu(self.sym, self.lx, self.r)

    def solution(self):
        """The solution, shape (n, nrhs), permuted numbering (row j is original row perm[j])."""
        return self.x

    def factor_values(self):
        """The factor's value array (tests)."""
        return self.lx


ENGINES = {None: CpuFactorEngine}
