"""Symbolic analysis of a sparse Cholesky factorization (host only).

Steps, all on the pattern of a symmetric matrix A (n x n):

1. fill-reducing ordering (:mod:`.ordering`: METIS nested dissection, RCM, natural);
2. elimination tree (Liu, with path compression) and its postorder; the ordering is composed with
   the postorder so that every subtree -- hence every supernode -- is a contiguous column range;
3. column counts (Gilbert-Ng-Peyton skeleton/least-common-ancestor algorithm);
4. fundamental supernodes; relaxed amalgamation (a size threshold ``merge_threshold`` as in the
   seed's design -- a child is merged into its parent when both have fewer columns than it -- or
   CHOLMOD's zero-fraction rules), and the row structure of every relaxed supernode;
5. the numeric plan: where every supernode's dense panel lives in one value array, the map from
   the entries of A to that array, the relative indices of every supernode's update into its
   ancestors, the column blocks (``block_size``) that split big supernodes into tasks, and the
   etree levels used to batch independent small supernodes.

Everything here depends on the pattern only, so a :class:`SymbolicFactor` is reused when the
values change (refactorization). Indices are int64 on the host.

Speed: the steps that are sequential by nature (the elimination tree with path compression,
the postorder walk, the column counts' disjoint sets, the amalgamation pass, the supernodal row
structures and the binary searches of the relative indices) are small loops compiled by Numba
(``@_compiled``; cached on disk after the first use); everything else is vectorised NumPy/SciPy.
Numba is the one compiler that is a plain PyPI wheel for every supported Python (no C toolchain
on the user's machine) and is already on the GPU machines. Without it the same functions run as
plain Python (correct, but far slower) -- the permuted matrix is never formed either way: the
loops read A's symmetric pattern through ``perm``/``iperm``.

The steps live in modules of their own: :mod:`.etree` (the elimination tree, its postorder and
the column counts), :mod:`.supernodes` (fundamental and relaxed supernodes, the top boundaries
and pieces kept for several ranks, the supernodes' work), :mod:`.structure` (the row structures
and the numeric plan) and :mod:`.factor` (:class:`SymbolicFactor`); this module checks the input,
loads the compiled loops and runs the steps (:func:`analyze`).
"""
import time

import numpy as np
import scipy.sparse as sp

from ... import threads
from ...arrays import inverse_permutation
from ...errors import HisparseError
from ...timing import StepClock

# The sequential loops below are compiled when Numba is there (see the module docstring).
from ...compiled import prange
from ...compiled import compiled_parallel as _compiled_parallel
from .etree import (_counts_by_runs, _etree_by_runs, _runs_of, _runs_pieces, column_counts,
                    elimination_tree, postordered)
from .factor import SymbolicFactor
from .ordering import (METIS_NITER, fill_reducing_order, level_set_dissection,
                       nested_dissection_balance, offdiagonal_pattern, resolve_ordering,
                       split_levels, start_ordering_pool)
from .ordering_file import OrderingFile, pattern_digest
from .structure import _build_plan, sorted_positions
from .supernodes import (RELAXATIONS, TOP_PIECE_COLUMNS, cut_top_separators,
                         fundamental_supernodes, keep_top_boundaries, relaxed_supernodes)

#: What other modules take from here (the steps' own functions: from their modules).
__all__ = ["RELAXATIONS", "SYMBOLIC_STEPS", "TOP_PIECE_COLUMNS", "SymbolicFactor", "analyze",
           "check_square_symmetric", "warm_up"]


@_compiled_parallel
def _mirror_status(indptr, indices, data, tolerance, status):
    """``status[i]`` for each row i of a canonical CSR matrix (sorted columns, no duplicates):
    0 when every entry (i, j) has its mirror (j, i) stored within ``tolerance``, 1 when one is
    not stored but the entry is at most ``tolerance`` (the values are symmetric, the pattern is
    not), 2 when a value differs from its mirror's by more (found by a binary search in row j;
    rows in parallel)."""
    for row in prange(len(indptr) - 1):
        worst = 0
        for entry in range(indptr[row], indptr[row + 1]):
            column = indices[entry]
            low, high = indptr[column], indptr[column + 1]
            while low < high:  # the first place in row `column` whose column is >= row
                middle = (low + high) // 2
                if indices[middle] < row:
                    low = middle + 1
                else:
                    high = middle
            if low < indptr[column + 1] and indices[low] == row:
                if abs(data[entry] - data[low]) > tolerance:
                    worst = 2
            elif abs(data[entry]) > tolerance:
                worst = 2
            elif worst == 0:
                worst = 1
        status[row] = worst


def check_square_symmetric(matrix, name="matrix"):
    """Raise one clear line when ``matrix`` (scipy CSR) is not square or not symmetric; return
    whether its stored pattern is symmetric too (:func:`analyze` then skips that check).

    Entries whose difference from their mirror is at most 1e-14 max|A| count as symmetric. The
    common case -- the same pattern in both triangles -- compares the value arrays directly."""
    m, n = matrix.shape
    if m != n:
        raise HisparseError(f"cholesky: {name} is not square ({m} x {n})")
    if sp.isspmatrix_csr(matrix) and matrix.has_canonical_format and matrix.nnz:
        # Each entry's mirror found in place, rows in parallel: a copy, a transpose and
        # their compares had taken 0.3-0.4 s of the 120^3 Laplacian's analysis. A matrix that
        # fails is checked again below, which names the worst entry.
        status = np.empty(n, dtype=np.int8)
        _mirror_status(matrix.indptr, matrix.indices, matrix.data,
                       1e-14 * float(np.abs(matrix.data).max()), status)
        worst = int(status.max())
        if worst < 2:
            return worst == 0
    a = sp.csr_matrix(matrix, copy=True)
    a.sum_duplicates()  # canonical: sorted indices, no duplicates
    transposed = a.T.tocsr()
    transposed.sum_duplicates()
    scale = float(np.abs(a.data).max()) if a.nnz else 1.0
    if (np.array_equal(a.indptr, transposed.indptr)
            and np.array_equal(a.indices, transposed.indices)
            and not (np.abs(a.data - transposed.data) > 1e-14 * scale).any()):
        return True
    diff = abs(a - transposed)
    if diff.nnz:
        diff.data[diff.data <= 1e-14 * scale] = 0
        diff.eliminate_zeros()
    if diff.nnz:
        coo = diff.tocoo()
        k = int(np.argmax(coo.data))
        i, j = int(coo.row[k]), int(coo.col[k])
        raise HisparseError(f"cholesky: {name} is not symmetric: A[{i}, {j}] = "
                            f"{float(matrix[i, j]):.17g} but A[{j}, {i}] = "
                            f"{float(matrix[j, i]):.17g}")
    return False  # symmetric values, but an entry is stored on one side only


def _load_parallel_loops():
    """Run the loops of the closed-run paths of :func:`elimination_tree` and
    :func:`column_counts` once on a small grid, so that this process has them: Numba loads each
    from its disk cache at its first call (0.1-0.2 s for these on an H200 host, which a timed
    analysis paid). :func:`analyze` calls it on a thread while the ordering runs."""
    if _LOADED_PARALLEL_LOOPS:
        return
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(12, 12))
    indptr, indices = offdiagonal_pattern(sp.kronsum(path, path, format="csr"), True)
    order = level_set_dissection(indptr, indices, 2)
    iorder = inverse_permutation(order)
    parent = _etree_by_runs(indptr, indices, order, iorder,
                            *_runs_of(indptr, indices, order, iorder, 2))
    perm, iperm, parent = postordered(order, parent)
    _counts_by_runs(indptr, indices, perm, iperm, parent,
                    *_runs_of(indptr, indices, perm, iperm, 2))
    _LOADED_PARALLEL_LOOPS.append(True)


_LOADED_PARALLEL_LOOPS = []


def _start_loading_parallel_loops(n):
    """A thread running :func:`_load_parallel_loops` when an analysis of ``n`` columns will take
    the closed-run paths (None otherwise, or when they are loaded). Its failure is left to the
    analysis' own call, which meets it again."""
    if _LOADED_PARALLEL_LOOPS or not _runs_pieces(n):
        return None
    return threads.in_background([_load_parallel_loops], "hisparse-load-loops")


def warm_up(nranks=1):
    """Load the compiled loops into this process (compiling them first when the disk cache is
    empty) by analysing a 4 x 4 grid Laplacian; returns the seconds it took. Numba is imported
    and initialises itself at the first compiled call of a process (plus its import), a
    one-time cost the operation pays before it times the analysis and records apart. On several
    ranks (``nranks`` > 1) also the loops of the several-rank analysis and of the subtree
    mapping (:mod:`.mapping`; about 40 ms to load, which the analysis had paid)."""
    start = time.perf_counter()
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(4, 4))
    grid = sp.kronsum(path, path, format="csr")
    analyze(grid, "natural", "cholmod")
    analyze(grid, "natural", "threshold")
    if nranks > 1:
        from .mapping import subtree_mapping
        path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(16, 16))
        grid = sp.kronsum(path, path, format="csr")
        # a nested dissection by hand (left half, right half, the middle column last), taken
        # as the natural order: the ``dissection`` ordering would import SciPy's graph module
        # (0.1 s on the development host) on this path, where an analysis reading its
        # ordering never needs it
        column = np.arange(256) % 16
        order = np.concatenate([np.flatnonzero(column < 8), np.flatnonzero(column > 8),
                                np.flatnonzero(column == 8)])
        subtree_mapping(analyze(grid[order][:, order], "natural", "cholmod", nranks=2), 2)
    return time.perf_counter() - start


def analyze(matrix, ordering="auto", relaxation="threshold", merge_threshold=64,
            block_size=1024, metis_niter=None, pattern_symmetric=False,
            pool=None, before_ordering=None, split="auto", nranks=1,
            top_piece_columns=TOP_PIECE_COLUMNS, ordering_file=None, complete=True, grid=None):
    """Full symbolic analysis of a symmetric sparse matrix.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix, shape (n, n), float
        Both triangles stored; only the pattern is used, plus the positions of its entries (for
        the value map of the numeric factorization).
    ordering : {"auto", "metis", "dissection", "geometric", "rcm", "natural"}
    relaxation : {"threshold", "cholmod", "none"}
    merge_threshold : int
        Column threshold of the ``threshold`` rule.
    block_size : int
        Columns per block task of big supernodes.
    metis_niter : int, optional
        METIS's refinement passes per level (:data:`METIS_NITER` when None).
    pattern_symmetric : bool
        The caller checked that the stored pattern is symmetric (the return value of
        :func:`check_square_symmetric`); used only for a matrix in canonical CSR form.
    pool : concurrent.futures.Executor, optional
        Worker processes from :func:`start_ordering_pool`, started by the caller (who shuts
        them down); otherwise they are started here when the ordering is split.
    before_ordering : callable, optional
        Called (no arguments) once the graph is built, right before the ordering: METIS leaves
        the interpreter free while it runs, so the caller can start work there that needs it
        (the Cholesky operation imports the GPU libraries) without slowing the analysis.
    split : "auto" or int
        Top levels of the METIS ordering split over worker processes (:func:`split_levels`).
    nranks : int
        Ranks the factorization is spread over (:func:`~.ordering.fill_reducing_order`,
        :func:`keep_top_boundaries`, :func:`cut_top_separators`).
    top_piece_columns : int
        On several ranks, the width of the pieces the top separators are cut into
        (:func:`cut_top_separators`; 0: not cut).
    ordering_file : str, optional
        An HDF5 file of the ordering (:mod:`.ordering_file`): read instead of computing the
        ordering when it exists (it must belong to this matrix and to the ``ordering`` asked
        for), else the computed ordering is written there (a new file).
    grid : sequence of int, optional
        The regular grid whose points the rows are, row-major (``ordering="geometric"``:
        :func:`~.geometric.grid_nested_dissection`).

    Returns
    -------
    SymbolicFactor
        Its ``stats`` hold ``ordering_seconds`` (the graph and the fill-reducing ordering),
        ``ordering_graph_seconds`` (the graph), ``ordering_top_split_seconds``,
        ``ordering_splits_seconds`` and ``ordering_leaves_seconds`` (when the whole graph's
        separator, the last separator and the last part were done, from the ordering's start:
        :func:`~.ordering.parallel_nested_dissection`, which also counts the splits a level set
        won and the level sets whose parts went on before their split was decided:
        ``ordering_level_set_splits``, ``ordering_speculations``,
        ``ordering_speculations_kept``) and ``symbolic_seconds`` (everything
        after the ordering), split into ``symbolic_<step>_seconds`` for the steps of
        :data:`SYMBOLIC_STEPS`; ``ordering_source``: ``computed``, ``file`` (read from
        ``ordering_file``) or ``computed and saved``, and ``ordering_file_seconds`` (the
        pattern's digest and the file's read or write).
    """
    start = time.perf_counter()
    matrix = sp.csr_matrix(matrix)
    pattern_symmetric = bool(pattern_symmetric) and matrix.has_canonical_format
    ordering = resolve_ordering(ordering, nranks, grid, matrix.indptr)
    saved = None if ordering_file is None else OrderingFile(ordering_file, ordering)
    reuse = saved is not None and saved.exists()
    loader = _start_loading_parallel_loops(matrix.shape[0])  # beside the ordering
    own_pool = pool is None
    if own_pool and not reuse:  # started first: its start overlaps the pattern's construction
        pool = start_ordering_pool(matrix.nnz, ordering, split)
    # Whether the ordering's top levels are split, decided once here: over the worker processes
    # start_ordering_pool gave (its rule), METIS alone without them.
    levels = split_levels(matrix.nnz, requested=split) if pool is not None else 0
    try:
        # Where every (sorted) entry sits in the caller's CSR data, for the value map.
        positions = sorted_positions(matrix)
        pattern = offdiagonal_pattern(positions, pattern_symmetric)
        if before_ordering is not None:
            before_ordering()
        split_timings = {}
        graph_built = time.perf_counter()
        file_seconds, digest, order = 0.0, None, None
        if saved is not None:  # the file's steps are timed apart from the ordering
            file_started = time.perf_counter()
            digest = pattern_digest(*pattern)
            if reuse:
                (order, used), levels = saved.read(matrix.shape[0], digest), 0
            file_seconds += time.perf_counter() - file_started
        if order is None:
            order, used = fill_reducing_order(positions, ordering, pattern, pool, metis_niter,
                                              levels, nranks, timings=split_timings, grid=grid)
            if saved is not None:
                file_started = time.perf_counter()
                saved.write(order, digest, used,
                            {"metis_niter": int(metis_niter or METIS_NITER),
                             "ordering_split": str(split), "ordering_split_levels": int(levels)})
                file_seconds += time.perf_counter() - file_started
    finally:
        if own_pool and pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    if loader is not None:
        loader.join()
    ordered = time.perf_counter()
    steps = StepClock()
    indptr, indices = pattern
    # Etree of the permuted pattern, then compose the ordering with the etree postorder.
    perm, iperm, parent = postordered(
        order, elimination_tree(indptr, indices, order, inverse_permutation(order)))
    steps.mark("etree")
    counts = column_counts(indptr, indices, perm, iperm, parent)
    steps.mark("counts")
    fund = fundamental_supernodes(parent, counts)
    starts = relaxed_supernodes(fund, parent, counts, relaxation, merge_threshold)
    if nranks > 1:
        starts = keep_top_boundaries(fund, starts, parent, counts, nranks)
        starts = cut_top_separators(starts, parent, counts, nranks, top_piece_columns)
    steps.mark("supernodes")
    factor = _build_plan(positions, pattern, perm, iperm, parent, counts, len(fund) - 1, starts,
                         block_size, used, relaxation, steps, complete)
    done = time.perf_counter()
    for step in SYMBOLIC_STEPS:
        factor.stats[f"symbolic_{step}_seconds"] = steps.seconds.get(step, 0.0)
    factor.stats["ordering_source"] = ("computed" if saved is None else
                                       "file" if reuse else "computed and saved")
    factor.stats["ordering_file_seconds"] = file_seconds
    factor.stats["ordering_seconds"] = ordered - start
    factor.stats["ordering_split_levels"] = levels if used == "metis" and len(pattern[1]) else 0
    factor.stats["ordering_threads"] = threads.usable_cores()
    # METIS's balance for the nested dissection (0: its default): :func:`nested_dissection_balance`
    factor.stats["ordering_metis_ufactor"] = nested_dissection_balance(
        len(pattern[0]) - 1, len(pattern[1])).get("ufactor", 0) if used == "metis" else 0
    factor.stats["symbolic_seconds"] = done - ordered
    factor.stats["ordering_graph_seconds"] = graph_built - start
    # where the parallel nested dissection's time went, from its start (0 where it did not run)
    for name in ("top_split", "splits", "leaves"):
        factor.stats[f"ordering_{name}_seconds"] = float(split_timings.get(name, 0.0))
    for name in ("level_set_splits", "speculations", "speculations_kept"):
        factor.stats[f"ordering_{name}"] = int(split_timings.get(name, 0))
    return factor


#: The steps of the symbolic analysis after the ordering whose seconds :func:`analyze` records
#: (``symbolic_<step>_seconds``): the elimination tree and its postorder, the column counts, the
#: supernodes (fundamental, relaxed, and on several ranks the top ones kept apart and cut), the
#: supernodes' row structures, the updates' groups and relative indices, and the map of A's
#: entries into the panels.
SYMBOLIC_STEPS = ("etree", "counts", "supernodes", "rows", "updates", "assembly")
