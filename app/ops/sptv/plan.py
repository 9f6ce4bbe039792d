"""The SpTV chunk plan: a rank's fibers cut into chunks of balanced nnz, each laid out by length
bin and packed into one host buffer, plus the config helpers that size it (``parse_bytes`` for
``device_memory_cap``, :func:`fit_plan` for the cap).

The CPU and GPU engines run the same plan (the CPU with NumPy, the bins and segments included),
so the plan is tested without a GPU.
"""
import re
from dataclasses import dataclass, field

import numpy as np

from ...errors import LayoutError
from ...formats._fiber import FiberTensor

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


def cap_check(value):
    """Config check of ``device_memory_cap``."""
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


def fit_plan(fibers, params, streams, block_size, pointer_dtype, vector_bytes,
             allocate=np.empty):
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
        Host buffer allocator (see :func:`build_plan`).

    Returns
    -------
    ChunkPlan

    Raises
    ------
    LayoutError
        The cap cannot be met (resident over it, or streaming with one nonzero per chunk).
    """
    cap = parse_bytes(params["device_memory_cap"])
    itemsize = fibers.values.dtype.itemsize
    nchunks = params["chunks"]
    while True:
        plan = build_plan(fibers, nchunks, pointer_dtype, block_size, allocate)
        if cap is None:
            return plan
        if params["execution"] == "resident":
            need = plan.nbytes + itemsize * (fibers.nfibers + plan.max_chunk_segments *
                                             len(plan.chunks)) + vector_bytes
            if need > cap:
                raise LayoutError(f"resident execution needs {need} device "
                                  f"bytes, over operation.params.device_memory_cap = {cap}; "
                                  f"use execution: streaming")
            return plan
        need = plan.streaming_device_bytes(streams, itemsize, vector_bytes)
        if need <= cap:
            return plan
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
