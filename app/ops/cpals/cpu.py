"""CP-ALS on the host (NumPy): the CPU engine and the MTTKRP it shares with the 'numpy' peer.

The engine holds this rank's block of rows of every mode's unfolding
(:class:`~hisparse.ops.cpals.state.UnfoldingBlocks`), a full, replicated copy of every factor
matrix (I_m x R), their Grams and lambda. One mode update is

    mttkrp(n) -> solve(n) -> inner_local() [last mode] -> factor_buffer(n) ... factor_gathered(n)
    -> normalize(n, first)

and an iteration ends with fit(norm_x) -> read_fit(). The operation fills ``factor_buffer(n)``
with the other ranks' rows (a planned row all-gather) between the two exchange steps and sums
``inner_local()`` over the ranks in place; the engine itself never communicates. The GPU engines
(:mod:`.gpu`) have the same steps.
"""
import numpy as np

from .._base import Engine


def hadamard(grams, skip=None):
    """Elementwise product of the R x R Grams, leaving out mode ``skip``."""
    out = np.ones_like(grams[0])
    for m, gram in enumerate(grams):
        if m != skip:
            out = out * gram
    return out


def numpy_mttkrp(csr, factors, rank, chunk=1 << 20):
    """MTTKRP of one block of unfolding rows with NumPy (the CPU engine and the 'numpy' peer).

    Parameters
    ----------
    csr : ModeCSR
    factors : list of ndarray, shape (I_m, R)
        All modes' factors (the mode's own is not read).

    Returns
    -------
    ndarray, shape (csr.n_rows, R), the factors' dtype
    """
    dtype = factors[0].dtype
    out = np.zeros((csr.n_rows, rank), dtype=dtype)
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    # Walk whole rows in chunks of about `chunk` nonzeros so the (nnz x R) rows stay small.
    start_row = 0
    while start_row < csr.n_rows:
        stop_row = int(np.searchsorted(indptr, indptr[start_row] + chunk, side="right")) - 1
        stop_row = min(max(stop_row, start_row + 1), csr.n_rows)
        lo, hi = int(indptr[start_row]), int(indptr[stop_row])
        if hi > lo:
            rows = csr.values[lo:hi, None].astype(dtype)
            for j, m in enumerate(csr.other_modes):
                rows = rows * factors[m][csr.other_idx[j, lo:hi]]
            lengths = np.diff(indptr[start_row:stop_row + 1])
            nonempty = np.flatnonzero(lengths)
            starts = (indptr[start_row:stop_row] - lo)[nonempty]
            out[start_row + nonempty] = np.add.reduceat(rows, starts, axis=0)
        start_row = stop_row
    return out


class CpuEngine(Engine):
    """NumPy on the host: the CPU backend (and what the CPU tests exercise).

    Parameters
    ----------
    ctx : EngineContext
    local : UnfoldingBlocks
    params : dict
        ``operation.params`` (``rank`` is read).
    """

    kernel_name = "numpy"

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.cp_rank = int(params["rank"])

    def upload(self):
        pass

    def load(self, factors, grams=None, lam=None):
        """Start from ``factors`` (and their ``grams``, fp64, and ``lam``; by default U^T U and
        ones)."""
        self.factors_full = [np.array(f, dtype=self.ctx.value_dtype) for f in factors]
        self.grams = [np.array(g, dtype=np.float64) for g in grams] if grams is not None else \
            [f.astype(np.float64).T @ f.astype(np.float64) for f in self.factors_full]
        self.lam = np.ones(self.cp_rank) if lam is None else np.array(lam, dtype=np.float64)

    def state(self):
        """``(lam, grams)``: checkpoints and the final result."""
        return self.lam.copy(), [g.copy() for g in self.grams]

    def mttkrp(self, n):
        self.m_local = numpy_mttkrp(self.local.modes[n], self.factors_full, self.cp_rank)

    def solve(self, n, vinv=None):
        """This rank's rows of U_n = M V^+, V the Hadamard product of the other modes' Grams
        (or ``vinv`` given)."""
        if vinv is None:
            vinv = np.linalg.pinv(hadamard(self.grams, skip=n))
        csr = self.local.modes[n]
        self.u_local = self.m_local @ vinv.astype(self.m_local.dtype)
        self.factors_full[n][csr.row_offset:csr.row_offset + csr.n_rows] = self.u_local

    def inner(self):
        return float(np.sum(self.u_local.astype(np.float64) * self.m_local.astype(np.float64)))

    def inner_local(self):
        """<U, M> of this rank's rows as a one-entry array the operation sums over the ranks."""
        self.inner_sum = np.array([self.inner()])
        return self.inner_sum

    def factor_buffer(self, n):
        """The (I_n, R) host array that the row all-gather of mode n fills in place; this
        rank's updated rows are already in it (``solve`` wrote them)."""
        return self.factors_full[n]

    def factor_gathered(self, n):
        """Every rank's rows of mode n are in :meth:`factor_buffer` (nothing to do here)."""

    def stats(self, n):
        u = self.factors_full[n].astype(np.float64)
        return u.T @ u, np.max(np.abs(u), axis=0) if len(u) else np.zeros(self.cp_rank)

    def scale(self, n, lam):
        self.factors_full[n] /= lam.astype(self.factors_full[n].dtype)

    def normalize(self, n, first):
        """lambda (column norms in the ``first`` iteration, else column maxima floored at 1),
        U_n /= lambda and G_n of the scaled factor."""
        products, column_max = self.stats(n)
        self.lam = np.sqrt(np.diag(products)) if first else np.maximum(column_max, 1.0)
        self.grams[n] = products / np.outer(self.lam, self.lam)
        self.scale(n, self.lam)

    def fit(self, norm_x):
        """1 - ||X - M|| / ||X|| from lambda, the Grams and the summed <X, M> (fp64)."""
        norm_m2 = float(self.lam @ hadamard(self.grams) @ self.lam)
        residual = np.sqrt(abs(norm_x ** 2 + norm_m2 - 2.0 * float(self.inner_sum[0])))
        self.last_fit = 1.0 - residual / norm_x if norm_x > 0 else 0.0

    def read_fit(self):
        return float(self.last_fit)

    def factors(self):
        return [f.copy() for f in self.factors_full]

    def local_mttkrp(self, n):
        return self.m_local

    def free(self):
        self.factors_full = None
        super().free()


# The MTTKRP kernel choice (operation.params.mttkrp) is the GPU's; the host has one MTTKRP.
ENGINES = dict.fromkeys(("seed", "fast"), CpuEngine)
