"""SpTV on the rank's GPU: the fiber kernels of ``kernels_cu/sptv.cu`` over ``gpu.streams`` CUDA
streams, resident (the packed chunks uploaded once) or streaming (every chunk sent from pinned
host memory on every product). v is uploaded once and Y stays on the device across the products;
after them the operation reads it back (:meth:`FiberGpuEngine.values`) or only its checksums and
samples. See :mod:`hisparse.ops.sptv.op` for the plan."""
import time

import numpy as np

from ...errors import LayoutError
from ...arrays import host_array
from ...gpu import staged_download
from ...gpu import KernelTable, c_type, grid_1d, type_defines
from .. import GpuEngine
from .plan import ALIGN, CHECKSUM_BLOCKS, FIBERS_PER_GROUP, fiber_sigma, parse_bytes

#: The kernels: short fibers by bins, long-fiber segments, per-fiber segment sums (per chunk);
#: the split-fiber pieces added to their fibers (per product); Y's checksums (after the run).
KERNELS = KernelTable("sptv", ["sptv_fiber_groups", "sptv_segments", "sptv_long_finish",
                               "sptv_combine_split", "sptv_checksums"])

#: CUDA events per chunk: H2D start/end (streaming), kernels start/end.
CHUNK_EVENTS = 4

#: Bytes per piece when Y is read back through page-locked buffers after the products. Small:
#: pinning the two buffers costs more than the pieces' Python loop (measured: docs/ops/sptv.md,
#: "Y read back in 2 MiB pieces").
DOWNLOAD_PIECE_BYTES = 2 << 20


class FiberGpuEngine(GpuEngine):
    """Fiber kernels on the rank's GPU over ``gpu.streams`` streams.

    ``local`` is a :class:`~hisparse.ops.sptv.plan.RankBlock`. Every device buffer comes from
    ``self.arena``; ``device_bytes`` counts them as the plan does
    (:meth:`~hisparse.ops.sptv.plan.ChunkPlan.device_bytes`: at least ALIGN bytes each), the
    arena's ``peak_device_bytes`` adds its own rounding.
    """

    #: resident: the packed chunks stay on the device; streaming: sent on every product
    RESIDENT = True

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="sptv")
        self.resident = self.RESIDENT
        self.plan = None
        self.device_bytes = 0
        self.last_compute_seconds = 0.0
        self._buffers = []
        self.graphs = None  # chunk order -> the recorded product (a GraphCache, made on first use)

    def host_allocator(self):
        """Allocator of the plan's packed host buffer: page-locked, so copies run async."""
        import pycuda.driver as cuda
        return lambda nbytes, dtype: cuda.pagelocked_empty(nbytes, dtype)

    def upload(self, plan):
        """Load the kernels; allocate and fill v, Y, the split table and (resident) the packed
        chunks on the device."""
        import pycuda.driver as cuda
        ctx, fibers = self.ctx, self.local.fibers
        vector = np.ascontiguousarray(self.local.vector)
        self.plan = plan
        self.block_size = ctx.config["gpu.block_size"]
        if self.block_size % 32 or self.block_size > 1024:
            raise LayoutError(f"gpu.block_size = {self.block_size}: SpTV needs a multiple of 32 "
                              f"up to 1024")
        kernels = KERNELS.load(ctx, type_defines(
            fibers.values.dtype, self.local.pointer_dtype,
            FIBER_INDEX_T=c_type(fibers.fiber_index.dtype), BLOCK_SIZE=self.block_size,
            FIBERS_PER_GROUP=FIBERS_PER_GROUP))
        self.k_groups = kernels.sptv_fiber_groups
        self.k_segments = kernels.sptv_segments
        self.k_finish = kernels.sptv_long_finish
        self.k_combine = kernels.sptv_combine_split
        self.k_checksums = kernels.sptv_checksums
        self.value_dtype = np.dtype(fibers.values.dtype)
        self.itemsize = self.value_dtype.itemsize
        sizes = plan.device_buffers(self.resident, self.itemsize, vector.nbytes)
        self.v_dev = self._alloc(sizes["v"], "v")
        if vector.size:
            cuda.memcpy_htod(int(self.v_dev), vector)
        self.y_dev = self._alloc(sizes["Y"], "Y")
        split_fibers, split_slots = plan.split_table()
        self.nsplit = len(split_fibers)
        self.split_dev = self._alloc(sizes["split table"], "split table")
        if self.nsplit:
            table = np.concatenate([split_fibers, split_slots]).astype(plan.pointer_dtype)
            cuda.memcpy_htod(int(self.split_dev), table)
        self.checksum_dev = self._alloc(sizes["checksum partials"], "checksum partials")
        if self.resident:
            self.tensor_dev = self._alloc(sizes["packed chunks"], "packed chunks")
            if hasattr(plan.buffer, "get"):
                # Packed on the GPU (CuPy, same context): copy into the arena, drop CuPy's copy.
                cuda.Context.synchronize()
                if plan.nbytes:
                    cuda.memcpy_dtod(int(self.tensor_dev), int(plan.buffer.data.ptr), plan.nbytes)
                cuda.Context.synchronize()
                plan.buffer = None
            elif plan.nbytes:
                cuda.memcpy_htod(int(self.tensor_dev), plan.buffer[:plan.nbytes])
            self.partial_dev = self._alloc(sizes["segment partial sums"], "segment partial sums")
            seg_slots = np.cumsum([0] + [c.nseg for c in plan.chunks])
            self.segment_slot = {c.index: int(seg_slots[i]) for i, c in enumerate(plan.chunks)}
        self.chunk_events = {c.index: [cuda.Event() for _ in range(CHUNK_EVENTS)]
                             for c in plan.chunks}
        self.set_streams(ctx.config["gpu.streams"])

    def set_streams(self, count):
        """(Re)create ``count`` streams and, for streaming, one staging area per stream."""
        import pycuda.driver as cuda
        self._free_graphs()  # recorded on the old streams
        self.streams = [cuda.Stream() for _ in range(count)]
        no_timing = cuda.event_flags.DISABLE_TIMING
        self.stream_done = [cuda.Event(no_timing) for _ in range(count)]
        self.fork_event = cuda.Event(no_timing)
        self.start_event, self.combine_event, self.end_event = \
            cuda.Event(), cuda.Event(), cuda.Event()
        for buffer in getattr(self, "_stages", []):
            self._free_one(buffer)
        self._stages, self.stages = [], []
        if not self.resident:
            sizes = self.plan.stage_buffers(self.itemsize)
            for _ in range(count):
                stage = (self._alloc(sizes["chunk stage"], "chunk stage"),
                         self._alloc(sizes["segment partial sums stage"],
                                     "segment partial sums stage"))
                self._stages += list(stage)
                self.stages.append(stage)

    def _alloc(self, nbytes, what):
        """A device buffer from the arena, counted at least ALIGN bytes (as the plan counts)."""
        size = max(int(nbytes), ALIGN)
        buffer = self.arena.alloc(size, what)
        self._buffers.append((buffer, size))
        self.device_bytes += size
        return buffer

    def _free_one(self, buffer):
        for entry in self._buffers:
            if entry[0] is buffer:
                self._buffers.remove(entry)
                self.device_bytes -= entry[1]
                self.arena.free(buffer)
                return

    def _launch(self, chunk, stream, base, y_ptr, partial_ptr):
        """The kernels of one chunk whose packed arrays start at device address ``base``."""
        address = {name: np.uintp(base + offset) for name, (offset, _, _) in chunk.layout.items()}
        v = np.uintp(int(self.v_dev))
        if chunk.group_blocks:
            # ptr .. y: the kernel's FIBER_GROUP_PARAMS (kernels_cu/sptv.cu), in its order
            self.k_groups.prepared_async_call(
                (chunk.group_blocks, 1), (self.block_size, 1, 1), stream, np.int32(chunk.bins),
                address["table"], address["ptr"], address["ind"], address["val"],
                address["out_id"], v, y_ptr)
        if chunk.nseg:
            self.k_segments.prepared_async_call(
                (chunk.nseg, 1), (self.block_size, 1, 1), stream, np.int32(chunk.nseg),
                address["seg_lo"], address["seg_hi"], address["ind"], address["val"], v,
                partial_ptr)
            # One warp per long fiber.
            self.k_finish.prepared_async_call(
                grid_1d(chunk.nlong * 32, self.block_size), (self.block_size, 1, 1), stream,
                np.int32(chunk.nlong), address["long_fiber"], address["long_seg_ptr"],
                partial_ptr, y_ptr)

    def multiply(self, chunk_order):
        """Y = X x_n v into the device Y (no copy back: read it with :meth:`values`).

        Resident execution with ``gpu.graphs`` replays the product's launches as one CUDA graph
        (recorded at the first product of each chunk order, before its clock starts): phases
        ``kernel`` and ``compute`` then both hold the replay's device time, and ``combine`` is
        not timed apart. Otherwise every chunk's kernels are launched and timed by events."""
        plan, timer, streams = self.plan, self.ctx.timer, self.streams
        sequence = plan.sequence(chunk_order)
        graph = self._graph(chunk_order, sequence)
        wall_start = time.perf_counter()
        self.start_event.record(streams[0])
        if graph is not None:
            graph.launch(streams[0])
        else:
            self._issue(sequence, timed=True)
        self.end_event.record(streams[0])
        self.end_event.synchronize()
        wall = time.perf_counter() - wall_start
        # From the first kernel (or H2D) to the last write of Y, on the device.
        self.last_compute_seconds = self.end_event.time_since(self.start_event) * 1e-3
        if graph is not None:
            timer.add("kernel", gpu=self.last_compute_seconds)
        else:
            self._add_launch_phases(sequence)
        timer.add("compute", wall=wall, gpu=self.last_compute_seconds)

    def _add_launch_phases(self, sequence):
        """Phases of a product launched chunk by chunk: the chunks' kernel (and H2D) busy time,
        and the split fibers' combine."""
        timer = self.ctx.timer
        timer.add("kernel", gpu=self._busy_seconds(sequence, 2))
        if not self.resident:
            timer.add("h2d", gpu=self._busy_seconds(sequence, 0))
        timer.add("combine", gpu=self.end_event.time_since(self.combine_event) * 1e-3)

    def _graph(self, chunk_order, sequence):
        """The recorded product for ``chunk_order`` (recorded now if new), or None when products
        are launched directly (streaming, ``gpu.graphs`` off, or a failed recording)."""
        if not (self.resident and self.ctx.config["gpu.graphs"]):
            return None
        if self.graphs is None:
            from ...gpu import GraphCache
            self.graphs = GraphCache(self.ctx.log)
        return self.graphs.graph(chunk_order, self.streams[0],
                                 lambda: self._issue(sequence, timed=False),
                                 f"SpTV product ({chunk_order} order)")

    def _issue(self, sequence, timed):
        """Launch one product's work: the chunks round-robin over the streams (forked from and
        joined back into stream 0 by events), then the split fibers' pieces on stream 0.
        ``timed``: record the per-chunk events (not while recording a graph: there they would
        be dependencies, not clocks)."""
        import pycuda.driver as cuda
        plan, streams = self.plan, self.streams
        used = range(min(len(streams), len(sequence)))
        # Only streams that receive chunks fork from stream 0: each must join back (a stream
        # that joined a graph recording and is not joined back invalidates it).
        self.fork_event.record(streams[0])
        for s in used[1:]:
            streams[s].wait_for_event(self.fork_event)
        for position, chunk in enumerate(sequence):
            s = position % len(streams)
            stream, events = streams[s], self.chunk_events[chunk.index]
            if self.resident:
                base = int(self.tensor_dev) + chunk.offset
                partial_address = int(self.partial_dev) + \
                    self.segment_slot[chunk.index] * self.itemsize
            else:
                stage, partial_stage = self.stages[s]
                base, partial_address = int(stage), int(partial_stage)
                events[0].record(stream)
                cuda.memcpy_htod_async(base, plan.buffer[chunk.offset:chunk.offset + chunk.nbytes],
                                       stream)
                events[1].record(stream)
            if timed:
                events[2].record(stream)
            # The chunk writes Y from its first fiber on (see plan.build_chunk).
            y_address = int(self.y_dev) + chunk.fiber_first * self.itemsize
            self._launch(chunk, stream, base, np.uintp(y_address), np.uintp(partial_address))
            if timed:
                events[3].record(stream)
        # Stream 0 waits for every stream's last kernel, then adds the split fibers' pieces.
        for s in used[1:]:
            self.stream_done[s].record(streams[s])
            streams[0].wait_for_event(self.stream_done[s])
        if timed:
            self.combine_event.record(streams[0])
        if self.nsplit:
            self.k_combine.prepared_async_call(
                (1, 1), (1, 1, 1), streams[0], np.int32(self.nsplit),
                np.uintp(int(self.split_dev)), np.uintp(int(self.y_dev)))

    def _busy_seconds(self, sequence, start):
        """Seconds between chunk events ``start`` and ``start + 1``, summed over the chunks."""
        return sum(self.chunk_events[c.index][start + 1].time_since(
            self.chunk_events[c.index][start]) for c in sequence) * 1e-3

    # -- after the products: Y where it is ----------------------------------------------------
    def values(self):
        """This rank's Y values (one per local fiber, in stored order) as a host array, read
        back in pieces of :data:`DOWNLOAD_PIECE_BYTES` through two page-locked buffers (the copy
        of one piece overlaps the host copy of the one before)."""
        out = np.empty(self.plan.nfibers, self.value_dtype)
        staged_download(int(self.y_dev), out, self.streams[0], DOWNLOAD_PIECE_BYTES)
        return out

    def checksums(self):
        """``[sum of Y, sum of squares of Y]`` in float64, reduced on the device (one partial
        pair per block, added here)."""
        import pycuda.driver as cuda
        stream = self.streams[0]
        self.k_checksums.prepared_async_call(
            (CHECKSUM_BLOCKS, 1), (self.block_size, 1, 1), stream, np.int64(self.plan.nfibers),
            np.uintp(int(self.y_dev)), np.uintp(int(self.checksum_dev)))
        partial = np.empty(2 * CHECKSUM_BLOCKS, dtype=np.float64)
        stream.synchronize()
        cuda.memcpy_dtoh(partial, int(self.checksum_dev))
        return partial.reshape(-1, 2).sum(axis=0)

    def take(self, runs):
        """Y values of the fiber ranges ``runs`` (``[(start, stop), ...]``), concatenated."""
        import pycuda.driver as cuda
        out = np.empty(sum(stop - start for start, stop in runs), dtype=self.value_dtype)
        position = 0
        for start, stop in runs:
            cuda.memcpy_dtoh(out[position:position + stop - start],
                             int(self.y_dev) + start * self.itemsize)
            position += stop - start
        return out

    def bytes_moved(self):
        """Bytes over PCIe per streaming product on this rank: the packed chunks (v was
        uploaded once; Y stays on the device)."""
        return float(self.plan.nbytes)

    def sweep(self, repeats):
        """Re-time this rank's product for 1, 2, 4, 8 streams x both chunk orders (rank 0,
        after the timed run). Returns ``{"sweep_s{S}_{order}_ms": median ms}``."""
        timer = self.ctx.timer
        cap = parse_bytes(self.params["device_memory_cap"])
        configured = len(self.streams)
        enabled, timer.enabled = timer.enabled, False
        out = {}
        try:
            for count in (1, 2, 4, 8):
                if not self.resident and cap is not None and self.plan.device_bytes(
                        False, count, self.itemsize, self.local.vector.nbytes) > cap:
                    continue  # this many staging buffers would break the cap
                self.set_streams(count)
                for order in ("stored", "nnz_desc"):
                    self.multiply(order)
                    times = []
                    for _ in range(repeats):
                        self.multiply(order)
                        times.append(self.last_compute_seconds)
                    out[f"sweep_s{count}_{order}_ms"] = float(np.median(times)) * 1e3
        finally:
            self.set_streams(configured)
            timer.enabled = enabled
        return out

    def _free_graphs(self):
        if self.graphs is not None:
            self.graphs.free()

    def free(self):
        """Free device memory, and drop graphs, page-locked buffers, streams and events while
        the context is still current (the driver releases it right after teardown)."""
        self._free_graphs()
        for buffer, _ in self._buffers:
            self.arena.free(buffer)
        self._buffers, self._stages, self.stages = [], [], []
        self.device_bytes = 0
        super().free()  # the arena's cache back to the driver
        self.streams, self.stream_done, self.chunk_events = [], [], {}
        self.start_event = self.combine_event = self.end_event = self.fork_event = None
        if self.plan is not None:
            self.plan.buffer = None


class StreamingFiberGpuEngine(FiberGpuEngine):
    """The same kernels with nothing of X kept on the device: per chunk and stream, H2D of the
    packed chunk -> kernels -> D2H of its Y piece, through one staging area per stream."""

    RESIDENT = False


class Csr5FiberGpuEngine(FiberGpuEngine):
    """Resident execution with this rank's fibers as the rows of a CSR5 matrix (columns: the
    mode-n index), multiplied by v with SpMV's CSR5 kernels (``kernels_cu/spmv_csr5.cu``): one
    launch for the tiles and the tail, one for rows crossing tiles. Y is one entry per fiber in
    stored order, as with the fiber kernels.

    Why: a product is an SpMV of the fiber matrix, and CSR5's fixed nonzero span per warp keeps
    every warp's loads equal whatever the fiber lengths, which is faster than the fiber kernels
    on the nell-2-like tensor (docs/ops/sptv.md; ``jobs/sptv_csr5_experiment.py``). The
    chunk plan is still built (its layout sizes the rank's data for ``device_memory_cap`` and
    the report) but its packed buffer is dropped after upload.
    """

    def upload(self, plan):
        """v and Y on the device; the fibers as CSR (fiber pointers, mode-n indices, values;
        int32 or int64 as the pointer dtype says) converted to CSR5 on the GPU."""
        import pycuda.driver as cuda
        from ...gpu import CSR5_KERNELS, Csr5Device, csr5_defines
        ctx, fibers = self.ctx, self.local.fibers
        self.plan, self.resident = plan, True
        self.block_size = ctx.config["gpu.block_size"]
        index_dtype = np.dtype(self.local.pointer_dtype)
        self.value_dtype = np.dtype(fibers.values.dtype)
        self.itemsize = self.value_dtype.itemsize
        nfibers, nnz, ncols = fibers.nfibers, fibers.nnz, int(fibers.shape[fibers.mode])
        host = _ShapeOnly(_host_pointers(fibers.fiber_ptr, index_dtype), index_dtype,
                          self.value_dtype, (nfibers, ncols), nnz)
        self.sigma = self.params["sigma"] or fiber_sigma(nnz / max(nfibers, 1))
        narrow = self.params["narrow_columns"]
        self.kernels = CSR5_KERNELS.load(ctx, csr5_defines(host, self.sigma, narrow))
        self.streams = [cuda.Stream()]
        self.device = Csr5Device(self.kernels, host, self.sigma, self.streams[0], self.arena,
                                 narrow)
        self.column_index_bits = 8 * self.device.column_dtype.itemsize
        self.device.load()
        arena = self.arena
        indptr = _device_copy(arena, fibers.fiber_ptr, index_dtype, "fiber pointers")
        indices = _device_copy(arena, fibers.fiber_index, index_dtype, "fiber mode-n indices")
        values = _device_copy(arena, fibers.values, self.value_dtype, "fiber values")
        self.device.convert(indptr, indices, values)
        self.device_bytes = sum(int(a.nbytes) for a in self.device.arrays.values())
        vector = np.ascontiguousarray(self.local.vector, dtype=self.value_dtype)
        self.v = arena.to_device(vector, "v")
        self.y = arena.empty(max(nfibers, 1), self.value_dtype, "Y")
        self.y_dev = self.y.gpudata
        self.checksum_dev = self._alloc(2 * 8 * CHECKSUM_BLOCKS, "checksum partials")
        kernels = KERNELS.load(ctx, type_defines(
            self.value_dtype, index_dtype, FIBER_INDEX_T=c_type(index_dtype),
            BLOCK_SIZE=self.block_size, FIBERS_PER_GROUP=FIBERS_PER_GROUP))
        self.k_checksums = kernels.sptv_checksums
        self.device_bytes += int(self.v.nbytes + self.y.nbytes)
        self.nsplit = 0
        plan.buffer = None  # the packed chunks are not used
        self.set_streams(1)

    def set_streams(self, count):
        """One stream: the CSR5 product is two launches in order (``gpu.streams`` is moot)."""
        import pycuda.driver as cuda
        self._free_graphs()
        if not self.streams:
            self.streams = [cuda.Stream()]
        self.device.stream = self.streams[0]
        self.stream_done = [cuda.Event(cuda.event_flags.DISABLE_TIMING)]
        self.start_event, self.end_event = cuda.Event(), cuda.Event()
        self.fork_event = self.combine_event = None
        self._stages, self.stages = [], []

    def _issue(self, sequence, timed):
        self.device.multiply(self.v, self.y)

    def _add_launch_phases(self, sequence):
        self.ctx.timer.add("kernel", gpu=self.last_compute_seconds)

    def sweep(self, repeats):
        return {}  # streams and chunk orders do not apply

    def free(self):
        if getattr(self, "device", None) is not None:
            self.device.free()
            self.device = None
        self.v = self.y = None
        super().free()


class _ShapeOnly:
    """What :class:`Csr5Device` reads of the host matrix: the row pointers (O(1) look-ups),
    shape, nnz and dtypes; the column indices and values are only on the device."""

    def __init__(self, indptr, index_dtype, value_dtype, shape, nnz):
        self.indptr, self.shape, self.nnz = indptr, shape, nnz
        self.indices, self.data = np.zeros(0, index_dtype), np.zeros(0, value_dtype)


def _host_pointers(pointers, dtype):
    """The fiber pointers as a host array of ``dtype`` (copied back when built on the GPU)."""
    return np.asarray(host_array(pointers)).astype(dtype, copy=False)


def _device_copy(arena, array, dtype, what):
    """``array`` (NumPy, or CuPy on this device) as an arena GPUArray of ``dtype``."""
    if hasattr(array, "get"):  # CuPy: cast there, copy device to device
        import pycuda.driver as cuda
        cast = array.astype(dtype, copy=False)
        out = arena.empty(max(int(cast.size), 1), dtype, what)
        cuda.Context.synchronize()
        if cast.size:
            cuda.memcpy_dtod(out.gpudata, int(cast.data.ptr), int(cast.nbytes))
        cuda.Context.synchronize()
        return out
    return arena.to_device(np.ascontiguousarray(array, dtype=dtype), what)


#: execution (or kernel) -> engine
ENGINES = {"resident": FiberGpuEngine, "streaming": StreamingFiberGpuEngine,
           "csr5": Csr5FiberGpuEngine}
