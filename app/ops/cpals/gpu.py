"""CP-ALS on the rank's GPU: the kernels of ``kernels_cu/mttkrp.cu``; the unfolding blocks and
every factor stay resident on the device.

The steps are those of the CPU engine (:mod:`.cpu`); the exchange of a mode's updated rows goes
through pinned host buffers: :meth:`MttkrpGpuEngine.factor_buffer` downloads this rank's rows
into the full host factor that the operation's row all-gather fills, and
:meth:`MttkrpGpuEngine.factor_gathered` uploads the whole factor again. One engine per MTTKRP
kernel (``operation.params.mttkrp``): ``seed`` (one block per unfolding row) and ``fast``
(nonzero-parallel teams).
"""
import numpy as np

from ...errors import HisparseError
from ...gpu import KernelTable, grid_1d, index_scalar, type_defines
from .._base import GpuEngine

KERNELS = KernelTable("mttkrp", ["mttkrp_row_block", "mttkrp_nnz_team", "factor_solve",
                                 "column_products", "reduce_partials", "scale_columns"])


def next_power_of_two(value):
    return 1 << max(0, int(value - 1).bit_length())


def team_size(rank):
    """Lanes per nonzero team of the faster kernel: R rounded up to a power of two, <= 32."""
    return min(32, next_power_of_two(rank))


def team_chunk(nnz, team, requested=None):
    """Nonzeros per team: enough teams to fill an H100 (about 132 SMs x 64 teams), at most 256."""
    if requested:
        return max(team, (int(requested) // team) * team)
    target = nnz // (132 * 64)
    return int(min(256, max(team, (target // team) * team)))


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
        self.kernels = KERNELS.load(ctx, type_defines(dtype, index_dtype, ORDER=self.order,
                                                      RANK=rank, TEAM=self.team))
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
        self.d_vinv = arena.zeros((rank, rank), dtype, "pseudo-inverse")
        self.d_lam = arena.zeros(rank, dtype, "lambda")
        self.block = 256
        self.max_partial_blocks = 1024
        width = rank * rank + rank
        self.d_partial = arena.zeros(self.max_partial_blocks * width, np.float64, "partials")
        self.d_total = arena.zeros(width, np.float64, "column products")
        self.h_total = cuda.pagelocked_empty(width, np.float64)
        self.h_vinv = cuda.pagelocked_empty((rank, rank), dtype)
        self.h_lam = cuda.pagelocked_empty(rank, dtype)
        self.h_full = [cuda.pagelocked_empty((int(size), rank), dtype) for size in self.shape]

    # -- steps ---------------------------------------------------------------------------------
    def load(self, factors):
        import pycuda.driver as cuda
        for n, factor in enumerate(factors):
            self.h_full[n][:] = factor
            cuda.memcpy_htod_async(self.d_factors[n].gpudata, self.h_full[n], self.stream)
        self.stream.synchronize()

    def _grid(self, threads):
        return grid_1d(threads, self.block)

    def mttkrp(self, n):
        raise NotImplementedError

    def solve(self, n, vinv):
        import pycuda.driver as cuda
        csr = self.local.modes[n]
        self.h_vinv[:] = vinv
        cuda.memcpy_htod_async(self.d_vinv.gpudata, self.h_vinv, self.stream)
        self.u_local_ptr = int(self.d_factors[n].gpudata) + \
            csr.row_offset * self.cp_rank * self.dtype.itemsize
        self.u_local_rows = csr.n_rows
        self.kernels.factor_solve.prepared_async_call(
            self._grid(csr.n_rows * self.cp_rank), (self.block, 1, 1), self.stream,
            self.index(csr.n_rows), self.d_m.gpudata, self.d_vinv.gpudata, self.u_local_ptr)

    def _column_products(self, n_rows, a_ptr, b_ptr):
        """fp64 A^T B and column max |A| over n_rows rows, on the host."""
        import pycuda.driver as cuda
        rows_per_block = max(64, -(-n_rows // self.max_partial_blocks))
        grid = grid_1d(n_rows, rows_per_block)
        self.kernels.column_products.prepared_async_call(
            grid, (self.block, 1, 1), self.stream, self.index(n_rows),
            self.index(rows_per_block), a_ptr, b_ptr, self.d_partial.gpudata)
        width = self.cp_rank * self.cp_rank + self.cp_rank
        self.kernels.reduce_partials.prepared_async_call(
            self._grid(width), (self.block, 1, 1), self.stream, np.int32(grid[0]),
            self.d_partial.gpudata, self.d_total.gpudata)
        cuda.memcpy_dtoh_async(self.h_total, self.d_total.gpudata, self.stream)
        self.stream.synchronize()
        r2 = self.cp_rank * self.cp_rank
        return (self.h_total[:r2].reshape(self.cp_rank, self.cp_rank).copy(),
                self.h_total[r2:].copy())

    def inner(self):
        products, _ = self._column_products(self.u_local_rows, self.u_local_ptr,
                                            self.d_m.gpudata)
        return float(np.trace(products))

    def factor_buffer(self, n):
        """The pinned (I_n, R) host array that the row all-gather of mode n fills in place,
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

    def stats(self, n):
        factor = self.d_factors[n]
        return self._column_products(int(self.shape[n]), factor.gpudata, factor.gpudata)

    def scale(self, n, lam):
        import pycuda.driver as cuda
        self.h_lam[:] = lam
        cuda.memcpy_htod_async(self.d_lam.gpudata, self.h_lam, self.stream)
        size = int(self.shape[n])
        self.kernels.scale_columns.prepared_async_call(
            self._grid(size * self.cp_rank), (self.block, 1, 1), self.stream, self.index(size),
            self.d_factors[n].gpudata, self.d_lam.gpudata)

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
        self.chunks = [team_chunk(csr.nnz, self.team, self.requested_chunk)
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
                self._grid(teams * self.team), (self.block, 1, 1), self.stream,
                self.index(csr.n_rows), self.index(csr.nnz), self.index(chunk),
                self.d_indptr[n].gpudata, self.d_values[n].gpudata, self.d_other_ptrs[n].gpudata,
                self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)


ENGINES = {"seed": RowBlockEngine, "fast": NnzTeamEngine}
