"""CP-ALS on the host (NumPy): the CPU engine and the MTTKRP it shares with the 'numpy' peer.

The engine holds this rank's block of rows of every mode's unfolding
(:class:`~hisparse.ops.cpals.layout.UnfoldingBlocks`), a full, replicated copy of every factor
matrix (I_m x R), their Grams and lambda. One mode update is

    mttkrp(n) -> solve(n) -> factor_buffer(n) ... factor_gathered(n) -> normalize(n, first[, norm_x])

and an iteration ends with read_fit(). ``solve`` returns this rank's column products (U^T U,
<U, M>, max |U| of its rows), which the operation sums and maximises over the ranks in place,
and the operation fills ``factor_buffer(n)`` with the other ranks' solved rows (a planned row
all-gather), both before ``normalize``. The engine itself never communicates. The GPU engines
(:mod:`.gpu`) have the same steps.
"""
import time

import numpy as np

from .. import Engine
from .products import FIT_SLOTS, product_width, reduction_parts, split_products


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
        This rank's blocks (:class:`~.layout.ModeCSR`).
    params : dict
        ``operation.params`` (``rank`` is read).
    """

    kernel_name = "numpy"
    unfoldings_built_on = "host"
    #: Every mode is normalised on the chain: no stream to hand an exchange to (gpu.py's
    #: engines defer it; the operation reads this to choose the iteration's sequence).
    DEFERS_NORMALIZATION = False

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.cp_rank = int(params["rank"])
        rank = self.cp_rank
        # The column products of this rank's rows (see solve), in the layout of split_products.
        self.total = np.zeros(product_width(rank))
        self.sums, self.maxima = reduction_parts(self.total, rank)

    def upload(self):
        pass

    upload_data = build_unfoldings = upload

    def load(self, factors, grams=None, lam=None):
        """Start from ``factors`` (and their ``grams``, fp64, and ``lam``; by default U^T U and
        ones)."""
        # C order whatever the start's layout: the row all-gather fills the factor in place as
        # one flat buffer, which a Fortran-ordered factor is not.
        self.factors_full = [np.array(f, dtype=self.ctx.value_dtype, order="C") for f in factors]
        self.grams = [np.array(g, dtype=np.float64) for g in grams] if grams is not None else \
            [f.astype(np.float64).T @ f.astype(np.float64) for f in self.factors_full]
        self.lam = np.ones(self.cp_rank) if lam is None else np.array(lam, dtype=np.float64)
        self.fits = {}

    def state(self):
        """``(lam, grams)``: checkpoints and the final result."""
        return self.lam.copy(), [g.copy() for g in self.grams]

    def _rows(self, n):
        block = self.local.modes[n]
        return slice(block.row_offset, block.row_offset + block.n_rows)

    def mttkrp(self, n):
        self.m_local = numpy_mttkrp(self.local.modes[n], self.factors_full, self.cp_rank)

    def solve(self, n, vinv=None):
        """This rank's rows of U_n = M V^+, V the Hadamard product of the other modes' Grams
        (or ``vinv`` given), and their column products.

        Returns
        -------
        (sums, maxima) : views of one fp64 array
            U^T U and <U, M> of this rank's rows (R*R + 1) to sum over the ranks, then the
            column maxima of |U| (R) to maximise over the ranks, in place, before
            :meth:`normalize`.
        """
        if vinv is None:
            vinv = np.linalg.pinv(hadamard(self.grams, skip=n))
        u_local = self.m_local @ vinv.astype(self.m_local.dtype)
        self.factors_full[n][self._rows(n)] = u_local
        u64 = u_local.astype(np.float64)
        rank = self.cp_rank
        self.sums[:rank * rank] = (u64.T @ u64).ravel()
        self.sums[rank * rank] = float(np.sum(u64 * self.m_local.astype(np.float64)))
        self.maxima[:] = np.max(np.abs(u64), axis=0, initial=0.0)
        return self.sums, self.maxima

    def products(self):
        """``(U^T U, <U, M>, column maxima of |U|)`` of the last solve (after the operation's
        all-reduce: of every rank's rows)."""
        gram, inner, maxima = split_products(self.total, self.cp_rank)
        return gram.copy(), inner, maxima.copy()

    def normalize(self, n, first, norm_x=None, slot=0):
        """From the column products reduced over the ranks: lambda (column norms in the
        ``first`` iteration, else column maxima floored at 1), U_n /= lambda (every row: the
        factor is gathered), G_n of the scaled factor, and with ``norm_x`` (after the last
        mode) the fit (fp64), kept in ``slot`` (the iteration) for :meth:`read_fit`."""
        products, inner, maxima = split_products(self.total, self.cp_rank)
        self.lam = np.sqrt(np.diag(products)) if first else np.maximum(maxima, 1.0)
        self.grams[n] = products / np.outer(self.lam, self.lam)
        self.factors_full[n] /= self.lam.astype(self.factors_full[n].dtype)
        if norm_x is not None:
            norm_m2 = float(self.lam @ hadamard(self.grams) @ self.lam)
            residual = np.sqrt(abs(norm_x ** 2 + norm_m2 - 2.0 * inner))
            self.fits[int(slot) % FIT_SLOTS] = 1.0 - residual / norm_x if norm_x > 0 else 0.0

    def factor_buffer(self, n, stream=None):
        """The (I_n, R) host array that the row all-gather of mode n fills in place; this
        rank's solved rows are already in it (``stream``: the GPU engines'; none here)."""
        return self.factors_full[n]

    def factor_gathered(self, n, stream=None):
        """Every rank's rows of mode n are in :meth:`factor_buffer` (nothing to do here)."""

    def read_fit(self, slot=0):
        return float(self.fits[int(slot) % FIT_SLOTS])

    @staticmethod
    def mark():
        """A point in time, for :meth:`elapsed` (the host computes synchronously)."""
        return time.perf_counter()

    @staticmethod
    def elapsed(start, end):
        return end - start

    def factors(self):
        return [f.copy() for f in self.factors_full]

    def factor_rows(self, n):
        """This rank's rows of factor n (``output.collect: parts``)."""
        return self.factors_full[n][self._rows(n)].copy()

    def local_mttkrp(self, n):
        return self.m_local

    def free(self):
        self.factors_full = None
        super().free()


# The MTTKRP kernel choice (operation.params.mttkrp) is the GPU's; the host has one MTTKRP.
ENGINES = dict.fromkeys(("seed", "fast"), CpuEngine)
