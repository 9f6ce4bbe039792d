"""The elimination tree, its postorder and the column counts of the symbolic analysis (steps 2
and 3 of :mod:`.symbolic`): Liu's tree with path compression and the Gilbert-Ng-Peyton counts,
each in one compiled pass or, on every core for a large matrix, by the closed runs of columns a
nested dissection leaves (its parts) at once, then the other columns; and the cut of a sequence
of work into pieces for the parallel loops.

The loops are compiled by Numba when it is there (``@_compiled``; see :mod:`.symbolic`).
"""
import numpy as np

from ...arrays import inverse_permutation, sorted_distinct

# The sequential loops below are compiled when Numba is there (see :mod:`.symbolic`).
from ...compiled import prange
from ...compiled import compiled as _compiled
from ...compiled import compiled_parallel as _compiled_parallel
from ...compiled import thread_count as _thread_count


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
