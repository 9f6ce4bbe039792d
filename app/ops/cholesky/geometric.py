"""Nested dissection of a regular grid by coordinate planes (``ordering: geometric``, what
``auto`` takes for a known grid): :func:`grid_nested_dissection` orders a matrix whose rows are
the grid's points in row-major order with no graph algorithm (diagonal planes too for a stencil
of face neighbours, :data:`FACE_STENCIL_DIRECTIONS`), METIS's fill or less on 3-D grids; the top
boxes' passes run in chunks on Numba's threads. :mod:`.ordering` chooses it; the measurements
behind the settings are in docs/ops/cholesky.md ("Stop 57")."""
import numpy as np

from ... import threads
from ...compiled import HAVE_NUMBA
from ...compiled import compiled as _compiled
from ...compiled import compiled_parallel as _compiled_parallel
from ...compiled import prange
from ...errors import HisparseError

#: Grid points from which :func:`grid_nested_dissection` cuts a box again (smaller boxes keep
#: their row-major order: against boxes of one point, nnz(L) +0.1-0.5 % on 200^2, 14^3 and 30^3,
#: +4 % on 40^2; the ordering's time is the same)
GRID_LEAF = 8


#: The cutting directions of :func:`grid_nested_dissection` for a stencil of face neighbours, by
#: dimension: the axes and the diagonals on which such a step moves the projection by at most one
#: (in 3-D the body diagonals, which cut a cube across a hexagon of about 3/4 of a face)
FACE_STENCIL_DIRECTIONS = {
    2: np.array([[1, 0], [0, 1], [1, 1], [1, -1]], dtype=np.int64),
    3: np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1], [1, 1, -1], [1, -1, 1],
                 [1, -1, -1]], dtype=np.int64),
}


#: points from which a piece's passes run in :data:`PASS_CHUNKS` chunks on Numba's threads (the
#: top of the tree, which :func:`_face_plane_dissection` cuts before the pieces go to the threads)
PARALLEL_PIECE = 1 << 16
PASS_CHUNKS = 64


@_compiled
def _projection(work, t, directions, k):
    """Point ``t``'s projection on direction ``k`` (the dot product of their coordinates)."""
    v = 0
    for j in range(work.shape[1]):
        v += work[t, j] * directions[k, j]
    return v


@_compiled
def _chunk_extents(work, lo, hi, directions, low, high):
    """The least and the most projection of the points ``work[lo:hi]`` on every direction, into
    ``low`` and ``high`` (one entry a direction)."""
    count = directions.shape[0]
    for k in range(count):
        low[k] = np.iinfo(np.int64).max
        high[k] = np.iinfo(np.int64).min
    for t in range(lo, hi):
        for k in range(count):
            v = _projection(work, t, directions, k)
            low[k] = min(low[k], v)
            high[k] = max(high[k], v)


@_compiled
def _chunk_sides(work, lo, hi, directions, middle, below, above):
    """How many of the points ``work[lo:hi]`` project below and above ``middle`` on every
    direction, into ``below`` and ``above``."""
    count = directions.shape[0]
    for k in range(count):
        below[k] = 0
        above[k] = 0
    for t in range(lo, hi):
        for k in range(count):
            v = _projection(work, t, directions, k)
            if v < middle[k]:
                below[k] += 1
            elif v > middle[k]:
                above[k] += 1


@_compiled
def _chunk_scatter(ids, work, spare_ids, spare, lo, hi, directions, k, c, at_low, at_high,
                   at_plane):
    """The points ``[lo, hi)`` into the spare arrays, in their order: those projecting below
    ``c`` on direction ``k`` from ``at_low`` on, above from ``at_high``, on the plane from
    ``at_plane``."""
    d = work.shape[1]
    for t in range(lo, hi):
        v = _projection(work, t, directions, k)
        if v < c:
            slot = at_low
            at_low += 1
        elif v > c:
            slot = at_high
            at_high += 1
        else:
            slot = at_plane
            at_plane += 1
        spare_ids[slot] = ids[t]
        for j in range(d):
            spare[slot, j] = work[t, j]


@_compiled
def _middles(low, high):
    """The middle of a piece's extent along every direction, from its chunks' least and most
    projections (chunks x directions)."""
    count = low.shape[1]
    middle = np.empty(count, dtype=np.int64)
    for k in range(count):
        middle[k] = (low[:, k].min() + high[:, k].max()) // 2
    return middle


@_compiled
def _best_of(middle, below, above, m):
    """``(k, c, below, above)``: the direction ``k`` whose plane through its middle ``c`` leaves
    the fewest points on it (weighted by the imbalance of the sides, summed over the chunks'
    counts ``below`` and ``above``, chunks x directions); ``(-1, 0, 0, 0)`` where no plane has
    points on both sides."""
    best, best_k = np.inf, -1
    for k in range(middle.shape[0]):
        lower, upper = below[:, k].sum(), above[:, k].sum()
        if lower and upper:
            score = (m - lower - upper) * (1.0 + abs(lower - upper) / m)
            if score < best:
                best, best_k = score, k
    if best_k < 0:
        return -1, 0, 0, 0
    return best_k, middle[best_k], below[:, best_k].sum(), above[:, best_k].sum()


@_compiled
def _cut_piece(ids, work, spare_ids, spare, directions, a, b):
    """Cut the piece ``[a, b)`` of the working arrays (its points' ids and coordinates) by its
    best plane, on this thread: ``(k, c, below, above)`` (:func:`_best_of`), the piece's points
    partitioned stably into below, above and the plane's (k < 0: left as they are). Two passes
    over the piece for every direction at once, and one to partition."""
    count = directions.shape[0]
    low = np.empty((1, count), dtype=np.int64)
    high = np.empty((1, count), dtype=np.int64)
    _chunk_extents(work, a, b, directions, low[0], high[0])
    middle = _middles(low, high)
    below = np.empty((1, count), dtype=np.int64)
    above = np.empty((1, count), dtype=np.int64)
    _chunk_sides(work, a, b, directions, middle, below[0], above[0])
    k, c, lower, upper = _best_of(middle, below, above, b - a)
    if k >= 0:
        _chunk_scatter(ids, work, spare_ids, spare, a, b, directions, k, c, a, a + lower,
                       a + lower + upper)
        ids[a:b] = spare_ids[a:b]
        work[a:b] = spare[a:b]
    return k, c, lower, upper


@_compiled_parallel
def _cut_piece_on_threads(ids, work, spare_ids, spare, directions, a, b):
    """:func:`_cut_piece` in :data:`PASS_CHUNKS` chunks on Numba's threads: each chunk's
    extents and sides, then each chunk's points scattered from its own offsets (the chunks'
    counts summed in chunk order: the same partition)."""
    count, chunks = directions.shape[0], PASS_CHUNKS
    bounds = np.empty(chunks + 1, dtype=np.int64)
    for q in range(chunks + 1):
        bounds[q] = a + (b - a) * q // chunks
    low = np.empty((chunks, count), dtype=np.int64)
    high = np.empty((chunks, count), dtype=np.int64)
    for q in prange(chunks):
        _chunk_extents(work, bounds[q], bounds[q + 1], directions, low[q], high[q])
    middle = _middles(low, high)
    below = np.empty((chunks, count), dtype=np.int64)
    above = np.empty((chunks, count), dtype=np.int64)
    for q in prange(chunks):
        _chunk_sides(work, bounds[q], bounds[q + 1], directions, middle, below[q], above[q])
    k, c, lower, upper = _best_of(middle, below, above, b - a)
    if k >= 0:
        at_low = np.empty(chunks, dtype=np.int64)
        at_high = np.empty(chunks, dtype=np.int64)
        at_plane = np.empty(chunks, dtype=np.int64)
        low_at, high_at, plane_at = a, a + lower, a + lower + upper
        for q in range(chunks):
            at_low[q], at_high[q], at_plane[q] = low_at, high_at, plane_at
            size = bounds[q + 1] - bounds[q]
            low_at += below[q, k]
            high_at += above[q, k]
            plane_at += size - below[q, k] - above[q, k]
        for q in prange(chunks):
            _chunk_scatter(ids, work, spare_ids, spare, bounds[q], bounds[q + 1], directions,
                           k, c, at_low[q], at_high[q], at_plane[q])
        for q in prange(chunks):
            ids[bounds[q]:bounds[q + 1]] = spare_ids[bounds[q]:bounds[q + 1]]
            work[bounds[q]:bounds[q + 1]] = spare[bounds[q]:bounds[q + 1]]
    return k, c, lower, upper


@_compiled
def _with_row(table, used, a, b, place):
    """``table`` (rows of ``(a, b, place)``, ``used`` of them taken) with the row ``(a, b,
    place)`` put at ``used``: doubled first when it is full."""
    if used == table.shape[0]:
        grown = np.empty((2 * used, 3), dtype=np.int64)
        grown[:used] = table[:used]
        table = grown
    table[used, 0], table[used, 1], table[used, 2] = a, b, place
    return table


@_compiled
def _dissect_pieces(ids, work, spare_ids, spare, directions, leaf, a, b, place, out, floor):
    """Depth first from the piece ``[a, b)`` whose ordering starts at ``place``: each piece of
    more than ``leaf`` points cut by its best plane (:func:`_cut_piece`; at the top, pieces of
    at least :data:`PARALLEL_PIECE` points with ``floor > 0``, :func:`_cut_piece_on_threads`),
    the plane's points written to ``out`` after the two halves' places, and the halves stacked;
    a piece of at most ``leaf`` points (or that no plane cuts) written in row-major order.
    Pieces smaller than ``floor`` points are not cut here but returned (``(a, b, place)`` rows)
    for the caller to finish; with ``floor = 0`` (inside :func:`_finish_pieces`'s threads) all
    are finished, on this thread."""
    stack = np.empty((64, 3), dtype=np.int64)
    left_over = np.empty((16, 3), dtype=np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = a, b, place
    top, kept = 1, 0
    while top:
        top -= 1
        a, b, place = stack[top, 0], stack[top, 1], stack[top, 2]
        if b - a < floor:
            left_over = _with_row(left_over, kept, a, b, place)
            kept += 1
            continue
        k = -1
        if b - a > leaf:
            if floor > 0 and b - a >= PARALLEL_PIECE:
                k, c, below, above = _cut_piece_on_threads(ids, work, spare_ids, spare,
                                                           directions, a, b)
            else:
                k, c, below, above = _cut_piece(ids, work, spare_ids, spare, directions, a, b)
        if k < 0:
            for t in range(b - a):
                out[place + t] = ids[a + t]
            continue
        plane = a + below + above
        for t in range(plane, b):
            out[place + below + above + t - plane] = ids[t]
        stack = _with_row(stack, top, a + below, plane, place + below)
        stack = _with_row(stack, top + 1, a, a + below, place)
        top += 2
    return left_over[:kept]


@_compiled_parallel
def _finish_pieces(ids, work, spare_ids, spare, directions, leaf, pieces, out):
    """:func:`_dissect_pieces` of every piece of ``pieces`` (disjoint ranges), on Numba's
    threads."""
    for p in prange(pieces.shape[0]):
        _dissect_pieces(ids, work, spare_ids, spare, directions, leaf, pieces[p, 0],
                        pieces[p, 1], pieces[p, 2], out, 0)


def _face_plane_dissection(coords, directions, leaf, out):
    """:func:`grid_nested_dissection` by planes of ``directions`` (k x d) of the points
    ``coords`` (n x d, row-major order), into ``out`` (new-to-old): the top of the tree down to
    pieces of 1/64 of the points, its large pieces' passes in chunks on Numba's threads, then
    those pieces (disjoint ranges of the working arrays) one a thread. The same ordering
    whatever the thread count."""
    from ...compiled import use_cores
    n = len(coords)
    ids = np.arange(n, dtype=np.int64)
    work = np.ascontiguousarray(coords, dtype=np.int64).copy()
    spare_ids = np.empty(n, dtype=np.int64)
    spare = np.empty_like(work)
    use_cores(threads.usable_cores())  # the top's chunked passes run from compiled code
    pieces = _dissect_pieces(ids, work, spare_ids, spare, directions, leaf, 0, n, 0, out,
                             max(1, n // 64))
    _finish_pieces(ids, work, spare_ids, spare, directions, leaf, pieces, out)


def _grid_points(shape):
    """The points of a box of extents ``shape``, row-major: (points x dimensions) int64."""
    return np.ascontiguousarray(np.indices(shape, dtype=np.int64).reshape(len(shape), -1).T)


def grid_of(grid, n):
    """``grid`` (the ``ordering_grid`` of a matrix of ``n`` rows) checked: positive extents whose
    product is ``n``; a tuple of ints."""
    if grid is None:
        raise HisparseError("operation.params.ordering: 'geometric' needs the grid whose points "
                            "the rows are: set operation.params.ordering_grid (e.g. [120, 120, "
                            "120]), or generate the input with kind: poisson")
    dims = tuple(int(d) for d in grid)
    if not dims or min(dims) < 1 or int(np.prod(dims, dtype=np.int64)) != n:
        raise HisparseError(f"operation.params.ordering_grid: {list(dims)} is not a grid of the "
                            f"matrix's {n} rows (positive extents whose product is the row "
                            f"count, the rows numbered row-major: the first extent slowest)")
    return dims


def grid_nested_dissection(dims, leaf=GRID_LEAF, faces_only=False):
    """Nested dissection of the regular grid ``dims`` (rows numbered row-major) by lattice
    planes. New-to-old int64.

    With ``faces_only`` (a stencil that reaches only the face neighbours: 5-point in 2-D,
    7-point in 3-D; Numba compiled), a piece is cut by the plane, among the axis and the
    diagonal directions (:data:`FACE_STENCIL_DIRECTIONS`), through the middle of its extent in
    that direction that leaves the fewest points on it (weighted by the halves' imbalance):
    a step to a face neighbour changes the projection on such a direction by at most one, so
    the points on the plane separate the two sides. The body diagonals cut a cube across a
    hexagon of about 3/4 of a face, and the pieces keep cutting small: on 64^3, nnz(L) 0.73x
    and flops 0.50x METIS's (docs/ops/cholesky.md, "Stop 57"). :func:`_face_plane_dissection`
    runs it.

    Otherwise (any stencil reaching one point in each direction: also 9/27-point) boxes: a box
    is split across its longest extent by the middle plane, the two halves ordered first
    (recursively), the plane last; boxes of at most ``leaf`` points keep their row-major order.
    Boxes of the same extents are ordered alike: each extent's ordering is made once, as the
    rows' offsets from the box's first corner (shifted by an addition for the other boxes), so a
    level is a few array operations and there is no graph (2000 x 2000: a fraction of a
    second)."""
    dims = tuple(int(d) for d in dims)
    if faces_only and len(dims) in FACE_STENCIL_DIRECTIONS and HAVE_NUMBA:
        coords = _grid_points(dims)
        out = np.empty(len(coords), dtype=np.int64)
        _face_plane_dissection(coords, FACE_STENCIL_DIRECTIONS[len(dims)], int(leaf), out)
        return out
    strides = np.array([int(np.prod(dims[k + 1:], dtype=np.int64)) for k in range(len(dims))],
                       dtype=np.int64)
    made = {}

    def row_major(shape):
        return _grid_points(shape) @ strides

    def ordered(shape):
        if shape not in made:
            if int(np.prod(shape)) <= leaf:
                made[shape] = row_major(shape)
            else:
                axis = int(np.argmax(shape))
                middle = shape[axis] // 2
                left = shape[:axis] + (middle,) + shape[axis + 1:]
                right = shape[:axis] + (shape[axis] - middle - 1,) + shape[axis + 1:]
                plane = shape[:axis] + (1,) + shape[axis + 1:]
                step = strides[axis]
                made[shape] = np.concatenate([ordered(left), ordered(right) + (middle + 1) * step,
                                              row_major(plane) + middle * step])
        return made[shape]

    return ordered(dims)
