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
"""
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ... import threads
from ...arrays import inverse_permutation, sorted_distinct, with_sorted
from ...errors import HisparseError
from ...timing import StepClock

# The sequential loops below are compiled when Numba is there (see the module docstring).
from ...compiled import prange
from ...compiled import compiled as _compiled
from ...compiled import compiled_parallel as _compiled_parallel
from ...compiled import thread_count as _thread_count
from .ordering import (METIS_NITER, fill_reducing_order, level_set_dissection,
                       nested_dissection_balance, offdiagonal_pattern, resolve_ordering,
                       split_levels, start_ordering_pool)
from .ordering_file import OrderingFile, pattern_digest

RELAXATIONS = ("threshold", "cholmod", "none")

# Guard against plans whose relative indices would not fit in memory (int32 each, 16 GB at the
# limit; offsets into them are int64 on the host and the GPU). The 250^3 Laplacian needs 5.9e8.
_MAX_RELATIVE_INDICES = 4_000_000_000

# CHOLMOD's defaults (Utility/t_cholmod_defaults.c): nrelax and zrelax
_CHOLMOD_NRELAX = (4, 16, 48)
_CHOLMOD_ZRELAX = (0.8, 0.1, 0.05)


# -- compiled loops (see the module docstring) ---------------------------------------------
@_compiled
def _etree(indptr, indices, order, iorder):
    """Elimination tree of P A P^T (Liu, path compression onto the current column), reading the
    symmetric pattern ``(indptr, indices)`` of A through ``order`` (new -> old) and ``iorder``."""
    n = len(order)
    parent = np.full(n, -1, dtype=np.int64)
    ancestor = np.full(n, -1, dtype=np.int64)
    for k in range(n):
        _etree_column(indptr, indices, order, iorder, k, parent, ancestor)
    return parent


@_compiled
def _etree_column(indptr, indices, order, iorder, k, parent, ancestor):
    """:func:`_etree`'s step for column ``k``."""
    o = order[k]
    for p in range(indptr[o], indptr[o + 1]):
        i = iorder[indices[p]]
        # climb from i to the root of its current subtree, compressing the path onto k
        while i != -1 and i < k:
            nxt = ancestor[i]
            ancestor[i] = k
            if nxt == -1:
                parent[i] = k
            i = nxt


@_compiled_parallel
def _lowest_neighbours(indptr, indices, order, iorder, pieces):
    """For every column k of P A P^T, the smallest of k and its neighbours' columns (by
    ``pieces`` of the columns at once)."""
    n = len(order)
    lowest = np.empty(n, dtype=np.int64)
    for piece in prange(pieces):
        for k in range(piece * n // pieces, (piece + 1) * n // pieces):
            o = order[k]
            m = k
            for p in range(indptr[o], indptr[o + 1]):
                i = iorder[indices[p]]
                if i < m:
                    m = i
            lowest[k] = m
    return lowest


@_compiled
def _closed_runs(lowest, least):
    """Runs [start, stop) of columns none of which has a neighbour before ``start``
    (``lowest[k] >= start``), each cut where a column has no earlier neighbour once it is at
    least ``least`` long; and the columns in no run. A nested dissection's parts are such runs,
    its separators the rest."""
    n = len(lowest)
    starts = np.empty(n + 1, dtype=np.int64)
    stops = np.empty(n + 1, dtype=np.int64)
    rest = np.empty(n, dtype=np.int64)
    runs = left = 0
    start = -1  # the open run's first column (-1: none)
    for k in range(n):
        if start >= 0 and lowest[k] >= start and not (lowest[k] == k and k - start >= least):
            continue
        if start >= 0:
            starts[runs], stops[runs] = start, k
            runs += 1
            start = -1
        if lowest[k] == k:
            start = k
        else:
            rest[left] = k
            left += 1
    if start >= 0:
        starts[runs], stops[runs] = start, n
        runs += 1
    return starts[:runs].copy(), stops[:runs].copy(), rest[:left].copy()


@_compiled_parallel
def _etree_by_runs(indptr, indices, order, iorder, starts, stops, cuts, rest):
    """:func:`_etree`, the closed runs (:func:`_closed_runs`; the runs ``cuts[g]`` to
    ``cuts[g + 1]`` one group) at once, then the other columns in order. The same tree: a run's
    columns climb only through its own columns, and a later column only through columns before
    it, which are all done by then, as in :func:`_etree`'s order."""
    n = len(order)
    parent = np.full(n, -1, dtype=np.int64)
    ancestor = np.full(n, -1, dtype=np.int64)
    for group in prange(len(cuts) - 1):
        for run in range(cuts[group], cuts[group + 1]):
            for k in range(starts[run], stops[run]):
                _etree_column(indptr, indices, order, iorder, k, parent, ancestor)
    for c in range(len(rest)):
        _etree_column(indptr, indices, order, iorder, rest[c], parent, ancestor)
    return parent


#: Columns below which the elimination tree is found in one pass (:func:`_etree`), not by
#: closed runs at once (:func:`elimination_tree`).
PARALLEL_ETREE_MIN_COLUMNS = 200_000


def _runs_pieces(n):
    """The pieces the closed-run paths cut ``n`` columns' work into (:func:`_parallel_pieces`),
    or 0 where they are not taken: a small matrix, or one thread."""
    pieces = _parallel_pieces()
    return 0 if n < PARALLEL_ETREE_MIN_COLUMNS or pieces <= 4 else pieces


def _runs_of(indptr, indices, order, iorder, pieces):
    """The closed runs of P A P^T's columns (:func:`_closed_runs`, at least n / ``pieces``
    long where they can be cut) and the other columns: ``(starts, stops, cuts, rest)``, the
    runs ``cuts[g]`` to ``cuts[g + 1]`` one group of about equal columns."""
    n = len(order)
    starts, stops, rest = _closed_runs(
        _lowest_neighbours(indptr, indices, order, iorder, pieces), max(1, n // pieces))
    return starts, stops, _work_cuts(stops - starts, pieces), rest


def elimination_tree(indptr, indices, order, iorder):
    """:func:`_etree`, on every core for a large matrix: the runs of columns a nested dissection
    leaves closed (its parts, whose columns have no neighbour before the run) are independent,
    so they are climbed at once and the separators after them (the 120^3 Laplacian: 0.44 s in
    one pass on a 16-core host)."""
    pieces = _runs_pieces(len(order))
    if not pieces:
        return _etree(indptr, indices, order, iorder)
    return _etree_by_runs(indptr, indices, order, iorder,
                          *_runs_of(indptr, indices, order, iorder, pieces))


def postordered(order, parent):
    """The ordering ``order`` composed with the postorder of its elimination tree ``parent``:
    ``(perm, iperm, parent)`` of the postordered matrix."""
    post = _postorder(parent)
    perm, ipost = order[post], inverse_permutation(post)
    parent = np.where(parent[post] >= 0, ipost[np.maximum(parent[post], 0)], -1)
    return perm, inverse_permutation(perm), parent


@_compiled
def _postorder(parent):
    """Depth-first postorder of a forest; roots and children in increasing index order."""
    n = len(parent)
    head = np.full(n, -1, dtype=np.int64)
    sibling = np.full(n, -1, dtype=np.int64)
    for j in range(n - 1, -1, -1):  # prepend, so every child list ends up ascending
        p = parent[j]
        if p >= 0:
            sibling[j] = head[p]
            head[p] = j
    post = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int64)
    k = 0
    for root in range(n):
        if parent[root] >= 0:
            continue
        top = 0
        stack[0] = root
        while top >= 0:
            node = stack[top]
            child = head[node]
            if child == -1:
                top -= 1
                post[k] = node
                k += 1
            else:
                head[node] = sibling[child]  # the next visit of node takes its next child
                top += 1
                stack[top] = child
    return post


@_compiled
def _column_counts(indptr, indices, perm, iperm, parent):
    """Gilbert-Ng-Peyton column counts of the postordered P A P^T (row subtrees' leaves and
    least common ancestors with path compression), reading A through ``perm``/``iperm``."""
    n = len(parent)
    first, delta = _counts_start(parent)
    maxfirst = np.full(n, -1, dtype=np.int64)
    prevleaf = np.full(n, -1, dtype=np.int64)
    ancestor = np.arange(n)
    for j in range(n):
        _count_column(indptr, indices, perm, iperm, parent, first, j, delta, maxfirst, prevleaf,
                      ancestor)
    _sum_up(parent, delta)
    return delta


@_compiled
def _count_column(indptr, indices, perm, iperm, parent, first, j, delta, maxfirst, prevleaf,
                  ancestor):
    """:func:`_column_counts`' step for column ``j``: its rows below it whose subtree it is a
    leaf of, and the least common ancestors with their previous leaves."""
    if parent[j] >= 0:
        delta[parent[j]] -= 1
    fj = first[j]
    o = perm[j]
    for p in range(indptr[o], indptr[o + 1]):
        i = iperm[indices[p]]
        jprev = _row_leaf(maxfirst, prevleaf, i, fj, j) if i > j else -2
        if jprev == -2:
            continue  # not a leaf of row i's subtree
        delta[j] += 1
        if jprev != -1:
            # least common ancestor of jprev and j: root of jprev's current set
            delta[_set_root(ancestor, jprev)] -= 1
    if parent[j] >= 0:
        ancestor[j] = parent[j]


@_compiled
def _counts_start(parent):
    """The first descendant of every column of a postordered tree, and the counts' start (1 at
    the leaves)."""
    n = len(parent)
    size = np.ones(n, dtype=np.int64)
    for j in range(n):
        if parent[j] >= 0:
            size[parent[j]] += size[j]
    first = np.empty(n, dtype=np.int64)
    delta = np.zeros(n, dtype=np.int64)
    for j in range(n):
        first[j] = j - size[j] + 1
        if size[j] == 1:
            delta[j] = 1
    return first, delta


@_compiled
def _sum_up(parent, delta):
    """The counts from their differences: each column's summed into its parent, in postorder."""
    for j in range(len(parent)):
        if parent[j] >= 0:
            delta[parent[j]] += delta[j]


@_compiled
def _row_leaf(maxfirst, prevleaf, row, fj, j):
    """Column ``j`` (first descendant ``fj``) meets row ``row`` below it: -2 when ``j`` is not a
    leaf of the row's subtree (a column it has met already is ``j``'s descendant); else the
    row's previous leaf (-1: none), and the row's state moves on to ``j``."""
    if fj <= maxfirst[row]:
        return -2
    maxfirst[row] = fj
    previous = prevleaf[row]
    prevleaf[row] = j
    return previous


@_compiled
def _set_root(ancestor, x):
    """The root of ``x``'s set in :func:`_column_counts`' disjoint sets (its first ancestor not
    yet done), the path from ``x`` compressed onto it."""
    q = x
    while q != ancestor[q]:
        q = ancestor[q]
    while x != q:
        nxt = ancestor[x]
        ancestor[x] = q
        x = nxt
    return q


@_compiled
def _decrement(decrements, key):
    """``decrements[key] -= 1``, from 0 for a new key (a dictionary)."""
    if key in decrements:
        decrements[key] -= 1
    else:
        decrements[key] = -1


@_compiled_parallel
def _counts_by_runs(indptr, indices, perm, iperm, parent, starts, stops, cuts, rest):
    """:func:`_column_counts` on every core: the closed runs of the postordered columns
    (:func:`_closed_runs`: whole subtrees, whose rows above them are separator columns in
    ``rest``) at once, then the separator columns in order. The same counts:

    - a run's own rows are seen only by its columns, in the same order;
    - a separator row's first leaf in a run is a leaf whatever came before (earlier leaves and
      their first descendants lie before the run), and the leaves after it in the run are those
      of the one-pass order; the least common ancestor of two of them is the first ancestor not
      done at the later one, found here as there (the run's columns after it are not done, and
      nothing outside the run lies below its roots). Each run records, per separator row, its
      first and last leaf there (an event): the least common ancestor of the first with the
      row's previous leaf is found in order with the separator columns, when every column
      before it is done, as in the one pass;
    - a decrement that falls outside its run falls on a separator column that is a parent of
      one of the run's roots; it is kept per group and added at the end (the counts are sums).

    A group keeps state only for the separator rows its columns meet and its roots' parents
    (in dictionaries), so its memory is its boundary's, not the separator columns'."""
    n = len(parent)
    groups = len(cuts) - 1
    first, delta = _counts_start(parent)
    nrest = len(rest)
    maxfirst = np.full(n, -1, dtype=np.int64)
    prevleaf = np.full(n, -1, dtype=np.int64)
    ancestor = np.arange(n)
    # Per group: its columns' entries in separator rows (a bound on its events and on the rows
    # it keeps state for) and its runs' roots below a separator column (a bound on the columns
    # its decrements outside the runs fall on: a run's least common ancestors outside it are its
    # roots' parents).
    bound = np.zeros(groups + 1, dtype=np.int64)
    roots = np.zeros(groups + 1, dtype=np.int64)
    for g in prange(groups):
        entries = tops = 0
        for run in range(cuts[g], cuts[g + 1]):
            for j in range(starts[run], stops[run]):
                tops += parent[j] >= stops[run]
                o = perm[j]
                for p in range(indptr[o], indptr[o + 1]):
                    entries += iperm[indices[p]] >= stops[run]
        bound[g + 1], roots[g + 1] = entries, tops
    for g in range(groups):
        bound[g + 1] += bound[g]
        roots[g + 1] += roots[g]
    event_first = np.empty(bound[groups], dtype=np.int64)
    event_row = np.empty(bound[groups], dtype=np.int64)
    event_last = np.empty(bound[groups], dtype=np.int64)
    events = np.zeros(groups, dtype=np.int64)
    tops_of = np.zeros(roots[groups], dtype=np.int64)  # (column, decrement) pairs per group
    top_decrements = np.zeros(roots[groups], dtype=np.int64)
    for g in prange(groups):
        # a separator row's state in a run, kept only for the rows this group meets
        slot_of_row = dict()
        slot_of_row[-1] = -1  # (typed by its first entry; no row is -1)
        row_first = np.full(bound[g + 1] - bound[g], -1, dtype=np.int64)
        row_maxfirst = np.empty(bound[g + 1] - bound[g], dtype=np.int64)
        row_prev = np.empty(bound[g + 1] - bound[g], dtype=np.int64)
        row_of_slot = np.empty(bound[g + 1] - bound[g], dtype=np.int64)
        touched = np.empty(bound[g + 1] - bound[g], dtype=np.int64)
        decrement_of = dict()  # separator column -> its decrements from this group
        decrement_of[-1] = 0  # (typed by its first entry)
        made = 0
        for run in range(cuts[g], cuts[g + 1]):
            end = stops[run]
            seen = 0
            for j in range(starts[run], end):
                pj = parent[j]
                if pj >= 0:
                    if pj < end:
                        delta[pj] -= 1
                    else:
                        _decrement(decrement_of, pj)
                fj = first[j]
                o = perm[j]
                for p in range(indptr[o], indptr[o + 1]):
                    i = iperm[indices[p]]
                    if i <= j:
                        continue
                    if i < end:  # a row of this run: the one-pass step
                        jprev = _row_leaf(maxfirst, prevleaf, i, fj, j)
                    else:  # a separator row after the run
                        if i in slot_of_row:
                            r = slot_of_row[i]
                        else:
                            r = len(slot_of_row) - 1
                            slot_of_row[i] = r
                            row_of_slot[r] = i
                        if row_first[r] == -1:  # its first leaf here: settled in order later
                            row_first[r] = j
                            row_maxfirst[r] = fj
                            row_prev[r] = j
                            touched[seen] = r
                            seen += 1
                            delta[j] += 1
                            continue
                        jprev = _row_leaf(row_maxfirst, row_prev, r, fj, j)
                    if jprev == -2:
                        continue
                    delta[j] += 1
                    if jprev != -1:
                        q = _set_root(ancestor, jprev)
                        if q < end:
                            delta[q] -= 1
                        else:
                            _decrement(decrement_of, q)
                if pj >= 0:
                    ancestor[j] = pj
            for t in range(seen):
                r = touched[t]
                at = bound[g] + made
                event_first[at], event_row[at], event_last[at] = row_first[r], row_of_slot[r], \
                    row_prev[r]
                made += 1
                row_first[r] = -1
        events[g] = made
        t = roots[g]
        for q, decrement in decrement_of.items():
            if q >= 0:
                tops_of[t], top_decrements[t] = q, decrement
                t += 1
    # the separator columns and the runs' events, in column order
    total = 0
    for g in range(groups):
        total += events[g]
    keys = np.empty(total, dtype=np.int64)
    slots = np.empty(total, dtype=np.int64)
    k = 0
    for g in range(groups):
        for t in range(bound[g], bound[g] + events[g]):
            keys[k] = event_first[t]
            slots[k] = t
            k += 1
    slots = slots[np.argsort(keys, kind="mergesort")]
    e = 0
    for c in range(nrest + 1):
        k = rest[c] if c < nrest else n
        while e < total and event_first[slots[e]] < k:
            t = slots[e]
            i = event_row[t]
            if prevleaf[i] != -1:
                delta[_set_root(ancestor, prevleaf[i])] -= 1
            prevleaf[i] = event_last[t]
            maxfirst[i] = first[event_last[t]]
            e += 1
        if c == nrest:
            break
        _count_column(indptr, indices, perm, iperm, parent, first, k, delta, maxfirst, prevleaf,
                      ancestor)
    for t in range(roots[groups]):
        delta[tops_of[t]] += top_decrements[t]  # 0 += 0 past each group's columns
    _sum_up(parent, delta)
    return delta


def column_counts(indptr, indices, perm, iperm, parent):
    """:func:`_column_counts`, on every core for a large matrix whose order leaves closed runs
    of columns (a nested dissection's parts: :func:`_counts_by_runs`)."""
    n = len(parent)
    pieces = _runs_pieces(n)
    if pieces:
        starts, stops, cuts, rest = _runs_of(indptr, indices, perm, iperm, pieces)
        if (stops - starts).sum() >= RUNS_LEAST_SHARE * n:  # else little to do at once
            return _counts_by_runs(indptr, indices, perm, iperm, parent, starts, stops, cuts,
                                   rest)
    return _column_counts(indptr, indices, perm, iperm, parent)


#: The share of the columns closed runs must hold for :func:`column_counts` to take them (it
#: keeps a separator row's state per group of runs: the other columns' count apiece).
RUNS_LEAST_SHARE = 0.5


@_compiled
def _amalgamate(nscol, snz, sparent, rule, merge_threshold, nrelax, zrelax):
    """Relaxed amalgamation pass (see :func:`relaxed_supernodes`); ``rule`` 0 = threshold,
    1 = CHOLMOD. Returns whether each fundamental supernode starts a relaxed one."""
    nf = len(nscol)
    nscol = nscol.copy()
    snz = snz.copy()
    zeros = np.zeros(nf, dtype=np.float64)
    merged = np.full(nf, -1, dtype=np.int64)
    for j in range(nf - 2, -1, -1):
        ss = sparent[j]
        if ss < 0:
            continue
        root = ss
        while merged[root] != -1:
            root = merged[root]
        s = ss
        while merged[s] != -1:
            nxt = merged[s]
            merged[s] = root
            s = nxt
        if root != j + 1:
            continue
        nscol0 = nscol[j]
        nscol1 = nscol[j + 1]
        ns = nscol0 + nscol1
        lnz0 = snz[j]
        lnz1 = snz[j + 1]
        newzeros = nscol0 * (lnz1 + nscol0 - lnz0)
        totzeros = zeros[j + 1] + newzeros
        if rule == 0:
            merge = nscol0 < merge_threshold and nscol1 < merge_threshold
        elif ns <= nrelax[0] or newzeros == 0:
            merge = True
        else:
            z = totzeros / (ns * (ns + 1) / 2.0 + ns * (lnz1 - nscol1))
            merge = ((ns <= nrelax[1] and z < zrelax[0]) or (ns <= nrelax[2] and z < zrelax[1])
                     or z < zrelax[2])
        if merge:
            zeros[j] = totzeros
            merged[j + 1] = j
            snz[j] = nscol0 + lnz1
            nscol[j] = ns
    return merged == -1


@_compiled_parallel
def _supernode_rows(indptr, indices, perm, iperm, starts, sparent, counts, threads):
    """Row structure of every supernode (its own columns, then the sorted rows beyond them:
    A's entries below its columns and its children's rows beyond its last column), and the
    supernodes' etree levels (0 at leaves).

    Every column of a supernode descends from its last column l, so the rows beyond the
    supernode are those of column l of L: ``nrows = ncols + counts[l] - 1`` is known first,
    and the supernodes of one level (whose children are all below it) fill their slices in
    parallel, in up to ``threads`` pieces with their own marks."""
    ns = len(starts) - 1
    n = len(perm)
    head = np.full(ns, -1, dtype=np.int64)
    sibling = np.full(ns, -1, dtype=np.int64)
    level = np.zeros(ns, dtype=np.int64)
    for s in range(ns - 1, -1, -1):
        p = sparent[s]
        if p >= 0:
            sibling[s] = head[p]
            head[p] = s
    for s in range(ns):  # children come first in postorder
        p = sparent[s]
        if p >= 0 and level[s] + 1 > level[p]:
            level[p] = level[s] + 1
    nrows = np.empty(ns, dtype=np.int64)
    for s in range(ns):
        nrows[s] = starts[s + 1] - starts[s] + counts[starts[s + 1] - 1] - 1
    rows_offset = np.zeros(ns + 1, dtype=np.int64)
    for s in range(ns):
        rows_offset[s + 1] = rows_offset[s] + nrows[s]
    out = np.empty(rows_offset[ns], dtype=np.int64)
    levels = (level.max() + 1) if ns else 0
    by_level, level_start = _order_by_key(level, levels)
    mark = np.full((threads, n), -1, dtype=np.int32)
    for lev in range(levels):
        first = level_start[lev]
        count = level_start[lev + 1] - first
        pieces = min(threads, count // 64)  # the top of the tree: not worth the threads' start
        if pieces <= 1:
            for q in range(first, first + count):
                _fill_rows(by_level[q], indptr, indices, perm, iperm, starts, head, sibling,
                           rows_offset, out, mark[0])
            continue
        for piece in prange(pieces):
            begin = first + piece * count // pieces
            for q in range(begin, first + (piece + 1) * count // pieces):
                _fill_rows(by_level[q], indptr, indices, perm, iperm, starts, head, sibling,
                           rows_offset, out, mark[piece])
    return out, nrows, level


@_compiled
def _fill_rows(s, indptr, indices, perm, iperm, starts, head, sibling, rows_offset, out, mark):
    """The row list of supernode ``s`` into ``out[rows_offset[s]:rows_offset[s + 1]]`` (see
    :func:`_supernode_rows`); ``mark[i] == s`` once row i is in."""
    f = starts[s]
    l1 = starts[s + 1]
    pos = rows_offset[s]
    for c in range(f, l1):
        out[pos] = c
        pos += 1
    for c in range(f, l1):
        o = perm[c]
        for p in range(indptr[o], indptr[o + 1]):
            i = iperm[indices[p]]
            if i >= l1 and mark[i] != s:
                mark[i] = s
                out[pos] = i
                pos += 1
    child = head[s]
    while child != -1:
        for q in range(rows_offset[child], rows_offset[child + 1]):
            i = out[q]
            if i >= l1 and mark[i] != s:
                mark[i] = s
                out[pos] = i
                pos += 1
        child = sibling[child]
    out[rows_offset[s] + (l1 - f):pos].sort()


@_compiled
def _lower_bound(rows, lo, hi, r):
    """First position in ``rows[lo:hi]`` (ascending) whose value is not below ``r``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if rows[mid] < r:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_compiled_parallel
def _count_lower_by_part(indptr, indices, iperm, column_part, chunk_cuts, counts):
    """Entries (r, c), r >= c, of the permuted lower triangle in each chunk of A's rows
    (``chunk_cuts``) by the part of their column: ``counts[chunk, part]`` (a negative part:
    left out)."""
    for chunk in prange(len(chunk_cuts) - 1):
        for o in range(chunk_cuts[chunk], chunk_cuts[chunk + 1]):
            r = iperm[o]
            for p in range(indptr[o], indptr[o + 1]):
                c = iperm[indices[p]]
                if r >= c and column_part[c] >= 0:
                    counts[chunk, column_part[c]] += 1


@_compiled_parallel
def _place_lower_by_part(indptr, indices, source, iperm, column_part, chunk_cuts, place,
                         rows_out, cols_out, source_out):
    """Every entry (r, c), r >= c, of the permuted lower triangle to its part's group, in A's
    row order within it (``place[chunk, part]``: where the chunk's entries of the part begin):
    its row and column into ``rows_out`` and ``cols_out`` (whatever their integer type) and its
    index in the caller's data into ``source_out``."""
    for chunk in prange(len(chunk_cuts) - 1):
        for o in range(chunk_cuts[chunk], chunk_cuts[chunk + 1]):
            r = iperm[o]
            for p in range(indptr[o], indptr[o + 1]):
                c = iperm[indices[p]]
                if r < c:
                    continue
                part = column_part[c]
                if part < 0:
                    continue
                k = place[chunk, part]
                rows_out[k] = r
                cols_out[k] = c
                source_out[k] = source[p]
                place[chunk, part] = k + 1


@_compiled_parallel
def entry_offsets(entry_rows, entry_cols, sn_of, starts, nrows, panel_offset, rows,
                  rows_offset):
    """Offsets in the value array of the entries (``entry_rows[k]``, ``entry_cols[k]``), r >= c,
    of a plan whose supernode ``s`` (``sn_of``: every column's) has columns ``starts[s]:starts[s
    + 1]``, its panel at ``panel_offset[s]`` (leading dimension ``nrows[s]``) and its row list
    ``rows`` at ``rows_offset[s]``: row r is one of its own columns (position r - first) or a
    below row (one binary search in the sorted rest of its row list). In parallel."""
    out = np.empty(len(entry_rows), dtype=np.int64)
    for k in prange(len(entry_rows)):
        r, c = entry_rows[k], entry_cols[k]
        s = sn_of[c]
        first = starts[s]
        ncols = starts[s + 1] - first
        if r < first + ncols:
            at = r - first
        else:
            base = rows_offset[s]
            at = _lower_bound(rows, base + ncols, rows_offset[s + 1], r) - base
        out[k] = panel_offset[s] + (c - first) * nrows[s] + at
    return out


def lower_entries(positions, iperm, index_dtype=np.int64, column_part=None, nparts=1):
    """Every entry of the permuted lower triangle of A, grouped by the part of its column
    (``column_part``, parts ``0 .. nparts - 1``; None: one part), each group in the order of the
    assembly map (A's rows in order, each row's sorted entries): ``(rows, cols, source, cuts)``,
    rows and columns permuted (``index_dtype``), ``source`` the entry's index in the caller's
    CSR data, part p's entries at ``cuts[p]:cuts[p + 1]``; the entries of a column whose part
    is negative are left out (one rank's own share: its columns part 0, the others -1).
    ``positions``: :attr:`SymbolicFactor.positions` (:func:`position_arrays` of A's sorted
    pattern, its data those indices). Counted by chunk of rows and part, then placed, both
    passes on the host's threads: no sort, and no gather of the entries after it."""
    indptr, indices, source = positions
    n = len(indptr) - 1
    if column_part is None:
        column_part, nparts = np.zeros(n, dtype=np.int64), 1
    chunks = max(1, min(4 * _thread_count(), -(-len(indices) // (1 << 16))))
    chunk_cuts = np.searchsorted(indptr, np.linspace(0, len(indices), chunks + 1)).astype(
        np.int64)
    chunk_cuts[0], chunk_cuts[-1] = 0, n
    counts = np.zeros((chunks, nparts), dtype=np.int64)
    _count_lower_by_part(indptr, indices, iperm, column_part, chunk_cuts, counts)
    # place[c, p]: after the lower parts' entries and the earlier chunks' of part p
    flat = np.zeros(chunks * nparts + 1, dtype=np.int64)
    np.cumsum(counts.T.ravel(), out=flat[1:])
    place = np.ascontiguousarray(flat[:-1].reshape(nparts, chunks).T)
    cuts = np.append(flat[:-1:chunks], flat[-1]).astype(np.int64)
    total = int(flat[-1])
    rows = np.empty(total, dtype=index_dtype)
    cols = np.empty(total, dtype=index_dtype)
    sources = np.empty(total, dtype=np.int64)
    _place_lower_by_part(indptr, indices, source, iperm, column_part, chunk_cuts, place, rows,
                         cols, sources)
    return rows, cols, sources, cuts


@_compiled_parallel
def _update_groups(rows, rows_offset, nrows, ncols, sn_of, starts, panel_offset, below_offset):
    """The update groups of every supernode, in one parallel pass per step (the vectorised
    NumPy it replaces made a dozen passes over the row lists, single-threaded).

    Supernode s's below-diagonal rows (its row list after its ``ncols`` own columns, in order)
    are concatenated into ``below`` at ``below_offset[s]``; a group is a run of consecutive
    below rows of one supernode owned by one target supernode (``sn_of``). Returns ``below``,
    every group's first position in ``below``, its target and its length to the end of its
    supernode's below rows (``group_begin``, ``group_target``, ``group_lengths``: the rows a
    group's relative indices cover), where each group's relative indices start
    (``group_rel_start``, groups one after another), and per below row: ``col_base``, where its
    column of its target's panel starts (``panel_offset[t] + (row - starts[t]) * nrows[t]``),
    and ``col_rel``, where its column's relative indices start (its group's, offset back to the
    row's place in its supernode's below list)."""
    ns = len(nrows)
    groups = np.zeros(ns + 1, dtype=np.int64)
    for s in prange(ns):
        count = 0
        previous = -1
        for p in range(rows_offset[s] + ncols[s], rows_offset[s] + nrows[s]):
            t = sn_of[rows[p]]
            if t != previous:
                count += 1
                previous = t
        groups[s + 1] = count
    for s in range(ns):
        groups[s + 1] += groups[s]
    nb = below_offset[ns]
    below = np.empty(nb, dtype=rows.dtype)
    col_base = np.empty(nb, dtype=np.int64)
    group_begin = np.empty(groups[ns], dtype=np.int64)
    group_target = np.empty(groups[ns], dtype=np.int64)
    group_lengths = np.empty(groups[ns], dtype=np.int64)
    for s in prange(ns):
        first = rows_offset[s] + ncols[s]
        q = below_offset[s]
        g = groups[s]
        previous = -1
        for p in range(first, rows_offset[s] + nrows[s]):
            r = rows[p]
            t = sn_of[r]
            below[q] = r
            col_base[q] = panel_offset[t] + (r - starts[t]) * nrows[t]
            if t != previous:
                group_begin[g] = q
                group_target[g] = t
                group_lengths[g] = below_offset[s + 1] - q
                g += 1
                previous = t
            q += 1
    group_rel_start = np.empty(groups[ns], dtype=np.int64)
    done = 0
    for g in range(groups[ns]):
        group_rel_start[g] = done
        done += group_lengths[g]
    col_rel = np.empty(nb, dtype=np.int64)
    for s in prange(ns):
        for g in range(groups[s], groups[s + 1]):
            end = group_begin[g + 1] if g + 1 < groups[s + 1] else below_offset[s + 1]
            value = group_rel_start[g] - (group_begin[g] - below_offset[s])
            for q in range(group_begin[g], end):
                col_rel[q] = value
    return below, group_begin, group_target, group_lengths, group_rel_start, col_base, col_rel


@_compiled
def _order_by_key(key, nkeys):
    """Stable counting sort: the indices of ``key`` (values in [0, nkeys)) by increasing key,
    and where each key's run starts in them (``nkeys + 1`` bounds)."""
    bounds = np.zeros(nkeys + 1, dtype=np.int64)
    for k in range(len(key)):
        bounds[key[k] + 1] += 1
    for i in range(nkeys):
        bounds[i + 1] += bounds[i]
    fill = bounds[:nkeys].copy()
    order = np.empty(len(key), dtype=np.int64)
    for k in range(len(key)):
        order[fill[key[k]]] = k
        fill[key[k]] += 1
    return order, bounds


@_compiled_parallel
def _relative_indices(rows, rows_offset, below, group_begin, group_target, group_lengths,
                      group_rel_start, total, n, order, cuts):
    """``rel`` of every update group: the positions, in the target supernode's row list, of
    the source's below rows from the group's first row to the end of the source's list.

    The groups are visited by target (``order``, from :func:`_order_by_key`): a target's row
    list is spread once into a map row -> position, then every group's rows are looked up
    (every one is in the target's list, by the structure theorem). ``cuts`` split ``order``
    into pieces of about equal work, run in parallel, each with its own map."""
    rel = np.empty(total, dtype=np.int32)
    for piece in prange(len(cuts) - 1):
        where = np.empty(n, dtype=np.int32)
        current = -1
        for q in range(cuts[piece], cuts[piece + 1]):
            g = order[q]
            t = group_target[g]
            if t != current:
                base = rows_offset[t]
                for p in range(base, rows_offset[t + 1]):
                    where[rows[p]] = p - base
                current = t
            b = group_begin[g]
            out = group_rel_start[g]
            for k in range(group_lengths[g]):
                rel[out + k] = where[below[b + k]]
    return rel


def _work_cuts(work, pieces):
    """Boundaries splitting a sequence of items of ``work`` into about ``pieces`` contiguous
    pieces of equal total work."""
    if not len(work):
        return np.zeros(2, dtype=np.int64)
    done = np.cumsum(work)
    marks = np.searchsorted(done, np.linspace(0, done[-1], pieces + 1)[1:-1], side="right")
    return sorted_distinct(np.concatenate([[0], marks, [len(work)]])).astype(np.int64)


def _parallel_pieces():
    """Pieces a parallel loop's work is cut into: a few per thread, for balance."""
    return 4 * _thread_count()


def fundamental_supernodes(parent, counts):
    """Start column of every fundamental supernode (plus n at the end).

    Columns j-1 and j share a supernode iff ``parent[j-1] == j``, ``counts[j-1] == counts[j] + 1``
    and j has exactly one child.
    """
    n = len(parent)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    nchild = np.bincount(parent[parent >= 0], minlength=n)
    j = np.arange(1, n)
    joined = (parent[j - 1] == j) & (counts[j - 1] == counts[j] + 1) & (nchild[j] == 1)
    starts = np.concatenate([[0], j[~joined], [n]])
    return starts.astype(np.int64)


def relaxed_supernodes(starts, parent, counts, rule="threshold", merge_threshold=64):
    """Relaxed amalgamation of fundamental supernodes (merging a supernode into its parent when
    the parent is the next supernode in postorder).

    Parameters
    ----------
    starts : ndarray, shape (nf + 1,), int64
        Fundamental supernode boundaries.
    rule : {"threshold", "cholmod", "none"}
        ``threshold``: merge when both the child and the (already merged) parent have fewer than
        ``merge_threshold`` columns (the seed's/MA87's nemin rule). ``cholmod``: CHOLMOD's
        rules (merge when the merged node has <= 4 columns, adds no zeros, or keeps the fraction
        of explicit zeros under 0.8 / 0.1 / 0.05 for <= 16 / <= 48 / any columns).

    Returns
    -------
    ndarray, shape (ns + 1,), int64
        Relaxed supernode boundaries.
    """
    nf = len(starts) - 1
    if rule == "none" or nf <= 1:
        return starts.copy()
    keep = _amalgamate(np.diff(starts).astype(np.int64), counts[starts[:-1]].astype(np.int64),
                       _supernode_parents(starts, parent), 0 if rule == "threshold" else 1,
                       int(merge_threshold), np.array(_CHOLMOD_NRELAX, dtype=np.int64),
                       np.array(_CHOLMOD_ZRELAX, dtype=np.float64))
    return np.concatenate([starts[:-1][keep], starts[-1:]]).astype(np.int64)


def _supernode_tree(starts, parent, counts):
    """The supernodal tree of the boundaries ``starts`` over the column tree ``parent``: every
    supernode's parent (-1 at roots), the work of its subtree (CHOLMOD's sum of squared column
    counts) and the whole factor's work."""
    sparent = _supernode_parents(starts, parent)
    squares = _squares_at_starts(counts, starts)
    work = squares[1:] - squares[:-1]
    return sparent, subtree_work(work, sparent), float(squares[-1])


@_compiled
def _supernode_parents(starts, parent):
    """Every supernode's parent: the supernode of its last column's parent (-1 at roots), in
    one compiled pass (NumPy's column-to-supernode ``repeat``, gather and ``where`` made four
    over the columns)."""
    ns = len(starts) - 1
    sn_of = np.empty(starts[ns], dtype=np.int64)
    for s in range(ns):
        for column in range(starts[s], starts[s + 1]):
            sn_of[column] = s
    sparent = np.full(ns, -1, dtype=np.int64)
    for s in range(ns):
        column = parent[starts[s + 1] - 1]
        if column >= 0:
            sparent[s] = sn_of[column]
    return sparent


def supernode_work(counts, starts):
    """The work of every supernode of the boundaries ``starts``: the sum of its columns'
    squared counts (CHOLMOD's flop count; the subtree mapping's weights)."""
    squares = _squares_at_starts(counts, starts)
    return squares[1:] - squares[:-1]


@_compiled
def _squares_at_starts(counts, starts):
    """The running sum of the squared column counts at every boundary of ``starts``, in one
    pass: NumPy's ``cumsum`` of the squares made three over the columns and two arrays as long
    (13 ms on the 120^3 Laplacian, this 2). The sum goes column by column, as ``cumsum``'s
    does: the same works to the last bit."""
    at_start = np.empty(len(starts))
    running = 0.0
    column = 0
    for s in range(len(starts)):
        while column < starts[s]:
            square = float(counts[column])
            running += square * square
            column += 1
        at_start[s] = running
    return at_start


#: On several ranks, a supernode is not merged into its parent when its subtree holds at least
#: 1 / (TOP_SPLIT * ranks) of the factor's work: the separators near the top of a nested
#: dissection then stay apart, so the subtree mapping can give them to different ranks.
TOP_SPLIT = 8


def keep_top_boundaries(fund, starts, parent, counts, nranks):
    """The relaxed supernode boundaries ``starts`` plus every fundamental boundary where a
    supernode whose subtree holds at least 1 / (:data:`TOP_SPLIT` * ``nranks``) of the work
    (CHOLMOD's sum of squared column counts) was merged into a parent that has another such
    child.

    Relaxation merges a supernode into its parent when the parent comes next in postorder; near
    the top of a nested dissection that merges one of a separator's two child separators into it
    (120^3 Laplacian, METIS, ``cholmod``: a 24,058-column root holding 27 % of the flops), and
    one rank then factors what two could have factored at once. Cutting a relaxed supernode at
    a fundamental boundary leaves two relaxed supernodes (each still a chain of the tree).

    Parameters
    ----------
    fund : ndarray, shape (nf + 1,)   fundamental supernode boundaries
    starts : ndarray, shape (ns + 1,)  relaxed boundaries (a subset of ``fund``)
    parent : ndarray, shape (n,)       elimination tree (postordered)
    counts : ndarray, shape (n,)       column counts
    nranks : int

    Returns
    -------
    ndarray, int64
    """
    nf = len(fund) - 1
    if nf <= 1:
        return starts
    fparent, subtree, total = _supernode_tree(fund, parent, counts)
    heavy = subtree >= total / (TOP_SPLIT * nranks)
    # a fork: a parent with two heavy children, which a merge into it would serialize (a merge
    # along a chain, a separator's own pieces, serializes nothing)
    forks = np.bincount(fparent[heavy & (fparent >= 0)], minlength=nf) >= 2
    child = np.arange(nf - 1)
    cut = np.flatnonzero((fparent[child] == child + 1) & heavy[child] & forks[child + 1]) + 1
    if not len(cut):
        return starts
    # boundaries in fundamental ids; a relaxed supernode may hold siblings (a child merged into
    # a parent already merged with another child), so the part below a cut is cut again below
    # every member whose parent is not in its part: each part is then a chain of the tree
    group_start = np.searchsorted(fund, starts[:-1])
    below_cuts = []
    for top in cut.tolist():
        begin = int(group_start[np.searchsorted(group_start, top, side="right") - 1])
        end = top
        for m in range(top - 1, begin - 1, -1):
            if m < end - 1 and fparent[m] >= end:
                below_cuts.append(m + 1)
                end = m + 1
    bounds = with_sorted(np.append(group_start, nf),
                         np.concatenate([cut, np.array(below_cuts, dtype=np.int64)]))
    return fund[bounds].astype(np.int64, copy=False)


#: On several ranks, the separators near the top of the tree (a supernode whose subtree holds
#: more than 1 / ranks of the factor's work: one rank alone cannot take it) are cut into pieces
#: of at most this many columns, so the mapping can deal one separator's pieces to several
#: ranks (``operation.params.top_piece_columns``; 0: not cut).
TOP_PIECE_COLUMNS = 1024


def cut_top_separators(starts, parent, counts, nranks, width=TOP_PIECE_COLUMNS):
    """The relaxed supernode boundaries ``starts`` with every supernode near the top cut into
    pieces of at most ``width`` columns (equal widths).

    A supernode is cut when its subtree holds more than 1 / ``nranks`` of the work (CHOLMOD's
    sum of squared column counts), it has more than ``width`` columns and it is a chain (every
    column's parent the next column: a dense separator). Its pieces are a chain of supernodes,
    each the only child of the next; the subtree mapping gives them to different ranks, which
    then share the separator's factorization (:mod:`.mapping`). One rank, or ``width`` 0:
    ``starts`` unchanged.

    Parameters
    ----------
    starts : ndarray, shape (ns + 1,)  relaxed boundaries
    parent : ndarray, shape (n,)       elimination tree (postordered)
    counts : ndarray, shape (n,)       column counts
    nranks, width : int

    Returns
    -------
    ndarray, int64
    """
    ns = len(starts) - 1
    if nranks <= 1 or width <= 0 or ns == 0:
        return starts
    _, subtree, total = _supernode_tree(starts, parent, counts)
    ncols = np.diff(starts)
    bounds = []
    for s in np.flatnonzero((subtree > total / nranks) & (ncols > width)).tolist():
        first, end = int(starts[s]), int(starts[s + 1])
        # a chain: every column's parent the next one
        if np.array_equal(parent[first:end - 1], np.arange(first + 1, end)):
            pieces = -(-int(ncols[s]) // width)
            bounds.append(first + (np.arange(1, pieces) * int(ncols[s])) // pieces)
    if not bounds:
        return starts
    return with_sorted(np.asarray(starts, dtype=np.int64), np.concatenate(bounds))


@_compiled
def subtree_work(work, sparent):
    """Work of every supernode's subtree (children precede parents in postorder): the
    relaxation's guard and the subtree mapping's cut both weigh subtrees by it."""
    total = work.copy()
    for s in range(len(sparent)):
        if sparent[s] >= 0:
            total[sparent[s]] += total[s]
    return total


@dataclass
class SymbolicFactor:
    """The pattern of the supernodal factor and the plan of its numeric factorization.

    Attributes (n columns, ns supernodes; all int64 unless noted)
    ----------
    n : int
    perm : (n,)   new-to-old ordering (fill-reducing composed with the etree postorder)
    iperm : (n,)  old-to-new
    parent : (n,) elimination tree of the permuted matrix
    counts : (n,) column counts of the exact factor
    fundamental : int   number of fundamental supernodes
    starts : (ns + 1,)  first column of every supernode
    nrows : (ns,)       rows of every supernode's panel (its columns first, then the rest)
    panel_offset : (ns + 1,) offset of every panel in the value array (column-major panels,
        leading dimension nrows[s])
    rows_offset : (ns + 1,)  offset of every supernode's row list in ``rows``
    rows : (sum nrows,)      global (permuted) row indices of every panel
    sparent : (ns,)     parent supernode, -1 at roots
    level : (ns,)       0 at leaves, 1 + max over children otherwise
    below_offset : (ns + 1,) offset of every supernode's below-diagonal rows in ``col_base`` /
        ``col_rel`` (rows beyond its own columns, m_s = nrows - ncols of them)
    col_base : (sum m,)  for below row r of supernode s: offset in the value array of column
        ``rows[r]`` of the target supernode that owns it
    col_rel : (sum m,)   with it, ``rel[col_rel[r] + i]`` is the position, inside that target
        column, of below row i (i >= r) of s
    rel : int32 array    relative row positions
    a_source : (nnz lower,)  index into A's CSR data of every entry of the permuted lower triangle
    a_dest : (nnz lower,)    its offset in the value array
    diag_pos : (n,)     offset of every diagonal entry of L in the value array
    blocks : list of ndarray  column-block boundaries (relative) of every supernode
    ordering : str
    positions : (indptr, indices, source) or None
        A's sorted pattern, every entry's index in the caller's data: kept by an analysis that
        stops before the numeric plan (``complete=False``: ``below_offset``, ``col_base``,
        ``col_rel``, ``rel``, ``a_source``, ``a_dest`` and ``diag_pos`` are None), whose ranks
        complete their own shares (:func:`~.mapping.complete_plan`) from its
        :func:`lower_entries`
    """

    n: int
    perm: np.ndarray
    iperm: np.ndarray
    parent: np.ndarray
    counts: np.ndarray
    fundamental: int
    starts: np.ndarray
    nrows: np.ndarray
    panel_offset: np.ndarray
    rows_offset: np.ndarray
    rows: np.ndarray
    sparent: np.ndarray
    level: np.ndarray
    below_offset: np.ndarray
    col_base: np.ndarray
    col_rel: np.ndarray
    rel: np.ndarray
    a_source: np.ndarray
    a_dest: np.ndarray
    diag_pos: np.ndarray
    block_size: int
    ordering: str
    relaxation: str
    stats: dict = field(default_factory=dict)
    positions: tuple = None

    @property
    def nsuper(self):
        return len(self.starts) - 1

    @property
    def ncols(self):
        return np.diff(self.starts)

    @property
    def factor_nnz(self):
        """Exact nnz(L) of the factor with this ordering (no relaxation zeros)."""
        return int(self.counts.sum())

    @property
    def supernodal_nnz(self):
        """Stored lower-triangle entries including the zeros that relaxation adds."""
        nc = self.ncols
        return int((nc * self.nrows - nc * (nc - 1) // 2).sum())

    @property
    def flops(self):
        """Symbolic flop count of the factorization, sum of c_j^2 (CHOLMOD's convention)."""
        return float((self.counts.astype(np.float64) ** 2).sum())

    def supernode_rows(self, s):
        return self.rows[self.rows_offset[s]:self.rows_offset[s + 1]]

    def column_blocks(self, s):
        """Relative column boundaries splitting supernode ``s`` into blocks of <= block_size."""
        nc = int(self.starts[s + 1] - self.starts[s])
        return sorted_distinct(np.concatenate([np.arange(0, nc, self.block_size), [nc]]))




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
        :func:`~.ordering.grid_nested_dissection`).

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


def update_plan(rows, rows_offset, nrows, ncols, sn_of, starts, panel_offset, n):
    """Relative indices of every supernode's update into its ancestors: ``(below_offset,
    col_base, col_rel, rel)`` of :class:`SymbolicFactor`, for the supernodes whose columns are
    ``starts[s]:starts[s] + ncols[s]`` of ``n`` (``sn_of``: every column's supernode; every row
    of a list is a column of some supernode). The below-diagonal rows of s are grouped by the
    target supernode owning them; group g (rows g0..g1 of s's below list, target t) needs the
    positions in t of s's below rows g0..m (all of them lie in t by the structure theorem).
    The whole plan's (:func:`analyze`) or one rank's share (:func:`~.mapping.complete_plan`)."""
    ns = len(nrows)
    m = nrows - ncols
    below_offset = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    (below, group_begin, group_target, group_lengths, group_rel_start, col_base,
     col_rel) = _update_groups(rows, rows_offset, nrows, ncols, sn_of, starts, panel_offset,
                               below_offset)
    total = int(group_lengths.sum())
    if total > _MAX_RELATIVE_INDICES:
        raise HisparseError(
            f"cholesky: the relative-index plan needs {total:.2e} entries (> "
            f"{_MAX_RELATIVE_INDICES:.0e}); use operation.params.relaxation 'threshold' or "
            f"'cholmod' (fewer, larger supernodes)")
    by_target, _ = _order_by_key(group_target, ns)
    rel = _relative_indices(rows, rows_offset, below, group_begin, group_target, group_lengths,
                            group_rel_start, total, n, by_target,
                            _work_cuts(group_lengths[by_target], _parallel_pieces()))
    return below_offset, col_base, col_rel, rel


def sorted_positions(matrix):
    """A's pattern with sorted rows, its data every entry's index in ``matrix.data``: the order
    (and the source) of the assembly map's entries. Rows already sorted (what the readers and
    generators give): ``matrix``'s own index arrays, shared, not copied and checked again (the
    pattern is only read from here on)."""
    if matrix.has_sorted_indices:
        index = threads.arange_into(np.empty(matrix.nnz, dtype=np.int64))
        positions = sp.csr_matrix((index, matrix.indices,
                                   matrix.indptr), shape=matrix.shape, copy=False)
        positions.has_sorted_indices = True
        return positions
    positions = sp.csr_matrix((np.arange(matrix.nnz, dtype=np.int64),
                               matrix.indices.copy(), matrix.indptr.copy()),
                              shape=matrix.shape)
    positions.sort_indices()
    return positions


def position_arrays(positions):
    """``(indptr, indices, source)`` int64 of :func:`sorted_positions`' matrix: what
    :func:`lower_entries` reads (one compiled version of its passes)."""
    return (positions.indptr.astype(np.int64, copy=False),
            positions.indices.astype(np.int64, copy=False),
            positions.data.astype(np.int64, copy=False))


def _build_plan(positions, pattern, perm, iperm, parent, counts, nfund, starts, block_size,
                used, relaxation, steps=None, complete=True):
    steps = steps or StepClock()
    n = len(perm)
    ns = len(starts) - 1
    ncols = np.diff(starts)
    sn_of = np.repeat(np.arange(ns, dtype=np.int64), ncols)
    last = starts[1:] - 1
    sparent = np.where(parent[last] >= 0, sn_of[np.maximum(parent[last], 0)], -1) \
        if ns else np.zeros(0, dtype=np.int64)
    # Row structure of each relaxed supernode: its own columns, A's rows below them, and the
    # children's rows beyond its last column (children have smaller indices in postorder).
    indptr, indices = pattern
    rows, nrows, level = _supernode_rows(indptr, indices, perm, iperm, starts,
                                         sparent.astype(np.int64), counts, _thread_count())
    rows_offset = np.concatenate([[0], np.cumsum(nrows)]).astype(np.int64)
    panel_offset = np.concatenate([[0], np.cumsum(nrows * ncols)]).astype(np.int64)
    steps.mark("rows")
    below_offset = col_base = col_rel = rel = a_source = a_dest = diag_pos = None
    source = position_arrays(positions)
    if complete:
        below_offset, col_base, col_rel, rel = update_plan(rows, rows_offset, nrows, ncols,
                                                           sn_of, starts, panel_offset, n)
        steps.mark("updates")
        # Map of A's entries (lower triangle of the permuted matrix) into the panels, in the
        # order of the sorted CSR (row-major): the same passes as a rank's share of it
        entry_rows, entry_cols, a_source, _ = lower_entries(source, iperm, np.int32 if n < 2 ** 31
                                                            else np.int64)
        a_dest = entry_offsets(entry_rows, entry_cols, sn_of, starts, nrows, panel_offset, rows,
                               rows_offset)
        del entry_rows, entry_cols
        j = np.arange(n, dtype=np.int64)
        diag_pos = panel_offset[sn_of] + (j - starts[sn_of]) * nrows[sn_of] + (j - starts[sn_of])
    steps.mark("assembly")
    factor = SymbolicFactor(
        n=n, perm=perm, iperm=iperm, parent=parent, counts=counts, fundamental=nfund,
        starts=starts, nrows=nrows, panel_offset=panel_offset, rows_offset=rows_offset,
        rows=rows, sparent=sparent, level=level, below_offset=below_offset, col_base=col_base,
        col_rel=col_rel, rel=rel, a_source=a_source, a_dest=a_dest, diag_pos=diag_pos,
        block_size=int(block_size), ordering=used, relaxation=relaxation,
        positions=None if complete else source)
    factor.stats = {
        "n": n, "ordering": used, "relaxation": relaxation,
        "fundamental_supernodes": nfund, "supernodes": ns,
        "factor_nnz": factor.factor_nnz, "supernodal_nnz": factor.supernodal_nnz,
        "factor_flops": factor.flops,
        "largest_supernode_cols": int(ncols.max()) if ns else 0,
        "levels": int(level.max()) + 1 if ns else 0,
        "panel_values": int(panel_offset[-1]),
    }
    return factor
