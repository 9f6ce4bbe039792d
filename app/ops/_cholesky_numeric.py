"""Numeric supernodal Cholesky: the CPU reference (NumPy/SciPy LAPACK) and the GPU engine.

Both work on the plan of :mod:`._cholesky_symbolic`: one value array holds every supernode's
dense panel (column-major, ``nrows[s] x ncols[s]``, the supernode's own columns first). The
factorization is right-looking: a supernode is factored (potrf on its diagonal block, trsm below
it), then its update ``C = L21 L21^T`` is subtracted from its ancestors' panels through the
relative indices of the plan ("modify").

GPU engine: the value array lives on the GPU for the whole factorization; the plan's index arrays
are uploaded once. Supernodes are processed by etree level (bottom up): all *small* supernodes
of a level go to one batched kernel (one thread block each: dense factorization in shared
memory, update, atomic scatter-add into the ancestors), so launch latency does not grow with the
number of supernodes; every *large* supernode is split into column blocks of ``block_size`` and
issued as potrf / trsm / syrk / gemm block tasks over S streams, with CUDA events enforcing the
dependencies (block k's trsm before the updates of the blocks right of it; updates of a block
stay on that block's stream so they serialize), followed by the external update in row chunks
(gemm into a per-stream workspace + the scatter kernel). Dense BLAS/LAPACK comes from cuBLAS and
cuSOLVER through CuPy's low-level bindings, with handles created in the rank's primary context.
"""
import numpy as np
import scipy.linalg
import scipy.linalg.blas
from scipy.linalg import lapack

from ..errors import HisparseError


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


def logdet(sym, lx):
    """log det A = 2 sum log L_jj."""
    return 2.0 * float(np.sum(np.log(lx[sym.diag_pos].astype(np.float64))))


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


# --------------------------------------------------------------------------------------------
# GPU engine
# --------------------------------------------------------------------------------------------

_SMALL_THREADS = 128


class GpuFactorEngine:
    """Supernodal factorization and solve on the rank's GPU.

    Parameters
    ----------
    ctx : RunContext
        Its device's primary context must be current.
    sym : SymbolicFactor
    dtype : numpy.dtype
        float64 or float32.
    module : pycuda.driver.Module
        ``kernels_cu/cholesky.cu`` compiled for ``dtype`` (loaded collectively by the caller).
    streams : int
        Streams for the block tasks of large supernodes.
    small_work : float
        A supernode with ``ncols * nrows**2 <= small_work`` goes to the batched kernel.
    """

    def __init__(self, ctx, sym, dtype, module, streams=4, small_work=2.0 ** 21,
                 smem_bytes=48 * 1024 - 256):
        import pycuda.driver as cuda
        self.cuda = cuda
        self.ctx, self.sym = ctx, sym
        self.dtype = np.dtype(dtype)
        if sym.n >= 2 ** 31 - 1:
            raise HisparseError("cholesky: the GPU engine needs n < 2^31")
        self.module = module
        self.smem_bytes = int(smem_bytes)
        self.k_assemble = self._get("assemble", "qPPPP")
        self.k_factor_small = self._get("factor_small", "iPPPPPPPPPP")
        self.k_scatter = self._get("scatter_update", "iiiPiPPPP")
        self.k_info = self._get("record_potrf_info", "PiP")
        self.k_diag = self._get("gather_diag", "iPPP")
        self.k_fwd_small = self._get("forward_small", "iPPPPPPPiiP")
        self.k_bwd_small = self._get("backward_small", "iPPPPPPPiiP")
        self.k_sub_rows = self._get("sub_rows", "iiPiPPi")
        self.k_gather_rows = self._get("gather_rows", "iiPPiPi")
        self.nstreams = max(1, int(streams))
        self.streams = [cuda.Stream() for _ in range(self.nstreams)]
        self.stream = self.streams[0]
        self._plan(small_work)
        self._upload()
        self._handles()

    def _get(self, name, signature):
        function = self.module.get_function(name)
        function.prepare(signature)
        return function

    # -- plan ------------------------------------------------------------------------------
    def _plan(self, small_work):
        sym = self.sym
        ncols = np.diff(sym.starts)
        work = ncols.astype(np.float64) * sym.nrows.astype(np.float64) ** 2
        small = work <= small_work
        self.schedule = []  # per level: (small supernode ids int32, [large supernode ids])
        for lev in range(int(sym.level.max()) + 1 if sym.nsuper else 0):
            ids = np.flatnonzero(sym.level == lev)
            self.schedule.append((ids[small[ids]].astype(np.int32), ids[~small[ids]].tolist()))
        self.large = np.flatnonzero(~small)
        self.n_small, self.n_large = int(small.sum()), len(self.large)
        bs = sym.block_size
        self.max_block = int(min(bs, ncols[self.large].max())) if self.n_large else 1
        below = sym.nrows - ncols
        self.max_chunk = int(max([below[s] * min(bs, below[s]) for s in self.large] + [1]))
        self.max_below = int(max(below.max() if sym.nsuper else 1, 1))

    def _upload(self):
        cuda, sym = self.cuda, self.sym
        self.keep = []

        def dev(array):
            array = np.ascontiguousarray(array)
            alloc = cuda.mem_alloc(max(array.nbytes, 8))
            if array.nbytes:
                cuda.memcpy_htod(alloc, array)
            self.keep.append(alloc)
            return alloc

        self.d_starts = dev(sym.starts.astype(np.int64))
        self.d_nrows = dev(sym.nrows.astype(np.int64))
        self.d_panel = dev(sym.panel_offset.astype(np.int64))
        self.d_below = dev(sym.below_offset.astype(np.int64))
        self.d_rows_off = dev(sym.rows_offset.astype(np.int64))
        self.d_rows = dev(sym.rows.astype(np.int32))
        self.d_col_base = dev(sym.col_base)
        self.d_col_rel = dev(sym.col_rel)
        self.d_rel = dev(sym.rel.astype(np.int32))
        self.d_src = dev(sym.a_source.astype(np.int64))
        self.d_dst = dev(sym.a_dest.astype(np.int64))
        self.d_diag = dev(sym.diag_pos.astype(np.int64))
        self.d_levels = [dev(ids) if len(ids) else None for ids, _ in self.schedule]
        item = self.dtype.itemsize
        self.n_values = int(sym.panel_offset[-1])
        self.d_L = cuda.mem_alloc(max(self.n_values * item, 8))
        self.d_failed = cuda.mem_alloc(4)
        self.d_diag_out = cuda.mem_alloc(max(sym.n * item, 8))
        self.d_chunk = [cuda.mem_alloc(self.max_chunk * item) for _ in range(self.nstreams)]
        self.d_info = [cuda.mem_alloc(4) for _ in range(self.nstreams)]
        self.d_values = None
        self.d_x = None
        self.d_t = None
        self.h_failed = cuda.pagelocked_empty(1, np.int32)
        self.h_diag = cuda.pagelocked_empty(sym.n, self.dtype)
        self.bytes_plan = int(sum(a.size for a in (sym.starts, sym.nrows, sym.panel_offset,
                                                   sym.below_offset, sym.rows_offset)) * 8
                              + sym.rows.size * 4 + (sym.col_base.size + sym.col_rel.size) * 8
                              + sym.rel.size * 4 + (sym.a_source.size + sym.a_dest.size) * 8)

    def _handles(self):
        try:
            from cupy_backends.cuda.libs import cublas, cusolver
        except ImportError as exc:
            if self.n_large:
                raise HisparseError(f"cholesky on the GPU needs CuPy for cuBLAS/cuSOLVER "
                                    f"({exc}); run with backend: cpu") from None
            self.blas = self.solver = None
            return
        self.cublas_mod, self.cusolver_mod = cublas, cusolver
        f64 = self.dtype == np.float64
        self.gemm = cublas.dgemm if f64 else cublas.sgemm
        self.syrk = cublas.dsyrk if f64 else cublas.ssyrk
        self.trsm = cublas.dtrsm if f64 else cublas.strsm
        self.potrf = cusolver.dpotrf if f64 else cusolver.spotrf
        potrf_size = cusolver.dpotrf_bufferSize if f64 else cusolver.spotrf_bufferSize
        self.blas = [cublas.create() for _ in range(self.nstreams)]
        self.solver = [cusolver.create() for _ in range(self.nstreams)]
        for q, stream in enumerate(self.streams):
            cublas.setStream(self.blas[q], stream.handle)
            cusolver.setStream(self.solver[q], stream.handle)
        self.scalars = {v: np.array([v], dtype=self.dtype) for v in (1.0, -1.0, 0.0)}
        lda = int(max(self.sym.nrows.max(), 1))
        self.lwork = int(potrf_size(self.solver[0], 0, self.max_block, int(self.d_L), lda))
        self.d_work = [self.cuda.mem_alloc(max(self.lwork, 1) * self.dtype.itemsize)
                       for _ in range(self.nstreams)]

    def _alpha(self, value):
        return self.scalars[value].ctypes.data

    # -- numeric factorization -------------------------------------------------------------
    def set_values(self, values, stream=None):
        """Upload A's CSR data (the h2d part of a refactorization)."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self.d_values is None:
            self.d_values = self.cuda.mem_alloc(max(values.nbytes, 8))
            self.h_values = self.cuda.pagelocked_empty(len(values), self.dtype)
        self.h_values[:] = values
        self.cuda.memcpy_htod_async(self.d_values, self.h_values, stream or self.stream)

    def factor(self):
        """Assemble A into the panels and factor; returns log det A.

        Raises
        ------
        NotPositiveDefinite
        """
        cuda, sym, st0 = self.cuda, self.sym, self.stream
        item = self.dtype.itemsize
        cuda.memset_d8_async(self.d_L, 0, self.n_values * item, st0)
        cuda.memset_d32_async(self.d_failed, 0x7FFFFFFF, 1, st0)
        nnz = len(sym.a_source)
        if nnz:
            self.k_assemble.prepared_async_call(((nnz + 255) // 256, 1), (256, 1, 1), st0,
                                                np.int64(nnz), self.d_values, self.d_src,
                                                self.d_dst, self.d_L)
        smem = self.smem_bytes
        for lev, (small, large) in enumerate(self.schedule):
            if len(small):
                self.k_factor_small.prepared_async_call(
                    (len(small), 1), (_SMALL_THREADS, 1, 1), st0, np.int32(len(small)),
                    self.d_levels[lev], self.d_starts, self.d_nrows, self.d_panel,
                    self.d_below, self.d_col_base, self.d_col_rel, self.d_rel, self.d_L,
                    self.d_failed, shared_size=smem)
            for s in large:
                self._factor_large(s)
        if sym.n:
            self.k_diag.prepared_async_call(((sym.n + 255) // 256, 1), (256, 1, 1), st0,
                                            np.int32(sym.n), self.d_diag, self.d_L,
                                            self.d_diag_out)
            cuda.memcpy_dtoh_async(self.h_diag, self.d_diag_out, st0)
        cuda.memcpy_dtoh_async(self.h_failed, self.d_failed, st0)
        st0.synchronize()
        failed = int(self.h_failed[0])
        if failed != 0x7FFFFFFF:
            raise NotPositiveDefinite(sym.perm[failed], failed)
        return 2.0 * float(np.sum(np.log(self.h_diag.astype(np.float64))))

    def _factor_large(self, s):
        """Block tasks of one large supernode over the streams, then its external update."""
        cuda, sym = self.cuda, self.sym
        streams, S = self.streams, self.nstreams
        item = self.dtype.itemsize
        first = int(sym.starts[s])
        nc = int(sym.starts[s + 1]) - first
        nr = int(sym.nrows[s])
        m = nr - nc
        base = int(self.d_L) + int(sym.panel_offset[s]) * item

        def at(row, col):
            return base + (row + col * nr) * item

        # Every stream starts after what stream 0 has issued so far (earlier supernodes).
        start = cuda.Event()
        start.record(streams[0])
        waiting = set()

        def join(q):
            if q and q not in waiting:
                streams[q].wait_for_event(start)
                waiting.add(q)

        blocks = sym.column_blocks(s).tolist()
        nblocks = len(blocks) - 1
        one, minus = self._alpha(1.0), self._alpha(-1.0)
        for k in range(nblocks):
            q = k % S
            join(q)
            c0, c1 = blocks[k], blocks[k + 1]
            bk = c1 - c0
            # potrf of diagonal block k: its updates from blocks < k ran on this same stream
            self.potrf(self.solver[q], 0, bk, at(c0, c0), nr, int(self.d_work[q]), self.lwork,
                       int(self.d_info[q]))
            self.k_info.prepared_async_call((1, 1), (1, 1, 1), streams[q], self.d_info[q],
                                            np.int32(first + c0), self.d_failed)
            if nr - c1 > 0:
                # trsm: L[c1:, block k] = A[c1:, block k] L_kk^{-T} (right, lower, transposed)
                self.trsm(self.blas[q], 1, 0, 1, 0, nr - c1, bk, one, at(c0, c0), nr,
                          at(c1, c0), nr)
            done = cuda.Event()
            done.record(streams[q])
            for j in range(k + 1, nblocks):
                qj = j % S
                join(qj)
                d0, d1 = blocks[j], blocks[j + 1]
                bj = d1 - d0
                if qj != q:
                    streams[qj].wait_for_event(done)
                # syrk on block j's diagonal tile, gemm on the tiles below it
                self.syrk(self.blas[qj], 0, 0, bj, bk, minus, at(d0, c0), nr, one, at(d0, d0),
                          nr)
                if nr - d1 > 0:
                    self.gemm(self.blas[qj], 0, 1, nr - d1, bj, bk, minus, at(d1, c0), nr,
                              at(d0, c0), nr, one, at(d1, d0), nr)
        touched = {0} | waiting
        if m > 0:
            # External update (modify): C = L21 L21^T in row chunks, scattered into ancestors.
            finished = []
            for q in sorted(touched):
                event = cuda.Event()
                event.record(streams[q])
                finished.append((q, event))
            chunk = sym.block_size
            b0 = int(sym.below_offset[s])
            zero = self._alpha(0.0)
            for c, r0 in enumerate(range(0, m, chunk)):
                q = c % S
                join(q)
                for q2, event in finished:
                    if q2 != q:
                        streams[q].wait_for_event(event)
                width = min(chunk, m - r0)
                height = m - r0
                self.gemm(self.blas[q], 0, 1, height, width, nc, one, at(nc + r0, 0), nr,
                          at(nc + r0, 0), nr, zero, int(self.d_chunk[q]), height)
                threads = 256
                grid = ((height * width + threads - 1) // threads, 1)
                self.k_scatter.prepared_async_call(
                    grid, (threads, 1, 1), streams[q], np.int32(m), np.int32(r0),
                    np.int32(width), self.d_chunk[q], np.int32(height),
                    int(self.d_col_base) + b0 * 8, int(self.d_col_rel) + b0 * 8, self.d_rel,
                    self.d_L)
            touched |= waiting
        # Stream 0 waits for every stream: the next supernode depends on this one.
        for q in sorted(touched):
            if q:
                event = cuda.Event()
                event.record(streams[q])
                streams[0].wait_for_event(event)

    # -- solve -----------------------------------------------------------------------------
    def upload_rhs(self, rhs_host):
        nrhs, n = rhs_host.shape
        item = self.dtype.itemsize
        if self.d_x is None or self.x_shape != (nrhs, n):
            if self.d_x is not None:
                self.d_x.free()
                self.d_t.free()
            self.d_x = self.cuda.mem_alloc(max(rhs_host.nbytes, 8))
            self.d_t = self.cuda.mem_alloc(max(self.max_below * nrhs * item, 8))
            self.x_shape = (nrhs, n)
        self.cuda.memcpy_htod_async(self.d_x, rhs_host, self.stream)

    def substitute(self):
        """L y = b then L^T x = y, in place on the uploaded right-hand sides (stream 0)."""
        st0 = self.stream  # handle 0 of cuBLAS is bound to stream 0
        nrhs, n = self.x_shape
        item = self.dtype.itemsize
        one, minus, zero = self._alpha(1.0), self._alpha(-1.0), self._alpha(0.0)
        x = int(self.d_x)
        for lev, (small, large) in enumerate(self.schedule):
            if len(small):
                self.k_fwd_small.prepared_async_call(
                    (len(small), 1), (_SMALL_THREADS, 1, 1), st0, np.int32(len(small)),
                    self.d_levels[lev], self.d_starts, self.d_nrows, self.d_panel,
                    self.d_rows_off, self.d_rows, self.d_L, np.int32(nrhs), np.int32(n),
                    self.d_x)
            for s in large:
                first, nc, nr, p, rows = self._geometry(s)
                self.trsm(self.blas[0], 0, 0, 0, 0, nc, nrhs, one, p, nr, x + first * item, n)
                m = nr - nc
                if m:
                    self.gemm(self.blas[0], 0, 0, m, nrhs, nc, one, p + nc * item, nr,
                              x + first * item, n, zero, int(self.d_t), m)
                    self.k_sub_rows.prepared_async_call(
                        ((m * nrhs + 255) // 256, 1), (256, 1, 1), st0, np.int32(m),
                        np.int32(nrhs), self.d_t, np.int32(m), rows + nc * 4, self.d_x,
                        np.int32(n))
        for lev in range(len(self.schedule) - 1, -1, -1):
            small, large = self.schedule[lev]
            for s in large:
                first, nc, nr, p, rows = self._geometry(s)
                m = nr - nc
                if m:
                    self.k_gather_rows.prepared_async_call(
                        ((m * nrhs + 255) // 256, 1), (256, 1, 1), st0, np.int32(m),
                        np.int32(nrhs), rows + nc * 4, self.d_x, np.int32(n), self.d_t,
                        np.int32(m))
                    self.gemm(self.blas[0], 1, 0, nc, nrhs, m, minus, p + nc * item, nr,
                              int(self.d_t), m, one, x + first * item, n)
                self.trsm(self.blas[0], 0, 0, 1, 0, nc, nrhs, one, p, nr, x + first * item, n)
            if len(small):
                self.k_bwd_small.prepared_async_call(
                    (len(small), 1), (_SMALL_THREADS, 1, 1), st0, np.int32(len(small)),
                    self.d_levels[lev], self.d_starts, self.d_nrows, self.d_panel,
                    self.d_rows_off, self.d_rows, self.d_L, np.int32(nrhs), np.int32(n),
                    self.d_x)

    def _geometry(self, s):
        sym, item = self.sym, self.dtype.itemsize
        first = int(sym.starts[s])
        nc = int(sym.starts[s + 1]) - first
        nr = int(sym.nrows[s])
        p = int(self.d_L) + int(sym.panel_offset[s]) * item
        rows = int(self.d_rows) + int(sym.rows_offset[s]) * 4
        return first, nc, nr, p, rows

    def download_x(self, out_host):
        self.cuda.memcpy_dtoh_async(out_host, self.d_x, self.stream)
        self.stream.synchronize()

    def download_factor(self):
        """The value array on the host (tests)."""
        out = np.empty(self.n_values, dtype=self.dtype)
        self.stream.synchronize()
        self.cuda.memcpy_dtoh(out, self.d_L)
        return out

    def free(self):
        if getattr(self, "blas", None):
            for handle in self.blas:
                self.cublas_mod.destroy(handle)
            for handle in self.solver:
                self.cusolver_mod.destroy(handle)
            self.blas = self.solver = None
        for name in ("d_L", "d_values", "d_x", "d_t", "d_failed", "d_diag_out"):
            alloc = getattr(self, name, None)
            if alloc is not None:
                alloc.free()
                setattr(self, name, None)
        for alloc in self.keep + getattr(self, "d_chunk", []) + getattr(self, "d_info", []) \
                + getattr(self, "d_work", []):
            alloc.free()
        self.keep, self.d_chunk, self.d_info, self.d_work = [], [], [], []
