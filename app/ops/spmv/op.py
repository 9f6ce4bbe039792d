"""SpMV, y = A x, over row partitions of A, in CSR (CSR-vector kernel) or CSR5 format.

Plan: rank 0 partitions A's rows (nnz-balanced blocks by default, or row-modulo), scatters the row
blocks and broadcasts x. Each rank keeps its block resident on its GPU (uploaded once; for CSR5
converted on the GPU once, phase ``convert``), then every repetition copies x in, runs
``iterations`` products, copies its part of y out, and y is gathered to rank 0 in global row
order. Design notes: docs/ops/spmv.md.
"""
import time

import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError
from ...formats import CSRMatrix
from ...formats._csr5 import (CSR5Matrix, OMEGA, MAX_SIGMA, build_csr5, calibration_chains,
                             csr5_spmv, default_sigma, descriptor_layout, tail_unit)
from ...parallel import gather_arrays
from ...partition import partition_rows
from .._base import Operation
from .._vectors import make_vector, vector_spec_check


def _sigma_check(value):
    return None if 1 <= value <= MAX_SIGMA else f"must lie in [1, {MAX_SIGMA}]"


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
        "format": Setting(str, "csr", "Sparse format of the kernel.", choices=("csr", "csr5")),
        "iterations": Setting(int, 1, "Products per repetition on resident data.", check=positive),
        "x": Setting(str, "random", "'random', 'ones' or 'FILE.h5:/dataset'.", check=vector_spec_check),
        "threads_per_row": Setting(int, None, "CSR-vector lanes per row; null = from the mean "
                                              "row length.", nullable=True,
                                   choices=(1, 2, 4, 8, 16, 32)),
        "sigma": Setting(int, None, "CSR5 tile height (entries per lane, 1..32); null = the mean "
                                    "row length clamped to [16, 32].", nullable=True,
                         check=_sigma_check),
    }
    PARTITIONS = ("nnz_balanced", "row_modulo", "row_blocks")
    PEERS = ("scipy", "cusparse")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "upload": "transfer",
                    "convert": "setup"}
    REPEAT_PHASES = {"h2d": "transfer", "kernel": "compute", "d2h": "transfer", "gather": "communication"}
    COMPUTE_PHASES = ("kernel",)

    def setup(self, problem):
        ctx = self.ctx
        part, shared = self.distribute(problem)
        x = shared["x"]
        self.local = CSRMatrix(part["indptr"], part["indices"], part["data"],
                               (len(part["indptr"]) - 1, part["ncols"]))
        self.rows = part["rows"]
        self.x = x
        # CSR5's sigma follows the global mean row length, so every rank compiles the same kernel.
        totals = ctx.comm.allreduce(np.array([self.local.nnz, self.local.nrows], np.int64))
        self.mean_row_length = float(totals[0]) / max(int(totals[1]), 1)
        self.global_rows = part["nrows"]
        self.y_full = None
        engines = {("gpu", "csr"): _GpuCsrEngine, ("cpu", "csr"): _CpuCsrEngine,
                   ("gpu", "csr5"): _GpuCsr5Engine, ("cpu", "csr5"): _CpuCsr5Engine}
        self.engine = engines[(ctx.backend, self.params["format"])](self)
        with ctx.timer.phase("upload"):
            self.engine.upload()
        self.convert_seconds = 0.0
        if hasattr(self.engine, "convert"):
            self.convert_seconds = self.engine.convert()
        # The slowest rank's conversion is what a run waits for.
        self.convert_seconds_max = max(ctx.comm.allgather(self.convert_seconds))

    def partition(self, problem):
        ctx = self.ctx
        x = make_vector(self.params["x"], problem.ncols, problem.data.dtype,
                        ctx.config["run.seed"])
        plan = partition_rows(problem.indptr, ctx.size, self.strategy)
        parts = []
        for rows in plan.rows:
            block = (problem.row_block(int(rows[0]), int(rows[-1]) + 1) if plan.contiguous
                     else problem.rows(rows))
            parts.append({"indptr": block.indptr.astype(problem.indptr.dtype),
                          "indices": block.indices, "data": block.data, "rows": rows,
                          "ncols": problem.ncols, "nrows": problem.nrows})
        self.x_global = x
        return parts, {"x": x}

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

    def summary(self):
        """CSR5: sigma, tiles and the conversion cost in SpMV-equivalents (conversion time of the
        slowest rank over rank 0's median time of one product)."""
        if self.params["format"] != "csr5":
            return {}
        config = self.ctx.config
        wall, gpu = self.ctx.timer.arrays(config["run.repeats"])
        column = list(self.phases()).index("kernel")
        seconds = np.where(np.isnan(gpu[:, column]), wall[:, column], gpu[:, column])
        per_product = float(np.nanmedian(seconds)) / self.params["iterations"]
        return {"csr5_sigma": int(self.engine.sigma), "csr5_tiles_rank0": int(self.engine.tiles),
                "csr5_convert_seconds": float(self.convert_seconds_max),
                "csr5_spmv_seconds": per_product,
                "csr5_convert_spmv_equivalents": float(self.convert_seconds_max / per_product)
                if per_product > 0 else float("nan")}

    def rank_info(self):
        info = {"n_rows": int(self.local.nrows), "nnz": int(self.local.nnz),
                "bytes_h2d": int(self.x.nbytes), "bytes_d2h": int(self.local.nrows *
                                                                  self.x.itemsize)}
        if self.params["format"] == "csr5":
            info.update(csr5_sigma=int(self.engine.sigma), csr5_tiles=int(self.engine.tiles),
                        csr5_convert_seconds=float(self.convert_seconds))
            steps = getattr(getattr(self.engine, "device", None), "convert_steps", {})
            info.update({f"csr5_convert_{k}_seconds": float(v) for k, v in steps.items()})
        return info


def _cusparse_spmv(problem, x, repeats, iterations):
    """cuSPARSE CSR SpMV through CuPy, timed with CUDA events on the same device."""
    from ...gpu._blas import csr_to_cupy, import_cupy, release_pool, time_with_events
    cupy, _ = import_cupy("cusparse")
    matrix = csr_to_cupy(problem)
    x_dev = cupy.asarray(x)
    matrix @ x_dev  # warm-up: cuSPARSE buffer allocation and handle creation

    def products():
        for _ in range(iterations):
            matrix @ x_dev

    seconds = time_with_events(products, repeats)
    matrix = x_dev = None  # drop the device arrays before the pool is emptied
    release_pool()
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
        """x in, ``iterations`` products, y out (phases h2d, kernel, d2h); returns y."""
        import pycuda.driver as cuda
        timer, stream = self.ctx.timer, self.stream
        with timer.phase("h2d", stream=stream):
            if len(self.x_host):  # zero-size copies have null pointers that cannot be packed
                cuda.memcpy_htod_async(self.x_dev.gpudata, self.x_host, stream)
        with timer.phase("kernel", stream=stream):
            for _ in range(iterations):
                self.product()
        with timer.phase("d2h", stream=stream):
            if len(self.y_host):
                cuda.memcpy_dtoh_async(self.y_host, self.y_dev.gpudata, stream)
            stream.synchronize()
        return np.array(self.y_host)

    def product(self):
        """Launch one y = A x on the engine's stream."""
        self.kernel.prepared_async_call(self.grid, self.block, self.stream, self.n_rows,
                                        self.indptr.gpudata, self.indices.gpudata,
                                        self.data.gpudata, self.x_dev.gpudata, self.y_dev.gpudata)

    def free(self):
        for name in ("indptr", "indices", "data", "x_dev", "y_dev"):
            array = getattr(self, name, None)
            if array is not None:
                array.gpudata.free()
                setattr(self, name, None)


def _sigma_for(op):
    return op.params["sigma"] or default_sigma(op.mean_row_length)


class _CpuCsr5Engine:
    """CSR5 on the host: the NumPy builder and the NumPy CSR5 product (the format's reference)."""

    def __init__(self, op):
        self.op = op
        self.sigma = _sigma_for(op)
        self.tiles = 0

    def upload(self):
        pass

    def convert(self):
        """Build the CSR5 form of the local block; returns the seconds it took."""
        with self.op.ctx.timer.phase("convert"):
            start = time.perf_counter()
            self.matrix = build_csr5(self.op.local, self.sigma)
            seconds = time.perf_counter() - start
        self.tiles = self.matrix.num_tiles
        return seconds

    def multiply(self, iterations):
        with self.op.ctx.timer.phase("kernel"):
            for _ in range(iterations):
                y = csr5_spmv(self.matrix, self.op.x)
        return y

    def free(self):
        self.matrix = None


class Csr5Device:
    """CSR5 on the current GPU: conversion from a resident CSR block and the product.

    Parameters
    ----------
    module : pycuda.driver.Module
        ``kernels_cu/spmv_csr5.cu`` compiled with this ``sigma`` and the matrix's dtypes.
    matrix : CSRMatrix
        The host copy of the block (shape, dtypes and O(1) row-pointer look-ups only).
    sigma : int
    stream : pycuda.driver.Stream

    Notes
    -----
    Conversion runs on the GPU; the host only handles O(tiles) data: the per-tile flags, the
    exclusive scan giving ``offset_ptr`` and the calibration chains.
    """

    BLOCK = 256

    def __init__(self, module, matrix, sigma, stream):
        self.matrix, self.sigma, self.stream = matrix, int(sigma), stream
        self.index_dtype, self.value_dtype = matrix.indices.dtype, matrix.data.dtype
        self.tile = OMEGA * self.sigma
        self.num_packet = descriptor_layout(self.sigma)[1]
        self.nnz, (self.m, self.n) = matrix.nnz, matrix.shape
        self.tiles = self.nnz // self.tile
        self.tail_start = self.tiles * self.tile
        names = ("csr5_tile_ptr", "csr5_tile_desc", "csr5_empty_offset", "csr5_mark_empty",
                 "csr5_transpose", "csr5_spmv_tiles", "csr5_spmv_tail", "csr5_calibrate")
        signatures = ("qqPP", "qqPPPPP", "qqPPPPPP", "qPP", "qPP", "qPPPPPPPPPP",
                      "qqqqqPPPPPP", "qPPPPP")
        self.kernels, self.signatures = {}, dict(zip(names, signatures))
        for name, signature in self.signatures.items():
            self.kernels[name] = module.get_function(name)
            self.kernels[name].prepare(signature)
        self.arrays = {}

    def _grid(self, threads):
        return (max(1, (int(threads) + self.BLOCK - 1) // self.BLOCK), 1)

    def _launch(self, name, threads, *args):
        # A zero-size GPUArray has no allocation (gpudata None): pass a null pointer.
        args = [0 if arg is None else arg for arg in args]
        self.kernels[name].prepared_async_call(self._grid(threads), (self.BLOCK, 1, 1),
                                               self.stream, *args)

    def load(self):
        """Launch every kernel once on empty work, so that the driver's lazy loading of the
        module's functions happens here and not inside the timed conversion."""
        for name, function in self.kernels.items():
            args = [np.int64(0) if kind == "q" else 0 for kind in self.signatures[name]]
            function.prepared_async_call((1, 1), (32, 1, 1), self.stream, *args)
        self.stream.synchronize()

    def convert(self, indptr, indices, data):
        """Build CSR5 from the device CSR arrays (GPUArrays). ``indices`` and ``data`` are
        transposed in place and become the format's ``col_idx`` / ``val``; the format keeps
        references to all three. Synchronises the stream.

        ``self.convert_steps`` receives the wall seconds of the three steps: ``device`` (tile_ptr
        and descriptors on the GPU, per-tile flags copied back), ``host`` (offset_ptr scan and
        calibration chains, overlapping the GPU's in-place transpose) and ``finish`` (uploads,
        empty_offset map, waiting for the transpose).
        """
        import pycuda.gpuarray as gpuarray
        p, m, q = self.tiles, self.m, np.int64
        arrays, stream = self.arrays, self.stream
        clock = [time.perf_counter()]
        arrays["indptr"], arrays["col"], arrays["val"] = indptr, indices, data
        tile_ptr = arrays["tile_ptr"] = gpuarray.empty(p + 1, self.index_dtype)
        self._launch("csr5_tile_ptr", p + 1, q(p + 1), q(m), indptr.gpudata, tile_ptr.gpudata)
        if p:
            tile_desc = arrays["tile_desc"] = gpuarray.empty(p * self.num_packet * OMEGA,
                                                             np.uint32)
            seg_count = gpuarray.empty(p, np.int32)
            tile_info = gpuarray.empty(p, np.uint8)
            self._launch("csr5_tile_desc", p * OMEGA, q(p), q(m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, seg_count.gpudata,
                         tile_info.gpudata)
            info_host = tile_info.get_async(stream=stream)
            segs_host = seg_count.get_async(stream=stream)
        else:  # everything is tail, in CSR order
            arrays["tile_desc"] = gpuarray.zeros(1, np.uint32)
            info_host = np.zeros(0, np.uint8)
            segs_host = np.zeros(0, np.int32)
        rows_host = tile_ptr.get_async(stream=stream)
        stream.synchronize()
        clock.append(time.perf_counter())
        if p:  # runs while the host builds offset_ptr and the chains
            self._launch("csr5_transpose", p * self.BLOCK, q(p), indices.gpudata, data.gpudata)
        rows_host = rows_host.astype(np.int64)
        has_empty = (info_host & 4) != 0
        offset_ptr = np.zeros(p + 1, dtype=np.int64)
        np.cumsum(np.where(has_empty, segs_host, 0), out=offset_ptr[1:])
        self.tail_row = int(rows_host[-1])
        self.lead_rows = int(rows_host[0])
        tail = tail_unit(self.matrix.indptr, self.tail_row, self.tail_start, self.nnz)
        chains = calibration_chains((info_host & 1) != 0, (info_host & 2) != 0, rows_host, tail)
        self.n_chains = len(chains[0])
        self.n_offsets = int(offset_ptr[-1])
        clock.append(time.perf_counter())
        arrays["offset_ptr"] = gpuarray.to_gpu_async(offset_ptr, stream=stream)
        arrays["empty_offset"] = gpuarray.empty(max(self.n_offsets, 1), self.index_dtype)
        if has_empty.any():
            self._launch("csr5_empty_offset", p * OMEGA, q(p), q(m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, tile_info.gpudata,
                         arrays["offset_ptr"].gpudata, arrays["empty_offset"].gpudata)
            self._launch("csr5_mark_empty", p, q(p), tile_info.gpudata, tile_ptr.gpudata)
        for name, values in zip(("chain_row", "chain_first", "chain_last"), chains):
            values = values.astype(self.index_dtype)
            arrays[name] = gpuarray.to_gpu_async(values if len(values) else
                                                 np.zeros(1, self.index_dtype), stream=stream)
        arrays["calibrator"] = gpuarray.empty(p + 1, self.value_dtype)
        stream.synchronize()
        clock.append(time.perf_counter())
        self.convert_steps = dict(zip(("device", "host", "finish"), np.diff(clock)))

    def multiply(self, x, y):
        """y = A x on the stream (x, y: GPUArrays of the value dtype; y needs no zeroing)."""
        a, q = self.arrays, np.int64
        if self.tiles:
            self._launch("csr5_spmv_tiles", self.tiles * OMEGA, q(self.tiles),
                         a["tile_ptr"].gpudata, a["tile_desc"].gpudata, a["col"].gpudata,
                         a["val"].gpudata, a["offset_ptr"].gpudata, a["empty_offset"].gpudata,
                         a["indptr"].gpudata, x.gpudata, y.gpudata, a["calibrator"].gpudata)
        extra = self.lead_rows + (self.m - self.tail_row)
        if extra:
            self._launch("csr5_spmv_tail", extra, q(self.lead_rows), q(self.tail_row), q(self.m),
                         q(self.tail_start), q(self.tiles), a["indptr"].gpudata,
                         a["col"].gpudata, a["val"].gpudata, x.gpudata, y.gpudata,
                         a["calibrator"].gpudata)
        if self.n_chains:
            self._launch("csr5_calibrate", self.n_chains * OMEGA, q(self.n_chains),
                         a["chain_row"].gpudata, a["chain_first"].gpudata,
                         a["chain_last"].gpudata, a["calibrator"].gpudata, y.gpudata)

    def to_host(self):
        """The converted format as a :class:`CSR5Matrix` (for comparison with the NumPy
        builder)."""
        a, p = self.arrays, self.tiles
        n_chains = self.n_chains
        return CSR5Matrix(
            (self.m, self.n), self.sigma, OMEGA, self.matrix.indptr, a["col"].get(),
            a["val"].get(), a["tile_ptr"].get(),
            a["tile_desc"].get()[:p * self.num_packet * OMEGA].reshape(p, self.num_packet, OMEGA),
            a["offset_ptr"].get(), a["empty_offset"].get()[:self.n_offsets],
            a["chain_row"].get()[:n_chains], a["chain_first"].get()[:n_chains],
            a["chain_last"].get()[:n_chains])

    def free(self, keep=()):
        """Free the format's device arrays (including the CSR arrays handed to :meth:`convert`),
        except the GPUArrays in ``keep``."""
        kept = {id(array) for array in keep}
        for name, array in list(self.arrays.items()):
            if id(array) not in kept and array.gpudata is not None:  # None: zero-size array
                array.gpudata.free()
            del self.arrays[name]


class _GpuCsr5Engine(_GpuCsrEngine):
    """CSR5 on the rank's GPU: the CSR block is uploaded, converted on the GPU once, in place
    (phase ``convert``), and the products run on resident data."""

    def __init__(self, op):
        super().__init__(op)
        self.sigma = _sigma_for(op)
        self.tiles = op.local.nnz // (OMEGA * self.sigma)

    def upload(self):
        import pycuda.driver as cuda
        import pycuda.gpuarray as gpuarray
        local = self.op.local
        value_t = "double" if local.data.dtype == np.float64 else "float"
        index_t = "int" if local.indices.dtype == np.int32 else "long long"
        module = self.ctx.load_kernels("spmv_csr5", {"VALUE_T": value_t, "INDEX_T": index_t,
                                                     "SIGMA": self.sigma})
        self.stream = cuda.Stream()
        self.device = Csr5Device(module, local, self.sigma, self.stream)
        self.device.load()
        self.indptr = gpuarray.to_gpu(local.indptr)
        self.indices = gpuarray.to_gpu(local.indices)
        self.data = gpuarray.to_gpu(local.data)
        self.x_host = cuda.pagelocked_empty(len(self.op.x), local.data.dtype)
        self.x_host[:] = self.op.x
        self.y_host = cuda.pagelocked_empty(local.nrows, local.data.dtype)
        self.x_dev = gpuarray.empty(max(len(self.op.x), 1), local.data.dtype)
        self.y_dev = gpuarray.empty(max(local.nrows, 1), local.data.dtype)

    def convert(self):
        """Convert on the GPU; returns the seconds it took (host wall clock, stream synced)."""
        with self.ctx.timer.phase("convert", stream=self.stream):
            start = time.perf_counter()
            self.device.convert(self.indptr, self.indices, self.data)
            seconds = time.perf_counter() - start
        # The CSR arrays became (in place) the CSR5 arrays; the device object owns them now.
        self.indptr = self.indices = self.data = None
        return seconds

    def product(self):
        self.device.multiply(self.x_dev, self.y_dev)

    def free(self):
        device = getattr(self, "device", None)
        if device is not None:
            device.free()
        super().free()


OPERATION = SpMV
