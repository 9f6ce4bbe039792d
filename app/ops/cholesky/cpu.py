"""CPU engine of the supernodal Cholesky: the reference factorization and solve on the host
(NumPy/SciPy LAPACK), and the functions it is made of (the tests use them directly).

Both engines work on the plan of :mod:`.symbolic`: one value array holds every supernode's dense
panel (column-major, ``nrows[s] x ncols[s]``, the supernode's own columns first). The
factorization is right-looking: a supernode is factored (potrf on its diagonal block, trsm below
it), then its update ``C = L21 L21^T`` is subtracted from its ancestors' panels through the
relative indices of the plan ("modify"). No MPI: the engine takes the plan, A's values and the
right-hand sides, and returns the solution in the permuted numbering.

Small supernodes, most of them on sparse problems, cost more in Python and in LAPACK/BLAS calls
than in arithmetic: runs of them are factored and substituted by one compiled loop each
(:func:`factor_supernodes`, :func:`substitute`), the large ones through LAPACK/BLAS.
"""
import time
from dataclasses import dataclass

import numpy as np

from ...compiled import compiled
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
    column = factor_supernodes(lx, PanelLayout.of(sym), np.arange(sym.nsuper, dtype=np.int64),
                               _dense_kernels(lx.dtype))
    if column >= 0:
        raise NotPositiveDefinite(sym.perm[column], column)
    return lx


def _linalg():
    """SciPy's dense linear algebra, imported at the CPU engine's first use: every Cholesky run
    imports this module (its errors and engines), and a GPU run, which never calls it, paid the
    import (0.17 s on the development host) in its start-up on every rank."""
    import scipy.linalg
    import scipy.linalg.blas
    import scipy.linalg.lapack
    return scipy.linalg


def _dense_kernels(dtype):
    """LAPACK potrf, BLAS trsm and syrk of ``dtype``."""
    linalg = _linalg()
    return (linalg.lapack.get_lapack_funcs("potrf", dtype=dtype),
            linalg.blas.get_blas_funcs("trsm", dtype=dtype),
            linalg.blas.get_blas_funcs("syrk", dtype=dtype))


@compiled
def _scatter_subtract(lx, update, r0, col_base, col_rel, rel):
    """lx[col_base[j] + rel[col_rel[j] + i]] -= update[i - r0, j - r0] for every column j of
    ``update`` (below rows r0 on) and row i >= j: the lower part of (a column range of) a
    supernode's update subtracted from its ancestors' panels (one pass, no index arrays)."""
    m = update.shape[0] + r0
    for jj in range(update.shape[1]):
        j = r0 + jj
        base = col_base[j]
        first = col_rel[j]
        for i in range(j, m):
            lx[base + rel[first + i]] -= update[i - r0, jj]


def factor_panel(panel, first, kernels):
    """Factor one supernode's ``panel`` in place: its diagonal block (potrf) and the rows below
    it (trsm). Returns the permuted column whose pivot is not positive (``first``: the
    supernode's first column), or -1."""
    potrf, trsm, _ = kernels
    nc = panel.shape[1]
    diag, info = potrf(panel[:nc], lower=1, clean=0, overwrite_a=0)
    if info != 0:
        return first + (info - 1 if info > 0 else 0)
    panel[:nc] = diag
    if panel.shape[0] > nc:
        # L21 = A21 L11^{-T} (BLAS trsm: right side, lower, transposed)
        panel[nc:] = trsm(1.0, diag, panel[nc:], side=1, lower=1, trans_a=1)
    return -1


def update_ancestors(panel, lx, col_base, col_rel, rel, kernels, rows=None):
    """Subtract a factored supernode's update from its ancestors' panels in ``lx``: C = L21
    L21^T, or with ``rows`` = (r0, r1) only its columns r0..r1-1 (below rows; the update of one
    ancestor, :func:`~.rank_plan.update_groups`), L21[r0:] L21[r0:r1]^T. ``col_base``,
    ``col_rel``: its below rows' entries of the plan; ``rel``: the plan's relative indices."""
    nc = panel.shape[1]
    below = panel[nc:]
    if not len(below):
        return
    if rows is None:
        update, r0 = kernels[2](1.0, below, lower=1), 0  # syrk: the lower triangle
    else:
        r0, r1 = rows
        update = below[r0:] @ below[r0:r1].T
    _scatter_subtract(lx, update, r0, col_base, col_rel, rel)


def factor_supernode(panel, first, lx, col_base, col_rel, rel, kernels):
    """Factor one supernode's ``panel`` (a view into ``lx``; its first column is ``first``)
    and subtract its update from its ancestors' panels in ``lx`` (right-looking:
    :func:`factor_panel`, then :func:`update_ancestors`).

    Returns
    -------
    int
        The permuted column whose pivot is not positive, or -1.
    """
    column = factor_panel(panel, first, kernels)
    if column < 0:
        update_ancestors(panel, lx, col_base, col_rel, rel, kernels)
    return column


#: Supernodes whose factorization and update cost at most this many multiply-adds
#: (ncols * nrows^2) are factored by one compiled loop over a run of them (the LAPACK and BLAS
#: calls of each, and the Python around them, cost more than their arithmetic); larger ones by
#: :func:`factor_supernode`.
SMALL_FACTOR_WORK = 2 ** 16


def factor_supernodes(lx, layout, supernodes, kernels):
    """Factor ``supernodes`` in order (right-looking, each update subtracted from its
    ancestors' panels in ``lx``): runs of small ones (:data:`SMALL_FACTOR_WORK`) by one
    compiled loop each, larger ones by :func:`factor_supernode`. Returns the first permuted
    column whose pivot is not positive (the factorization stops there), or -1."""
    order = np.asarray(supernodes, dtype=np.int64)
    if not len(order):
        return -1
    work = layout.ncols[order] * layout.nrows[order].astype(np.float64) ** 2
    for is_small, run in _runs(work <= SMALL_FACTOR_WORK, order):
        if is_small:
            column = _factor_run(lx, layout.panel_offset, layout.nrows, layout.ncols,
                                 layout.first, layout.below_offset, layout.col_base,
                                 layout.col_rel, layout.rel, np.ascontiguousarray(run))
            if column >= 0:
                return column
            continue
        for s in run.tolist():
            column = factor_supernode(layout.panel(lx, s), int(layout.first[s]), lx,
                                      *layout.updates(s), layout.rel, kernels)
            if column >= 0:
                return column
    return -1


@compiled
def _factor_run(lx, panel_offset, nrows, ncols, first, below_offset, col_base, col_rel, rel,
                run):
    """Factor the supernodes of ``run`` in order, column by column (the panel's pivot, the
    column scaled, the columns right of it updated), then subtract each one's update L21 L21^T
    from its ancestors (``col_base[j] + rel[col_rel[j] + i]`` for below rows i >= j). Returns
    the first column whose pivot is not positive, or -1."""
    for s in run:
        off, nr, nc = panel_offset[s], nrows[s], ncols[s]
        for c in range(nc):
            d = lx[off + c * nr + c]
            if not d > 0.0:
                return first[s] + c
            d = np.sqrt(d)
            lx[off + c * nr + c] = d
            for r in range(c + 1, nr):
                lx[off + c * nr + r] /= d
            for j in range(c + 1, nc):
                ljc = lx[off + c * nr + j]
                for r in range(j, nr):
                    lx[off + j * nr + r] -= lx[off + c * nr + r] * ljc
        b0 = below_offset[s]
        m = nr - nc
        for j in range(m):
            base, start = col_base[b0 + j], col_rel[b0 + j]
            for i in range(j, m):
                u = lx[off + nc + i] * lx[off + nc + j]
                for c in range(1, nc):
                    u += lx[off + c * nr + nc + i] * lx[off + c * nr + nc + j]
                lx[base + rel[start + i]] -= u
    return -1


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
    layout = PanelLayout.of(sym)
    every = np.arange(sym.nsuper, dtype=np.int64)
    substitute(lx, layout, x, every, forward=True)
    substitute(lx, layout, x, every, forward=False)
    return x


#: Supernodes with at most this many panel entries are substituted by one compiled loop over a
#: run of them (a Python call and two BLAS calls each cost more than their arithmetic: the
#: 1000^2 grid's 180,000 supernodes took 4 s a solve at 4 ranks); larger ones by BLAS.
SMALL_SOLVE_ENTRIES = 16384


@dataclass
class PanelLayout:
    """Where a factor's panels lie and where their updates go: the arrays of a
    :class:`~.factor.SymbolicFactor` or of a rank's :class:`~.rank_plan.LocalPlan` (panel
    offsets, rows and columns of every panel, first column, row lists and their offsets, and
    the update plan: below-row offsets, ``col_base``, ``col_rel``, ``rel``)."""

    panel_offset: np.ndarray
    nrows: np.ndarray
    ncols: np.ndarray
    first: np.ndarray
    rows: np.ndarray
    rows_offset: np.ndarray
    below_offset: np.ndarray
    col_base: np.ndarray
    col_rel: np.ndarray
    rel: np.ndarray

    @classmethod
    def of(cls, plan):
        """The layout of a SymbolicFactor (``starts``) or a LocalPlan (``first``, ``ncols``)."""
        if hasattr(plan, "starts"):
            first, ncols = plan.starts[:-1], np.diff(plan.starts)
        else:
            first, ncols = plan.first, plan.ncols
        return cls(plan.panel_offset, plan.nrows, ncols, first, plan.rows, plan.rows_offset,
                   plan.below_offset, plan.col_base, plan.col_rel, plan.rel)

    def panel(self, lx, s):
        """Supernode ``s``'s panel as a (nrows, ncols) Fortran-ordered view of ``lx``."""
        nr, nc, off = int(self.nrows[s]), int(self.ncols[s]), int(self.panel_offset[s])
        return lx[off:off + nr * nc].reshape(nc, nr).T

    def below(self, s):
        return self.rows[self.rows_offset[s] + self.ncols[s]:self.rows_offset[s + 1]]

    def updates(self, s):
        """``col_base`` and ``col_rel`` of supernode ``s``'s below rows."""
        b0, b1 = int(self.below_offset[s]), int(self.below_offset[s + 1])
        return self.col_base[b0:b1], self.col_rel[b0:b1]


def _runs(small, order):
    """``(is small, run)`` for every maximal run of ``order`` alike in ``small``."""
    cuts = np.flatnonzero(small[1:] != small[:-1]) + 1
    return zip(small[np.concatenate([[0], cuts])], np.split(order, cuts))


def substitute(lx, layout, x, supernodes, forward):
    """Forward (L y = b, ``supernodes`` in order) or backward (L^T x = y, in reverse order)
    substitution of ``x`` (n x k, C order) by the panels of ``supernodes``: runs of small ones
    (:data:`SMALL_SOLVE_ENTRIES`) by one compiled loop each, larger ones by BLAS."""
    order = np.asarray(supernodes, dtype=np.int64)
    if not forward:
        order = order[::-1]
    if not len(order):
        return
    small = layout.nrows[order] * layout.ncols[order] <= SMALL_SOLVE_ENTRIES
    for is_small, run in _runs(small, order):
        if is_small:
            loop = _forward_run if forward else _backward_run
            loop(lx, layout.panel_offset, layout.nrows, layout.ncols, layout.first,
                 layout.rows, layout.rows_offset, np.ascontiguousarray(run), x)
            continue
        step = forward_supernode if forward else backward_supernode
        for s in run.tolist():
            step(layout.panel(lx, s), x, int(layout.first[s]), layout.below(s))


def forward_supernode(panel, x, f, below):
    """Forward substitution of one supernode: its columns ``f..`` of ``x`` solved with its
    diagonal block, then ``L21 y`` subtracted at its ``below`` rows."""
    nc = panel.shape[1]
    x[f:f + nc] = _linalg().solve_triangular(panel[:nc], x[f:f + nc], lower=True)
    if panel.shape[0] > nc:
        x[below] -= panel[nc:] @ x[f:f + nc]


def backward_supernode(panel, x, f, below):
    """Backward substitution of one supernode: ``L21^T x`` of its ``below`` rows subtracted
    from its columns ``f..``, then solved with its diagonal block (transposed)."""
    nc = panel.shape[1]
    if panel.shape[0] > nc:
        x[f:f + nc] -= panel[nc:].T @ x[below]
    x[f:f + nc] = _linalg().solve_triangular(panel[:nc], x[f:f + nc], lower=True, trans="T")


@compiled
def _forward_run(lx, panel_offset, nrows, ncols, first, rows, rows_offset, run, x):
    """Forward substitution by the panels of ``run``, in order, column by column: x at a column
    divided by its pivot, then its multiples subtracted at the rows below (the panel's row list:
    its own columns, then the below rows)."""
    for s in run:
        off, nr, nc, f, ro = panel_offset[s], nrows[s], ncols[s], first[s], rows_offset[s]
        for k in range(x.shape[1]):
            for c in range(nc):
                v = x[f + c, k] / lx[off + c * nr + c]
                x[f + c, k] = v
                for r in range(c + 1, nr):
                    x[rows[ro + r], k] -= lx[off + c * nr + r] * v


@compiled
def _backward_run(lx, panel_offset, nrows, ncols, first, rows, rows_offset, run, x):
    """Backward substitution by the panels of ``run``, in the order given (the reverse of the
    forward one), its columns last to first: the rows below subtracted, then the pivot."""
    for s in run:
        off, nr, nc, f, ro = panel_offset[s], nrows[s], ncols[s], first[s], rows_offset[s]
        for k in range(x.shape[1]):
            for c in range(nc - 1, -1, -1):
                v = x[f + c, k]
                for r in range(c + 1, nr):
                    v -= lx[off + c * nr + r] * x[rows[ro + r], k]
                x[f + c, k] = v / lx[off + c * nr + c]


def factor_to_sparse(sym, lx):
    """The factor as a SciPy CSC lower-triangular matrix (permuted numbering), for tests."""
    import scipy.sparse as sp
    rows, cols, vals = [], [], []
    layout = PanelLayout.of(sym)
    for s in range(sym.nsuper):
        panel = layout.panel(lx, s)
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
        ``sym`` (the :class:`~.factor.SymbolicFactor`) and ``matrix`` (A's pattern, for the
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

    # -- iterative refinement (composed by the operation: see refinement.refine) ----------
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


class SubtreeFactorEngine(Engine):
    """One rank's share of the factorization and solve under the subtree-to-rank mapping
    (:mod:`.mapping`), on the host: its subtrees without any exchange, then the top supernodes
    one by one. The operation moves the update and solve blocks between the ranks; the engine
    only hands them out and takes them in (it never sees a communicator).

    Parameters
    ----------
    ctx : EngineContext
    local : CholeskyLocal
        ``plan``: this rank's :class:`~.rank_plan.LocalPlan`.
    params : dict
    """

    stream = None

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.plan = local.plan
        self.layout = PanelLayout.of(local.plan)
        self.dtype = np.dtype(ctx.value_dtype)
        self.values = self.lx = self.x = None
        self.kernels = _dense_kernels(self.dtype)
        self._local_solve = 0.0  # seconds of forward_local/backward_local since the last take

    def _panel(self, i):
        return self.layout.panel(self.lx, int(i))

    def load(self, values):
        """This rank's entries of A (in the order of its plan's ``a_dest``)."""
        self.values = values

    def factor_local(self):
        """Assemble this rank's entries and factor its subtrees; returns the first permuted
        column whose pivot is not positive, or -1."""
        plan = self.plan
        self.lx = np.zeros(int(plan.panel_offset[-1]), dtype=self.dtype)
        np.add.at(self.lx, plan.a_dest, self.values.astype(self.dtype, copy=False))
        return factor_supernodes(self.lx, self.layout, plan.local, self.kernels)

    def update_block(self, i0, i1):
        """The panels of held supernodes ``i0..i1`` (consecutive) as they stand: this rank's
        updates to them (a view)."""
        plan = self.plan
        return self.lx[int(plan.panel_offset[i0]):int(plan.panel_offset[i1 + 1])]

    def empty_update_block(self, i0, i1):
        """A buffer for another rank's update block of supernodes ``i0..i1``."""
        return np.empty_like(self.update_block(i0, i1))

    def add_update(self, i0, i1, block):
        """Add another rank's update ``block`` to the panels of supernodes ``i0..i1``."""
        self.update_block(i0, i1)[:] += block

    def factor_top(self, i):
        """Factor top supernode ``i`` (its updates all in), its panel only (its updates of the
        supernodes above: :meth:`update_top`); returns as :meth:`factor_local`."""
        return factor_panel(self._panel(int(i)), int(self.plan.first[i]), self.kernels)

    def update_top(self, i, r0, r1):
        """Subtract factored top supernode ``i``'s update of its below rows ``r0..r1-1`` (one
        ancestor's, :func:`~.rank_plan.update_groups`) from the panels here."""
        update_ancestors(self._panel(int(i)), self.lx, *self.layout.updates(int(i)),
                         self.layout.rel, self.kernels, (r0, r1))

    def synchronize(self):
        """Nothing is pending on the host (the GPU engine waits for its stream here)."""

    def logdet(self):
        """This rank's share of log det A: its owned columns' pivots."""
        return logdet_of_diagonal(self.lx[self.plan.diag_pos])

    # -- solve (the operation composes the steps: forward up the tree, backward down) --------
    def start_solve(self, rhs):
        """Right-hand sides at this rank's owned columns (permuted order, shape (nc, k))."""
        self.x = np.zeros((self.plan.n, rhs.shape[1]), dtype=self.dtype)
        self.x[self.plan.owned_columns] = rhs

    def _columns(self, i0, i1):
        return slice(int(self.plan.first[i0]), int(self.plan.first[i1] + self.plan.ncols[i1]))

    def forward_local(self):
        began = time.perf_counter()
        substitute(self.lx, self.layout, self.x, self.plan.local, forward=True)
        self._local_solve += time.perf_counter() - began

    def solve_block(self, i0, i1):
        """The rows of ``x`` at the columns of supernodes ``i0..i1`` (a view)."""
        return self.x[self._columns(i0, i1)]

    def empty_solve_block(self, i0, i1):
        """A buffer for another rank's solve block of supernodes ``i0..i1``."""
        return np.empty_like(self.solve_block(i0, i1))

    def add_solve_block(self, i0, i1, block):
        self.x[self._columns(i0, i1)] += block

    def solved_block(self, i0, i1):
        """The solution at the columns of supernodes ``i0..i1`` once they are solved backward
        (here the same rows of ``x`` as :meth:`solve_block`)."""
        return self.solve_block(i0, i1)

    def set_solved_block(self, i0, i1, block):
        """Take the owner's :meth:`solved_block` of ``i0..i1``."""
        self.x[self._columns(i0, i1)] = block

    def forward_top(self, i):
        forward_supernode(self._panel(i), self.x, int(self.plan.first[i]),
                          self.layout.below(int(i)))

    def backward_top(self, i):
        backward_supernode(self._panel(i), self.x, int(self.plan.first[i]),
                           self.layout.below(int(i)))

    def backward_local(self):
        began = time.perf_counter()
        substitute(self.lx, self.layout, self.x, self.plan.local, forward=False)
        self._local_solve += time.perf_counter() - began

    def take_local_solve_seconds(self):
        """Seconds the solves since the last call spent in this rank's subtrees
        (:meth:`forward_local`, :meth:`backward_local`)."""
        seconds, self._local_solve = self._local_solve, 0.0
        return seconds

    def solution(self):
        """The solution at this rank's owned columns, shape (nc, k)."""
        return self.x[self.plan.owned_columns]

    def held_bytes(self):
        """Bytes this rank holds for the factorization: its panels, its plan and the solve's
        vector."""
        item = self.dtype.itemsize
        x = 0 if self.x is None else self.x.nbytes
        return int(self.plan.panel_offset[-1]) * item + self.plan.nbytes() + x


ENGINES = {None: CpuFactorEngine, "subtree": SubtreeFactorEngine}
