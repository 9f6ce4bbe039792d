"""Fill-reducing orderings of a sparse Cholesky factorization (host only): the first step of the
analysis of :mod:`.symbolic`.

``metis``: METIS nested dissection (the METIS that pymetis ships, called directly through
:mod:`.metis`, else through pymetis's API); on large graphs its top levels are split here by
METIS's own vertex separator or a breadth-first level set, whichever cuts better
(:data:`LEVEL_SET_TRIES`), and the parts ordered concurrently in worker processes
(:func:`parallel_nested_dissection`). ``rcm``: SciPy's reverse Cuthill-McKee, the documented
fallback when pymetis is missing (a bandwidth ordering: always available, far from optimal on
3-D problems). ``dissection``: the top levels of a nested dissection cut by breadth-first level
sets (:func:`level_set_dissection`), RCM inside the parts: no METIS needed, and an elimination tree
whose top splits into independent subtrees, which ``auto`` takes for several ranks without
pymetis (:func:`choose_ordering`). ``geometric``: nested dissection of a regular grid by
coordinate planes (:func:`grid_nested_dissection`), for a matrix whose rows are the grid's
points in row-major order (diagonal planes too for a stencil of face neighbours): no graph
algorithm, and METIS's fill or less on 3-D grids. ``natural`` keeps the input order; ``auto``
chooses by :func:`choose_ordering`.
The measurements behind the settings below are in docs/ops/cholesky.md ("Ordering").
"""
import itertools
import os
import time
from concurrent.futures import FIRST_COMPLETED, wait
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

from ... import threads
from ...arrays import sorted_distinct
from ...compiled import HAVE_NUMBA
from ...compiled import compiled_parallel as _compiled_parallel
from ...compiled import prange
from ...errors import HisparseError
from ...formats import balanced_row_cuts, row_entries
from . import metis
from .geometric import FACE_STENCIL_DIRECTIONS, grid_nested_dissection, grid_of

ORDERINGS = ("auto", "metis", "dissection", "geometric", "rcm", "natural")


def have_pymetis():
    try:
        import pymetis  # noqa: F401
        return True
    except ImportError:
        return False


def offdiagonal_pattern(matrix, symmetric=False):
    """The symmetric pattern of ``matrix`` (the union of A and A^T) without its diagonal, as CSR
    ``(indptr, indices)`` int64 arrays with sorted indices. ``symmetric``: the caller knows the
    stored pattern is symmetric (:func:`check_square_symmetric` found it so), so it is not
    checked again (a transpose of the whole pattern); with sorted rows too (the analysis'
    ``positions``) the rows are read as they are: no pattern matrix is made (its int8 values, its
    int64 copies, the sort's check: half the 0.7 s a 2000^2 grid's saved ordering took to read
    on the H200 host)."""
    indptr, indices = matrix.indptr, matrix.indices
    if not (symmetric and matrix.has_sorted_indices):
        pattern = sp.csr_matrix((np.ones(matrix.nnz, dtype=np.int8), indices, indptr),
                                shape=matrix.shape)
        if not symmetric and not _pattern_is_symmetric(pattern):
            pattern = (pattern + pattern.T).tocsr()
        pattern.sort_indices()
        indptr, indices = pattern.indptr, pattern.indices
    return _without_diagonal(indptr, indices)


def _without_diagonal(indptr, indices):
    """CSR ``(indptr, indices)`` less each row's diagonal entry, as int64 arrays: each row's
    off-diagonal entries counted, then placed, both passes over pieces of rows on the host's
    threads."""
    cuts = balanced_row_cuts(indptr)
    kept = np.zeros(len(indptr), dtype=np.int64)
    _count_offdiagonal(indptr, indices, cuts, kept[1:])
    np.cumsum(kept, out=kept)
    out = np.empty(int(kept[-1]), dtype=np.int64)
    _place_offdiagonal(indptr, indices, cuts, kept, out)
    return kept, out


@_compiled_parallel
def _count_offdiagonal(indptr, indices, cuts, counts):
    for piece in prange(len(cuts) - 1):
        for row in range(cuts[piece], cuts[piece + 1]):
            count = 0
            for entry in range(indptr[row], indptr[row + 1]):
                if indices[entry] != row:
                    count += 1
            counts[row] = count


@_compiled_parallel
def _place_offdiagonal(indptr, indices, cuts, starts, out):
    for piece in prange(len(cuts) - 1):
        for row in range(cuts[piece], cuts[piece + 1]):
            at = starts[row]
            for entry in range(indptr[row], indptr[row + 1]):
                if indices[entry] != row:
                    out[at] = indices[entry]
                    at += 1


def _pattern_is_symmetric(pattern):
    """Whether a CSR pattern equals its transpose (one transpose, no sparse arithmetic)."""
    if pattern.nnz == 0:
        return True
    transposed = pattern.T.tocsr()
    transposed.sort_indices()
    pattern.sort_indices()
    return (np.array_equal(pattern.indptr, transposed.indptr)
            and np.array_equal(pattern.indices, transposed.indices))


def fill_reducing_order(matrix, method="auto", pattern=None, pool=None, niter=None,
                        levels=None, nranks=1, timings=None, grid=None):
    """A fill-reducing permutation of a symmetric matrix.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix, shape (n, n)
    method : {"auto", "metis", "dissection", "geometric", "rcm", "natural"}
        ``auto``: see :func:`choose_ordering`.
    pattern : tuple of ndarray, optional
        ``(indptr, indices)`` of :func:`offdiagonal_pattern`, when the caller has it already.
    pool : concurrent.futures.Executor, optional
        Worker processes of :func:`ordering_pool` started by the caller (for the parallel
        nested dissection of a large graph).
    niter : int, optional
        METIS's refinement passes (:data:`METIS_NITER` when omitted).
    levels : int, optional
        Top dissection levels split over ``pool`` (:func:`split_levels` when omitted).
    nranks : int
        Ranks the factorization will be spread over: ``auto``'s choice without pymetis, and
        the levels of ``dissection`` (:func:`dissection_levels`).
    timings : dict, optional
        Filled by the parallel nested dissection (:func:`parallel_nested_dissection`).
    grid : sequence of int, optional
        The regular grid whose points the rows are, in row-major order (``geometric``).

    Returns
    -------
    perm : ndarray, shape (n,), int64
        New-to-old order: row/column ``k`` of the permuted matrix is ``perm[k]`` of ``matrix``.
    used : str
        The method actually used.
    """
    n = matrix.shape[0]
    method = resolve_ordering(method, nranks, grid, matrix.indptr)
    if method == "geometric":  # the grid (and the stencil's reach) alone: no graph
        return grid_nested_dissection(grid_of(grid, n), faces_only=reaches_faces_only(
            grid, most_row_entries(matrix.indptr))), "geometric"
    if pattern is None:
        pattern = offdiagonal_pattern(matrix)
    indptr, indices = pattern
    if method == "natural" or n <= 1:
        return np.arange(n, dtype=np.int64), "natural"
    if method == "metis":
        if not have_pymetis():
            raise HisparseError("operation.params.ordering: 'metis' needs pymetis (pip install "
                                "pymetis, or the 'pymetis' extra); use 'rcm' or 'auto'")
        if len(indices) == 0:
            return np.arange(n, dtype=np.int64), "metis"
        levels = split_levels(matrix.nnz) if levels is None else levels
        if levels:
            return parallel_nested_dissection(indptr, indices, levels, pool=pool,
                                              niter=niter, timings=timings), "metis"
        return _metis_nested_dissection(indptr, indices, niter), "metis"
    if method == "rcm":
        return _rcm(indptr, indices), "rcm"
    if method == "dissection":
        return level_set_dissection(indptr, indices, dissection_levels(nranks)), "dissection"
    raise HisparseError(f"operation.params.ordering: expected one of {ORDERINGS}, got {method!r}")


def _metis_settings(niter, **extra):
    """METIS's options by name (:data:`metis.OPTION_INDEX`, and pymetis.Options' fields):
    ``niter`` refinement passes (:data:`METIS_NITER` when None) and ``extra``."""
    return {"niter": METIS_NITER if niter is None else int(niter), **extra}


def _metis_nested_dissection(indptr, indices, niter=None):
    """METIS's own nested dissection of a CSR graph, ``niter`` refinement passes
    (:data:`METIS_NITER` when None): the METIS pymetis ships, called directly
    (:func:`metis.node_nd`), else through pymetis's API; new-to-old int64."""
    n = len(indptr) - 1
    if len(indices) == 0:
        return np.arange(n, dtype=np.int64)
    settings = _metis_settings(niter, **nested_dissection_balance(n, len(indices)))
    perm = metis.node_nd(indptr, indices, settings)  # METIS called directly (metis.py: why)
    if perm is not None:
        return perm
    import pymetis
    xadj, adjncy = indptr.astype(np.int32), indices.astype(np.int32)
    options = pymetis.Options(**settings)
    if hasattr(pymetis, "CSRAdjacency"):
        perm, _iperm = pymetis.nested_dissection(adjacency=pymetis.CSRAdjacency(xadj, adjncy),
                                                 options=options)
    else:
        perm, _iperm = pymetis.nested_dissection(xadj=xadj, adjncy=adjncy, options=options)
    # pymetis returns (perm, iperm); perm is new-to-old (the pitfall: iperm is not).
    return np.asarray(perm, dtype=np.int64)


#: Sparse, mesh-like graphs (mean degree at most SPARSE_MEAN_DEGREE: grids, road and circuit
#: networks) are dissected with METIS_OPTION_UFACTOR 400 (separators may leave the two sides
#: 1.4:1 instead of METIS's 1.2:1): fewer flops on every such graph measured, but more on
#: denser ones (docs/ops/cholesky.md, "Ordering").
SPARSE_MEAN_DEGREE = 12
SPARSE_UFACTOR = 400
#: Denser graphs of at least DENSE_TIGHT_MIN_VERTICES vertices are dissected with ufactor 30
#: (sides within 1.03:1): METIS's refinement, most of its time on these graphs, has less to do;
#: smaller dense graphs keep METIS's default, where the tighter balance costs flops
#: (docs/ops/cholesky.md, "seventh round").
DENSE_UFACTOR = 30
DENSE_TIGHT_MIN_VERTICES = 8000


def nested_dissection_balance(n, entries):
    """METIS's balance option for the nested dissection of a graph of ``n`` vertices and
    ``entries`` adjacency entries: :data:`SPARSE_UFACTOR` when it is sparse (mean degree <=
    :data:`SPARSE_MEAN_DEGREE`), :data:`DENSE_UFACTOR` when it is denser and has at least
    :data:`DENSE_TIGHT_MIN_VERTICES` vertices, else none (METIS's default balance)."""
    if entries <= SPARSE_MEAN_DEGREE * max(n, 1):
        return {"ufactor": SPARSE_UFACTOR}
    return {"ufactor": DENSE_UFACTOR} if n >= DENSE_TIGHT_MIN_VERTICES else {}


#: METIS's refinement passes per uncoarsening level (METIS_OPTION_NITER; METIS's own default
#: is 10): one pass costs little fill and saves much of METIS's time (docs/ops/cholesky.md,
#: "Ordering").
METIS_NITER = 1


# -- parallel nested dissection (the top levels split here, the parts ordered by METIS) -------
# Each split is METIS's own vertex separator (the one its nested dissection computes at that
# level; metis.vertex_separator), so the split ordering is METIS's dissection with its top
# levels run concurrently (analysis times and flops against METIS alone: docs/ops/cholesky.md,
# "sixth round").
#: Matrices with at least this many stored entries get their ordering split. Below it the
#: worker processes' start (a fresh interpreter importing this module) is not hidden.
PARALLEL_MIN_NNZ = 1_000_000
#: ... and at least this many get one level more (:data:`PARALLEL_LEVELS` + 1).
PARALLEL_DEEP_NNZ = 4_000_000
#: ... and at least this many, on 16 cores or more, one level more again (16 parts; the 120^3
#: Laplacian's ordering 7.4-8.1 -> 6.2-6.4 s on a 16-core host, flops 2 % fewer; the 2000^2
#: grid's 10.8-10.9 -> 9.4-9.6 s: docs/ops/cholesky.md, "Ordering, stop 41").
PARALLEL_DEEPER_NNZ = 10_000_000
#: Levels split below :data:`PARALLEL_DEEP_NNZ`: four parts for METIS.
PARALLEL_LEVELS = 2
#: METIS seeds tried per split, concurrently; the smallest balanced separator wins. METIS's
#: default seed first (-1); seeds 0 and 1 start its generator alike, so 1 is left out.
SEPARATOR_SEEDS = (-1, 2, 3, 4)
SEPARATOR_TRIES = len(SEPARATOR_SEEDS)
#: Each split also tries a breadth-first level set (:func:`level_set_separator`: a few
#: tenths of a second beside METIS's seconds) and keeps it where it scores better than METIS's
#: separators. On 3-D grids its flat diagonal cuts beat METIS's (120^3 Laplacian, 4 split
#: levels, one METIS seed: factor flops 1.52e13 -> 7.90e12, nnz(L) 1.57e9 -> 1.12e9); on the
#: other graphs measured (2-D grid, 27-point stencil, road network, random geometric graph,
#: R-MAT, Andrews) METIS's wins or they tie (docs/ops/cholesky.md, "Level sets among the
#: tries").
LEVEL_SET_TRIES = True
#: ... unless one of its parts holds less than this fraction of the vertices.
LEVEL_SET_LEAST_PART = 0.25
#: The level set a split tries is the thinnest level that leaves at least this fraction of the
#: vertices on either side (:func:`level_set_separator`'s ``least``): about the median level.
#: Against 0.3 (the thinnest level within 30/70), the 120^3 Laplacian's factor flops 7.86e12 ->
#: 7.35e12 and the subtree mapping's estimated critical path at 2 / 4 ranks 4.60e12 / 2.51e12
#: -> 3.70e12 / 2.13e12 (bound 1.71 / 3.13 -> 1.99 / 3.46): balanced parts balance the ranks
#: (docs/ops/cholesky.md, "Level sets among the tries").
LEVEL_SET_BALANCE = 0.48
#: ... and where it scores less than this much above the best of METIS's tries: a level set is
#: done long before them, so the work under it has gone on meanwhile
#: (:data:`SPECULATE_LEVEL_SETS`), and keeping it, not METIS's separator, takes the tries of
#: the whole graph and each split below off the ordering's critical path. On the 2-D grid
#: METIS's separator wins the top splits by 2-5 % (1000^2: 1,018 against 1,000 at the top, 451
#: against 435 and 474 against 450 below), and the chain of its tries, one level after the
#: other, was most of the ordering (docs/ops/cholesky.md, "Stop 53"). Where a level set is
#: further behind (the road network, R-MAT, a 27-point stencil), METIS's separator is kept.
LEVEL_SET_TOLERANCE = 0.05
#: A part of the last split level larger than the average part (n / 2^levels) is split again
#: (at most :data:`EXTRA_LEVELS` more times) instead of being ordered whole: METIS lets the two
#: sides of a sparse graph's separator differ 1.4:1, so the last level's parts range over 2x in
#: size, and the largest one's nested dissection ended the ordering alone (120^3 on 16 cores:
#: parts of 50k-153k vertices, ordered in 0.6-1.6 s).
LEAF_BALANCE = 1.0
EXTRA_LEVELS = 2
#: What ``ordering_split`` takes: auto (:func:`split_levels`' rule) or the levels (0: no split;
#: 4 levels already make 16 parts).
SPLIT_CHOICES = ("auto", 0, 1, 2, 3, 4)


def split_levels(nnz, workers=None, requested="auto"):
    """Top levels of the nested dissection split by :func:`parallel_nested_dissection` for a
    matrix of ``nnz`` stored entries: ``requested`` when it is a number (0: METIS alone);
    for ``auto``, :data:`PARALLEL_LEVELS` when it has at least :data:`PARALLEL_MIN_NNZ` and at
    least 4 cores are there (the four parts run at once; on fewer cores the tried separators
    cost more than they save), one more from :data:`PARALLEL_DEEP_NNZ` on 8 cores and another
    from :data:`PARALLEL_DEEPER_NNZ` on 16, else 0."""
    if requested != "auto":
        return int(requested)
    workers = threads.usable_cores() if workers is None else workers
    if nnz < PARALLEL_MIN_NNZ or workers < 4:
        return 0
    # a level more for the large ones, where there are cores for its parts
    return (PARALLEL_LEVELS + (nnz >= PARALLEL_DEEP_NNZ and workers >= 8)
            + (nnz >= PARALLEL_DEEPER_NNZ and workers >= 16))


def induced_subgraph(indptr, indices, vertices):
    """CSR ``(indptr, indices)`` of the subgraph induced by ``vertices`` (sorted), in their local
    numbering; int32 (what METIS takes, and half the bytes between processes)."""
    n = len(indptr) - 1
    local = np.full(n, -1, dtype=np.int64)
    local[vertices] = np.arange(len(vertices))
    selection, take = row_entries(indptr, vertices)
    row = np.repeat(np.arange(len(vertices)), np.diff(selection))
    neighbour = local[indices[take]]
    keep = neighbour >= 0
    sub_ptr = np.concatenate([[0], np.cumsum(np.bincount(row[keep], minlength=len(vertices)))])
    return sub_ptr.astype(np.int32), neighbour[keep].astype(np.int32)


def edge_cut_separator(indptr, indices, side):
    """A vertex separator from a bisection ``side`` (0/1 per vertex): a minimum vertex cover of
    the cut edges (Koenig's theorem on the bipartite graph of the cut: maximum matching, then
    the vertices reachable from unmatched left ones by alternating paths)."""
    from scipy.sparse.csgraph import maximum_bipartite_matching
    n = len(indptr) - 1
    row = np.repeat(np.arange(n), np.diff(indptr))
    cut = (side[row] == 0) & (side[indices] == 1)
    left, li = np.unique(row[cut], return_inverse=True)
    right, ri = np.unique(indices[cut], return_inverse=True)
    if not len(left):
        return np.zeros(0, dtype=np.int64)
    bipartite = sp.csr_matrix((np.ones(len(li), dtype=np.int8), (li, ri)),
                              shape=(len(left), len(right)))
    match_left = maximum_bipartite_matching(bipartite, perm_type="column")
    match_right = np.full(len(right), -1, dtype=np.int64)
    matched = np.flatnonzero(match_left >= 0)
    match_right[match_left[matched]] = matched
    reached_left = match_left < 0
    reached_right = np.zeros(len(right), dtype=bool)
    frontier = np.flatnonzero(reached_left)
    while len(frontier):
        r = sorted_distinct(bipartite[frontier].indices)
        r = r[~reached_right[r]]
        reached_right[r] = True
        nxt = match_right[r]  # every reached right vertex is matched (the matching is maximum)
        nxt = nxt[nxt >= 0]
        nxt = nxt[~reached_left[nxt]]
        reached_left[nxt] = True
        frontier = nxt
    return np.concatenate([left[~reached_left], right[reached_right]])


def _separator(indptr, indices, seed, niter=None):
    """One try at the split of a graph, with METIS seed ``seed``: returns (score, separator,
    side), where side (int8) is 0/1 and 2 on the separator, and the score is the separator's
    size weighted by the imbalance of the two parts.

    The separator is METIS's own vertex separator, the one its nested dissection computes at
    every level (:func:`metis.vertex_separator`), with the options the parts' dissection gets;
    where that cannot be called, a minimum vertex cover (:func:`edge_cut_separator`) of METIS's
    edge bisection, which costs fill."""
    n = len(indptr) - 1
    side = metis.vertex_separator(indptr, indices, _metis_settings(
        niter, seed=seed, **nested_dissection_balance(n, len(indices))))
    if side is not None:
        separator = np.flatnonzero(side == 2)
    else:
        side = _edge_bisection(indptr, indices, _metis_settings(niter, seed=seed))
        separator = edge_cut_separator(indptr, indices, side)
        side[separator] = 2
    return _separator_score(side), separator, side


def _separator_score(side):
    """The score of a split ``side`` (0/1, 2 on the separator) that the tries of a split are
    compared by: the separator's size weighted by the imbalance of the two parts."""
    sizes = np.bincount(side, minlength=3)
    return int(sizes[2]) * (1.0 + abs(int(sizes[0]) - int(sizes[1])) / max(len(side), 1))


def _edge_bisection(indptr, indices, settings):
    """METIS's edge bisection (``part_graph``, 2 parts) with ``settings``: 0/1 per vertex."""
    side = metis.bisection(indptr, indices, settings)
    if side is None:  # METIS cannot be called directly here: through pymetis's API
        import pymetis
        xadj, adjncy = indptr.astype(np.int32), indices.astype(np.int32)
        parts = pymetis.part_graph(2, adjacency=pymetis.CSRAdjacency(xadj, adjncy),
                                   options=pymetis.Options(**settings))
        side = np.asarray(parts.vertex_part if hasattr(parts, "vertex_part") else parts[1],
                          dtype=np.int8)
    return side


def ordering_pool(workers, levels=PARALLEL_LEVELS):
    """Worker processes for :func:`parallel_nested_dissection`: a ``forkserver`` pool (pymetis
    holds the GIL, so threads would run METIS one at a time). The fork server is a fresh
    single-threaded interpreter that imports this module once; workers fork from it, never
    from this process (which may hold a CUDA context and threads). Start it early -- its start
    (about a second, made by a thread: :data:`PRESPAWN_WORKERS`) then overlaps the caller's
    work."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    # The workers take this process's CPUs as they are now (analysis_affinity may have widened
    # them), whatever the fork server inherited when it started.
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    count = pool_size(workers, levels)
    pool = ProcessPoolExecutor(count, mp_context=context, initializer=_use_cpus,
                               initargs=(cpus,))
    if not PRESPAWN_WORKERS:
        pool.submit(int)  # starts the fork server and a first worker now
        return pool
    threads.in_background([lambda: _start_workers(pool, count)], "hisparse-ordering-start")
    return pool


def pool_size(workers, levels):
    """The worker processes of :func:`ordering_pool` on ``workers`` cores for ``levels`` split
    levels: no more than the second level's tries (the widest that run at once)."""
    return max(1, min(workers, SEPARATOR_TRIES << max(levels - 1, 0)))


#: Start the fork server and every worker of :func:`ordering_pool` from a thread, at once,
#: instead of the fork server in the caller (a submit waits until it has imported this module:
#: 0.7 s on the development host) and the workers one at a time in the dissection's submits
#: (the executor starts one per submit where none is idle, and each start holds the submitting
#: thread until the fork server has forked: the first splits waited for it).
PRESPAWN_WORKERS = True
#: Seconds a start-up task of :func:`_start_workers` holds its worker: long enough that the
#: next submit finds no idle worker and starts another.
SPAWN_HOLD_SECONDS = 0.05


def _start_workers(pool, count):
    """Submit ``count`` start-up tasks to ``pool`` so that it starts the fork server and its
    workers now (a submit starts a worker where none is idle). A pool shut down meanwhile, or
    worker processes this host refuses, are left to the dissection, which meets and reports
    them (it falls back to METIS alone)."""
    try:
        pool.submit(int)
        for _ in range(count - 1):
            pool.submit(time.sleep, SPAWN_HOLD_SECONDS)
    except (RuntimeError, OSError):  # shut down, or broken: BrokenProcessPool is a RuntimeError
        pass


def _use_cpus(cpus):
    """Worker start: run on ``cpus`` (None: as inherited)."""
    if cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass


def parallel_nested_dissection(indptr, indices, levels, workers=None, pool=None, niter=None,
                               timings=None):
    """Nested dissection whose top ``levels`` are split here and whose parts are ordered by
    METIS, concurrently in worker processes (:func:`ordering_pool`, unless ``pool`` is given).

    A split tries :data:`SEPARATOR_SEEDS` at once (:func:`_separator`: METIS's vertex
    separator) and a level set (:data:`LEVEL_SET_TRIES`), keeps the separator that is
    smallest for its balance, and orders [part 0, part 1, separator]; the parts under the level
    set go on while METIS's tries run (:data:`SPECULATE_LEVEL_SETS`). Every part of the last
    level is ordered by METIS's nested dissection, except one larger than the average part,
    which is split again (:data:`LEAF_BALANCE`). Subgraphs with fewer than 2,000 vertices or no
    edges are not split. The parts' subgraphs are extracted by the workers too. If the worker
    processes cannot run, METIS orders the whole graph here. Returns new-to-old int64.

    ``timings`` (a dict, optional) gets where the time went, in seconds from the start:
    ``top_split`` (the whole graph's separator chosen), ``splits`` (the last split chosen) and
    ``leaves`` (the last part ordered); and counts: ``level_set_splits`` (splits a level set
    won), ``speculations`` (level sets whose parts went on before their split was decided) and
    ``speculations_kept`` (those that won).
    """
    from concurrent.futures.process import BrokenProcessPool
    workers = threads.usable_cores() if workers is None else workers
    own_pool = pool is None
    try:
        if own_pool:
            pool = ordering_pool(workers, levels)
        return _dissect(pool, workers, indptr, indices, levels, niter,
                        {} if timings is None else timings)
    except (BrokenProcessPool, OSError) as exc:
        import warnings
        warnings.warn(f"cholesky: parallel nested dissection failed ({exc}); METIS alone")
        return _metis_nested_dissection(indptr, indices, niter)
    finally:
        if own_pool and pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class GraphFile:
    """A CSR graph (int32) stored in a scratch directory (tmpfs where the node has one) for the
    ordering's worker processes: they map it (copy-on-write) instead of receiving it through
    the pool's one pipe, which sends every task's arguments in turn -- the 120^3 Laplacian's
    48 MB graph to the four tries of its split took 0.8 s there, the last try starting that
    late, and every level of the split moves as much again. Pickles as its path."""

    def __init__(self, directory, name, indptr, indices):
        self.path = os.path.join(directory, name)
        self.vertices, self.entries = len(indptr) - 1, len(indices)
        np.save(self.path + "-indptr.npy", np.asarray(indptr, dtype=np.int32))
        np.save(self.path + "-indices.npy", np.asarray(indices, dtype=np.int32))

    def load(self):
        """``(indptr, indices)``, mapped from the files (writes stay in this process)."""
        return (np.load(self.path + "-indptr.npy", mmap_mode="c"),
                np.load(self.path + "-indices.npy", mmap_mode="c"))


def _scratch_directory():
    """A temporary directory for :class:`GraphFile` (removed by :func:`_remove_when_done`): in
    /dev/shm when it is there and writable (memory, no disk), else the system's temporary
    directory."""
    import tempfile
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.TemporaryDirectory(prefix="hisparse-ordering-", dir=where)


def _separator_of(graph, seed, niter):
    """:func:`_separator` of a :class:`GraphFile` (a worker's task)."""
    return _separator(*graph.load(), seed, niter)


def _level_set_try(indptr, indices, balance=None, least_part=None):
    """:func:`level_set_separator` (``least`` = ``balance``, :data:`LEVEL_SET_BALANCE` when
    None) as a try of a split, scored as :func:`_separator` scores METIS's: (score, separator,
    side). The caller passes the settings: a worker process has the module's defaults."""
    balance = LEVEL_SET_BALANCE if balance is None else balance
    least_part = LEVEL_SET_LEAST_PART if least_part is None else least_part
    side = level_set_separator(indptr, indices, balance)
    sizes = np.bincount(side, minlength=3)
    # A lopsided cut (no level leaves LEVEL_SET_LEAST_PART on either side: a graph of several
    # components, a star) would win on its small separator and leave the split undone.
    lopsided = min(int(sizes[0]), int(sizes[1])) < least_part * len(side)
    return (np.inf if lopsided else _separator_score(side)), np.flatnonzero(side == 2), side


def _level_set_of(graph, balance, least_part):
    """:func:`_level_set_try` of a :class:`GraphFile` (a worker's task)."""
    return _level_set_try(*graph.load(), balance, least_part)


def _leaf_of(graph, niter):
    """:func:`_metis_nested_dissection` of a :class:`GraphFile` (a worker's task)."""
    return _metis_nested_dissection(*graph.load(), niter)


def _part_of(graph, side, part, name):
    """The subgraph of a :class:`GraphFile` induced by the vertices of ``side == part``, stored
    beside it as ``name`` (a worker's task)."""
    inside = np.flatnonzero(side == part)
    return GraphFile(os.path.dirname(graph.path), name, *induced_subgraph(*graph.load(), inside))


def _dissect(pool, workers, indptr, indices, levels, niter, timings):
    """The work of :func:`parallel_nested_dissection` on ``pool`` (of ``workers`` processes);
    the graphs go to the workers as :class:`GraphFile`."""
    scratch, abandoned = _scratch_directory(), []
    try:
        return _dissect_in(pool, workers, scratch.name, indptr, indices, levels, niter, timings,
                           abandoned)
    finally:
        _remove_when_done(scratch, abandoned)


#: Seconds the scratch directory waits for dropped tasks still running before it is removed.
SCRATCH_WAIT_SECONDS = 120.0


def _remove_when_done(scratch, tasks):
    """Remove the ``scratch`` directory (:func:`_scratch_directory`) once ``tasks`` are done:
    dropped parts of a speculation may still be running, and one extracting a subgraph writes
    there (removed under it, the directory's removal could fail, or leave its file in
    /dev/shm). At once when none runs, else from a thread, so the analysis goes on."""
    running = [task for task in tasks if not task.done()]
    if not running:
        scratch.cleanup()
        return

    threads.in_background([lambda: wait(running, timeout=SCRATCH_WAIT_SECONDS),
                           scratch.cleanup], "hisparse-ordering-scratch")


def _seeds_at(level, workers):
    """The METIS seeds tried at once for each split ``level`` levels below the whole graph: all
    of :data:`SEPARATOR_SEEDS` while the level's splits times them fit in ``workers``, fewer
    (at least one) below, where the tries would only queue behind each other."""
    return SEPARATOR_SEEDS[:max(1, min(SEPARATOR_TRIES, workers >> level))]


#: A split's level set is done long before METIS's tries (the 120^3 Laplacian's whole graph:
#: 0.5 s against 1.8 s on 16 cores), so its two parts are extracted, split and ordered at once,
#: on the workers METIS's tries leave idle. The split is still decided when its last try is
#: done, by the same rule: the work under the level set is kept where it wins (the ordering it
#: would have been, sooner) and cancelled where METIS's separator does.
SPECULATE_LEVEL_SETS = True


def _best_try(results, level_set=None, tolerance=None):
    """Index of the try a split keeps among ``results`` ((score, separator, side) each):
    the level set's (at index ``level_set``, None when not tried) where its score is below
    ``1 + tolerance`` (:data:`LEVEL_SET_TOLERANCE` when None) times the best of the others,
    else the best score (the first of equals: METIS's tries come first, so with no tolerance a
    level set wins only where it scores strictly less). The same rule whether
    or not the level set's parts went on early, so the ordering never depends on timing."""
    tolerance = LEVEL_SET_TOLERANCE if tolerance is None else tolerance
    best = min(range(len(results)), key=lambda i: results[i][0])
    if level_set is None or best == level_set:
        return best
    others = min(results[i][0] for i in range(len(results)) if i != level_set)
    if results[level_set][0] < (1.0 + tolerance) * others:
        return level_set
    return best


class _Piece:
    """A (sub)graph of the parallel nested dissection: ``key`` (its path from the whole graph,
    0/1 per split), ``vertices`` (numbers in the whole graph, sorted), ``depth`` (split levels
    left: 0 and below only while larger than the average part), ``graph`` (its
    :class:`GraphFile`, once extracted), then either ``order`` (a leaf, ordered by METIS) or
    ``separator`` and ``children`` (a split); ``speculative`` holds the pieces under its level
    set while the split is undecided."""

    __slots__ = ("key", "vertices", "depth", "graph", "alive", "tries", "level_set", "order",
                 "separator", "children", "speculative", "finished", "by_level_set", "speculated")

    def __init__(self, key, vertices, depth):
        self.key, self.vertices, self.depth = key, vertices, depth
        self.graph = self.level_set = self.order = self.separator = None
        self.children = self.speculative = ()
        self.tries = []
        self.alive = True
        self.finished = 0.0  # seconds from the start: its order or its split decided
        self.by_level_set = False  # a split whose level set won
        self.speculated = False  # ... whose level set's parts went on before it was decided

    def pieces(self, since=0.0):
        """This piece and every piece under it in the dissection as decided, each with the time
        it was final: done, and every split above it decided (a piece under a level set may be
        done before its split is)."""
        final = max(self.finished, since)
        yield self, final
        for child in self.children:
            yield from child.pieces(final)


def _dissect_in(pool, workers, directory, indptr, indices, levels, niter, timings, abandoned):
    """:func:`_dissect` in the scratch ``directory``; ``abandoned`` gets the dropped tasks that
    were running (their workers are busy until they are done)."""
    started = time.perf_counter()
    n = len(indptr) - 1
    pending = {}  # future -> (what, piece): "part" (its GraphFile), "leaf", "try"
    names = itertools.count()  # the pieces' GraphFile names
    leaf_most = LEAF_BALANCE * n / (1 << levels)
    speculations, running_most = 0, pool_size(workers, levels)

    def place(piece):
        """Order a (sub)graph: METIS on a leaf, else the tries of its split (below the split
        levels too while the part is larger than the average one: :data:`LEAF_BALANCE`)."""
        graph, depth, size = piece.graph, piece.depth, len(piece.vertices)
        if depth <= -EXTRA_LEVELS or (depth <= 0 and size <= leaf_most) or size < 2000 or \
                not graph.entries:
            pending[pool.submit(_leaf_of, graph, niter)] = ("leaf", piece)
            return
        if LEVEL_SET_TRIES:  # submitted first: the cheap try, whose parts may go on meanwhile
            piece.level_set = pool.submit(_level_set_of, graph, LEVEL_SET_BALANCE,
                                          LEVEL_SET_LEAST_PART)
        # METIS's seeds first in the tries: a level set wins only where it scores strictly less
        piece.tries = [pool.submit(_separator_of, graph, seed, niter)
                       for seed in _seeds_at(len(piece.key), workers)]
        if piece.level_set is not None:
            piece.tries.append(piece.level_set)
        for future in piece.tries:
            pending[future] = ("try", piece)

    def split(piece, side):
        """The two parts of ``piece`` by ``side`` (0/1, 2 on the separator), their subgraphs
        extracted by the workers."""
        parts = []
        for part in (0, 1):
            child = _Piece(piece.key + (part,), piece.vertices[side == part], piece.depth - 1)
            pending[pool.submit(_part_of, piece.graph, side, part, f"g{next(names)}")] = (
                "part", child)
            parts.append(child)
        return tuple(parts)

    def drop(pieces):
        """Give up ``pieces`` and everything under them: their waiting tasks are cancelled, and
        the results of those already running never read."""
        stack = list(pieces)
        while stack:
            piece = stack.pop()
            piece.alive = False
            stack.extend(piece.children + piece.speculative)
        for future, (_, piece) in list(pending.items()):
            if not piece.alive:
                if not future.cancel():
                    abandoned.append(future)
                del pending[future]

    def busy():
        """The tasks submitted and not done (the dropped ones that still run among them)."""
        return len(pending) + sum(not f.done() for f in abandoned)

    root = _Piece((), np.arange(n, dtype=np.int64), levels)
    root.graph = GraphFile(directory, f"g{next(names)}", indptr, indices)
    place(root)
    while pending:
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        for future in done:
            if future not in pending:
                continue  # dropped by an earlier one of ``done``
            what, piece = pending.pop(future)
            if what == "part":
                piece.graph = future.result()
                place(piece)
            elif what == "leaf":
                piece.order = piece.vertices[future.result()]
                piece.finished = time.perf_counter() - started
                piece.vertices = None  # done with: the pieces of a 250^3 graph hold GBs
            elif piece.separator is None:  # a try of an undecided split
                # ... on workers left idle (none taken from work that will be kept)
                if future is piece.level_set and SPECULATE_LEVEL_SETS and \
                        busy() < running_most and not all(f.done() for f in piece.tries):
                    score, _, side = future.result()
                    if np.isfinite(score):
                        piece.speculative = split(piece, side)
                        piece.speculated = True
                        speculations += 1
                if not all(f.done() for f in piece.tries):
                    continue  # a split is decided once, when its last try is done
                results = [f.result() for f in piece.tries]
                best = _best_try(results, piece.tries.index(piece.level_set)
                                 if piece.level_set is not None else None)
                _, separator, side = results[best]
                piece.separator = piece.vertices[separator]
                piece.finished = time.perf_counter() - started
                piece.by_level_set = piece.tries[best] is piece.level_set
                if piece.speculative and piece.by_level_set:
                    piece.children = piece.speculative
                else:
                    drop(piece.speculative)
                    piece.children = split(piece, side)
                piece.speculative, piece.vertices = (), None

    decided = list(root.pieces())
    splits = [(p, final) for p, final in decided if p.separator is not None]
    timings["top_split"] = root.finished if root.separator is not None else 0.0
    if splits:
        timings["splits"] = max(final for _, final in splits)
    timings["leaves"] = max(final for p, final in decided if p.order is not None)
    timings["level_set_splits"] = sum(p.by_level_set for p, _ in splits)
    timings["speculations"] = speculations  # dropped ones too, and those under them
    timings["speculations_kept"] = sum(p.speculated and p.by_level_set for p, _ in splits)

    def ordered(piece):
        if piece.order is not None:
            return [piece.order]
        return ordered(piece.children[0]) + ordered(piece.children[1]) + [piece.separator]

    return np.concatenate(ordered(root))


def choose_ordering(nranks=1, grid=None, max_row_entries=None):
    """The ordering ``auto`` uses: the planes of a known grid (``geometric``), else METIS nested
    dissection when pymetis is installed, else RCM on one rank and
    :func:`level_set_dissection` on several (whose subtree-to-rank mapping needs a tree that
    splits at its top: RCM's is a path).

    ``grid``: the grid the rows are the points of, when known (``ordering_grid``, or a generated
    poisson input's dims); ``max_row_entries``: the most entries a row of the matrix holds (what
    tells a stencil of face neighbours, :func:`reaches_faces_only`, whose diagonal planes need
    Numba's compiled passes). On the development host the planes' factors against METIS's:
    nnz(L) / flops 0.83 / 0.62 on the 7-point 40^3, 0.73 / 0.50 on 64^3, 1.06 / 1.15 on the
    5-point 400^2; by boxes on the 27-point stencil, nnz(L) 0.92 on 12^3 and 0.96 (flops 0.93)
    on 120^3; from an ordering that takes a fraction of METIS's time (docs/ops/cholesky.md,
    "Stop 57").

    The rule without a grid is by measurement (docs/ops/cholesky.md, "Ordering"): on the
    circuit-like matrices (2-D grids, the luxembourg_osm Laplacian) RCM is much cheaper to
    compute than METIS but gives many times the fill and the flops and a far taller elimination
    tree (one launch per level on the GPU), so it never wins on time to solution. On matrices of
    at least :data:`PARALLEL_MIN_NNZ` entries with at least 4 cores, METIS's nested dissection is
    run as :func:`parallel_nested_dissection` (:func:`split_levels`).
    """
    if grid is not None and len(grid) in FACE_STENCIL_DIRECTIONS and (
            HAVE_NUMBA or not reaches_faces_only(grid, max_row_entries)):
        return "geometric"
    if have_pymetis():
        return "metis"
    return "dissection" if nranks > 1 else "rcm"


def resolve_ordering(method, nranks=1, grid=None, indptr=None):
    """``method``, or for ``auto`` :func:`choose_ordering`'s choice for a matrix with row
    pointers ``indptr`` (whose most entries a row tell a grid's stencil): what the analysis, its
    ordering file and the ordering's worker processes are all given."""
    if method != "auto":
        return method
    return choose_ordering(nranks, grid, None if indptr is None else most_row_entries(indptr))


def reaches_faces_only(grid, max_row_entries):
    """Whether a grid's stencil reaches only the face neighbours (no row of more than 2 d + 1
    entries: 5-point in 2-D, 7-point in 3-D), which :func:`grid_nested_dissection` may then
    cut by diagonal planes as well."""
    return grid is not None and max_row_entries is not None and \
        max_row_entries <= 2 * len(grid) + 1


def most_row_entries(indptr):
    """The most entries a row of a CSR matrix with row pointers ``indptr`` holds (0 without
    rows): what :func:`choose_ordering` reads a grid's stencil from."""
    indptr = np.asarray(indptr)
    return int(np.diff(indptr).max()) if len(indptr) > 1 else 0


def _rcm(indptr, indices):
    """SciPy's reverse Cuthill-McKee of a CSR graph; new-to-old int64."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    n = len(indptr) - 1
    graph = sp.csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr), shape=(n, n))
    return np.asarray(reverse_cuthill_mckee(graph, symmetric_mode=True), dtype=np.int64)


#: Levels of :func:`level_set_dissection` beyond log2 of the ranks: about four subtrees per
#: rank, for the mapping to balance.
DISSECTION_EXTRA_LEVELS = 2
#: Parts smaller than this are not dissected further.
DISSECTION_MIN_VERTICES = 64


def dissection_levels(nranks):
    """Levels of :func:`level_set_dissection` for ``nranks`` ranks."""
    return int(np.ceil(np.log2(max(nranks, 1)))) + DISSECTION_EXTRA_LEVELS


def _bfs_levels(indptr, indices, source):
    """Breadth-first level of every vertex from ``source`` (-1: not reached), from SciPy's
    breadth-first search (C). No compiled loop: the level set is a try of every split, run by
    the ordering's worker processes, where loading a compiled one cost 0.67 s a process.

    A first-in-first-out search lists the children of earlier vertices first, so the
    positions of the vertices' parents never fall along its order, and each level ends where
    the parents' positions reach the level's end (one search a level). Should SciPy's search
    ever list them otherwise, the levels come from :func:`_bfs_levels_by_frontier`."""
    from scipy.sparse.csgraph import breadth_first_order
    n = len(indptr) - 1
    graph = sp.csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr), shape=(n, n))
    reached, parent = breadth_first_order(graph, int(source), directed=True,
                                          return_predecessors=True)
    position = np.empty(n, dtype=np.int64)
    position[reached] = np.arange(len(reached))
    parent_position = position[parent[reached[1:]]]
    if not np.all(parent_position[1:] >= parent_position[:-1]):
        return _bfs_levels_by_frontier(indptr, indices, source)
    ends = [1]  # level k is reached[ends[k-1]:ends[k]]
    while ends[-1] < len(reached):
        ends.append(1 + int(np.searchsorted(parent_position, ends[-1], side="left")))
    level = np.full(n, -1, dtype=np.int64)
    level[reached] = np.repeat(np.arange(len(ends)), np.diff([0] + ends))
    return level


def _bfs_levels_by_frontier(indptr, indices, source):
    """:func:`_bfs_levels` one level at a time: the frontier's neighbours not yet reached."""
    level = np.full(len(indptr) - 1, -1, dtype=np.int64)
    level[source] = 0
    frontier, depth = np.array([source], dtype=np.int64), 0
    while len(frontier):
        neighbours = np.asarray(indices)[row_entries(indptr, frontier)[1]]
        frontier = sorted_distinct(neighbours[level[neighbours] < 0]).astype(np.int64)
        depth += 1
        level[frontier] = depth
    return level


def level_set_separator(indptr, indices, least=0.3):
    """A vertex separator of a graph from breadth-first level sets: from a pseudo-peripheral
    vertex (the farthest from vertex 0), the thinnest level that leaves at least ``least`` of the
    reached vertices on either side, else the level where half of them lie below (every edge
    joins one level to itself or the next, so a level separates those before it from those
    after). Returns ``side`` (int8): 0 and 1 for the parts, 2 on the separator;
    vertices not reached (another component) go to part 1."""
    level = _bfs_levels(indptr, indices, 0)
    level = _bfs_levels(indptr, indices, int(np.argmax(level)))
    reached = level >= 0
    counts = np.bincount(level[reached])
    total = reached.sum()
    below = np.cumsum(counts) - counts  # vertices before each level
    k = int(np.searchsorted(below + counts, total / 2.0))  # the median level
    # the thinnest level that leaves at least ``least`` of the vertices on either side, if any
    balanced = np.flatnonzero((below >= least * total) & (below + counts <= (1 - least) * total))
    if len(balanced):
        k = int(balanced[np.argmin(counts[balanced])])
    side = np.where(reached & (level < k), 0, 1).astype(np.int8)
    side[level == k] = 2
    return side


def level_set_dissection(indptr, indices, levels):
    """Nested dissection of a CSR graph whose top ``levels`` are cut by
    :func:`level_set_separator`, the parts ordered by RCM: [part 0, part 1, separator] at every
    level. New-to-old int64."""

    def order(vertices, graph, depth):
        if depth == 0 or len(vertices) < DISSECTION_MIN_VERTICES or not len(graph[1]):
            return [vertices[_rcm(*graph)]]
        side = level_set_separator(*graph)
        out = []
        for part in (0, 1):
            inside = np.flatnonzero(side == part)
            if len(inside):
                out += order(vertices[inside], induced_subgraph(*graph, inside), depth - 1)
        return out + [vertices[side == 2]]

    n = len(indptr) - 1
    return np.concatenate(order(np.arange(n, dtype=np.int64), (indptr, indices), levels))


def start_ordering_pool(nnz, ordering="auto", split="auto"):
    """The worker processes :func:`analyze` will order a matrix of ``nnz`` stored entries with
    (:func:`ordering_pool`), or None when it will not split the ordering (:func:`split_levels`
    of ``split``, no pymetis, another ordering, or no worker processes here). A caller that
    starts them before its other setup work hides their start (about a second) behind it; it
    passes them to :func:`analyze` with the same ``split`` and shuts them down afterwards."""
    levels = split_levels(nnz, requested=split)
    if ordering not in ("auto", "metis") or not levels or not have_pymetis():
        return None
    try:
        return ordering_pool(threads.usable_cores(), levels)
    except OSError:  # no worker processes here: METIS alone
        return None



def node_cpus():
    """The CPUs this process could run on if no launcher had bound it: the node's online CPUs
    (``/sys/devices/system/cpu/online``, else ``os.cpu_count()``), as a set of ids. A container's
    or a job's cpuset narrows them further; :func:`analysis_affinity` lets the kernel apply it."""
    try:
        with open("/sys/devices/system/cpu/online") as handle:
            cpus = set()
            for part in handle.read().strip().split(","):
                low, _, high = part.partition("-")
                cpus.update(range(int(low), int(high or low) + 1))
            if cpus:
                return cpus
    except (OSError, ValueError):
        pass
    return set(range(os.cpu_count() or 1))


@contextmanager
def analysis_affinity(log=None):
    """Run the block on the node's CPUs when a launcher bound this process to fewer (Open MPI's
    ``mpirun`` binds each rank to one core at one or two ranks): the ordering's worker processes
    (forked while it lasts, :func:`ordering_pool`) and the analysis' threads then use the cores
    the other ranks leave idle while rank 0 analyses, where the binding would give them one
    core and :func:`split_levels` would not split the ordering at all. The kernel keeps the
    result within the process's cpuset (a container's or a Slurm job's). The binding is put back
    afterwards (this thread's; threads started inside keep the wider set). ``log(line)`` is told
    when the set is widened. Yields the CPU count the block runs on."""
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - not Linux
        yield threads.usable_cores()
        return
    bound = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, node_cpus() | bound)
        wide = os.sched_getaffinity(0)
    except OSError:
        wide = bound
    if len(wide) <= len(bound):
        yield len(bound)
        return
    if log is not None:
        log(f"this rank is bound to {len(bound)} of the node's {len(wide)} CPUs (the "
            f"launcher's binding); the analysis and the ordering's worker processes run on all "
            f"{len(wide)} and the binding is restored after it")
    try:
        yield len(wide)
    finally:
        os.sched_setaffinity(0, bound)
