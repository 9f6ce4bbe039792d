"""SpMV engines on the rank's GPU (PyCUDA): the CSR-vector kernel (``kernels_cu/spmv_csr.cu``)
and CSR5 (``kernels_cu/spmv_csr5.cu``: conversion on the GPU once, then products on resident
data). The matrix block stays resident between repetitions; every device allocation goes through
the engine's arena, so the run records this rank's peak device bytes."""
import time

import numpy as np

from ...formats._csr5 import CSR5Matrix, OMEGA, calibration_chains, descriptor_layout, tail_unit
from ...gpu import KernelTable, grid_1d, index_scalar, type_defines
from .._base import GpuEngine
from .op import threads_per_row

CSR_KERNELS = KernelTable("spmv_csr", ["spmv_csr_vector"])
CSR5_KERNELS = KernelTable("spmv_csr5", [
    "csr5_tile_ptr", "csr5_tile_desc", "csr5_empty_offset", "csr5_mark_empty", "csr5_transpose",
    "csr5_spmv_tiles", "csr5_spmv_tail", "csr5_calibrate"])


def csr5_defines(matrix, sigma):
    """The ``-D`` macros of ``spmv_csr5.cu`` for ``matrix``'s dtypes and tile height ``sigma``."""
    return type_defines(matrix.data.dtype, matrix.indices.dtype, SIGMA=int(sigma))


class Csr5Device:
    """CSR5 on the current GPU: conversion from a resident CSR block and the product.

    Parameters
    ----------
    kernels : hisparse.gpu.Kernels
        :data:`CSR5_KERNELS` loaded with :func:`csr5_defines` of ``matrix`` and ``sigma``.
    matrix : CSRMatrix
        The host copy of the block (shape, dtypes and O(1) row-pointer look-ups only).
    sigma : int
    stream : pycuda.driver.Stream
    arena : hisparse.gpu.DeviceArena
        Where the format's device arrays are allocated.

    Notes
    -----
    Conversion runs on the GPU; the host only handles O(tiles) data: the per-tile flags, the
    exclusive scan giving ``offset_ptr`` and the calibration chains.
    """

    BLOCK = 256

    def __init__(self, kernels, matrix, sigma, stream, arena):
        self.matrix, self.sigma, self.stream, self.arena = matrix, int(sigma), stream, arena
        self.index_dtype, self.value_dtype = matrix.indices.dtype, matrix.data.dtype
        self.tile = OMEGA * self.sigma
        self.num_packet = descriptor_layout(self.sigma)[1]
        self.nnz, (self.m, self.n) = matrix.nnz, matrix.shape
        self.tiles = self.nnz // self.tile
        self.tail_start = self.tiles * self.tile
        self.kernels = kernels
        self.signatures = CSR5_KERNELS.signatures(csr5_defines(matrix, self.sigma))
        self.arrays = {}

    def _launch(self, name, threads, *args):
        # A zero-size GPUArray made outside an arena has no allocation (gpudata None): pass a
        # null pointer.
        args = [0 if arg is None else arg for arg in args]
        self.kernels[name].prepared_async_call(grid_1d(threads, self.BLOCK), (self.BLOCK, 1, 1),
                                               self.stream, *args)

    def load(self):
        """Launch every kernel once on empty work, so that the driver's lazy loading of the
        module's functions happens here and not inside the timed conversion."""
        for name in CSR5_KERNELS.names:
            args = [np.int64(0) if kind == "q" else 0 for kind in self.signatures[name]]
            self.kernels[name].prepared_async_call((1, 1), (32, 1, 1), self.stream, *args)
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
        p, m, q = self.tiles, self.m, np.int64
        arrays, stream, arena = self.arrays, self.stream, self.arena
        clock = [time.perf_counter()]
        arrays["indptr"], arrays["col"], arrays["val"] = indptr, indices, data
        tile_ptr = arrays["tile_ptr"] = arena.empty(p + 1, self.index_dtype, "csr5 tile_ptr")
        self._launch("csr5_tile_ptr", p + 1, q(p + 1), q(m), indptr.gpudata, tile_ptr.gpudata)
        seg_count = tile_info = None  # per-tile scratch, released at the end
        if p:
            tile_desc = arrays["tile_desc"] = arena.empty(p * self.num_packet * OMEGA, np.uint32,
                                                          "csr5 tile_desc")
            seg_count = arena.empty(p, np.int32, "csr5 segment counts")
            tile_info = arena.empty(p, np.uint8, "csr5 tile flags")
            self._launch("csr5_tile_desc", p * OMEGA, q(p), q(m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, seg_count.gpudata,
                         tile_info.gpudata)
            info_host = tile_info.get_async(stream=stream)
            segs_host = seg_count.get_async(stream=stream)
        else:  # everything is tail, in CSR order
            arrays["tile_desc"] = arena.zeros(1, np.uint32, "csr5 tile_desc")
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
        arrays["offset_ptr"] = arena.to_device(offset_ptr, "csr5 offset_ptr", stream=stream)
        arrays["empty_offset"] = arena.empty(max(self.n_offsets, 1), self.index_dtype,
                                             "csr5 empty_offset")
        if has_empty.any():
            self._launch("csr5_empty_offset", p * OMEGA, q(p), q(m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, tile_info.gpudata,
                         arrays["offset_ptr"].gpudata, arrays["empty_offset"].gpudata)
            self._launch("csr5_mark_empty", p, q(p), tile_info.gpudata, tile_ptr.gpudata)
        for name, values in zip(("chain_row", "chain_first", "chain_last"), chains):
            values = values.astype(self.index_dtype)
            arrays[name] = arena.to_device(values if len(values) else
                                           np.zeros(1, self.index_dtype), f"csr5 {name}",
                                           stream=stream)
        arrays["calibrator"] = arena.empty(p + 1, self.value_dtype, "csr5 calibrator")
        stream.synchronize()
        arena.release(seg_count, tile_info)
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
        """Give the format's device arrays back to the arena (including the CSR arrays handed to
        :meth:`convert`), except the GPUArrays in ``keep``."""
        kept = {id(array) for array in keep}
        for name, array in list(self.arrays.items()):
            if id(array) not in kept:
                self.arena.release(array)
            del self.arrays[name]


class CsrEngine(GpuEngine):
    """CSR-vector kernel on the rank's GPU; the matrix stays resident between repetitions."""

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="spmv")

    def upload(self):
        import pycuda.driver as cuda
        matrix = self.local.matrix
        lengths = np.diff(matrix.indptr)
        mean = float(lengths.mean()) if len(lengths) else 1.0
        self.tpr = self.params["threads_per_row"] or threads_per_row(mean)
        kernels = CSR_KERNELS.load(self.ctx, type_defines(matrix.data.dtype, matrix.indices.dtype,
                                                          THREADS_PER_ROW=self.tpr))
        self.kernel = kernels.spmv_csr_vector
        self.stream = cuda.Stream()
        self._upload_block()
        block = self.ctx.config["gpu.block_size"]
        self.block = (block, 1, 1)
        self.grid = grid_1d(matrix.nrows * self.tpr, block)
        self.n_rows = index_scalar(matrix.indices.dtype)(matrix.nrows)

    def _upload_block(self):
        """The CSR arrays to the device, and the x / y buffers (page-locked on the host, so the
        per-repetition copies are asynchronous on the engine's stream)."""
        import pycuda.driver as cuda
        matrix, x, arena = self.local.matrix, self.local.x, self.arena
        self.indptr = arena.to_device(matrix.indptr, "indptr")
        self.indices = arena.to_device(matrix.indices, "indices")
        self.data = arena.to_device(matrix.data, "values")
        self.x_host = cuda.pagelocked_empty(len(x), matrix.data.dtype)
        self.x_host[:] = x
        self.y_host = cuda.pagelocked_empty(matrix.nrows, matrix.data.dtype)
        self.x_dev = arena.empty(max(len(x), 1), matrix.data.dtype, "x")
        self.y_dev = arena.empty(max(matrix.nrows, 1), matrix.data.dtype, "y")

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
        self.indptr = self.indices = self.data = self.x_dev = self.y_dev = None
        super().free()


class Csr5Engine(CsrEngine):
    """CSR5 on the rank's GPU: the CSR block is uploaded, converted on the GPU once, in place
    (phase ``convert``), and the products run on resident data."""

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.sigma = local.sigma
        self.tiles = local.matrix.nnz // (OMEGA * self.sigma)
        self.device = None

    def upload(self):
        import pycuda.driver as cuda
        matrix = self.local.matrix
        kernels = CSR5_KERNELS.load(self.ctx, csr5_defines(matrix, self.sigma))
        self.stream = cuda.Stream()
        self.device = Csr5Device(kernels, matrix, self.sigma, self.stream, self.arena)
        self.device.load()
        self._upload_block()

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
        if self.device is not None:
            self.device.free()
        super().free()


ENGINES = {"csr": CsrEngine, "csr5": Csr5Engine}
