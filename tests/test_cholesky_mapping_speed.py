"""The subtree mapping's compiled cut search (``mapping._grow_top``, ``_cut``, ``_assign``)
against the pure-Python search it replaced, kept here as the reference: every field of the
:class:`SubtreeMap` the same to the last bit (the estimates, which pick the cut, included),
compiled and as plain Python (what runs without Numba)."""
import heapq

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.ops.cholesky import mapping, supernodes
from hisparse.ops.cholesky.mapping import (CUT_TOLERANCE, MAX_TOP_PER_RANK, OWNER_RULES,
                                           SubtreeMap, subtree_mapping)
from hisparse.ops.cholesky.rank_plan import _row_groups
from hisparse.ops.cholesky.supernodes import subtree_work
from hisparse.ops.cholesky.symbolic import TOP_PIECE_COLUMNS, analyze


# -- the reference: the mapping before its cut search was compiled ----------------------------
def _reference_supernode_flops(sym):
    squares = sym.counts.astype(np.float64) ** 2
    cumulative = np.concatenate([[0.0], np.cumsum(squares)])
    return cumulative[sym.starts[1:]] - cumulative[sym.starts[:-1]]


def _reference_deal(weights, nranks):
    heap = [(0.0, r) for r in range(nranks)]
    rank = np.empty(len(weights), dtype=np.int64)
    order = np.argsort(-weights, kind="stable")
    for item, weight in zip(order.tolist(), np.asarray(weights, np.float64)[order].tolist()):
        load, r = heap[0]
        rank[item] = r
        heapq.heapreplace(heap, (load + weight, r))
    load = np.zeros(nranks)
    for total, r in heap:
        load[r] = total
    return rank, load


def _reference_top_costs(sym, s, work):
    nc = int(sym.starts[s + 1] - sym.starts[s])
    m = int(sym.nrows[s]) - nc
    target, begin, end = _row_groups(sym.starts, sym.rows[sym.rows_offset[s] + nc:
                                                          sym.rows_offset[s + 1]])
    length = end - begin
    update = nc * length * (2.0 * (m - begin) - length)
    factor = nc ** 3 / 3.0 + float(nc) * nc * m
    scale = work / max(factor + update.sum(), 1.0)
    return factor * scale, dict(zip(target.tolist(), (update * scale).tolist()))


class _ReferenceTopCosts(dict):
    def __init__(self, sym, work):
        super().__init__()
        self.sym, self.work = sym, work

    def __missing__(self, s):
        if self.sym is None:
            cost = self[s] = (float(self.work[s]), {})
        else:
            cost = self[s] = _reference_top_costs(self.sym, s, float(self.work[s]))
        return cost


def _reference_assign(top, roots, kids, subtree, work, nranks, costs, owner=None, rule="load"):
    root_rank, load = _reference_deal(subtree[roots], nranks)
    if owner is not None:
        root_rank = owner[roots]
        load = np.bincount(root_rank, weights=subtree[roots], minlength=nranks)
    rank_of = dict(zip(roots.tolist(), root_rank.tolist()))
    free = load.copy()
    top_rank, holders = {}, {}
    pending = [{} for _ in range(nranks)]
    for t in top.tolist():
        held = set()
        for k in kids[t]:
            held |= holders[k] if k in holders else {rank_of[k]}
        for q in held:
            free[q] += pending[q].pop(t, 0.0)
        ready = max(free[q] for q in held)
        if owner is not None:
            r = int(owner[t])
        elif rule == "load":
            r = min(held, key=lambda q: (max(ready, free[q]), load[q], q))
        else:
            r = min(held, key=lambda q: (max(ready, free[q]) + sum(pending[q].values()),
                                         load[q], q))
        factor, updates = costs[t]
        free[r] = max(ready, free[r]) + factor
        load[r] += work[t]
        for target, cost in updates.items():
            pending[r][target] = pending[r].get(target, 0.0) + cost
        top_rank[t] = r
        holders[t] = held | {r}
    return root_rank, top_rank, holders, float(free.max())


def _reference_cut(sparent, subtree, work, nranks, costs):
    ns = len(sparent)
    nchild = np.bincount(sparent[sparent >= 0], minlength=ns)
    children = np.argsort(sparent, kind="stable")
    children = children[sparent[children] >= 0]
    bounds = np.concatenate([[0], np.cumsum(nchild)])
    candidates = list(np.flatnonzero(sparent < 0))
    top, kids = [], {}
    tried = []
    while candidates:
        if len(candidates) >= nranks:
            for rule in OWNER_RULES:
                _, _, _, makespan = _reference_assign(
                    np.array(sorted(top), dtype=np.int64), np.array(candidates, dtype=np.int64),
                    kids, subtree, work, nranks, costs, rule=rule)
                tried.append((makespan, list(top), list(candidates), rule))
            if len(top) >= MAX_TOP_PER_RANK * nranks:
                break
        weights = subtree[candidates]
        heaviest = int(np.argmax(weights))
        s = int(candidates[heaviest])
        if nchild[s] == 0:
            break
        candidates.pop(heaviest)
        top.append(s)
        kids[s] = [int(c) for c in children[bounds[s]:bounds[s + 1]]]
        candidates.extend(kids[s])
    rule = OWNER_RULES[0]
    if tried:
        least = min(t[0] for t in tried)
        _, top, candidates, rule = next(t for t in tried if t[0] <= CUT_TOLERANCE * least)
    top = np.array(sorted(top), dtype=np.int64)
    return (top, np.array(sorted(candidates), dtype=np.int64),
            {t: kids[t] for t in top.tolist()}, rule)


def _reference_chains(sparent, top, owner, holders, one_owner=True):
    nchild = np.bincount(sparent[sparent >= 0], minlength=len(sparent))
    chains = []
    for k, t in enumerate(top):
        if (chains and top[k - 1] + 1 == t and sparent[top[k - 1]] == t and nchild[t] == 1
                and (owner[t] == owner[top[k - 1]] or not one_owner)
                and np.array_equal(holders[k], holders[k - 1])):
            chains[-1][1] = k
        else:
            chains.append([k, k])
    return np.array(chains, dtype=np.int64).reshape(-1, 2)


def _reference_first_descendant(sparent):
    first = np.arange(len(sparent))
    for s in range(len(sparent)):
        p = sparent[s]
        if p >= 0 and first[s] < first[p]:
            first[p] = first[s]
    return first


def _reference_mapping(sym, nranks):
    ns = sym.nsuper
    sparent = sym.sparent.astype(np.int64)
    work = _reference_supernode_flops(sym)
    subtree = subtree_work(work, sparent)
    costs = _ReferenceTopCosts(sym, work)
    top, roots, kids, rule = _reference_cut(sparent, subtree, work, nranks, costs)
    root_rank, top_rank, held, makespan = _reference_assign(top, roots, kids, subtree, work,
                                                            nranks, costs, rule=rule)
    owner = np.full(ns, -1, dtype=np.int64)
    first = _reference_first_descendant(sparent)
    for c, r in zip(roots, root_rank):
        owner[first[c]:c + 1] = r
    for t in top.tolist():
        owner[t] = top_rank[t]
    holders = [np.array(sorted(held[t]), dtype=np.int64) for t in top.tolist()]
    rank_flops = np.bincount(owner, weights=work, minlength=nranks)
    return SubtreeMap(nranks=nranks, owner=owner, top=top, roots=roots, holders=holders,
                      rank_flops=rank_flops,
                      chains=_reference_chains(sparent, top, owner, holders),
                      solve_chains=_reference_chains(sparent, top, owner, holders,
                                                     one_owner=False),
                      makespan=makespan)


def _reference_makespan(sparent, top, owner, work, nranks):
    is_top = np.zeros(len(sparent), dtype=bool)
    is_top[top] = True
    kids = {t: np.flatnonzero(sparent == t).tolist() for t in top.tolist()}
    roots = np.array(sorted(k for t in top.tolist() for k in kids[t] if not is_top[k])
                     + np.flatnonzero((sparent < 0) & ~is_top).tolist(), dtype=np.int64)
    subtree = subtree_work(work, sparent.astype(np.int64))
    return _reference_assign(top, roots, kids, subtree, work, nranks,
                             _ReferenceTopCosts(None, work), owner)[3]


# -- the cases --------------------------------------------------------------------------------
def _random_spd_pattern(n, density, seed):
    """A random symmetric pattern with its diagonal (the values do not matter here)."""
    a = sp.random(n, n, density=density, random_state=seed, format="csr")
    return sp.csr_matrix(a + a.T + sp.identity(n))


def _rmat_laplacian(scale, seed):
    """A shifted graph Laplacian of an R-MAT graph: an irregular tree with fat separators."""
    graph = generators.rmat(scale, 8, seed=seed).to_scipy()
    graph = sp.csr_matrix(abs(graph) + abs(graph).T)
    graph.setdiag(0)
    graph.eliminate_zeros()
    graph.data[:] = -1.0
    degree = -np.asarray(graph.sum(axis=1)).ravel()
    return sp.csr_matrix(graph + sp.diags(degree + 1.0))


def _poisson(*shape):
    return lambda: generators.poisson(list(shape)).to_scipy()


#: matrix, and the width of the pieces the top separators are cut into: narrow pieces make
#: long chains in the top, many updates pending and the lookahead rule's turn
CASES = {
    "grid30": (_poisson(30, 30), TOP_PIECE_COLUMNS),
    "grid47x31": (_poisson(47, 31), TOP_PIECE_COLUMNS),
    "grid60-pieces": (_poisson(60, 60), 8),
    "cube9": (_poisson(9, 9, 9), TOP_PIECE_COLUMNS),
    "cube12x11x10": (_poisson(12, 11, 10), TOP_PIECE_COLUMNS),
    "cube16-pieces": (_poisson(16, 16, 16), 16),
    "cube18x17x16-pieces": (_poisson(18, 17, 16), 12),
    "random": (lambda: _random_spd_pattern(400, 0.008, 5), TOP_PIECE_COLUMNS),
    "rmat": (lambda: _rmat_laplacian(9, 2), TOP_PIECE_COLUMNS),  # many components
}
ORDERINGS = ["dissection", "metis", "rcm"]
NRANKS = [2, 3, 4, 5, 8, 16]

_SYMBOLIC = {}


def _sym(case, ordering, nranks):
    key = (case, ordering, nranks)
    if key not in _SYMBOLIC:
        if ordering == "metis":
            pytest.importorskip("pymetis")
        matrix, width = CASES[case]
        _SYMBOLIC[key] = analyze(sp.csr_matrix(matrix()), ordering=ordering, nranks=nranks,
                                 split=0, top_piece_columns=width)
    return _SYMBOLIC[key]


def _assert_same_mapping(got, expected):
    assert got.nranks == expected.nranks
    for name in ("owner", "top", "roots", "rank_flops", "chains", "solve_chains"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert len(got.holders) == len(expected.holders)
    for a, b in zip(got.holders, expected.holders):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert got.makespan == expected.makespan  # to the last bit: it picked the cut


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_cut_search_maps_as_the_python_one(case, ordering):
    for nranks in NRANKS:
        sym = _sym(case, ordering, nranks)
        _assert_same_mapping(subtree_mapping(sym, nranks), _reference_mapping(sym, nranks))


def _without_numba(monkeypatch):
    """The mapping's compiled loops as plain Python, what runs without Numba (they call each
    other through the module)."""
    for name, function in list(vars(mapping).items()):
        if hasattr(function, "py_func"):
            monkeypatch.setattr(mapping, name, function.py_func)


# plain Python is slow: the smaller cases
PLAIN_PYTHON = [("grid30", "dissection", 3), ("cube16-pieces", "metis", 8),
                ("random", "metis", 5), ("rmat", "dissection", 16)]


@pytest.mark.parametrize("case,ordering,nranks", PLAIN_PYTHON)
def test_cut_search_without_numba_maps_as_the_python_one(monkeypatch, case, ordering, nranks):
    _without_numba(monkeypatch)
    sym = _sym(case, ordering, nranks)
    _assert_same_mapping(subtree_mapping(sym, nranks), _reference_mapping(sym, nranks))


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_makespan_of_a_given_mapping_is_the_python_ones(nranks):
    """:func:`mapping._makespan` (owners given, no plan) on random owners of real trees."""
    rng = np.random.default_rng(nranks)
    for case, ordering in (("grid60-pieces", "dissection"), ("cube16-pieces", "metis"),
                           ("random", "metis")):
        sym = _sym(case, ordering, nranks)
        smap = subtree_mapping(sym, nranks)
        sparent = sym.sparent.astype(np.int64)
        work = _reference_supernode_flops(sym)
        for owner in (smap.owner, rng.integers(0, nranks, sym.nsuper)):
            assert mapping._makespan(sparent, smap.top, owner, work, nranks) == \
                _reference_makespan(sparent, smap.top, owner, work, nranks)


def test_supernode_flops_are_the_cumulative_sums_differences():
    for case, ordering in (("grid30", "dissection"), ("cube12x11x10", "metis"),
                           ("rmat", "rcm")):
        sym = _sym(case, ordering, 4)
        expected = _reference_supernode_flops(sym)
        squares = supernodes._squares_at_starts.py_func(sym.counts, sym.starts)  # no Numba
        for flops in (mapping.supernode_flops(sym), squares[1:] - squares[:-1]):
            assert np.array_equal(flops, expected)


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("nranks", [1, 2, 3, 7])
def test_deal_is_the_heap_deal_it_replaced(monkeypatch, nranks, numba):
    if not numba:
        _without_numba(monkeypatch)
    rng = np.random.default_rng(nranks)
    for weights in (rng.pareto(1.5, 500), np.round(5 * rng.random(300)), np.ones(9),
                    np.zeros(0)):
        rank, load = mapping._deal(weights, nranks)
        expected_rank, expected_load = _reference_deal(weights, nranks)
        assert np.array_equal(rank, expected_rank)
        assert np.array_equal(load, expected_load)
