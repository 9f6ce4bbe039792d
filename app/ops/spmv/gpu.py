"""SpMV engines on the rank's GPU (PyCUDA): the local (or merged) block in CSR (CSR-vector kernel,
``kernels_cu/spmv_csr.cu``) or CSR5 (``kernels_cu/spmv_csr5.cu``: conversion on the GPU once, then
products on resident data); the ghost block in CSR5 (its product adding into the ghost rows) or
CSR-vector; the halo packing and the chain's normalisation with the small kernels of
``spmv_csr.cu``. x is one buffer, the owned entries and those the exchange brings (views of it,
laid out as :class:`~hisparse.ops.spmv.local.SpmvLocal` says). Everything stays resident between repetitions, y included;
every device allocation goes through the engine's arena, so the run records this rank's peak
device bytes.

Two streams: ``stream`` (compute: the products and the normalisation) and ``comm_stream``
(packing and the exchange of ghost entries), ordered by events only: a product's exchange starts
when x is final, its ghost block's product when the exchange is done. The steps are those of the
CPU engines (see ``cpu.py``); they only launch work, nothing waits on the host.
"""
import time

import numpy as np

from ...formats import OMEGA, CSRMatrix
from ...gpu import (CSR5_KERNELS, Csr5Device, KernelTable, background_work, csr5_defines,
                    grid_1d, index_scalar, type_defines)
from .. import GpuEngine
from .local import threads_per_row

CSR_KERNELS = KernelTable("spmv_csr", ["spmv_csr_vector"])
#: The ghost block's accumulate kernel and the vector kernels of a distributed product, compiled
#: with the ghost block's lanes per row.
HALO_KERNELS = KernelTable("spmv_csr", [
    "spmv_csr_vector", "gather_entries", "scale_sum_squares"])


def _view(array, offset, count):
    """``count`` entries of a 1-D GPUArray from ``offset`` on, as a GPUArray sharing its memory
    (made here: PyCUDA's slicing of a zero-length range has no pointer to pass a kernel)."""
    import pycuda.gpuarray as gpuarray
    return gpuarray.GPUArray((int(count),), array.dtype, base=array,
                             gpudata=int(array.gpudata) + int(offset) * array.dtype.itemsize)


class _GhostPart:
    """A ghost block (or one rank's part of it, when the exchange runs in rounds) on the device:
    its product adds into the rows ``rows`` of y from ``x_ghost``, in CSR5 (converted on the
    GPU in :meth:`convert`) when the run gives the ghost block a tile height, else CSR-vector.
    With ``fold`` it is the checkerboard's fold instead (``SpmvLocal.fold``): CSR-vector with
    values 1 from ``fold_buffer``, the partial sums the other ranks sent."""

    def __init__(self, engine, block, rows, fold=False):
        local, arena = engine.local, engine.arena
        self.engine, self.nrows = engine, int(block.nrows)
        self.source = "fold_buffer" if fold else "x_ghost"
        halo_index = local.ghost.indices.dtype
        if fold:  # the halo kernels' one index type; the value 1 (kept once for a uniform A)
            block = CSRMatrix(block.indptr.astype(halo_index), block.indices.astype(halo_index),
                              np.ones(1 if local.uniform is not None else block.nnz,
                                      dtype=block.data.dtype), block.shape)
        self.indptr = arena.to_device(block.indptr, "ghost indptr")
        self.indices = arena.to_device(block.indices, "ghost indices")
        self.data = arena.to_device(block.data if fold else engine._values_on_device(block),
                                    "ghost values")
        self.rows = arena.to_device(np.asarray(rows).astype(halo_index), "ghost rows")
        self.device = None
        if local.ghost_sigma and block.nnz and not fold:
            uniform = local.uniform
            kernels = CSR5_KERNELS.load(engine.ctx, csr5_defines(block, local.ghost_sigma,
                                                                 uniform=uniform is not None))
            self.device = Csr5Device(kernels, block, local.ghost_sigma, engine.stream, arena,
                                     uniform=uniform)
            self.device.load()

    def convert(self):
        if self.device is not None:
            self.device.convert(self.indptr, self.indices, self.data)
            # The CSR arrays became (in place) its CSR5 arrays.
            self.indptr = self.indices = self.data = None

    def multiply(self):
        """Launch y[rows] += part x_ghost (or the fold's sum) on the compute stream."""
        engine = self.engine
        source = getattr(engine, self.source)
        if self.device is not None:
            self.device.multiply(source, engine.y, rows=self.rows)
        elif self.nrows:
            tpr = engine.local.ghost_threads_per_row
            engine._launch(engine.halo_kernels.spmv_csr_vector, self.nrows * tpr, engine.stream,
                           engine.index_scalar(self.nrows), self.rows.gpudata,
                           self.indptr.gpudata, self.indices.gpudata, self.data.gpudata,
                           source.gpudata, engine.y.gpudata)

    def free(self):
        if self.device is not None:
            self.device.free()
            self.device = None
        self.indptr = self.indices = self.data = self.rows = None


class _DistributedEngine(GpuEngine):
    """The steps of a distributed product on the rank's GPU; subclasses place the local (or
    merged) block (:meth:`_load_local`, :meth:`_convert_local`) and multiply it
    (:meth:`_multiply`)."""

    #: threads per block of the reductions (a multiple of 32, at most 1024: ``block_sum``)
    REDUCE_THREADS = 256
    #: most blocks of the sum of squares' first pass (its second pass is one block)
    MAX_REDUCE_BLOCKS = 1024

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="spmv")
        self.stream = self.comm_stream = None

    def upload(self):
        """Kernels, streams, the blocks and the vectors on the device."""
        import pycuda.driver as cuda
        local, arena = self.local, self.arena
        matrix, ghost = local.matrix, local.ghost
        dtype = matrix.data.dtype
        self.stream, self.comm_stream = cuda.Stream(), cuda.Stream()
        no_timing = cuda.event_flags.DISABLE_TIMING
        self.x_final, self.ghosts_in = cuda.Event(no_timing), cuda.Event(no_timing)
        self.block_size = self.ctx.config["gpu.block_size"]
        halo_index = ghost.indices.dtype  # the ghost block's and the packing's index type
        self.index_scalar = index_scalar(halo_index)
        # A uniform A keeps its one value for the ghost block too (on a graph spread over
        # ranks the ghost block can hold most of a rank's entries).
        self.halo_kernels = HALO_KERNELS.load(self.ctx, type_defines(
            dtype, halo_index, THREADS_PER_ROW=local.ghost_threads_per_row,
            **self._uniform_defines()))
        self._load_local()
        self.indptr = arena.to_device(matrix.indptr, "indptr")
        self.indices = arena.to_device(matrix.indices, "indices")
        self.data = arena.to_device(self._values_on_device(matrix), "values")
        self.x0 = arena.to_device(local.x, "x (initial)")
        # One buffer for the owned entries of x and those the exchange brings (SpmvLocal).
        self.x_all = arena.empty(max(local.x_length, 1), dtype, "x")
        self.x = _view(self.x_all, local.x_offset, len(local.x))
        self.x_ghost = _view(self.x_all, local.ghost_offset, local.x_length - local.ghost_offset)
        self.y = arena.empty(max(matrix.nrows, 1), dtype, "y")
        # The whole ghost block, or its parts by source rank (the exchange in rounds), each
        # with an event its round records on the communication stream.
        parts = local.ghost_parts or [(ghost, local.ghost_rows)]
        self.ghost_parts = [_GhostPart(self, block, rows) for block, rows in parts]
        self.part_received = [cuda.Event(no_timing) for _ in self.ghost_parts]
        self.n_send = len(local.send_index)
        self.send_index = arena.to_device(local.send_index.astype(halo_index), "send index")
        self.send_buffer = arena.empty(max(self.n_send, 1), dtype, "halo send buffer")
        # The checkerboard's fold: the foreign rows' partial sums (the end of y) go out as they
        # lie; what comes back for the owned rows is added by a CSR-vector product with values 1.
        self.y_foreign = _view(self.y, local.n_rows, local.foreign_rows)
        self.fold_part = None
        if local.fold is not None:
            self.fold_buffer = arena.empty(max(local.fold.ncols, 1), dtype, "fold buffer")
            self.fold_part = _GhostPart(self, local.fold, local.fold_rows, fold=True)
        self.reduce_blocks = min(grid_1d(local.n_rows, self.REDUCE_THREADS)[0],
                                 self.MAX_REDUCE_BLOCKS)
        self.partials = arena.empty(self.reduce_blocks, dtype, "norm partial sums")
        self.blocks_done = arena.zeros(1, np.uint32, "norm blocks done")
        self.norm2 = arena.zeros(1, dtype, "squared norm")

    def convert(self):
        """CSR5 conversions on the GPU (the local block's in :class:`Csr5Engine`, the ghost
        block's with ``ghost_sigma``), phase ``convert``; returns the seconds they took (host
        wall clock, stream synced)."""
        with self.ctx.timer.phase("convert", stream=self.stream):
            start = time.perf_counter()
            self._convert_local()
            for part in self.ghost_parts:
                part.convert()
            seconds = time.perf_counter() - start
        return seconds

    def _convert_local(self):
        """Convert the local block (CSR-vector: nothing to do)."""

    def _load_local(self):
        """Load the local block's kernels."""
        raise NotImplementedError

    def _uniform_defines(self):
        """The macro that compiles the CSR-vector kernels (local and ghost block) for a uniform
        A (``SpmvLocal.uniform``), or none."""
        return {} if self.local.uniform is None else {"UNIFORM_VALUES": 1}

    def _values_on_device(self, block):
        """``block``'s values (the local or the ghost block) as the kernels read them: its
        values array, or the one value of a uniform A (the kernels are then compiled with
        ``UNIFORM_VALUES``)."""
        uniform = self.local.uniform
        return block.data if uniform is None else uniform

    def _launch(self, kernel, threads, stream, *args):
        block = self.block_size
        kernel.prepared_async_call(grid_1d(threads, block), (block, 1, 1), stream, *args)

    def start(self):
        """x = the initial x (a device copy on the compute stream)."""
        import pycuda.driver as cuda
        if self.x0.nbytes:
            cuda.memcpy_dtod_async(self.x.gpudata, self.x0.gpudata, self.x0.nbytes, self.stream)

    def begin_exchange(self):
        """The communication stream waits for the compute stream's work so far: x is final and
        the last ghost product has read the ghost buffer."""
        self.x_final.record(self.stream)
        self.comm_stream.wait_for_event(self.x_final)

    def pack(self):
        """Pack the entries of x the peers need (communication stream); returns the buffer."""
        if self.n_send:
            self._launch(self.halo_kernels.gather_entries, self.n_send, self.comm_stream,
                         np.int64(self.n_send), self.send_index.gpudata, self.x.gpudata,
                         self.send_buffer.gpudata)
        return self.send_buffer

    def end_exchange(self):
        """The compute stream waits for the exchange issued on the communication stream."""
        self.ghosts_in.record(self.comm_stream)
        self.stream.wait_for_event(self.ghosts_in)

    def part_done(self, index):
        """Mark on the communication stream that ghost part ``index``'s entries are in."""
        self.part_received[index].record(self.comm_stream)

    def add_ghost_part(self, index):
        """Launch ghost part ``index``'s product on the compute stream once its round is in.
        Later rounds are still moving: in a recorded graph they outrank it."""
        self.stream.wait_for_event(self.part_received[index])
        with self._background():
            self.ghost_parts[index].multiply()

    def _background(self):
        """The block's launches as background work of a recorded graph (hisparse.gpu's
        graphs), as ``gpu.graph_priorities`` says."""
        return background_work(self.stream, self.ctx.config["gpu.graph_priorities"])

    def multiply_local(self):
        """Launch the product that needs no received entries on the compute stream (it runs
        while the exchange does): y = A_local x, or nothing when the blocks are merged."""
        if not self.local.merged:
            with self._background():  # in a recorded graph the exchange beside it outranks it
                self._multiply(self.x)

    def add_ghost(self):
        """Launch the product that needs the received entries on the compute stream:
        y[ghost rows] += A_ghost x_ghost (CSR5 or CSR-vector), or y = A x_all when the blocks
        are merged."""
        if self.local.merged:
            self._multiply(self.x_all)
            return
        for part in self.ghost_parts:
            part.multiply()

    def _multiply(self, x):
        """Launch y = A x for the local (or merged) block, x on the device."""
        raise NotImplementedError

    def fold_values(self):
        """The foreign rows' partial sums (the end of y), what the fold sends."""
        return self.y_foreign

    def add_fold(self):
        """Launch y[fold rows] += the partial sums received (``fold_buffer``) on the compute
        stream, after :meth:`end_exchange`."""
        if self.fold_part is not None:
            self.fold_part.multiply()

    def next_x(self, scaled):
        """Launch the chain's step after a product (square A: x's local entries are y's):
        x = y / sqrt(norm2), norm2 being the previous x's all-reduced sum of squares (``scaled``;
        the first product of a chain takes x = y), then ``norm2`` = this rank's sum of the new
        x^2, all-reduced by the operation with the next product's exchange. One launch."""
        self.halo_kernels.scale_sum_squares.prepared_async_call(
            (self.reduce_blocks, 1), (self.REDUCE_THREADS, 1, 1), self.stream,
            np.int64(self.local.n_rows), np.int32(bool(scaled)), self.y.gpudata,
            self.x.gpudata, self.partials.gpudata, self.blocks_done.gpudata, self.norm2.gpudata)

    def result(self):
        """This rank's result, on the host (waits for the device): a chain's last y, which
        :meth:`next_x` left in x, or y."""
        return (self.x if self.local.chained else self.y).get()[:self.local.n_rows]

    def free(self):
        for part in (getattr(self, "ghost_parts", None) or []) + \
                [getattr(self, "fold_part", None)]:
            if part is not None:
                part.free()
        self.ghost_parts, self.fold_part = [], None
        self.x0 = self.x = self.x_all = self.y = self.x_ghost = self.send_buffer = None
        self.y_foreign = self.fold_buffer = None
        self.indptr = self.indices = self.data = None
        super().free()


class CsrEngine(_DistributedEngine):
    """CSR-vector kernel for the local block."""

    def _load_local(self):
        matrix = self.local.matrix
        lengths = np.diff(matrix.indptr)
        mean = float(lengths.mean()) if len(lengths) else 1.0
        self.tpr = self.params["threads_per_row"] or threads_per_row(mean)
        kernels = CSR_KERNELS.load(self.ctx, type_defines(matrix.data.dtype, matrix.indices.dtype,
                                                          THREADS_PER_ROW=self.tpr,
                                                          **self._uniform_defines()))
        self.kernel = kernels.spmv_csr_vector
        self.grid = grid_1d(matrix.nrows * self.tpr, self.block_size)
        self.n_rows = index_scalar(matrix.indices.dtype)(matrix.nrows)

    def _multiply(self, x):
        # rows = NULL: the plain product, y[r] = (A x)[r]
        self.kernel.prepared_async_call(self.grid, (self.block_size, 1, 1), self.stream,
                                        self.n_rows, np.intp(0), self.indptr.gpudata,
                                        self.indices.gpudata, self.data.gpudata, x.gpudata,
                                        self.y.gpudata)


class Csr5Engine(_DistributedEngine):
    """CSR5 for the local block: the CSR block is uploaded, converted on the GPU once, in place
    (phase ``convert``), and the products run on resident data."""

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.sigma = local.sigma
        self.tiles = local.matrix.nnz // (OMEGA * self.sigma)
        self.device = None

    def _load_local(self):
        matrix, uniform = self.local.matrix, self.local.uniform
        kernels = CSR5_KERNELS.load(self.ctx, csr5_defines(matrix, self.sigma,
                                                           uniform=uniform is not None))
        self.device = Csr5Device(kernels, matrix, self.sigma, self.stream, self.arena,
                                 uniform=uniform)
        self.device.load()

    def _convert_local(self):
        self.device.convert(self.indptr, self.indices, self.data)
        # The CSR arrays became (in place) the CSR5 arrays; the device object owns them now.
        self.indptr = self.indices = self.data = None

    def _multiply(self, x):
        self.device.multiply(x, self.y)

    def free(self):
        if self.device is not None:
            self.device.free()
        super().free()


ENGINES = {"csr": CsrEngine, "csr5": Csr5Engine}
