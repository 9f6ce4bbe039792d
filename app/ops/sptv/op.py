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

The CPU backend runs the same chunk plan with NumPy (the bins and segments included), so the
plan is tested without a GPU.
"""
import re
import time
from dataclasses import dataclass, field

import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError, InputError, LayoutError
from ...formats import COOTensor
from ...formats._fiber import FiberTensor, fiber_index_dtype
from ...parallel import all_call, gather_arrays
from ...partition._tensor import TENSOR_STRATEGIES, partition_tensor
from .._base import Operation
from .._vectors import make_vector, vector_spec_check

#: lanes per fiber of the short-fiber bins (bin b has 2**b lanes)
LANE_BINS = (1, 2, 4, 8, 16, 32)
#: fibers longer than this go to the segment kernels (block per segment)
LONG_FIBER = 1024
#: nonzeros per segment of a long fiber
SEGMENT_NNZ = 2048
#: byte alignment of every array inside a packed chunk, and of chunks inside the host buffer
ALIGN = 256
#: int32 fields per row of the bin table (first block, first position, fibers, lanes)
BIN_FIELDS = 4
#: consecutive fibers one lane group handles in the fiber-group kernel: their loads are issued
#: together, so a thread keeps several memory requests in flight (the kernel is latency-bound
#: with one short fiber per group)
FIBERS_PER_GROUP = 4

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "kib": 1 << 10,
               "mib": 1 << 20, "gib": 1 << 30}


def parse_bytes(value):
    """``device_memory_cap`` in bytes: an integer or a string like ``'64MiB'`` / ``'2GB'``.

    Returns
    -------
    int or None
    """
    if value is None or isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kKmMgG]?i?[bB]?)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot read {value!r} as a byte count")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def _cap_check(value):
    try:
        size = parse_bytes(value)
    except ValueError:
        return "expected a byte count such as 268435456, '256MiB' or '2GB'"
    return None if size is None or size > 0 else "must be positive"


# -- the chunk plan ---------------------------------------------------------------------------

def chunk_bounds(fiber_ptr, nchunks):
    """Nonzero boundaries of about ``nchunks`` chunks of balanced nnz.

    A boundary moves to the nearest fiber start when that is within half a chunk of its ideal
    position; otherwise (a fiber longer than a chunk) it stays inside the fiber, which is then
    split over chunks.

    Parameters
    ----------
    fiber_ptr : ndarray, shape (nfibers + 1,), int64
    nchunks : int

    Returns
    -------
    ndarray, shape (chunks + 1,), int64
        Strictly increasing, from 0 to nnz; empty (one element) when nnz is 0.
    """
    nnz = int(fiber_ptr[-1])
    if nnz == 0:
        return np.zeros(1, dtype=np.int64)
    nchunks = max(1, min(int(nchunks), nnz))
    target = nnz / nchunks
    ideal = np.round(np.arange(1, nchunks) * target).astype(np.int64)
    above = np.minimum(np.searchsorted(fiber_ptr, ideal, side="left"), len(fiber_ptr) - 1)
    upper = fiber_ptr[above]
    lower = fiber_ptr[np.maximum(above - 1, 0)]
    snapped = np.where(ideal - lower <= upper - ideal, lower, upper)
    cuts = np.where(np.abs(snapped - ideal) <= target / 2, snapped, ideal)
    return np.unique(np.concatenate([[0], cuts, [nnz]]).astype(np.int64))


@dataclass
class Chunk:
    """One chunk of a rank's fibers: nonzeros ``nnz_lo:nnz_hi`` of the local FiberTensor.

    Attributes
    ----------
    fiber_first : int
        Local id of the first fiber the chunk touches; chunk-local fiber ``j`` is local fiber
        ``fiber_first + j``.
    nfibers : int
        Fibers touched (the first and the last may be partial).
    continues : bool
        The first fiber started in an earlier chunk: its partial sum is added on the host.
    bins : int
        Rows of the bin table (non-empty lane bins).
    group_blocks, nseg, nlong : int
        Blocks of the fiber-group kernel, segments and long fibers.
    layout : dict
        name -> (byte offset in the packed chunk, element count, dtype).
    nbytes : int
        Bytes of the packed chunk (what streaming sends).
    offset : int
        Byte offset of the packed chunk in the rank's host buffer.
    """

    index: int
    nnz_lo: int
    nnz_hi: int
    fiber_first: int
    nfibers: int
    continues: bool
    bins: int = 0
    group_blocks: int = 0
    nseg: int = 0
    nlong: int = 0
    layout: dict = field(default_factory=dict)
    nbytes: int = 0
    offset: int = 0

    @property
    def nnz(self):
        return self.nnz_hi - self.nnz_lo


def _ceil_log2(lengths):
    """Smallest b with 2**b >= length, for positive int lengths (exact for any int64)."""
    b = np.zeros(len(lengths), dtype=np.int64)
    remaining = lengths - 1
    while remaining.any():
        b += remaining > 0
        remaining >>= 1
    return b


def build_chunk(fibers, index, lo, hi, pointer_dtype, block_size):
    """The kernel arrays of nonzeros ``lo:hi`` of ``fibers``.

    Inside the chunk the fibers are laid out again by bin (short fibers by lane count, then the
    long fibers), each bin keeping the stored fiber order: a thread group then reads neighbouring
    fibers with no indirection on the load path, and ``out_id`` / ``long_fiber`` say where each
    result goes in the chunk's Y piece (chunk-local fiber ids in stored order).

    Returns
    -------
    chunk : Chunk
    arrays : dict of name -> ndarray
        ``val`` (nnz,), ``ind`` (nnz,) and ``ptr`` (nfibers + 1,) in bin layout; ``out_id``
        (int32, nshort: Y slot of each short fiber); ``table`` (int32, bins x 4: first block,
        first position, fibers, lanes); ``seg_lo``/``seg_hi`` (nseg,) segment bounds of the long
        fibers; ``long_fiber`` (int32, nlong: Y slots); ``long_seg_ptr`` (int32, nlong + 1).
    """
    global_ptr = fibers.fiber_ptr
    first = int(np.searchsorted(global_ptr, lo, side="right")) - 1
    last = int(np.searchsorted(global_ptr, hi - 1, side="right")) - 1
    stored_ptr = (np.clip(global_ptr[first:last + 2], lo, hi) - lo).astype(np.int64)
    lengths = np.diff(stored_ptr)
    is_long = lengths > LONG_FIBER
    short = np.flatnonzero(~is_long)
    bins = np.minimum(_ceil_log2(lengths[short]), len(LANE_BINS) - 1).astype(np.uint8)
    out_id = short[np.argsort(bins, kind="stable")]
    long_ids = np.flatnonzero(is_long)
    layout = np.concatenate([out_id, long_ids])  # stored fiber id at each bin-layout position
    new_lengths = lengths[layout]
    ptr = np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64)
    # Nonzero k of the new layout comes from stored position source[k].
    source = np.repeat(stored_ptr[layout] - ptr[:-1], new_lengths) + np.arange(hi - lo)
    counts = np.bincount(bins, minlength=len(LANE_BINS))
    table, block, position = [], 0, 0
    for b, count in enumerate(counts):
        if count == 0:
            continue
        lanes = LANE_BINS[b]
        table.append((block, position, int(count), lanes))
        per_block = FIBERS_PER_GROUP * (block_size // lanes)
        block += -(-int(count) // per_block)
        position += int(count)
    long_first = len(out_id)
    seg_counts = -(-lengths[long_ids] // SEGMENT_NNZ)
    long_seg_ptr = np.concatenate([[0], np.cumsum(seg_counts)]).astype(np.int64)
    owner = np.repeat(np.arange(len(long_ids)), seg_counts)
    long_lo = ptr[long_first:long_first + len(long_ids)]
    long_hi = ptr[long_first + 1:long_first + len(long_ids) + 1]
    seg_lo = long_lo[owner] + (np.arange(int(long_seg_ptr[-1])) - long_seg_ptr[owner]) \
        * SEGMENT_NNZ
    seg_hi = np.minimum(seg_lo + SEGMENT_NNZ, long_hi[owner])
    values = fibers.values[lo:hi]
    indices = fibers.fiber_index[lo:hi]
    arrays = {
        "val": values[source],
        "ind": indices[source],
        "ptr": ptr.astype(pointer_dtype),
        "out_id": out_id.astype(np.int32),
        "table": np.asarray(table, dtype=np.int32).reshape(-1),
        "seg_lo": seg_lo.astype(pointer_dtype),
        "seg_hi": seg_hi.astype(pointer_dtype),
        "long_fiber": long_ids.astype(np.int32),
        "long_seg_ptr": long_seg_ptr.astype(np.int32),
    }
    chunk = Chunk(index=index, nnz_lo=int(lo), nnz_hi=int(hi), fiber_first=first,
                  nfibers=len(lengths), continues=bool(global_ptr[first] < lo), bins=len(table),
                  group_blocks=block, nseg=int(long_seg_ptr[-1]), nlong=len(long_ids))
    offset = 0
    for name, array in arrays.items():
        chunk.layout[name] = (offset, len(array), array.dtype)
        offset += -(-array.nbytes // ALIGN) * ALIGN
    chunk.nbytes = max(offset, ALIGN)
    return chunk, arrays


@dataclass
class ChunkPlan:
    """A rank's chunks and their packed host buffer.

    Attributes
    ----------
    chunks : list of Chunk
        In stored order.
    buffer : ndarray, uint8
        Every chunk's packed arrays (page-locked on the GPU backend).
    """

    chunks: list
    buffer: np.ndarray
    pointer_dtype: np.dtype

    @property
    def nbytes(self):
        return int(sum(c.nbytes for c in self.chunks))

    @property
    def max_chunk_bytes(self):
        return max((c.nbytes for c in self.chunks), default=ALIGN)

    @property
    def max_chunk_fibers(self):
        return max((c.nfibers for c in self.chunks), default=1)

    @property
    def max_chunk_segments(self):
        return max((c.nseg for c in self.chunks), default=1)

    def sequence(self, chunk_order):
        """Chunks in processing order: ``stored``, or ``nnz_desc`` (largest first, so the long
        tail of the last stream is short — the seed's block sorting)."""
        if chunk_order == "nnz_desc":
            return sorted(self.chunks, key=lambda c: (-c.nnz, c.index))
        return list(self.chunks)

    def view(self, chunk, name):
        """The array ``name`` of ``chunk`` as a view into the packed buffer."""
        offset, count, dtype = chunk.layout[name]
        start = chunk.offset + offset
        return self.buffer[start:start + count * dtype.itemsize].view(dtype)

    def streaming_device_bytes(self, streams, value_itemsize, vector_bytes):
        """Device bytes of streaming execution: v plus, per stream, one chunk buffer, its Y
        piece and its segment partial sums."""
        def allocation(nbytes):  # the GPU engine allocates at least ALIGN bytes per buffer
            return max(int(nbytes), ALIGN)
        per_stream = (allocation(self.max_chunk_bytes)
                      + allocation(value_itemsize * self.max_chunk_fibers)
                      + allocation(value_itemsize * self.max_chunk_segments))
        return int(allocation(vector_bytes) + streams * per_stream)


def build_plan(fibers, nchunks, pointer_dtype, block_size, allocate=np.empty):
    """Cut ``fibers`` into chunks and pack them into one host buffer.

    Parameters
    ----------
    fibers : FiberTensor
    nchunks : int
    pointer_dtype : numpy dtype (int32 or int64)
    block_size : int
        Threads per block of the fiber-group kernel.
    allocate : callable
        ``allocate(nbytes, dtype)`` of the host buffer (``pycuda.driver.pagelocked_empty`` on
        the GPU backend).

    Returns
    -------
    ChunkPlan
    """
    bounds = chunk_bounds(fibers.fiber_ptr, nchunks)
    chunks, arrays, offset = [], [], 0
    for index in range(len(bounds) - 1):
        chunk, chunk_arrays = build_chunk(fibers, index, int(bounds[index]),
                                          int(bounds[index + 1]), pointer_dtype, block_size)
        chunk.offset = offset
        offset += chunk.nbytes
        chunks.append(chunk)
        arrays.append(chunk_arrays)
    plan = ChunkPlan(chunks, allocate(max(offset, ALIGN), np.uint8), np.dtype(pointer_dtype))
    for chunk, chunk_arrays in zip(chunks, arrays):
        for name, array in chunk_arrays.items():
            if len(array):
                plan.view(chunk, name)[:] = array
    return plan


def combine_split_fibers(plan, y, side):
    """Add the partial sums of fibers split over chunks (kept in ``side[chunk.index]``) to Y."""
    split = [c for c in plan.chunks if c.continues]
    if split:
        np.add.at(y, np.array([c.fiber_first for c in split], dtype=np.int64),
                  side[[c.index for c in split]])


# -- the operation ----------------------------------------------------------------------------

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
                                     nullable=True, check=_cap_check),
        "vector": Setting(str, "random", "v: 'random', 'ones' or 'FILE.h5:/dataset'.",
                          check=vector_spec_check),
        "store_result": Setting(bool, True, "Write Y (coordinates and values) to /result."),
        "sweep": Setting(bool, False, "After the run, rank 0 re-times its part with 1, 2, 4, 8 "
                                      "streams and both chunk orders (GPU)."),
    }
    PARTITIONS = TENSOR_STRATEGIES
    PEERS = ("numpy", "cusparse_full", "cusparse_fibers")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "format": "setup", "pack": "setup",
                    "upload": "transfer"}
    REPEAT_PHASES = {"h2d": "transfer", "kernel": "compute", "d2h": "transfer", "compute": "compute",
                     "combine": "communication", "gather": "communication"}
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
        # Fiber coordinates do not change between products: gather them once.
        gathered = gather_arrays(ctx.comm, {"coords": local.fiber_coords})
        if ctx.is_root:
            self.coords_global = np.concatenate([g["coords"] for g in gathered]) \
                if gathered else np.zeros((0, len(self.shape) - 1), dtype=np.int64)
        # Kernel types must agree on every rank (the kernel cache is shared per node).
        total_nnz = ctx.comm.allreduce(local.nnz) if ctx.size > 1 else local.nnz
        wide = ctx.index_width == "int64" or total_nnz >= np.iinfo(np.int32).max
        self.pointer_dtype = np.dtype(np.int64 if wide else np.int32)
        self.engine = (_GpuEngine if ctx.backend == "gpu" else _CpuEngine)(self)
        with ctx.timer.phase("pack"):
            # A cap that one rank cannot meet stops every rank with the same message.
            self.plan = all_call(ctx.comm, self._fit_plan)
        with ctx.timer.phase("upload"):
            self.engine.upload()
        totals = np.array([self.plan.nbytes, local.nfibers, local.nnz], dtype=np.float64)
        if ctx.size > 1:
            from mpi4py import MPI
            ctx.comm.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)
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

    def _fit_plan(self):
        """Build the chunk plan; under a device memory cap, double the chunks until streaming
        fits (resident execution must hold the whole plan)."""
        params, ctx = self.params, self.ctx
        cap = parse_bytes(params["device_memory_cap"])
        streams = ctx.config["gpu.streams"]
        itemsize = self.fibers.values.dtype.itemsize
        nchunks = params["chunks"]
        allocate = self.engine.host_allocator()
        while True:
            plan = build_plan(self.fibers, nchunks, self.pointer_dtype,
                              ctx.config["gpu.block_size"], allocate)
            if cap is None:
                return plan
            if params["execution"] == "resident":
                need = plan.nbytes + itemsize * (self.fibers.nfibers + plan.max_chunk_segments *
                                                 len(plan.chunks)) + self.vector.nbytes
                if need > cap:
                    raise LayoutError(f"resident execution needs {need} device "
                                      f"bytes, over operation.params.device_memory_cap = {cap}; "
                                      f"use execution: streaming")
                return plan
            need = plan.streaming_device_bytes(streams, itemsize, self.vector.nbytes)
            if need <= cap:
                return plan
            if nchunks >= max(self.fibers.nnz, 1):
                raise LayoutError(f"streaming needs {need} device bytes with one "
                                  f"nonzero per chunk, over operation.params.device_memory_cap = "
                                  f"{cap}; raise the cap or lower gpu.streams ({streams})")
            nchunks = min(nchunks * 2, max(self.fibers.nnz, 1))

    # -- repeats ------------------------------------------------------------------------------
    def run_once(self):
        y_local = self.engine.multiply(self.params["chunk_order"])
        if self.ctx.timer.enabled:
            self.compute_seconds.append(self.engine.last_compute_seconds)
        with self.ctx.timer.phase("gather"):
            if self.ctx.size == 1:
                self.y_full = y_local
            else:
                gathered = gather_arrays(self.ctx.comm, {"y": y_local})
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
            return self._numpy_peer(problem, repeats)
        if name in ("cusparse_full", "cusparse_fibers"):
            return self._cusparse_peer(problem, repeats, full=name == "cusparse_full")
        raise HisparseError(f"unknown peer {name}")

    def _numpy_peer(self, problem, repeats):
        """NumPy on the COO tensor: bincount of value · v[i_n] by precomputed fiber ids."""
        fibers = self._global_fibers(problem)
        fiber_of = np.repeat(np.arange(fibers.nfibers), fibers.fiber_lengths)
        index = fibers.fiber_index.astype(np.intp)
        v = self.vector_global
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.bincount(fiber_of, weights=fibers.values * v[index], minlength=fibers.nfibers)
            seconds.append(time.perf_counter() - start)
        return {"seconds": seconds, "device": "cpu", "library": f"numpy {np.__version__}"}

    def _cusparse_peer(self, problem, repeats, full):
        """cuSPARSE CSR SpMV (CuPy) on the transposed mode-n unfolding: one row per fiber
        position — all prod(I_m, m != n) of them (``full``, the seed's peer) or only the
        non-empty fibers — and one column per mode-n index. Timed with CUDA events."""
        from ...gpu._blas import import_cupy, release_pool, time_with_events
        cupy, csp = import_cupy("cusparse_full" if full else "cusparse_fibers")
        fibers = self._global_fibers(problem)
        if full:
            dims = [problem.shape[m] for m in fibers.other_modes]
            nrows = float(np.prod([float(d) for d in dims]))
            if nrows >= np.iinfo(np.int32).max:
                raise HisparseError(f"the full unfolding has {nrows:.3g} rows, over cuSPARSE's "
                                    f"int32 row limit")
            nrows = int(nrows)
            keys = np.ravel_multi_index(tuple(fibers.fiber_coords.T), dims)
            row_counts = np.zeros(nrows, dtype=np.int64)
            row_counts[keys] = fibers.fiber_lengths
            indptr = np.concatenate([[0], np.cumsum(row_counts)])
        else:
            nrows = fibers.nfibers
            indptr = fibers.fiber_ptr
        if fibers.nnz >= np.iinfo(np.int32).max:
            raise HisparseError("more than 2**31 nonzeros: over cuSPARSE's int32 CSR limit")
        matrix = csp.csr_matrix((cupy.asarray(fibers.values),
                                 cupy.asarray(fibers.fiber_index.astype(np.int32)),
                                 cupy.asarray(indptr.astype(np.int32))),
                                shape=(nrows, problem.shape[self.mode]))
        v = cupy.asarray(self.vector_global)
        matrix @ v  # warm-up: handle creation and buffer allocation
        seconds = time_with_events(lambda: matrix @ v, repeats)
        matrix = v = None  # drop the device arrays before the pool is emptied
        release_pool()
        return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}",
                "rows": nrows}

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
            from ...gpu._bandwidth import host_to_device_bandwidth
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


# -- engines ----------------------------------------------------------------------------------

class _CpuEngine:
    """NumPy on the host, running the same chunk plan as the GPU: per chunk, the bins' fibers by
    ``reduceat`` over P_f, the long fibers by segments and then per-fiber sums of segments."""

    device_bytes = 0

    def __init__(self, op):
        self.op = op
        self.last_compute_seconds = 0.0

    def host_allocator(self):
        return np.empty

    def upload(self):
        self.y = np.full(self.op.fibers.nfibers, np.nan, dtype=self.op.fibers.values.dtype)
        self.side = np.zeros(max(len(self.op.plan.chunks), 1), dtype=self.y.dtype)

    def multiply(self, chunk_order):
        op, plan, timer = self.op, self.op.plan, self.op.ctx.timer
        v = op.vector
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


class _GpuEngine:
    """Fiber kernels on the rank's GPU over ``gpu.streams`` streams (see the module docstring)."""

    def __init__(self, op):
        self.op = op
        self.ctx = op.ctx
        self.device_bytes = 0
        self.last_compute_seconds = 0.0
        self._allocations = []

    def host_allocator(self):
        import pycuda.driver as cuda
        return lambda nbytes, dtype: cuda.pagelocked_empty(nbytes, dtype)

    def upload(self):
        import pycuda.driver as cuda
        op, ctx = self.op, self.ctx
        fibers = op.fibers
        value_t = "double" if fibers.values.dtype == np.float64 else "float"
        index_t = "int" if op.pointer_dtype == np.int32 else "long long"
        fiber_index_t = {np.dtype(np.uint16): "unsigned short", np.dtype(np.int32): "int",
                         np.dtype(np.int64): "long long"}[fibers.fiber_index.dtype]
        self.block_size = ctx.config["gpu.block_size"]
        if self.block_size % 32 or self.block_size > 1024:
            raise LayoutError(f"gpu.block_size = {self.block_size}: SpTV needs a multiple of 32 "
                              f"up to 1024")
        module = ctx.load_kernels("sptv", {"VALUE_T": value_t, "INDEX_T": index_t,
                                           "FIBER_INDEX_T": fiber_index_t,
                                           "BLOCK_SIZE": self.block_size,
                                           "FIBERS_PER_GROUP": FIBERS_PER_GROUP})
        self.k_groups = module.get_function("sptv_fiber_groups")
        self.k_groups.prepare("iPPPPPPP")
        self.k_segments = module.get_function("sptv_segments")
        self.k_segments.prepare("iPPPPPP")
        self.k_finish = module.get_function("sptv_long_finish")
        self.k_finish.prepare("iPPPP")
        self.itemsize = fibers.values.dtype.itemsize
        self.v_host = cuda.pagelocked_empty(len(op.vector), op.vector.dtype)
        self.v_host[:] = op.vector
        self.v_dev = self._alloc(op.vector.nbytes)
        # Page-locked Y (one extra element: a rank may own no fiber); y_host is its used part.
        self.y_pinned = cuda.pagelocked_empty(fibers.nfibers + 1, fibers.values.dtype)
        self.y_host = self.y_pinned[:fibers.nfibers]
        self.side = cuda.pagelocked_empty(max(len(op.plan.chunks), 1), fibers.values.dtype)
        self.resident = op.params["execution"] == "resident"
        plan = op.plan
        if self.resident:
            self.tensor_dev = self._alloc(plan.nbytes)
            if plan.nbytes:
                cuda.memcpy_htod(self.tensor_dev, plan.buffer[:plan.nbytes])
            y_slots = np.cumsum([0] + [c.nfibers for c in plan.chunks])
            seg_slots = np.cumsum([0] + [c.nseg for c in plan.chunks])
            self.y_dev = self._alloc(int(y_slots[-1]) * self.itemsize)
            self.partial_dev = self._alloc(int(seg_slots[-1]) * self.itemsize)
            self.slots = {c.index: (int(y_slots[i]), int(seg_slots[i]))
                          for i, c in enumerate(plan.chunks)}
        self.chunk_events = {c.index: [cuda.Event() for _ in range(6)] for c in plan.chunks}
        self.set_streams(ctx.config["gpu.streams"])

    def set_streams(self, count):
        """(Re)create ``count`` streams and, for streaming, one staging area per stream."""
        import pycuda.driver as cuda
        self.streams = [cuda.Stream() for _ in range(count)]
        self.stream_events = [(cuda.Event(), cuda.Event()) for _ in range(count)]
        self.start_event, self.v_event = cuda.Event(), cuda.Event()
        for allocation in getattr(self, "_stages", []):
            self._free_one(allocation)
        self._stages, self.stages = [], []
        if not self.resident:
            plan = self.op.plan
            for _ in range(count):
                stage = (self._alloc(plan.max_chunk_bytes),
                         self._alloc(plan.max_chunk_fibers * self.itemsize),
                         self._alloc(plan.max_chunk_segments * self.itemsize))
                self._stages += list(stage)
                self.stages.append(stage)

    def _alloc(self, nbytes):
        import pycuda.driver as cuda
        size = max(int(nbytes), ALIGN)
        allocation = cuda.mem_alloc(size)
        self._allocations.append((allocation, size))
        self.device_bytes += size
        return allocation

    def _free_one(self, allocation):
        for entry in self._allocations:
            if entry[0] is allocation:
                self._allocations.remove(entry)
                self.device_bytes -= entry[1]
                allocation.free()
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
            warps_per_block = self.block_size // 32
            self.k_finish.prepared_async_call(
                (-(-chunk.nlong // warps_per_block), 1), (self.block_size, 1, 1), stream,
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
        import pycuda.driver as cuda
        plan, timer = self.op.plan, self.ctx.timer
        streams = self.streams
        sequence = plan.sequence(chunk_order)
        wall_start = time.perf_counter()
        self.start_event.record(streams[0])
        cuda.memcpy_htod_async(self.v_dev, self.v_host, streams[0])
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
                cuda.memcpy_htod_async(stage, plan.buffer[chunk.offset:chunk.offset + chunk.nbytes],
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
        kernel_busy = sum(self.chunk_events[c.index][3].time_since(self.chunk_events[c.index][2])
                          for c in sequence) * 1e-3
        if self.resident:
            # Kernel-only time: from the start to the last stream's last kernel (the D2H of Y
            # is issued after every kernel of a stream).
            kernel_span = max((self.stream_events[s][0].time_since(self.start_event)
                               for s in used), default=0.0) * 1e-3
            self.last_compute_seconds = kernel_span
            h2d = self.v_event.time_since(self.start_event) * 1e-3
        else:
            h2d = sum(self.chunk_events[c.index][1].time_since(self.chunk_events[c.index][0])
                      for c in sequence) * 1e-3
            # End to end: from the first copy of v to the last copy of Y.
            self.last_compute_seconds = pipeline
        d2h = sum(self.chunk_events[c.index][5].time_since(self.chunk_events[c.index][4])
                  for c in sequence) * 1e-3
        with timer.phase("combine"):
            combine_split_fibers(plan, self.y_host, self.side)
        timer.add("h2d", gpu=h2d)
        timer.add("kernel", gpu=kernel_busy)
        timer.add("d2h", gpu=d2h)
        timer.add("compute", wall=wall, gpu=self.last_compute_seconds)
        return self.y_host

    def bytes_moved(self):
        """Bytes over PCIe per streaming product on this rank: chunks in, Y out, v in."""
        return float(self.op.plan.nbytes + self.y_host.nbytes + self.v_host.nbytes)

    def sweep(self, repeats):
        """Re-time this rank's product for 1, 2, 4, 8 streams x both chunk orders (rank 0,
        after the timed run). Returns ``{"sweep_s{S}_{order}_ms": median ms}``."""
        op, timer = self.op, self.ctx.timer
        cap = parse_bytes(op.params["device_memory_cap"])
        configured = len(self.streams)
        enabled, timer.enabled = timer.enabled, False
        out = {}
        try:
            for count in (1, 2, 4, 8):
                if not self.resident and cap is not None and op.plan.streaming_device_bytes(
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
        for allocation, _ in self._allocations:
            allocation.free()
        self._allocations, self._stages, self.stages = [], [], []
        self.v_host = self.y_pinned = self.y_host = self.side = None
        self.streams, self.stream_events, self.chunk_events = [], [], {}
        self.start_event = self.v_event = None
        self.op.plan.buffer = None


OPERATION = SpTV
