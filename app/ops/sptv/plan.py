"""The SpTV chunk plan: a rank's fibers cut into chunks of balanced nnz, each laid out by length
bin and packed into one host buffer, plus the config helpers that size it (``parse_bytes`` for
``device_memory_cap``, :func:`fit_plan` for the cap).

Every chunk writes its results straight into the rank's Y array, at its first fiber: Y holds
``nfibers + chunks`` slots, the last ``chunks`` of which take the piece of a fiber that an
earlier chunk started (a fiber longer than a chunk is split over chunks); after the kernels,
:func:`combine_split_fibers` adds those pieces to their fibers. So Y is complete where the
kernels wrote it (on the GPU, it never leaves the device during the products).

The CPU and GPU engines run the same plan (the CPU with NumPy, the bins and segments included),
so the plan is tested without a GPU. The plan is built by the same code with NumPy on the host or
with CuPy on the GPU (``xp``), from a fiber tensor held there (see
:func:`hisparse.formats._fiber.fibers_by_sort`): the GPU then packs the chunks straight into
device memory.
"""
import math
import re
from dataclasses import dataclass, field

import numpy as np

from ...errors import LayoutError
from ...formats import MAX_SIGMA
from ...formats import FiberTensor, stable_argsort
from ...arrays import count_values, host_array, operand, sorted_distinct

#: lanes per fiber of the short-fiber bins (bin b has 2**b lanes)
LANE_BINS = (1, 2, 4, 8, 16, 32)
#: fibers longer than this go to the segment kernels (block per segment)
LONG_FIBER = 1024
#: nonzeros per segment of a long fiber
SEGMENT_NNZ = 2048
#: byte alignment of every array inside a packed chunk, and of chunks inside the host buffer
ALIGN = 256
#: consecutive fibers one lane group handles in the fiber-group kernel: their loads are issued
#: together, so a thread keeps several memory requests in flight (the kernel is latency-bound
#: with one short fiber per group)
FIBERS_PER_GROUP = 4
#: blocks of the checksum kernel (each writes one partial sum and one of squares, in double)
CHECKSUM_BLOCKS = 64


def fiber_sigma(mean_fiber_length):
    """``kernel: csr5``'s tile height for a mean fiber length: rounded up, clamped to [8, 32].

    Fibers are short (the nell-2-like tensor's mean is 7.1 entries), and SpMV's rule (the mean
    row length clamped to [16, 32]) puts two fibers' worth of entries on a lane; the rule was
    chosen by measuring each sigma (docs/ops/sptv.md)."""
    return int(min(MAX_SIGMA, max(8, math.ceil(float(mean_fiber_length)))))

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


def cap_check(value):
    """Config check of ``device_memory_cap``."""
    try:
        size = parse_bytes(value)
    except ValueError:
        return "expected a byte count such as 268435456, '256MiB' or '2GB'"
    return None if size is None or size > 0 else "must be positive"


# -- the chunk plan ---------------------------------------------------------------------------

def chunk_bounds(fiber_ptr, nchunks, xp=np):
    """Nonzero boundaries of about ``nchunks`` chunks of balanced nnz.

    A boundary moves to the nearest fiber start when that is within half a chunk of its ideal
    position; otherwise (a fiber longer than a chunk) it stays inside the fiber, which is then
    split over chunks.

    Parameters
    ----------
    fiber_ptr : ndarray, shape (nfibers + 1,), int64
        NumPy, or CuPy with ``xp=cupy`` (only ``nchunks`` pointers come to the host).
    nchunks : int
    xp : module

    Returns
    -------
    ndarray (NumPy), shape (chunks + 1,), int64
        Strictly increasing, from 0 to nnz; empty (one element) when nnz is 0.
    """
    nnz = int(fiber_ptr[-1])
    if nnz == 0:
        return np.zeros(1, dtype=np.int64)
    nchunks = max(1, min(int(nchunks), nnz))
    target = nnz / nchunks
    ideal = np.round(np.arange(1, nchunks) * target).astype(np.int64)
    above = np.minimum(host_array(xp.searchsorted(fiber_ptr, xp.asarray(ideal), side="left")),
                       len(fiber_ptr) - 1)
    upper = host_array(fiber_ptr[xp.asarray(above)])
    lower = host_array(fiber_ptr[xp.asarray(np.maximum(above - 1, 0))])
    snapped = np.where(ideal - lower <= upper - ideal, lower, upper)
    cuts = np.where(np.abs(snapped - ideal) <= target / 2, snapped, ideal)
    return sorted_distinct(np.concatenate([[0], cuts, [nnz]]).astype(np.int64))


@dataclass
class Chunk:
    """One chunk of a rank's fibers: nonzeros ``nnz_lo:nnz_hi`` of the local FiberTensor.

    Attributes
    ----------
    fiber_first : int
        Local id of the first fiber the chunk touches; chunk-local fiber ``j`` is local fiber
        ``fiber_first + j``. The chunk's kernels write Y from slot ``fiber_first`` on.
    nfibers : int
        Fibers touched (the first and the last may be partial).
    continues : bool
        The first fiber started in an earlier chunk: its piece goes to Y slot ``side_slot``
        and is added to the fiber by :func:`combine_split_fibers`.
    side_slot : int
        Y slot of the chunk's own piece of a split fiber: ``nfibers of the rank + index``.
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
    side_slot: int = 0
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


def _ceil_log2(lengths, xp=np):
    """Smallest b with 2**b >= length, for positive int lengths (exact for any int64)."""
    b = xp.zeros(len(lengths), dtype=xp.int64)
    zero, one = operand(xp, 0), operand(xp, 1)
    remaining = lengths - one
    while bool(remaining.any()):
        b += remaining > zero
        remaining >>= one
    return b


def _prefix_sum(counts, xp=np):
    """``[0, c0, c0 + c1, ...]``, int64."""
    return xp.concatenate([xp.zeros(1, dtype=xp.int64),
                           xp.cumsum(counts, dtype=xp.int64)]).astype(xp.int64, copy=False)


def _repeat_per_group(per_group, starts, total, xp=np):
    """``per_group[g]`` at every position of group ``g``, where group g covers ``starts[g]`` to
    ``starts[g + 1]`` (``starts[-1] = total``) and no group is empty: ``np.repeat`` by lengths,
    written as a scatter of the differences and a prefix sum, which CuPy also runs."""
    out = xp.zeros(total, dtype=xp.int64)
    if len(per_group):
        steps = per_group.astype(xp.int64)
        steps[1:] -= per_group[:-1]
        out[starts[:-1]] = steps
    return xp.cumsum(out)


def build_chunk(fibers, index, lo, hi, pointer_dtype, block_size, xp=np):
    """The kernel arrays of nonzeros ``lo:hi`` of ``fibers``.

    Inside the chunk the fibers are laid out again by bin (short fibers by lane count, then the
    long fibers), each bin keeping the stored fiber order: a thread group then reads neighbouring
    fibers with no indirection on the load path, and ``out_id`` / ``long_fiber`` say where each
    result goes in the rank's Y, counted from the chunk's first fiber: chunk-local fiber ``j``
    goes to ``j``, except the piece of a fiber an earlier chunk started (``continues``), which
    goes to ``side_slot - fiber_first``.

    ``fibers`` holds NumPy arrays, or CuPy arrays with ``xp=cupy`` (the arrays are then built on
    the GPU; a few counts per chunk come to the host).

    Returns
    -------
    chunk : Chunk
    arrays : dict of name -> ndarray (of ``xp``)
        ``val`` (nnz,), ``ind`` (nnz,) and ``ptr`` (nfibers + 1,) in bin layout; ``out_id``
        (int32, nshort: Y slot of each short fiber); ``table`` (int32, bins x 4, BIN_FIELDS in
        kernels_cu/sptv.cu: first block, first position, fibers, lanes); ``seg_lo``/``seg_hi`` (nseg,) segment bounds of the long
        fibers; ``long_fiber`` (int32, nlong: Y slots); ``long_seg_ptr`` (int32, nlong + 1).
    """
    global_ptr = fibers.fiber_ptr
    first, last = host_array(xp.searchsorted(global_ptr, xp.asarray([lo, hi - 1]),
                                             side="right")).tolist()
    first, last = first - 1, last - 1
    stored_ptr = (xp.clip(global_ptr[first:last + 2], lo, hi) - operand(xp, lo)) \
        .astype(xp.int64)
    lengths = xp.diff(stored_ptr)
    continues = int(global_ptr[first]) < lo
    side_slot = fibers.nfibers + index
    # Y slot of each chunk-local fiber, counted from the chunk's first fiber.
    y_slot = xp.arange(len(lengths), dtype=xp.int64)
    if continues:
        y_slot[0] = side_slot - first
    is_long = lengths > operand(xp, LONG_FIBER)
    short = xp.flatnonzero(~is_long)
    bins = xp.minimum(_ceil_log2(lengths[short], xp), len(LANE_BINS) - 1).astype(xp.uint8)
    out_id = short[stable_argsort(xp, bins)]
    long_ids = xp.flatnonzero(is_long)
    layout = xp.concatenate([out_id, long_ids])  # stored fiber id at each bin-layout position
    ptr = _prefix_sum(lengths[layout], xp)
    # Nonzero k of the new layout comes from stored position source[k].
    source = _repeat_per_group(stored_ptr[layout] - ptr[:-1], ptr, hi - lo, xp) + \
        xp.arange(hi - lo, dtype=xp.int64)
    counts = host_array(count_values(bins.astype(xp.int64), len(LANE_BINS)))
    table, block, position = [], 0, 0
    for b, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        lanes = LANE_BINS[b]
        table.append((block, position, count, lanes))
        per_block = FIBERS_PER_GROUP * (block_size // lanes)
        block += -(-count // per_block)
        position += count
    nlong = len(long_ids)
    long_first = len(out_id)
    segment = operand(xp, SEGMENT_NNZ)
    seg_counts = -(-lengths[long_ids] // segment)
    long_seg_ptr = _prefix_sum(seg_counts, xp)
    nseg = int(long_seg_ptr[-1])
    owner = _repeat_per_group(xp.arange(nlong, dtype=xp.int64), long_seg_ptr, nseg, xp)
    long_lo = ptr[long_first:long_first + nlong]
    long_hi = ptr[long_first + 1:long_first + nlong + 1]
    seg_lo = long_lo[owner] + (xp.arange(nseg, dtype=xp.int64) - long_seg_ptr[owner]) * segment
    seg_hi = xp.minimum(seg_lo + segment, long_hi[owner])
    values = fibers.values[lo:hi]
    indices = fibers.fiber_index[lo:hi]
    arrays = {
        "val": values[source],
        "ind": indices[source],
        "ptr": ptr.astype(pointer_dtype),
        "out_id": y_slot[out_id].astype(xp.int32),
        "table": xp.asarray(np.asarray(table, dtype=np.int32).reshape(-1)),
        "seg_lo": seg_lo.astype(pointer_dtype),
        "seg_hi": seg_hi.astype(pointer_dtype),
        "long_fiber": y_slot[long_ids].astype(xp.int32),
        "long_seg_ptr": long_seg_ptr.astype(xp.int32),
    }
    chunk = Chunk(index=index, nnz_lo=int(lo), nnz_hi=int(hi), fiber_first=first,
                  nfibers=len(lengths), continues=continues, side_slot=side_slot, bins=len(table),
                  group_blocks=block, nseg=nseg, nlong=nlong)
    offset = 0
    for name, array in arrays.items():
        chunk.layout[name] = (offset, len(array), array.dtype)
        offset += -(-array.nbytes // ALIGN) * ALIGN
    chunk.nbytes = max(offset, ALIGN)
    return chunk, arrays


def _allocation(nbytes):
    """Bytes the GPU engine counts for one device buffer: at least ALIGN."""
    return max(int(nbytes), ALIGN)


@dataclass
class ChunkPlan:
    """A rank's chunks and their packed host buffer.

    Attributes
    ----------
    chunks : list of Chunk
        In stored order.
    buffer : ndarray, uint8
        Every chunk's packed arrays (page-locked on the GPU backend; a CuPy array in device
        memory when the plan was built on the GPU).
    pointer_dtype : numpy dtype
        Of the fiber pointers and segment bounds (``INDEX_T``), and of the split table.
    nfibers : int
        The rank's fibers: Y's first ``nfibers`` slots.
    """

    chunks: list
    buffer: np.ndarray
    pointer_dtype: np.dtype
    nfibers: int = 0

    @property
    def nbytes(self):
        return int(sum(c.nbytes for c in self.chunks))

    @property
    def y_length(self):
        """Slots of the rank's Y array: one per fiber, then one per chunk (split-fiber pieces)."""
        return self.nfibers + len(self.chunks)

    @property
    def max_chunk_bytes(self):
        return max((c.nbytes for c in self.chunks), default=ALIGN)

    @property
    def max_chunk_segments(self):
        return max((c.nseg for c in self.chunks), default=1)

    def split_table(self):
        """``(fibers, slots)``, int64: for each chunk continuing a fiber (in chunk order), the
        fiber and the Y slot holding the chunk's piece of it."""
        split = [c for c in self.chunks if c.continues]
        return (np.array([c.fiber_first for c in split], dtype=np.int64),
                np.array([c.side_slot for c in split], dtype=np.int64))

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

    def device_buffers(self, resident, value_itemsize, vector_bytes):
        """``{name: bytes}`` of the device buffers the GPU engine holds for the whole run: v, Y
        (with the split-fiber slots), the split table (fibers then slots), the checksum partial
        sums and, resident, the packed chunks and every chunk's segment partial sums."""
        buffers = {"v": vector_bytes, "Y": value_itemsize * self.y_length,
                   "split table": 2 * len(self.split_table()[0]) * self.pointer_dtype.itemsize,
                   "checksum partials": 2 * CHECKSUM_BLOCKS * np.dtype(np.float64).itemsize}
        if resident:
            buffers["packed chunks"] = self.nbytes
            buffers["segment partial sums"] = value_itemsize * sum(c.nseg for c in self.chunks)
        return buffers

    def stage_buffers(self, value_itemsize):
        """``{name: bytes}`` of the buffers streaming holds per stream: one packed chunk and its
        segment partial sums."""
        return {"chunk stage": self.max_chunk_bytes,
                "segment partial sums stage": value_itemsize * self.max_chunk_segments}

    def device_bytes(self, resident, streams, value_itemsize, vector_bytes):
        """Device bytes of the GPU engine (each buffer counted at least ALIGN bytes): the
        buffers of :meth:`device_buffers` plus, streaming, ``streams`` x :meth:`stage_buffers`."""
        total = sum(map(_allocation, self.device_buffers(resident, value_itemsize,
                                                         vector_bytes).values()))
        if not resident:
            total += streams * sum(map(_allocation, self.stage_buffers(value_itemsize).values()))
        return int(total)


def build_plan(fibers, nchunks, pointer_dtype, block_size, allocate=None, xp=np):
    """Cut ``fibers`` into chunks and pack them into one buffer.

    Parameters
    ----------
    fibers : FiberTensor
        With NumPy arrays, or CuPy arrays and ``xp=cupy`` (the plan is then built and packed on
        the GPU).
    nchunks : int
    pointer_dtype : numpy dtype (int32 or int64)
    block_size : int
        Threads per block of the fiber-group kernel.
    allocate : callable
        ``allocate(nbytes, dtype)`` of the buffer (``pycuda.driver.pagelocked_empty`` for a
        host plan on the GPU backend); default ``xp.empty``.
    xp : module

    Returns
    -------
    ChunkPlan
    """
    allocate = allocate or xp.empty
    bounds = chunk_bounds(fibers.fiber_ptr, nchunks, xp)
    if fibers.nfibers + len(bounds) > np.iinfo(np.int32).max:
        raise LayoutError(f"{fibers.nfibers} fibers on one rank: over the int32 Y slots of the "
                          f"SpTV kernels; use more ranks")
    chunks, arrays, offset = [], [], 0
    for index in range(len(bounds) - 1):
        chunk, chunk_arrays = build_chunk(fibers, index, int(bounds[index]),
                                          int(bounds[index + 1]), pointer_dtype, block_size, xp)
        chunk.offset = offset
        offset += chunk.nbytes
        chunks.append(chunk)
        arrays.append(chunk_arrays)
    plan = ChunkPlan(chunks, allocate(max(offset, ALIGN), np.uint8), np.dtype(pointer_dtype),
                     fibers.nfibers)
    for chunk, chunk_arrays in zip(chunks, arrays):
        for name, array in chunk_arrays.items():
            if len(array):
                plan.view(chunk, name)[:] = array
    return plan


def combine_split_fibers(plan, y):
    """Add the pieces of fibers split over chunks (in Y's slots past the fibers) to their
    fibers, in chunk order (as the device does it, so both give the same sums)."""
    fibers, slots = plan.split_table()
    if len(fibers):
        np.add.at(y, fibers, y[slots])


def fit_plan(fibers, params, streams, block_size, pointer_dtype, vector_bytes,
             allocate=None, xp=np):
    """Build the chunk plan of ``operation.params``; under ``device_memory_cap``, double the
    chunks until streaming fits (resident execution must hold the whole plan).

    Parameters
    ----------
    fibers : FiberTensor
    params : dict
        ``operation.params`` (``chunks``, ``execution``, ``device_memory_cap``).
    streams, block_size : int
        ``gpu.streams`` and ``gpu.block_size``.
    pointer_dtype : numpy dtype
    vector_bytes : int
        Bytes of v on the device.
    allocate : callable
        Buffer allocator (see :func:`build_plan`).
    xp : module
        ``numpy``, or ``cupy`` for fibers on the GPU (see :func:`build_plan`).

    Returns
    -------
    ChunkPlan

    Raises
    ------
    LayoutError
        The cap cannot be met (resident over it, or streaming with one nonzero per chunk, or
        with v and Y alone over it).
    """
    cap = parse_bytes(params["device_memory_cap"])
    itemsize = fibers.values.dtype.itemsize
    resident = params["execution"] == "resident"
    nchunks = params["chunks"]
    while True:
        plan = build_plan(fibers, nchunks, pointer_dtype, block_size, allocate, xp)
        if cap is None:
            return plan
        need = plan.device_bytes(resident, streams, itemsize, vector_bytes)
        if resident:
            if need > cap:
                raise LayoutError(f"resident execution needs {need} device "
                                  f"bytes, over operation.params.device_memory_cap = {cap}; "
                                  f"use execution: streaming")
            return plan
        if need <= cap:
            return plan
        # v, Y and its tables stay on the device whatever the chunks.
        kept = plan.device_bytes(resident, 0, itemsize, vector_bytes)
        if kept >= cap:
            raise LayoutError(f"streaming keeps v and Y on the device ({kept} bytes), over "
                              f"operation.params.device_memory_cap = {cap}; raise the cap or "
                              f"use more ranks")
        if nchunks >= max(fibers.nnz, 1):
            raise LayoutError(f"streaming needs {need} device bytes with one "
                              f"nonzero per chunk, over operation.params.device_memory_cap = "
                              f"{cap}; raise the cap or lower gpu.streams ({streams})")
        nchunks = min(nchunks * 2, max(fibers.nnz, 1))


@dataclass
class RankBlock:
    """What an SpTV engine works on: this rank's block of X by fibers, v, and the dtype of the
    fiber pointers and segment bounds on the device (``INDEX_T`` of the kernels).

    The chunk plan is built after the engine exists (its host buffer is page-locked on the GPU,
    see ``host_allocator``) and handed to ``engine.upload(plan)``.
    """

    fibers: FiberTensor
    vector: np.ndarray
    pointer_dtype: np.dtype
