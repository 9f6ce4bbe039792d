"""GPU engine of the supernodal Cholesky: the factorization and solve on the rank's GPU.

It works on the plan of :mod:`.symbolic` (see :mod:`.cpu` for the value-array layout). The value
array lives on the GPU for the whole factorization and stays there for the solves; the plan's
index arrays are uploaded once.

**Chunks and levels.** Every supernode is cut into column chunks of at most :data:`CHUNK` (64)
columns (:func:`.schedule.chunk_plan`). A chunk depends on the previous chunk of its supernode and on
the last chunk of every child supernode, so chunks get levels: the chain of a supernode starts
one level above the highest end of its children's chains. Chunks of one level are independent;
each kernel launch covers one whole level, whatever the number of supernodes in it, so the
launch count follows the height of the chunked elimination tree, not the number of supernodes
(the circuit-like matrices have tens of thousands of small supernodes but only a few dozen
levels).

**Numeric factorization.** Per level, two launches over all its chunks: ``factor_panels`` (one
block per 256 below rows of a chunk: the chunk's 64 x 64 diagonal block factored in shared memory,
its below rows solved in registers) and ``update_tiles`` (one block per 32 x 32 tile of every
chunk's update L21 L21^T, subtracted with atomics from the supernode's later columns or, through
the relative indices, from its ancestors). The few *large* supernodes (``ncols * nrows**2 >
small_work``: the top separators, where dense BLAS pays) take one level slot each and are
factored by cuSOLVER/cuBLAS block tasks over S streams with CUDA events (block k's trsm before
the updates of the blocks right of it; updates of a block stay on that block's stream), then
their external update in row chunks (gemm into a per-stream workspace + ``scatter_update``).
Dense BLAS/LAPACK comes from :class:`hisparse.gpu._blas.DenseHandles`.

**Solve.** Forward substitution bottom-up and backward top-down over the chunks of every
supernode (large ones too), all right-hand sides at once; the factor stays resident. Default
(``solve_schedule: flow``): one launch per direction (``solve_forward_flow``,
``solve_backward_flow``) over the task list of :func:`.schedule.flow_tasks`; blocks take tasks from a
ticket counter in dependency order and wait on per-chunk counters, and the many leaf chunks (at
most 32 columns and 32 below rows) go up to 8 to a block, one warp each. ``levels``: one launch
per chunk level and direction (``solve_forward``, ``solve_backward``). Iterative refinement
(composed by the operation): ``residual`` (r = b - A x in fp64 from A's resident CSR values, and
the componentwise backward error, one 8-byte copy to the host) and ``correct`` (the same
substitution on r, then x += d), each one CUDA graph.

Every device buffer comes from the engine's arena, so the peak device bytes are recorded. No
MPI: the engine takes the plan, A's values and the right-hand sides, and returns the solution.
"""
import numpy as np

from ...errors import HisparseError
from ...gpu import DenseHandles
from ...gpu import GraphCache
from ...gpu import KernelTable, grid_1d, type_defines
from ...threads import copy_into, take_into
from .. import GpuEngine
from .cpu import NotPositiveDefinite, logdet_of_diagonal
from .rank_plan import local_symbolic
from .schedule import (CHUNK, CHUNK_THREADS, chunk_plan, flow_tasks, level_lists, owned_runs,
                       panel_blocks, subtree_flow_tasks, subtree_solve_lists, tile_blocks,
                       top_chunks)

#: The kernels of ``kernels_cu/cholesky.cu`` this engine launches (signatures derived from the
#: source).
KERNELS = KernelTable("cholesky", [
    "assemble", "factor_panels", "update_tiles", "scatter_update", "record_potrf_info",
    "gather_diag", "solve_forward", "solve_backward", "solve_forward_flow",
    "solve_backward_flow", "residual", "add_correction"])

#: Threads per block of the element-wise kernels.
_THREADS = 256
#: ``failed`` when every pivot is positive (``NO_FAILURE`` of ``kernels_cu/cholesky.cu``).
_NO_FAILURE = 0x7FFFFFFF


def load_kernels(ctx):
    """``kernels_cu/cholesky.cu`` compiled for this run's value type (row indices int32).

    Collective per node (the node-local compile cache): the operation calls it on every rank in
    setup, though only rank 0 factors, and hands the result to the engine.
    """
    return KERNELS.load(ctx, type_defines(ctx.value_dtype, np.int32, CHUNK=CHUNK))


class GpuFactorEngine(GpuEngine):
    """Supernodal factorization and solve on the rank's GPU.

    Parameters
    ----------
    ctx : EngineContext
        Its device's primary context must be current. ``gpu.streams`` sets the streams of the
        block tasks of large supernodes; the value type is the run's precision.
    local : CholeskyLocal
        ``sym`` (the :class:`~.factor.SymbolicFactor`), ``kernels`` (from
        :func:`load_kernels`, loaded collectively by the operation) and ``matrix`` (A's
        pattern, uploaded for the refinement's residual; None: no refinement).
    params : dict
        ``operation.params``: a supernode with ``ncols * nrows**2 <= small_work`` is factored
        by the chunk kernels, a larger one by block tasks.
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
        self.matrix = local.matrix
        self.nstreams = max(1, int(ctx.config["gpu.streams"]))
        self.streams = [cuda.Stream() for _ in range(self.nstreams)]
        self.stream = self.streams[0]
        self.handles = None
        # The run-wide switch (gpu.graphs) and the operation's own (cuda_graphs) must both allow
        # graphs.
        self.use_graphs = bool(params.get("cuda_graphs", True)) and bool(ctx.config["gpu.graphs"])
        self.graphs = GraphCache(lambda line: ctx.log(f"cholesky: {line}"))
        # keys: "factor", ("solve", shape), ...
        # "flow": one launch per solve direction (FlowTasks); "levels": one per chunk level
        self.solve_schedule = params.get("solve_schedule", "flow")
        self._plan(params["small_work"])
        self._upload()
        self._handles()

    # -- plan ------------------------------------------------------------------------------
    def _chained(self, small_work):
        """Which supernodes the chunk kernels factor (the others: block tasks)."""
        sym = self.sym
        work = np.diff(sym.starts).astype(np.float64) * sym.nrows.astype(np.float64) ** 2
        return work <= small_work

    def _plan(self, small_work):
        sym = self.sym
        ncols = np.diff(sym.starts)
        chained = self._chained(small_work)
        self.factor_plan = plan = chunk_plan(sym, chained)
        ids = np.arange(len(plan.sup), dtype=np.int64)
        self.panel_lists = level_lists(ids, plan.level, panel_blocks(plan.below), plan.n_levels)
        updating = plan.below > 0
        self.tile_lists = level_lists(ids[updating], plan.level[updating],
                                      tile_blocks(plan.below[updating]), plan.n_levels)
        self.large_at = [[] for _ in range(plan.n_levels)]
        for s, lev in zip(plan.large.tolist(), plan.large_level.tolist()):
            self.large_at[lev].append(s)
        self.solve_plan = splan = chunk_plan(sym, np.ones(sym.nsuper, dtype=bool))
        self.solve_lists = level_lists(np.arange(len(splan.sup), dtype=np.int64), splan.level,
                                       panel_blocks(splan.below), splan.n_levels)
        self.flow = self._flow_tasks(splan) if self.solve_schedule == "flow" else None
        self.large = plan.large
        self.n_small, self.n_large = int(chained.sum()), len(self.large)
        bs = sym.block_size
        self.max_block = int(min(bs, ncols[self.large].max())) if self.n_large else 1
        below = sym.nrows - ncols
        self.max_chunk = int(max([below[s] * min(bs, below[s]) for s in self.large] + [1]))

    def _flow_tasks(self, splan):
        """The dataflow solve's task list: every chunk of the solve plan."""
        return flow_tasks(self.sym, splan)

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
        # A's pattern for the refinement's residual: row k of P A P^T is row perm[k] of A (its
        # CSR data is what set_values uploads), its columns renumbered here once.
        self.refinable = self.matrix is not None
        if self.refinable:
            pattern = self.matrix
            self.d_perm = dev(sym.perm.astype(np.int32), "refinement row order")
            self.d_a_ptr = dev(pattern.indptr.astype(np.int64), "refinement row pointers")
            self.d_a_cols = dev(sym.iperm[pattern.indices].astype(np.int32),
                                "refinement columns")
            self.d_error = self._buffer(1, np.uint64, "refinement backward error")
            self.h_error = self.cuda.pagelocked_empty(1, np.uint64)
        plan_arrays = []

        def chunks_on_device(plan, what):
            arrays = [plan.sup, plan.c0, plan.width]
            plan_arrays.extend(arrays)
            return tuple(dev(a, what) for a in arrays) + (
                arena.zeros(max(len(plan.sup), 1), np.int32, what + " tickets").gpudata,)

        def lists_on_device(lists, what):
            plan_arrays.extend([lists.chunks, lists.prefix])
            chunks, prefix = dev(lists.chunks, what), dev(lists.prefix, what + " prefix")
            return [(lists.count(lev), int(chunks) + int(lists.begin[lev]) * 4,
                     int(prefix) + int(lists.prefix_at[lev]) * 8, int(lists.grid[lev]))
                    if lists.count(lev) else None for lev in range(len(lists.grid))]

        self.d_factor_chunks = chunks_on_device(self.factor_plan, "factor chunks")
        self.panel_launches = lists_on_device(self.panel_lists, "panel tasks")
        self.tile_launches = lists_on_device(self.tile_lists, "update tiles")
        self.d_solve_chunks = chunks_on_device(self.solve_plan, "solve chunks")
        self.solve_launches = lists_on_device(self.solve_lists, "solve tasks")
        if self.flow is not None:
            flow = self.flow
            # the flow kernels' FLOW_TASK_PARAMS (kernels_cu/cholesky.cu), in its order
            arrays = [flow.task_unit, flow.unit_chunk, flow.unit_part, flow.target_ptr,
                      flow.target_chunk, flow.expected]
            plan_arrays.extend(arrays)
            self.d_flow = tuple(dev(a, "dataflow solve tasks") for a in arrays)
            # zeroed before every solve: 2 tickets, then arrived, contributed, solved per chunk
            self.sync_count = 2 + 3 * len(self.solve_plan.sup)
            self.d_sync = self._buffer(self.sync_count, np.int32, "dataflow solve counters")
        self.n_values = int(sym.panel_offset[-1])
        self.d_L = self._buffer(self.n_values, self.dtype, "factor values")
        self.d_failed = self._buffer(1, np.int32, "failed pivot")
        self.d_diag_out = self._buffer(sym.n, self.dtype, "diagonal")
        self.d_chunk = [self._buffer(self.max_chunk, self.dtype, "update chunk")
                        for _ in range(self.nstreams)] if self.n_large else []
        self.d_info = [self._buffer(1, np.int32, "potrf info") for _ in range(self.nstreams)]
        self.d_work = []
        self.d_values = None
        self.x_dev = self.w_dev = self.y_dev = self.c_dev = None
        self.h_failed = self.cuda.pagelocked_empty(1, np.int32)
        self.h_diag = self.cuda.pagelocked_empty(sym.n, self.dtype)
        self.bytes_plan = int(sum(a.size for a in (sym.starts, sym.nrows, sym.panel_offset,
                                                   sym.below_offset, sym.rows_offset)) * 8
                              + sym.rows.size * 4 + (sym.col_base.size + sym.col_rel.size) * 8
                              + sym.rel.size * 4 + (sym.a_source.size + sym.a_dest.size) * 8
                              + sum(a.nbytes for a in plan_arrays))

    def _buffer(self, count, dtype, what):
        """Device memory for ``count`` values of ``dtype`` from the arena (its allocation)."""
        return self.arena.empty(count, dtype, what).gpudata

    def _handles(self):
        if not self.n_large:
            return  # only the chunk kernels run: no cuBLAS/cuSOLVER needed
        self.handles = handles = DenseHandles(self.dtype, self.streams, "cholesky on the GPU")
        lda = int(max(self.sym.nrows.max(), 1))
        self.lwork = int(handles.potrf_buffer_size(handles.solver[0], 0, self.max_block,
                                                   int(self.d_L), lda))
        self.d_work = [self._buffer(max(self.lwork, 1), self.dtype, "potrf workspace")
                       for _ in range(self.nstreams)]

    @property
    def chunk_levels(self):
        """Levels of the factorization and of the solve (launches per direction)."""
        return self.factor_plan.n_levels, self.solve_plan.n_levels

    # -- numeric factorization -------------------------------------------------------------
    def set_values(self, values, stream=None):
        """Upload A's CSR data (the h2d part of a refactorization)."""
        values = np.asarray(values)
        if self.d_values is None:
            self.d_values = self._buffer(len(values), self.dtype, "matrix values")
            self.h_values = self.cuda.pagelocked_empty(len(values), self.dtype)
        copy_into(self.h_values, values)  # (and to the run's precision) on the host's threads
        self.cuda.memcpy_htod_async(self.d_values, self.h_values, stream or self.stream)

    def factor(self):
        """Assemble A into the panels and factor; returns log det A.

        Raises
        ------
        NotPositiveDefinite
        """
        self._run("factor", self._enqueue_factor)
        self.stream.synchronize()
        failed = int(self.h_failed[0])
        if failed != _NO_FAILURE:
            raise NotPositiveDefinite(self.sym.perm[failed], failed)
        return logdet_of_diagonal(self.h_diag)

    def _run(self, key, enqueue):
        """Issue ``enqueue``'s work on stream 0: replay its CUDA graph (captured at the first
        call), or issue it directly when that work is not captured or its capture failed."""
        if self._capturable(key):
            self.graphs.run(key, self.stream, enqueue, f"cholesky {key}")
        else:
            enqueue()

    def _capturable(self, key):
        """Whether ``key``'s work is captured. Not the factorization when it has large
        supernodes: their cuBLAS/cuSOLVER calls touch the legacy stream during a capture
        (cudaErrorStreamCaptureImplicit on the H100), so that work always launches directly."""
        if not self.use_graphs:
            return False
        return not (key == "factor" and self.n_large)

    @property
    def graph_error(self):
        """Why a recording failed ("" when none did)."""
        return self.graphs.error

    @property
    def graphed(self):
        """What runs as CUDA graphs: "factor", "solve", both ("factor+solve") or ""."""
        names = {key if isinstance(key, str) else key[0] for key in self.graphs.graphs}
        return "+".join(sorted(names))

    def _enqueue_factor(self):
        """The factorization's work on the streams (everything joins stream 0 at the end)."""
        cuda, sym, st0, kernels = self.cuda, self.sym, self.stream, self.kernels
        item = self.dtype.itemsize
        cuda.memset_d8_async(self.d_L, 0, self.n_values * item, st0)
        cuda.memset_d32_async(self.d_failed, _NO_FAILURE, 1, st0)
        nnz = len(sym.a_source)
        if nnz:
            kernels.assemble.prepared_async_call(grid_1d(nnz, _THREADS), (_THREADS, 1, 1), st0,
                                                 np.int64(nnz), self.d_values, self.d_src,
                                                 self.d_dst, self.d_L)
        sup, c0, width, tickets = self.d_factor_chunks
        # the kernels' CHUNK_TABLE_PARAMS (kernels_cu/cholesky.cu), in its order
        geometry = (sup, c0, width, self.d_starts, self.d_nrows, self.d_panel, self.d_rows_off)
        block = (CHUNK_THREADS, 1, 1)
        for lev in range(self.factor_plan.n_levels):
            panels = self.panel_launches[lev]
            if panels is not None:
                count, chunks, prefix, grid = panels
                kernels.factor_panels.prepared_async_call(
                    (grid, 1), block, st0, np.int32(count), chunks, prefix, *geometry, tickets,
                    self.d_L, self.d_failed)
            tiles = self.tile_launches[lev]
            if tiles is not None:
                count, chunks, prefix, grid = tiles
                kernels.update_tiles.prepared_async_call(
                    (grid, 1), block, st0, np.int32(count), chunks, prefix, *geometry,
                    self.d_below, self.d_col_base, self.d_col_rel, self.d_rel, self.d_L)
            for s in self.large_at[lev]:
                self._factor_large(s)
        if sym.n:
            kernels.gather_diag.prepared_async_call(grid_1d(sym.n, _THREADS), (_THREADS, 1, 1),
                                                    st0, np.int32(sym.n), self.d_diag, self.d_L,
                                                    self.d_diag_out)
            cuda.memcpy_dtoh_async(self.h_diag, self.d_diag_out, st0)
        cuda.memcpy_dtoh_async(self.h_failed, self.d_failed, st0)

    def _factor_large(self, s, factor=True, rows=None):
        """Block tasks of one large supernode over the streams (``factor``), then its external
        update: all of it, or with ``rows`` = (r0, r1) its below rows r0..r1-1 only (one
        ancestor's, :func:`~.rank_plan.update_groups`)."""
        cuda, sym, streams = self.cuda, self.sym, self.streams
        # Every stream starts after what stream 0 has issued so far (earlier supernodes).
        start = cuda.Event()
        start.record(streams[0])
        waiting = set()

        def join(q):
            if q and q not in waiting:
                streams[q].wait_for_event(start)
                waiting.add(q)

        at = self._panel_address(s)
        if factor:
            self._large_blocks(s, at, join)
        touched = {0} | waiting
        r0, r1 = (0, int(sym.nrows[s] - (sym.starts[s + 1] - sym.starts[s]))) \
            if rows is None else rows
        if r1 > r0:
            self._large_update(s, at, join, touched, r0, r1)
            touched |= waiting
        # Stream 0 waits for every stream: the next supernode depends on this one.
        for q in sorted(touched):
            if q:
                event = cuda.Event()
                event.record(streams[q])
                streams[0].wait_for_event(event)

    def _panel_address(self, s):
        """``at(row, col)``: the device address of entry (row, col) of supernode ``s``'s panel."""
        item = self.dtype.itemsize
        nr = int(self.sym.nrows[s])
        base = int(self.d_L) + int(self.sym.panel_offset[s]) * item

        def at(row, col):
            return base + (row + col * nr) * item

        return at

    def _large_blocks(self, s, at, join):
        """potrf and trsm of every column block of large supernode ``s``, each block's syrk and
        gemm updates of the blocks right of it, over the streams (``join(q)`` before stream q's
        first task)."""
        sym, handles, streams, S = self.sym, self.handles, self.streams, self.nstreams
        first = int(sym.starts[s])
        nr = int(sym.nrows[s])
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
            done = self.cuda.Event()
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

    def _large_update(self, s, at, join, touched, r0, r1):
        """External update (modify) of large supernode ``s``, columns ``r0..r1-1`` of C = L21
        L21^T in chunks of columns, scattered into its ancestors, each chunk after every stream
        in ``touched``."""
        sym, handles, streams, S = self.sym, self.handles, self.streams, self.nstreams
        nc = int(sym.starts[s + 1] - sym.starts[s])
        nr = int(sym.nrows[s])
        m = nr - nc
        one = handles.alpha(1.0)
        finished = []
        for q in sorted(touched):
            event = self.cuda.Event()
            event.record(streams[q])
            finished.append((q, event))
        chunk = sym.block_size
        b0 = int(sym.below_offset[s])
        zero = handles.alpha(0.0)
        for c, c0 in enumerate(range(r0, r1, chunk)):
            q = c % S
            join(q)
            for q2, event in finished:
                if q2 != q:
                    streams[q].wait_for_event(event)
            width = min(chunk, r1 - c0)
            height = m - c0
            handles.gemm(handles.blas[q], 0, 1, height, width, nc, one, at(nc + c0, 0), nr,
                         at(nc + c0, 0), nr, zero, int(self.d_chunk[q]), height)
            self.kernels.scatter_update.prepared_async_call(
                grid_1d(height * width, _THREADS), (_THREADS, 1, 1), streams[q], np.int32(m),
                np.int32(c0), np.int32(width), self.d_chunk[q], np.int32(height),
                int(self.d_col_base) + b0 * 8, int(self.d_col_rel) + b0 * 8, self.d_rel,
                self.d_L)

    # -- solve -----------------------------------------------------------------------------
    def load(self, values, b):
        """The h2d part of a refactorization: A's CSR data, and the right-hand sides ``b``
        (n, nrhs; original numbering), permuted here and uploaded."""
        self.set_values(values)
        self.upload_rhs(b, self.sym.perm)

    def upload_rhs(self, rhs, perm=None):
        """Upload right-hand sides, shape (n, nrhs), through a pinned buffer: ``rhs`` as it is
        (permuted numbering), or its rows ``perm`` (new-to-old) when given."""
        n, nrhs = rhs.shape
        self._rhs_buffers(nrhs, n)
        for column in range(nrhs):  # gathered and transposed on the host's threads
            if perm is None:
                copy_into(self.rhs_host[column], rhs[:, column])
            else:
                take_into(self.rhs_host[column], rhs[:, column], perm)
        self.cuda.memcpy_htod_async(self.d_x, self.rhs_host, self.stream)

    def _rhs_buffers(self, nrhs, n):
        """The device and page-locked buffers of ``nrhs`` right-hand sides of ``n`` rows (made
        again when the shape changes); True when they were made now."""
        if self.x_dev is None or self.x_shape != (nrhs, n):
            self.arena.release(self.x_dev, self.w_dev, self.y_dev, self.c_dev)
            self.graphs.drop(keep=lambda key: key == "factor")
            # b (kept), the accumulating copy the forward pass consumes (the residual, when
            # refining), the solution and the refinement's correction
            self.x_dev = self.arena.empty((nrhs, n), self.dtype, "right-hand sides")
            self.w_dev = self.arena.empty((nrhs, n), self.dtype, "solve workspace")
            self.y_dev = self.arena.empty((nrhs, n), self.dtype, "solution")
            self.c_dev = self.arena.empty((nrhs, n), self.dtype, "refinement correction") \
                if self.refinable else None
            self.d_x, self.d_w, self.d_y = self.x_dev.gpudata, self.w_dev.gpudata, \
                self.y_dev.gpudata
            self.rhs_host = self.cuda.pagelocked_empty((nrhs, n), self.dtype)
            self.x_host = self.cuda.pagelocked_empty((nrhs, n), self.dtype)
            self.x_shape = (nrhs, n)
            return True
        return False

    def solve(self):
        """L y = b then L^T x = y over the chunk levels (stream 0); b stays as uploaded."""
        self._run(("solve", self.x_shape), self._enqueue_solve)

    def _enqueue_solve(self):
        nrhs, n = self.x_shape
        self.cuda.memcpy_dtod_async(self.d_w, self.d_x, nrhs * n * self.dtype.itemsize,
                                    self.stream)
        self._enqueue_substitution(self.d_w, self.d_y)

    # -- iterative refinement (composed by the operation: see refinement.refine) ----------
    def residual(self):
        """r = b - A x of the current solution into the solve workspace, and its componentwise
        backward error (on its way to the host; :meth:`backward_error` reads it)."""
        if not self.refinable:
            raise HisparseError("cholesky: refinement needs the matrix's pattern (local.matrix)")
        self._run(("residual", self.x_shape), self._enqueue_residual)

    def _enqueue_residual(self):
        nrhs, n = self.x_shape
        self.cuda.memset_d32_async(self.d_error, 0, 2, self.stream)
        self.kernels.residual.prepared_async_call(
            grid_1d(n, _THREADS), (_THREADS, 1, 1), self.stream, np.int32(n), np.int32(nrhs),
            self.d_perm, self.d_a_ptr, self.d_a_cols, self.d_values, self.d_x, self.d_y,
            self.d_w, self.d_error)
        self.cuda.memcpy_dtoh_async(self.h_error, self.d_error, self.stream)

    def backward_error(self):
        """The backward error measured by the last :meth:`residual` (waits for it)."""
        self.stream.synchronize()
        return float(self.h_error.view(np.float64)[0])

    def correct(self):
        """Solve A d = r (r from :meth:`residual`) and add d to the solution."""
        self._run(("correct", self.x_shape), self._enqueue_correct)

    def _enqueue_correct(self):
        nrhs, n = self.x_shape
        count = nrhs * n
        self._enqueue_substitution(self.d_w, self.c_dev.gpudata)
        self._add(count, self.c_dev.gpudata, self.d_y)

    def _add(self, count, source, target):
        """target[:count] += source[:count] on stream 0 (device addresses of ``dtype``
        values)."""
        self.kernels.add_correction.prepared_async_call(
            grid_1d(count, _THREADS), (_THREADS, 1, 1), self.stream, np.int64(count), source,
            target)

    def _enqueue_substitution(self, rhs, out):
        """out = (L L^T)^{-1} rhs on stream 0; ``rhs`` is consumed (the forward pass
        accumulates into it)."""
        st0, kernels = self.stream, self.kernels
        tickets = self.d_solve_chunks[3]
        geometry = self._geometry()
        block = (CHUNK_THREADS, 1, 1)
        if self.flow is not None:
            self.cuda.memset_d32_async(self.d_sync, 0, self.sync_count, st0)
            self._flow_pass(True, rhs, out)
            self._flow_pass(False, None, out)
            return
        launches = [x for x in self.solve_launches if x is not None]
        for count, chunks, prefix, grid in launches:
            kernels.solve_forward.prepared_async_call(
                (grid, 1), block, st0, np.int32(count), chunks, prefix, *geometry, rhs, out)
        for count, chunks, prefix, grid in reversed(launches):
            kernels.solve_backward.prepared_async_call(
                (grid, 1), block, st0, np.int32(count), chunks, prefix, *geometry, out,
                tickets)

    def _geometry(self):
        """CHUNK_TABLE_PARAMS (kernels_cu/cholesky.cu) of the solve's chunks in its order, then
        the solve kernels' next arguments."""
        nrhs, n = self.x_shape
        sup, c0, width, _ = self.d_solve_chunks
        return (sup, c0, width, self.d_starts, self.d_nrows, self.d_panel, self.d_rows_off,
                self.d_rows, self.d_L, np.int32(nrhs), np.int32(n))

    def _flow_pass(self, forward, rhs, out):
        """One dataflow pass of :attr:`flow`'s tasks on stream 0: forward, L y = ``rhs`` (the
        sums accumulate in it) into ``out``; backward, L^T x = y in ``out``. The counters
        (``d_sync``) must hold what the pass waits on: zero, and a chunk the pass does not
        solve but waits for marked solved."""
        ntasks, nchunks = self.flow.ntasks, len(self.solve_plan.sup)
        if not ntasks:
            return
        tasks = (np.int32(ntasks),) + self.d_flow + self._geometry()
        block = (CHUNK_THREADS, 1, 1)
        if forward:
            self.kernels.solve_forward_flow.prepared_async_call(
                (ntasks, 1), block, self.stream, *tasks, rhs, out, self.d_sync,
                np.int32(nchunks))
        else:
            self.kernels.solve_backward_flow.prepared_async_call(
                (ntasks, 1), block, self.stream, *tasks, out, self.d_sync, np.int32(nchunks))

    def solution(self):
        """The d2h part: the solution, shape (n, nrhs), permuted numbering (row j is original
        row perm[j]); a view of a pinned buffer that the next repetition overwrites."""
        self.cuda.memcpy_dtoh_async(self.x_host, self.d_y, self.stream)
        self.stream.synchronize()
        return self.x_host.T

    def factor_values(self):
        """The factor's value array on the host (tests)."""
        out = np.empty(self.n_values, dtype=self.dtype)
        self.stream.synchronize()
        self.cuda.memcpy_dtoh(out, self.d_L)
        return out

    def free(self):
        """Destroy the graphs and the cuBLAS/cuSOLVER handles, give every device buffer back."""
        self.graphs.free()
        if self.handles is not None:
            self.handles.destroy()
            self.handles = None
        super().free()


class GpuSubtreeEngine(GpuFactorEngine):
    """One rank's share under ``partition.strategy: subtree`` on its GPU: the rank's held
    supernodes as a plan of their own (:func:`~.rank_plan.local_symbolic`), its subtrees
    factored by the engine's chunk kernels and block tasks (the top supernodes left out), then
    each top supernode it owns by block tasks once the other ranks' update blocks are added.
    The blocks go through page-locked host buffers, made once (the operation moves them with
    MPI). The solve runs on the device too: the rank's subtrees by one dataflow launch per
    direction over their chunks (``solve_schedule: flow``, :meth:`_flow_tasks`; ``levels``:
    one launch per chunk level), each top supernode one launch per chunk of it
    (``solve_forward`` / ``solve_backward``), its solve blocks (the partial sums of the
    forward pass, the solved rows of the backward one) through the host.

    Parameters
    ----------
    local : CholeskyLocal
        ``plan`` (this rank's :class:`~.rank_plan.LocalPlan`), ``kernels`` and ``runs`` (the runs
        of top supernodes it holds, ``(i0, i1, owner, holders)``, for its block buffers).
    """

    def __init__(self, ctx, local, params):
        import types
        self.plan = local.plan
        self.rank = int(local.plan.rank)
        self.top_ids = sorted(int(i) for i in local.plan.top if i >= 0)
        sym = local_symbolic(local.plan, params["block_size"])
        super().__init__(ctx, types.SimpleNamespace(sym=sym, kernels=local.kernels,
                                                    matrix=None), params)
        self.owned_local = np.searchsorted(sym.perm, local.plan.owned_columns)
        self.owned_runs = owned_runs(self.owned_local)
        runs = list(getattr(local, "runs", None) or [])
        ids = np.array(self.top_ids, dtype=np.int64)
        if not runs and len(ids):  # without the operation's runs: every consecutive stretch
            runs = [(int(r[0]), int(r[-1]), -1, None)
                    for r in np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1)]
        sizes = [int(self.sym.panel_offset[i1 + 1] - self.sym.panel_offset[i0])
                 for i0, i1, _, _ in runs]
        # Staged through the host: a received block covers one run the rank owns, room for the
        # longest on the device and the host; every run sent gets a page-locked buffer of its
        # own (the sends overlap). Read through CUDA IPC (local.staged false) none is needed:
        # on the 120^3 Laplacian they were a 1.66 GB device block and gigabytes of page-locked
        # memory per rank, made in the upload.
        self.received_size = max([size for (_, _, owner, _), size in zip(runs, sizes)
                                  if owner in (self.rank, -1)] + [1])
        self.d_block = self.h_received = None
        self.h_sent = {}
        if getattr(local, "staged", True):
            self._staging_buffers()
            self.h_sent = {(i0, i1): self.cuda.pagelocked_empty(size, self.dtype)
                           for (i0, i1, owner, _), size in zip(runs, sizes)
                           if owner != self.rank}
        solve_runs = list(getattr(local, "solve_runs", None) or runs)
        self.max_run_cols = max([int(self.sym.starts[i1 + 1] - self.sym.starts[i0])
                                 for i0, i1, _, _ in solve_runs] + [1])
        self._solve_lists()
        self.d_solve_block = None
        self._local_events = []  # (start, end) of the subtrees' solve passes not yet taken

    def _staging_buffers(self):
        """The device and page-locked host buffers a received block is staged in (made once)."""
        if self.d_block is None:
            self.d_block = self._buffer(self.received_size, self.dtype, "received update block")
            self.h_received = self.cuda.pagelocked_empty(self.received_size, self.dtype)

    def _chained(self, small_work):
        chained = super()._chained(small_work)
        chained[self.top_ids] = False  # block tasks, one supernode at a time, after the exchange
        return chained

    def _plan(self, small_work):
        super()._plan(small_work)
        tops = set(self.top_ids)
        self.large_at = [[s for s in level if s not in tops] for level in self.large_at]

    def _flow_tasks(self, splan):
        """The dataflow solve's task list over the rank's subtrees (:func:`subtree_flow_tasks`)."""
        return subtree_flow_tasks(self.sym, splan, self.top_ids)

    def _solve_lists(self):
        """The solve's launches on the device (:func:`subtree_solve_lists`); with the dataflow
        solve, what the backward pass over the subtrees finds in the counters of the top
        chunks: solved (their own launches solved them before it starts)."""
        local, tops = subtree_solve_lists(self.solve_plan, self.top_ids)
        self.local_launches = self._launches(local, "local solve tasks")
        self.top_launches = {i: self._launches(lists, "top solve tasks")
                             for i, lists in tops.items()}
        if self.flow is not None:
            self.d_tops_solved = self.arena.to_device(
                top_chunks(self.solve_plan, self.top_ids).astype(np.int32),
                "top chunks solved").gpudata

    def _launches(self, lists, what):
        """(count, chunk list, prefix, grid) of every nonempty level of ``lists``, on the
        device."""
        if not len(lists.chunks):
            return []
        chunks = self.arena.to_device(lists.chunks, what).gpudata
        prefix = self.arena.to_device(lists.prefix, what + " prefix").gpudata
        return [(lists.count(lev), int(chunks) + int(lists.begin[lev]) * 4,
                 int(prefix) + int(lists.prefix_at[lev]) * 8, int(lists.grid[lev]))
                for lev in range(len(lists.grid)) if lists.count(lev)]

    def load(self, values):
        """This rank's entries of A (uploaded)."""
        self.set_values(values)

    def _failed(self):
        self.cuda.memcpy_dtoh_async(self.h_failed, self.d_failed, self.stream)
        self.stream.synchronize()
        failed = int(self.h_failed[0])
        return -1 if failed == _NO_FAILURE else int(self.sym.perm[failed])

    def factor_local(self):
        """Assemble and factor the rank's subtrees; the first failing permuted (global) column,
        or -1."""
        self._enqueue_factor()
        return self._failed()

    def _panel_range(self, i0, i1):
        return int(self.sym.panel_offset[i0]), int(self.sym.panel_offset[i1 + 1])

    def update_block(self, i0, i1):
        """The panels of held supernodes ``i0..i1`` (this rank's updates to them), copied to
        the run's page-locked host buffer (kept until the next factorization)."""
        lo, hi = self._panel_range(i0, i1)
        out = self.h_sent.get((i0, i1))
        if out is None or len(out) != hi - lo:
            out = self.h_sent[(i0, i1)] = self.cuda.pagelocked_empty(hi - lo, self.dtype)
        self.cuda.memcpy_dtoh_async(out, int(self.d_L) + lo * self.dtype.itemsize, self.stream)
        self.stream.synchronize()
        return out

    def empty_update_block(self, i0, i1):
        """The page-locked buffer another rank's update block of ``i0..i1`` is received into
        (one for every run: :meth:`add_update` is done with it before the next comes)."""
        lo, hi = self._panel_range(i0, i1)
        self._staging_buffers()
        return self.h_received[:hi - lo]

    def add_update(self, i0, i1, block):
        """Add another rank's update ``block`` to the panels of supernodes ``i0..i1`` on the
        device."""
        lo, hi = self._panel_range(i0, i1)
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self._staging_buffers()
        self.cuda.memcpy_htod_async(self.d_block, block, self.stream)
        self._add(hi - lo, self.d_block, int(self.d_L) + lo * self.dtype.itemsize)
        self.stream.synchronize()  # the block is the caller's buffer

    def factor_top(self, i):
        """Factor top supernode ``i`` by block tasks, its panel only (its updates of the
        supernodes above: :meth:`update_top`); returns as :meth:`factor_local`."""
        self._factor_large(int(i), rows=(0, 0))
        return self._failed()

    def update_top(self, i, r0, r1):
        """Subtract factored top supernode ``i``'s update of its below rows ``r0..r1-1`` (one
        ancestor's, :func:`~.rank_plan.update_groups`) from the panels here (enqueued)."""
        self._factor_large(int(i), factor=False, rows=(int(r0), int(r1)))

    # -- update blocks read from the other GPUs' memory (``subtree_exchange: ipc``) ---------
    def ipc_handle(self):
        """The CUDA IPC handle of this rank's panel array (bytes), for the owners of the runs
        it sends to."""
        return bytes(self.cuda.mem_get_ipc_handle(int(self.d_L)))

    def open_peers(self, handles):
        """Map the panel arrays of other ranks (``{rank: ipc_handle()}``) into this context
        (peer access enabled on first use)."""
        self.peers = {}
        for rank, handle in handles.items():  # one by one: close_peers undoes a partial map
            # PyCUDA takes the handle as a bytearray only (bytes are refused)
            self.peers[int(rank)] = self.cuda.IPCMemoryHandle(bytearray(handle))

    def update_range(self, i0, i1):
        """Where the panels of ``i0..i1`` lie in this rank's panel array, ``[lo, hi)`` (int64,
        2), once this rank's updates to them are done: the owner reads them from there."""
        lo, hi = self._panel_range(i0, i1)
        self.stream.synchronize()
        return np.array([lo, hi], dtype=np.int64)

    def _peer_panels(self, i0, i1, where, source):
        """``(values, address here, address in rank source's array)`` of the panels of
        ``i0..i1``, which lie at ``where`` (its :meth:`update_range`) in its array."""
        lo, hi = self._panel_range(i0, i1)
        start, stop = int(where[0]), int(where[1])
        if stop - start != hi - lo:
            raise HisparseError(f"cholesky: rank {source}'s panels of this rank's supernodes "
                                f"{i0}..{i1} have {stop - start} values, expected {hi - lo}")
        item = self.dtype.itemsize
        return hi - lo, int(self.d_L) + lo * item, int(self.peers[int(source)]) + start * item

    def add_peer_update(self, i0, i1, where, source):
        """Add rank ``source``'s update block of ``i0..i1``, read from its panel array at
        ``where`` (its :meth:`update_range`), to the panels here."""
        count, here, there = self._peer_panels(i0, i1, where, source)
        self._add(count, there, here)
        self.stream.synchronize()

    def copy_peer_panels(self, i0, i1, where, source):
        """Take rank ``source``'s factored panels of ``i0..i1``, read from its panel array at
        ``where`` (its :meth:`update_range`), in place of this rank's (enqueued)."""
        count, here, there = self._peer_panels(i0, i1, where, source)
        self.cuda.memcpy_dtod_async(here, there, count * self.dtype.itemsize, self.stream)

    def synchronize(self):
        self.stream.synchronize()

    def close_peers(self):
        """Unmap the other ranks' panel arrays (before any rank frees its own)."""
        for handle in getattr(self, "peers", {}).values():
            handle.close()
        self.peers = {}

    def free(self):
        self.close_peers()
        super().free()

    def logdet(self):
        """This rank's share of log det A (its owned columns' pivots)."""
        sym = self.sym
        if sym.n:
            self.kernels.gather_diag.prepared_async_call(
                grid_1d(sym.n, _THREADS), (_THREADS, 1, 1), self.stream, np.int32(sym.n),
                self.d_diag, self.d_L, self.d_diag_out)
            self.cuda.memcpy_dtoh_async(self.h_diag, self.d_diag_out, self.stream)
        self.stream.synchronize()
        return logdet_of_diagonal(self.h_diag[self.owned_local])

    # -- solve on the device: x (n x nrhs, column-major) in the solve workspace (the forward
    # pass's partial sums) and the solution buffer (y, then x) of the engine ------------------
    def start_solve(self, rhs):
        """Right-hand sides at this rank's owned columns (permuted order, shape (nc, k)): the
        forward pass's sums start from them (zero at the other held columns). They go into the
        page-locked buffer by the owned columns' runs (:attr:`owned_runs`), whose other
        columns stay zero from its making: no n x k array made, filled and scattered on the
        host every solve."""
        if self._rhs_buffers(rhs.shape[1], self.sym.n):
            self.rhs_host.fill(0)
        for column in range(rhs.shape[1]):
            if self.owned_runs is None:
                self.rhs_host[column, self.owned_local] = rhs[:, column]
                continue
            for first, place, count in self.owned_runs:
                copy_into(self.rhs_host[column, place:place + count],
                          rhs[first:first + count, column])
        self.cuda.memcpy_htod_async(self.d_x, self.rhs_host, self.stream)
        nrhs, n = self.x_shape
        self.cuda.memcpy_dtod_async(self.d_w, self.d_x, nrhs * n * self.dtype.itemsize,
                                    self.stream)
        count = nrhs * self.max_run_cols
        if self.d_solve_block is None or self.d_solve_block.size < count:
            self.arena.release(self.d_solve_block)
            self.d_solve_block = self.arena.empty(count, self.dtype, "received solve block")

    def _forward(self, launches):
        geometry = self._geometry()
        for count, chunks, prefix, grid in launches:
            self.kernels.solve_forward.prepared_async_call(
                (grid, 1), (CHUNK_THREADS, 1, 1), self.stream, np.int32(count), chunks, prefix,
                *geometry, self.d_w, self.d_y)

    def _backward(self, launches):
        geometry, tickets = self._geometry(), self.d_solve_chunks[3]
        for count, chunks, prefix, grid in reversed(launches):
            self.kernels.solve_backward.prepared_async_call(
                (grid, 1), (CHUNK_THREADS, 1, 1), self.stream, np.int32(count), chunks, prefix,
                *geometry, self.d_y, tickets)

    def _timed_local(self, launch):
        """``launch()`` (work on stream 0) between two events, for
        :meth:`take_local_solve_seconds`."""
        start, end = self.cuda.Event(), self.cuda.Event()
        start.record(self.stream)
        launch()
        end.record(self.stream)
        self._local_events.append((start, end))

    def take_local_solve_seconds(self):
        """Device seconds the solves since the last call spent in this rank's subtrees
        (:meth:`forward_local`, :meth:`backward_local`; waits for their end)."""
        seconds = 0.0
        for start, end in self._local_events:
            end.synchronize()
            seconds += end.time_since(start) / 1e3
        self._local_events = []
        return seconds

    def forward_local(self):
        """L y = b over the rank's subtrees: one dataflow launch (``solve_schedule: flow``,
        the counters zeroed first) or one launch per chunk level."""
        self._timed_local(self._forward_local)

    def _forward_local(self):
        if self.flow is None:
            self._forward(self.local_launches)
            return
        self.cuda.memset_d32_async(self.d_sync, 0, self.sync_count, self.stream)
        self._flow_pass(True, self.d_w, self.d_y)

    def forward_top(self, i):
        self._forward(self.top_launches[int(i)])

    def backward_top(self, i):
        self._backward(self.top_launches[int(i)])

    def backward_local(self):
        """L^T x = y over the rank's subtrees, after every top supernode's backward steps: the
        dataflow pass's ticket and parts counters zeroed, the top chunks marked solved (the
        subtree units below them wait on that), or one launch per chunk level."""
        self._timed_local(self._backward_local)

    def _backward_local(self):
        if self.flow is None:
            self._backward(self.local_launches)
            return
        nchunks, item = len(self.solve_plan.sup), 4
        sync = int(self.d_sync)
        self.cuda.memset_d32_async(sync + item, 0, 1, self.stream)  # the backward ticket
        self.cuda.memset_d32_async(sync + (2 + nchunks) * item, 0, nchunks, self.stream)
        self.cuda.memcpy_dtod_async(sync + (2 + 2 * nchunks) * item, self.d_tops_solved,
                                    nchunks * item, self.stream)
        self._flow_pass(False, None, self.d_y)

    def _columns(self, i0, i1):
        return int(self.sym.starts[i0]), int(self.sym.starts[i1 + 1])

    def _rows_to_host(self, d_array, i0, i1):
        """Columns of supernodes ``i0..i1`` of a device (n x nrhs) array, shape (nrhs, w)."""
        c0, c1 = self._columns(i0, i1)
        nrhs, n = self.x_shape
        item = self.dtype.itemsize
        out = np.empty((nrhs, c1 - c0), dtype=self.dtype)
        self.stream.synchronize()
        for r in range(nrhs):
            self.cuda.memcpy_dtoh(out[r], int(d_array) + (r * n + c0) * item)
        return out

    def solve_block(self, i0, i1):
        """The forward pass's partial sums at the columns of supernodes ``i0..i1`` (this
        rank's contribution to them), shape (nrhs, columns)."""
        return self._rows_to_host(self.d_w, i0, i1)

    def empty_solve_block(self, i0, i1):
        c0, c1 = self._columns(i0, i1)
        return np.empty((self.x_shape[0], c1 - c0), dtype=self.dtype)

    def add_solve_block(self, i0, i1, block):
        """Add another rank's partial sums (:meth:`solve_block`) at the columns of ``i0..i1``."""
        c0, c1 = self._columns(i0, i1)
        nrhs, n = self.x_shape
        item, width = self.dtype.itemsize, c1 - c0
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self.cuda.memcpy_htod_async(self.d_solve_block.gpudata, block, self.stream)
        for r in range(nrhs):
            self._add(width, int(self.d_solve_block.gpudata) + r * width * item,
                      int(self.d_w) + (r * n + c0) * item)
        self.stream.synchronize()  # the block is the caller's buffer

    def solved_block(self, i0, i1):
        """The solution at the columns of supernodes ``i0..i1`` (after their backward steps),
        shape (nrhs, columns)."""
        return self._rows_to_host(self.d_y, i0, i1)

    def set_solved_block(self, i0, i1, block):
        """Take the owner's :meth:`solved_block` of ``i0..i1`` as this rank's solution there."""
        c0, _ = self._columns(i0, i1)
        nrhs, n = self.x_shape
        item = self.dtype.itemsize
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self.stream.synchronize()
        for r in range(nrhs):
            self.cuda.memcpy_htod(int(self.d_y) + (r * n + c0) * item, block[r])

    def solution(self):
        """The solution at this rank's owned columns, shape (nc, k), taken by their runs."""
        self.cuda.memcpy_dtoh_async(self.x_host, self.d_y, self.stream)
        self.stream.synchronize()
        if self.owned_runs is None:
            return self.x_host[:, self.owned_local].T
        out = np.empty((len(self.owned_local), self.x_shape[0]), dtype=self.dtype)
        for column in range(self.x_shape[0]):
            for first, place, count in self.owned_runs:
                copy_into(out[first:first + count, column],
                          self.x_host[column, place:place + count])
        return out

    def held_bytes(self):
        """Peak device bytes of this rank's engine."""
        return int(self.memory_stats().get("peak_device_bytes", 0))


ENGINES = {None: GpuFactorEngine, "subtree": GpuSubtreeEngine}
