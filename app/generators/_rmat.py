"""R-MAT graphs: edges made in fixed-size blocks, each from its own seeded stream (on the host,
compiled or by NumPy's passes, or on a GPU), and the unit rows of an edge list."""
import threading

import numpy as np

from ..compiled import HAVE_NUMBA, compiled, compiled_parallel, prange
from ..formats import CSRMatrix
from ._common import _sorted_unique_keys, _threaded, _whole
from ._keyed_permutation import _feistel_walk_one, _permutation, _permuted


# -- R-MAT: edges made in fixed-size blocks, each from its own seeded stream ---------------------

#: Edges per R-MAT block. Block ``b`` draws its edges from the stream seeded by ``(seed, 0, b)``,
#: so the graph of a seed is the same whichever ranks make which blocks. Changing it changes
#: every generated graph.
RMAT_EDGE_BLOCK = 1 << 16
#: edges from which a rank makes its R-MAT edges with compiled code (:func:`_rmat_block_host`)
#: rather than NumPy's passes. Below, Numba's import and the load of the compiled functions from
#: its cache cost more than they save: a fresh process made R-MAT 18's 1M edges (SpGEMM's
#: benchmark) in 0.56-0.81 s compiled and 0.21-0.25 s with NumPy, and sorted them into rows in
#: 0.15-0.24 against 0.07-0.10 s (development host); at 4M edges the compiled passes win.
_COMPILED_EDGES_MIN = 1 << 21
#: edges from which a GPU run makes a rank's R-MAT edges on its GPU (:func:`rmat_edges_on_device`):
#: where the host would take its compiled passes
DEVICE_EDGES_MIN = _COMPILED_EDGES_MIN
#: largest R-MAT scale: an edge's two vertex ids are made in one 64-bit word (2**32 vertices,
#: 16 * 2**32 edges by default: terabytes of edges)
RMAT_MAX_SCALE = 32


def rmat_blocks(scale, edge_factor):
    """How many edge blocks an R-MAT graph has."""
    nedges = int(edge_factor) << int(scale)
    return -(-nedges // RMAT_EDGE_BLOCK)


def _rmat_span(scale, edge_factor, blocks):
    """``(n, nedges, blocks, first, total)`` of R-MAT edge blocks ``blocks`` (a range; None:
    all): the vertices and edges of the graph, the blocks, their first edge and how many edges
    they hold."""
    if not 0 < scale <= RMAT_MAX_SCALE:
        raise ValueError(f"rmat_edges: scale must be 1..{RMAT_MAX_SCALE}, got {scale}")
    n = 1 << scale
    nedges = int(edge_factor) * n
    blocks = range(rmat_blocks(scale, edge_factor)) if blocks is None else blocks
    if not isinstance(blocks, range) or blocks.step != 1:
        raise ValueError("rmat_edges: blocks must be a range of consecutive edge blocks")
    first = blocks[0] * RMAT_EDGE_BLOCK if len(blocks) else 0
    total = max(0, min(nedges, (blocks[-1] + 1) * RMAT_EDGE_BLOCK) - first) if len(blocks) else 0
    return n, nedges, blocks, first, total


def rmat_edges(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, seed=0, symmetric=False,
               blocks=None):
    """The (source, destination) vertex pairs of R-MAT edge blocks ``blocks`` (a range; default
    all), vertex ids permuted, with the reverse edges when ``symmetric``. Duplicates are kept
    (the matrix collapses them)."""
    n, nedges, blocks, first, total = _rmat_span(scale, edge_factor, blocks)
    # The quadrant of a level is the number of thresholds <= its uniform draw r (0..3): a row
    # bit where r >= a + b (quadrants 2, 3), a column bit in quadrants 1 and 3.
    low, middle, high = a, a + b, a + b + c
    src = np.zeros(total, dtype=np.int64)
    dst = np.zeros(total, dtype=np.int64)
    permutation = _permutation(n, seed)
    walk = (*permutation.words(), permutation.keys)
    buffers = threading.local()
    use_compiled = HAVE_NUMBA and total >= _COMPILED_EDGES_MIN

    def make(block):
        lo = block * RMAT_EDGE_BLOCK
        count = min(RMAT_EDGE_BLOCK, nedges - lo)
        if count <= 0:  # a block past the last edge
            return
        out_src, out_dst = src[lo - first:lo - first + count], dst[lo - first:lo - first + count]
        # One draw per level and edge, level after level: the stream of (seed, 0, block) in the
        # order of one rng.random(count) per level.
        rng = np.random.default_rng([seed, 0, block])
        if use_compiled:
            if not hasattr(buffers, "words"):
                buffers.words = np.empty(RMAT_EDGE_BLOCK, dtype=np.uint64)
            _rmat_block_host(rng, scale, low, middle, high, buffers.words[:count], *walk,
                             out_src, out_dst)
            return
        _rmat_bits_numpy(rng.random((scale, count)), low, middle, high, out_src, out_dst)
        # Spread the heavy vertices over the matrix with a permutation computed per id (no
        # n-sized table on every rank).
        out_src[:] = _permuted(out_src, permutation, compiled_walk=False)
        out_dst[:] = _permuted(out_dst, permutation, compiled_walk=False)

    # Blocks are contiguous edge ranges written in place: threads make them at once (NumPy and
    # the generator release the GIL), the same edges whatever the thread count.
    _threaded(make, blocks)
    return _with_reverse_edges(src, dst) if symmetric else (src, dst)


def _with_reverse_edges(src, dst):
    """The edges ``(src, dst)`` followed by their reverses (a symmetric R-MAT's)."""
    return np.concatenate([src, dst]), np.concatenate([dst, src])


#: PCG64's multiplier (NumPy's ``PCG64``: a 128-bit LCG, XSL-RR output)
PCG64_MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645
_MASK128 = (1 << 128) - 1


def lcg_jump(steps, multiplier, increment):
    """``(A, C)`` such that ``steps`` steps of the LCG ``s -> multiplier * s + increment``
    (modulo 2**128) take ``s`` to ``A * s + C``: squaring and multiplying, O(log steps) (the
    jump-ahead of Brown, "Random number generation with arbitrary strides", 1994). Python ints.
    The GPU's R-MAT kernel runs the same loop."""
    total_multiplier, total_increment = 1, 0
    while steps:
        if steps & 1:
            total_multiplier = total_multiplier * multiplier & _MASK128
            total_increment = (total_increment * multiplier + increment) & _MASK128
        increment = (multiplier + 1) * increment & _MASK128
        multiplier = multiplier * multiplier & _MASK128
        steps >>= 1
    return total_multiplier, total_increment


def rmat_block_table(scale, edge_factor, seed, blocks):
    """What a GPU needs to make R-MAT edge blocks ``blocks`` (a range) with the host's draws: per
    block, its PCG64 state and increment (NumPy's generator seeded by ``(seed, 0, block)``) and
    the jump of one level (the block's edge count in steps: level ``l`` of edge ``e`` is draw
    ``l * count + e`` of the block's stream), each 128-bit value as two uint64 words (high,
    low): ``(len(blocks), 8)`` uint64, columns state, increment, level multiplier, level
    increment."""
    nedges = int(edge_factor) << int(scale)
    table = np.zeros((len(blocks), 8), dtype=np.uint64)
    words = (1 << 64) - 1
    for row, block in enumerate(blocks):
        state = np.random.default_rng([seed, 0, block]).bit_generator.state["state"]
        count = min(RMAT_EDGE_BLOCK, nedges - block * RMAT_EDGE_BLOCK)
        values = (state["state"], state["inc"],
                  *lcg_jump(max(count, 0), PCG64_MULTIPLIER, state["inc"]))
        table[row] = [part for value in values for part in (value >> 64, value & words)]
    return table


def rmat_edges_on_device(ctx, scale, edge_factor=16, a=0.57, b=0.19, c=0.19, seed=0,
                         symmetric=False, blocks=None):
    """:func:`rmat_edges` made on this rank's GPU (PyCUDA, ``kernels_cu/generators.cu``'s
    ``rmat_edges``; ``ctx``: the run context, which loads kernels) and copied to the host: the same
    edges, bit for bit (each edge's draws found by jumping the block's stream,
    :func:`rmat_block_table`). On the host the draws are CPU-bound and the ranks of a node share
    its cores, so there the generation does not shrink with ranks; here each rank's GPU makes
    its blocks."""
    n, _, blocks, first, total = _rmat_span(scale, edge_factor, blocks)
    from ..gpu import device_rmat_edges
    src, dst = device_rmat_edges(ctx, rmat_block_table(scale, edge_factor, seed, blocks),
                                 first, total, RMAT_EDGE_BLOCK, scale,
                                 (a, a + b, a + b + c),
                                 _permutation(n, seed))
    return _with_reverse_edges(src, dst) if symmetric else (src, dst)


def rmat_part_edges(params, blocks, device=None):
    """:func:`rmat_edges` of ``params`` (an R-MAT spec's) for edge blocks ``blocks``: on the GPU
    of ``device`` (a GPU run's context) from :data:`DEVICE_EDGES_MIN` edges
    (:func:`rmat_edges_on_device`), else on the host; the same edges either way."""
    if device is not None and \
            _rmat_span(params["scale"], params["edge_factor"], blocks)[4] >= DEVICE_EDGES_MIN:
        return rmat_edges_on_device(device, **params, blocks=blocks)
    return rmat_edges(**params, blocks=blocks)


#: device memory a key of :func:`hisparse.gpu.device_rmat_unit_rows` may take at once (the key,
#: its scan, the sort's space, its column), with a fifth of the free memory left over
UNIT_ROWS_BYTES_PER_KEY = 32


class RmatRowsOnDevice:
    """An R-MAT graph's whole unit matrix made on a GPU
    (:func:`hisparse.gpu.device_rmat_unit_rows`):
    the rows :func:`rmat` makes on the host, from every edge block, without an edge list on the
    host. Every rank of a GPU run makes the whole graph (a GPU makes R-MAT 23's 134M edges in a
    fraction of the time the host's cores took to sort them into rows) and keeps its rows, so
    no edge and no row moves between the ranks, and every rank knows every row's length for the
    nnz-balanced split (:func:`hisparse.layout.generate_row_part`)."""

    def __init__(self, params):
        self.params = dict(params)

    def keys(self):
        """The keys the device sorts: one an edge, two when symmetric."""
        edges = int(self.params["edge_factor"]) << int(self.params["scale"])
        return edges * (2 if self.params["symmetric"] else 1)

    def fits(self):
        """Whether this rank's GPU makes it: from :data:`DEVICE_EDGES_MIN` edges, with CuPy, and
        its keys' memory (:data:`UNIT_ROWS_BYTES_PER_KEY`) within 4/5 of the free device
        memory. (The ranks must agree before any makes it: the caller's all-reduce.)"""
        if self.keys() < DEVICE_EDGES_MIN:
            return False
        from ..gpu import fits_free_memory, optional_cupy
        cupy = optional_cupy("R-MAT's rows on the GPU")
        return cupy is not None and fits_free_memory(cupy, self.keys() * UNIT_ROWS_BYTES_PER_KEY)

    def make(self):
        """``(indptr, columns)``: the row pointers (int64, host) and the column indices (a CuPy
        int64 array on the current GPU) of the whole unit matrix, :func:`unit_rows` of
        :func:`rmat_edges` of every block (the same matrix, entry for entry)."""
        from ..gpu import device_rmat_unit_rows, import_cupy
        p = self.params
        scale, edge_factor = int(p["scale"]), int(p["edge_factor"])
        n, nedges, blocks, _, _ = _rmat_span(scale, edge_factor, None)
        return device_rmat_unit_rows(
            import_cupy("R-MAT's rows on the GPU"),
            rmat_block_table(scale, edge_factor, p["seed"], blocks), nedges, RMAT_EDGE_BLOCK,
            scale, (p["a"], p["a"] + p["b"], p["a"] + p["b"] + p["c"]),
            _permutation(n, p["seed"]), p["symmetric"])

    @staticmethod
    def download(columns, first, last, dtype=np.int64):
        """Entries ``first .. last - 1`` of :meth:`make`'s columns on the host, as ``dtype``
        (narrowed on the device: a run whose indices are int32 copies half the bytes and casts
        nothing on the host; R-MAT 23's 131M int64 columns took 0.35 s to copy at one rank,
        2xH200 host, and their cast to int32 0.2-0.35 s)."""
        from ..gpu import host_copy
        return host_copy(columns[first:last].astype(dtype, copy=False))

    @staticmethod
    def release():
        """Return the device memory that :meth:`make` cached (CuPy's pool) once its columns
        are let go."""
        from ..gpu import release_pool
        release_pool()


def _rmat_bits_numpy(draws, low, middle, high, src, dst):
    """Bit ``l`` of each edge's source and destination from its draw ``r`` of level ``l``
    (``draws``: levels x edges): a row bit where ``r >= middle`` (quadrants 2, 3), a column bit
    in quadrants 1 and 3; ORed into ``src`` / ``dst`` (zeros). The reference of the compiled
    :func:`_rmat_block_host`, and what runs without Numba."""
    rows = np.packbits(draws >= middle, axis=0, bitorder="little")
    columns = np.packbits(((draws >= low) & (draws < middle)) | (draws >= high), axis=0,
                          bitorder="little")
    for byte in range(rows.shape[0]):  # 8 levels per byte, least significant first
        src |= rows[byte].astype(np.int64) << (8 * byte)
        dst |= columns[byte].astype(np.int64) << (8 * byte)


@compiled
def _rmat_block_host(rng, levels, low, middle, high, words, limit, half, mask, keys, src, dst):
    """One R-MAT edge block, compiled: :func:`_rmat_bits_numpy` of ``rng.random((levels,
    len(src)))`` (each draw taken from the generator as it is used: Numba calls NumPy's bit
    generator, so the stream is the same), then :func:`keyed_permutation` of every source and
    destination (the walk's ``limit, half, mask, keys``), written to ``src`` and ``dst``.

    While the levels are drawn an edge's two ids share one word of ``words`` (source bits low,
    destination bits from bit 32: at most 32 levels), 512 KiB for a block, which stays in the
    core's cache over the levels' passes. Until stop 55 the draws went into a (levels, 65536)
    array first and the bits into two int64 arrays (24 MB a block written and read back) and
    the permutation ran as two more calls: R-MAT 23's edges took 1.51-1.65 s on the 2xH200
    host's 32 threads, now 1.40-1.50 s; the draws themselves bound it, and a node's ranks share
    its cores (two processes making half each took as long), hence the GPU's path
    (:func:`rmat_edges_on_device`)."""
    words[:] = 0
    for level in range(levels):
        row_shift = np.uint64(level)
        column_shift = np.uint64(32 + level)
        for edge in range(words.shape[0]):
            r = rng.random()
            row = np.uint64(r >= middle)
            column = np.uint64(((r >= low) and (r < middle)) or (r >= high))
            words[edge] |= (row << row_shift) | (column << column_shift)
    low_half = np.uint64(0xFFFFFFFF)
    for edge in range(words.shape[0]):
        word = words[edge]
        src[edge] = np.int64(_feistel_walk_one(word & low_half, limit, half, mask, keys))
        dst[edge] = np.int64(_feistel_walk_one(word >> np.uint64(32), limit, half, mask, keys))


#: edges from which :func:`unit_rows` groups and sorts them by row on the host's threads
#: (compiled) rather than sorting their keys with NumPy (as for the edges themselves,
#: :data:`_COMPILED_EDGES_MIN`)
_COMPILED_ROWS_MIN = 1 << 21


def unit_rows(src, dst, rows, ncols):
    """CSR block of the rows ``rows`` (ascending) from the edges ``(src, dst)`` whose sources all
    lie in ``rows``: one unit entry per distinct edge, columns sorted; int64 indices."""
    rows = np.asarray(rows, dtype=np.int64)
    ncols = int(ncols)
    src = np.asarray(src, dtype=np.int64)
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1:  # a range: no search
        local_rows = src - rows[0] if rows[0] else src
    else:
        local_rows = np.searchsorted(rows, src)
    if HAVE_NUMBA and len(src) >= _COMPILED_ROWS_MIN:
        indptr, columns = _rows_by_buckets(local_rows, np.asarray(dst, np.int64), len(rows))
        return CSRMatrix(indptr, columns, np.ones(len(columns)), (len(rows), ncols))
    keys = _sorted_unique_keys(local_rows * ncols + np.asarray(dst, np.int64),
                               max(len(rows), 1) * max(ncols, 1))
    local, columns = np.divmod(keys, ncols)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.bincount(local, minlength=len(rows)), out=indptr[1:])
    return CSRMatrix(indptr, columns, np.ones(len(keys)), (len(rows), ncols))


def _rows_by_buckets(local_rows, dst, nrows):
    """``(indptr, columns)`` of :func:`unit_rows` from the edges' local rows and columns, on the
    host's threads: the edges grouped by ranges of rows (buckets, :func:`group_pairs`), then
    each bucket counting-sorted by row and each row's columns sorted and de-duplicated on its
    own thread. The NumPy path's serial passes over every key (the bucket numbers' sort, the
    gather, the division back into rows and columns) took most of R-MAT 23's one-rank
    generation: 7.6 s of 9.8 on 32 cores."""
    from ..partition import group_pairs
    from ..threads import usable_cores
    edges = len(local_rows)
    if not edges or not nrows:
        return np.zeros(nrows + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    buckets = max(1, min(8 * usable_cores(), nrows, 4096))
    row_cuts = np.linspace(0, nrows, buckets + 1).astype(np.int64)
    grouped_rows, grouped_dst, bucket_start = group_pairs(local_rows, dst, row_cuts)
    sorted_dst = np.empty(edges, dtype=np.int64)
    distinct = np.zeros(nrows, dtype=np.int64)
    row_start = np.zeros(nrows, dtype=np.int64)
    _sort_buckets(grouped_rows, grouped_dst, bucket_start, row_cuts, sorted_dst, row_start,
                  distinct)
    del grouped_rows, grouped_dst
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(distinct, out=indptr[1:])
    columns = np.empty(int(indptr[-1]), dtype=np.int64)
    _compact_rows(sorted_dst, row_start, indptr, row_cuts, columns)
    return indptr, columns


@compiled_parallel
def _sort_buckets(grouped_rows, grouped_dst, bucket_start, row_cuts, sorted_dst, row_start,
                  distinct):
    """Per bucket (its edges at ``bucket_start[b]:bucket_start[b+1]``, its rows
    ``row_cuts[b]:row_cuts[b+1]``): the edges counting-sorted by row into ``sorted_dst`` (row
    r's from ``row_start[r]``), each row's columns sorted and de-duplicated in place,
    ``distinct[r]`` their count. A bucket writes only its own rows' entries."""
    for bucket in prange(len(bucket_start) - 1):
        lo, hi = bucket_start[bucket], bucket_start[bucket + 1]
        first = row_cuts[bucket]
        fill = np.zeros(row_cuts[bucket + 1] - first, dtype=np.int64)
        for edge in range(lo, hi):
            fill[grouped_rows[edge] - first] += 1
        at = lo
        for k in range(len(fill)):  # counts -> where each row's edges go
            count = fill[k]
            fill[k] = at
            row_start[first + k] = at
            at += count
        for edge in range(lo, hi):
            k = grouped_rows[edge] - first
            sorted_dst[fill[k]] = grouped_dst[edge]
            fill[k] += 1
        for k in range(len(fill)):
            begin, end = row_start[first + k], fill[k]
            if end - begin > 1:
                sorted_dst[begin:end].sort()
            kept = 0
            for position in range(begin, end):
                value = sorted_dst[position]
                if kept == 0 or value != sorted_dst[begin + kept - 1]:
                    sorted_dst[begin + kept] = value
                    kept += 1
            distinct[first + k] = kept


@compiled_parallel
def _compact_rows(sorted_dst, row_start, indptr, row_cuts, columns):
    """Each row's distinct columns (the first ``indptr[r+1] - indptr[r]`` of its places in
    ``sorted_dst``) laid end to end."""
    for bucket in prange(len(row_cuts) - 1):
        for row in range(row_cuts[bucket], row_cuts[bucket + 1]):
            source = row_start[row]
            for k in range(indptr[row + 1] - indptr[row]):
                columns[indptr[row] + k] = sorted_dst[source + k]


def rmat(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, seed=0, symmetric=False):
    """R-MAT power-law graph with ``2**scale`` vertices and about ``edge_factor * 2**scale`` edges.

    Each edge descends ``scale`` levels of the quadrant tree with probabilities a, b, c and
    d = 1 - a - b - c. Edges are drawn in blocks of :data:`RMAT_EDGE_BLOCK`, block ``b`` from the
    stream seeded by ``(seed, 0, b)``, so ranks that each make some blocks build the same graph
    (:func:`rmat_edges`). Vertex ids are permuted (:func:`keyed_permutation`) so heavy rows are
    spread over the matrix; duplicate edges collapse to one unit entry.
    """
    n = 1 << scale
    src, dst = rmat_edges(scale, edge_factor, a, b, c, seed, symmetric)
    return _whole(unit_rows(src, dst, np.arange(n, dtype=np.int64), n), symmetric=symmetric)
