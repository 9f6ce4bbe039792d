"""Multi-level SpTV, Y = X x_n v, for an N-order sparse tensor X and any mode n.

Y is the sparse (N-1)-order tensor of the non-empty mode-n fibers: one entry per fiber, the dot
product of the fiber with v. See docs/ops/sptv.md.

Plan (three levels of parallelism):

1. **Ranks** — rank 0 cuts every mode except n into a grid over the ranks, balancing nonzeros
   (:mod:`hisparse.partition._tensor`). A block holds whole fibers, so each rank owns a block of Y
   and no reduction is needed; v is broadcast, Y's values are gathered to rank 0 (its coordinates
   once, at setup, since they do not change between products).
2. **Chunks and streams** — each rank stores its block in the fiber-compressed format
   (:class:`~hisparse.formats._fiber.FiberTensor`) and cuts its nonzeros into ``chunks`` pieces of
   about equal nnz (at fiber starts where one is near, else inside a long fiber: the pieces of a
   split fiber are added on the host). Each chunk's fibers are laid out again by length bin and
   packed into one contiguous (pinned) host buffer: Val, Ind, P_f, the Y slot of each fiber, the
   bin table and the long-fiber segments.
   Chunks are issued in stored order or by decreasing nnz over ``gpu.streams`` CUDA streams:
   *streaming* execution sends every chunk from the host on every product (H2D -> kernels -> D2H
   per chunk, so copies overlap compute, and the device holds only ``streams`` chunk buffers:
   tensors larger than the GPU memory or ``device_memory_cap`` work); *resident* execution uploads
   the chunks once and each product only sends v and returns Y.
3. **Threads** — fibers are binned by length: 1..32 lanes per fiber (each lane group taking
   FIBERS_PER_GROUP fibers, loads issued together) for fibers up to LONG_FIBER nonzeros, one
   block per SEGMENT_NNZ-segment of longer fibers (kernels_cu/sptv.cu).

The code: :mod:`.plan` (chunk plan), :mod:`.cpu` and :mod:`.gpu` (engines, which take a rank's
block and return its Y values and never see a communicator), :mod:`.peers`; this module
composes them with the collectives of :mod:`hisparse.parallel`.
"""
import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError, InputError
from ...formats import COOTensor
from ...formats._fiber import FiberTensor, fiber_index_dtype
from ...parallel import AllReduce, all_call, gather_parts
from ...partition._tensor import TENSOR_STRATEGIES, partition_tensor
from .._base import Operation
from .._vectors import make_vector, vector_spec_check
from .peers import cusparse_peer, numpy_peer
from .plan import RankBlock, cap_check, fit_plan


class SpTV(Operation):
    """Y = X x_n v for a sparse N-order tensor X (fiber-compressed, N-1-dimensional grid)."""

    NAME = "sptv"
    INPUT_KIND = "tensor"
    PARAMS = {
        "mode": Setting(int, None, "Contracted mode n (0-based); null = the last mode.",
                        nullable=True, check=lambda v: None if v >= 0 else "must be >= 0"),
        "chunks": Setting(int, 8, "Chunks of balanced nnz per rank (P).", check=positive),
        "chunk_order": Setting(str, "nnz_desc", "Order chunks are issued in.",
                               choices=("stored", "nnz_desc")),
        "execution": Setting(str, "resident", "resident: tensor uploaded once; streaming: sent "
                                              "from the host on every product.",
                             choices=("resident", "streaming")),
        "device_memory_cap": Setting((int, str), None, "Device bytes streaming may use (e.g. "
                                                       "'256MiB'); chunks are added until it "
                                                       "fits. null = no cap.",
                                     nullable=True, check=cap_check),
        "vector": Setting(str, "random", "v: 'random', 'ones' or 'FILE.h5:/dataset'.",
                          check=vector_spec_check),
        "store_result": Setting(bool, True, "Write Y (coordinates and values) to /result."),
        "sweep": Setting(bool, False, "After the run, rank 0 re-times its part with 1, 2, 4, 8 "
                                      "streams and both chunk orders (GPU)."),
    }
    PARTITIONS = TENSOR_STRATEGIES
    PEERS = ("numpy", "cusparse_full", "cusparse_fibers")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "format": "setup",
                    "pack": "setup", "upload": "transfer"}
    # combine adds the pieces of split fibers on the host: local compute, no message.
    REPEAT_PHASES = {"h2d": "transfer", "kernel": "compute", "d2h": "transfer",
                     "compute": "compute", "combine": "compute", "gather": "communication"}
    COMPUTE_PHASES = ("compute",)
    DEFAULT_RTOL = {"fp64": 1e-11, "fp32": 1e-4}

    # -- setup --------------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        part, shared = self.distribute(problem)
        self.vector = shared["v"]
        self.mode, self.shape = part["mode"], tuple(part["shape"])
        with ctx.timer.phase("format"):
            local = FiberTensor.from_coo(COOTensor(part["indices"], part["values"], self.shape),
                                         self.mode, name=f"rank {ctx.rank} block")
        self.fibers = local
        part = None
        sum_over_ranks = AllReduce(ctx.comm, "sum")
        # Fiber coordinates do not change between products: gather them once.
        gathered = gather_parts(ctx.comm, {"coords": local.fiber_coords})
        if ctx.is_root:
            self.coords_global = np.concatenate([g["coords"] for g in gathered]) \
                if gathered else np.zeros((0, len(self.shape) - 1), dtype=np.int64)
        # Kernel types must agree on every rank (the kernel cache is shared per node).
        total_nnz = sum_over_ranks.scalar(local.nnz)
        wide = ctx.index_width == "int64" or total_nnz >= np.iinfo(np.int32).max
        self.pointer_dtype = np.dtype(np.int64 if wide else np.int32)
        self.engine = self.pick_engine(RankBlock(local, self.vector, self.pointer_dtype),
                                       self.params["execution"])
        with ctx.timer.phase("pack"):
            # A cap that one rank cannot meet stops every rank with the same message.
            self.plan = all_call(ctx.comm, fit_plan, local, self.params,
                                 ctx.config["gpu.streams"], ctx.config["gpu.block_size"],
                                 self.pointer_dtype, self.vector.nbytes,
                                 self.engine.host_allocator())
        with ctx.timer.phase("upload"):
            self.engine.upload(self.plan)
        totals = sum_over_ranks(np.array([self.plan.nbytes, local.nfibers, local.nnz],
                                         dtype=np.float64))
        self.global_plan_bytes, self.global_fibers = float(totals[0]), int(totals[1])
        self.y_full = None
        self.compute_seconds = []

    def partition(self, problem):
        """Rank 0: choose the grid, split the nonzeros, make v."""
        ctx = self.ctx
        order = problem.order
        mode = order - 1 if self.params["mode"] is None else self.params["mode"]
        if mode >= order:
            raise InputError(f"operation.params.mode = {mode}, but the tensor has order {order} "
                             f"(modes 0..{order - 1})")
        if order < 3:
            raise InputError(f"SpTV needs a tensor of order >= 3, got order {order}")
        self.vector_global = make_vector(self.params["vector"], problem.shape[mode],
                                         problem.values.dtype, ctx.config["run.seed"],
                                         name="vector", what=f"the size of mode {mode}")
        self.grid_plan = partition_tensor(problem.indices, problem.shape, mode, ctx.size,
                                          self.strategy)
        common = {"mode": mode, "shape": list(problem.shape), "grid": list(self.grid_plan.grid)}
        shared = {"v": self.vector_global}
        if ctx.size == 1:
            return [dict(common, indices=problem.indices, values=problem.values)], shared
        owner = self.grid_plan.part_of(problem.indices)
        order_by_rank = np.argsort(owner.astype(np.int16), kind="stable")
        starts = np.searchsorted(owner[order_by_rank], np.arange(ctx.size + 1))
        parts = []
        for rank in range(ctx.size):
            take = order_by_rank[starts[rank]:starts[rank + 1]]
            parts.append(dict(common, indices=problem.indices[take],
                              values=problem.values[take]))
        return parts, shared

    # -- repeats ------------------------------------------------------------------------------
    def run_once(self):
        y_local = self.engine.multiply(self.params["chunk_order"])
        if self.ctx.timer.enabled:
            self.compute_seconds.append(self.engine.last_compute_seconds)
        with self.ctx.timer.phase("gather"):
            if self.ctx.size == 1:
                self.y_full = y_local
            else:
                gathered = gather_parts(self.ctx.comm, {"y": y_local})
                if self.ctx.is_root:
                    self.y_full = np.concatenate([g["y"] for g in gathered])

    def teardown(self):
        self.engine.free()
        self.y_full = None

    # -- rank 0 -------------------------------------------------------------------------------
    def result(self):
        """``(coords, values)``: Y's fiber coordinates (nfibers, N-1) int64 and values, in rank
        order (each rank's fibers sorted lexicographically)."""
        return self.coords_global, np.array(self.y_full)

    def result_arrays(self, result):
        if not self.params["store_result"]:
            return {}
        coords, values = result
        return {"coords": coords, "values": values}

    def reference(self, problem):
        """Plain NumPy: key every nonzero by its coordinates outside mode n, sum value · v[i_n]
        per key. Returns ``(coords, values)`` sorted lexicographically, float64."""
        mode = self.mode
        other = [m for m in range(problem.order) if m != mode]
        dims = [problem.shape[m] for m in other]
        coords = problem.indices[:, other]
        products = problem.values.astype(np.float64) * \
            self.vector_global.astype(np.float64)[problem.indices[:, mode]]
        size = float(np.prod([float(d) for d in dims]))
        if size <= 5e8:
            # Dense accumulation over every fiber position: linear in nnz, no sort.
            keys = np.ravel_multi_index(tuple(coords.T), dims)
            present = np.flatnonzero(np.bincount(keys, minlength=int(size)))
            sums = np.bincount(keys, weights=products, minlength=int(size))[present]
            fiber_coords = np.stack(np.unravel_index(present, dims), axis=1).astype(np.int64)
            return fiber_coords.reshape(-1, len(other)), sums
        if size < 2.0 ** 62:
            keys = np.ravel_multi_index(tuple(coords.T), dims)
            unique, inverse = np.unique(keys, return_inverse=True)
            fiber_coords = np.stack(np.unravel_index(unique, dims), axis=1).astype(np.int64)
        else:
            fiber_coords, inverse = np.unique(coords, axis=0, return_inverse=True)
        sums = np.bincount(inverse.ravel(), weights=products, minlength=len(fiber_coords))
        return fiber_coords.reshape(-1, len(other)), sums

    def compare(self, result, reference):
        """Max-norm relative error of Y's values after matching fibers; inf when the sets of
        non-empty fibers differ."""
        coords, values = result
        ref_coords, ref_values = reference
        if coords.shape != ref_coords.shape:
            return float("inf")
        order = np.lexsort(coords.T[::-1]) if len(coords) else np.zeros(0, dtype=np.int64)
        if not np.array_equal(coords[order], ref_coords):
            return float("inf")
        return super().compare(values[order], ref_values)

    def work(self, problem):
        nnz = problem.nnz
        value = problem.values.dtype.itemsize
        index = fiber_index_dtype(problem.shape[self.mode]).itemsize
        vector_bytes = float(self.vector_global.nbytes)
        if self.params["execution"] == "streaming":
            # What crosses PCIe per product: every packed chunk, Y back, v.
            moved = self.global_plan_bytes + self.global_fibers * value + vector_bytes
        else:
            # What the kernels read and write: Val, Ind, P_f, the Y slots (out_id), Y, v.
            pointer = self.pointer_dtype.itemsize
            moved = nnz * (value + index) + self.global_fibers * (pointer + 4 + value) \
                + vector_bytes
        return {"flops": 2.0 * nnz, "bytes": float(moved)}

    def run_peer(self, name, problem, repeats):
        if name == "numpy":
            return numpy_peer(self._global_fibers(problem), self.vector_global, repeats)
        if name in ("cusparse_full", "cusparse_fibers"):
            return cusparse_peer(self._global_fibers(problem), self.vector_global, repeats,
                                 full=name == "cusparse_full")
        raise HisparseError(f"unknown peer {name}")

    def _global_fibers(self, problem):
        if self.ctx.size == 1:
            return self.fibers
        if getattr(self, "_fibers_all", None) is None:
            self._fibers_all = FiberTensor.from_coo(problem, self.mode)
        return self._fibers_all

    def summary(self):
        part = self.grid_plan
        attrs = {"sptv_mode": int(self.mode), "sptv_execution": self.params["execution"],
                 "sptv_chunk_order": self.params["chunk_order"],
                 "sptv_streams": int(self.ctx.config["gpu.streams"]),
                 "sptv_grid": "x".join(str(g) for g in part.grid),
                 "sptv_rank_nnz": ",".join(str(int(n)) for n in part.nnz_per_part),
                 "sptv_nnz_imbalance": part.imbalance,
                 "sptv_fibers": int(self.global_fibers),
                 "sptv_fibers_per_nnz": self.global_fibers / max(int(part.nnz_per_part.sum()), 1)}
        if self.ctx.backend == "gpu":
            from ..gpu._bandwidth import host_to_device_bandwidth
            bandwidth = host_to_device_bandwidth()
            attrs["h2d_pinned_bandwidth_gbs"] = bandwidth / 1e9
            if self.compute_seconds and self.params["execution"] == "streaming":
                # Rank 0's end-to-end streaming rate over the bytes it moved, vs pinned H2D.
                median = float(np.median(self.compute_seconds))
                moved = self.engine.bytes_moved()
                attrs["rank0_streaming_gbs"] = moved / median / 1e9
                attrs["rank0_streaming_fraction_of_h2d"] = moved / median / bandwidth
            if self.params["sweep"]:
                attrs.update(self.engine.sweep(self.ctx.config["run.repeats"]))
        return attrs

    def rank_info(self):
        plan, fibers = self.plan, self.fibers
        itemsize = fibers.values.dtype.itemsize
        return {"nnz": int(fibers.nnz), "n_fibers": int(fibers.nfibers),
                "chunks": len(plan.chunks), "tensor_bytes": int(plan.nbytes),
                "device_bytes": int(self.engine.device_bytes),
                "streaming_device_bytes": plan.streaming_device_bytes(
                    self.ctx.config["gpu.streams"], itemsize, self.vector.nbytes),
                "long_fibers": int(sum(c.nlong for c in plan.chunks)),
                "split_fibers": int(sum(c.continues for c in plan.chunks))}
