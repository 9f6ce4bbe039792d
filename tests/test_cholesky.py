"""Supernodal Cholesky: symbolic counts against dense elimination (plan), the CPU factorization
and solve against NumPy/SciPy, the GPU engine against the CPU engine on the same plan (engines
agree), error lines, and the driver on CPU and GPU (marker gpu)."""
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from hisparse import generators
from hisparse.arrays import inverse_permutation
from hisparse.errors import HisparseError
from hisparse.formats import CSRMatrix
from hisparse.gpu import type_defines
from hisparse.io import write_matrix
from hisparse.ops.cholesky import (CholeskyLocal, etree, metis, ordering, schedule, structure,
                                   supernodes, symbolic)
from hisparse.ops.cholesky.cpu import (NotPositiveDefinite, assemble_values, factor_cpu,
                                       factor_to_sparse, logdet, solve_cpu)
from hisparse.ops.cholesky.gpu import KERNELS
from hisparse.ops.cholesky.schedule import CHUNK
from hisparse.ops.cholesky.problem import shifted_laplacian
from hisparse.ops.cholesky.refinement import refine
from hisparse.ops.cholesky.ordering import have_pymetis
from hisparse.ops.cholesky.symbolic import analyze, check_square_symmetric

from flow_emulation import FlowSolveOnHost, chunk_geometry
from helpers import bind_gpu, engine_for, random_spd, run_config, run_context, write_config

DATA = Path(os.environ.get("HISPARSE_SHARED_DATA", Path(__file__).resolve().parents[2]
                           / "shared" / "data" / "matrices" / "spd"))
ORDERINGS = ["natural", "rcm"] + (["metis"] if have_pymetis() else [])

# SIAM 100-digit challenge problem 7 (published): inv(A)(1,1) of Trefethen_20000, and the
# log-determinant measured with CHOLMOD (reference notes).
TREFETHEN_20000_INV11 = 0.72507834626840116746868771925116
TREFETHEN_20000_LOGDET = 2.2424561044e5


def _structural_factor_count(dense):
    """nnz of the Cholesky factor's pattern by symbolic dense elimination (no cancellation)."""
    pattern = dense != 0
    n = len(pattern)
    for k in range(n):
        rows = np.flatnonzero(pattern[k + 1:, k]) + k + 1
        pattern[np.ix_(rows, rows)] = True
    return pattern


def _backward_error(a, x, b):
    r = np.abs(b - a @ x)
    return float((r / (abs(a) @ np.abs(x) + np.abs(b))).max())


def _unpermute(sym, x_perm):
    """The solution in the original numbering (row perm[j] of x is row j of x_perm)."""
    x = np.empty_like(x_perm)
    x[sym.perm] = x_perm
    return x


def _solve_with(sym, values, b):
    """Factor A's ``values`` on the plan ``sym`` and solve for ``b`` (original numbering)."""
    lx = factor_cpu(sym, values)
    return lx, _unpermute(sym, solve_cpu(sym, lx, b[sym.perm]))


def _solve(a, b, **kw):
    sym = analyze(a, **kw)
    lx, x = _solve_with(sym, a.data, b)
    return sym, lx, x


# -- symbolic -------------------------------------------------------------------------------
@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("make", [lambda: generators.poisson([9, 11]).to_scipy(),
                                  lambda: random_spd(70, 0.05, 1),
                                  lambda: generators.trefethen(60).to_scipy()])
def test_symbolic_counts_match_dense_elimination(make, ordering):
    a = make()
    sym = analyze(a, ordering=ordering, relaxation="none")
    permuted = a[sym.perm][:, sym.perm].toarray()
    pattern = _structural_factor_count(permuted)
    lower = np.tril(pattern)
    assert sym.factor_nnz == int(lower.sum())
    np.testing.assert_array_equal(sym.counts, lower.sum(axis=0))
    # elimination tree: parent[j] = first off-diagonal row of column j of L
    for j in range(a.shape[0]):
        below = np.flatnonzero(lower[j + 1:, j])
        assert sym.parent[j] == (j + 1 + below[0] if len(below) else -1)
    # without relaxation the supernodal storage holds exactly the factor
    assert sym.supernodal_nnz == sym.factor_nnz
    # the permutation is a permutation, and the postorder keeps children before parents
    assert sorted(sym.perm.tolist()) == list(range(a.shape[0]))
    assert np.all((sym.parent > np.arange(a.shape[0])) | (sym.parent == -1))


@pytest.mark.parametrize("relaxation", ["threshold", "cholmod"])
def test_relaxed_supernodes_cover_the_factor(relaxation):
    a = generators.poisson([10, 9, 8]).to_scipy()
    exact = analyze(a, ordering="rcm", relaxation="none")
    relaxed = analyze(a, ordering="rcm", relaxation=relaxation, merge_threshold=16)
    assert relaxed.factor_nnz == exact.factor_nnz
    assert relaxed.nsuper < exact.nsuper
    assert relaxed.supernodal_nnz >= relaxed.factor_nnz
    # every exact column pattern is inside its relaxed supernode's rows
    lower = sp.tril(factor_to_sparse(exact, factor_cpu(exact, a.data))).tocsc()
    for s in range(relaxed.nsuper):
        rows = set(relaxed.supernode_rows(s).tolist())
        for j in range(relaxed.starts[s], relaxed.starts[s + 1]):
            col = lower.indices[lower.indptr[j]:lower.indptr[j + 1]]
            assert set(col.tolist()) <= rows
    if relaxation == "threshold":
        assert np.diff(relaxed.starts).max() >= 16 or relaxed.nsuper == 1


def test_block_split_of_large_supernodes():
    a = generators.trefethen(300).to_scipy()
    sym = analyze(a, ordering="rcm", relaxation="cholmod", block_size=32)
    for s in range(sym.nsuper):
        blocks = sym.column_blocks(s)
        assert blocks[0] == 0 and blocks[-1] == sym.starts[s + 1] - sym.starts[s]
        assert np.diff(blocks).max() <= 32


@pytest.mark.parametrize("case", ["cube", "grid", "components"])
def test_elimination_tree_and_counts_by_closed_runs_are_the_one_pass_ones(monkeypatch, case):
    """The closed runs of a nested dissection climbed at once, then the separators, give the
    tree and the column counts of one pass over the columns, for any ordering (dissections,
    where the runs are its parts; RCM, natural and random orders, where they are few or
    none)."""
    monkeypatch.setattr(etree, "PARALLEL_ETREE_MIN_COLUMNS", 0)
    monkeypatch.setattr(etree, "RUNS_LEAST_SHARE", 0.0)
    # the patches reach the module that reads them: the closed-run paths are taken (threads)
    assert etree._runs_pieces(1) or etree._parallel_pieces() <= 4
    rng = np.random.default_rng(11)
    if case == "cube":
        a = generators.poisson([14, 13, 12]).to_scipy()
    elif case == "grid":
        a = generators.poisson([60, 50]).to_scipy()
    else:  # a random pattern of several components
        blocks = [sp.random(m, m, density=min(1.0, 3.0 / m), random_state=m, format="csr")
                  for m in (300, 1, 500, 2)]
        b = sp.block_diag(blocks, format="csr")
        a = (b + b.T + sp.identity(b.shape[0])).tocsr()
    indptr, indices = ordering.offdiagonal_pattern(a)
    n = a.shape[0]
    orders = {"dissection": ordering.level_set_dissection(indptr, indices, 4),
              "rcm": ordering._rcm(indptr, indices), "natural": np.arange(n, dtype=np.int64),
              "random": rng.permutation(n).astype(np.int64)}
    runs_seen = 0
    for name, order in orders.items():
        iorder = inverse_permutation(order)
        expected = etree._etree(indptr, indices, order, iorder)
        lowest = etree._lowest_neighbours(indptr, indices, order, iorder, 7)
        starts, stops, rest = etree._closed_runs(lowest, 5)
        # every column once: in one run or in the rest; no run's column reaches before it
        covered = np.concatenate([np.arange(s, e) for s, e in zip(starts, stops)] + [rest])
        np.testing.assert_array_equal(np.sort(covered), np.arange(n))
        for s, e in zip(starts, stops):
            assert lowest[s:e].min() >= s
        runs_seen += len(starts) if name == "dissection" else 0
        for pieces in (1, 3, 16):
            cuts = etree._work_cuts(stops - starts, pieces)
            np.testing.assert_array_equal(
                etree._etree_by_runs(indptr, indices, order, iorder, starts, stops, cuts,
                                     rest), expected, err_msg=f"{case} {name} {pieces}")
        np.testing.assert_array_equal(etree.elimination_tree(indptr, indices, order, iorder),
                                      expected)
        # the column counts of the postordered matrix, by the same runs at once
        perm, iperm, parent = etree.postordered(order, expected)
        counts = etree._column_counts(indptr, indices, perm, iperm, parent)
        # against the factor's structure itself (a dense Cholesky factor of the small ones)
        if n <= 1200:
            permuted = a[perm][:, perm].toarray()
            pattern = np.abs(np.linalg.cholesky(permuted + n * np.eye(n))) > 0
            np.testing.assert_array_equal(counts, pattern.sum(axis=0))
        lowest = etree._lowest_neighbours(indptr, indices, perm, iperm, 5)
        starts, stops, rest = etree._closed_runs(lowest, 7)
        for pieces in (1, 3, 16):
            cuts = etree._work_cuts(stops - starts, pieces)
            np.testing.assert_array_equal(
                etree._counts_by_runs(indptr, indices, perm, iperm, parent, starts, stops,
                                      cuts, rest), counts, err_msg=f"{case} {name} {pieces}")
        np.testing.assert_array_equal(
            etree.column_counts(indptr, indices, perm, iperm, parent), counts)
    assert runs_seen > 4  # the dissection's parts were climbed apart


def test_analysis_by_closed_runs_loads_its_loops_beside_the_ordering(monkeypatch):
    """A large analysis loads the closed-run loops on a thread while it orders, and its tree,
    counts and factor are those of the one-pass loops."""
    a = generators.poisson([16, 15, 14]).to_scipy()
    monkeypatch.setattr(etree, "PARALLEL_ETREE_MIN_COLUMNS", 1 << 40)
    one_pass = analyze(a, "dissection", "cholmod", nranks=2)
    monkeypatch.setattr(etree, "PARALLEL_ETREE_MIN_COLUMNS", 0)
    monkeypatch.setattr(symbolic, "_LOADED_PARALLEL_LOOPS", [])
    loader = symbolic._start_loading_parallel_loops(a.shape[0])
    if etree._parallel_pieces() > 4:  # more than one thread here
        assert loader is not None
        loader.join()
        assert symbolic._LOADED_PARALLEL_LOOPS
        assert symbolic._start_loading_parallel_loops(a.shape[0]) is None  # loaded once
    by_runs = analyze(a, "dissection", "cholmod", nranks=2)
    for name in ("perm", "parent", "counts", "starts", "rows"):
        np.testing.assert_array_equal(getattr(by_runs, name), getattr(one_pass, name))


# -- the compiled analysis loops against their plain-Python form --------------------------------
# (The analysis was also checked field by field against the implementation it replaced, kept at
# commit 7742e5a; the structure tests above check it against dense factors independently.)
def test_uncompiled_loops_agree_with_the_compiled_ones():
    # Without Numba the same functions run as plain Python (.py_func): same results.
    a = generators.poisson([7, 6, 5]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    order = np.random.default_rng(3).permutation(a.shape[0]).astype(np.int64)
    iorder = np.argsort(order).astype(np.int64)
    for compiled in (etree._etree,):
        np.testing.assert_array_equal(compiled.py_func(indptr, indices, order, iorder),
                                      compiled(indptr, indices, order, iorder))
    lowest = etree._lowest_neighbours(indptr, indices, order, iorder, 3)
    np.testing.assert_array_equal(
        etree._lowest_neighbours.py_func(indptr, indices, order, iorder, 3), lowest)
    for got, want in zip(etree._closed_runs.py_func(lowest, 4),
                         etree._closed_runs(lowest, 4)):
        np.testing.assert_array_equal(got, want)
    parent = etree._etree(indptr, indices, order, iorder)
    post = etree._postorder(parent)
    np.testing.assert_array_equal(etree._postorder.py_func(parent), post)
    perm = order[post]
    iperm = np.argsort(perm).astype(np.int64)
    ipost = np.argsort(post)
    parent = np.where(parent[post] >= 0, ipost[np.maximum(parent[post], 0)], -1)
    counts = etree._column_counts(indptr, indices, perm, iperm, parent)
    np.testing.assert_array_equal(
        etree._column_counts.py_func(indptr, indices, perm, iperm, parent), counts)
    fund = supernodes.fundamental_supernodes(parent, counts)
    last = fund[1:] - 1
    sn_of = np.repeat(np.arange(len(fund) - 1), np.diff(fund))
    sparent = np.where(parent[last] >= 0, sn_of[np.maximum(parent[last], 0)], -1)
    args = (np.diff(fund), counts[fund[:-1]], sparent, 1, 64, np.array([4, 16, 48]),
            np.array([0.8, 0.1, 0.05]))
    np.testing.assert_array_equal(supernodes._amalgamate.py_func(*args),
                                  supernodes._amalgamate(*args))
    for got, expected in zip(structure._supernode_rows.py_func(indptr, indices, perm, iperm,
                                                               fund, sparent, counts, 1),
                             structure._supernode_rows(indptr, indices, perm, iperm, fund,
                                                       sparent, counts, 3)):
        np.testing.assert_array_equal(got, expected)
    # the map of A's entries and the relative indices: compiled == plain Python, and analyze's
    # plan (which runs them on all threads) == one plain-Python piece
    sym = analyze(a, ordering="natural", relaxation="none")
    sn_of = np.repeat(np.arange(sym.nsuper), np.diff(sym.starts))
    pattern = (a.indptr.astype(np.int64), a.indices.astype(np.int64),
               np.arange(a.nnz, dtype=np.int64))
    # the entries of the permuted lower triangle and their offsets: the whole plan's map
    rows, cols, source, cuts = structure.lower_entries(pattern, sym.iperm, np.int32)
    np.testing.assert_array_equal(source, sym.a_source)
    assert cuts.tolist() == [0, len(source)]
    # grouped by a part per column (three, by column modulo 3): each part's in the map's order
    part = np.arange(a.shape[0]) % 3
    grouped = structure.lower_entries(pattern, sym.iperm, np.int64, part, 3)
    for p in range(3):
        keep = part[cols] == p
        for got, expected in zip(grouped[:3], (rows, cols, source)):
            np.testing.assert_array_equal(got[grouped[3][p]:grouped[3][p + 1]], expected[keep])
    chunk_cuts = np.array([0, 7, a.shape[0]], dtype=np.int64)
    counts = np.zeros((2, 3), dtype=np.int64)
    structure._count_lower_by_part.py_func(pattern[0], pattern[1], sym.iperm, part, chunk_cuts,
                                           counts)
    place = np.ascontiguousarray(np.concatenate([[0], np.cumsum(counts.T.ravel())])[:-1]
                                 .reshape(3, 2).T)
    plain = [np.empty_like(rows), np.empty_like(cols), np.empty_like(source)]
    structure._place_lower_by_part.py_func(*pattern, sym.iperm, part, chunk_cuts, place, *plain)
    for got, expected in zip(plain, grouped[:3]):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(structure.entry_offsets(rows, cols, sn_of, sym.starts,
                                                          sym.nrows, sym.panel_offset, sym.rows,
                                                          sym.rows_offset), sym.a_dest)
    np.testing.assert_array_equal(structure.entry_offsets.py_func(
        rows, cols, sn_of, sym.starts, sym.nrows, sym.panel_offset, sym.rows, sym.rows_offset),
        sym.a_dest)
    below = np.concatenate([sym.supernode_rows(s)[sym.starts[s + 1] - sym.starts[s]:]
                            for s in range(sym.nsuper)])
    first = sym.below_offset[:-1]  # one group per supernode's first below row: every target
    groups = np.flatnonzero(np.diff(sym.below_offset) > 0)
    group_begin = first[groups]
    target = sn_of[below[group_begin]]
    lengths = sym.below_offset[groups + 1] - group_begin
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    order, bounds = structure._order_by_key.py_func(target, sym.nsuper)
    np.testing.assert_array_equal(order, np.argsort(target, kind="stable"))
    np.testing.assert_array_equal(bounds, np.searchsorted(np.sort(target),
                                                          np.arange(sym.nsuper + 1)))
    rel = structure._relative_indices.py_func(
        sym.rows, sym.rows_offset, below, group_begin, target, lengths, start,
        int(lengths.sum()), sym.n, order, np.array([0, len(order) // 2, len(order)]))
    for g, t in enumerate(target):  # each entry is the row's position in the target's list
        np.testing.assert_array_equal(sym.supernode_rows(t)[rel[start[g]:start[g] + lengths[g]]],
                                      below[group_begin[g]:group_begin[g] + lengths[g]])


def test_parallel_supernode_rows_do_not_depend_on_the_thread_count():
    # a level needs 64 supernodes per piece to run in parallel: a 2-D grid has enough leaves
    a = generators.poisson([60, 50]).to_scipy()
    sym = analyze(a, ordering="rcm" if not have_pymetis() else "metis", relaxation="none")
    indptr, indices = ordering.offdiagonal_pattern(a)
    one = structure._supernode_rows(indptr, indices, sym.perm, sym.iperm, sym.starts,
                                    sym.sparent, sym.counts, 1)
    many = structure._supernode_rows(indptr, indices, sym.perm, sym.iperm, sym.starts,
                                     sym.sparent, sym.counts, 7)
    assert np.bincount(sym.level).max() >= 2 * 64 or not have_pymetis()
    for got, expected in zip(many, one):
        np.testing.assert_array_equal(got, expected)


def test_induced_subgraph_and_edge_cut_separator():
    """The pieces of the parallel nested dissection that need no METIS: the induced subgraph
    (against SciPy's submatrix) and the separator from a bisection (a vertex cover of the cut:
    no edge joins the two parts once it is removed; minimum: a 2-D grid cut down the middle
    needs one column)."""
    a = generators.poisson([20, 17]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    keep = np.flatnonzero(np.random.default_rng(3).random(a.shape[0]) < 0.6)
    sub_ptr, sub_idx = ordering.induced_subgraph(indptr, indices, keep)
    expected = sp.csr_matrix(a)[keep][:, keep].tocsr()
    expected.setdiag(0)
    expected.eliminate_zeros()
    expected.sort_indices()
    np.testing.assert_array_equal(sub_ptr, expected.indptr)
    np.testing.assert_array_equal(sub_idx, expected.indices)
    x = np.arange(a.shape[0]) // 17  # grid row of every vertex: cut between rows 9 and 10
    side = (x >= 10).astype(np.int8)
    separator = ordering.edge_cut_separator(indptr, indices, side)
    assert len(separator) == 17
    side[separator] = 2
    row = np.repeat(np.arange(a.shape[0]), np.diff(indptr))
    assert not np.any((side[row] == 0) & (side[indices] == 1))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a Linux process allowed at least two CPUs")
def test_analysis_affinity_widens_a_binding_and_restores_it():
    """A rank bound to one CPU (as mpirun binds one or two ranks) analyses on every CPU it is
    allowed, its ordering workers too, and is bound again afterwards."""
    allowed = os.sched_getaffinity(0)
    one = {min(allowed)}
    lines = []
    try:
        os.sched_setaffinity(0, one)
        with ordering.analysis_affinity(lines.append) as cpus:
            assert os.sched_getaffinity(0) == allowed and cpus == len(allowed)
            pool = ordering.ordering_pool(2, levels=1)
            try:
                assert pool.submit(os.sched_getaffinity, 0).result(timeout=60) == allowed
            finally:
                pool.shutdown()
        assert os.sched_getaffinity(0) == one
        assert len(lines) == 1 and f"bound to 1 of the node's {len(allowed)} CPUs" in lines[0]
        os.sched_setaffinity(0, allowed)
        with ordering.analysis_affinity(lines.append) as cpus:  # not bound: nothing to say
            assert cpus == len(allowed) and os.sched_getaffinity(0) == allowed
        assert len(lines) == 1
    finally:
        os.sched_setaffinity(0, allowed)


def test_ordering_split_rule():
    # large matrices on at least 4 cores split 2 levels, the largest 3 where there are 8 cores;
    # small ones or 2 cores: METIS alone; a number given is taken as it is
    assert ordering.split_levels(ordering.PARALLEL_MIN_NNZ, workers=16) == 2
    assert ordering.split_levels(ordering.PARALLEL_MIN_NNZ - 1, workers=16) == 0
    assert ordering.split_levels(ordering.PARALLEL_DEEP_NNZ, workers=16) == 3
    assert ordering.split_levels(ordering.PARALLEL_DEEP_NNZ, workers=4) == 2
    assert ordering.split_levels(ordering.PARALLEL_DEEPER_NNZ, workers=16) == 4
    assert ordering.split_levels(ordering.PARALLEL_DEEPER_NNZ, workers=15) == 3
    # every split tries all seeds while they fit in the workers, at least one below
    assert ordering._seeds_at(0, 16) == ordering.SEPARATOR_SEEDS
    assert ordering._seeds_at(3, 16) == ordering.SEPARATOR_SEEDS[:2]
    assert ordering._seeds_at(4, 4) == ordering.SEPARATOR_SEEDS[:1]
    assert ordering.split_levels(10 ** 8, workers=2) == 0
    assert ordering.split_levels(10, workers=2, requested=3) == 3
    assert ordering.split_levels(10 ** 8, workers=16, requested=0) == 0


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
@pytest.mark.parametrize("case", ["cube", "grid", "trefethen", "disconnected"])
def test_metis_vertex_separator_separates(case):
    """METIS's vertex separator (internal entry points, checked on every call) splits the graph:
    no edge joins the two sides, and on a 3-D grid it is no larger than a plane of it. The
    check itself rejects a side array with a crossing edge."""
    if not metis.available():
        pytest.skip("METIS cannot be called directly here")
    if case == "cube":
        matrix = generators.poisson([14, 13, 12]).to_scipy()
    elif case == "grid":
        matrix = generators.poisson([40, 37]).to_scipy()
    elif case == "trefethen":
        matrix = generators.trefethen(700).to_scipy()
    else:  # two grids side by side, no edge between them
        matrix = sp.block_diag([generators.poisson([15, 16]).to_scipy()] * 2, format="csr")
    indptr, indices = ordering.offdiagonal_pattern(matrix)
    side = metis.vertex_separator(indptr, indices, {"niter": 1, "seed": 3})
    if side is None:
        pytest.skip("this METIS build does not export its separator routines")
    assert side.dtype == np.int8 and len(side) == matrix.shape[0]
    sizes = np.bincount(side, minlength=3)
    assert sizes[0] > 0 and sizes[1] > 0
    row = np.repeat(np.arange(matrix.shape[0]), np.diff(indptr))
    assert not np.any((side[row] == 0) & (side[indices] == 1))
    assert metis.is_separator(indptr, indices, side)
    if case == "cube":
        assert sizes[2] <= 14 * 13
    crossing = side.copy()  # a vertex of side 0 with a neighbour on side 0 moved to side 1
    inner = np.flatnonzero((side[row] == 0) & (side[indices] == 0))[0]
    crossing[row[inner]] = 1
    assert not metis.is_separator(indptr, indices, crossing)
    # the same seed gives the same separator (METIS's generator is seeded on every call)
    np.testing.assert_array_equal(side, metis.vertex_separator(indptr, indices,
                                                               {"niter": 1, "seed": 3}))


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
def test_parallel_nested_dissection_is_a_good_permutation():
    a = generators.poisson([24, 23, 22]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    timings = {}
    order = ordering.parallel_nested_dissection(indptr, indices, 2, workers=4, timings=timings)
    np.testing.assert_array_equal(np.sort(order), np.arange(a.shape[0]))
    # the whole graph's split comes first, then the level below it, then the parts' orderings
    # (the parts under a level set may be split, and ordered, before the whole graph's split is
    # decided: such a part is final when the split above it is, at the same instant)
    assert 0 < timings["top_split"] <= timings["splits"] <= timings["leaves"]

    def flops(perm):
        sym = analyze(a[perm][:, perm], "natural", "none")
        return sym.flops

    # the fill stays near plain METIS's (METIS's own seeds move it by +-10 % either way)
    assert flops(order) <= 1.4 * flops(ordering._metis_nested_dissection(indptr, indices))


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
def test_ordering_pool_started_by_a_thread_orders_as_one_started_by_its_submits(monkeypatch):
    """Workers started at once by the pool's thread give the ordering that workers started one
    per submit give; a pool shut down while its thread may still be starting them ends
    quietly."""
    a = generators.poisson([20, 19, 18]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    orders = []
    for prespawn in (True, False):
        monkeypatch.setattr(ordering, "PRESPAWN_WORKERS", prespawn)
        pool = ordering.ordering_pool(4, levels=2)
        try:
            orders.append(ordering.parallel_nested_dissection(indptr, indices, 2, workers=4,
                                                              pool=pool))
        finally:
            pool.shutdown()
    np.testing.assert_array_equal(np.sort(orders[0]), np.arange(a.shape[0]))
    np.testing.assert_array_equal(orders[0], orders[1])
    monkeypatch.setattr(ordering, "PRESPAWN_WORKERS", True)
    ordering.ordering_pool(4, levels=2).shutdown(wait=True, cancel_futures=True)


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
def test_split_ordering_splits_a_part_larger_than_the_average_again(monkeypatch):
    """Below the split levels a part larger than the average one is split again, so that no
    part METIS orders whole is larger than the average (separators of sparse graphs may leave
    sides 1.4:1: a 3-D Laplacian's four parts); without that rule the last level's parts are
    ordered as they come."""
    from concurrent.futures import ThreadPoolExecutor
    a = generators.poisson([40, 38, 36]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    n, levels = a.shape[0], 2
    leaves = []
    ordered = ordering._leaf_of
    # METIS's separators (its sides up to 1.4:1); the level sets a split also tries are cut
    # near the median level and leave no part larger than the average to split again
    monkeypatch.setattr(ordering, "LEVEL_SET_TRIES", False)
    monkeypatch.setattr(ordering, "_leaf_of",
                        lambda graph, niter: leaves.append(graph.vertices) or
                        ordered(graph, niter))
    for balance in (float("inf"), ordering.LEAF_BALANCE):
        monkeypatch.setattr(ordering, "LEAF_BALANCE", balance)
        leaves.clear()
        with ThreadPoolExecutor(1) as pool:  # one METIS call at a time, in this process
            order = ordering._dissect(pool, 4, indptr, indices, levels, None, {})
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
        if balance == float("inf"):
            assert len(leaves) == 1 << levels and max(leaves) > n / (1 << levels)
        else:
            assert len(leaves) > 1 << levels and max(leaves) <= balance * n / (1 << levels)


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
@pytest.mark.parametrize("vertex", [True, False])
def test_split_separator_and_its_edge_cut_fallback(monkeypatch, vertex):
    """One try of a split: METIS's vertex separator, or where that cannot be called the minimum
    vertex cover of METIS's edge bisection; either way a separator (no edge joins the sides)
    of about a plane of the grid, reported in the side array too."""
    if not vertex:
        monkeypatch.setattr(metis, "vertex_separator", lambda *args: None)
    a = generators.poisson([16, 15, 14]).to_scipy()
    indptr, indices = ordering.offdiagonal_pattern(a)
    score, separator, side = ordering._separator(indptr, indices, 2)
    assert metis.is_separator(indptr, indices, side)
    np.testing.assert_array_equal(np.sort(separator), np.flatnonzero(side == 2))
    assert 0 < len(separator) <= 2 * 16 * 15 and len(separator) <= score


def test_symmetry_check_accepts_round_off_and_one_sided_tiny_entries():
    a = generators.poisson([5, 6]).to_scipy().tolil()
    assert check_square_symmetric(a.tocsr()) is True  # the pattern is symmetric too
    a[0, 29] = 1e-17  # only in one triangle, below 1e-14 max|A|
    a[4, 5] = a[4, 5] * (1 + 1e-15)
    # symmetric values, not a symmetric pattern: the analysis must symmetrise it itself
    assert check_square_symmetric(a.tocsr()) is False
    one_sided = a.tocsr()
    assert analyze(one_sided).factor_nnz == analyze(one_sided + one_sided.T).factor_nnz
    a[5, 4] = 3.0
    with pytest.raises(HisparseError, match=r"not symmetric: A\[(4, 5|5, 4)\]"):
        check_square_symmetric(a.tocsr())


def test_shifted_laplacian_is_the_graph_laplacian_plus_shift():
    rng = np.random.default_rng(0)
    graph = sp.random(40, 40, density=0.08, random_state=rng, format="csr")
    lap = shifted_laplacian(graph, 0.5)
    pattern = ((graph + graph.T) != 0).astype(float)
    pattern.setdiag(0)
    expected = sp.csgraph.laplacian(pattern.toarray()) + 0.5 * np.eye(40)
    np.testing.assert_allclose(lap.toarray(), expected)
    assert np.linalg.eigvalsh(lap.toarray()).min() > 0.49


# -- numeric (CPU) --------------------------------------------------------------------------
@pytest.mark.parametrize("relaxation", ["none", "threshold", "cholmod"])
@pytest.mark.parametrize("make", [lambda: generators.poisson([23, 19]).to_scipy(),
                                  lambda: generators.poisson([9, 8, 7]).to_scipy(),
                                  lambda: generators.poisson([6, 7, 5], stencil=27).to_scipy()])
def test_cpu_factor_and_solve(make, relaxation):
    a = make()
    rng = np.random.default_rng(4)
    b = a @ rng.uniform(-1, 1, (a.shape[0], 3))
    sym, lx, x = _solve(a, b, relaxation=relaxation, merge_threshold=8)
    lower = factor_to_sparse(sym, lx)
    permuted = a[sym.perm][:, sym.perm]
    assert abs(lower @ lower.T - permuted).max() <= 1e-12 * abs(a).max()
    assert _backward_error(a, x, b) <= 1e-12
    sign, expected = np.linalg.slogdet(a.toarray())
    assert sign == 1 and logdet(sym, lx) == pytest.approx(expected, rel=1e-12)


def test_trefethen_2000_logdet_and_inverse_entry():
    a = generators.trefethen(2000).to_scipy()
    dense = a.toarray()
    e0 = np.zeros((2000, 1))
    e0[0] = 1.0
    sym, lx, x = _solve(a, e0)
    assert x[0, 0] == pytest.approx(np.linalg.inv(dense)[0, 0], rel=1e-13)
    assert logdet(sym, lx) == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-13)
    b = a @ np.random.default_rng(0).uniform(-1, 1, (2000, 2))
    assert _backward_error(a, _solve(a, b)[2], b) <= 1e-12
    # log det of the (1,1) minor minus log det A = log inv(A)(1,1)
    minor = a[1:, 1:].tocsr()
    sym_b = analyze(minor)
    assert np.exp(logdet(sym_b, factor_cpu(sym_b, minor.data)) - logdet(sym, lx)) == \
        pytest.approx(x[0, 0], rel=1e-10)


def test_refactorization_reuses_the_analysis():
    a = generators.poisson([15, 16]).to_scipy()
    sym = analyze(a)
    rng = np.random.default_rng(2)
    # same pattern, new values: a + diag shift and scaled off-diagonals
    new = a.copy()
    new.data = np.where(new.indices == np.repeat(np.arange(a.shape[0]), np.diff(a.indptr)),
                        new.data + rng.uniform(0.5, 2.0, new.nnz), new.data * 0.7)
    b = rng.uniform(-1, 1, (a.shape[0], 1))
    _lx, x = _solve_with(sym, new.data, b)
    np.testing.assert_allclose(x, spl.spsolve(new.tocsc(), b).reshape(-1, 1), rtol=1e-10,
                               atol=1e-12)


def test_unsorted_csr_input_maps_values_correctly():
    a = generators.poisson([7, 8]).to_scipy()
    rng = np.random.default_rng(0)
    shuffled = a.copy()
    for i in range(a.shape[0]):  # reverse every row's entries
        lo, hi = a.indptr[i], a.indptr[i + 1]
        shuffled.indices[lo:hi] = a.indices[lo:hi][::-1]
        shuffled.data[lo:hi] = a.data[lo:hi][::-1]
    shuffled.has_sorted_indices = False
    b = rng.uniform(-1, 1, (a.shape[0], 1))
    sym = analyze(shuffled)
    _lx, x = _solve_with(sym, shuffled.data, b)
    assert _backward_error(a, x, b) <= 1e-12


# -- engines agree: the engine picked for a backend against the CPU engine on the same plan -----
ENGINE_BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
ENGINE_CASES = {
    "defaults": {},  # batched small supernodes + block tasks for the rest
    "all-block-tasks": {"small_work": 1.0, "block_size": 48, "nrhs": 3},
    "all-batched": {"small_work": 1e12, "nrhs": 2},
}


@contextmanager
def _engine(tmp_path, backend, local, params):
    """The engine Cholesky picks for ``backend`` on ``local``, in this process as a one-rank run
    without MPI (the GPU bound and the kernels loaded as setup does); freed afterwards."""
    device = bind_gpu(backend)
    ctx = run_context(tmp_path, "cholesky", params, backend, device,
                      input={"generate": {"kind": "poisson", "dims": [4, 4]}})
    try:
        if backend == "gpu":
            from hisparse.ops.cholesky.gpu import load_kernels
            local.kernels = load_kernels(ctx)
        engine = engine_for(ctx, local)
        try:
            yield engine
        finally:
            engine.free()
    finally:
        if device is not None:
            device.release()


@pytest.mark.parametrize("case", list(ENGINE_CASES))
@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_engines_agree_on_the_same_plan(tmp_path, backend, case):
    params = ENGINE_CASES[case]
    a = generators.poisson([12, 11, 10]).to_scipy()
    b = a @ np.random.default_rng(5).uniform(-1, 1, (a.shape[0], params.get("nrhs", 1)))
    sym = analyze(a, relaxation="cholmod", block_size=params.get("block_size", 1024))
    with _engine(tmp_path, backend, CholeskyLocal(sym), params) as engine:
        assert engine.BACKEND == backend
        engine.load(a.data, b)
        det = engine.factor()
        engine.solve()
        x = _unpermute(sym, np.array(engine.solution()))
        lower = factor_to_sparse(sym, engine.factor_values())
        peak = engine.memory_stats()["peak_device_bytes"]
    # the factor: the CPU engine's on the same plan, and L L^T = P A P^T
    reference = factor_to_sparse(sym, factor_cpu(sym, a.data))
    assert abs(lower - reference).max() <= 1e-12 * abs(reference).max()
    assert abs(lower @ lower.T - a[sym.perm][:, sym.perm]).max() <= 1e-12 * abs(a).max()
    np.testing.assert_allclose(x, spl.spsolve(a.tocsc(), b).reshape(x.shape), rtol=1e-10,
                               atol=1e-12)
    assert det == pytest.approx(np.linalg.slogdet(a.toarray())[1], rel=1e-12)
    if backend == "gpu":  # at least the factor's panels were on the device, through the arena
        assert peak >= int(sym.panel_offset[-1]) * 8
    else:
        assert peak == 0


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
@pytest.mark.parametrize("direct", [True, False])
def test_metis_balance_follows_the_mean_degree(monkeypatch, direct):
    """Sparse mesh-like graphs are dissected with the looser balance (fewer flops on grids),
    small denser ones with METIS's default and large denser ones with the tighter balance; the
    results file says which. The option reaches METIS whether it is called directly or through
    pymetis's API."""
    import pymetis
    seen = []
    if direct:
        if not metis.available():
            pytest.skip("METIS cannot be called directly here")
        real = metis.node_nd
        monkeypatch.setattr(metis, "node_nd", lambda indptr, indices, options: (
            seen.append(options.get("ufactor")), real(indptr, indices, options))[1])
    else:
        real = pymetis.nested_dissection

        def spy(*args, **kwargs):
            seen.append(kwargs["options"].ufactor)
            return real(*args, **kwargs)

        monkeypatch.setattr(metis, "_library", False)  # as where the symbols are not found
        monkeypatch.setattr(pymetis, "nested_dissection", spy)
    grid = generators.poisson([30, 30]).to_scipy()  # mean degree 3.9
    dense = generators.trefethen(300).to_scipy()  # mean degree 16
    large_dense = generators.trefethen(ordering.DENSE_TIGHT_MIN_VERTICES).to_scipy()  # 24
    assert analyze(grid, "metis").stats["ordering_metis_ufactor"] == ordering.SPARSE_UFACTOR
    assert analyze(dense, "metis").stats["ordering_metis_ufactor"] == 0
    large = analyze(large_dense, "metis", relaxation="cholmod", split=0)
    assert large.stats["ordering_metis_ufactor"] == ordering.DENSE_UFACTOR
    assert seen[0] == ordering.SPARSE_UFACTOR and seen[1] not in (ordering.SPARSE_UFACTOR,
                                                                  ordering.DENSE_UFACTOR)
    assert seen[2] == ordering.DENSE_UFACTOR
    # the rule at its edges: mean degree 12 is sparse; 13 is dense, tight from the size on
    n = ordering.DENSE_TIGHT_MIN_VERTICES
    assert ordering.nested_dissection_balance(n, 12 * n) == {"ufactor": ordering.SPARSE_UFACTOR}
    assert ordering.nested_dissection_balance(n - 1, 13 * (n - 1)) == {}
    assert ordering.nested_dissection_balance(n, 13 * n) == {"ufactor": ordering.DENSE_UFACTOR}


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
@pytest.mark.parametrize("case", ["grid", "trefethen", "random"])
def test_direct_metis_call_gives_pymetis_permutation(case):
    """METIS called directly (metis.node_nd, metis.bisection) and through pymetis's API, with
    the same options, return the same permutation and partition: the direct call changes the
    cost, not the ordering."""
    import pymetis
    if not metis.available():
        pytest.skip("METIS cannot be called directly here")
    if case == "grid":
        matrix, options = generators.poisson([23, 31]).to_scipy(), {"niter": 1, "ufactor": 400}
    elif case == "trefethen":
        matrix, options = generators.trefethen(500).to_scipy(), {"niter": 1}
    else:
        rng = np.random.default_rng(5)
        a = sp.random(400, 400, density=0.02, random_state=rng, format="csr")
        matrix, options = (a + a.T).tocsr(), {"niter": 10, "seed": 3}
    indptr, indices = ordering.offdiagonal_pattern(matrix)
    direct = metis.node_nd(indptr, indices, options)
    through, _ = pymetis.nested_dissection(
        adjacency=pymetis.CSRAdjacency(indptr.astype(np.int32), indices.astype(np.int32)),
        options=pymetis.Options(**options))
    np.testing.assert_array_equal(direct, np.asarray(through))
    np.testing.assert_array_equal(np.sort(direct), np.arange(matrix.shape[0]))
    # The bisection the split ordering tries (seeded), likewise.
    bisection_options = {"niter": options["niter"], "seed": 2}
    side = metis.bisection(indptr, indices, bisection_options)
    parts = pymetis.part_graph(
        2, adjacency=pymetis.CSRAdjacency(indptr.astype(np.int32), indices.astype(np.int32)),
        options=pymetis.Options(**bisection_options))
    np.testing.assert_array_equal(side, np.asarray(parts[1]))
    assert set(np.unique(side)) == {0, 1}


@pytest.mark.gpu
def test_gpu_dataflow_solve_on_the_split_ordered_grid(tmp_path):
    """The 700^2 grid ordered with split top levels has whole-block backward units of fewer
    below rows than a block's threads; the dataflow backward pass multiplied the zeros of L
    past them by shared memory it had not written, and on the H100 that memory held NaN
    (every run: the solution was NaN, the level-by-level solve and the factor were right)."""
    if not ordering.have_pymetis():
        pytest.skip("the split ordering needs pymetis")
    a = generators.poisson([700, 700]).to_scipy()
    b = a @ np.random.default_rng(8).uniform(-1, 1, (a.shape[0], 1))
    sym = analyze(a, relaxation="cholmod", split=2)
    assert sym.stats["ordering_split_levels"] == 2
    with _engine(tmp_path, "gpu", CholeskyLocal(sym), {"solve_schedule": "flow"}) as engine:
        engine.load(a.data, b)
        engine.factor()
        engine.solve()
        x = _unpermute(sym, np.array(engine.solution()))
    assert _backward_error(a, x, b) <= 1e-13


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_refinement_steps_and_the_auto_rule(tmp_path, backend):
    # Trefethen_2000: dense fill, so the unrefined backward error is well above eps
    a = generators.trefethen(2000).to_scipy()
    b = a @ np.random.default_rng(3).uniform(-1, 1, (a.shape[0], 2))
    sym = analyze(a, relaxation="cholmod")

    def solution():
        return _unpermute(sym, np.array(engine.solution()))

    with _engine(tmp_path, backend, CholeskyLocal(sym, matrix=a), {}) as engine:
        engine.load(a.data, b)
        engine.factor()
        engine.solve()
        unrefined = solution()
        assert refine(engine, 0, 1.0)[0] == 0
        # auto, tolerance above the error: measured (the engine's own fp64 residual, in its
        # summation order), no step, the solution unchanged
        steps, measured = refine(engine, "auto", 1.0)
        host = _backward_error(a, unrefined, b)
        assert steps == 0 and host / 2 <= measured <= 2 * host
        np.testing.assert_array_equal(solution(), unrefined)
        # auto, tolerance below it: one step; then two fixed steps
        assert refine(engine, "auto", measured / 2) == (1, measured)
        once = solution()
        assert refine(engine, 2, 1.0)[0] == 2
        twice = solution()
    exact = spl.spsolve(a.tocsc(), b)
    for x in (once, twice):  # H100: 1.06e-15 unrefined, 4.96e-16 after one step
        assert _backward_error(a, x, b) <= min(host, 1e-15)
        np.testing.assert_allclose(x, exact, rtol=1e-10, atol=1e-13)


# -- the GPU engine's chunk schedule, emulated block by block on the host ------------------------
def _find_task(prefix, count, b):
    lo, hi = 0, count - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if prefix[mid] <= b:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _level_blocks(lists, lev):
    """(chunk, block index within the chunk, blocks of the chunk) of every block of a launch,
    found the way the kernels find them (binary search over the level's prefix)."""
    count = lists.count(lev)
    if not count:
        return []
    prefix = lists.prefix[lists.prefix_at[lev]:lists.prefix_at[lev] + count + 1]
    assert prefix[0] == 0 and prefix[-1] == lists.grid[lev]
    out = []
    for b in range(int(lists.grid[lev])):
        t = _find_task(prefix, count, b)
        out.append((int(lists.chunks[lists.begin[lev] + t]), int(b - prefix[t]),
                    int(prefix[t + 1] - prefix[t])))
    return out


def _emulate_gpu_factor(sym, values, small_work):
    """The factorization as the GPU engine schedules it: chunk levels, factor_panels blocks,
    update_tiles tiles (with the kernels' target addressing) and large supernodes."""
    ncols = np.diff(sym.starts)
    chained = ncols * sym.nrows.astype(float) ** 2 <= small_work
    plan = schedule.chunk_plan(sym, chained)
    ids = np.arange(len(plan.sup))
    panels = schedule.level_lists(ids, plan.level, schedule.panel_blocks(plan.below), plan.n_levels)
    updating = plan.below > 0
    tiles = schedule.level_lists(ids[updating], plan.level[updating],
                            schedule.tile_blocks(plan.below[updating]), plan.n_levels)
    lx = assemble_values(sym, values)
    for lev in range(plan.n_levels):
        # a launch's blocks run concurrently: they read what the previous launches left
        before = lx.copy()
        factored = {}
        for v, part, nblocks in _level_blocks(panels, lev):
            s, c0, w, ld, diag, m = chunk_geometry(sym, plan, v)
            if v not in factored:  # every block reads the diagonal block before any write-back
                block = np.tril(before[diag + np.arange(w)[:, None] + np.arange(w)[None, :] * ld])
                factored[v] = np.linalg.cholesky(block + np.tril(block, -1).T)
            rows = np.arange(part * schedule.CHUNK_THREADS, min(m, (part + 1) * schedule.CHUNK_THREADS))
            at = diag + w + rows[:, None] + np.arange(w)[None, :] * ld
            lx[at] = np.linalg.solve(factored[v], before[at].T).T
        for v, d in factored.items():
            s, c0, w, ld, diag, m = chunk_geometry(sym, plan, v)
            for j in range(w):
                lx[diag + j * ld + np.arange(j, w)] = d[j:, j]
        before = lx.copy()
        for v, local, _ in _level_blocks(tiles, lev):
            s, c0, w, ld, diag, m = chunk_geometry(sym, plan, v)
            ti = int((np.sqrt(8.0 * local + 1.0) - 1.0) * 0.5)
            while (ti + 1) * (ti + 2) // 2 <= local:
                ti += 1
            while ti * (ti + 1) // 2 > local:
                ti -= 1
            tj = local - ti * (ti + 1) // 2
            below = before[diag + w + np.arange(m)[:, None] + np.arange(w)[None, :] * ld]
            nc, b0, local0 = int(ncols[s]), int(sym.below_offset[s]), c0 + w
            i, j = np.meshgrid(np.arange(ti * schedule.TILE, min(m, (ti + 1) * schedule.TILE)),
                               np.arange(tj * schedule.TILE, min(m, (tj + 1) * schedule.TILE)),
                               indexing="ij")
            keep = i >= j
            i, j = i[keep], j[keep]
            il, jl = local0 + i, local0 + j
            own = jl < nc  # the supernode's later columns, else an ancestor's
            target = int(sym.panel_offset[s]) + jl * ld + il
            r = b0 + jl[~own] - nc
            target[~own] = sym.col_base[r] + sym.rel[sym.col_rel[r] + il[~own] - nc]
            np.subtract.at(lx, target, np.einsum("ik,ik->i", below[i], below[j]))
        for s in plan.large[plan.large_level == lev]:
            _factor_supernode(sym, lx, int(s))
    return lx


def _factor_supernode(sym, lx, s):
    """One supernode of factor_cpu's loop (what the large path's block tasks compute)."""
    nr, nc = int(sym.nrows[s]), int(sym.starts[s + 1] - sym.starts[s])
    off = int(sym.panel_offset[s])
    panel = lx[off:off + nr * nc].reshape(nc, nr).T
    panel[:nc] = np.linalg.cholesky(np.tril(panel[:nc]) + np.tril(panel[:nc], -1).T)
    m = nr - nc
    if m:
        panel[nc:] = scipy.linalg.solve_triangular(panel[:nc], panel[nc:].T, lower=True).T
        update = panel[nc:] @ panel[nc:].T
        b0 = int(sym.below_offset[s])
        for j in range(m):
            i = np.arange(j, m)
            lx[sym.col_base[b0 + j] + sym.rel[sym.col_rel[b0 + j] + i]] -= update[i, j]


def _emulate_gpu_solve(sym, lx, rhs):
    """The solve as the GPU engine schedules it: solve_forward over the chunk levels, then
    solve_backward top-down with its partial sums; rhs (n, k) permuted."""
    plan = schedule.chunk_plan(sym, np.ones(sym.nsuper, dtype=bool))
    lists = schedule.level_lists(np.arange(len(plan.sup)), plan.level, schedule.panel_blocks(plan.below),
                            plan.n_levels)
    work = np.array(rhs, dtype=float)
    y = np.full_like(work, np.nan)

    def pieces(v):
        s, c0, w, ld, diag, m = chunk_geometry(sym, plan, v)
        d = np.tril(lx[diag + np.arange(w)[:, None] + np.arange(w)[None, :] * ld])
        first = int(sym.starts[s]) + c0
        rows = sym.rows[sym.rows_offset[s] + c0 + w:sym.rows_offset[s + 1]]
        below = lx[diag + w + np.arange(m)[:, None] + np.arange(w)[None, :] * ld]
        return first, w, d, rows, below

    for lev in range(plan.n_levels):
        before = work.copy()  # what the earlier launches left
        for v, part, _ in _level_blocks(lists, lev):
            first, w, d, rows, below = pieces(v)
            solved = np.linalg.solve(d, before[first:first + w])
            if part == 0:
                y[first:first + w] = solved
            mine = slice(part * schedule.CHUNK_THREADS, (part + 1) * schedule.CHUNK_THREADS)
            work[rows[mine]] -= below[mine] @ solved
    for lev in range(plan.n_levels - 1, -1, -1):
        done, before = {}, y.copy()
        for v, part, nblocks in _level_blocks(lists, lev):
            first, w, d, rows, below = pieces(v)
            mine = slice(part * schedule.CHUNK_THREADS, (part + 1) * schedule.CHUNK_THREADS)
            y[first:first + w] -= below[mine].T @ before[rows[mine]]
            done[v] = done.get(v, 0) + 1
            if done[v] == nblocks:  # the last block of the chunk solves in place
                y[first:first + w] = np.linalg.solve(d.T, y[first:first + w])
    return y


@pytest.mark.parametrize("dims", [[30, 29], [12, 11, 10]])
def test_flow_target_lists_are_the_chunks_of_each_units_rows(dims):
    """The compiled target lists of the dataflow solve hold, for every unit, the chunks of its
    below rows in ascending order, each once -- what a gather of every row's chunk and a
    compare of neighbours gives -- and ``expected`` counts every chunk's senders."""
    sym = analyze(generators.poisson(dims).to_scipy(), "metis" if have_pymetis() else "rcm")
    plan = schedule.chunk_plan(sym, np.ones(sym.nsuper, dtype=bool))
    flow = schedule.flow_tasks(sym, plan)
    chunk_of_column = np.repeat(np.arange(len(plan.sup)), plan.width)
    for unit, v in enumerate(flow.unit_chunk):
        part = max(int(flow.unit_part[unit]), 0)
        s, c0, w = int(plan.sup[v]), int(plan.c0[v]), int(plan.width[v])
        rows = sym.rows[sym.rows_offset[s] + c0 + w:sym.rows_offset[s + 1]]
        mine = rows[part * schedule.CHUNK_THREADS:(part + 1) * schedule.CHUNK_THREADS]
        owners = chunk_of_column[mine]
        runs = owners[np.concatenate([[True], owners[1:] != owners[:-1]])] if len(owners) \
            else owners
        np.testing.assert_array_equal(
            flow.target_chunk[flow.target_ptr[unit]:flow.target_ptr[unit + 1]], runs)
    np.testing.assert_array_equal(flow.expected,
                                  np.bincount(flow.target_chunk, minlength=len(plan.sup)))


def _emulate_flow_solve(sym, lx, rhs):
    """The dataflow solves over every chunk (:class:`flow_emulation.FlowSolveOnHost`); rhs
    (n, k) permuted."""
    plan = schedule.chunk_plan(sym, np.ones(sym.nsuper, dtype=bool))
    host = FlowSolveOnHost(sym, plan, schedule.flow_tasks(sym, plan), lx)
    work = np.array(rhs, dtype=float)
    y = np.full_like(work, np.nan)
    host.forward(work, y)
    host.backward(y, np.zeros(len(plan.sup), dtype=bool))
    return y


def _poisson_with_clique(dims, clique):
    """A Poisson matrix whose last ``clique`` unknowns are also coupled densely: a supernode of
    at least ``clique`` columns whatever the ordering (METIS, or RCM where pymetis is missing)."""
    a = generators.poisson(dims).to_scipy().tolil()
    n = a.shape[0]
    last = np.arange(n - clique, n)
    a[np.ix_(last, last)] = a[np.ix_(last, last)].toarray() - 0.01
    a.setdiag(a.diagonal() + 0.01 * clique)  # stays diagonally dominant: SPD
    return a.tocsr()


@pytest.mark.parametrize("make,small_work", [
    (lambda: _poisson_with_clique([12, 11, 10], 80), 2.0 ** 21),  # chunks + large ones
    (lambda: _poisson_with_clique([12, 11, 10], 80), 1e12),  # chunks only, chains > 1
    (lambda: generators.poisson([30, 31]).to_scipy(), 1.0),  # large ones only
    (lambda: _poisson_with_clique([16, 17], 130), 2.0 ** 18),
])
def test_gpu_chunk_schedule_emulated_on_the_host(make, small_work):
    """The GPU engine's schedule (chunk plan, level task lists, the kernels' block-to-task
    search, tile decoding and target addressing), run block by block on the host with each
    launch reading what earlier launches left: it must give the CPU engine's factor and
    solution. Catches a chunk placed on a level before its dependencies."""
    a = make()
    sym = analyze(a, relaxation="cholmod")
    assert np.diff(sym.starts).max() > CHUNK or small_work < 2.0  # chains of several chunks
    reference = factor_cpu(sym, a.data)
    lx = _emulate_gpu_factor(sym, a.data, small_work)
    assert abs(lx - reference).max() <= 1e-12 * abs(reference).max()
    b = a @ np.random.default_rng(2).uniform(-1, 1, (a.shape[0], 2))
    expected = solve_cpu(sym, reference, b[sym.perm])
    y = _emulate_gpu_solve(sym, reference, b[sym.perm])
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)
    y = _emulate_flow_solve(sym, reference, b[sym.perm])
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)


def test_chunk_levels_follow_the_dependencies():
    a = generators.poisson([12, 11, 10]).to_scipy()
    sym = analyze(a, relaxation="cholmod")
    chained = np.arange(sym.nsuper) % 3 != 0
    plan = schedule.chunk_plan(sym, chained)
    first_level = np.full(sym.nsuper, -1)
    last_level = np.full(sym.nsuper, -1)
    for v in range(len(plan.sup)):
        s = plan.sup[v]
        if plan.c0[v] == 0:
            first_level[s] = plan.level[v]
        else:  # a chunk comes right after the previous chunk of its supernode
            assert plan.level[v] == plan.level[v - 1] + 1 and plan.sup[v - 1] == s
        last_level[s] = max(last_level[s], plan.level[v])
        assert plan.c0[v] + plan.width[v] <= sym.starts[s + 1] - sym.starts[s]
    first_level[plan.large] = last_level[plan.large] = plan.large_level
    children_end = np.full(sym.nsuper, -1)
    np.maximum.at(children_end, sym.sparent[sym.sparent >= 0], last_level[sym.sparent >= 0])
    # every supernode starts on the first level after its last child's last chunk
    np.testing.assert_array_equal(first_level, children_end + 1)
    # and the chunks cover every column of every chained supernode once
    covered = np.zeros(sym.n, dtype=int)
    for v in range(len(plan.sup)):
        first = sym.starts[plan.sup[v]] + plan.c0[v]
        covered[first:first + plan.width[v]] += 1
    np.testing.assert_array_equal(covered[np.repeat(chained, np.diff(sym.starts))], 1)


@pytest.mark.gpu
@pytest.mark.parametrize("small_work", [1e12, 2.0 ** 21])  # all chunked / with large ones
def test_gpu_refactorizations_and_repeated_solves_replay_graphs(tmp_path, small_work):
    a = generators.poisson([12, 11, 10]).to_scipy()
    sym = analyze(a, relaxation="cholmod")
    x_true = np.random.default_rng(7).uniform(-1, 1, (a.shape[0], 2))
    with _engine(tmp_path, "gpu", CholeskyLocal(sym), {"small_work": small_work}) as engine:
        for scale in (1.0, 3.0, 0.25):  # new values each time, same pattern
            engine.load(a.data * scale, (a * scale) @ x_true)
            det = engine.factor()
            for _ in range(2):  # the right-hand sides stay as uploaded
                engine.solve()
                np.testing.assert_allclose(_unpermute(sym, np.array(engine.solution())), x_true,
                                           rtol=1e-9, atol=1e-12)
            assert det == pytest.approx(np.linalg.slogdet(a.toarray() * scale)[1], rel=1e-12)
        # the solve always replays a graph; the factorization only when every supernode is
        # chunked (the block tasks' cuBLAS/cuSOLVER calls launch directly)
        assert engine.graphed == ("factor+solve" if engine.n_large == 0 else "solve")


def test_kernel_table_matches_the_launches_validated_on_the_gpu():
    # The signatures derived from the source for the launches checked on the H100.
    assert KERNELS.signatures(type_defines(np.float64, np.int32, CHUNK=CHUNK)) == {
        "assemble": "qPPPP", "factor_panels": "iPPPPPPPPPPPP", "update_tiles": "iPPPPPPPPPPPPPP",
        "scatter_update": "iiiPiPPPP", "record_potrf_info": "PiP", "gather_diag": "iPPP",
        "solve_forward": "iPPPPPPPPPPPiiPP", "solve_backward": "iPPPPPPPPPPPiiPP",
        "solve_forward_flow": "iPPPPPPPPPPPPPPPiiPPPi",
        "solve_backward_flow": "iPPPPPPPPPPPPPPPiiPPi", "residual": "iiPPPPPPPP",
        "add_correction": "qPP"}


def test_analysis_told_the_pattern_is_symmetric_gives_the_same_plan():
    """The operation passes what the symmetry check found; skipping the analysis's own check
    changes nothing in the plan."""
    a = generators.poisson([7, 6, 5], 27).to_scipy()
    told = analyze(a, "rcm", pattern_symmetric=check_square_symmetric(a))
    plain = analyze(a, "rcm")
    assert told.factor_nnz == plain.factor_nnz and told.nsuper == plain.nsuper
    np.testing.assert_array_equal(told.perm, plain.perm)


# -- errors ---------------------------------------------------------------------------------
def test_non_square_and_non_symmetric_raise_one_line():
    with pytest.raises(HisparseError, match="not square"):
        check_square_symmetric(sp.csr_matrix(np.ones((3, 4))))
    bad = generators.poisson([4, 4]).to_scipy().tolil()
    bad[2, 7] = 5.0
    with pytest.raises(HisparseError, match=r"not symmetric: A\[2, 7\]"):
        check_square_symmetric(bad.tocsr())


@pytest.mark.parametrize("case", ["symmetric", "one_sided_zero", "one_sided_tiny", "value",
                                  "missing_mirror", "unsorted"])
def test_symmetry_check_in_place_agrees_with_the_transpose(case):
    """The in-place check (each entry's mirror found by a search in its column's row) answers
    as the comparison with the transpose does: True for a symmetric pattern and values, False
    for symmetric values with an entry stored on one side only (a zero, or within 1e-14 max|A|),
    and the one line naming the worst entry otherwise, for canonical and unsorted CSR alike."""
    a = sp.csr_matrix(random_spd(60, 0.1, 7))
    a.sum_duplicates()
    scale = float(abs(a.data).max())
    if case.startswith("one_sided"):  # an entry stored at (i, j) only, where neither was
        dense = a.toarray()
        i, j = [(i, j) for i in range(60) for j in range(i + 1, 60) if dense[i, j] == 0][0]
        coo = a.tocoo()
        value = 0.0 if case == "one_sided_zero" else 1e-16 * scale
        a = sp.csr_matrix((np.append(coo.data, value), (np.append(coo.row, i),
                                                        np.append(coo.col, j))), shape=a.shape)
        a.sum_duplicates()
        assert a.nnz == coo.nnz + 1 and a.has_canonical_format
    if case in ("value", "missing_mirror"):
        lil = a.tolil()
        i, j = (4, 9) if case == "value" else (6, 41)
        lil[i, j] = (lil[i, j] or 0.0) + 1e-9 * scale
        a = lil.tocsr()
    if case == "unsorted":  # the same symmetric matrix with its rows' columns reversed
        a = sp.csr_matrix((a.data.copy(), a.indices.copy(), a.indptr.copy()), shape=a.shape)
        for r in range(a.shape[0]):
            lo, hi = a.indptr[r], a.indptr[r + 1]
            a.indices[lo:hi], a.data[lo:hi] = a.indices[lo:hi][::-1], a.data[lo:hi][::-1]
        a.has_sorted_indices = False
    dense = a.toarray()
    if case in ("value", "missing_mirror"):
        with pytest.raises(HisparseError, match="not symmetric: A"):
            check_square_symmetric(a)
        return
    assert np.abs(dense - dense.T).max() <= 1e-14 * scale
    stored = a.copy()
    stored.data[:] = 1
    expected = (stored != stored.T).nnz == 0
    assert check_square_symmetric(a) == expected
    assert expected == (case in ("symmetric", "unsorted"))


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_indefinite_matrix_names_the_original_column(ordering):
    a = generators.poisson([8, 9]).to_scipy().tolil()
    a[37, 37] = -1.0  # diagonally dominant elsewhere: only this pivot can fail
    a = a.tocsr()
    sym = analyze(a, ordering=ordering)
    with pytest.raises(NotPositiveDefinite, match=r"pivot of column 37 \(original") as info:
        factor_cpu(sym, a.data)
    assert info.value.column == 37
    assert sym.perm[info.value.permuted_column] == 37


def test_singular_matrix_raises():
    # rows/columns 3 and 11 are identical 2x2 blocks [[1, 1], [1, 1]]: an exact zero pivot
    a = sp.lil_matrix(np.eye(16) * 4.0)
    a[3, 3] = a[11, 11] = a[3, 11] = a[11, 3] = 1.0
    a = a.tocsr()
    sym = analyze(a, ordering="natural")
    with pytest.raises(NotPositiveDefinite) as info:
        factor_cpu(sym, a.data)
    assert info.value.column in (3, 11)


# -- driver ---------------------------------------------------------------------------------
def _matrix_input(tmp_path, matrix):
    """The ``input`` section reading ``matrix`` (a CSRMatrix) from an HDF5 file in tmp_path."""
    path = tmp_path / "a.h5"
    write_matrix(path, matrix)
    return {"path": str(path)}


def _indefinite_laplacian(grid, column, value):
    """A 2-D Laplacian whose ``column``'s diagonal is ``value`` < 0 (only that pivot fails)."""
    a = generators.poisson(grid).to_scipy().tolil()
    a[column, column] = value
    return CSRMatrix.from_scipy(a.tocsr(), symmetric=True)


def _run(tmp_path, input, backend="cpu", expect_rc=0, gpu=None, **params):
    """Run Cholesky with ``params`` on one rank: ``(run, /result arrays)``, or the finished
    process when ``expect_rc`` is not 0."""
    sections = {"gpu": gpu} if gpu else {}
    cfg = write_config(tmp_path, "cholesky", params, input=input, backend=backend, **sections)
    return run_config(tmp_path, cfg, expect_rc=expect_rc)


def test_driver_cpu_solves_and_records(tmp_path):
    a = generators.poisson([14, 15])
    run, arrays = _run(tmp_path, _matrix_input(tmp_path, a), nrhs=3)
    x, b = arrays["x"], arrays["b"]
    assert run["attrs"]["verify_passed"]
    matrix = a.to_scipy()
    np.testing.assert_allclose(x, spl.spsolve(matrix.tocsc(), b), rtol=1e-10, atol=1e-12)
    assert run["attrs"]["chol_factor_nnz"] > 0
    assert run["attrs"]["flops"] == pytest.approx(run["attrs"]["chol_factor_flops"])
    # the CPU engine moves no data: its transfer phases are not recorded
    kinds = run["phase_kinds"]
    assert kinds["numeric"] == "compute" and kinds["h2d"] == kinds["upload"] == "transfer"
    wall = run["wall"][:, 0, :]
    assert np.isnan(wall[:, run["phases"].index("h2d")]).all()
    assert np.isfinite(wall[:, run["phases"].index("numeric")]).all()
    assert int(run["rank_vars"]["peak_device_bytes"][0]) == 0
    # its phases: the analysis once, then the median numeric and solve of the repeats
    attrs = run["attrs"]
    for phase in ("numeric", "solve"):
        assert attrs[f"chol_{phase}_seconds"] == \
            pytest.approx(np.median(wall[:, run["phases"].index(phase)]))
    assert attrs["chol_analysis_seconds"] == pytest.approx(wall[0, run["phases"].index("analysis")])
    assert attrs["chol_analysis_seconds"] >= \
        attrs["chol_ordering_seconds"] + attrs["chol_symbolic_seconds"]
    # one time to solution, the driver's: the analysis is in its setup, the factorizations and
    # solves inside its repeats
    assert "chol_time_to_solution_seconds" not in attrs
    assert attrs["setup_seconds"] >= attrs["chol_analysis_seconds"] + attrs["chol_upload_seconds"]
    inside = wall[:, run["phases"].index("numeric")] + wall[:, run["phases"].index("solve")]
    assert attrs["repeats_seconds"] >= inside.sum()
    # one rank factors everything: no exchange phase is recorded
    assert attrs["chol_distribute_seconds"] == attrs["chol_gather_seconds"] == 0.0
    assert attrs["chol_partition"] == "single" and list(attrs["chol_rank_flops"]) == \
        [attrs["chol_factor_flops"]]
    # refinement auto: the unrefined error (measured in the refine phase) is below the
    # tolerance on a 2-D Laplacian, so no step was made
    assert np.isfinite(wall[:, run["phases"].index("refine")]).all()
    assert attrs["chol_refinement"] == "auto" and attrs["chol_refinement_steps"] == 0
    assert attrs["chol_unrefined_backward_error"] == \
        pytest.approx(_backward_error(matrix, x, b), rel=1e-6)


def test_driver_cpu_refines_by_the_setting(tmp_path):
    a = generators.trefethen(1500)
    run, arrays = _run(tmp_path, {"generate": {"kind": "trefethen", "n": 1500}}, nrhs=2,
                       refinement=2, relaxation="cholmod")
    attrs, x, b = run["attrs"], arrays["x"], arrays["b"]
    assert attrs["verify_passed"] and attrs["chol_refinement_steps"] == 2
    matrix = a.to_scipy()
    assert _backward_error(matrix, x, b) <= min(attrs["chol_unrefined_backward_error"], 1e-15)


def test_driver_reports_not_positive_definite(tmp_path):
    proc = _run(tmp_path, _matrix_input(tmp_path, _indefinite_laplacian([6, 6], 20, -2.0)),
                expect_rc=2)
    assert "not positive definite" in proc.stderr and "column 20" in proc.stderr


# -- optional: SuiteSparse matrices from ../shared/data -------------------------------------
def _load_shared(name):
    import scipy.io
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    if name.endswith(".txt.gz"):
        t = np.loadtxt(path)
        a = sp.coo_matrix((t[:, 2], (t[:, 0].astype(int), t[:, 1].astype(int)))).tocsr()
        return (a + sp.tril(a, -1).T).tocsr()
    return sp.csr_matrix(scipy.io.mmread(str(path)))


@pytest.mark.parametrize("name", ["bcsstk02.mtx", "bcsstk21.mtx", "1138_bus.mtx",
                                  "bcsstk13.mtx.gz"])
def test_shared_spd_matrices_cpu(name):
    a = _load_shared(name)
    a.sort_indices()
    b = a @ np.random.default_rng(1).uniform(-1, 1, (a.shape[0], 1))
    _sym, _lx, x = _solve(a, b)
    assert _backward_error(a, x, b) <= 1e-12


# -- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("grid,params", [
    ([40, 41], {}),  # defaults: batched small supernodes + block tasks for the rest
    ([14, 13, 12], {}),
    ([14, 13, 12], {"small_work": 1.0, "block_size": 48, "nrhs": 3}),  # all as block tasks
    ([40, 41], {"small_work": 1e12, "nrhs": 2}),  # every supernode in the batched kernel
    ([14, 13, 12], {"relaxation": "none"}),
    ([14, 13, 12], {"nrhs": 11}),  # the dataflow solves' right-hand-side tiles (8 / 4) and a rest
    ([40, 41], {"solve_schedule": "levels", "nrhs": 2}),  # the level-by-level solves
    ([14, 13, 12], {"refinement": 2, "nrhs": 3}),  # refined: residual + correction graphs
    ([40, 41], {"refinement": 1, "solve_schedule": "levels", "cuda_graphs": False}),
])
def test_gpu_solves_laplacians(tmp_path, grid, params):
    matrix = generators.poisson(grid)
    run, arrays = _run(tmp_path, _matrix_input(tmp_path, matrix), backend="gpu", **params)
    x, b = arrays["x"], arrays["b"]
    a = matrix.to_scipy()
    assert _backward_error(a, x, b) <= 1e-12
    sign, expected = np.linalg.slogdet(a.toarray()) if a.shape[0] <= 2000 else (1, None)
    if expected is not None:
        assert run["attrs"]["chol_logdet"] == pytest.approx(expected, rel=1e-11)
    # the factor's panels at least went through the engine's arena
    item = np.dtype(np.float64).itemsize
    assert int(run["rank_vars"]["peak_device_bytes"][0]) >= \
        int(run["attrs"]["chol_supernodal_nnz"]) * item


@pytest.mark.gpu
@pytest.mark.parametrize("streams,block_size", [(1, 1024), (4, 128)])
def test_gpu_trefethen_2000(tmp_path, streams, block_size):
    run, arrays = _run(tmp_path, {"generate": {"kind": "trefethen", "n": 2000}}, backend="gpu",
                       gpu={"streams": streams}, rhs="unit", block_size=block_size,
                       relaxation="cholmod")
    x = arrays["x"]
    dense = generators.trefethen(2000).to_scipy().toarray()
    assert x[0, 0] == pytest.approx(np.linalg.inv(dense)[0, 0], rel=1e-12)
    assert run["attrs"]["chol_logdet"] == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-12)


@pytest.mark.gpu
def test_gpu_not_positive_definite(tmp_path):
    matrix_input = _matrix_input(tmp_path, _indefinite_laplacian([30, 30], 451, -3.0))
    for small_work in (1.0, 1e12):  # the cuSOLVER path and the batched kernel
        proc = _run(tmp_path, matrix_input, backend="gpu", expect_rc=2, small_work=small_work)
        assert "not positive definite" in proc.stderr and "column 451 " in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("HISPARSE_SLOW") != "1", reason="set HISPARSE_SLOW=1")
def test_gpu_trefethen_20000_published_values(tmp_path):
    run, arrays = _run(tmp_path, {"generate": {"kind": "trefethen", "n": 20000}}, backend="gpu",
                       rhs="unit", relaxation="cholmod")
    assert arrays["x"][0, 0] == pytest.approx(TREFETHEN_20000_INV11, rel=1e-13)
    assert run["attrs"]["chol_logdet"] == pytest.approx(TREFETHEN_20000_LOGDET, rel=1e-10)


def test_analyze_calls_before_ordering_once_before_the_ordering(monkeypatch):
    """The hook the operation uses to start the library import runs once, after the graph is
    built and before the fill-reducing ordering starts."""
    events = []
    real = ordering.fill_reducing_order

    def spy(*args, **kwargs):
        events.append("ordering")
        return real(*args, **kwargs)

    monkeypatch.setattr(symbolic, "fill_reducing_order", spy)
    sym = analyze(generators.poisson([9, 7]).to_scipy(), "rcm",
                  before_ordering=lambda: events.append("hook"))
    assert events == ["hook", "ordering"] and sym.n == 63


@pytest.mark.parametrize("block_entries", [1 << 21, 64])
def test_residual_operator_blocks_equal_the_whole_product(monkeypatch, block_entries):
    """The refinements' residual (A made once, one compiled pass by row blocks on threads)
    equals b - A x and the backward error computed here on the whole matrix, whatever the
    blocks (one, or several with rows of every length, an empty row among them)."""
    from hisparse.ops.cholesky.reference import ResidualOperator
    from hisparse.ops.cholesky import reference
    monkeypatch.setattr(ResidualOperator, "BLOCK_ENTRIES", block_entries)
    monkeypatch.setattr(reference, "usable_cores", lambda: 4)
    rng = np.random.default_rng(3)
    a = sp.random(300, 300, density=0.04, format="csr", random_state=4, dtype=np.float32)
    a = (a + a.T + 30 * sp.eye(300, dtype=np.float32)).tocsr()
    a = a.tolil()
    a[17, :] = 0  # an empty row: its residual is b's row
    a = a.tocsr()
    operator = ResidualOperator(a)
    cuts = operator.row_cuts
    assert len(cuts) - 1 == (1 if block_entries > a.nnz else 32)  # 8 per core, 4 cores
    assert cuts[0] == 0 and cuts[-1] == 300 and np.all(np.diff(cuts) > 0)
    x, b = rng.standard_normal((300, 3)), rng.standard_normal((300, 3))
    residual, error = operator.residual_error(x, b)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(residual, b - a64 @ x, rtol=0, atol=1e-12)
    assert error == pytest.approx(_backward_error(a64, x, b), rel=1e-12)
    np.testing.assert_array_equal(residual[17], b[17])


@pytest.mark.parametrize("dims", [[30, 29], [12, 11, 10]])
def test_compiled_substitution_runs_agree_with_blas_per_supernode(monkeypatch, dims):
    """The host solve substitutes runs of small supernodes by one compiled loop and larger ones
    by BLAS (SMALL_SOLVE_ENTRIES): all by BLAS, the default mix and all compiled give the same
    solution, which solves A x = b; the compiled loops agree with their Python bodies."""
    from hisparse.ops.cholesky import cpu
    a = generators.poisson(dims).to_scipy()
    sym = analyze(a, relaxation="cholmod")
    lx = factor_cpu(sym, a.data)
    b = a @ np.random.default_rng(4).uniform(-1, 1, (a.shape[0], 3))
    solutions = []
    for threshold in (0, cpu.SMALL_SOLVE_ENTRIES, 10 ** 9):
        monkeypatch.setattr(cpu, "SMALL_SOLVE_ENTRIES", threshold)
        solutions.append(_unpermute(sym, solve_cpu(sym, lx, b[sym.perm])))
    for x in solutions:
        np.testing.assert_allclose(a @ x, b, rtol=1e-10, atol=1e-10 * abs(b).max())
        np.testing.assert_allclose(x, solutions[0], rtol=1e-12, atol=1e-12)
    layout = cpu.PanelLayout.of(sym)
    args = (lx, layout.panel_offset, layout.nrows, layout.ncols, layout.first, layout.rows,
            layout.rows_offset)
    every = np.arange(sym.nsuper, dtype=np.int64)
    for loop, run in ((cpu._forward_run, every), (cpu._backward_run, every[::-1].copy())):
        compiled, python = b[sym.perm].copy(), b[sym.perm].copy()
        loop(*args, run, compiled)
        loop.py_func(*args, run, python)
        np.testing.assert_allclose(compiled, python, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dims", [[30, 29], [12, 11, 10]])
def test_compiled_factor_runs_agree_with_lapack_per_supernode(monkeypatch, dims):
    """The host factorization takes runs of small supernodes through one compiled loop and
    larger ones through LAPACK/BLAS (SMALL_FACTOR_WORK): all by LAPACK, the default mix and all
    compiled give the same factor, and name the same column when a pivot is not positive."""
    from hisparse.ops.cholesky import cpu
    a = generators.poisson(dims).to_scipy()
    sym = analyze(a, relaxation="cholmod")
    factors = []
    for threshold in (0, cpu.SMALL_FACTOR_WORK, 10 ** 12):
        monkeypatch.setattr(cpu, "SMALL_FACTOR_WORK", threshold)
        factors.append(factor_cpu(sym, a.data))
    for lx in factors[1:]:
        np.testing.assert_allclose(lx, factors[0], rtol=1e-12, atol=1e-12 * abs(factors[0]).max())
    layout = cpu.PanelLayout.of(sym)
    every = np.arange(sym.nsuper, dtype=np.int64)
    args = (layout.panel_offset, layout.nrows, layout.ncols, layout.first, layout.below_offset,
            layout.col_base, layout.col_rel, layout.rel, every)
    compiled, python = (cpu.assemble_values(sym, a.data) for _ in range(2))
    assert cpu._factor_run(compiled, *args) == cpu._factor_run.py_func(python, *args) == -1
    np.testing.assert_allclose(compiled, python, rtol=1e-13, atol=1e-13)
    bad = a.tolil()
    bad[17, 17] = -1.0
    bad = bad.tocsr()
    columns = set()
    for threshold in (0, 10 ** 12):
        monkeypatch.setattr(cpu, "SMALL_FACTOR_WORK", threshold)
        with pytest.raises(NotPositiveDefinite) as failure:
            factor_cpu(sym, bad.data)
        columns.add(failure.value.column)
    assert columns == {17}


@pytest.mark.parametrize("shape,nrhs", [((300, 300), 1), ((400, 250), 3), ((0, 5), 1)])
def test_residual_operator_is_scipys_products(shape, nrhs):
    """The compiled residual (one pass over A's entries, rows in blocks on threads) gives the
    two SciPy products' residual bit for bit and their backward error, for square and
    rectangular blocks of rows (a rank's rows), several right-hand sides, a 1-D b, and inf
    where x holds a NaN."""
    from hisparse.ops.cholesky.reference import ResidualOperator
    rng = np.random.default_rng(11)
    a = sp.random(*shape, density=0.05, random_state=4, format="csr", dtype=np.float32)
    x, b = rng.standard_normal((shape[1], nrhs)), rng.standard_normal((shape[0], nrhs))
    operator = ResidualOperator(a)
    residual, error = operator.residual_error(x, b)
    a64 = a.astype(np.float64)
    expected = b - a64 @ x
    np.testing.assert_array_equal(residual, expected)
    scale = abs(a64) @ np.abs(x) + np.abs(b)
    assert error == (float((np.abs(expected) / scale).max()) if expected.size else 0.0)
    flat, flat_error = operator.residual_error(x[:, 0], b[:, 0])
    assert flat.shape == (shape[0],) and flat_error <= error
    np.testing.assert_array_equal(flat, expected[:, 0])
    if shape[0]:
        x[0, 0] = np.nan
        assert operator.residual_error(x, b)[1] == np.inf or a[:, 0].nnz == 0


def _breadth_first_distances(indptr, indices, source):
    """Distances from ``source`` by a plain queue (-1: not reached): the reference."""
    from collections import deque
    level = np.full(len(indptr) - 1, -1)
    level[source] = 0
    queue = deque([source])
    while queue:
        v = queue.popleft()
        for u in indices[indptr[v]:indptr[v + 1]]:
            if level[u] < 0:
                level[u] = level[v] + 1
                queue.append(u)
    return level


@pytest.mark.parametrize("levels", [ordering._bfs_levels, ordering._bfs_levels_by_frontier])
def test_breadth_first_levels_are_the_distances(levels):
    rng = np.random.default_rng(7)
    graphs = [sp.csr_matrix((1, 1)), sp.csr_matrix(generators.poisson([9, 7]).to_scipy())]
    for trial in range(25):  # random graphs, several components among them
        n = int(rng.integers(2, 250))
        a = sp.random(n, n, density=float(rng.uniform(0.002, 0.05)), random_state=trial,
                      format="csr")
        graphs.append((a + a.T).tocsr())
    for a in graphs:
        indptr, indices = ordering.offdiagonal_pattern(a)
        source = int(rng.integers(0, a.shape[0]))
        np.testing.assert_array_equal(levels(indptr, indices, source),
                                      _breadth_first_distances(indptr, indices, source))


def test_a_lopsided_level_set_does_not_win_a_split():
    """A graph whose first vertex is alone: its level set would cut nothing off, and loses to
    any separator."""
    grid = generators.poisson([30, 30]).to_scipy()
    a = sp.block_diag([sp.identity(1), grid], format="csr")
    indptr, indices = ordering.offdiagonal_pattern(a)
    score, separator, side = ordering._level_set_try(indptr, indices)
    assert score == np.inf and metis.is_separator(indptr, indices, side)
    score, separator, side = ordering._level_set_try(*ordering.offdiagonal_pattern(grid))
    assert np.isfinite(score) and len(separator) <= 30


def test_a_split_keeps_a_level_set_within_the_tolerance_of_metis():
    """The level set is kept where it scores below 1 + LEVEL_SET_TOLERANCE times METIS's best
    (its work has gone on meanwhile), else the best try; a lopsided one never."""
    def tries(*scores):
        return [(score, None, None) for score in scores]

    keep = ordering._best_try
    assert ordering.LEVEL_SET_TOLERANCE == 0.05
    assert keep(tries(100.0, 98.0, 102.8), level_set=2) == 2  # within 5 % of 98
    assert keep(tries(100.0, 98.0, 103.0), level_set=2) == 1  # 5.1 % above: METIS's best
    assert keep(tries(100.0, 98.0, 90.0), level_set=2) == 2
    assert keep(tries(100.0, 98.0, np.inf), level_set=2) == 1
    assert keep(tries(100.0, 98.0, 99.0), level_set=2, tolerance=0.0) == 1
    assert keep(tries(100.0, 100.0, 100.0), level_set=2, tolerance=0.0) == 0  # the first equal
    assert keep(tries(100.0, 98.0), level_set=None) == 1
    assert keep(tries(np.inf, 5.0, 6.0), level_set=0) == 1  # a lopsided level set tried first


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
@pytest.mark.parametrize("one_at_a_time", [True, False])
def test_parts_under_a_level_set_go_on_before_the_split_is_decided(monkeypatch, one_at_a_time):
    """The parts under a split's level set are split and ordered while METIS's tries run; the
    ordering is the one made by waiting for every split's decision, where the level set wins
    (its parts kept) and where METIS's separator does (its parts dropped)."""
    from concurrent.futures import ThreadPoolExecutor
    counts = {"speculations": 0, "speculations_kept": 0}
    for case in (generators.poisson([30, 30, 30]), generators.poisson([150, 150]),
                 generators.poisson([40, 24, 18])):
        a = case.to_scipy()
        indptr, indices = ordering.offdiagonal_pattern(a)
        orders = {}
        for speculate in (False, True):
            monkeypatch.setattr(ordering, "SPECULATE_LEVEL_SETS", speculate)
            timings = {}
            if one_at_a_time:  # deterministic: the level set, submitted first, is done first
                with ThreadPoolExecutor(1) as pool:  # as if 16 workers: idle ones to go on
                    orders[speculate] = ordering._dissect(pool, 16, indptr, indices, 3, None,
                                                          timings)
            else:  # worker processes, as a run has them
                orders[speculate] = ordering.parallel_nested_dissection(
                    indptr, indices, 3, workers=4, timings=timings)
            np.testing.assert_array_equal(np.sort(orders[speculate]), np.arange(a.shape[0]))
            assert 0 < timings["top_split"] <= timings["splits"] < timings["leaves"]
            assert timings["speculations_kept"] <= timings["level_set_splits"]
            if not speculate:
                assert timings["speculations"] == 0
        for key in counts:
            counts[key] += timings[key]
        np.testing.assert_array_equal(orders[False], orders[True])
    if one_at_a_time:  # some level sets won with their parts done ahead, some lost
        assert 0 < counts["speculations_kept"] < counts["speculations"]


def test_scratch_directory_waits_for_dropped_tasks_still_writing():
    """The ordering's scratch directory is removed at once when no dropped task runs, else once
    they are done (one may still write a subgraph there): never under a writer, never left."""
    import os
    import threading
    import time as clock
    from concurrent.futures import ThreadPoolExecutor
    scratch = ordering._scratch_directory()
    ordering._remove_when_done(scratch, [])
    assert not os.path.exists(scratch.name)
    scratch = ordering._scratch_directory()
    release = threading.Event()

    def late_writer():  # a dropped part extracting its subgraph after the ordering ended
        release.wait(10)
        ordering.GraphFile(scratch.name, "late", np.array([0, 1, 2]), np.array([1, 0]))
        return "written"

    with ThreadPoolExecutor(1) as pool:
        task = pool.submit(late_writer)
        ordering._remove_when_done(scratch, [task])
        assert os.path.isdir(scratch.name)  # the analysis goes on; the writer has its place
        release.set()
        assert task.result(timeout=10) == "written"
    deadline = clock.monotonic() + 10
    while os.path.exists(scratch.name) and clock.monotonic() < deadline:
        clock.sleep(0.01)
    assert not os.path.exists(scratch.name)


@pytest.mark.skipif(not have_pymetis(), reason="needs pymetis")
def test_split_ordering_takes_level_sets_where_they_cut_less(monkeypatch):
    """On a 3-D grid the splits' level sets (flat diagonal cuts) beat METIS's separators: fewer
    flops with them among the tries; on a graph where METIS's win, the same ordering."""
    from concurrent.futures import ThreadPoolExecutor

    def split_order(a, level_sets):
        monkeypatch.setattr(ordering, "LEVEL_SET_TRIES", level_sets)
        indptr, indices = ordering.offdiagonal_pattern(a)
        with ThreadPoolExecutor(1) as pool:  # the tries one at a time, in this process
            order = ordering._dissect(pool, 4, indptr, indices, 2, None, {})
        np.testing.assert_array_equal(np.sort(order), np.arange(a.shape[0]))
        return order, analyze(a[order][:, order], "natural", "none").flops

    cube = generators.poisson([40, 40, 40]).to_scipy()  # 0.70x the flops (48^3: 0.60x)
    (_, without), (_, with_sets) = split_order(cube, False), split_order(cube, True)
    assert with_sets < 0.9 * without
    stencil = generators.poisson([24, 24, 24], stencil=27).to_scipy()
    np.testing.assert_array_equal(split_order(stencil, False)[0], split_order(stencil, True)[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_right_hand_sides_are_the_products_of_the_known_solutions(dtype):
    """b = A x_true in float64 for the random and the ones solution, whatever A's precision,
    A left as it was; b = ones and b = e_0 have no known solution."""
    from hisparse.ops.cholesky.problem import make_rhs
    a = sp.csr_matrix(generators.poisson([9, 7]).to_scipy()).astype(dtype)
    before = a.copy()
    for kind in ("random_x", "ones_x"):
        b, x_true = make_rhs(a, kind, 3, seed=5)
        assert b.dtype == np.float64 and b.shape == (63, 3)
        np.testing.assert_allclose(b, a.toarray().astype(np.float64) @ x_true, rtol=1e-13,
                                   atol=1e-13)
    assert (a != before).nnz == 0 and a.dtype == dtype
    b, x_true = make_rhs(a, "unit", 2, seed=5)
    assert x_true is None and b[0].tolist() == [1.0, 1.0] and not b[1:].any()
    assert make_rhs(a, "ones", 1, seed=5)[1] is None
