"""Cholesky on several ranks (``partition.strategy: subtree``): the subtree-to-rank mapping and
the local plans (every supernode factored once, the ranks' shares balanced), the ranks' engine
steps composed in one process against the one-rank factorization, the level-set dissection, and
the driver under mpiexec at 2, 3 and 4 ranks against SciPy."""
import os
import types

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from hisparse import generators
from hisparse.formats import CSRMatrix
from hisparse.io import write_matrix
from hisparse.ops.cholesky import ordering
from hisparse.ops.cholesky.cpu import SubtreeFactorEngine, factor_cpu, logdet, solve_cpu
from hisparse.ops.cholesky import rank_plan
from hisparse.ops.cholesky.mapping import subtree_mapping, supernode_flops
from hisparse.ops.cholesky.rank_plan import (LowerEntries, TopUpdates, entry_supernodes, local_plan,
                                             local_symbolic, own_lower_entries, plan_structure)
from hisparse.ops.cholesky.structure import position_arrays, sorted_positions
from hisparse.ops.cholesky.symbolic import TOP_PIECE_COLUMNS, analyze

from conftest import run_hisparse
from flow_emulation import FlowSolveOnHost
from helpers import random_spd, read_run, results_in, run_config, write_config


MATRICES = {
    "grid": lambda: generators.poisson([36, 33]).to_scipy(),
    "laplacian3d": lambda: generators.poisson([11, 10, 9]).to_scipy(),
    "irregular": lambda: random_spd(500, 0.006, 3),
}


def _backward_error(a, x, b):
    r = np.abs(b - a @ x)
    return float((r / (abs(a) @ np.abs(x) + np.abs(b))).max())


# -- mapping and local plans ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5])
def test_mapping_owns_every_supernode_once_and_plans_cover_it(name, nranks):
    a = MATRICES[name]()
    sym = analyze(a, nranks=nranks)
    mapping = subtree_mapping(sym, nranks)
    assert len(mapping.owner) == sym.nsuper and mapping.owner.min() >= 0
    assert mapping.owner.max() < nranks
    np.testing.assert_allclose(mapping.rank_flops.sum(), sym.flops, rtol=1e-12)
    np.testing.assert_allclose(supernode_flops(sym).sum(), sym.flops, rtol=1e-12)
    # every top supernode is an ancestor of subtree roots only; every subtree hangs from the top
    is_top = np.zeros(sym.nsuper, dtype=bool)
    is_top[mapping.top] = True
    for c in mapping.roots:
        assert not is_top[c]
        assert sym.sparent[c] < 0 or is_top[sym.sparent[c]]
    for s in range(sym.nsuper):  # a subtree supernode's parent is in the subtree or the top
        p = sym.sparent[s]
        if p >= 0 and not is_top[s] and not is_top[p]:
            assert mapping.owner[p] == mapping.owner[s]
    plans = [local_plan(sym, mapping, r) for r in range(nranks)]
    columns = np.concatenate([plan.owned_columns for plan, _ in plans])
    assert sorted(columns.tolist()) == list(range(sym.n))
    sources = np.concatenate([source for _, source in plans])
    assert sorted(sources.tolist()) == sorted(sym.a_source.tolist())
    # the critical path: no shorter than any rank's own work, no longer than all of it
    assert mapping.rank_flops.max() * (1 - 1e-12) <= mapping.makespan
    assert mapping.makespan <= sym.flops * (1 + 1e-12)
    if nranks == 1:
        assert len(mapping.top) == 0
        assert plans[0][0].panel_offset[-1] == sym.panel_offset[-1]
        assert mapping.makespan == pytest.approx(sym.flops, rel=1e-12)


def test_top_boundaries_undo_a_merge_at_a_fork_only():
    """Two heavy subtrees under one root: the merge of the second into the root is undone on
    several ranks (they can be factored at once); along a chain nothing is cut."""
    from hisparse.ops.cholesky.supernodes import keep_top_boundaries
    fund = np.array([0, 2, 4, 5])
    counts = np.array([3, 2, 3, 2, 1])
    fork = np.array([1, 4, 3, 4, -1])  # columns 0-1 and 2-3 both hang from column 4
    merged = np.array([0, 2, 5])
    np.testing.assert_array_equal(keep_top_boundaries(fund, merged, fork, counts, 2),
                                  [0, 2, 4, 5])
    chain = np.array([1, 2, 3, 4, -1])
    np.testing.assert_array_equal(keep_top_boundaries(fund, merged, chain, counts, 2), merged)
    # a light subtree (under 1 / (TOP_SPLIT * ranks) of the work) stays merged
    light = np.array([10, 9, 1, 1, 1])
    np.testing.assert_array_equal(keep_top_boundaries(fund, merged, fork, light, 2), merged)


@pytest.mark.parametrize("name", list(MATRICES))
def test_supernodes_cut_at_forks_are_chains_of_the_tree(monkeypatch, name):
    """Every cut the analysis for several ranks makes (here at every fork, TOP_SPLIT huge)
    leaves supernodes whose columns all descend from the supernode's last column, and the
    factor of the plan is the matrix's (log det as one rank's)."""
    from hisparse.ops.cholesky import supernodes
    monkeypatch.setattr(supernodes, "TOP_SPLIT", 10 ** 9)
    a = MATRICES[name]()
    for relaxation in ("cholmod", "threshold"):
        sym = analyze(a, relaxation=relaxation, nranks=4)
        for s in range(sym.nsuper):
            last = int(sym.starts[s + 1]) - 1
            for j in range(int(sym.starts[s]), last):
                k = j
                while 0 <= k < last:
                    k = int(sym.parent[k])
                assert k == last, (relaxation, s, j)
        assert logdet(sym, factor_cpu(sym, a.data)) == pytest.approx(_one_rank_logdet(a),
                                                                     rel=1e-11)


def test_several_ranks_keep_the_separators_under_the_root_apart():
    """On a nested dissection, the analysis for several ranks leaves no supernode with two
    heavy child subtrees merged with one of them, so the mapping's top has both."""
    a = generators.poisson([30, 29]).to_scipy()
    four = analyze(a, ordering="dissection", relaxation="cholmod", nranks=4)
    mapping = subtree_mapping(four, 4)
    assert len(mapping.top) >= 3  # the root separator and the two under it
    assert mapping.rank_flops.sum() / mapping.makespan > 2.0


@pytest.mark.parametrize("name", ["grid", "laplacian3d"])
def test_separators_cut_into_pieces_are_shared_by_ranks(name):
    """With top_piece_columns small, the separators above the subtrees are cut into chains of
    pieces (the same factor: flops, log det), some separator's pieces go to several ranks, and
    the simulated schedule is shorter than with one rank per separator."""
    a = MATRICES[name]()
    whole = analyze(a, ordering="dissection", nranks=4, top_piece_columns=0)
    cut = analyze(a, ordering="dissection", nranks=4, top_piece_columns=8)
    assert cut.nsuper > whole.nsuper and cut.flops == pytest.approx(whole.flops, rel=1e-12)
    assert np.diff(cut.starts)[-1] <= 8 < np.diff(whole.starts)[-1]  # the root separator
    mapping = subtree_mapping(cut, 4)
    top = set(mapping.top.tolist())
    chains = {}  # the first piece of every chain of top supernodes -> its owners
    for t in mapping.top.tolist():
        head = t - 1 if t - 1 in top and cut.sparent[t - 1] == t else t
        while head - 1 in top and cut.sparent[head - 1] == head:
            head -= 1
        chains.setdefault(head, set()).add(int(mapping.owner[t]))
    assert max(len(owners) for owners in chains.values()) >= 2
    # the solve takes a separator's pieces as one run: fewer runs than the blocks moved
    assert len(mapping.solve_chains) < len(mapping.chains)
    bound = mapping.rank_flops.sum() / mapping.makespan
    assert bound > subtree_mapping(whole, 4).rank_flops.sum() / subtree_mapping(
        whole, 4).makespan
    assert logdet(cut, factor_cpu(cut, a.data)) == pytest.approx(_one_rank_logdet(a), rel=1e-11)


def test_makespan_waits_for_the_children_of_a_top_supernode():
    """Two leaves on two ranks under one root: the root starts when the slower leaf is done."""
    from hisparse.ops.cholesky.mapping import _makespan
    sparent = np.array([2, 2, -1])
    work = np.array([5.0, 3.0, 4.0])
    assert _makespan(sparent, np.array([2]), np.array([0, 1, 1]), work, 2) == 9.0
    assert _makespan(sparent, np.array([2]), np.array([0, 1, 0]), work, 2) == 9.0
    # a root on the rank of the faster leaf waits for the slower one
    assert _makespan(sparent, np.array([2]), np.array([1, 0, 0]), np.array([3.0, 5.0, 4.0]),
                     2) == 9.0


def test_every_rank_gets_a_tenth_of_the_flops_on_a_grid_at_four_ranks():
    a = generators.poisson([60, 60]).to_scipy()
    for order in ["dissection"] + (["metis"] if ordering.have_pymetis() else []):
        sym = analyze(a, ordering=order, nranks=4)
        share = subtree_mapping(sym, 4).rank_flops / sym.flops
        assert share.min() >= 0.10, (order, share)


def test_a_path_tree_leaves_ranks_idle():
    """RCM's elimination tree is a path: the mapping cannot split it and says so."""
    a = generators.poisson([20, 20]).to_scipy()
    sym = analyze(a, ordering="rcm")
    mapping = subtree_mapping(sym, 3)
    assert mapping.idle_ranks() == [1, 2]


def _engines(sym, mapping, values, dtype):
    ctx = types.SimpleNamespace(value_dtype=dtype)
    engines = []
    for r in range(mapping.nranks):
        plan, source = local_plan(sym, mapping, r)
        engine = SubtreeFactorEngine(ctx, types.SimpleNamespace(plan=plan), {})
        engine.load(values[source])
        engines.append(engine)
    return engines


def _each_top(mapping, engines, reverse=False, chains=None):
    """Every run of top supernodes (mapping.chains, or ``chains``): its owner's engine (its
    last supernode's), the run's local ids there, and every other holder's engine with its
    local ids."""
    chains = mapping.chains if chains is None else chains
    chains = chains[::-1] if reverse else chains
    for k0, k1 in chains:
        owner_rank = int(mapping.owner[mapping.top[k1]])
        owner = engines[owner_rank]
        others = [(engines[int(r)], int(engines[int(r)].plan.top[k0]),
                   int(engines[int(r)].plan.top[k1]))
                  for r in mapping.holders[k0] if r != owner_rank]
        yield owner, int(owner.plan.top[k0]), int(owner.plan.top[k1]), others


def _take_factored_pieces(mapping, engines):
    """What tree.py does with CUDA IPC after the factorization: the owner of every solve chain's
    last supernode takes the factored panels of its other supernodes from their owners."""
    for k0, k1 in mapping.solve_chains:
        solver = engines[int(mapping.owner[mapping.top[k1]])]
        for k in range(k0, k1 + 1):
            owner = engines[int(mapping.owner[mapping.top[k]])]
            if owner is solver:
                continue
            i, j = int(solver.plan.top[k]), int(owner.plan.top[k])
            solver.lx[solver.plan.panel_offset[i]:solver.plan.panel_offset[i + 1]] = \
                owner.lx[owner.plan.panel_offset[j]:owner.plan.panel_offset[j + 1]]


def _distributed_solve(sym, mapping, engines, b, chains=None):
    """What tree.py does over MPI, here by copies between the engines of one process (by the
    runs ``chains``: mapping.chains when None)."""
    b_perm = b[sym.perm]
    for engine in engines:
        engine.start_solve(b_perm[engine.plan.owned_columns])
        engine.forward_local()
    for owner, i0, i1, others in _each_top(mapping, engines, chains=chains):
        for engine, j0, j1 in others:
            owner.add_solve_block(i0, i1, engine.solve_block(j0, j1).copy())
        for i in range(i0, i1 + 1):
            owner.forward_top(i)
    for owner, i0, i1, others in _each_top(mapping, engines, reverse=True, chains=chains):
        for i in range(i1, i0 - 1, -1):
            owner.backward_top(i)
        for engine, j0, j1 in others:
            engine.set_solved_block(j0, j1, owner.solved_block(i0, i1).copy())
    x_perm = np.zeros(b.shape)
    for engine in engines:
        engine.backward_local()
        x_perm[engine.plan.owned_columns] = engine.solution()
    x = np.empty_like(x_perm)
    x[sym.perm] = x_perm
    return x


def _factor_tops(mapping, engines):
    """The top supernodes' exchange and factorization as tree.py runs them (every rank applies
    its own top supernodes' updates to a panel before it sends or factors it); the failing
    columns (or -1)."""
    updates = [TopUpdates(engine.plan) for engine in engines]

    def prepare(engine, i):
        for source, r0, r1 in updates[engine.plan.rank].due(i):
            engine.update_top(source, r0, r1)

    failed = []
    for owner, i0, i1, others in _each_top(mapping, engines):
        for engine, j0, j1 in others:
            for j in range(j0, j1 + 1):
                prepare(engine, j)
            owner.add_update(i0, i1, engine.update_block(j0, j1).copy())
        for i in range(i0, i1 + 1):
            prepare(owner, i)
            failed.append(owner.factor_top(i))
            updates[owner.plan.rank].factored(i)
    return failed


#: top_piece_columns of the engine-step tests: the default (no separator of these small
#: matrices is cut) and pieces of 8 columns (the separators above the subtrees shared by ranks)
PIECES = [TOP_PIECE_COLUMNS, 8]


def _factored_ranks(name, nranks, width=TOP_PIECE_COLUMNS):
    """``(A, analysis, mapping, engines)``: every rank's engine of matrix ``name`` factored
    (its subtrees, then the top supernodes with the exchanged updates), each step checked;
    ``width``: the analysis' top_piece_columns."""
    a = MATRICES[name]()
    sym = analyze(a, nranks=nranks, top_piece_columns=width)
    mapping = subtree_mapping(sym, nranks)
    engines = _engines(sym, mapping, a.data, np.float64)
    assert all(engine.factor_local() < 0 for engine in engines)
    assert all(column < 0 for column in _factor_tops(mapping, engines))
    return a, sym, mapping, engines


@pytest.mark.parametrize("width", PIECES)
@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_ranks_engine_steps_give_the_one_rank_factor(name, nranks, width):
    a, sym, mapping, engines = _factored_ranks(name, nranks, width)
    # a separator's supernodes move together: fewer exchanges than top supernodes
    assert len(mapping.chains) <= len(mapping.top)
    # (no top at all where the ranks' subtrees are whole components: METIS on the irregular
    # matrix at 2 ranks)
    np.testing.assert_array_equal(np.concatenate([np.arange(k0, k1 + 1)
                                                  for k0, k1 in mapping.chains]
                                                 + [np.zeros(0, np.int64)]),
                                  np.arange(len(mapping.top)))
    lx = factor_cpu(sym, a.data)
    # every rank's panels equal the one-rank factor's (up to the order of the update sums)
    for engine in engines:
        plan = engine.plan
        for i, s in enumerate(plan.supernodes):
            if mapping.owner[s] != plan.rank:
                continue
            mine = engine.lx[plan.panel_offset[i]:plan.panel_offset[i + 1]]
            whole = lx[sym.panel_offset[s]:sym.panel_offset[s + 1]]
            np.testing.assert_allclose(mine, whole, rtol=1e-12, atol=1e-12 * abs(whole).max())
    assert sum(e.logdet() for e in engines) == pytest.approx(logdet(sym, lx), rel=1e-12)
    b = a @ np.random.default_rng(0).uniform(-1, 1, (a.shape[0], 3))
    x = _distributed_solve(sym, mapping, engines, b)
    assert _backward_error(a, x, b) <= 1e-14
    x_one = np.empty_like(x)
    x_one[sym.perm] = solve_cpu(sym, lx, b[sym.perm])
    np.testing.assert_allclose(x, x_one, rtol=1e-10, atol=1e-12)


class _DeviceSolveOnHost:
    """The solve steps of :class:`~hisparse.ops.cholesky.gpu.GpuSubtreeEngine` on the host:
    its launch lists (``subtree_solve_lists``) run chunk task by chunk task as the kernels
    ``solve_forward`` / ``solve_backward`` do them (right-hand sides n x nrhs column-major, the
    forward sums in ``w``, the solution in ``y``), the tasks of one launch in reverse order (they
    must not depend on each other), ``y`` NaN where nothing has written it. ``schedule``
    ``flow``: the rank's subtrees by the dataflow tasks instead (``subtree_flow_tasks``, run
    in ticket order with every wait checked; the backward pass finds the top chunks marked
    solved, as the engine marks them)."""

    def __init__(self, engine, schedule="levels"):
        from hisparse.ops.cholesky.schedule import (chunk_plan, subtree_flow_tasks,
                                                    subtree_solve_lists, top_chunks)
        self.plan, self.lx = engine.plan, engine.lx  # the GPU engine's panels: the same layout
        self.sym = local_symbolic(self.plan, 64)
        self.splan = chunk_plan(self.sym, np.ones(self.sym.nsuper, dtype=bool))
        top_ids = sorted(int(i) for i in self.plan.top if i >= 0)
        self.local, self.tops = subtree_solve_lists(self.splan, top_ids)
        self.flow = None
        if schedule == "flow":
            self.flow = FlowSolveOnHost(self.sym, self.splan,
                                        subtree_flow_tasks(self.sym, self.splan, top_ids),
                                        self.lx)
            self.tops_solved = top_chunks(self.splan, top_ids)
        self.owned = np.searchsorted(self.sym.perm, self.plan.owned_columns)

    def _chunk(self, v):
        sym, s = self.sym, int(self.splan.sup[v])
        c0, w = int(self.splan.c0[v]), int(self.splan.width[v])
        nr, nc = int(sym.nrows[s]), int(sym.starts[s + 1] - sym.starts[s])
        panel = self.lx[sym.panel_offset[s]:sym.panel_offset[s + 1]].reshape(nc, nr).T
        first = int(sym.starts[s]) + c0
        return (panel[c0:c0 + w, c0:c0 + w], panel[c0 + w:, c0:c0 + w],
                slice(first, first + w), sym.supernode_rows(s)[c0 + w:])

    def _run(self, lists, forward):
        levels = range(len(lists.grid))
        for lev in (levels if forward else reversed(levels)):
            for v in lists.chunks[lists.begin[lev]:lists.begin[lev + 1]][::-1]:
                diag, below, cols, rows = self._chunk(int(v))
                if forward:
                    x = scipy.linalg.solve_triangular(diag, self.w[:, cols].T, lower=True)
                    self.y[:, cols] = x.T
                    self.w[:, rows] -= (below @ x).T
                else:
                    self.y[:, cols] -= (below.T @ self.y[:, rows].T).T
                    self.y[:, cols] = scipy.linalg.solve_triangular(
                        diag, self.y[:, cols].T, lower=True, trans="T").T

    def _columns(self, i0, i1):
        return slice(int(self.sym.starts[i0]), int(self.sym.starts[i1 + 1]))

    def start_solve(self, rhs):
        self.w = np.zeros((rhs.shape[1], self.sym.n))
        self.w[:, self.owned] = rhs.T
        self.y = np.full_like(self.w, np.nan)

    def forward_local(self):
        if self.flow is None:
            self._run(self.local, True)
        else:
            self.flow.forward(self.w.T, self.y.T)

    def forward_top(self, i):
        self._run(self.tops[int(i)], True)

    def backward_top(self, i):
        self._run(self.tops[int(i)], False)

    def backward_local(self):
        if self.flow is None:
            self._run(self.local, False)
        else:
            self.flow.backward(self.y.T, self.tops_solved.copy())

    def solve_block(self, i0, i1):
        return self.w[:, self._columns(i0, i1)]

    def add_solve_block(self, i0, i1, block):
        self.w[:, self._columns(i0, i1)] += block

    def solved_block(self, i0, i1):
        return self.y[:, self._columns(i0, i1)]

    def set_solved_block(self, i0, i1, block):
        self.y[:, self._columns(i0, i1)] = block

    def solution(self):
        return self.y[:, self.owned].T


@pytest.mark.parametrize("schedule", ["flow", "levels"])
@pytest.mark.parametrize("width", PIECES)
@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_device_solve_schedule_gives_the_solution(name, nranks, width, schedule):
    """The GPU engine's distributed solve (its launch lists or, ``flow``, its dataflow tasks
    over the subtrees; its partial sums up the tree and solved rows down it), emulated task by
    task on the host, solves A x = b; by the solve chains, as with CUDA IPC (a separator's
    factored pieces taken by one rank first)."""
    a, sym, mapping, engines = _factored_ranks(name, nranks, width)
    assert len(mapping.solve_chains) <= len(mapping.chains)
    _take_factored_pieces(mapping, engines)
    b = a @ np.random.default_rng(1).uniform(-1, 1, (a.shape[0], 2))
    x = _distributed_solve(sym, mapping, [_DeviceSolveOnHost(e, schedule) for e in engines],
                           b, mapping.solve_chains)
    assert np.isfinite(x).all()
    assert _backward_error(a, x, b) <= 1e-14


@pytest.mark.parametrize("nranks", [2, 3])
def test_local_symbolic_is_a_plan_of_its_own(nranks):
    """The GPU engine factors a rank's share as a whole plan: the held columns renumbered, every
    below row inside a held target whose column the update base points at."""
    a = MATRICES["laplacian3d"]()
    sym = analyze(a, nranks=nranks)
    mapping = subtree_mapping(sym, nranks)
    for rank in range(nranks):
        plan, _ = local_plan(sym, mapping, rank)
        local = local_symbolic(plan, 64)
        assert local.n == int(plan.ncols.sum()) and local.starts[-1] == local.n
        assert np.all((local.sparent > np.arange(local.nsuper)) | (local.sparent == -1))
        np.testing.assert_array_equal(local.perm, np.sort(local.perm))
        for i in range(local.nsuper):
            rows = local.supernode_rows(i)
            nc = int(local.starts[i + 1] - local.starts[i])
            np.testing.assert_array_equal(rows[:nc], np.arange(local.starts[i],
                                                               local.starts[i + 1]))
            assert np.all(np.diff(rows) > 0)
            np.testing.assert_array_equal(local.perm[rows], plan.supernode_rows(i))
            below = rows[nc:]
            target = np.searchsorted(local.starts, below, side="right") - 1
            if len(below):
                assert target[0] == local.sparent[i]
            b0 = int(local.below_offset[i])
            np.testing.assert_array_equal(
                local.col_base[b0:b0 + len(below)],
                local.panel_offset[target] + (below - local.starts[target]) * local.nrows[target])
        # the diagonal of every local column, and the rank's entries of A, inside its panels
        assert np.all(local.diag_pos < local.panel_offset[-1])
        assert np.all(plan.a_dest < local.panel_offset[-1])


def test_a_rank_names_its_failing_pivot():
    a = generators.poisson([20, 20]).to_scipy().tolil()
    a[37, 37] = -3.0
    a = a.tocsr()
    sym = analyze(a, nranks=3)
    mapping = subtree_mapping(sym, 3)
    engines = _engines(sym, mapping, a.data, np.float64)
    failed = [e.factor_local() for e in engines] + _factor_tops(mapping, engines)
    failing = min(f for f in failed if f >= 0)
    assert sym.perm[failing] == 37


# -- level-set dissection ---------------------------------------------------------------------
@pytest.mark.parametrize("make,most", [
    (lambda: generators.poisson([30, 25]).to_scipy(), 0.05),
    (lambda: generators.poisson([8, 9, 10]).to_scipy(), 0.2),
    (lambda: random_spd(300, 0.01, 5), 1.0),  # an expander: no small separator exists
    (lambda: sp.block_diag([generators.poisson([9, 9]).to_scipy(),
                            generators.poisson([7, 8]).to_scipy()], format="csr"), 0.1)])
def test_level_set_separator_separates(make, most):
    indptr, indices = ordering.offdiagonal_pattern(make())
    side = ordering.level_set_separator(indptr, indices)
    row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    assert not np.any((side[row] == 0) & (side[indices] == 1))
    sizes = np.bincount(side, minlength=3)
    assert sizes[0] > 0 and sizes[1] > 0 and sizes[2] <= most * len(side)
    perm = ordering.level_set_dissection(indptr, indices, 3)
    assert sorted(perm.tolist()) == list(range(len(side)))


# -- the driver under mpiexec ----------------------------------------------------------------
def _input(tmp_path, matrix):
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(matrix, symmetric=True))
    return {"path": str(path)}


def _one_rank_logdet(a):
    sym = analyze(a)
    return logdet(sym, factor_cpu(sym, a.data))


def _check_subtree_run(a, run, arrays):
    """A subtree run's solution against SciPy (backward error, x) and its logdet against one
    rank's; returns the run's attributes."""
    attrs = run["attrs"]
    assert attrs["chol_partition"] == "subtree" and attrs["verify_passed"]
    x, b = arrays["x"], arrays["b"]
    assert _backward_error(a, x, b) <= 1e-14
    np.testing.assert_allclose(x, spl.spsolve(a.tocsc(), b), rtol=1e-9, atol=1e-12)
    assert attrs["chol_logdet"] == pytest.approx(_one_rank_logdet(a), rel=1e-10)
    # every rank's time in its subtrees' solve passes, inside its solve phase (the wall clock
    # there includes the exchanges' waits)
    subtrees = np.asarray(run["rank_vars"]["chol_solve_subtree_seconds"], dtype=float)
    solve = run["wall"][:, :, run["phases"].index("solve")]
    assert len(subtrees) == int(attrs["nranks"]) and np.all(subtrees > 0)
    assert np.all(subtrees <= np.nanmax(solve, axis=0) + 1e-3)
    return attrs


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_driver_subtree_against_scipy(tmp_path, name, nranks):
    a = MATRICES[name]()
    cfg = write_config(tmp_path, "cholesky", {"nrhs": 2}, input=_input(tmp_path, a),
                       backend="cpu")
    run, arrays = run_config(tmp_path, cfg, nprocs=nranks)
    attrs = _check_subtree_run(a, run, arrays)
    # the set-up outside the named phases, step by step on every rank, all inside the driver's
    # prepare: rank 0 loads the compiled analysis, the others wait for its analysis
    steps = {step: np.asarray(run["rank_vars"][f"chol_prepare_{step}_seconds"])
             for step in ("pool", "kernels", "compiled", "rhs", "wait")}
    prepare = run["wall"][0, :, run["phases"].index("prepare")]
    assert steps["compiled"][0] > 0 and np.all(steps["compiled"][1:] == 0)
    assert steps["wait"][0] == 0 and np.all(steps["wait"][1:] > 0)
    assert np.all(sum(steps.values()) <= prepare + 1e-3)
    flops = np.asarray(attrs["chol_rank_flops"])
    assert len(flops) == nranks and flops.sum() == pytest.approx(attrs["chol_factor_flops"])
    assert len(attrs["chol_rank_peak_bytes"]) == nranks
    assert min(attrs["chol_rank_peak_bytes"]) > 0
    if name == "grid" and nranks == 4:
        assert flops.min() >= 0.10 * flops.sum()


@pytest.mark.parametrize("name,nranks,precision", [("grid", 4, "fp64"), ("laplacian3d", 3, "fp64"),
                                                   ("laplacian3d", 2, "fp32")])
def test_driver_subtree_separators_in_pieces(tmp_path, name, nranks, precision):
    """The separators above the subtrees cut into pieces of 8 columns, dealt to several ranks
    (a pipeline of blocks between them), under mpiexec against SciPy."""
    a = MATRICES[name]()
    cfg = write_config(tmp_path, "cholesky", {"nrhs": 2, "top_piece_columns": 8},
                       input=_input(tmp_path, a), backend="cpu", precision=precision)
    run, arrays = run_config(tmp_path, cfg, nprocs=nranks)
    attrs = run["attrs"]
    assert attrs["verify_passed"] and attrs["chol_top_exchanges"] > nranks
    if precision == "fp64":
        _check_subtree_run(a, run, arrays)
    else:
        assert _backward_error(a, arrays["x"], arrays["b"]) <= 1e-6
        assert attrs["chol_logdet"] == pytest.approx(_one_rank_logdet(a), rel=1e-5)


@pytest.mark.parametrize("name,nranks", [("grid", 4), ("irregular", 3)])
def test_driver_subtree_fp32(tmp_path, name, nranks):
    a = MATRICES[name]()
    cfg = write_config(tmp_path, "cholesky", {"nrhs": 2, "refinement": 1},
                       input=_input(tmp_path, a), backend="cpu", precision="fp32")
    run, arrays = run_config(tmp_path, cfg, nprocs=nranks)
    attrs = run["attrs"]
    assert attrs["verify_passed"] and attrs["chol_refinement_steps"] == 1
    # the fp32 factor's solution, refined once with an fp64 residual, down to what the float32
    # solution itself can hold (one rank does no better)
    unrefined = attrs["chol_unrefined_backward_error"]
    assert unrefined <= 1e-5
    assert _backward_error(a, arrays["x"], arrays["b"]) < unrefined
    assert attrs["chol_logdet"] == pytest.approx(_one_rank_logdet(a), rel=1e-5)


def test_driver_subtree_reports_not_positive_definite(tmp_path):
    a = generators.poisson([20, 20]).to_scipy().tolil()
    a[37, 37] = -3.0
    cfg = write_config(tmp_path, "cholesky", {}, input=_input(tmp_path, a.tocsr()),
                       backend="cpu")
    proc = run_config(tmp_path, cfg, nprocs=3, expect_rc=2)
    assert "not positive definite" in proc.stderr and "column 37 " in proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("nranks,params", [
    (2, {"subtree_exchange": "host"}), (4, {"subtree_exchange": "host", "small_work": 2.0 ** 21}),
    (3, {"refinement": 1}), (2, {"subtree_exchange": "ipc"}),
    (4, {"subtree_exchange": "ipc", "small_work": 2.0 ** 21}),
    (4, {"top_piece_columns": 24, "small_work": 2.0 ** 21}),
    (3, {"top_piece_columns": 24, "subtree_exchange": "host"}),
    (2, {"solve_schedule": "levels"}),
    (3, {"solve_schedule": "levels", "refinement": 1, "top_piece_columns": 24})])
def test_gpu_subtree_against_scipy(tmp_path, nranks, params):
    """Each rank factors its subtrees on its GPU (chunk kernels, and block tasks with
    small_work 2^21), the top supernodes after the update blocks come through host MPI or are
    read from the other GPUs through CUDA IPC (auto, at 3 ranks); the solve runs on the GPUs,
    the subtrees by the dataflow tasks or level by level (refined once at 3 ranks: a second
    distributed solve)."""
    a = generators.poisson([16, 15, 14]).to_scipy()
    cfg = write_config(tmp_path, "cholesky", dict(params, nrhs=2), input=_input(tmp_path, a),
                       backend="gpu")
    attrs = _check_subtree_run(a, *run_config(tmp_path, cfg, nprocs=nranks))
    assert min(attrs["chol_rank_peak_bytes"]) > 0
    # auto reads the blocks through CUDA IPC on one node (every rank of a test is on one)
    assert attrs["chol_subtree_exchange"] == params.get("subtree_exchange", "ipc")
    assert attrs["chol_top_exchanges"] >= 1
    assert attrs["chol_solve_schedule"] == params.get("solve_schedule", "flow")
    if "refinement" in params:
        assert attrs["chol_refinement_steps"] == 1


@pytest.mark.gpu
def test_gpu_subtree_falls_back_to_the_host_where_ipc_cannot_map(tmp_path):
    """Where one rank cannot map the others' memory through CUDA IPC (injected on rank 1, as
    GPUs without peer access refuse it), every rank falls back to staging the blocks through
    the host, says so, and the answer is still right."""
    a = generators.poisson([16, 15, 14]).to_scipy()
    cfg = write_config(tmp_path, "cholesky", {"nrhs": 2}, input=_input(tmp_path, a),
                       backend="gpu", debug={"fail_rank": 1, "fail_phase": "ipc"})
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    attrs = _check_subtree_run(a, *read_run(results_in(tmp_path / "out")))
    assert attrs["chol_subtree_exchange"] == "host"
    assert "could not be mapped through CUDA IPC (rank 1" in proc.stderr


def test_single_strategy_on_two_ranks_warns_that_one_idles(tmp_path):
    a = generators.poisson([12, 12]).to_scipy()
    cfg = write_config(tmp_path, "cholesky", {}, input=_input(tmp_path, a), backend="cpu",
                       partition={"strategy": "single"})
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "leaves ranks [1] idle" in proc.stderr


def test_plan_job_prints_every_rank_and_their_shares(tmp_path):
    """jobs/cholesky_plan.py (will a factorization fit on P GPUs): a line per rank whose flop
    shares add up to the whole, and the 1-rank panels those of the analysis (``auto`` of the
    Laplacian, whose grid the script knows: the grid's planes)."""
    import re
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "jobs" / "cholesky_plan.py"
    proc = subprocess.run([sys.executable, str(script), "30,28,26", "1", "3", "--pieces", "16"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shares = [float(s) for s in re.findall(r"flops [0-9.e+]+ \(([0-9.]+)%\)", proc.stdout)]
    assert len(shares) == 3 and sum(shares) == pytest.approx(100.0, abs=0.2)
    sym = analyze(generators.poisson([30, 28, 26]).to_scipy(), relaxation="cholmod",
                  grid=[30, 28, 26])
    assert sym.stats["ordering"] == "geometric"
    panels = re.search(r"rank 0: panels ([0-9.e+-]+) GB", proc.stdout).group(1)
    assert float(panels) == pytest.approx(sym.panel_offset[-1] * 8 / 1e9, rel=1e-3)


def test_only_heavy_dense_chains_are_cut_into_pieces():
    """cut_top_separators cuts a supernode into equal pieces of at most ``width`` columns only
    when its subtree holds more than 1/P of the work, it is wider than ``width`` and it is a
    chain; one rank or width 0 leave the boundaries as they are."""
    from hisparse.ops.cholesky.supernodes import cut_top_separators
    # columns 0-1 and 2-3 are two leaves, 4-11 a chain (a dense separator) above both
    parent = np.array([1, 4, 3, 4, 5, 6, 7, 8, 9, 10, 11, -1])
    counts = np.array([9, 8, 9, 8, 8, 7, 6, 5, 4, 3, 2, 1])
    starts = np.array([0, 2, 4, 12])
    np.testing.assert_array_equal(cut_top_separators(starts, parent, counts, 2, 3),
                                  [0, 2, 4, 6, 9, 12])  # 8 columns: 3 pieces of 2, 3, 3
    np.testing.assert_array_equal(cut_top_separators(starts, parent, counts, 2, 8), starts)
    np.testing.assert_array_equal(cut_top_separators(starts, parent, counts, 1, 3), starts)
    np.testing.assert_array_equal(cut_top_separators(starts, parent, counts, 2, 0), starts)
    # not a chain (column 6's parent is not column 7): left whole
    broken = parent.copy()
    broken[6] = 11
    np.testing.assert_array_equal(cut_top_separators(starts, broken, counts, 2, 3), starts)
    # a leaf holding more than 1/P of the work is cut too when it is a wide chain
    heavy = np.array([0, 8, 12])
    chain = np.append(np.arange(1, 12), -1)
    np.testing.assert_array_equal(cut_top_separators(heavy, chain, counts, 2, 4),
                                  [0, 4, 8, 12])


@pytest.mark.parametrize("width", [4, 8])
def test_update_groups_are_the_plan_targets(width):
    """update_groups splits a held supernode's below rows by the held supernode they lie in, and
    TopUpdates hands each group out once, at its target."""
    from hisparse.ops.cholesky.rank_plan import update_groups
    a = MATRICES["laplacian3d"]()
    sym = analyze(a, nranks=3, top_piece_columns=width)
    mapping = subtree_mapping(sym, 3)
    for rank in range(3):
        plan, _ = local_plan(sym, mapping, rank)
        updates = TopUpdates(plan)
        for i in range(plan.nsuper):
            below = plan.supernode_rows(i)[int(plan.ncols[i]):]
            groups = update_groups(plan, i)
            assert sum(r1 - r0 for _, r0, r1 in groups) == len(below)
            for target, r0, r1 in groups:
                first = plan.first[target]
                assert ((below[r0:r1] >= first)
                        & (below[r0:r1] < first + plan.ncols[target])).all()
            assert [t for t, _, _ in groups] == sorted({t for t, _, _ in groups})
            updates.factored(i)
        handed = sum(len(updates.due(t)) for t in range(plan.nsuper))
        assert handed == sum(len(update_groups(plan, i)) for i in range(plan.nsuper))
        assert not updates.pending


@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_rank_residual_rows_are_the_whole_residual(nprocs):
    """Every rank's rows of b - A x (its own rows of P A P^T, the entries of x its rows reach
    fetched from the other ranks) equal the rows of the residual made from the whole x, and the
    backward error agreed by the ranks is the whole one: for the subtree mapping's columns and
    for columns dealt round robin (rows that reach every rank)."""
    from hisparse.ops.cholesky.reference import residual_error
    from hisparse.ops.cholesky.residual import RankResidual, rank_rows
    from hisparse.parallel import get_world
    comm = get_world()
    ok = True
    for name in ("laplacian3d", "irregular"):
        a = sp.csr_matrix(MATRICES[name]())
        n = a.shape[0]
        sym = analyze(a, nranks=comm.size)
        rng = np.random.default_rng(5)
        x, b = rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
        whole_r, whole_error = residual_error(a, x, b)
        owned_by = {"subtree": local_plan(sym, subtree_mapping(sym, comm.size),
                                          comm.rank)[0].owned_columns,
                    "round robin": np.arange(comm.rank, n, comm.size)}
        for owned in owned_by.values():
            original = sym.perm[owned]  # the permuted columns' rows of A
            residual = RankResidual(comm, rank_rows(a, sym.perm, sym.iperm, owned), owned, n,
                                    b[original])
            r, error = residual(x[original])
            ok = ok and np.allclose(r, whole_r[original], rtol=1e-13, atol=1e-13)
            ok = ok and error == pytest.approx(whole_error, rel=1e-12)
            ok = ok and residual.ghosts > 0
    assert all(comm.allgather(bool(ok)))


@pytest.mark.parametrize("nranks", [1, 3, 4])
def test_deal_is_longest_first_to_the_least_loaded_rank(nranks):
    """Every item, heaviest first, goes to the least loaded rank (the lowest numbered among
    equal loads), ties among the weights included: what an argmin over the loads per item
    gives."""
    from hisparse.ops.cholesky.mapping import _deal
    rng = np.random.default_rng(8)
    for weights in (rng.pareto(1.5, 2000), np.round(5 * rng.random(300)), np.ones(9)):
        rank, load = _deal(weights, nranks)
        expected_load = np.zeros(nranks)
        for item in np.argsort(-weights, kind="stable"):
            r = int(np.argmin(expected_load))
            assert rank[item] == r
            expected_load[r] += weights[item]
        np.testing.assert_array_equal(load, expected_load)


@pytest.mark.parametrize("max_slices", [rank_plan.MAX_RUN_SLICES, 0])
def test_runs_taken_as_slices_equal_the_gather_by_index(monkeypatch, max_slices):
    """A rank's runs of the plan's arrays copied as merged slices (or, past the slice limit,
    gathered by index) against NumPy's gather of the concatenated aranges."""
    monkeypatch.setattr(rank_plan, "MAX_RUN_SLICES", max_slices)
    rng = np.random.default_rng(3)
    array = rng.integers(-50, 50, 400).astype(np.int32)
    lengths = rng.integers(0, 9, 60)
    touching = np.concatenate([[0], np.cumsum(lengths)[:-1]])  # each run begins at the last end
    scattered = rng.integers(0, 390, 60)  # any order, overlapping, some empty
    for starts in (touching, scattered, touching[::-1].copy()):
        ends = np.minimum(starts + lengths, len(array))
        expected = np.concatenate([array[a:b] for a, b in zip(starts, ends)])
        taken = rank_plan._take_runs(array, starts, ends)
        assert taken.dtype == array.dtype and np.array_equal(taken, expected)
    assert len(rank_plan._take_runs(array, np.array([5]), np.array([5]))) == 0


@pytest.mark.parametrize("nranks", [2, 3])
def test_entries_grouped_by_owner_are_each_ranks_entries_in_order(nranks):
    """Each rank's entries of A, from the pattern an analysis without the numeric plan keeps,
    are those of the whole plan whose supernode it owns, in the whole plan's order, with the
    same indices into A's data; their rows and columns, where the whole plan's map puts them,
    are entries of the permuted lower triangle holding that value; and a rank's own pass over
    its own copy of A (own_lower_entries) gives the same arrays."""
    a = sp.csr_matrix(MATRICES["laplacian3d"]())
    sym = analyze(a, nranks=nranks)
    shell = analyze(a, nranks=nranks, complete=False)
    assert shell.a_dest is None and shell.rel is None and shell.positions is not None
    assert np.array_equal(shell.rows, sym.rows) and np.array_equal(shell.perm, sym.perm)
    smap = subtree_mapping(sym, nranks)
    from_pattern = LowerEntries.of_factor(shell, smap)
    from_plan = LowerEntries.of_factor(sym, smap)
    supernode = entry_supernodes(sym)
    lower = sp.tril(a[sym.perm][:, sym.perm]).tocoo()
    value_at = {(int(r), int(c)): v for r, c, v in zip(lower.row, lower.col, lower.data)}
    seen = 0
    own_copy = position_arrays(sorted_positions(sp.csr_matrix(a)))  # a rank's own copy of A
    for rank in range(nranks):
        rows, cols, source = from_pattern.of(rank)
        expected = np.flatnonzero(smap.owner[supernode] == rank)
        assert np.array_equal(source, sym.a_source[expected])
        for got, want in zip((rows, cols, source), from_plan.of(rank)):
            assert np.array_equal(got, want)
        owned = plan_structure(shell, smap, rank).owned_columns
        for got, want in zip(own_lower_entries(own_copy, sym.iperm, owned), (rows, cols, source)):
            assert np.array_equal(got, want) and got.dtype == want.dtype
        assert all(value_at[(int(r), int(c))] == a.data[k] for r, c, k in zip(rows, cols, source))
        seen += len(rows)
    assert seen == len(supernode) == lower.nnz


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_each_ranks_completed_plan_is_its_share_of_the_whole_plan(name, nranks):
    """A rank completes its own plan from its structure and its entries of A: A's values land
    in its panels where the whole plan (made by rank 0 for every rank before) puts them, and
    every below row's target column and relative indices are its target's; from the pattern
    an analysis without the numeric plan keeps or from the whole plan, the same arrays."""
    a = sp.csr_matrix(MATRICES[name]())
    sym = analyze(a, nranks=nranks)
    shell = analyze(a, nranks=nranks, complete=False)
    smap = subtree_mapping(sym, nranks)
    whole = np.zeros(sym.panel_offset[-1])
    whole[sym.a_dest] = a.data[sym.a_source]
    sn_of = np.repeat(np.arange(sym.nsuper), np.diff(sym.starts))
    for rank in range(nranks):
        plan, source = local_plan(shell, smap, rank)
        again, again_source = local_plan(sym, smap, rank)
        assert np.array_equal(source, again_source)
        for field in vars(plan):
            assert np.array_equal(getattr(plan, field), getattr(again, field)), field
        assert np.array_equal(plan.rows, np.concatenate(
            [sym.rows[sym.rows_offset[s]:sym.rows_offset[s + 1]] for s in plan.supernodes]))
        mine = np.zeros(plan.panel_offset[-1])
        mine[plan.a_dest] = a.data[source]
        loc = {int(s): i for i, s in enumerate(plan.supernodes)}
        for i, s in enumerate(plan.supernodes.tolist()):
            # A's entries in the panels the rank owns; none in a top panel it only holds
            lo, hi = plan.panel_offset[i], plan.panel_offset[i + 1]
            owned = smap.owner[s] == rank
            expected = whole[sym.panel_offset[s]:sym.panel_offset[s + 1]] if owned else 0.0
            assert np.array_equal(mine[lo:hi], np.broadcast_to(expected, (hi - lo,)))
            below = plan.supernode_rows(i)[plan.ncols[i]:]
            for q in range(len(below)):
                t = loc[int(sn_of[below[q]])]
                at = plan.below_offset[i] + q
                assert plan.col_base[at] == plan.panel_offset[t] + \
                    (below[q] - plan.first[t]) * plan.nrows[t]
                target_rows = plan.supernode_rows(t).tolist()
                # rel[col_rel[r] + i]: below row i >= r of s in the column of row r's target
                rel = plan.rel[plan.col_rel[at] + q:plan.col_rel[at] + len(below)]
                assert rel.tolist() == [target_rows.index(r) for r in below[q:]]

def test_rank_rows_are_the_permuted_matrix_rows():
    """A rank's rows of P A P^T (the residual's), copied row by row, are SciPy's row selection
    with its columns renamed: the same order, values and index type (int32 here)."""
    from hisparse.ops.cholesky.residual import rank_rows
    a = sp.csr_matrix(MATRICES["irregular"]())
    rng = np.random.default_rng(3)
    perm = rng.permutation(a.shape[0])
    iperm = np.argsort(perm)
    for owned in (np.sort(rng.choice(a.shape[0], 123, replace=False)), np.arange(0),
                  np.arange(a.shape[0])):
        indptr, indices, data = rank_rows(a, perm, iperm, owned)
        expected = a[perm[owned]]
        assert indices.dtype == np.int32
        assert np.array_equal(indptr, expected.indptr)
        assert np.array_equal(indices, iperm[expected.indices])
        assert np.array_equal(data, expected.data)


@pytest.mark.parametrize("owned", [
    [], [5], [0, 1, 2, 3], [2, 3, 4, 9, 10, 14], [7, 8, 9, 1, 2, 3, 20]])
def test_owned_runs_place_each_row_at_its_column(owned):
    """The GPU subtree engine's runs of owned columns put right-hand-side row k at local column
    owned[k] and take it back from there, as the scatter and gather by index do; too many runs
    give None (then the engine scatters by index)."""
    from hisparse.ops.cholesky import schedule
    owned = np.asarray(owned, dtype=np.int64)
    rhs = np.arange(len(owned), dtype=float) + 1.0
    placed, taken = np.zeros(25), np.empty(len(owned))
    for first, place, count in schedule.owned_runs(owned):
        placed[place:place + count] = rhs[first:first + count]
        taken[first:first + count] = placed[place:place + count]
    expected = np.zeros(25)
    expected[owned] = rhs
    np.testing.assert_array_equal(placed, expected)
    np.testing.assert_array_equal(taken, rhs)
    scattered = np.arange(0, 4 * (schedule.MAX_OWNED_RUNS + 1), 2)
    assert schedule.owned_runs(scattered) is None


@pytest.mark.parallel(nprocs=[2])
def test_every_rank_loads_the_compiled_analysis_on_one_thread(monkeypatch, nprocs):
    """At several ranks every rank's load of the compiled analysis (rank 0's before its
    analysis, the others' beside it) runs on one thread (threads.at_most), rank 0's inside its
    work alone, and the threads come back for the analysis; the run is verified."""
    import tempfile
    from hisparse import driver, threads
    from hisparse.io import read_results
    from hisparse.ops.cholesky import op as cholesky_op
    from hisparse.parallel import get_world
    comm = get_world()
    seen = []
    warm_up = cholesky_op.warm_up

    def recording(nranks=1):
        seen.append((nranks, threads.usable_cores()))
        return warm_up(nranks)

    monkeypatch.setattr(cholesky_op, "warm_up", recording)
    root = comm.bcast(tempfile.mkdtemp(prefix="hisparse-warm-up-") if comm.rank == 0 else None)
    config = os.path.join(root, f"run{comm.rank}.yaml")
    with open(config, "w") as out:
        out.write("operation: {name: cholesky}\n"
                  "input: {generate: {kind: poisson, dims: [12, 12]}}\n"
                  f"backend: cpu\npartition: {{strategy: subtree}}\noutput: {{dir: {root}}}\n"
                  "run: {repeats: 1}\n")
    comm.Barrier()
    driver.run(config, comm=comm)
    assert seen == [(2 if comm.rank == 0 else 1, 1)]
    assert not threads._caps
    if comm.rank == 0:
        results = [name for name in os.listdir(root) if name.endswith(".h5")]
        assert len(results) == 1
        assert read_results(os.path.join(root, results[0]))["attrs"]["verify_passed"]
