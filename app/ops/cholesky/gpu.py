"""GPU engine of the supernodal Cholesky: the factorization and solve on the rank's GPU.

It works on the plan of :mod:`.symbolic` (see :mod:`.cpu` for the value-array layout). The value
array lives on the GPU for the whole factorization; the plan's index arrays are uploaded once.
Supernodes are processed by etree level (bottom up): all *small* supernodes of a level go to one
batched kernel (one thread block each: dense factorization in shared memory, update, atomic
scatter-add into the ancestors), so launch latency does not grow with the number of supernodes;
every *large* supernode is split into column blocks of ``block_size`` and issued as potrf / trsm /
syrk / gemm block tasks over S streams, with CUDA events enforcing the dependencies (block k's
trsm before the updates of the blocks right of it; updates of a block stay on that block's
stream so they serialize), followed by the external update in row chunks (gemm into a per-stream
workspace + the scatter kernel). Dense BLAS/LAPACK comes from cuBLAS and cuSOLVER through
:class:`hisparse.gpu._blas.DenseHandles`, with handles created in the rank's primary context.
Every device buffer comes from the engine's arena, so the peak device bytes are recorded. No
MPI: the engine takes the plan, A's values and the right-hand sides, and returns the solution.
"""
import numpy as np

from ...errors import HisparseError
from ...gpu._blas import DenseHandles
from ...gpu._kernels import KernelTable, grid_1d, type_defines
from .._base import GpuEngine
from .cpu import NotPositiveDefinite, logdet_of_diagonal

#: The kernels of ``kernels_cu/cholesky.cu`` this engine launches (signatures derived from the
#: source).
KERNELS = KernelTable("cholesky", [
    "assemble", "factor_small", "scatter_update", "record_potrf_info", "gather_diag",
    "forward_small", "backward_small", "sub_rows", "gather_rows"])

#: Dynamic shared memory of the small-supernode kernel (48 KiB less room for static shared).
SMEM_BYTES = 48 * 1024 - 256
#: Threads per block of the batched small-supernode kernels.
_SMALL_THREADS = 128
#: Threads per block of the element-wise kernels.
_THREADS = 256
#: ``failed`` when every pivot is positive (``NO_FAILURE`` of ``kernels_cu/cholesky.cu``).
_NO_FAILURE = 0x7FFFFFFF


def load_kernels(ctx):
    """``kernels_cu/cholesky.cu`` compiled for this run's value type (row indices int32).

    Collective per node (the node-local compile cache): the operation calls it on every rank in
    setup, though only rank 0 factors, and hands the result to the engine.
    """
    return KERNELS.load(ctx, type_defines(ctx.value_dtype, np.int32, SMEM_BYTES=SMEM_BYTES))


class GpuFactorEngine(GpuEngine):
    """Supernodal factorization and solve on the rank's GPU.

    Parameters
    ----------
    ctx : EngineContext
        Its device's primary context must be current. ``gpu.streams`` sets the streams of the
        block tasks of large supernodes; the value type is the run's precision.
    local : CholeskyLocal
        ``sym`` (the :class:`~.symbolic.SymbolicFactor`) and ``kernels`` (from
        :func:`load_kernels`, loaded collectively by the operation).
    params : dict
        ``operation.params``: a supernode with ``ncols * nrows**2 <= small_work`` goes to the
        batched kernel.
    """

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="cholesky")
        import pycuda.driver as cuda
        self.cuda = cuda
        self.sym = sym = local.sym
        self.dtype = np.dtype(ctx.value_dtype)
        if sym.n >= 2 ** 31 - 1:
            raise HisparseError("cholesky: the GPU engine needs n < 2^31")
        self.kernels = local.kernels
        self.nstreams = max(1, int(ctx.config["gpu.streams"]))
        self.streams = [cuda.Stream() for _ in range(self.nstreams)]
        self.stream = self.streams[0]
        self.handles = None
        self._plan(params["small_work"])
        self._upload()
        self._handles()

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
        sym, arena = self.sym, self.arena

        def dev(array, what):
            return arena.to_device(array, what).gpudata

        self.d_starts = dev(sym.starts.astype(np.int64), "supernode starts")
        self.d_nrows = dev(sym.nrows.astype(np.int64), "supernode rows")
        self.d_panel = dev(sym.panel_offset.astype(np.int64), "panel offsets")
        self.d_below = dev(sym.below_offset.astype(np.int64), "below offsets")
        self.d_rows_off = dev(sym.rows_offset.astype(np.int64), "row-list offsets")
        self.d_rows = dev(sym.rows.astype(np.int32), "row lists")
        self.d_col_base = dev(sym.col_base, "update column bases")
        self.d_col_rel = dev(sym.col_rel, "update relative offsets")
        self.d_rel = dev(sym.rel.astype(np.int32), "relative indices")
        self.d_src = dev(sym.a_source.astype(np.int64), "assembly sources")
        self.d_dst = dev(sym.a_dest.astype(np.int64), "assembly destinations")
        self.d_diag = dev(sym.diag_pos.astype(np.int64), "diagonal positions")
        self.d_levels = [dev(ids, "level supernodes") if len(ids) else None
                         for ids, _ in self.schedule]
        self.n_values = int(sym.panel_offset[-1])
        self.d_L = self._buffer(self.n_values, self.dtype, "factor values")
        self.d_failed = self._buffer(1, np.int32, "failed pivot")
        self.d_diag_out = self._buffer(sym.n, self.dtype, "diagonal")
        self.d_chunk = [self._buffer(self.max_chunk, self.dtype, "update chunk")
                        for _ in range(self.nstreams)]
        self.d_info = [self._buffer(1, np.int32, "potrf info") for _ in range(self.nstreams)]
        self.d_work = []
        self.d_values = None
        self.x_dev = self.t_dev = None
        self.h_failed = self.cuda.pagelocked_empty(1, np.int32)
        self.h_diag = self.cuda.pagelocked_empty(sym.n, self.dtype)
        self.bytes_plan = int(sum(a.size for a in (sym.starts, sym.nrows, sym.panel_offset,
                                                   sym.below_offset, sym.rows_offset)) * 8
                              + sym.rows.size * 4 + (sym.col_base.size + sym.col_rel.size) * 8
                              + sym.rel.size * 4 + (sym.a_source.size + sym.a_dest.size) * 8)

    def _buffer(self, count, dtype, what):
        """Device memory for ``count`` values of ``dtype`` from the arena (its allocation)."""
        return self.arena.empty(count, dtype, what).gpudata

    def _handles(self):
        try:
            self.handles = DenseHandles(self.dtype, self.streams, "cholesky on the GPU")
        except HisparseError:
            if self.n_large:
                raise
            return  # only the batched kernels run: no cuBLAS/cuSOLVER needed
        handles = self.handles
        lda = int(max(self.sym.nrows.max(), 1))
        self.lwork = int(handles.potrf_buffer_size(handles.solver[0], 0, self.max_block,
                                                   int(self.d_L), lda))
        self.d_work = [self._buffer(max(self.lwork, 1), self.dtype, "potrf workspace")
                       for _ in range(self.nstreams)]

    # -- numeric factorization -------------------------------------------------------------
    def set_values(self, values, stream=None):
        """Upload A's CSR data (the h2d part of a refactorization)."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self.d_values is None:
            self.d_values = self._buffer(len(values), self.dtype, "matrix values")
            self.h_values = self.cuda.pagelocked_empty(len(values), self.dtype)
        self.h_values[:] = values
        self.cuda.memcpy_htod_async(self.d_values, self.h_values, stream or self.stream)

    def factor(self):
        """Assemble A into the panels and factor; returns log det A.

        Raises
        ------
        NotPositiveDefinite
        """
        cuda, sym, st0, kernels = self.cuda, self.sym, self.stream, self.kernels
        item = self.dtype.itemsize
        cuda.memset_d8_async(self.d_L, 0, self.n_values * item, st0)
        cuda.memset_d32_async(self.d_failed, _NO_FAILURE, 1, st0)
        nnz = len(sym.a_source)
        if nnz:
            kernels.assemble.prepared_async_call(grid_1d(nnz, _THREADS), (_THREADS, 1, 1), st0,
                                                 np.int64(nnz), self.d_values, self.d_src,
                                                 self.d_dst, self.d_L)
        for lev, (small, large) in enumerate(self.schedule):
            if len(small):
                kernels.factor_small.prepared_async_call(
                    (len(small), 1), (_SMALL_THREADS, 1, 1), st0, np.int32(len(small)),
                    self.d_levels[lev], self.d_starts, self.d_nrows, self.d_panel,
                    self.d_below, self.d_col_base, self.d_col_rel, self.d_rel, self.d_L,
                    self.d_failed, shared_size=SMEM_BYTES)
            for s in large:
                self._factor_large(s)
        if sym.n:
            kernels.gather_diag.prepared_async_call(grid_1d(sym.n, _THREADS), (_THREADS, 1, 1),
                                                    st0, np.int32(sym.n), self.d_diag, self.d_L,
                                                    self.d_diag_out)
            cuda.memcpy_dtoh_async(self.h_diag, self.d_diag_out, st0)
        cuda.memcpy_dtoh_async(self.h_failed, self.d_failed, st0)
        st0.synchronize()
        failed = int(self.h_failed[0])
        if failed != _NO_FAILURE:
            raise NotPositiveDefinite(sym.perm[failed], failed)
        return logdet_of_diagonal(self.h_diag)

    def _factor_large(self, s):
        """Block tasks of one large supernode over the streams, then its external update."""
        cuda, sym, handles = self.cuda, self.sym, self.handles
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
        one, minus = handles.alpha(1.0), handles.alpha(-1.0)
        for k in range(nblocks):
            q = k % S
            join(q)
            c0, c1 = blocks[k], blocks[k + 1]
            bk = c1 - c0
            # potrf of diagonal block k: its updates from blocks < k ran on this same stream
            handles.potrf(handles.solver[q], 0, bk, at(c0, c0), nr, int(self.d_work[q]),
                          self.lwork, int(self.d_info[q]))
            self.kernels.record_potrf_info.prepared_async_call(
                (1, 1), (1, 1, 1), streams[q], self.d_info[q], np.int32(first + c0),
                self.d_failed)
            if nr - c1 > 0:
                # trsm: L[c1:, block k] = A[c1:, block k] L_kk^{-T} (right, lower, transposed)
                handles.trsm(handles.blas[q], 1, 0, 1, 0, nr - c1, bk, one, at(c0, c0), nr,
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
                handles.syrk(handles.blas[qj], 0, 0, bj, bk, minus, at(d0, c0), nr, one,
                             at(d0, d0), nr)
                if nr - d1 > 0:
                    handles.gemm(handles.blas[qj], 0, 1, nr - d1, bj, bk, minus, at(d1, c0), nr,
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
            zero = handles.alpha(0.0)
            for c, r0 in enumerate(range(0, m, chunk)):
                q = c % S
                join(q)
                for q2, event in finished:
                    if q2 != q:
                        streams[q].wait_for_event(event)
                width = min(chunk, m - r0)
                height = m - r0
                handles.gemm(handles.blas[q], 0, 1, height, width, nc, one, at(nc + r0, 0), nr,
                             at(nc + r0, 0), nr, zero, int(self.d_chunk[q]), height)
                self.kernels.scatter_update.prepared_async_call(
                    grid_1d(height * width, _THREADS), (_THREADS, 1, 1), streams[q], np.int32(m),
                    np.int32(r0),
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
    def load(self, values, b):
        """The h2d part of a refactorization: A's CSR data, and the right-hand sides ``b``
        (n, nrhs; original numbering), permuted here and uploaded."""
        self.set_values(values)
        self.upload_rhs(b[self.sym.perm])

    def upload_rhs(self, rhs):
        """Upload permuted right-hand sides, shape (n, nrhs), through a pinned buffer."""
        n, nrhs = rhs.shape
        if self.x_dev is None or self.x_shape != (nrhs, n):
            self.arena.release(self.x_dev, self.t_dev)
            self.x_dev = self.arena.empty((nrhs, n), self.dtype, "right-hand sides")
            self.t_dev = self.arena.empty(self.max_below * nrhs, self.dtype, "solve workspace")
            self.d_x, self.d_t = self.x_dev.gpudata, self.t_dev.gpudata
            self.rhs_host = self.cuda.pagelocked_empty((nrhs, n), self.dtype)
            self.x_host = self.cuda.pagelocked_empty((nrhs, n), self.dtype)
            self.x_shape = (nrhs, n)
        self.rhs_host[:] = rhs.T
        self.cuda.memcpy_htod_async(self.d_x, self.rhs_host, self.stream)

    def solve(self):
        """L y = b then L^T x = y, in place on the uploaded right-hand sides (stream 0)."""
        st0, kernels, handles = self.stream, self.kernels, self.handles
        nrhs, n = self.x_shape
        item = self.dtype.itemsize
        x = int(self.d_x)
        if handles is not None:  # (only large supernodes use them) handle 0 is on stream 0
            blas = handles.blas[0]
            one, minus, zero = handles.alpha(1.0), handles.alpha(-1.0), handles.alpha(0.0)
        for lev, (small, large) in enumerate(self.schedule):
            if len(small):
                self._solve_small(kernels.forward_small, lev, len(small))
            for s in large:
                first, nc, nr, p, rows = self._geometry(s)
                handles.trsm(blas, 0, 0, 0, 0, nc, nrhs, one, p, nr, x + first * item, n)
                m = nr - nc
                if m:
                    handles.gemm(blas, 0, 0, m, nrhs, nc, one, p + nc * item, nr,
                                 x + first * item, n, zero, int(self.d_t), m)
                    kernels.sub_rows.prepared_async_call(
                        grid_1d(m * nrhs, _THREADS), (_THREADS, 1, 1), st0, np.int32(m),
                        np.int32(nrhs), self.d_t, np.int32(m), rows + nc * 4, self.d_x,
                        np.int32(n))
        for lev in range(len(self.schedule) - 1, -1, -1):
            small, large = self.schedule[lev]
            for s in large:
                first, nc, nr, p, rows = self._geometry(s)
                m = nr - nc
                if m:
                    kernels.gather_rows.prepared_async_call(
                        grid_1d(m * nrhs, _THREADS), (_THREADS, 1, 1), st0, np.int32(m),
                        np.int32(nrhs), rows + nc * 4, self.d_x, np.int32(n), self.d_t,
                        np.int32(m))
                    handles.gemm(blas, 1, 0, nc, nrhs, m, minus, p + nc * item, nr,
                                 int(self.d_t), m, one, x + first * item, n)
                handles.trsm(blas, 0, 0, 1, 0, nc, nrhs, one, p, nr, x + first * item, n)
            if len(small):
                self._solve_small(kernels.backward_small, lev, len(small))

    def _solve_small(self, kernel, lev, count):
        """One launch of ``forward_small`` or ``backward_small`` (the same arguments) over the
        ``count`` small supernodes of level ``lev``, on stream 0."""
        nrhs, n = self.x_shape
        kernel.prepared_async_call(
            (count, 1), (_SMALL_THREADS, 1, 1), self.stream, np.int32(count),
            self.d_levels[lev], self.d_starts, self.d_nrows, self.d_panel, self.d_rows_off,
            self.d_rows, self.d_L, np.int32(nrhs), np.int32(n), self.d_x)

    def _geometry(self, s):
        sym, item = self.sym, self.dtype.itemsize
        first = int(sym.starts[s])
        nc = int(sym.starts[s + 1]) - first
        nr = int(sym.nrows[s])
        p = int(self.d_L) + int(sym.panel_offset[s]) * item
        rows = int(self.d_rows) + int(sym.rows_offset[s]) * 4
        return first, nc, nr, p, rows

    def solution(self):
        """The d2h part: the solution, shape (n, nrhs), permuted numbering (row j is original
        row perm[j]); a view of a pinned buffer that the next repetition overwrites."""
        self.cuda.memcpy_dtoh_async(self.x_host, self.d_x, self.stream)
        self.stream.synchronize()
        return self.x_host.T

    def factor_values(self):
        """The factor's value array on the host (tests)."""
        out = np.empty(self.n_values, dtype=self.dtype)
        self.stream.synchronize()
        self.cuda.memcpy_dtoh(out, self.d_L)
        return out

    def free(self):
        """Destroy the cuBLAS/cuSOLVER handles and give every device buffer back."""
        if self.handles is not None:
            self.handles.destroy()
            self.handles = None
        super().free()


ENGINES = {None: GpuFactorEngine}
