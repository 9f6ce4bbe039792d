"""CP-ALS engines: the per-rank data and the steps of one mode update, on the host (NumPy) or on
the rank's GPU (kernels_cu/mttkrp.cu), plus the cuSPARSE-SpMM MTTKRP peer.

Every engine holds, for each mode n, the CSR of its block of rows of the mode-n unfolding
(:class:`~hisparse.ops._cpals_format.ModeCSR`) and a full, replicated copy of every factor
matrix (I_m x R, row-major). One mode update is

    mttkrp(n) -> solve(n, V^+) -> inner() [last mode] -> allgather(n) -> stats(n) -> scale(n, lam)

where only ``allgather`` communicates; the host-side arithmetic between the steps (Hadamard of
the Grams, pseudo-inverse, lambda, fit) is the operation's.
"""
import time

import numpy as np

from ..errors import HisparseError


class _Layout:
    """Row blocks of every mode over the ranks, for the factor all-gather."""

    def __init__(self, comm, local, rank):
        self.comm = comm
        self.rank = rank
        blocks = [(csr.row_offset, csr.n_rows) for csr in local]
        self.blocks = comm.allgather(blocks) if comm.size > 1 else [blocks]

    def counts(self, n):
        """Element counts and displacements of mode n's row blocks, in rank order."""
        counts = np.array([b[n][1] * self.rank for b in self.blocks], dtype=np.int64)
        displs = np.array([b[n][0] * self.rank for b in self.blocks], dtype=np.int64)
        return counts, displs


def _allgather_rows(comm, local_rows, full, counts, displs):
    """MPI all-gather of each rank's row block into ``full`` (host arrays, same dtype)."""
    from mpi4py import MPI
    kind = MPI.DOUBLE if full.dtype == np.float64 else MPI.FLOAT
    comm.Allgatherv([np.ascontiguousarray(local_rows), kind],
                    [full, (counts.tolist(), displs.tolist()), kind])


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


class CpuEngine:
    """NumPy on the host: the CPU backend (and what the CPU tests exercise)."""

    kernel_name = "numpy"

    def __init__(self, ctx, local, shape, rank):
        self.ctx, self.local, self.shape, self.rank = ctx, local, shape, rank
        self.layout = _Layout(ctx.comm, local, rank)

    def upload(self):
        pass

    def load(self, factors):
        self.factors_full = [np.array(f, dtype=self.ctx.value_dtype) for f in factors]

    def mttkrp(self, n):
        self.m_local = numpy_mttkrp(self.local[n], self.factors_full, self.rank)

    def solve(self, n, vinv):
        csr = self.local[n]
        self.u_local = self.m_local @ vinv.astype(self.m_local.dtype)
        self.factors_full[n][csr.row_offset:csr.row_offset + csr.n_rows] = self.u_local

    def inner(self):
        return float(np.sum(self.u_local.astype(np.float64) * self.m_local.astype(np.float64)))

    def allgather(self, n):
        if self.ctx.comm.size == 1:
            return
        counts, displs = self.layout.counts(n)
        _allgather_rows(self.ctx.comm, self.u_local, self.factors_full[n], counts, displs)

    def stats(self, n):
        u = self.factors_full[n].astype(np.float64)
        return u.T @ u, np.max(np.abs(u), axis=0) if len(u) else np.zeros(self.rank)

    def scale(self, n, lam):
        self.factors_full[n] /= lam.astype(self.factors_full[n].dtype)

    def factors(self):
        return [f.copy() for f in self.factors_full]

    def local_mttkrp(self, n):
        return self.m_local

    def free(self):
        self.factors_full = None


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


class GpuEngine:
    """The rank's GPU: kernels of ``kernels_cu/mttkrp.cu``; data and factors stay resident."""

    def __init__(self, ctx, local, shape, rank, kernel="fast", chunk=None):
        self.ctx, self.local, self.shape, self.rank = ctx, local, shape, rank
        self.kernel = kernel
        self.kernel_name = "mttkrp_row_block" if kernel == "seed" else "mttkrp_nnz_team"
        self.requested_chunk = chunk
        self.layout = _Layout(ctx.comm, local, rank)
        self.order = len(shape)

    def upload(self):
        import pycuda.driver as cuda
        import pycuda.gpuarray as gpuarray
        ctx, rank = self.ctx, self.rank
        dtype = ctx.value_dtype
        self.dtype = dtype
        if rank > 1024:
            raise HisparseError(f"operation.params.rank {rank} > 1024 is not supported on the GPU")
        index_dtype = np.dtype(self.local[0].indptr.dtype)
        self.index_dtype = index_dtype
        self.team = team_size(rank)
        defines = {"VALUE_T": "double" if dtype == np.float64 else "float",
                   "INDEX_T": "int" if index_dtype == np.int32 else "long long",
                   "ORDER": self.order, "RANK": rank, "TEAM": self.team}
        module = ctx.load_kernels("mttkrp", defines)
        i = "i" if index_dtype == np.int32 else "q"
        self.k_seed = module.get_function("mttkrp_row_block")
        self.k_seed.prepare(i + "PPPPP")
        self.k_fast = module.get_function("mttkrp_nnz_team")
        self.k_fast.prepare(i * 3 + "PPPPP")
        self.k_solve = module.get_function("factor_solve")
        self.k_solve.prepare(i + "PPP")
        self.k_products = module.get_function("column_products")
        self.k_products.prepare(i * 2 + "PPP")
        self.k_reduce = module.get_function("reduce_partials")
        self.k_reduce.prepare("iPP")
        self.k_scale = module.get_function("scale_columns")
        self.k_scale.prepare(i + "PP")
        self.index = np.int32 if index_dtype == np.int32 else np.int64
        self.stream = cuda.Stream()
        self.arrays = []

        def keep(array):
            self.arrays.append(array)
            return array

        self.d_indptr, self.d_values, self.d_other, self.d_other_ptrs = [], [], [], []
        for csr in self.local:
            self.d_indptr.append(keep(gpuarray.to_gpu(np.ascontiguousarray(csr.indptr))))
            self.d_values.append(keep(gpuarray.to_gpu(np.ascontiguousarray(csr.values,
                                                                           dtype=dtype))))
            other = keep(gpuarray.to_gpu(np.ascontiguousarray(csr.other_idx, dtype=np.int32)))
            self.d_other.append(other)
            ptrs = np.array([int(other.gpudata) + j * csr.nnz * 4
                             for j in range(self.order - 1)], dtype=np.uint64)
            self.d_other_ptrs.append(keep(gpuarray.to_gpu(ptrs)))
        self.d_factors = [keep(gpuarray.zeros((int(size), rank), dtype)) for size in self.shape]
        self.d_factor_ptrs = []
        for n in range(self.order):
            ptrs = np.array([int(self.d_factors[m].gpudata) for m in range(self.order) if m != n],
                            dtype=np.uint64)
            self.d_factor_ptrs.append(keep(gpuarray.to_gpu(ptrs)))
        max_local = max(max(csr.n_rows for csr in self.local), 1)
        self.d_m = keep(gpuarray.zeros((max_local, rank), dtype))
        self.d_vinv = keep(gpuarray.zeros((rank, rank), dtype))
        self.d_lam = keep(gpuarray.zeros(rank, dtype))
        self.block = 256
        self.max_partial_blocks = 1024
        width = rank * rank + rank
        self.d_partial = keep(gpuarray.zeros(self.max_partial_blocks * width, np.float64))
        self.d_total = keep(gpuarray.zeros(width, np.float64))
        self.h_total = cuda.pagelocked_empty(width, np.float64)
        self.h_vinv = cuda.pagelocked_empty((rank, rank), dtype)
        self.h_lam = cuda.pagelocked_empty(rank, dtype)
        self.h_local = cuda.pagelocked_empty((max_local, rank), dtype)
        self.h_full = [cuda.pagelocked_empty((int(size), rank), dtype) for size in self.shape]
        self.chunks = [team_chunk(csr.nnz, self.team, self.requested_chunk) for csr in self.local]

    # -- steps ---------------------------------------------------------------------------------
    def load(self, factors):
        import pycuda.driver as cuda
        for n, factor in enumerate(factors):
            self.h_full[n][:] = factor
            cuda.memcpy_htod_async(self.d_factors[n].gpudata, self.h_full[n], self.stream)
        self.stream.synchronize()

    def _grid(self, threads):
        return (max(1, (int(threads) + self.block - 1) // self.block), 1)

    def mttkrp(self, n):
        import pycuda.driver as cuda
        csr, idx = self.local[n], self.index
        if self.kernel == "seed":
            self.k_seed.prepared_async_call(
                (max(csr.n_rows, 1), 1), (self.rank, 1, 1), self.stream, idx(csr.n_rows),
                self.d_indptr[n].gpudata, self.d_values[n].gpudata, self.d_other_ptrs[n].gpudata,
                self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)
            return
        # Rows cut by chunk boundaries are added atomically: start from zero.
        words = csr.n_rows * self.rank * self.dtype.itemsize // 4
        if words:
            cuda.memset_d32_async(self.d_m.gpudata, 0, words, self.stream)
        chunk = self.chunks[n]
        teams = (csr.nnz + chunk - 1) // chunk
        if teams:
            self.k_fast.prepared_async_call(
                self._grid(teams * self.team), (self.block, 1, 1), self.stream, idx(csr.n_rows),
                idx(csr.nnz), idx(chunk), self.d_indptr[n].gpudata, self.d_values[n].gpudata,
                self.d_other_ptrs[n].gpudata, self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)

    def solve(self, n, vinv):
        import pycuda.driver as cuda
        csr = self.local[n]
        self.h_vinv[:] = vinv
        cuda.memcpy_htod_async(self.d_vinv.gpudata, self.h_vinv, self.stream)
        self.u_local_ptr = int(self.d_factors[n].gpudata) + \
            csr.row_offset * self.rank * self.dtype.itemsize
        self.u_local_rows = csr.n_rows
        self.k_solve.prepared_async_call(self._grid(csr.n_rows * self.rank), (self.block, 1, 1),
                                         self.stream, self.index(csr.n_rows), self.d_m.gpudata,
                                         self.d_vinv.gpudata, self.u_local_ptr)

    def _column_products(self, n_rows, a_ptr, b_ptr):
        """fp64 A^T B and column max |A| over n_rows rows, on the host."""
        import pycuda.driver as cuda
        rows_per_block = max(64, -(-n_rows // self.max_partial_blocks))
        blocks = max(1, -(-n_rows // rows_per_block))
        self.k_products.prepared_async_call((blocks, 1), (self.block, 1, 1), self.stream,
                                            self.index(n_rows), self.index(rows_per_block),
                                            a_ptr, b_ptr, self.d_partial.gpudata)
        width = self.rank * self.rank + self.rank
        self.k_reduce.prepared_async_call(self._grid(width), (self.block, 1, 1), self.stream,
                                          np.int32(blocks), self.d_partial.gpudata,
                                          self.d_total.gpudata)
        cuda.memcpy_dtoh_async(self.h_total, self.d_total.gpudata, self.stream)
        self.stream.synchronize()
        r2 = self.rank * self.rank
        return self.h_total[:r2].reshape(self.rank, self.rank).copy(), self.h_total[r2:].copy()

    def inner(self):
        products, _ = self._column_products(self.u_local_rows, self.u_local_ptr,
                                            self.d_m.gpudata)
        return float(np.trace(products))

    def allgather(self, n):
        import pycuda.driver as cuda
        if self.ctx.comm.size == 1:
            return
        rows = self.u_local_rows
        local = self.h_local[:rows]
        if rows:
            cuda.memcpy_dtoh_async(local, self.u_local_ptr, self.stream)
        self.stream.synchronize()
        counts, displs = self.layout.counts(n)
        _allgather_rows(self.ctx.comm, local, self.h_full[n], counts, displs)
        cuda.memcpy_htod_async(self.d_factors[n].gpudata, self.h_full[n], self.stream)

    def stats(self, n):
        factor = self.d_factors[n]
        return self._column_products(int(self.shape[n]), factor.gpudata, factor.gpudata)

    def scale(self, n, lam):
        import pycuda.driver as cuda
        self.h_lam[:] = lam
        cuda.memcpy_htod_async(self.d_lam.gpudata, self.h_lam, self.stream)
        size = int(self.shape[n])
        self.k_scale.prepared_async_call(self._grid(size * self.rank), (self.block, 1, 1),
                                         self.stream, self.index(size),
                                         self.d_factors[n].gpudata, self.d_lam.gpudata)

    def factors(self):
        import pycuda.driver as cuda
        out = []
        for n in range(self.order):
            cuda.memcpy_dtoh_async(self.h_full[n], self.d_factors[n].gpudata, self.stream)
        self.stream.synchronize()
        for n in range(self.order):
            out.append(np.array(self.h_full[n]))
        return out

    def local_mttkrp(self, n):
        """The last MTTKRP (of mode n) on the host: local rows x R (tests, the peer check)."""
        self.stream.synchronize()
        return self.d_m.get()[:self.local[n].n_rows]

    def free(self):
        for array in getattr(self, "arrays", []):
            array.gpudata.free()
        self.arrays = []


# -- peers ------------------------------------------------------------------------------------

def cusparse_mttkrp_peer(full_csrs, factors, count, repeats, check=None):
    """MTTKRP as cuSPARSE SpMM through CuPy: X_(n) (distinct columns only) times the rows of the
    Khatri-Rao product for those columns, formed per call by gathering factor rows.

    Parameters
    ----------
    full_csrs : list of ModeCSR
        The whole unfolding of every mode.
    factors : list of ndarray, shape (I_m, R)
    count : int
        MTTKRPs per repeat (cycling over the modes), to match one of our repetitions.
    check : tuple (mode, ndarray) or None
        Our MTTKRP of ``mode`` with ``factors``, compared with the peer's.

    Returns
    -------
    dict
        ``seconds`` per repeat and attributes.
    """
    from ..gpu._blas import import_cupy, release_pool, time_with_events
    cupy, csp = import_cupy("cusparse")
    dtype = factors[0].dtype
    d_factors = [cupy.asarray(f) for f in factors]
    plans = []
    for csr in full_csrs:
        sizes = [int(factors[m].shape[0]) for m in csr.other_modes]
        if float(np.prod(sizes, dtype=np.float64)) >= 2.0 ** 62:
            raise HisparseError("peer 'cusparse': unfolding column ids overflow int64")
        other = cupy.asarray(csr.other_idx).astype(cupy.int64)
        key = other[0]
        for j in range(1, len(sizes)):
            key = key * sizes[j] + other[j]
        del other
        unique, columns = cupy.unique(key, return_inverse=True)
        del key
        coords = []
        rest = unique
        for j in reversed(range(len(sizes))):
            coords.append((rest % sizes[j]).astype(cupy.int32))
            rest = rest // sizes[j]
        coords.reverse()
        matrix = csp.csr_matrix((cupy.asarray(csr.values, dtype=dtype),
                                 columns.astype(cupy.int32).ravel(),
                                 cupy.asarray(csr.indptr).astype(cupy.int32)),
                                shape=(csr.n_rows, int(len(unique))))
        plans.append((csr.other_modes, coords, matrix))

    def one(n):
        modes, coords, matrix = plans[n]
        krp = d_factors[modes[0]][coords[0]]
        for m, c in zip(modes[1:], coords[1:]):
            krp *= d_factors[m][c]
        return matrix @ krp

    attrs = {}
    if check is not None:
        mode, ours = check
        theirs = cupy.asnumpy(one(mode))
        scale = float(np.abs(theirs).max()) or 1.0
        attrs["max_rel_diff_vs_ours"] = float(np.abs(theirs - ours).max() / scale)
    order = len(plans)
    for n in range(order):
        one(n)  # warm-up: cuSPARSE handles and buffers

    def mttkrps():
        for call in range(count):
            one(call % order)

    seconds = time_with_events(mttkrps, repeats)
    plans.clear()
    d_factors.clear()
    release_pool()
    import cupy.cuda.runtime as rt
    return dict(attrs, seconds=seconds, device="gpu", library=f"cupy {cupy.__version__}",
                mttkrps_per_repeat=count, cuda_runtime=rt.runtimeGetVersion())


def numpy_mttkrp_peer(full_csrs, factors, count, repeats):
    """MTTKRP with NumPy on the host (one process), ``count`` calls per repeat."""
    rank = factors[0].shape[1]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in range(count):
            numpy_mttkrp(full_csrs[call % len(full_csrs)], factors, rank)
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "device": "cpu", "mttkrps_per_repeat": count}
