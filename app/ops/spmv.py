"""SpMV, y = A x, over row partitions of A (CSR kernel; CSR5 is a separate format).

Plan: rank 0 partitions A's rows (nnz-balanced blocks by default, or row-modulo), scatters the row
blocks and broadcasts x. Each rank keeps its block resident on its GPU (uploaded once), then every
repetition copies x in, runs ``iterations`` products, copies its part of y out, and y is gathered
to rank 0 in global row order.
"""
import time

import numpy as np

from ..config import Setting, positive
from ..errors import HisparseError, InputError
from ..formats import CSRMatrix
from ..parallel import bcast_arrays, gather_arrays, root_call, scatter_arrays
from ..partition import partition_rows
from ._base import Operation


def _x_check(value):
    if value in ("random", "ones") or (":" in value and value.split(":", 1)[0].endswith(
            (".h5", ".hdf5"))):
        return None
    return "expected 'random', 'ones' or 'FILE.h5:/dataset'"


def make_x(spec, ncols, dtype, seed):
    """The input vector x, shape (ncols,), of the value dtype.

    Parameters
    ----------
    spec : str
        ``random`` (uniform in [-1, 1) from ``seed``), ``ones``, or ``FILE.h5:/dataset``.
    """
    if spec == "ones":
        return np.ones(ncols, dtype=dtype)
    if spec == "random":
        return np.random.default_rng(seed).uniform(-1.0, 1.0, ncols).astype(dtype)
    import h5py
    path, dataset = spec.split(":", 1)
    try:
        with h5py.File(path, "r") as handle:
            if dataset not in handle:
                raise InputError(f"{path}: dataset '{dataset}' (operation.params.x) not found")
            x = np.asarray(handle[dataset][()])
    except OSError as exc:
        raise InputError(f"{path}: cannot read x ({exc})") from None
    if x.ndim != 1 or len(x) != ncols:
        raise InputError(f"{path}:{dataset}: x has shape {x.shape}, expected ({ncols},) to match "
                         f"the matrix's {ncols} columns")
    if not np.isfinite(x).all():
        raise InputError(f"{path}:{dataset}: x holds NaN/Inf at index {int(np.argmin(np.isfinite(x)))}")
    return x.astype(dtype)


def threads_per_row(mean_row_length):
    """Lanes per row for the CSR-vector kernel: the power of two nearest the mean row length."""
    if mean_row_length <= 1:
        return 1
    return int(min(32, 2 ** round(np.log2(mean_row_length))))


class SpMV(Operation):
    """y = A x for a sparse matrix A (CSR), partitioned by rows."""

    NAME = "spmv"
    INPUT_KIND = "matrix"
    PARAMS = {
        "format": Setting(str, "csr", "Sparse format of the kernel.", choices=("csr",)),
        "iterations": Setting(int, 1, "Products per repetition on resident data.", check=positive),
        "x": Setting(str, "random", "'random', 'ones' or 'FILE.h5:/dataset'.", check=_x_check),
        "threads_per_row": Setting(int, None, "CSR-vector lanes per row; null = from the mean "
                                              "row length.", nullable=True,
                                   choices=(1, 2, 4, 8, 16, 32)),
    }
    PARTITIONS = ("nnz_balanced", "row_modulo", "row_blocks")
    PEERS = ("scipy", "cusparse")
    SETUP_PHASES = ("partition", "distribute", "upload")
    REPEAT_PHASES = ("h2d", "kernel", "d2h", "gather")
    COMPUTE_PHASES = ("kernel",)

    def setup(self, problem):
        ctx = self.ctx
        with ctx.timer.phase("partition"):
            parts = root_call(ctx.comm, self._partition, problem)
        with ctx.timer.phase("distribute"):
            part = scatter_arrays(ctx.comm, parts)
            x = bcast_arrays(ctx.comm, {"x": parts[0]["x"] if ctx.is_root else None}
                             if ctx.is_root else None)["x"]
        self.local = CSRMatrix(part["indptr"], part["indices"], part["data"],
                               (len(part["indptr"]) - 1, part["ncols"]))
        self.rows = part["rows"]
        self.x = x
        self.global_rows = part["nrows"]
        self.y_full = None
        self.engine = (_GpuCsrEngine if ctx.backend == "gpu" else _CpuCsrEngine)(self)
        with ctx.timer.phase("upload"):
            self.engine.upload()

    def _partition(self, problem):
        ctx = self.ctx
        x = make_x(self.params["x"], problem.ncols, problem.data.dtype, ctx.config["run.seed"])
        plan = partition_rows(problem.indptr, ctx.size, self.strategy)
        parts = []
        for rows in plan.rows:
            block = (problem.row_block(int(rows[0]), int(rows[-1]) + 1) if plan.contiguous
                     else problem.rows(rows))
            parts.append({"indptr": block.indptr.astype(problem.indptr.dtype),
                          "indices": block.indices, "data": block.data, "rows": rows,
                          "ncols": problem.ncols, "nrows": problem.nrows})
        parts[0]["x"] = x
        self.x_global = x
        return parts

    def run_once(self):
        y_local = self.engine.multiply(self.params["iterations"])
        with self.ctx.timer.phase("gather"):
            gathered = gather_arrays(self.ctx.comm, {"y": y_local, "rows": self.rows})
            if self.ctx.is_root:
                y = np.empty(self.global_rows, dtype=y_local.dtype)
                for piece in gathered:
                    y[piece["rows"]] = piece["y"]
                self.y_full = y

    def teardown(self):
        self.engine.free()

    def result(self):
        return self.y_full

    def result_arrays(self, result):
        return {"y": result}

    def reference(self, problem):
        return problem.to_scipy().astype(np.float64) @ self.x_global.astype(np.float64)

    def work(self, problem):
        value = problem.data.dtype.itemsize
        index = problem.indices.dtype.itemsize
        m, n, nnz = problem.nrows, problem.ncols, problem.nnz
        per_product = nnz * (value + index) + (m + 1) * index + m * value + n * value
        k = self.params["iterations"]
        return {"flops": 2.0 * nnz * k, "bytes": float(per_product) * k}

    def run_peer(self, name, problem, repeats):
        k = self.params["iterations"]
        if name == "scipy":
            matrix = problem.to_scipy()
            x = self.x_global
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(k):
                    matrix @ x
                seconds.append(time.perf_counter() - start)
            return {"seconds": seconds, "device": "cpu"}
        if name == "cusparse":
            return _cusparse_spmv(problem, self.x_global, repeats, k)
        raise HisparseError(f"unknown peer {name}")

    def rank_info(self):
        return {"n_rows": int(self.local.nrows), "nnz": int(self.local.nnz),
                "bytes_h2d": int(self.x.nbytes), "bytes_d2h": int(self.local.nrows *
                                                                   self.x.itemsize)}


def _cusparse_spmv(problem, x, repeats, iterations):
    """cuSPARSE CSR SpMV through CuPy, timed with CUDA events on the same device."""
    try:
        import cupy
        import cupyx.scipy.sparse as csp
    except ImportError as exc:
        raise HisparseError(f"peer 'cusparse' needs CuPy ({exc})") from None
    matrix = csp.csr_matrix((cupy.asarray(problem.data), cupy.asarray(problem.indices),
                             cupy.asarray(problem.indptr)), shape=problem.shape)
    x_dev = cupy.asarray(x)
    matrix @ x_dev  # warm-up: cuSPARSE buffer allocation and handle creation
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    seconds = []
    for _ in range(repeats):
        start.record()
        for _ in range(iterations):
            matrix @ x_dev
        end.record()
        end.synchronize()
        seconds.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    del matrix, x_dev
    cupy.get_default_memory_pool().free_all_blocks()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}"}


class _CpuCsrEngine:
    """SciPy on the host: the fallback path and the CPU backend."""

    def __init__(self, op):
        self.op = op

    def upload(self):
        self.matrix = self.op.local.to_scipy()

    def multiply(self, iterations):
        with self.op.ctx.timer.phase("kernel"):
            for _ in range(iterations):
                y = self.matrix @ self.op.x
        return y

    def free(self):
        self.matrix = None


class _GpuCsrEngine:
    """CSR-vector kernel on the rank's GPU; the matrix stays resident between repetitions."""

    def __init__(self, op):
        self.op = op
        self.ctx = op.ctx

    def upload(self):
        import pycuda.driver as cuda
        import pycuda.gpuarray as gpuarray
        local = self.op.local
        value_t = "double" if local.data.dtype == np.float64 else "float"
        index_t = "int" if local.indices.dtype == np.int32 else "long long"
        lengths = np.diff(local.indptr)
        mean = float(lengths.mean()) if len(lengths) else 1.0
        self.tpr = self.op.params["threads_per_row"] or threads_per_row(mean)
        module = self.ctx.load_kernels("spmv_csr", {"VALUE_T": value_t, "INDEX_T": index_t,
                                                    "THREADS_PER_ROW": self.tpr})
        self.kernel = module.get_function("spmv_csr_vector")
        self.kernel.prepare(("i" if index_t == "int" else "q") + "PPPPP")
        self.stream = cuda.Stream()
        self.indptr = gpuarray.to_gpu(local.indptr)
        self.indices = gpuarray.to_gpu(local.indices)
        self.data = gpuarray.to_gpu(local.data)
        self.x_host = cuda.pagelocked_empty(len(self.op.x), local.data.dtype)
        self.x_host[:] = self.op.x
        self.y_host = cuda.pagelocked_empty(local.nrows, local.data.dtype)
        self.x_dev = gpuarray.empty(len(self.op.x), local.data.dtype)
        self.y_dev = gpuarray.empty(max(local.nrows, 1), local.data.dtype)
        block = self.ctx.config["gpu.block_size"]
        self.block = (block, 1, 1)
        self.grid = ((local.nrows * self.tpr + block - 1) // block or 1, 1)
        self.n_rows = np.int32(local.nrows) if index_t == "int" else np.int64(local.nrows)

    def multiply(self, iterations):
        import pycuda.driver as cuda
        timer, stream = self.ctx.timer, self.stream
        with timer.phase("h2d", stream=stream):
            cuda.memcpy_htod_async(self.x_dev.gpudata, self.x_host, stream)
        with timer.phase("kernel", stream=stream):
            for _ in range(iterations):
                self.kernel.prepared_async_call(self.grid, self.block, stream, self.n_rows,
                                                self.indptr.gpudata, self.indices.gpudata,
                                                self.data.gpudata, self.x_dev.gpudata,
                                                self.y_dev.gpudata)
        with timer.phase("d2h", stream=stream):
            if len(self.y_host):
                cuda.memcpy_dtoh_async(self.y_host, self.y_dev.gpudata, stream)
            stream.synchronize()
        return np.array(self.y_host)

    def free(self):
        for name in ("indptr", "indices", "data", "x_dev", "y_dev"):
            array = getattr(self, name, None)
            if array is not None:
                array.gpudata.free()
                setattr(self, name, None)


OPERATION = SpMV
