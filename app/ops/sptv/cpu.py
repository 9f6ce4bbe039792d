"""SpTV on the host: NumPy running the same chunk plan as the GPU engine (bins, segments and the
split-fiber slots of Y included), so the plan is exercised without a GPU."""
import time

import numpy as np

from .. import Engine
from .plan import combine_split_fibers


class FiberCpuEngine(Engine):
    """NumPy on the host, running the same chunk plan as the GPU: per chunk, the bins' fibers by
    ``reduceat`` over P_f, the long fibers by segments and then per-fiber sums of segments, each
    written into the rank's Y at the chunk's first fiber, as the kernels write it.

    ``local`` is a :class:`~hisparse.ops.sptv.plan.RankBlock`. Resident and streaming execution
    are the same here: the tensor is always in host memory.
    """

    device_bytes = 0

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params)
        self.plan = None
        self.y = None
        self.last_compute_seconds = 0.0

    def host_allocator(self):
        """Allocator of the plan's packed host buffer."""
        return np.empty

    def upload(self, plan):
        """Take the chunk plan and allocate Y (NaN, so a slot no chunk writes shows)."""
        self.plan = plan
        self.y = np.full(plan.y_length, np.nan, dtype=self.local.fibers.values.dtype)

    def multiply(self, chunk_order):
        """Y = X x_n v into this engine's Y (read it with :meth:`values`)."""
        plan, timer = self.plan, self.ctx.timer
        v = self.local.vector
        start = time.perf_counter()
        with timer.phase("kernel"):
            for chunk in plan.sequence(chunk_order):
                self._chunk_product(plan, chunk, v, self.y[chunk.fiber_first:])
        with timer.phase("combine"):
            combine_split_fibers(plan, self.y)
        self.last_compute_seconds = time.perf_counter() - start
        timer.add("compute", wall=self.last_compute_seconds)

    @staticmethod
    def _chunk_product(plan, chunk, v, y):
        """One chunk's results into ``y`` (Y from the chunk's first fiber on), following the
        GPU kernels on the bin layout."""
        view = lambda name: plan.view(chunk, name)  # noqa: E731
        products = view("val") * v[view("ind")]
        ptr = view("ptr").astype(np.intp)
        out_id = view("out_id")
        if len(out_id):
            # Short fibers occupy the first len(out_id) positions; each holds >= 1 nonzero.
            nshort = len(out_id)
            y[out_id] = np.add.reduceat(products[:ptr[nshort]], ptr[:nshort])
        if chunk.nlong:
            bounds = np.stack([view("seg_lo"), view("seg_hi")], axis=1).ravel().astype(np.intp)
            partial = np.add.reduceat(np.concatenate([products, [0]]), bounds)[::2]
            y[view("long_fiber")] = np.add.reduceat(partial, view("long_seg_ptr")[:-1])

    # -- after the products: Y where it is ----------------------------------------------------
    def values(self):
        """This rank's Y values (one per local fiber, in stored order)."""
        return self.y[:self.plan.nfibers]

    def checksums(self):
        """``[sum of Y, sum of squares of Y]`` in float64."""
        y = self.values().astype(np.float64)
        return np.array([y.sum(), np.dot(y, y)])

    def take(self, runs):
        """Y values of the fiber ranges ``runs`` (``[(start, stop), ...]``), concatenated."""
        y = self.values()
        return np.concatenate([y[start:stop] for start, stop in runs] or [y[:0]])

    def bytes_moved(self):
        return 0

    def free(self):
        self.y = None
        super().free()


#: execution (or kernel) -> engine: all run the same host code
ENGINES = {"resident": FiberCpuEngine, "streaming": FiberCpuEngine, "csr5": FiberCpuEngine}
