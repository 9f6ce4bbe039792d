"""CP-ALS on the rank's GPU: the MTTKRP kernels of ``kernels_cu/mttkrp.cu`` and the dense steps of
``kernels_cu/cpals_dense.cu``. The unfolding blocks, every factor, the Grams and lambda stay
resident on the device, so one ALS iteration never waits for the host: the R x R solve,
normalisation and fit run there too, and the host reads one number (the fit) per iteration.

The steps are those of the CPU engine (:mod:`.cpu`). The operation all-gathers a mode's updated
rows either in place in the device factor (:meth:`MttkrpGpuEngine.device_factor`, NCCL on the
engine's stream) or, on an MPI transport, through pinned host memory
(:meth:`MttkrpGpuEngine.factor_buffer` downloads this rank's rows into the full host factor the
MPI all-gather fills, :meth:`MttkrpGpuEngine.factor_gathered` uploads it again). One engine per
MTTKRP kernel (``operation.params.mttkrp``): ``seed`` (one block per unfolding row) and
``fast`` (nonzero-parallel teams).
"""
import numpy as np

from ...errors import HisparseError
from ...gpu import KernelTable, grid_1d, index_scalar, type_defines
from .._base import GpuEngine

MTTKRP_KERNELS = KernelTable("mttkrp", ["mttkrp_row_block", "mttkrp_nnz_team"])
DENSE_KERNELS = KernelTable("cpals_dense", [
    "gram_inverse", "factor_solve", "column_products", "reduce_partials", "normalize_gram",
    "scale_columns", "inner_product", "cp_fit"])

#: Most nonzeros per team of the 'fast' kernel.
MAX_CHUNK = 256
#: What a team pays before its first nonzero (the binary search for its first row, ~14 dependent
#: loads), in nonzeros' worth of time: an estimate, used only to choose the chunk.
TEAM_OVERHEAD = 32
#: Dynamic shared memory the solve may use for its R x R matrix (the default 48 KiB per block,
#: less room for the kernel's static shared memory).
SOLVE_SHARED_BYTES = 48 * 1024 - 256
#: Threads per block of the element-wise kernels and of the one-block reductions.
BLOCK = 256


def next_power_of_two(value):
    return 1 << max(0, int(value - 1).bit_length())


def team_size(rank):
    """Lanes per nonzero team of the faster kernel: R rounded up to a power of two, <= 32."""
    return min(32, next_power_of_two(rank))


def team_chunk(nnz, team, requested=None, resident=None):
    """Nonzeros per team of the 'fast' kernel (a multiple of ``team``, at most :data:`MAX_CHUNK`).

    Every team does the same work, so the teams run in waves of ``resident`` (how many the GPU
    holds at once) and the kernel takes about (waves) x (chunk + :data:`TEAM_OVERHEAD`). With the
    chunk fixed at 256, a rank's share of the nonzeros could end on a part-filled wave: 2 ranks
    of a 20M-nonzero tensor ran 3.1 waves each (taking 4) against 6.2 (7) on one rank, so the
    MTTKRP scaled 1.75x. The chunk that minimises that estimate fills the last wave instead.
    Without ``resident`` (occupancy unknown): enough teams to fill an H100 (about 132 SMs x 64
    teams), at most 256 nonzeros each.
    """
    if requested:
        return max(team, (int(requested) // team) * team)
    nnz = int(nnz)
    if resident:
        def estimate(chunk):
            waves = -(-(-(-nnz // chunk)) // int(resident))
            return waves * (chunk + TEAM_OVERHEAD), -chunk  # ties: fewer, longer teams
        return min(range(team, max(team, MAX_CHUNK) + 1, team), key=estimate)
    target = nnz // (132 * 64)
    return int(min(MAX_CHUNK, max(team, (target // team) * team)))


def resident_teams(function, block, team):
    """Teams of ``team`` lanes that the current GPU runs at once for a kernel launched with
    ``block`` threads per block: SMs x blocks per SM (bounded by threads and by registers,
    allocated per warp in units of 256), or None if the driver does not say."""
    import pycuda.driver as cuda
    try:
        device = cuda.Context.get_device()
        attribute = cuda.device_attribute
        sms = device.get_attribute(attribute.MULTIPROCESSOR_COUNT)
        threads = device.get_attribute(attribute.MAX_THREADS_PER_MULTIPROCESSOR)
        registers = device.get_attribute(attribute.MAX_REGISTERS_PER_MULTIPROCESSOR)
        per_thread = function.get_attribute(cuda.function_attribute.NUM_REGS)
    except (AttributeError, cuda.Error):
        return None
    warps = block // 32
    per_warp = -(-max(1, per_thread) * 32 // 256) * 256
    blocks = min(threads // block, registers // (per_warp * warps))
    return max(1, blocks) * sms * (block // team) if sms else None


class MttkrpGpuEngine(GpuEngine):
    """The steps of one mode update on the GPU; subclasses launch their MTTKRP kernel.

    Parameters
    ----------
    ctx : EngineContext
    local : UnfoldingBlocks
    params : dict
        ``operation.params`` (``rank`` and ``chunk`` are read).
    """

    #: The MTTKRP kernel this engine launches (recorded as ``mttkrp_kernel``).
    kernel_name = None

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="cpals")
        self.cp_rank = int(params["rank"])
        self.requested_chunk = params["chunk"]
        self.shape = local.shape
        self.order = local.order

    def upload(self):
        import pycuda.driver as cuda
        ctx, rank, arena = self.ctx, self.cp_rank, self.arena
        dtype = ctx.value_dtype
        self.dtype = dtype
        if rank > 1024:
            raise HisparseError(f"operation.params.rank {rank} > 1024 is not supported on the GPU")
        modes = self.local.modes
        index_dtype = np.dtype(modes[0].indptr.dtype)
        self.index_dtype = index_dtype
        self.team = team_size(rank)
        self.kernels = MTTKRP_KERNELS.load(ctx, type_defines(dtype, index_dtype, ORDER=self.order,
                                                             RANK=rank, TEAM=self.team))
        self.dense = DENSE_KERNELS.load(ctx, type_defines(dtype, index_dtype, ORDER=self.order,
                                                          RANK=rank))
        self.index = index_scalar(index_dtype)
        self.stream = cuda.Stream()

        self.d_indptr, self.d_values, self.d_other, self.d_other_ptrs = [], [], [], []
        for csr in modes:
            self.d_indptr.append(arena.to_device(csr.indptr, "row pointers"))
            self.d_values.append(arena.to_device(np.ascontiguousarray(csr.values, dtype=dtype),
                                                 "values"))
            other = arena.to_device(np.ascontiguousarray(csr.other_idx, dtype=np.int32),
                                    "coordinates")
            self.d_other.append(other)
            ptrs = np.array([int(other.gpudata) + j * csr.nnz * 4
                             for j in range(self.order - 1)], dtype=np.uint64)
            self.d_other_ptrs.append(arena.to_device(ptrs, "coordinate pointers"))
        self.d_factors = [arena.zeros((int(size), rank), dtype, "factor") for size in self.shape]
        self.d_factor_ptrs = []
        for n in range(self.order):
            ptrs = np.array([int(self.d_factors[m].gpudata) for m in range(self.order) if m != n],
                            dtype=np.uint64)
            self.d_factor_ptrs.append(arena.to_device(ptrs, "factor pointers"))
        max_local = max(max(csr.n_rows for csr in modes), 1)
        self.d_m = arena.zeros((max_local, rank), dtype, "MTTKRP rows")
        self._upload_dense_state()
        self.h_full = [cuda.pagelocked_empty((int(size), rank), dtype) for size in self.shape]

    def _upload_dense_state(self):
        """The buffers of the dense steps: Grams, lambda, the solve's matrix, partials, the
        inner product and the fit, and their pinned host copies."""
        import pycuda.driver as cuda
        rank, arena = self.cp_rank, self.arena
        self.d_grams = arena.zeros((self.order, rank, rank), np.float64, "Grams")
        self.d_lam = arena.zeros(rank, np.float64, "lambda")
        self.d_vinv = arena.zeros((rank, rank), self.dtype, "inverse of V")
        # The solve's R x R matrix and one column: in shared memory when they fit.
        solve_bytes = (rank * rank + rank) * 8
        self.solve_shared = solve_bytes if solve_bytes <= SOLVE_SHARED_BYTES else 0
        self.d_solve_work = None if self.solve_shared else \
            arena.empty(rank * rank + rank, np.float64, "solve matrix")
        self.solve_block = min(1024, max(32, -(-rank * rank // 32) * 32))
        self.max_partial_blocks = 1024
        width = rank * rank + rank
        self.d_partial = arena.zeros(self.max_partial_blocks * width, np.float64, "partials")
        self.d_total = arena.zeros(width, np.float64, "column products")
        self.d_blocks_done = arena.zeros(1, np.uint32, "block counter")
        self.d_inner = arena.zeros(1, np.float64, "<U, M>")
        self.d_fit = arena.zeros(1, np.float64, "fit")
        self.d_status = arena.zeros(1, np.int32, "solve status")
        self.h_total = cuda.pagelocked_empty(width, np.float64)
        self.h_vinv = cuda.pagelocked_empty((rank, rank), self.dtype)
        self.h_lam = cuda.pagelocked_empty(rank, np.float64)
        self.h_grams = cuda.pagelocked_empty((self.order, rank, rank), np.float64)
        self.h_scalars = cuda.pagelocked_empty(2, np.float64)  # <U, M>, fit
        self.h_status = cuda.pagelocked_empty(1, np.int32)

    # -- state ---------------------------------------------------------------------------------
    def load(self, factors, grams=None, lam=None):
        """Start from ``factors`` (and their ``grams``, fp64, and ``lam``; by default U^T U and
        ones)."""
        import pycuda.driver as cuda
        if grams is None:
            grams = [np.asarray(f, dtype=np.float64).T @ np.asarray(f, dtype=np.float64)
                     for f in factors]
        for n, factor in enumerate(factors):
            self.h_full[n][:] = factor
            cuda.memcpy_htod_async(self.d_factors[n].gpudata, self.h_full[n], self.stream)
            self.h_grams[n] = grams[n]
        self.h_lam[:] = 1.0 if lam is None else lam
        cuda.memcpy_htod_async(self.d_grams.gpudata, self.h_grams, self.stream)
        cuda.memcpy_htod_async(self.d_lam.gpudata, self.h_lam, self.stream)
        cuda.memset_d32_async(self.d_status.gpudata, 0, 1, self.stream)
        self.stream.synchronize()

    def state(self):
        """``(lam, grams)`` on the host (fp64): checkpoints and the final result."""
        import pycuda.driver as cuda
        cuda.memcpy_dtoh_async(self.h_lam, self.d_lam.gpudata, self.stream)
        cuda.memcpy_dtoh_async(self.h_grams, self.d_grams.gpudata, self.stream)
        self.stream.synchronize()
        return self.h_lam.copy(), [gram.copy() for gram in self.h_grams]

    def factors(self):
        import pycuda.driver as cuda
        for n in range(self.order):
            cuda.memcpy_dtoh_async(self.h_full[n], self.d_factors[n].gpudata, self.stream)
        self.stream.synchronize()
        return [np.array(full) for full in self.h_full]

    def local_mttkrp(self, n):
        """The last MTTKRP (of mode n) on the host: local rows x R (tests, the peer check)."""
        self.stream.synchronize()
        return self.d_m.get()[:self.local.modes[n].n_rows]

    # -- steps ---------------------------------------------------------------------------------
    def _grid(self, threads):
        return grid_1d(threads, BLOCK)

    def mttkrp(self, n):
        raise NotImplementedError

    def solve(self, n, vinv=None):
        """This rank's rows of U_n = M V^-1, written into the device factor. V^-1 comes from
        the engine's Grams on the device, or is ``vinv`` (R x R, from the host) when given."""
        import pycuda.driver as cuda
        csr, rank = self.local.modes[n], self.cp_rank
        if vinv is None:
            self.dense.gram_inverse.prepared_async_call(
                (1, 1), (self.solve_block, 1, 1), self.stream, np.int32(n),
                self.d_grams.gpudata, 0 if self.d_solve_work is None else
                self.d_solve_work.gpudata, self.d_vinv.gpudata, self.d_status.gpudata,
                shared_size=self.solve_shared)
        else:
            self.h_vinv[:] = vinv
            cuda.memcpy_htod_async(self.d_vinv.gpudata, self.h_vinv, self.stream)
        self.u_local_ptr = int(self.d_factors[n].gpudata) + \
            csr.row_offset * rank * self.dtype.itemsize
        self.u_local_rows = csr.n_rows
        self.dense.factor_solve.prepared_async_call(
            self._grid(csr.n_rows * rank), (BLOCK, 1, 1), self.stream,
            self.index(csr.n_rows), self.d_m.gpudata, self.d_vinv.gpudata, self.u_local_ptr)

    def inner_local(self):
        """<U, M> of this rank's rows of the last solved mode (unscaled U), fp64, as a device
        array of one entry that the operation sums over the ranks in place."""
        count = self.u_local_rows * self.cp_rank
        blocks = min(self.max_partial_blocks, self._grid(count)[0])
        self.dense.inner_product.prepared_async_call(
            (blocks, 1), (BLOCK, 1, 1), self.stream, np.int64(count), self.u_local_ptr,
            self.d_m.gpudata, self.d_partial.gpudata, self.d_blocks_done.gpudata,
            self.d_inner.gpudata)
        return self.d_inner

    def inner(self):
        """<U, M> of this rank's rows, on the host."""
        import pycuda.driver as cuda
        cuda.memcpy_dtoh_async(self.h_scalars[:1], self.inner_local().gpudata, self.stream)
        self.stream.synchronize()
        return float(self.h_scalars[0])

    def device_factor(self, n):
        """The (I_n, R) device factor of mode n, this rank's updated rows in place: what a
        device all-gather fills."""
        return self.d_factors[n]

    def factor_buffer(self, n):
        """The pinned (I_n, R) host array that a host all-gather of mode n fills in place,
        with this rank's updated rows downloaded into it."""
        import pycuda.driver as cuda
        csr, full = self.local.modes[n], self.h_full[n]
        if self.u_local_rows:
            cuda.memcpy_dtoh_async(full[csr.row_offset:csr.row_offset + self.u_local_rows],
                                   self.u_local_ptr, self.stream)
        self.stream.synchronize()
        return full

    def factor_gathered(self, n):
        """Upload the whole factor of mode n, now that every rank's rows are on the host."""
        import pycuda.driver as cuda
        cuda.memcpy_htod_async(self.d_factors[n].gpudata, self.h_full[n], self.stream)

    def _column_products(self, n):
        """Enqueue fp64 U_n^T U_n and the column maxima of the whole factor into d_total."""
        factor, n_rows = self.d_factors[n], int(self.shape[n])
        rows_per_block = max(64, -(-n_rows // self.max_partial_blocks))
        grid = grid_1d(n_rows, rows_per_block)
        self.dense.column_products.prepared_async_call(
            grid, (BLOCK, 1, 1), self.stream, self.index(n_rows), self.index(rows_per_block),
            factor.gpudata, factor.gpudata, self.d_partial.gpudata)
        self.dense.reduce_partials.prepared_async_call(
            self._grid(self.cp_rank * self.cp_rank + self.cp_rank), (BLOCK, 1, 1), self.stream,
            np.int32(grid[0]), self.d_partial.gpudata, self.d_total.gpudata)

    def stats(self, n):
        """U_n^T U_n (fp64) and the column maxima of |U_n|, on the host."""
        import pycuda.driver as cuda
        self._column_products(n)
        cuda.memcpy_dtoh_async(self.h_total, self.d_total.gpudata, self.stream)
        self.stream.synchronize()
        r2 = self.cp_rank * self.cp_rank
        return (self.h_total[:r2].reshape(self.cp_rank, self.cp_rank).copy(),
                self.h_total[r2:].copy())

    def _scale_columns(self, n):
        size = int(self.shape[n])
        self.dense.scale_columns.prepared_async_call(
            self._grid(size * self.cp_rank), (BLOCK, 1, 1), self.stream, self.index(size),
            self.d_factors[n].gpudata, self.d_lam.gpudata)

    def scale(self, n, lam):
        """U_n /= ``lam`` (from the host)."""
        import pycuda.driver as cuda
        self.h_lam[:] = lam
        cuda.memcpy_htod_async(self.d_lam.gpudata, self.h_lam, self.stream)
        self._scale_columns(n)

    def normalize(self, n, first):
        """lambda from the gathered U_n (column norms in the ``first`` iteration, else column
        maxima floored at 1), U_n /= lambda and G_n of the scaled factor, all on the device."""
        self._column_products(n)
        self.dense.normalize_gram.prepared_async_call(
            (1, 1), (BLOCK, 1, 1), self.stream, np.int32(bool(first)), self.d_total.gpudata,
            self.d_lam.gpudata, int(self.d_grams.gpudata) + n * self.cp_rank ** 2 * 8)
        self._scale_columns(n)

    def fit(self, norm_x):
        """Enqueue the fit from lambda, the Grams and the summed <X, M>, and its copy (with the
        solve's status) to the host; :meth:`read_fit` reads it once the stream is done."""
        import pycuda.driver as cuda
        self.dense.cp_fit.prepared_async_call(
            (1, 1), (BLOCK, 1, 1), self.stream, np.float64(norm_x), self.d_lam.gpudata,
            self.d_grams.gpudata, self.d_inner.gpudata, self.d_fit.gpudata)
        cuda.memcpy_dtoh_async(self.h_scalars[1:], self.d_fit.gpudata, self.stream)
        cuda.memcpy_dtoh_async(self.h_status, self.d_status.gpudata, self.stream)

    def read_fit(self):
        """The fit enqueued by :meth:`fit` (call after the engine's stream is done)."""
        failed = int(self.h_status[0])
        if failed:
            error = HisparseError(
                f"CP-ALS on the GPU: the {self.cp_rank}x{self.cp_rank} system of mode "
                f"{failed - 1} (the Hadamard product of the other modes' Grams) is not positive "
                f"definite: the factors have lost rank (is rank {self.cp_rank} more than the "
                f"tensor supports?); backend: cpu solves it with a pseudo-inverse")
            error.collective = True  # every rank solves the same system from the same Grams
            raise error
        return float(self.h_scalars[1])


class RowBlockEngine(MttkrpGpuEngine):
    """``mttkrp: seed``: one thread block per unfolding row, one thread per rank column."""

    kernel_name = "mttkrp_row_block"

    def mttkrp(self, n):
        csr = self.local.modes[n]
        self.kernels.mttkrp_row_block.prepared_async_call(
            grid_1d(csr.n_rows, 1), (self.cp_rank, 1, 1), self.stream, self.index(csr.n_rows),
            self.d_indptr[n].gpudata, self.d_values[n].gpudata, self.d_other_ptrs[n].gpudata,
            self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)


class NnzTeamEngine(MttkrpGpuEngine):
    """``mttkrp: fast``: equal chunks of nonzeros, one per team of lanes (see mttkrp.cu)."""

    kernel_name = "mttkrp_nnz_team"

    def upload(self):
        super().upload()
        resident = resident_teams(self.kernels.mttkrp_nnz_team, BLOCK, self.team)
        self.chunks = [team_chunk(csr.nnz, self.team, self.requested_chunk, resident)
                       for csr in self.local.modes]

    def mttkrp(self, n):
        import pycuda.driver as cuda
        csr = self.local.modes[n]
        # Rows cut by chunk boundaries are added atomically: start from zero.
        words = csr.n_rows * self.cp_rank * self.dtype.itemsize // 4
        if words:
            cuda.memset_d32_async(self.d_m.gpudata, 0, words, self.stream)
        chunk = self.chunks[n]
        teams = (csr.nnz + chunk - 1) // chunk
        if teams:
            self.kernels.mttkrp_nnz_team.prepared_async_call(
                self._grid(teams * self.team), (BLOCK, 1, 1), self.stream,
                self.index(csr.n_rows), self.index(csr.nnz), self.index(chunk),
                self.d_indptr[n].gpudata, self.d_values[n].gpudata, self.d_other_ptrs[n].gpudata,
                self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)


ENGINES = {"seed": RowBlockEngine, "fast": NnzTeamEngine}
