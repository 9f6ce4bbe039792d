"""The chunk schedule of the supernodal Cholesky on the GPU, planned on the host: every
supernode cut into column chunks and the chunks given levels (:func:`chunk_plan`), the launches
of a level (:func:`level_lists`), the dataflow solves' task list (:func:`flow_tasks`), the blocks
per chunk of the kernels (:func:`panel_blocks`, :func:`tile_blocks`), and a rank's share of them
under strategy subtree (:func:`subtree_flow_tasks`, :func:`subtree_solve_lists`,
:func:`owned_runs`). NumPy only: :mod:`.gpu`'s engines launch what it plans (its docstring has
the design)."""
from dataclasses import dataclass

import numpy as np

from ...compiled import compiled_parallel, prange

#: Columns of a chunk (``CHUNK`` of ``kernels_cu/cholesky.cu``).
CHUNK = 64
#: Threads of the chunk kernels, hence below rows per block (``CHUNK_THREADS``).
CHUNK_THREADS = 256
#: Update tiles are TILE x TILE (``TILE``).
TILE = 32

@dataclass
class ChunkPlan:
    """Column chunks of the chained supernodes and the level of every chunk.

    Attributes
    ----------
    sup, c0, width : ndarray, int32
        Chunk v is columns ``c0[v] .. c0[v] + width[v] - 1`` of supernode ``sup[v]``; the chunks
        of one supernode are consecutive, in column order.
    level : ndarray, int64
        Level of every chunk.
    below : ndarray, int64
        Below rows of every chunk (the supernode's rows after the chunk's columns).
    large, large_level : ndarray, int64
        The supernodes that are not chained (one level slot each) and their levels.
    n_levels : int
    """

    sup: np.ndarray
    c0: np.ndarray
    width: np.ndarray
    level: np.ndarray
    below: np.ndarray
    large: np.ndarray
    large_level: np.ndarray
    n_levels: int


def chunk_plan(sym, chained, width=CHUNK):
    """Cut every ``chained`` supernode into chunks of at most ``width`` columns and give every
    chunk (and every other supernode, as one slot) the lowest level after its dependencies.

    Parameters
    ----------
    sym : SymbolicFactor
    chained : ndarray of bool, shape (nsuper,)
    width : int

    Returns
    -------
    ChunkPlan
    """
    ns = sym.nsuper
    ncols = np.diff(sym.starts)
    nchunks = np.where(chained, -(-ncols // width), 1).astype(np.int64)
    # first level of every supernode's chain: one above the highest end of its children's,
    # propagated level by level of the supernodal tree (children sit on lower tree levels)
    start = np.zeros(ns, dtype=np.int64)
    by_level = np.argsort(sym.level, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(sym.level, minlength=1))])
    for lev in range(len(bounds) - 1):
        nodes = by_level[bounds[lev]:bounds[lev + 1]]
        parents = sym.sparent[nodes]
        has_parent = parents >= 0
        np.maximum.at(start, parents[has_parent],
                      start[nodes[has_parent]] + nchunks[nodes[has_parent]])
    chained_ids = np.flatnonzero(chained)
    per = nchunks[chained_ids]
    sup = np.repeat(chained_ids, per)
    first_chunk = np.cumsum(per) - per
    k = np.arange(len(sup), dtype=np.int64) - np.repeat(first_chunk, per)
    c0 = k * width
    widths = np.minimum(width, ncols[sup] - c0)
    level = start[sup] + k
    large = np.flatnonzero(~chained)
    large_level = start[large]
    n_levels = int(max(level.max() + 1 if len(level) else 0,
                       large_level.max() + 1 if len(large) else 0))
    return ChunkPlan(sup=sup.astype(np.int32), c0=c0.astype(np.int32),
                     width=widths.astype(np.int32), level=level,
                     below=(sym.nrows[sup] - c0 - widths).astype(np.int64), large=large,
                     large_level=large_level, n_levels=n_levels)


@dataclass
class LevelLists:
    """Task lists of one chunk kernel, level by level.

    A level's tasks are ``chunks[begin[l]:begin[l + 1]]``; ``prefix[prefix_at[l] : prefix_at[l]
    + count + 1]`` holds the first block of every task and the grid size (``grid[l]``).
    """

    chunks: np.ndarray
    begin: np.ndarray
    prefix: np.ndarray
    prefix_at: np.ndarray
    grid: np.ndarray

    def count(self, lev):
        return int(self.begin[lev + 1] - self.begin[lev])


def level_lists(chunk_ids, levels, blocks, n_levels):
    """Group chunks (``chunk_ids``, with their ``levels`` and ``blocks`` per chunk) by level."""
    order = np.argsort(levels, kind="stable")
    chunks = chunk_ids[order].astype(np.int32)
    count = np.bincount(levels[order], minlength=n_levels)[:n_levels]
    begin = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    cumulative = np.concatenate([[0], np.cumsum(blocks[order])]).astype(np.int64)
    seg_len = count + 1
    prefix_at = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)
    index = np.repeat(begin[:-1] - prefix_at[:-1], seg_len) + np.arange(prefix_at[-1])
    prefix = cumulative[index] - np.repeat(cumulative[begin[:-1]], seg_len)
    grid = cumulative[begin[1:]] - cumulative[begin[:-1]]
    return LevelLists(chunks=chunks, begin=begin, prefix=prefix.astype(np.int64),
                      prefix_at=prefix_at, grid=grid)


#: A chunk of at most SMALL_UNIT columns and below rows is a "small" unit of the dataflow
#: solves: one warp solves it (lane = row), and up to CHUNK_THREADS / 32 of them share a block.
SMALL_UNIT = 32


@dataclass
class FlowTasks:
    """The task list of the dataflow solves (``solve_forward_flow`` / ``solve_backward_flow``).

    Units are (chunk ``unit_chunk[u]``, part ``unit_part[u]`` of CHUNK_THREADS below rows) in
    chunk-level order, so every unit's producers come before it. A task (one block; the forward
    pass takes tickets in task order, the backward pass in the reverse one) is the units
    ``task_unit[t]:task_unit[t + 1]``: one unit, or up to CHUNK_THREADS / 32 small units of one
    level (``unit_part == -1``: at most :data:`SMALL_UNIT` columns and below rows; one warp
    each). The below rows of unit u lie in the chunks ``target_chunk[target_ptr[u]:
    target_ptr[u + 1]]`` (each once): forward, it adds to their right-hand sides and counts
    itself in their ``arrived``; backward, it waits until they are solved. ``expected[v]``: how
    many units count themselves in chunk v's ``arrived``.
    """

    task_unit: np.ndarray
    unit_chunk: np.ndarray
    unit_part: np.ndarray
    target_ptr: np.ndarray
    target_chunk: np.ndarray
    expected: np.ndarray

    @property
    def ntasks(self):
        return len(self.task_unit) - 1


def flow_tasks(sym, plan, chunks=None):
    """:class:`FlowTasks` of a chunk plan in which every supernode is chained (the solve's).

    Parameters
    ----------
    sym : SymbolicFactor
    plan : ChunkPlan
        Its chunks tile the columns 0..n-1 in order (supernodes in order, chunks in column
        order), so a column's chunk is found by ``np.repeat``.
    chunks : array of int, optional
        The chunks whose units the tasks hold (default: all). A rank's subtrees under strategy
        subtree leave out its top supernodes' chunks, which are solved between the exchanges;
        every producer of a chunk in the list must be in it (a chunk's producers are its
        supernode's descendants), and ``expected`` counts the listed units only.

    Returns
    -------
    FlowTasks
    """
    nchunks = len(plan.sup)
    small = (plan.width <= SMALL_UNIT) & (plan.below <= SMALL_UNIT)
    blocks = panel_blocks(plan.below)
    listed = np.arange(nchunks) if chunks is None else np.asarray(chunks, dtype=np.int64)
    # chunk order: by level, the small chunks of a level first (they are grouped)
    order = listed[np.lexsort((listed, ~small[listed], plan.level[listed]))]
    chunk = np.repeat(order, blocks[order])
    first = np.cumsum(blocks[order]) - blocks[order]
    part = np.arange(len(chunk), dtype=np.int64) - np.repeat(first, blocks[order])
    # tasks: every unit that is not small alone; runs of small units of one level by WARPS
    unit_small = small[chunk]
    level = plan.level[chunk]
    run_start = np.ones(len(chunk), dtype=bool)
    if len(chunk) > 1:
        run_start[1:] = (level[1:] != level[:-1]) | (unit_small[1:] != unit_small[:-1])
    position = np.arange(len(chunk))
    in_run = position - np.maximum.accumulate(np.where(run_start, position, 0))
    new_task = ~unit_small | (in_run % (CHUNK_THREADS // 32) == 0)
    task_unit = np.append(np.flatnonzero(new_task), len(chunk))
    # the chunks of every unit's below rows
    chunk_of_column = np.repeat(np.arange(nchunks, dtype=np.int64), plan.width)
    sup = plan.sup[chunk].astype(np.int64)
    begin = (sym.rows_offset[sup] + plan.c0[chunk] + plan.width[chunk]
             + part * CHUNK_THREADS).astype(np.int64)
    length = np.maximum(np.minimum(begin + CHUNK_THREADS, sym.rows_offset[sup + 1]) - begin, 0)
    per_unit = np.empty(len(chunk), dtype=np.int64)
    _count_targets(sym.rows, begin, length, chunk_of_column, per_unit)
    target_ptr = np.concatenate([[0], np.cumsum(per_unit)]).astype(np.int64)
    target_chunk = np.empty(int(target_ptr[-1]), dtype=np.int64)
    _fill_targets(sym.rows, begin, length, chunk_of_column, target_ptr, target_chunk)
    return FlowTasks(task_unit=task_unit.astype(np.int32), unit_chunk=chunk.astype(np.int32),
                     unit_part=np.where(unit_small, -1, part).astype(np.int32),
                     target_ptr=target_ptr, target_chunk=target_chunk.astype(np.int32),
                     expected=np.bincount(target_chunk, minlength=nchunks).astype(np.int32))


# The target lists walk every unit's below rows (the factor's row structure, 10^7-10^8 entries):
# in NumPy, as a gather of every row's chunk and a compare of neighbours, they were most of the
# engine's set-up (120^3 Laplacian: 0.6-0.85 s of a 1.2 s upload on an H200 host); here one
# compiled pass per unit counts and one fills, the units on the process's cores.
@compiled_parallel
def _count_targets(rows, begin, length, chunk_of_column, per_unit):
    """``per_unit[u]``: the runs of equal chunks among the chunks of unit u's below rows
    ``rows[begin[u]:begin[u] + length[u]]`` (their chunks ascend: the runs are its targets)."""
    for unit in prange(len(begin)):
        count, last = 0, -1
        for k in range(begin[unit], begin[unit] + length[unit]):
            owner = chunk_of_column[rows[k]]
            if owner != last:
                count += 1
                last = owner
        per_unit[unit] = count


@compiled_parallel
def _fill_targets(rows, begin, length, chunk_of_column, target_ptr, target_chunk):
    """Unit u's targets (:func:`_count_targets`' runs, each chunk once) from ``target_ptr[u]``."""
    for unit in prange(len(begin)):
        place, last = target_ptr[unit], -1
        for k in range(begin[unit], begin[unit] + length[unit]):
            owner = chunk_of_column[rows[k]]
            if owner != last:
                target_chunk[place] = owner
                place += 1
                last = owner


def panel_blocks(below):
    """Blocks of ``factor_panels`` / the solves per chunk: one per CHUNK_THREADS below rows."""
    return np.maximum(1, -(-below // CHUNK_THREADS))


def tile_blocks(below):
    """Blocks of ``update_tiles`` per chunk: the TILE x TILE tiles of its lower update."""
    tiles = -(-below // TILE)
    return tiles * (tiles + 1) // 2



#: runs of owned columns above which :func:`owned_runs` gives up (one Python copy a run)
MAX_OWNED_RUNS = 256


def owned_runs(owned_local):
    """The runs of consecutive columns among a rank's owned local columns, as ``(first, place,
    count)``: right-hand-side rows ``first:first + count`` are local columns ``place:place +
    count`` (a rank's subtrees are one or a few runs, its owned top pieces a few more). None
    where there are more than :data:`MAX_OWNED_RUNS` (the columns are then scattered and
    gathered by index)."""
    owned_local = np.asarray(owned_local, dtype=np.int64)
    if not len(owned_local):
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(owned_local) != 1) + 1])
    if len(starts) > MAX_OWNED_RUNS:
        return None
    counts = np.diff(np.append(starts, len(owned_local)))
    return [(int(f), int(owned_local[f]), int(c)) for f, c in zip(starts, counts)]


def top_chunks(splan, top_ids):
    """Which chunks of a rank's solve chunk plan ``splan`` belong to its top supernodes
    ``top_ids`` under strategy subtree (the others are its subtrees')."""
    is_top = np.zeros(int(splan.sup.max()) + 1 if len(splan.sup) else 0, dtype=bool)
    is_top[list(top_ids)] = True
    return is_top[splan.sup]


def subtree_flow_tasks(sym, splan, top_ids):
    """The dataflow solve's tasks over a rank's subtrees (:func:`flow_tasks` of the chunks not
    in ``top_ids``): their producers are their descendants, all in the subtrees; the top
    supernodes are solved between the exchanges, chunk by chunk."""
    return flow_tasks(sym, splan, np.flatnonzero(~top_chunks(splan, top_ids)))


def subtree_solve_lists(splan, top_ids):
    """The launches of a rank's solve under strategy subtree, from its solve chunk plan
    ``splan`` (every held supernode chained) and its top supernodes ``top_ids``: the chunks of
    its subtrees grouped by level (:class:`LevelLists`), and for every top supernode its chunks
    one per level, in column order (the chunks of one supernode depend on each other).

    Returns
    -------
    (LevelLists, dict of int -> LevelLists)
    """
    blocks = panel_blocks(splan.below)
    ids = np.flatnonzero(~top_chunks(splan, top_ids)).astype(np.int64)
    local = level_lists(ids, splan.level[ids], blocks[ids], splan.n_levels)
    tops = {}
    for i in top_ids:
        ids = np.flatnonzero(splan.sup == i).astype(np.int64)
        tops[int(i)] = level_lists(ids, np.arange(len(ids), dtype=np.int64), blocks[ids],
                                   len(ids))
    return local, tops
