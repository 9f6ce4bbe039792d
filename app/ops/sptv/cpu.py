"""SpTV on the host: NumPy running the same chunk plan as the GPU engine (bins and segments
included), so the plan is exercised without a GPU."""
import time

import numpy as np

from .._base import Engine
from .plan import combine_split_fibers


class FiberCpuEngine(Engine):
    """NumPy on the host, running the same chunk plan as the GPU: per chunk, the bins' fibers by
    ``reduceat`` over P_f, the long fibers by segments and then per-fiber sums of segments.

    ``local`` is a :class:`~hisparse.ops.sptv.plan.RankBlock`. Resident and streaming execution
    are the same here: the tensor is always in host memory.
    """

    device_bytes = 0

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.plan = None
        self.last_compute_seconds = 0.0

    def host_allocator(self):
        """Allocator of the plan's packed host buffer."""
        return np.empty

    def upload(self, plan):
        """Take the chunk plan and allocate Y and the split-fiber partial sums."""
        fibers = self.local.fibers
        self.plan = plan
        self.y = np.full(fibers.nfibers, np.nan, dtype=fibers.values.dtype)
        self.side = np.zeros(max(len(plan.chunks), 1), dtype=self.y.dtype)

    def multiply(self, chunk_order):
        """This rank's Y values (one per local fiber, in stored order)."""
        plan, timer = self.plan, self.ctx.timer
        v = self.local.vector
        start = time.perf_counter()
        with timer.phase("kernel"):
            for chunk in plan.sequence(chunk_order):
                y_chunk = self._chunk_product(plan, chunk, v)
                first = chunk.fiber_first
                if chunk.continues:
                    self.side[chunk.index] = y_chunk[0]
                    self.y[first + 1:first + chunk.nfibers] = y_chunk[1:]
                else:
                    self.y[first:first + chunk.nfibers] = y_chunk
        with timer.phase("combine"):
            combine_split_fibers(plan, self.y, self.side)
        self.last_compute_seconds = time.perf_counter() - start
        timer.add("compute", wall=self.last_compute_seconds)
        return self.y

    @staticmethod
    def _chunk_product(plan, chunk, v):
        """One chunk's Y piece, following the GPU kernels on the bin layout."""
        view = lambda name: plan.view(chunk, name)  # noqa: E731
        products = view("val") * v[view("ind")]
        ptr = view("ptr").astype(np.intp)
        y = np.full(chunk.nfibers, np.nan, dtype=products.dtype)
        out_id = view("out_id")
        if len(out_id):
            # Short fibers occupy the first len(out_id) positions; each holds >= 1 nonzero.
            nshort = len(out_id)
            y[out_id] = np.add.reduceat(products[:ptr[nshort]], ptr[:nshort])
        if chunk.nlong:
            bounds = np.stack([view("seg_lo"), view("seg_hi")], axis=1).ravel().astype(np.intp)
            partial = np.add.reduceat(np.concatenate([products, [0]]), bounds)[::2]
            y[view("long_fiber")] = np.add.reduceat(partial, view("long_seg_ptr")[:-1])
        return y

    def bytes_moved(self):
        return 0

    def free(self):
        self.y = None
        super().free()


#: execution -> engine: both run the same host code
ENGINES = {"resident": FiberCpuEngine, "streaming": FiberCpuEngine}
