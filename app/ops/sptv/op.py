"""Multi-level SpTV, Y = X x_n v, for an N-order sparse tensor X and any mode n.

Y is the sparse (N-1)-order tensor of the non-empty mode-n fibers: one entry per fiber, the dot
product of the fiber with v. See docs/ops/sptv.md.

Plan (three levels of parallelism):

1. **Ranks** — every mode except n is cut into a grid over the ranks, balancing nonzeros
   (:mod:`hisparse.partition._tensor`). The tensor is read by parts (a ``TensorGridLayout``): each
   rank reads a slice of the file's nonzeros or generates a range of fibers (with CuPy on its GPU
   for resident execution), the grid is cut from the ranks' summed histograms and the nonzeros
   move to their owners in one all-to-all (:class:`hisparse.layout.TensorGridLayout`). A block holds
   whole fibers, so each rank owns a block of Y and no reduction is needed: a product is the
   ranks' engines alone, no message. v is made on every rank from the seed; Y stays where the
   engine wrote it (on the GPU) across the products, and :meth:`SpTV.collect` gathers it to
   rank 0 once after them (or only its checksums and samples, ``output.collect``).
2. **Chunks and streams** — each rank stores its block in the fiber-compressed format
   (:class:`~hisparse.formats._fiber.FiberTensor`) and cuts its nonzeros into ``chunks`` pieces of
   about equal nnz (at fiber starts where one is near, else inside a long fiber: the pieces of a
   split fiber are added after the chunks, on the device). Each chunk's fibers are laid out again
   by length bin and packed into one contiguous buffer: Val, Ind, P_f, the Y slot of each fiber,
   the bin table and the long-fiber segments. For resident execution on the GPU the format and
   this plan are built on the device from the uploaded COO (CuPy sorts and scans); otherwise on
   the host, into page-locked memory.
   Chunks are issued in stored order or by decreasing nnz over ``gpu.streams`` CUDA streams:
   *streaming* execution sends every chunk from the host on every product (H2D -> kernels per
   chunk, so copies overlap compute, and the device holds v, Y and only ``streams`` chunk
   buffers: tensors larger than the GPU memory or ``device_memory_cap`` work); *resident*
   execution uploads the chunks once and each product is kernels only.
3. **Threads** — fibers are binned by length: 1..32 lanes per fiber (each lane group taking
   FIBERS_PER_GROUP fibers, loads issued together) for fibers up to LONG_FIBER nonzeros, one
   block per SEGMENT_NNZ-segment of longer fibers (kernels_cu/sptv.cu).

The code: :mod:`.plan` (chunk plan), :mod:`.cpu` and :mod:`.gpu` (engines, which take a rank's
block, keep its Y and never see a communicator), :mod:`.peers`, :mod:`.reference` (the
verification's Y); this module composes them with
the collectives of :mod:`hisparse.parallel` (used only at setup and in :meth:`SpTV.collect`).
"""
from dataclasses import dataclass

import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError, InputError, same_on_every_rank
from ...formats import COOTensor
from ...formats import (FiberTensor, fiber_index_dtype, fibers_by_sort, sigma_check,
                        sortable)
from ...arrays import host_array, in_module
from ...layout import TensorGridLayout, TensorProblem
from ...parallel import AllReduce, all_call, gather_parts
from ...partition import TENSOR_STRATEGIES, partition_tensor, split_by_owner
from .. import Operation, make_vector, vector_spec_check
from .peers import cusparse_peer, numpy_peer
from .plan import RankBlock, cap_check, fit_plan
from .reference import fiber_sums, lexicographic_order, rows_in


class SpTV(Operation):
    """Y = X x_n v for a sparse N-order tensor X (fiber-compressed, N-1-dimensional grid)."""

    GATHERS_RESULT = True
    WRITES_PARTS = True
    NAME = "sptv"
    INPUT_KIND = "tensor"
    #: ``format_on: auto`` builds on the device from this many nonzeros per rank. Below it
    #: CuPy's start-up in the process (its import, and SciPy's that its first array-scalar
    #: operation makes) costs more than NumPy's work on the host (measured: docs/ops/sptv.md,
    #: "Small tensors build on the host").
    DEVICE_FORMAT_MIN_NNZ = 2_000_000
    PARAMS = {
        "mode": Setting(int, None, "Contracted mode n (0-based); null = the last mode.",
                        nullable=True, check=lambda v: None if v >= 0 else "must be >= 0"),
        "chunks": Setting(int, 8, "Chunks of balanced nnz per rank (P).", check=positive),
        "chunk_order": Setting(str, "nnz_desc", "Order chunks are issued in.",
                               choices=("stored", "nnz_desc")),
        "execution": Setting(str, "resident", "resident: tensor uploaded once; streaming: sent "
                                              "from the host on every product.",
                             choices=("resident", "streaming")),
        "kernel": Setting(str, "fibers", "Product kernel of resident execution on the GPU: "
                                         "fibers (the multi-level fiber kernels over chunks and "
                                         "streams) or csr5 (the fibers as rows of a CSR5 matrix,"
                                         " SpMV's kernels: one fixed nonzero span per warp).",
                          choices=("fibers", "csr5")),
        "sigma": Setting(int, None, "CSR5 tile height of kernel: csr5 (entries per lane, "
                                    "1..32); null = the mean fiber length rounded up, clamped "
                                    "to [8, 32].",
                         nullable=True, check=sigma_check),
        "narrow_columns": Setting(bool, None, "kernel: csr5 reads the mode-n indices as 16-bit "
                                              "integers (a third less traffic per product on "
                                              "short fibers); null = when mode n has at most "
                                              "65,536 entries.", nullable=True),
        "device_memory_cap": Setting((int, str), None, "Device bytes streaming may use (e.g. "
                                                       "'256MiB'); chunks are added until it "
                                                       "fits. null = no cap.",
                                     nullable=True, check=cap_check),
        "vector": Setting(str, "random", "v: 'random', 'ones' or 'FILE.h5:/dataset'.",
                          check=vector_spec_check, path=True),
        "store_result": Setting(bool, True, "Write Y (coordinates and values) to /result."),
        "sweep": Setting(bool, False, "After the run, rank 0 re-times its part with 1, 2, 4, 8 "
                                      "streams and both chunk orders (GPU)."),
        "format_on": Setting(str, "auto", "Where resident execution on the GPU makes a generated "
                                          "tensor and builds its fiber format: device (CuPy), "
                                          "host (NumPy), or auto = device from "
                                          f"{DEVICE_FORMAT_MIN_NNZ:,} nonzeros per rank "
                                          "(CuPy's start-up costs more than the host's work "
                                          "below).",
                             choices=("auto", "device", "host")),
    }
    PARTITIONS = TENSOR_STRATEGIES
    PEERS = ("numpy", "cusparse_full", "cusparse_fibers")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "format": "setup",
                    "pack": "setup", "upload": "transfer"}
    # A product is `compute`: the engine's kernels, and the additions of split fibers' pieces,
    # with Y left where they wrote it (no copy back, no message). `kernel` (busy time summed
    # over chunks and streams), streaming's `h2d` and `combine` are parts of it.
    REPEAT_PHASES = {"h2d": "detail", "kernel": "detail", "combine": "detail",
                     "compute": "compute"}
    COMPUTE_PHASES = ("compute",)
    #: ``output.collect``: ``gather`` Y to rank 0, or leave it on the
    #: ranks (``parts``: read back to each rank's host; ``none``: where it is) and verify by
    #: checksums and samples.
    COLLECT_MODES = ("gather", "parts", "none")
    DEFAULT_RTOL = {"fp64": 1e-11, "fp32": 1e-4}
    # Its collectives move host buffers (a scalar, the checksums, the gathered parts; the
    # nonzeros' routing stays on the host: on NCCL it cost more than it saved), so auto picks
    # the MPI transport and no NCCL communicator is made.
    DEVICE_COLLECTIVES = False

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """The default (the rank's nonzeros) and the vector v, whole on every rank."""
        estimate = super().estimate_memory(config, header, nranks)
        order = len(header.shape)
        mode = config["operation.params.mode"]
        mode = order - 1 if mode is None or mode >= order else mode
        return estimate.add("operation.params.vector", header.shape[mode] * header.value_bytes)

    # -- setup --------------------------------------------------------------------------------
    def layout(self):
        """Every rank reads a slice of the tensor (generated with :meth:`input_module`) and the
        grid of the contracted mode (:meth:`fiber_mode`) is cut collectively."""
        return TensorGridLayout(self.strategy, self.fiber_mode, self.input_module)

    def setup(self, problem):
        ctx = self.ctx
        part, shared = self.distribute(problem)
        if isinstance(problem, TensorProblem):
            self.grid_plan = problem.grid
        self.vector = shared["v"]
        self.mode, self.shape = part["mode"], tuple(part["shape"])
        sum_over_ranks = AllReduce(ctx.transport, "sum")
        # Kernel types must agree on every rank (the kernel cache is shared per node).
        total_nnz = self.global_nnz = sum_over_ranks.scalar(len(part["values"]))
        wide = ctx.index_width == "int64" or total_nnz >= np.iinfo(np.int32).max
        self.pointer_dtype = np.dtype(np.int64 if wide else np.int32)
        block = RankBlock(None, self.vector, self.pointer_dtype)
        self.engine = self.pick_engine(block, self._engine_variant())
        xp = self._device_module()
        local, xp = self._format(part, xp)
        block.fibers, part = local, None
        with ctx.timer.phase("pack"):
            # A cap that one rank cannot meet stops every rank with the same message.
            self.plan = all_call(ctx.comm, fit_plan, local, self.params,
                                 ctx.config["gpu.streams"], ctx.config["gpu.block_size"],
                                 self.pointer_dtype, self.vector.nbytes,
                                 self.engine.host_allocator() if xp is np else None, xp)
            _synchronize(xp)
        with ctx.timer.phase("upload"):
            self.engine.upload(self.plan)
            # What stays of the format: the fibers' coordinates, on the host (for collect).
            self.fiber_coords = host_array(local.fiber_coords)
        self.nfibers, self.nnz = local.nfibers, local.nnz
        self.value_dtype = np.dtype(local.values.dtype)
        self.format_on = "host" if xp is np else "device"
        self.fibers = local if xp is np else None
        if xp is not np:  # the device copies of the COO, fibers and plan: back to the driver
            block.fibers = local = None
            from ...gpu import release_pool
            release_pool()
        totals = sum_over_ranks(np.array([self.plan.nbytes, self.nfibers, self.nnz],
                                         dtype=np.float64))
        self.global_plan_bytes, self.global_fibers = float(totals[0]), int(totals[1])
        self.coords_global = self.y_full = self.y_local = self.checks = None
        self.compute_seconds = []

    def input_module(self):
        """CuPy when a generated tensor is to be made on this rank's GPU, where its format will
        be built (:meth:`_format_module`, by the spec's count): the COO then never crosses PCIe at
        one rank. NumPy otherwise, and for a file (read on the host; :meth:`_device_module`
        places its format once its count is known)."""
        spec = self.ctx.config["input.generate"]
        return np if spec is None else self._format_module(spec.get("nnz"))

    @classmethod
    def _formats_on_device(cls, params, backend, nranks, nnz):
        """Whether the GPU backend's resident execution builds the format on the device:
        ``format_on`` device, or auto with at least :attr:`DEVICE_FORMAT_MIN_NNZ` nonzeros per
        rank in ``nnz`` (None: not known yet, counts as large)."""
        if backend != "gpu" or params["execution"] != "resident":
            return False
        place = params["format_on"]
        if place == "host":
            return False
        return not (place == "auto" and nnz is not None and
                    int(nnz) < cls.DEVICE_FORMAT_MIN_NNZ * nranks)

    @classmethod
    def modules_for_setup(cls, config, nranks):
        """CuPy where the format will be built on the device: a generated tensor by its spec's
        count, a file only with ``format_on: device`` (auto waits for the count read)."""
        params, spec = config["operation.params"], config["input.generate"]
        if spec is None and params["format_on"] != "device":
            return ()
        nnz = None if spec is None else spec.get("nnz")
        return ("cupy",) if cls._formats_on_device(params, "gpu", nranks, nnz) else ()

    def _format_module(self, nnz):
        """CuPy when the format is built on the device (:meth:`_formats_on_device`) and CuPy is
        importable; NumPy otherwise."""
        if not self._formats_on_device(self.params, self.ctx.backend, self.ctx.size, nnz):
            return np
        from ...gpu import optional_cupy
        return optional_cupy("the SpTV input on the GPU") or np

    def _engine_variant(self):
        """``execution``, or ``csr5`` for the CSR5 kernel (resident execution only)."""
        if self.params["kernel"] != "csr5":
            return self.params["execution"]
        if self.params["execution"] != "resident":
            with same_on_every_rank():  # every rank reads the same config here
                raise HisparseError("operation.params.kernel: csr5 needs operation.params."
                                    "execution: resident (the CSR5 format is built once on the "
                                    "device)")
        return "csr5"

    def _device_module(self):
        """CuPy when this rank builds its fiber format and chunk plan on its GPU, else NumPy
        (streaming packs into page-locked host memory: the tensor may not fit the GPU). Where a
        generated tensor was made (:meth:`input_module`; its merged count may fall either side of
        the threshold its spec's did), else by the count read; and the fiber keys within int64."""
        if not sortable(self.shape, self.mode):
            return np
        if self.ctx.config["input.generate"] is not None:
            return self.input_module()
        return self._format_module(self.global_nnz)

    def _format(self, part, xp):
        """``(FiberTensor, xp)``: this rank's block by fibers, built with ``xp`` (CuPy: the COO
        is uploaded, phase ``upload``, then sorted on the GPU, phase ``format``) or on the host by
        :meth:`FiberTensor.from_coo`."""
        timer = self.ctx.timer
        if xp is not np:
            with timer.phase("upload"):  # nothing to copy when the COO was made on the device
                indices, values = in_module(xp, part["indices"]), in_module(xp, part["values"])
                _synchronize(xp)
            with timer.phase("format"):
                fibers = fibers_by_sort(xp, indices, values, self.shape, self.mode)
                _synchronize(xp)
            return fibers, xp
        with timer.phase("format"):
            # A COO made on the device (streaming execution builds on the host) comes back.
            coo = COOTensor(host_array(part["indices"]), host_array(part["values"]), self.shape)
            return FiberTensor.from_coo(coo, self.mode, name=f"rank {self.ctx.rank} block"), np

    def fiber_mode(self, problem):
        """The contracted mode n (``operation.params.mode``, default the last), checked against
        the tensor's order."""
        order = problem.order
        mode = order - 1 if self.params["mode"] is None else self.params["mode"]
        if mode >= order:
            raise InputError(f"operation.params.mode = {mode}, but the tensor has order {order} "
                             f"(modes 0..{order - 1})")
        if order < 3:
            raise InputError(f"SpTV needs a tensor of order >= 3, got order {order}")
        return mode

    def shared_data(self, part):
        """Tensor read by parts: v, made on every rank (from ``run.seed``, or read from its
        file), as :meth:`partition` makes it on rank 0. *Collective*: a vector file that is
        missing or of the wrong length stops every rank with one error line (each rank
        reading it alone would abort the job once per rank)."""
        return all_call(self.ctx.comm, self._make_vector, part["mode"],
                        part["shape"][part["mode"]], part["values"].dtype)

    def _make_vector(self, mode, length, dtype):
        """``{"v": v}``: v from its spec and ``run.seed`` (the same on every rank), kept as
        :attr:`vector_global` for the reference and the peers."""
        self.vector_global = make_vector(self.params["vector"], length, dtype,
                                         self.ctx.config["run.seed"], name="vector",
                                         what=f"the size of mode {mode}")
        return {"v": self.vector_global}

    def partition(self, problem):
        """Rank 0 (the whole tensor read there: :class:`~hisparse.layout.WholeOnRoot`): choose
        the grid, split the nonzeros, make v."""
        ctx = self.ctx
        mode = self.fiber_mode(problem)
        shared = self._make_vector(mode, problem.shape[mode], problem.values.dtype)
        self.grid_plan = partition_tensor(problem.indices, problem.shape, mode, ctx.size,
                                          self.strategy)
        common = {"mode": mode, "shape": list(problem.shape), "grid": list(self.grid_plan.grid)}
        if ctx.size == 1:
            return [dict(common, indices=problem.indices, values=problem.values)], shared
        pieces = split_by_owner(self.grid_plan.part_of(problem.indices), ctx.size,
                                problem.indices, problem.values)
        return [dict(common, indices=indices, values=values) for indices, values in pieces], shared

    # -- repeats ------------------------------------------------------------------------------
    def run_once(self):
        """One product on every rank's engine; Y stays where the engine wrote it. Fibers never
        cross ranks (the grid cuts only the modes other than n), so nothing is combined across
        ranks and no message is sent."""
        self.engine.multiply(self.params["chunk_order"])
        if self.ctx.timer.enabled:
            self.compute_seconds.append(self.engine.last_compute_seconds)

    def collect_mode(self):
        """``output.collect`` (the schema validates it; SpTV handles every mode itself)."""
        return self.ctx.config["output.collect"]

    def collect(self):
        """After the products: gather Y (values and fiber coordinates) to rank 0 when the
        results file or verification needs it and ``output.collect`` is ``gather``; otherwise
        leave Y on the ranks and bring only its checksums (sum and sum of squares, reduced on
        each rank's device and over the ranks) and sampled fibers to rank 0. ``parts`` also
        reads each rank's Y back to its host (:meth:`local_result_arrays`). *Collective.*"""
        ctx = self.ctx
        mode = self.collect_mode()
        wanted = self.params["store_result"] or ctx.config["verify.enabled"]
        if mode == "gather" and wanted:
            values = self.engine.values()
            if ctx.size == 1:
                self.coords_global, self.y_full = self.fiber_coords, values
                return
            gathered = gather_parts(ctx.transport, {"coords": self.fiber_coords, "y": values})
            if ctx.is_root:
                self.coords_global = np.concatenate([g["coords"] for g in gathered])
                self.y_full = np.concatenate([g["y"] for g in gathered])
            return
        if mode == "parts":
            self.y_local = self.engine.values()
        sums = AllReduce(ctx.transport, "sum")(self.engine.checksums())
        runs = sample_runs(self.nfibers)
        rows = np.concatenate([np.arange(a, b) for a, b in runs] or [np.zeros(0, np.int64)])
        samples = {"coords": self.fiber_coords[rows], "values": self.engine.take(runs)}
        gathered = gather_parts(ctx.transport, samples) if ctx.size > 1 else [samples]
        if ctx.is_root:
            self.checks = YChecks(self.global_fibers, float(sums[0]), float(sums[1]),
                                  np.concatenate([g["coords"] for g in gathered]),
                                  np.concatenate([g["values"] for g in gathered]))

    def local_result_arrays(self):
        """This rank's part of Y (``output.collect: parts``, every rank): its fibers'
        coordinates and values, each rank's fibers sorted lexicographically; the parts follow
        each other in rank order, as :meth:`result` has them."""
        return {"coords": (self.fiber_coords, None), "values": (self.y_local, None)}

    def teardown(self):
        self.engine.free()
        self.y_full = self.y_local = None

    # -- rank 0 -------------------------------------------------------------------------------
    def result(self):
        """``(coords, values)``: Y's fiber coordinates (nfibers, N-1) int64 and values, in rank
        order (each rank's fibers sorted lexicographically); or :class:`YChecks` when Y stayed
        on the ranks (see :meth:`collect`)."""
        if self.y_full is None:
            return self.checks
        return self.coords_global, np.asarray(self.y_full)

    def result_arrays(self, result):
        if not self.params["store_result"] or isinstance(result, YChecks):
            return {}
        coords, values = result
        return {"coords": coords, "values": values}

    def reference(self, problem):
        """Y in float64 from the whole tensor (:func:`~.reference.fiber_sums`): ``(coords,
        values)``, fibers sorted lexicographically."""
        return fiber_sums(problem.indices, problem.values, problem.shape, self.mode,
                          self.vector_global)

    def compare(self, result, reference):
        """Max-norm relative error of Y's values after matching fibers; inf when the sets of
        non-empty fibers differ. For :class:`YChecks`, see :meth:`YChecks.error`."""
        if isinstance(result, YChecks):
            return result.error(reference, [self.shape[m] for m in range(len(self.shape))
                                            if m != self.mode])
        coords, values = result
        ref_coords, ref_values = reference
        if coords.shape != ref_coords.shape:
            return float("inf")
        order = lexicographic_order(coords, [self.shape[m] for m in range(len(self.shape))
                                              if m != self.mode])
        if order is not None:
            coords, values = coords[order], values[order]
        if not np.array_equal(coords, ref_coords):
            return float("inf")
        return super().compare(values, ref_values)

    def work(self, problem):
        nnz = problem.nnz
        value = self.value_dtype.itemsize
        index = fiber_index_dtype(problem.shape[self.mode]).itemsize
        # kernel: csr5 reads the mode-n indices at the width its engine chose (narrow_columns)
        index = getattr(self.engine, "column_index_bits", 8 * index) // 8
        vector_bytes = float(self.vector_global.nbytes)
        if self.params["execution"] == "streaming":
            # What crosses PCIe per product: every packed chunk (v is uploaded once, Y stays).
            moved = self.global_plan_bytes
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
        """The whole tensor by fibers, on the host, for the peers (rank 0): this rank's own at
        one rank when it was built on the host, else built once here (on the GPU when the
        rank's format was)."""
        if self.ctx.size == 1 and self.fibers is not None:
            return self.fibers
        if getattr(self, "_fibers_all", None) is None:
            xp = self._device_module()
            if xp is np:
                self._fibers_all = FiberTensor.from_coo(problem, self.mode)
            else:
                self._fibers_all = fibers_by_sort(xp, in_module(xp, problem.indices),
                                                  in_module(xp, problem.values), problem.shape,
                                                  self.mode).to_host()
                from ...gpu import release_pool
                release_pool()
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
                 "sptv_fibers_per_nnz": self.global_fibers / max(int(part.nnz_per_part.sum()), 1),
                 "sptv_collect": self.collect_mode(), "sptv_format_on": self.format_on}
        if self.checks is not None:
            attrs["sptv_y_sum"], attrs["sptv_y_sum_of_squares"] = self.checks.sum, \
                self.checks.sum_of_squares
        if self.ctx.backend == "gpu":
            from ...gpu import host_to_device_bandwidth
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
        plan = self.plan
        itemsize = self.value_dtype.itemsize
        return {"nnz": int(self.nnz), "n_fibers": int(self.nfibers),
                "chunks": len(plan.chunks), "tensor_bytes": int(plan.nbytes),
                "device_bytes": int(self.engine.device_bytes),
                "streaming_device_bytes": plan.device_bytes(
                    False, self.ctx.config["gpu.streams"], itemsize, self.vector.nbytes),
                "long_fibers": int(sum(c.nlong for c in plan.chunks)),
                "column_index_bits": int(getattr(self.engine, "column_index_bits", 0)),
                "split_fibers": int(sum(c.continues for c in plan.chunks))}


#: Fibers sampled per rank when Y is not gathered: SAMPLE_RUNS runs of SAMPLE_RUN consecutive
#: fibers spread over the rank's fibers (consecutive fibers catch a shifted layout inside a
#: chunk, spread runs catch a wrong chunk).
SAMPLE_RUNS, SAMPLE_RUN = 32, 8


def sample_runs(nfibers):
    """``[(start, stop), ...]``: disjoint ascending fiber ranges sampled from ``nfibers``."""
    if nfibers <= SAMPLE_RUNS * SAMPLE_RUN:
        return [(0, nfibers)] if nfibers else []
    starts = np.linspace(0, nfibers - SAMPLE_RUN, SAMPLE_RUNS).astype(np.int64)
    return [(int(a), int(a) + SAMPLE_RUN) for a in starts]


@dataclass
class YChecks:
    """What rank 0 knows of a Y that stayed on the ranks: the fiber count, the sum and the sum
    of squares of every value (each rank's reduced on its device, then over the ranks), and
    sampled fibers (coordinates and values)."""

    nfibers: int
    sum: float
    sum_of_squares: float
    coords: np.ndarray
    values: np.ndarray

    def error(self, reference, dims):
        """A lower bound of the max-norm relative error of Y against ``reference``
        ``(coords, values)``: with ``e_i = y_i - r_i``, ``|e_i| <= d max|r|`` for the max-norm
        error d gives ``|sum y - sum r| <= d n max|r|`` and ``|sum y^2 - sum r^2| <= d max|r|
        (2 sum|r| + d n max|r|)``; so each checksum difference, divided by its bound at d = 1
        (squares: to first order), and the sampled fibers' max-norm error are each at most d.
        Inf when the fiber counts differ or a sampled fiber is not in the reference."""
        ref_coords, ref_values = reference
        ref = np.asarray(ref_values, dtype=np.float64)
        if self.nfibers != len(ref):
            return float("inf")
        if not len(ref):
            return 0.0
        largest = float(np.abs(ref).max())
        if largest == 0.0:
            largest = 1.0  # an all-zero reference: absolute errors
        at = rows_in(ref_coords, self.coords, dims)
        if (at < 0).any():
            return float("inf")
        errors = [abs(self.sum - ref.sum()) / (len(ref) * largest),
                  abs(self.sum_of_squares - np.dot(ref, ref)) / (2 * largest * np.abs(ref).sum()
                                                                 or 1.0)]
        if len(at):
            errors.append(float(np.abs(self.values.astype(np.float64) - ref[at]).max())
                          / largest)
        return float(np.max(errors))  # NaN (a non-finite Y) propagates


def _synchronize(xp):
    """Wait for the GPU when ``xp`` is CuPy (its work is asynchronous: a phase timed around it
    must end when the work does)."""
    if xp is not np:
        xp.cuda.Device().synchronize()
