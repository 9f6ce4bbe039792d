"""SpTV on the rank's GPU: the fiber kernels of ``kernels_cu/sptv.cu`` over ``gpu.streams`` CUDA
streams, resident (the packed chunks uploaded once) or streaming (every chunk sent from pinned
host memory on every product). See :mod:`hisparse.ops.sptv.op` for the plan."""
import time

import numpy as np

from ...errors import LayoutError
from ...gpu._kernels import KernelTable, c_type, grid_1d, type_defines
from .._base import GpuEngine
from .plan import ALIGN, FIBERS_PER_GROUP, combine_split_fibers, parse_bytes

#: The kernels of one chunk: short fibers by bins, long-fiber segments, per-fiber segment sums.
KERNELS = KernelTable("sptv", ["sptv_fiber_groups", "sptv_segments", "sptv_long_finish"])

#: CUDA events per chunk: H2D start/end, kernels start/end, D2H start/end.
CHUNK_EVENTS = 6


class FiberGpuEngine(GpuEngine):
    """Fiber kernels on the rank's GPU over ``gpu.streams`` streams.

    ``local`` is a :class:`~hisparse.ops.sptv.plan.RankBlock`. Every device buffer comes from
    ``self.arena``; ``device_bytes`` counts them as the plan does
    (:meth:`~hisparse.ops.sptv.plan.ChunkPlan.streaming_device_bytes`: at least ALIGN bytes
    each), the arena's ``peak_device_bytes`` adds its own rounding.
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

    def host_allocator(self):
        """Allocator of the plan's packed host buffer: page-locked, so copies run async."""
        import pycuda.driver as cuda
        return lambda nbytes, dtype: cuda.pagelocked_empty(nbytes, dtype)

    def upload(self, plan):
        """Load the kernels, allocate v, Y and (resident) the packed chunks on the device."""
        import pycuda.driver as cuda
        ctx, fibers, vector = self.ctx, self.local.fibers, self.local.vector
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
        self.itemsize = fibers.values.dtype.itemsize
        self.v_host = cuda.pagelocked_empty(len(vector), vector.dtype)
        self.v_host[:] = vector
        self.v_dev = self._alloc(vector.nbytes, "v")
        # Page-locked Y (one extra element: a rank may own no fiber); y_host is its used part.
        self.y_pinned = cuda.pagelocked_empty(fibers.nfibers + 1, fibers.values.dtype)
        self.y_host = self.y_pinned[:fibers.nfibers]
        self.side = cuda.pagelocked_empty(max(len(plan.chunks), 1), fibers.values.dtype)
        if self.resident:
            self.tensor_dev = self._alloc(plan.nbytes, "packed chunks")
            if plan.nbytes:
                cuda.memcpy_htod(int(self.tensor_dev), plan.buffer[:plan.nbytes])
            y_slots = np.cumsum([0] + [c.nfibers for c in plan.chunks])
            seg_slots = np.cumsum([0] + [c.nseg for c in plan.chunks])
            self.y_dev = self._alloc(int(y_slots[-1]) * self.itemsize, "Y")
            self.partial_dev = self._alloc(int(seg_slots[-1]) * self.itemsize,
                                           "segment partial sums")
            self.slots = {c.index: (int(y_slots[i]), int(seg_slots[i]))
                          for i, c in enumerate(plan.chunks)}
        self.chunk_events = {c.index: [cuda.Event() for _ in range(CHUNK_EVENTS)]
                             for c in plan.chunks}
        self.set_streams(ctx.config["gpu.streams"])

    def set_streams(self, count):
        """(Re)create ``count`` streams and, for streaming, one staging area per stream."""
        import pycuda.driver as cuda
        self.streams = [cuda.Stream() for _ in range(count)]
        self.stream_events = [(cuda.Event(), cuda.Event()) for _ in range(count)]
        self.start_event, self.v_event = cuda.Event(), cuda.Event()
        for buffer in getattr(self, "_stages", []):
            self._free_one(buffer)
        self._stages, self.stages = [], []
        if not self.resident:
            plan = self.plan
            for _ in range(count):
                stage = (self._alloc(plan.max_chunk_bytes, "chunk stage"),
                         self._alloc(plan.max_chunk_fibers * self.itemsize, "Y stage"),
                         self._alloc(plan.max_chunk_segments * self.itemsize,
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

    def _copy_back(self, chunk, stream, y_address):
        import pycuda.driver as cuda
        first, count = chunk.fiber_first, chunk.nfibers
        if chunk.continues:
            cuda.memcpy_dtoh_async(self.side[chunk.index:chunk.index + 1], y_address, stream)
            if count > 1:
                cuda.memcpy_dtoh_async(self.y_host[first + 1:first + count],
                                       y_address + self.itemsize, stream)
        else:
            cuda.memcpy_dtoh_async(self.y_host[first:first + count], y_address, stream)

    def multiply(self, chunk_order):
        """This rank's Y values (one per local fiber, in stored order, in page-locked memory)."""
        import pycuda.driver as cuda
        plan, timer = self.plan, self.ctx.timer
        streams = self.streams
        sequence = plan.sequence(chunk_order)
        wall_start = time.perf_counter()
        self.start_event.record(streams[0])
        cuda.memcpy_htod_async(int(self.v_dev), self.v_host, streams[0])
        self.v_event.record(streams[0])
        for stream in streams[1:]:
            stream.wait_for_event(self.v_event)
        used = set()
        for position, chunk in enumerate(sequence):
            s = position % len(streams)
            stream, events = streams[s], self.chunk_events[chunk.index]
            used.add(s)
            if self.resident:
                y_slot, seg_slot = self.slots[chunk.index]
                base = int(self.tensor_dev) + chunk.offset
                y_address = int(self.y_dev) + y_slot * self.itemsize
                partial_address = int(self.partial_dev) + seg_slot * self.itemsize
            else:
                stage, y_stage, partial_stage = self.stages[s]
                base, y_address, partial_address = int(stage), int(y_stage), int(partial_stage)
                events[0].record(stream)
                cuda.memcpy_htod_async(base, plan.buffer[chunk.offset:chunk.offset + chunk.nbytes],
                                       stream)
                events[1].record(stream)
            events[2].record(stream)
            self._launch(chunk, stream, base, np.uintp(y_address), np.uintp(partial_address))
            events[3].record(stream)
            if not self.resident:
                events[4].record(stream)
                self._copy_back(chunk, stream, y_address)
                events[5].record(stream)
        if self.resident:
            for s in used:
                self.stream_events[s][0].record(streams[s])
            for position, chunk in enumerate(sequence):
                s = position % len(streams)
                y_slot, _ = self.slots[chunk.index]
                events = self.chunk_events[chunk.index]
                events[4].record(streams[s])
                self._copy_back(chunk, streams[s], int(self.y_dev) + y_slot * self.itemsize)
                events[5].record(streams[s])
        for s in used or {0}:
            self.stream_events[s][1].record(streams[s])
        for stream in streams:
            stream.synchronize()
        wall = time.perf_counter() - wall_start
        pipeline = max(self.stream_events[s][1].time_since(self.start_event)
                       for s in used or {0}) * 1e-3
        kernel_busy = self._busy_seconds(sequence, 2)
        if self.resident:
            # Kernel-only time: from the start to the last stream's last kernel (the D2H of Y
            # is issued after every kernel of a stream).
            kernel_span = max((self.stream_events[s][0].time_since(self.start_event)
                               for s in used), default=0.0) * 1e-3
            self.last_compute_seconds = kernel_span
            h2d = self.v_event.time_since(self.start_event) * 1e-3
        else:
            h2d = self._busy_seconds(sequence, 0)
            # End to end: from the first copy of v to the last copy of Y.
            self.last_compute_seconds = pipeline
        d2h = self._busy_seconds(sequence, 4)
        with timer.phase("combine"):
            combine_split_fibers(plan, self.y_host, self.side)
        timer.add("h2d", gpu=h2d)
        timer.add("kernel", gpu=kernel_busy)
        timer.add("d2h", gpu=d2h)
        timer.add("compute", wall=wall, gpu=self.last_compute_seconds)
        return self.y_host

    def _busy_seconds(self, sequence, start):
        """Seconds between chunk events ``start`` and ``start + 1``, summed over the chunks."""
        return sum(self.chunk_events[c.index][start + 1].time_since(
            self.chunk_events[c.index][start]) for c in sequence) * 1e-3

    def bytes_moved(self):
        """Bytes over PCIe per streaming product on this rank: chunks in, Y out, v in."""
        return float(self.plan.nbytes + self.y_host.nbytes + self.v_host.nbytes)

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
                if not self.resident and cap is not None and self.plan.streaming_device_bytes(
                        count, self.itemsize, self.v_host.nbytes) > cap:
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

    def free(self):
        """Free device memory, and drop page-locked buffers, streams and events while the
        context is still current (the driver releases it right after teardown)."""
        for buffer, _ in self._buffers:
            self.arena.free(buffer)
        self._buffers, self._stages, self.stages = [], [], []
        super().free()  # the arena's cache back to the driver
        self.v_host = self.y_pinned = self.y_host = self.side = None
        self.streams, self.stream_events, self.chunk_events = [], [], {}
        self.start_event = self.v_event = None
        if self.plan is not None:
            self.plan.buffer = None


class StreamingFiberGpuEngine(FiberGpuEngine):
    """The same kernels with nothing of X kept on the device: per chunk and stream, H2D of the
    packed chunk -> kernels -> D2H of its Y piece, through one staging area per stream."""

    RESIDENT = False


#: execution -> engine
ENGINES = {"resident": FiberGpuEngine, "streaming": StreamingFiberGpuEngine}
