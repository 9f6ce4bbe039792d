"""Synthetic inputs with a seed: Poisson stencils, R-MAT graphs, Trefethen matrices, random
matrices and FROSTT-like random tensors.

A generator spec is a mapping ``{kind: NAME, ...params}``; :func:`validate_spec` checks it against
the generator's parameters and :func:`generate` builds the object. The same specs are accepted by
``input.generate`` in a run config and by ``hisparse generate``.

Every matrix generator can also make a part of its matrix alone (:func:`part_source`): stencil
and band rows are built per row, random matrices in fixed row blocks and R-MAT edges in fixed edge
blocks, each block from its own stream seeded by ``(seed, 0, block)``. So ranks that each make
their own rows get, together, exactly the matrix :func:`generate` makes for the same seed,
whatever their number. The random tensor is made by fiber ranges the same way
(:func:`tensor_source`), every random number a hash of the seed and the fiber's number, so a
range is the same bits whether NumPy or CuPy (on a GPU) makes it.
"""
import math
import threading
from dataclasses import dataclass

import numpy as np

from .compiled import HAVE_NUMBA, compiled, compiled_parallel, prange, splitmix64
from .config import Setting, positive, non_negative, validate_section
from .threads import threaded
from .errors import ConfigError
from .formats import COOTensor, CSRMatrix
from .arrays import array_module, distinct_of_sorted, sorted_distinct


#: keys below which :func:`_sorted_unique_keys` sorts in one piece
_BUCKET_SORT_MIN = 1 << 22


def _sorted_unique_keys(keys, key_range):
    """:func:`~hisparse.arrays.sorted_distinct` of ``keys`` (int64 in ``[0, key_range)``),
    sorted in buckets of the key range on the host's threads: the buckets' keys are gathered
    apart (a stable sort of small bucket numbers, NumPy's radix sort), each bucket sorted and
    de-duplicated on its own thread, and the buckets laid end to end are sorted because the
    ranges are. One sort of all
    of R-MAT 23's 134M edge keys took most of the one-rank generation."""
    from .threads import usable_cores
    cores = usable_cores()
    if len(keys) < _BUCKET_SORT_MIN or cores < 4:  # too few keys or cores to repay the pass
        return sorted_distinct(keys)
    buckets = min(4 * cores, 1024)
    width = -(-int(key_range) // buckets)
    bucket = (keys // width).astype(np.int16)
    order = np.argsort(bucket, kind="stable")
    starts = np.searchsorted(bucket[order], np.arange(buckets + 1, dtype=np.int16))
    grouped = keys[order]
    del order, bucket
    parts = [None] * buckets

    def sort_bucket(index):
        part = grouped[starts[index]:starts[index + 1]]
        part.sort()
        parts[index] = distinct_of_sorted(part)
    threaded(sort_bucket, range(buckets), name="hisparse-sort")
    return np.concatenate(parts)


def _dims_check(value):
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                            for v in value):
        return "must be a non-empty list of positive integers"
    return None


def _probability(value):
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


#: Rows of a stencil or band matrix built per step (temporaries of a few MB per worker).
_ROW_CHUNK = 1 << 15
#: Most threads that build a band matrix's rows at once (beyond that the steps wait on memory).
_MAX_BUILD_WORKERS = 32


def _each_chunk(count, work):
    """``work(lo, hi)`` over the consecutive chunks of ``count`` rows, by a pool of threads when
    there are several chunks: NumPy releases the GIL in its array operations, so the chunks are
    built at once on as many cores as the process may use (at most :data:`_MAX_BUILD_WORKERS`).
    Each chunk writes its own slices of preallocated arrays, so the result does not depend on
    the number of threads."""
    _threaded(lambda lo: work(lo, min(lo + _ROW_CHUNK, count)), range(0, count, _ROW_CHUNK))


def _threaded(work, items):
    """:func:`~hisparse.threads.threaded` with at most :data:`_MAX_BUILD_WORKERS` threads."""
    threaded(work, items, _MAX_BUILD_WORKERS, "hisparse-generate")


def _poisson_layout(dims, stencil):
    """Checked ``(dims, stencil)`` of a Poisson spec, the stencil defaulted."""
    dims = [int(d) for d in dims]
    if len(dims) not in (2, 3):
        raise ValueError("poisson dims must have 2 or 3 entries")
    stencil = stencil or (5 if len(dims) == 2 else 7)
    expected = (5, 9) if len(dims) == 2 else (7, 27)
    if stencil not in expected:
        raise ValueError(f"stencil {stencil} does not match {len(dims)}D dims")
    return dims, stencil


def _poisson_offsets(dims, stencil):
    """The stencil's neighbour offsets (one vector per neighbour, the centre included), ordered
    by linear offset so that every row's columns come out sorted."""
    ndim = len(dims)
    if stencil in (5, 7):
        offsets = [np.zeros(ndim, np.int64)]
        for axis in range(ndim):
            for step in (-1, 1):
                offset = np.zeros(ndim, np.int64)
                offset[axis] = step
                offsets.append(offset)
    else:  # the full box
        grids = np.meshgrid(*([np.array([-1, 0, 1])] * ndim), indexing="ij")
        offsets = list(np.stack([g.ravel() for g in grids], axis=1).astype(np.int64))
    strides = np.array([int(np.prod(dims[axis + 1:], dtype=np.int64)) for axis in range(ndim)],
                       dtype=np.int64)
    return sorted(offsets, key=lambda o: int(o @ strides)), strides


class _BandRows:
    """Rows of a matrix whose row ``i`` holds columns ``i + shift`` for a fixed list of shifts,
    each present where a validity test passes (stencils on a grid, Trefethen's power-of-two
    bands): any set of rows is built without the others, so ranks make their own rows.

    Shift 0 (the diagonal) is present in every row and holds ``diagonal(rows)``; every other
    present entry holds ``off_diagonal``. ``pattern(rows)`` gives the present entries, a bool
    array ``(len(rows), len(shifts))``, and where each row's diagonal entry falls among them;
    ``count(rows)`` the entries of each row (int64), without the mask."""

    def __init__(self, nrows, shifts, pattern, count, diagonal, off_diagonal):
        self.nrows, self.shifts = int(nrows), np.asarray(shifts, dtype=np.int64)
        self.pattern, self.count = pattern, count
        self.diagonal, self.off_diagonal = diagonal, float(off_diagonal)

    def lengths(self, rows):
        """Entries of each row in ``rows`` (int64)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(len(rows), dtype=np.int64)

        def count(lo, hi):
            out[lo:hi] = self.count(rows[lo:hi])

        _each_chunk(len(rows), count)
        return out

    def build(self, rows, ncols, lengths=None):
        """The rows ``rows`` (ascending) as a CSRMatrix of shape ``(len(rows), ncols)``, columns
        sorted; int64 row pointers, int32 columns when they fit. Chunks of rows are built by
        threads straight into the result's arrays (:func:`_each_chunk`). ``lengths``: the
        rows' :meth:`lengths` when the caller has them already."""
        rows = np.asarray(rows, dtype=np.int64)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(self.lengths(rows) if lengths is None else lengths, out=indptr[1:])
        limit = np.iinfo(np.int32).max
        column_dtype = np.int32 if ncols <= limit else np.int64
        # Candidate columns in the narrow dtype too when every row number fits it: the present
        # ones are columns (they fit); absent ones may wrap, but the mask drops them.
        candidate_dtype = column_dtype if self.nrows <= limit else np.int64
        shifts = self.shifts.astype(candidate_dtype)
        indices = np.empty(int(indptr[-1]), dtype=column_dtype)
        data = np.empty(int(indptr[-1]), dtype=np.float64)

        def fill(lo, hi):
            chunk = rows[lo:hi]
            mask, diagonal_slot = self.pattern(chunk)
            start, stop = indptr[lo], indptr[hi]
            indices[start:stop] = (chunk.astype(candidate_dtype)[:, None] + shifts)[mask]
            values = data[start:stop]
            values.fill(self.off_diagonal)
            values[indptr[lo:hi] - start + diagonal_slot] = self.diagonal(chunk)

        _each_chunk(len(rows), fill)
        return CSRMatrix(indptr, indices, data, (len(rows), int(ncols)))


def _grid_coordinates(rows, dims):
    """The grid coordinates of row-major ``rows`` (as ``np.unravel_index``, in int32 when the
    row numbers fit: twice as fast)."""
    if math.prod(dims) <= np.iinfo(np.int32).max:
        rows = rows.astype(np.int32)
    coordinates = []
    for size in dims[:0:-1]:
        rows, coordinate = np.divmod(rows, size)
        coordinates.append(coordinate)
    return [rows] + coordinates[::-1]


def _poisson_band(dims, stencil, scale):
    """:class:`_BandRows` of the Poisson matrix: centre ``2 * ndim`` (5/7 points) or
    ``stencil - 1`` (9/27 points), -1 at every neighbour, all times ``scale``."""
    dims, stencil = _poisson_layout(dims, stencil)
    offsets, strides = _poisson_offsets(dims, stencil)
    offsets = np.array(offsets, dtype=np.int64)
    shape = np.array(dims, dtype=np.int64)
    centre_value = float(2 * len(dims) if stencil in (5, 7) else stencil - 1)
    centre = np.flatnonzero(~offsets.any(axis=1))[0]
    # Along each axis a grid point is at the low edge (bit 0), at the high edge (bit 1), both
    # (an axis of one point) or neither; the 4**ndim combinations' masks are tabulated once, so
    # a row's mask, length and diagonal slot are lookups of its class.
    ndim = len(dims)
    masks = np.ones((4 ** ndim, len(offsets)), dtype=bool)
    for code in range(4 ** ndim):
        for axis in range(ndim):
            edges = (code >> (2 * axis)) & 3
            steps = np.array([not edges & 1, True, not edges & 2])  # steps -1, 0, +1 stay on
            masks[code] &= steps[offsets[:, axis] + 1]
    counts = masks.sum(axis=1)
    before_centre = masks[:, :centre].sum(axis=1)

    def classes(rows):
        code = np.zeros(len(rows), dtype=np.intp)
        for axis, coordinate in enumerate(_grid_coordinates(rows, dims)):
            code |= ((coordinate == 0) | ((coordinate == shape[axis] - 1) << 1)) << (2 * axis)
        return code

    def pattern(rows):
        code = classes(rows)
        return masks[code], before_centre[code]

    def diagonal(rows):
        return np.full(len(rows), centre_value * scale)

    return _BandRows(int(np.prod(shape)), offsets @ strides, pattern,
                     lambda rows: counts[classes(rows)], diagonal, -1.0 * scale)


def poisson(dims, stencil=None, scale=1.0):
    """Negative Laplacian on a regular 2D/3D grid (SPD, symmetric).

    Rows are numbered row-major (the first grid dimension varies slowest, as in C arrays). The
    5/7-point stencil is the Kronecker sum of second differences (centre ``2 * ndim``); the
    9/27-point one the full box (centre ``stencil - 1``, -1 elsewhere: diagonally dominant,
    hence SPD). Built row by row (:func:`poisson_rows` gives any set of rows alone).

    Parameters
    ----------
    dims : list of int
        Grid points per dimension, length 2 or 3; the matrix has ``prod(dims)`` rows.
    stencil : int, optional
        5 or 9 (2D), 7 or 27 (3D); defaults to 5 / 7.
    """
    band = _poisson_band(dims, stencil, scale)
    return _whole(band.build(np.arange(band.nrows, dtype=np.int64), band.nrows), symmetric=True)


def poisson_rows(dims, rows, stencil=None, scale=1.0):
    """Rows ``rows`` (ascending global ids) of :func:`poisson`'s matrix, shape
    ``(len(rows), prod(dims))``, equal to those rows of the whole matrix."""
    band = _poisson_band(dims, stencil, scale)
    return band.build(rows, band.nrows)


def _whole(matrix, symmetric=False):
    """A generated whole matrix, its index arrays in the narrowest dtype that holds them."""
    limit = np.iinfo(np.int32).max
    indptr = matrix.indptr.astype(np.int32 if matrix.nnz <= limit else np.int64, copy=False)
    indices = matrix.indices.astype(np.int32 if matrix.ncols <= limit else np.int64, copy=False)
    return CSRMatrix(indptr, indices, matrix.data, matrix.shape, symmetric)


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
    from .gpu import device_rmat_edges
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
    """An R-MAT graph's whole unit matrix made on a GPU (:func:`hisparse.gpu.device_rmat_unit_rows`):
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
        from .gpu import fits_free_memory, optional_cupy
        cupy = optional_cupy("R-MAT's rows on the GPU")
        return cupy is not None and fits_free_memory(cupy, self.keys() * UNIT_ROWS_BYTES_PER_KEY)

    def make(self):
        """``(indptr, columns)``: the row pointers (int64, host) and the column indices (a CuPy
        int64 array on the current GPU) of the whole unit matrix, :func:`unit_rows` of
        :func:`rmat_edges` of every block (the same matrix, entry for entry)."""
        from .gpu import device_rmat_unit_rows, import_cupy
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
        from .gpu import host_copy
        return host_copy(columns[first:last].astype(dtype, copy=False))

    @staticmethod
    def release():
        """Return the device memory that :meth:`make` cached (CuPy's pool) once its columns
        are let go."""
        from .gpu import release_pool
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
    from .partition import group_pairs
    from .threads import usable_cores
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


#: :func:`keyed_permutation`'s default rounds and stream
PERMUTATION_ROUNDS, PERMUTATION_STREAM = 4, 1


def keyed_permutation(values, n, seed, rounds=PERMUTATION_ROUNDS, stream=PERMUTATION_STREAM):
    """A pseudo-random bijection of ``[0, n)``, keyed by ``(seed, stream)``, applied to ``values``
    (a NumPy or CuPy array: the result is the same bits either way).

    A balanced Feistel network over the smallest even power of two >= n, with cycle walking back
    into ``[0, n)``: every id is mapped on its own, so ranks permute their ids without an
    ``n``-sized table. (A bijection keeps the multiset of degrees or row lengths, so the
    statistics of what it permutes are those of any other permutation.)
    """
    return _permuted(values, _permutation(n, seed, rounds, stream))


def _permuted(values, params, compiled_walk=HAVE_NUMBA):
    """:func:`keyed_permutation` with its :class:`Permutation` made (a caller permuting many
    arrays with one key makes it once: its keys come from a seed sequence, ~45 us); on the host
    by the compiled walk where ``compiled_walk``, else by NumPy's passes."""
    xp = array_module(values)
    values = xp.asarray(values).astype(xp.int64, copy=False)
    if xp is not np:  # one kernel, each id walking on its own: the same bits
        from .gpu import device_keyed_permutation
        return device_keyed_permutation(xp, values.astype(xp.uint64), params).view(xp.int64)
    limit, half, mask = params.words()
    keys = params.keys
    values = values.astype(np.uint64)
    if not compiled_walk:
        return _feistel_walk_numpy(values, limit, half, mask, keys).astype(np.int64)
    out = np.empty(len(values), dtype=np.uint64)
    _feistel_walk_host(values, limit, half, mask, keys, out)
    return out.view(np.int64)  # every id < n < 2**63


@dataclass
class Permutation:
    """:func:`keyed_permutation`'s parameters: ids walk until they fall below ``limit``;
    ``shift`` and ``low`` split a word into its halves (``low`` the mask of the lower); ``keys``
    the rounds' keys (uint64)."""

    limit: int
    shift: int
    low: int
    keys: np.ndarray

    def words(self):
        """``(limit, shift, low)`` as uint64 scalars: the walk's operands (compiled code and
        kernels take them so)."""
        return np.uint64(self.limit), np.uint64(self.shift), np.uint64(self.low)


def _permutation(n, seed, rounds=PERMUTATION_ROUNDS, stream=PERMUTATION_STREAM):
    """:func:`keyed_permutation`'s :class:`Permutation`: the network spans the smallest even
    number of bits >= those of ``n - 1`` (at least 2); the rounds' keys come from ``(seed,
    stream)``."""
    bits = max(2, int(n - 1).bit_length())
    bits += bits & 1
    keys = np.random.SeedSequence([seed, stream]).generate_state(rounds, dtype=np.uint64)
    return Permutation(limit=int(n), shift=bits // 2, low=(1 << (bits // 2)) - 1, keys=keys)


def _feistel(x, half, mask, keys):
    """The Feistel network of :func:`keyed_permutation` on a NumPy uint64 array."""
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ (_mix64(right ^ key) & mask)
    return (left << half) | right


def _feistel_walk_numpy(values, n, half, mask, keys):
    """:func:`keyed_permutation` in NumPy array passes: the network on every id, then again on
    those still outside ``[0, n)`` until none is. The reference of the compiled walk, and what
    runs without Numba; its passes over the few ids left shrink to a handful of elements, which
    cost the interpreter more than the arithmetic (an R-MAT edge block of 65,536 ids takes
    about 17)."""
    out = _feistel(values, half, mask, keys)
    outside = np.flatnonzero(out >= n)
    while len(outside):
        out[outside] = _feistel(out[outside], half, mask, keys)
        outside = outside[out[outside] >= n]
    return out


@compiled
def _feistel_walk_host(values, n, half, mask, keys, out):
    """:func:`keyed_permutation` compiled, each id walking on its own (the device kernel's loop):
    the same bits as :func:`_feistel_walk_numpy`, one pass. Runs without the interpreter's lock,
    so the threads that make R-MAT's edge blocks permute at once."""
    for i in range(values.shape[0]):
        out[i] = _feistel_walk_one(values[i], n, half, mask, keys)


@compiled
def _feistel_walk_one(v, n, half, mask, keys):
    """One id's walk through :func:`keyed_permutation`'s network (uint64 operands)."""
    while True:
        left = v >> half
        right = v & mask
        for r in range(keys.shape[0]):
            left, right = right, left ^ (splitmix64(right ^ keys[r]) & mask)
        v = (left << half) | right
        if v < n:
            return v


def _mix64(x):
    """SplitMix64's finaliser: a bijective scramble of 64-bit words (wrapping arithmetic; NumPy
    or CuPy uint64 arrays, or NumPy scalars)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _primes(count):
    """The first ``count`` primes, int64."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    limit = max(16, int(count * (np.log(count) + np.log(np.log(count + 2)) + 2)))
    sieve = np.ones(limit + 1, dtype=bool)
    sieve[:2] = False
    for p in range(2, int(limit ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = False
    return np.flatnonzero(sieve)[:count].astype(np.int64)


def _trefethen_band(n):
    """:class:`_BandRows` of Trefethen_n: the ``i``-th prime on the diagonal, ones at
    ``|i - j| = 2**k``."""
    steps = np.array([1 << k for k in range(max(int(n - 1).bit_length(), 0)) if (1 << k) < n],
                     dtype=np.int64)
    shifts = np.concatenate([-steps[::-1], [0], steps])
    primes = _primes(n).astype(np.float64)

    def below(rows):  # present entries left of the diagonal: the steps 2**k <= row
        return np.searchsorted(steps, rows, side="right")

    def pattern(rows):
        moved = rows[:, None] + shifts[None, :]
        return (moved >= 0) & (moved < n), below(rows)

    def count(rows):
        return 1 + below(rows) + below(n - 1 - rows)

    return _BandRows(n, shifts, pattern, count, lambda rows: primes[rows], 1.0)


def trefethen(n):
    """Trefethen_n: primes 2, 3, 5, ... on the diagonal and ones where ``|i - j|`` is a power of 2.

    SPD; ``inv(A)[0, 0]`` of Trefethen_20000 is 0.7250783462684011... (SIAM 100-digit problem 7).
    """
    band = _trefethen_band(n)
    return _whole(band.build(np.arange(n, dtype=np.int64), n), symmetric=True)


# -- random matrices: rows made in fixed-size blocks, each from its own seeded stream -------------

#: Rows per random-matrix block: block ``b`` draws its columns and values from the stream seeded
#: by ``(seed, 0, b)``, so the matrix of a seed is the same whichever ranks make which blocks.
RANDOM_ROW_BLOCK = 1 << 14


def random_matrix_blocks(rows):
    """How many row blocks a random matrix of ``rows`` rows has."""
    return -(-int(rows) // RANDOM_ROW_BLOCK)


def random_matrix_rows(rows, cols=None, nnz_per_row=8, seed=0, power_law=0.0, blocks=None):
    """Row blocks ``blocks`` (a range; default all) of :func:`random_matrix`'s matrix: a
    CSRMatrix of the rows ``blocks.start * RANDOM_ROW_BLOCK`` up to the end of the last block."""
    cols = cols or rows
    blocks = range(random_matrix_blocks(rows)) if blocks is None else blocks
    first = min(blocks.start * RANDOM_ROW_BLOCK, rows)
    stop = min(blocks.stop * RANDOM_ROW_BLOCK, rows) if len(blocks) else first
    row_ids = np.arange(first, stop, dtype=np.int64)
    lengths = _random_row_lengths(row_ids, rows, cols, nnz_per_row, seed, power_law)
    pieces = []
    for block in blocks:
        lo, hi = block * RANDOM_ROW_BLOCK - first, min((block + 1) * RANDOM_ROW_BLOCK, rows) - first
        rng = np.random.default_rng([seed, 0, block])
        count = int(lengths[lo:hi].sum())
        local_rows = np.repeat(np.arange(hi - lo, dtype=np.int64), lengths[lo:hi])
        columns = rng.integers(0, cols, size=count, dtype=np.int64)
        values = rng.uniform(-1.0, 1.0, size=count)
        pieces.append(_summed_rows(local_rows, columns, values, hi - lo, cols))
    return _stack_rows(pieces, cols)


def _random_row_lengths(row_ids, rows, cols, nnz_per_row, seed, power_law):
    """Entries drawn for each row in ``row_ids``: ``nnz_per_row``, or (``power_law`` > 0) a
    Zipf-like law, the weight of rank k = (k + 1) ** -power_law given to row
    :func:`keyed_permutation` (k) -- the mean kept near ``nnz_per_row``."""
    if power_law <= 0:
        return np.full(len(row_ids), min(nnz_per_row, cols), dtype=np.int64)
    total = 0.0
    for lo in range(0, rows, 1 << 20):  # the weights' sum in bounded pieces, the same everywhere
        total += float((np.arange(lo + 1, min(lo + (1 << 20), rows) + 1, dtype=np.float64)
                        ** (-power_law)).sum())
    zipf_rank = keyed_permutation(row_ids, rows, seed)
    weights = (zipf_rank + 1.0) ** (-power_law)
    lengths = np.maximum(1, np.round(weights / (total / rows) * nnz_per_row)).astype(np.int64)
    return np.minimum(lengths, cols)


def _summed_rows(local_rows, columns, values, nrows, ncols):
    """CSR of ``nrows`` rows from (row, column, value) triplets: columns sorted, duplicates
    summed."""
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    matrix = sp.coo_matrix((values, (local_rows, columns)), shape=(nrows, ncols)).tocsr()
    matrix.sum_duplicates()
    matrix.sort_indices()
    return CSRMatrix(matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64),
                     matrix.data, (nrows, ncols))


def _stack_rows(pieces, ncols):
    """Row blocks one after the other as one CSRMatrix (int64 indices)."""
    if not pieces:
        return CSRMatrix(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), (0, ncols))
    lengths = np.concatenate([np.diff(p.indptr) for p in pieces])
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return CSRMatrix(indptr, np.concatenate([p.indices for p in pieces]),
                     np.concatenate([p.data for p in pieces]), (len(lengths), int(ncols)))


def random_matrix(rows, cols=None, nnz_per_row=8, seed=0, power_law=0.0):
    """Random-column matrix: ``nnz_per_row`` entries per row at uniform random columns.

    Values are uniform in [-1, 1); entries falling on one column are summed. ``power_law`` > 0 draws row lengths from a Zipf-like law with that exponent instead
    (mean kept near ``nnz_per_row``), giving irregular rows. Rows are made in blocks of
    :data:`RANDOM_ROW_BLOCK`, each from its own seeded stream (:func:`random_matrix_rows`).
    """
    return _whole(random_matrix_rows(rows, cols, nnz_per_row, seed, power_law))


# -- random tensors: every random number a hash of (seed, purpose, fiber, counter) ---------------
#
# Fiber f (0 <= f < nfibers) is made from its number alone: its coordinates outside the fiber mode
# are the f-th image of a keyed permutation of the fiber space (distinct fibers, uniform, in random
# order), its length a lognormal draw scaled by a constant known in advance, its mode-n indices
# and values hashes of (fiber, draw) and (fiber, index). Integer hashing and table lookups give
# the same bits in NumPy (the code below, the reference) and on a GPU (kernels_cu/generators.cu,
# through hisparse.gpu.DeviceFibers), so any range of fibers is made alone, on the host or on a
# GPU, and ranks that each make a range get together exactly the tensor of one process.

#: Fibers made per step on the host (bounds the temporaries: about 0.5 M nonzeros per step at 0.14
#: fibers per nonzero) and on a GPU (fewer, larger steps: launches and syncs cost more there than
#: memory). Any value gives the same tensor.
TENSOR_FIBER_STEP = 1 << 16
TENSOR_FIBER_STEP_GPU = 1 << 20

#: The lognormal weights are read from a table of ``2**bits + 1`` quantiles, linearly interpolated
#: (a lookup, a multiply and an add: the same bits on every array module, where ``exp`` and ``log``
#: may differ in the last place between libm and CUDA). Quantiles beyond ``2**-(bits + 2)`` from
#: either end are clamped there (z = +-5.0 at 20 bits: among ten million fibers about one is cut).
_WEIGHT_TABLE_BITS = 20

#: Hash purposes (distinct streams of one seed).
_LENGTH, _ROUNDING, _EXTRA, _INDEX, _VALUE = 1, 2, 3, 4, 5


def _stream_key(seed, purpose):
    """The uint64 key of one purpose's stream of ``seed`` (SplitMix64 on Python integers)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + purpose) & _WORD
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _WORD
    return np.uint64(x ^ (x >> 31))


_WORD = (1 << 64) - 1


def _hash(key, first):
    """Counter-based uint64 hash of ``(key, first)`` (uint64 arrays, NumPy or CuPy); a second
    counter is folded in by :func:`_hash_more`."""
    return _mix64(first * np.uint64(0x9E3779B97F4A7C15) ^ key)


def _hash_more(premixed, second):
    """The hash of ``(key, first, second)`` from ``premixed = _hash(key, first)``: a fiber's
    hash is mixed once and reused by each of its nonzeros."""
    return _mix64(premixed + second * np.uint64(0xD1B54A32D192ED03))


def _unit_float(bits):
    """Uniform float64 in [0, 1) from uint64 hashes (the top 53 bits: exact on every module)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)


def _normal_quantiles(q):
    """Standard normal quantiles of ``q`` in (0, 1) (Acklam's rational approximation, relative
    error below 1.2e-9: it defines the generator's weights, computed once on the host)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00)
    q = np.asarray(q, dtype=np.float64)
    z = np.empty_like(q)
    low, high = q < 0.02425, q > 1 - 0.02425
    middle = ~(low | high)
    r = q[middle] - 0.5
    s = r * r
    z[middle] = (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r / \
        (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)
    for where, sign, tail in ((low, 1.0, q[low]), (high, -1.0, 1 - q[high])):
        t = np.sqrt(-2 * np.log(tail))
        z[where] = sign * (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / \
            ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
    return z


def _weight_table(skew):
    """``(table, steps, mean)``: lognormal(0, ``skew``) quantiles at ``k / 2**bits`` (k = 0 ..
    2**bits, the ends clamped), the differences of neighbours, and the mean of the
    piecewise-linear law they define (what the fiber lengths are normalised by)."""
    count = 1 << _WEIGHT_TABLE_BITS
    clamp = 2.0 ** -(_WEIGHT_TABLE_BITS + 2)
    q = np.clip(np.arange(count + 1, dtype=np.float64) / count, clamp, 1 - clamp)
    table = np.exp(skew * _normal_quantiles(q))
    steps = table[1:] - table[:-1]
    mean = float((table[:-1] + table[1:]).sum() / (2 * count))
    return table, steps, mean


#: The keyed permutation's stream that places the fibers in the fiber space.
_COORDINATE_STREAM = 2


@dataclass
class FiberRecipe:
    """What a random tensor's fibers are made from on a GPU (:class:`hisparse.gpu.DeviceFibers`),
    decided on the host by :class:`TensorSource`: the weight ``table`` and its ``steps`` (float64,
    ``2**table_bits + 1`` and ``2**table_bits`` values), ``scale`` (a weight's share of the
    nonzeros), the stream ``keys`` by purpose (``length``, ``rounding``, ``extra``, ``index``,
    ``value``), the tensor's ``shape`` and fiber ``mode``, and the fiber space's
    :class:`Permutation`."""

    table: np.ndarray
    steps: np.ndarray
    table_bits: int
    scale: float
    keys: dict
    shape: tuple
    mode: int
    permutation: Permutation


@dataclass
class TensorSource:
    """How :func:`random_tensor`'s tensor is made by fiber ranges (ranks that each make a range
    get together the same tensor, whatever their number and array module).

    Attributes
    ----------
    shape : tuple of int
    mode : int
        The fiber mode.
    nfibers : int
        Fibers (numbered ``0 .. nfibers - 1``; every one holds at least one nonzero).
    """

    shape: tuple
    mode: int
    nfibers: int
    nnz: int
    seed: int
    skew: float

    def fibers(self, fibers=None, xp=np):
        """The nonzeros of fibers ``fibers`` (a range; default all) with array module ``xp``:
        ``(indices (k, N) int64, values (k,) float64)``, grouped by fiber in fiber order, mode-n
        indices ascending inside a fiber, no duplicate coordinates."""
        fibers = range(self.nfibers) if fibers is None else fibers
        return self.fibers_of(xp.arange(fibers.start, fibers.stop, dtype=xp.int64), xp)

    def fibers_of(self, ids, xp=np):
        """:meth:`fibers` of the fibers numbered ``ids`` (an ``xp`` integer array, any order, no
        repeats), grouped by fiber in the order of ``ids``: a fiber's nonzeros depend on its
        number alone, so a rank makes the fibers it owns without anyone sending them."""
        step = TENSOR_FIBER_STEP if xp is np else TENSOR_FIBER_STEP_GPU
        ids = ids.astype(xp.uint64)
        starts = range(0, len(ids), step)
        if xp is np:  # the steps on the process's cores (NumPy lets the interpreter's lock go)
            self._weights()
            pieces = [None] * len(starts)
            _threaded(lambda k: pieces.__setitem__(k, self._step(ids[starts[k]:starts[k] + step])),
                      range(len(starts)))
        else:  # one GPU: its steps in order, each in the device module's five launches
            device = self._on_device(xp)
            pieces = [device.fibers(ids[lo:lo + step]) for lo in starts]
        if not pieces:
            return (xp.zeros((0, len(self.shape)), dtype=xp.int64), xp.zeros(0, dtype=xp.float64))
        if len(pieces) == 1:
            return pieces[0]
        if xp is not np:
            return (xp.concatenate([p[0] for p in pieces]), xp.concatenate([p[1] for p in pieces]))
        # Joined by the threads too: one copy of the whole tensor is a second of memcpy at 77M.
        ends = np.cumsum([len(p[1]) for p in pieces])
        indices = np.empty((int(ends[-1]), len(self.shape)), dtype=np.int64)
        values = np.empty(int(ends[-1]), dtype=np.float64)

        def place(k):
            lo = int(ends[k - 1]) if k else 0
            indices[lo:int(ends[k])], values[lo:int(ends[k])] = pieces[k]
            pieces[k] = None

        _threaded(place, range(len(pieces)))
        return indices, values

    def fiber_coordinates(self, ids, xp=np):
        """The coordinates of the fibers numbered ``ids`` (an ``xp`` integer array): ``(len(ids),
        N)`` int64, 0 in the fiber mode's column. Distinct points of the fiber space, in random
        order (a keyed permutation of the numbers), so that where a fiber goes is known without
        making its nonzeros."""
        if xp is not np:
            return self._on_device(xp).coordinates(ids.astype(xp.uint64))
        shape, mode = self.shape, self.mode
        other = [m for m in range(len(shape)) if m != mode]
        sizes = [shape[m] for m in other]
        linear = keyed_permutation(ids.astype(np.int64), math.prod(sizes), self.seed,
                                   stream=_COORDINATE_STREAM)
        coords = np.zeros((len(ids), len(shape)), dtype=np.int64)
        for m, extent in zip(other[::-1], sizes[::-1]):
            coords[:, m] = linear % extent
            linear = linear // extent
        return coords

    def _on_device(self, cupy):
        """The :class:`hisparse.gpu.DeviceFibers` of this tensor on the current GPU (made once
        per device: the weight table uploaded once)."""
        from .gpu import DeviceFibers
        made = self.__dict__.setdefault("_device_fibers", {})
        device = cupy.cuda.Device().id
        if device not in made:
            made[device] = DeviceFibers(cupy, self.recipe())
        return made[device]

    def recipe(self):
        """What the device makes the fibers from (:class:`FiberRecipe`): the host's decisions
        of :meth:`_lengths`, :meth:`_step` and :meth:`fiber_coordinates`, made once."""
        table, steps, mean = self._weights()
        space = math.prod(s for m, s in enumerate(self.shape) if m != self.mode)
        return FiberRecipe(
            table=table, steps=steps, table_bits=_WEIGHT_TABLE_BITS,
            scale=self._scale(mean),
            keys={purpose: int(_stream_key(self.seed, code)) for purpose, code in
                  (("length", _LENGTH), ("rounding", _ROUNDING), ("extra", _EXTRA),
                   ("index", _INDEX), ("value", _VALUE))},
            shape=tuple(self.shape), mode=self.mode,
            permutation=_permutation(space, self.seed, stream=_COORDINATE_STREAM))

    def _scale(self, mean):
        """A weight's share of the nonzeros: the expected total of the fibers' lengths is then
        ``nnz``."""
        return self.nnz / (self.nfibers * mean)

    def _weights(self):
        """:func:`_weight_table` of the skew, made once (before threads share it)."""
        if getattr(self, "_table", None) is None:
            self._table = _weight_table(self.skew)
        return self._table

    def _lengths(self, ids):
        """Nonzeros wanted in each fiber of ``ids`` (uint64): a lognormal weight times a constant
        (the expected total is ``nnz``), rounded up or down at random, in [1, I_n]."""
        table, steps, mean = self._weights()
        bits = _hash(_stream_key(self.seed, _LENGTH), ids)
        # The top bits pick the table slot, the rest place the weight inside it.
        slot = (bits >> np.uint64(64 - _WEIGHT_TABLE_BITS)).astype(np.int64)
        fraction = _unit_float(bits << np.uint64(_WEIGHT_TABLE_BITS))
        weight = table[slot] + fraction * steps[slot]
        share = weight * self._scale(mean)
        rounded = np.floor(share + _unit_float(_hash(_stream_key(self.seed, _ROUNDING), ids)))
        return np.clip(rounded, 1, self.shape[self.mode]).astype(np.int64)

    def _step(self, ids):
        """The nonzeros of the fibers ``ids`` (uint64), grouped in their order, on the host (the
        reference of the device module's steps)."""
        size = self.shape[self.mode]
        lengths = self._lengths(ids)
        # Draws with replacement, a few more than the length so that about `length` distinct
        # indices remain: L + L(L-1)/(2 I) (rounded at random, integer arithmetic only).
        capped = np.minimum(lengths, 1 << 31).astype(np.uint64)
        spare = _hash(_stream_key(self.seed, _EXTRA), ids) % np.uint64(2 * size)
        draws = lengths + ((capped * (capped - np.uint64(1)) + spare) //
                           np.uint64(2 * size)).astype(np.int64)
        total = int(draws.sum())
        local = np.repeat(np.arange(len(draws), dtype=np.int64), draws)  # each draw's fiber
        counter = np.arange(total, dtype=np.int64) - (np.cumsum(draws) - draws)[local]
        index = _hash_more(_hash(_stream_key(self.seed, _INDEX), ids)[local],
                           counter.astype(np.uint64)) % np.uint64(size)
        del counter
        # Distinct indices inside each fiber, ascending: sort (fiber, index) keys, drop repeats.
        keys = np.sort(local * size + index.astype(np.int64))
        del local, index
        if len(keys) > 1:
            keys = keys[np.concatenate([np.ones(1, dtype=bool), keys[1:] != keys[:-1]])]
        local, index = keys // size, keys % size
        values = _unit_float(_hash_more(_hash(_stream_key(self.seed, _VALUE), ids)[local],
                                        index.astype(np.uint64)))
        indices = self.fiber_coordinates(ids)[local]
        indices[:, self.mode] = index
        return indices, values


def tensor_source(dims, nnz, fibers_per_nnz=0.1, mode=None, seed=0, skew=1.0):
    """The :class:`TensorSource` of :func:`random_tensor`'s parameters."""
    dims = tuple(int(d) for d in dims)
    mode = len(dims) - 1 if mode is None else int(mode)
    space = float(np.prod([float(d) for m, d in enumerate(dims) if m != mode]))
    if space >= 2.0 ** 62:
        raise ValueError(f"random_tensor: the modes other than {mode} span {space:.3g} fibers; "
                         f"at most 2**62 are supported")
    largest_step = max(TENSOR_FIBER_STEP, TENSOR_FIBER_STEP_GPU)
    if dims[mode] >= 2 ** 62 // largest_step:  # (fiber in step, index) keys stay in int64
        raise ValueError(f"random_tensor: mode {mode} has {dims[mode]} indices; at most "
                         f"{2 ** 62 // largest_step - 1} are supported")
    nfibers = int(max(1, min(round(nnz * fibers_per_nnz), space, nnz)))
    return TensorSource(dims, mode, nfibers, int(nnz), int(seed), float(skew))


def random_tensor(dims, nnz, fibers_per_nnz=0.1, mode=None, seed=0, skew=1.0):
    """FROSTT-like random tensor with a target number of nonzeros and of mode-``mode`` fibers.

    ``round(fibers_per_nnz * nnz)`` distinct fibers (coordinate tuples of every mode but
    ``mode``) are drawn uniformly; fiber lengths follow a skewed (lognormal, ``skew`` = sigma)
    law, clipped to [1, I_mode], scaled so that they total ``nnz`` in expectation; indices along
    ``mode`` are drawn uniformly without clustering, a few extra draws making up for repeats,
    which are merged (so the result has about ``nnz`` nonzeros, not exactly). Nonzeros come
    grouped by fiber, the fibers in random order, indices ascending inside a fiber.

    Every random number is a counter-based hash of the seed and the fiber's number
    (:class:`TensorSource`): any range of fibers is made alone, with NumPy or CuPy, and gives
    exactly those fibers of this tensor.

    Parameters
    ----------
    dims : list of int
        Shape, order N >= 2.
    nnz : int
        Target nonzeros.
    fibers_per_nnz : float
        Target ratio of non-empty mode-``mode`` fibers to nonzeros, in (0, 1].
    mode : int, optional
        The fiber mode; default the last.
    """
    source = tensor_source(dims, nnz, fibers_per_nnz, mode, seed, skew)
    indices, values = source.fibers()
    return COOTensor(indices, values, source.shape)


# -- the registry: one class per kind -------------------------------------------------------------

class Generator:
    """One kind of generated input: its parameters (``PARAMS``, validated by
    :func:`validate_spec`), what it makes (``MAKES``), the whole object (:meth:`whole`), how ranks
    make their parts alone (:meth:`part_source`) and whether it is slow to make again
    (``SLOW_TO_REMAKE``). The class docstring's first line is the generator's summary in
    docs/config.md. Classes, never instantiated: :data:`GENERATORS` maps names to them."""

    NAME = "?"
    #: ``"matrix"`` or ``"tensor"``
    MAKES = "matrix"
    PARAMS = {}
    #: Takes seconds to make again (random draws, routing and a sort per entry): a one-rank run
    #: keeps the one it made for verification instead (:class:`hisparse.layout.RowLayout`);
    #: stencils and bands are made again about as fast as the kept arrays' fingerprint is taken.
    SLOW_TO_REMAKE = False

    @classmethod
    def problems(cls, params):
        """Checks across parameters (each alone is checked by its ``Setting``): yields
        ``(key, message)`` for what is wrong; :func:`validate_spec` raises the first as a
        :class:`~hisparse.errors.ConfigError` naming the key (so a check may assume the ones
        before it passed)."""
        return iter(())

    @classmethod
    def whole(cls, **params):
        """The whole matrix or tensor."""
        raise NotImplementedError

    @classmethod
    def part_source(cls, params):
        """How ranks make their parts alone: a :class:`PartSource` (matrices) or a
        :class:`TensorSource` (tensors), from validated ``params`` (no ``kind``)."""
        raise NotImplementedError

    @classmethod
    def grid(cls, params):
        """The regular grid whose points the matrix's rows are, row-major (its extents), or
        None: no grid."""
        return None


class Poisson(Generator):
    """Negative Laplacian on a regular 2D/3D grid (SPD, symmetric)."""

    NAME = "poisson"
    PARAMS = {
        "dims": Setting(list, None, "Grid points per dimension (2 or 3 entries).",
                        check=_dims_check),
        "stencil": Setting(int, None, "5/9 (2D) or 7/27 (3D).", choices=(5, 7, 9, 27),
                           nullable=True),
        "scale": Setting(float, 1.0, "Multiply all values."),
    }

    @classmethod
    def problems(cls, params):
        dims, stencil = params["dims"], params["stencil"]
        if dims is None:
            yield "dims", "missing; e.g. [64, 64]"
        if len(dims) not in (2, 3):
            yield "dims", f"expected 2 or 3 entries, got {dims}"
        allowed = (5, 9) if len(dims) == 2 else (7, 27)
        if stencil is not None and stencil not in allowed:
            yield "stencil", f"expected one of {allowed} for {len(dims)}D dims, got {stencil}"

    whole = staticmethod(poisson)

    @classmethod
    def part_source(cls, params):
        band = _poisson_band(params["dims"], params["stencil"], params["scale"])
        return PartSource((band.nrows, band.nrows), True, band=band)

    @classmethod
    def grid(cls, params):
        return list(params["dims"])


class Rmat(Generator):
    """R-MAT power-law graph with ``2**scale`` vertices and about ``edge_factor * 2**scale`` edges."""

    NAME = "rmat"
    PARAMS = {
        "scale": Setting(int, 10, "log2 of the vertex count (at most 32).", check=positive),
        "edge_factor": Setting(int, 16, "Edges per vertex.", check=positive),
        "a": Setting(float, 0.57, "R-MAT probability a.", check=_probability),
        "b": Setting(float, 0.19, "R-MAT probability b.", check=_probability),
        "c": Setting(float, 0.19, "R-MAT probability c.", check=_probability),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "symmetric": Setting(bool, False, "Add reverse edges."),
    }
    SLOW_TO_REMAKE = True

    @classmethod
    def problems(cls, params):
        if params["scale"] > RMAT_MAX_SCALE:
            yield "scale", (f"at most {RMAT_MAX_SCALE} (2**{RMAT_MAX_SCALE} vertices), got "
                            f"{params['scale']}")
        total = params["a"] + params["b"] + params["c"]
        if total > 1.0 + 1e-12:
            yield "a", (f"a + b + c = {total:.6g} exceeds 1 (d = 1 - a - b - c is the fourth "
                        f"quadrant's probability); lower a, b or c")

    whole = staticmethod(rmat)

    @classmethod
    def part_source(cls, params):
        n = 1 << params["scale"]
        return PartSource((n, n), params["symmetric"],
                          edges=lambda blocks, device=None: rmat_part_edges(params, blocks,
                                                                            device),
                          nblocks=rmat_blocks(params["scale"], params["edge_factor"]),
                          whole_on_device=RmatRowsOnDevice(params))


class Trefethen(Generator):
    """Trefethen_n: primes 2, 3, 5, ... on the diagonal and ones where ``|i - j|`` is a power of 2."""

    NAME = "trefethen"
    PARAMS = {"n": Setting(int, 2000, "Order of the matrix.", check=positive)}
    whole = staticmethod(trefethen)

    @classmethod
    def part_source(cls, params):
        band = _trefethen_band(params["n"])
        return PartSource((band.nrows, band.nrows), True, band=band)


class RandomMatrix(Generator):
    """Random-column matrix: ``nnz_per_row`` entries per row at uniform random columns."""

    NAME = "random_matrix"
    PARAMS = {
        "rows": Setting(int, 1000, "Rows.", check=positive),
        "cols": Setting(int, None, "Columns (default: rows).", nullable=True, check=positive),
        "nnz_per_row": Setting(int, 8, "Average entries per row.", check=positive),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "power_law": Setting(float, 0.0, "Zipf exponent of row lengths (0 = uniform).",
                             check=non_negative),
    }
    SLOW_TO_REMAKE = True
    whole = staticmethod(random_matrix)

    @classmethod
    def part_source(cls, params):
        rows = params["rows"]
        return PartSource((rows, params["cols"] or rows), False,
                          row_blocks=lambda blocks: random_matrix_rows(**params, blocks=blocks),
                          rows_per_block=RANDOM_ROW_BLOCK, nblocks=random_matrix_blocks(rows))


class RandomTensor(Generator):
    """FROSTT-like random tensor with a target number of nonzeros and of mode-``mode`` fibers."""

    NAME = "random_tensor"
    MAKES = "tensor"
    PARAMS = {
        "dims": Setting(list, None, "Shape of the tensor.", check=_dims_check),
        "nnz": Setting(int, 1000, "Target nonzeros.", check=positive),
        "fibers_per_nnz": Setting(float, 0.1, "Target fibers per nonzero in (0, 1].",
                                  check=lambda v: None if 0 < v <= 1 else "must lie in (0, 1]"),
        "mode": Setting(int, None, "Fiber mode (default: last).", nullable=True,
                        check=non_negative),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "skew": Setting(float, 1.0, "Lognormal sigma of fiber lengths.", check=non_negative),
    }

    @classmethod
    def problems(cls, params):
        dims = params["dims"]
        if dims is None or len(dims) < 2:
            yield "dims", "expected at least 2 entries"
        if params["mode"] is not None and params["mode"] >= len(dims):
            yield "mode", f"must be < order {len(dims)}"
        mode = len(dims) - 1 if params["mode"] is None else params["mode"]
        space = math.prod(d for m, d in enumerate(dims) if m != mode)
        if space >= 2 ** 62:
            yield "dims", (f"the modes other than {mode} span {space:.3g} fibers; at most 2**62 "
                           f"are supported")

    whole = staticmethod(random_tensor)

    @classmethod
    def part_source(cls, params):
        return tensor_source(**params)


#: Every generator kind by name (``input.generate.kind``).
GENERATORS = {kind.NAME: kind for kind in (Poisson, Rmat, Trefethen, RandomMatrix, RandomTensor)}


def _params(spec):
    return {k: v for k, v in spec.items() if k != "kind"}


def validate_spec(spec, source="<generate>", prefix="generate."):
    """Validate a generator spec and fill its defaults.

    Raises
    ------
    ConfigError
        Unknown generator, unknown parameter or bad value; names ``source`` and the key.
    """
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ConfigError(source, prefix + "kind", f"missing; expected one of "
                                                   f"{', '.join(GENERATORS)}")
    kind = Setting(str, None, "", choices=tuple(GENERATORS)).validate(spec["kind"], source,
                                                                     prefix + "kind")
    out = validate_section(GENERATORS[kind].PARAMS, _params(spec), source, prefix)
    for key, message in GENERATORS[kind].problems(out):
        raise ConfigError(source, prefix + key, message)
    return {"kind": kind, **out}


def generator_of(spec):
    """The :class:`Generator` class of a spec's kind (``KeyError`` for an unknown one; a
    validated spec has a known one)."""
    return GENERATORS[spec["kind"]]


def generate(spec):
    """Build the matrix or tensor described by a (validated or raw) spec."""
    spec = validate_spec(dict(spec))
    return generator_of(spec).whole(**_params(spec))


@dataclass
class PartSource:
    """How a matrix generator makes a part of its matrix, for ranks that each make their own
    rows (:meth:`hisparse.layout.RowLayout.load`) and get the same global matrix as
    :func:`generate` whatever their number.

    Exactly one way is set:

    - ``band``: any set of rows is made alone (``band.lengths(rows)``, ``band.build(rows,
      ncols)``): Poisson stencils, Trefethen;
    - ``row_blocks``: ``row_blocks(range_of_blocks)`` makes consecutive blocks of
      ``rows_per_block`` rows (the first at ``start * rows_per_block``), ``nblocks`` in all:
      random matrices;
    - ``edges``: ``edges(range_of_blocks, device=None)`` gives the (source, destination) pairs
      of edge blocks, ``nblocks`` in all, made on the GPU of ``device`` (a GPU run's context)
      where that pays; each distinct pair is one unit entry of row ``source``: R-MAT.

    Besides, ``whole_on_device`` (R-MAT's :class:`RmatRowsOnDevice`) makes the whole matrix's
    rows on a GPU where it ``fits()`` (``make()``), which a GPU run's ranks take instead.
    """

    shape: tuple
    symmetric: bool
    band: object = None
    row_blocks: object = None
    rows_per_block: int = 0
    edges: object = None
    nblocks: int = 0
    whole_on_device: object = None


def part_source(spec):
    """How ranks make their parts of a (validated) spec's matrix or tensor alone: its
    generator's :meth:`Generator.part_source`."""
    return generator_of(spec).part_source(_params(spec))


def makes_band(spec):
    """Whether a (validated) spec makes a matrix by a band (a stencil: every row's columns
    within a fixed distance of the row), known from its parameters alone."""
    return spec_kind(spec) == "matrix" and part_source(spec).band is not None


def grid_of_spec(spec):
    """The regular grid whose points a (validated) spec's matrix rows are, row-major (a
    Poisson's dims), or None."""
    return generator_of(spec).grid(_params(spec))


def spec_kind(spec):
    """``"tensor"`` or ``"matrix"``: what a generator spec produces."""
    return generator_of(spec).MAKES
