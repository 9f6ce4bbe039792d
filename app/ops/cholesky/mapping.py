"""Subtree-to-rank mapping of the supernodal elimination tree (``partition.strategy: subtree``;
host only, no MPI); each rank's local plan from it is :mod:`.rank_plan`'s.

The tree is cut near its top: starting from its roots, the candidate subtree of most work
(factor flops, CHOLMOD's sum of squared column counts) is split -- its root goes to the *top*
and its children become candidates -- until the heaviest candidate is one supernode or
:data:`MAX_TOP_PER_RANK` top supernodes per rank are reached; every cut passed is estimated by
simulating the schedule (:func:`_assign`) and the first within :data:`CUT_TOLERANCE` of the
least is taken. On a nested-dissection ordering the top is the separators of its first levels
(cut into pieces on several ranks: :func:`~.supernodes.cut_top_separators`) and the candidates
are the subdomains below them, so with P ranks about log2(P) levels are cut, and any P works
(not only powers of two). Every candidate subtree is factored by its rank alone; a top
supernode is owned by one of the ranks holding it (:data:`OWNER_RULES`) and factored by it once
the other holders have sent their update blocks. The top is left-looking
(:class:`.rank_plan.TopUpdates`): a rank applies its own top supernodes' updates to a panel when
it reaches it, so the pieces of one separator dealt to several ranks are factored as a pipeline.
"""
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ...compiled import compiled
from .supernodes import subtree_work, supernode_work

#: The first cut (fewest top supernodes: fewest exchanges, which the estimate leaves out) whose
#: estimated time is within this factor of the least of the cuts tried is taken.
CUT_TOLERANCE = 1.05
#: The most top supernodes per rank (each is one exchange), however unbalanced the tree.
MAX_TOP_PER_RANK = 32


def supernode_flops(sym):
    """Factor flops of every supernode: the sum of its columns' squared counts."""
    return supernode_work(sym.counts, sym.starts)


def _deal(weights, nranks):
    """Longest-processing-time-first: the rank of every item, and every rank's load. The items
    go heaviest first (among equal weights, the first first) to the least loaded rank:
    :func:`_deal_in_order`."""
    weights = np.asarray(weights, dtype=np.float64)
    order = np.argsort(-weights, kind="stable")
    dealt, load = _deal_in_order(weights[order], nranks)
    rank = np.empty(len(weights), dtype=np.int64)
    rank[order] = dealt
    return rank, load


@compiled
def _deal_in_order(weights, nranks):
    """The rank of every item, in the order given (heaviest first), and every rank's load: each
    item goes to the least loaded rank (the lowest numbered among equals), which comes off a
    heap: an ``argmin`` over the ranks per item was most of the mapping's time on 10^5
    subtrees."""
    rank = np.empty(len(weights), dtype=np.int64)
    heap_load = np.zeros(nranks)
    heap_rank = np.arange(nranks)
    for item in range(len(weights)):
        rank[item] = heap_rank[0]
        heap_load[0] += weights[item]
        _sift_down(heap_load, heap_rank)
    load = np.empty(nranks)
    for r in range(nranks):
        load[heap_rank[r]] = heap_load[r]
    return rank, load


@compiled
def _sift_down(load, rank):
    """Restore :func:`_deal`'s heap (the least ``(load, rank)`` first) once its first entry's
    load grew."""
    i = 0
    while 2 * i + 1 < len(load):
        child = 2 * i + 1
        if child + 1 < len(load) and _comes_first(load[child + 1], rank[child + 1],
                                                  load[child], rank[child]):
            child += 1
        if not _comes_first(load[child], rank[child], load[i], rank[i]):
            break
        load[i], load[child] = load[child], load[i]
        rank[i], rank[child] = rank[child], rank[i]
        i = child


@compiled
def _comes_first(load, rank, other_load, other_rank):
    """``(load, rank) < (other_load, other_rank)``."""
    return load < other_load or (load == other_load and rank < other_rank)


@dataclass
class SubtreeMap:
    """Which rank factors which supernode.

    Attributes
    ----------
    nranks : int
    owner : (ns,) int64      the rank that factors every supernode
    top : (nt,) int64        the supernodes above the subtrees, ascending (postorder)
    roots : (nc,) int64      the roots of the subtrees, ascending
    holders : list of ndarray   for every top supernode, the ranks that hold its panel (its owner
        and every rank owning one of its descendants), ascending
    rank_flops : (nranks,) float64  factor flops of every rank
    makespan : float         the mapping's critical path in flops (:func:`_assign`'s simulated
        schedule; communication left out):
        ``rank_flops.sum() / makespan`` bounds the speed-up over one rank
    chains : (nchains, 2) int64  runs ``[k0, k1]`` of :attr:`top` (inclusive) that are a chain
        of the tree (each the only child of the next) with one owner and the same holders: a
        separator cut into several supernodes. Their blocks move together: every update to
        the run is in once its first supernode's is (nothing else hangs below the others).
    solve_chains : (nsolve, 2) int64  runs of :attr:`top` that are a chain with the same
        holders, whatever their owners: a separator whose pieces several ranks factor. Where
        the ranks read each other's memory (CUDA IPC) the owner of a run's last supernode takes
        the others' factored pieces after the factorization and solves the whole run (one
        exchange per run and direction instead of one per piece).
    """

    nranks: int
    owner: np.ndarray
    top: np.ndarray
    roots: np.ndarray
    holders: list = field(default_factory=list)
    rank_flops: np.ndarray = None
    chains: np.ndarray = None
    solve_chains: np.ndarray = None
    makespan: float = float("nan")

    def idle_ranks(self):
        """Ranks that factor nothing."""
        return [r for r in range(self.nranks) if self.rank_flops[r] == 0]


def top_costs(sym, work, supernodes):
    """The work of every supernode of ``supernodes`` (``work``: every supernode's) split as the
    top's schedule runs it: its factorization (potrf and trsm of its panel) and its update of
    every ancestor (the group of its below rows in that ancestor, the rows from there down:
    :func:`update_groups`), in proportion to their flops. Returns ``(factor, update_bounds,
    update_target, update_cost)``: ``supernodes[k]``'s factorization ``factor[k]``, and for
    ``u`` in ``update_bounds[k]:update_bounds[k + 1]`` its update of ``update_target[u]``
    (ascending), ``update_cost[u]``."""
    bounds, target, begin, end = _below_row_groups(supernodes, sym.starts, sym.rows_offset,
                                                   sym.rows)
    groups = np.diff(bounds)
    nc = sym.starts[supernodes + 1] - sym.starts[supernodes]
    m = sym.nrows[supernodes] - nc
    length = end - begin
    # flops: potrf nc^3/3 + trsm nc^2 m; a group of g rows, h from its first to the last:
    # the g x g triangle and the (h - g) x g rectangle below it, nc g (2h - g)
    update = np.repeat(nc, groups) * length * (2.0 * (np.repeat(m, groups) - begin) - length)
    factor = (nc ** 3).astype(np.float64) / 3.0 + nc.astype(np.float64) * nc * m
    # each supernode's updates summed on their own, as NumPy sums an array (pairwise): one sum
    # of them all would round otherwise, and the estimates that pick the cut are kept to the
    # last bit
    total = factor + np.array([update[a:b].sum() for a, b in zip(bounds[:-1].tolist(),
                                                                   bounds[1:].tolist())])
    scale = work[supernodes] / np.maximum(total, 1.0)
    return factor * scale, bounds, target, update * np.repeat(scale, groups)


@compiled
def _below_row_groups(supernodes, starts, rows_offset, rows):
    """:func:`.rank_plan._row_groups` of the below rows of every supernode of ``supernodes``, one after
    the other: ``(bounds, target, begin, end)``, the groups of ``supernodes[k]`` at
    ``bounds[k]:bounds[k + 1]``. A top supernode has thousands of below rows in a few dozen
    groups: each group's target is searched for from the last one's, its end from its start."""
    bounds = np.zeros(len(supernodes) + 1, dtype=np.int64)
    target = np.empty(16 * len(supernodes) + 16, dtype=np.int64)
    begin = np.empty(len(target), dtype=np.int64)
    end = np.empty(len(target), dtype=np.int64)
    g = 0
    for k in range(len(supernodes)):
        s = supernodes[k]
        first = rows_offset[s] + starts[s + 1] - starts[s]
        last = rows_offset[s + 1]
        i = first
        t = s  # the targets are after s, ascending
        while i < last:
            t = _first_at_least(starts, t + 1, len(starts), rows[i] + 1) - 1
            j = _first_at_least(rows, i, last, starts[t + 1])
            if g == len(target):
                target, begin, end = _grown(target), _grown(begin), _grown(end)
            target[g], begin[g], end[g] = t, i - first, j - first
            g += 1
            i = j
        bounds[k + 1] = g
    return bounds, target[:g].copy(), begin[:g].copy(), end[:g].copy()


@compiled
def _grown(array):
    """``array`` in twice the room, its entries first. (A loop, not a slice assignment, here
    and in the other compiled functions that copy into an array: Numba compiles it in a
    fraction of the time, which a fresh install's first run waits for.)"""
    grown = np.empty(2 * len(array), dtype=array.dtype)
    for i in range(len(array)):
        grown[i] = array[i]
    return grown


@compiled
def _first_at_least(array, lo, hi, value):
    """The first index of ``lo..hi-1`` where the ascending ``array`` is at least ``value``
    (``hi`` if none), searched from ``lo`` by doubling steps (the answer is mostly near ``lo``:
    fewer reads, and close together, than a binary search of the whole range), then halving."""
    if lo >= hi or array[lo] >= value:
        return lo
    below, step = lo, 1  # array[below] < value
    while below + step < hi and array[below + step] < value:
        below += step
        step *= 2
    above = min(below + step, hi)  # above == hi or array[above] >= value
    while above - below > 1:
        middle = (below + above) // 2
        if array[middle] < value:
            below = middle
        else:
            above = middle
    return above


@dataclass
class _Tree:
    """The supernodal tree as the cut reads it: every supernode's ``parent``, the ``size`` of
    its subtree (its supernodes: the subtree of s is ``s - size[s] + 1 .. s`` in postorder),
    the ``roots`` by decreasing subtree work (equal works in their order), and every
    supernode's ``work`` and its subtree's (``subtree``)."""

    parent: np.ndarray
    size: np.ndarray
    roots: np.ndarray
    work: np.ndarray
    subtree: np.ndarray


def _tree(sparent, work):
    """The :class:`_Tree` of ``sparent`` (int64, postorder) with supernode work ``work``."""
    subtree = subtree_work(work, sparent)
    roots = np.flatnonzero(sparent < 0)
    return _Tree(parent=sparent,
                 size=subtree_work(np.ones(len(sparent)), sparent).astype(np.int64),
                 roots=roots[np.argsort(-subtree[roots], kind="stable")].astype(np.int64),
                 work=work, subtree=subtree)


class _Top(NamedTuple):
    """Supernodes of the top, one row each, as the compiled loops read them: ``row[s]`` the row
    of supernode s (-1 for the others); the children of row k
    ``kids[kid_bounds[k]:kid_bounds[k + 1]]`` (ascending), its ``depth`` (how many ancestors)
    and ``work``; that work split as the schedule runs it (:func:`top_costs`): ``factor[k]``
    and, for ``u`` in ``update_bounds[k]:update_bounds[k + 1]``, ``update_cost[u]`` to the
    ancestor at depth ``update_depth[u]``."""

    row: np.ndarray
    kid_bounds: np.ndarray
    kids: np.ndarray
    depth: np.ndarray
    work: np.ndarray
    factor: np.ndarray
    update_bounds: np.ndarray
    update_depth: np.ndarray
    update_cost: np.ndarray


def _top(tree, supernodes, row, kid_bounds, kids, depth, factor, update_bounds, update_target,
         update_cost):
    """The :class:`_Top` of ``supernodes`` (their rows, children and depths as
    :func:`_top_tree` gives them) with their costs (:func:`top_costs`)."""
    return _Top(row=row, kid_bounds=kid_bounds, kids=kids, depth=depth,
                work=tree.work[supernodes], factor=factor, update_bounds=update_bounds,
                update_depth=depth[row[update_target]], update_cost=update_cost)


@compiled
def _top_tree(supernodes, row, parent, size):
    """The children (ascending) and depth of every supernode of ``supernodes`` (every one's
    parent among them, before it; ``row``: their positions): ``(kid_bounds, kids, depth)`` as
    :class:`_Top` keeps them."""
    kid_bounds = np.zeros(len(supernodes) + 1, dtype=np.int64)
    kids = np.empty(len(parent), dtype=np.int64)
    depth = np.zeros(len(supernodes), dtype=np.int64)
    for k in range(len(supernodes)):
        s = supernodes[k]
        if parent[s] >= 0:
            depth[k] = depth[row[parent[s]]] + 1
        kid_bounds[k + 1] = kid_bounds[k] + _children_of(s, size, kids[kid_bounds[k]:])
    return kid_bounds, kids[:kid_bounds[-1]].copy(), depth


@compiled
def _children_of(s, size, out):
    """Write supernode ``s``'s children into ``out``, ascending; returns how many. In postorder
    the last child's subtree ends right before s, and every other one's right before the
    next sibling's."""
    n = 0
    c = s - 1
    while c > s - size[s]:
        out[n] = c
        n += 1
        c -= size[c]
    for i in range(n // 2):
        out[i], out[n - 1 - i] = out[n - 1 - i], out[i]
    return n


#: How :func:`_assign` picks a top supernode's owner among its holders: the least loaded one
#: that would be free first, or the one that would be free first once the updates it still
#: has to apply are counted (a separator's pieces then go round the ranks). Each cut is
#: simulated with both; the shorter wins (neither is better on every tree).
OWNER_RULES = ("load", "lookahead")
# the rules as the compiled loops know them: their indices
_LOOKAHEAD = OWNER_RULES.index("lookahead")
_NRULES = len(OWNER_RULES)


@compiled
def _assign(top, roots, root_rank, load, slot, tops, owner, rule):
    """Ranks of a cut (``top`` ascending, candidate ``roots``; ``tops``: :class:`_Top`) and its
    estimated time, by simulating the schedule the operation runs:

    every rank factors its subtrees (the candidates, dealt: ``root_rank``, every rank's
    ``load``), then goes through the top supernodes it holds in postorder; at each it first
    applies its own top supernodes' updates to it, then sends its block (non-owner) or, once
    every holder's block is in, factors it (owner). The owner is picked among the holders by
    ``rule`` (an index of :data:`OWNER_RULES`), unless ``owner`` (every supernode's rank) is
    given, not empty; the holders of a top supernode are its owner and the ranks owning a
    descendant. Communication is left out. ``slot`` (one entry per supernode) is scratch.

    A top supernode's owner is the ``min`` over its holders by ``(time, load, rank)``, and
    every floating-point sum is made in the order of the dictionaries of the pure-Python loop
    this replaced, so that every cut's estimate, which picks the cut, is the same to the last
    bit. The pending updates are handled inline, not by functions: Numba does not inline calls
    to compiled functions, and the calls were most of the time.

    Returns ``(top_rank, holder_bounds, holder_ranks, makespan)``: the holders of ``top[k]``
    are ``holder_ranks[holder_bounds[k]:holder_bounds[k + 1]]``, in no order."""
    nranks, ntop = len(load), len(top)
    for k in range(ntop):
        slot[top[k]] = k
    for c in range(len(roots)):
        slot[roots[c]] = -1 - c
    free = load.copy()
    load = load.copy()
    # A rank's pending updates go to supernodes above the one reached (postorder: a supernode
    # not reached yet above one passed is above the one reached), at most one per depth, so
    # they are kept by (rank, depth of their target).
    ndepth = 1
    for k in range(ntop):
        ndepth = max(ndepth, tops.depth[tops.row[top[k]]] + 1)
    # every rank's pending updates in the order they came (the lookahead rule sums them in
    # that order), one row a rank: ``queue[q, :queued[q]]`` the works, ``queue_depth`` their
    # targets' depths (-1 once taken: the work is then 0.0, which leaves the sum as it is;
    # a full row drops them) and ``position[q, d]`` the update of depth d in the row (-1: none)
    queue = np.zeros((nranks, ndepth))
    queue_depth = np.empty((nranks, ndepth), dtype=np.int64)
    queued = np.zeros(nranks, dtype=np.int64)
    position = np.full((nranks, ndepth), -1, dtype=np.int64)
    # the running sums of the rows, ``running[q, :summed[q]]`` up to date: a sum starts again
    # from the first work changed since the last
    running = np.empty((nranks, ndepth))
    summed = np.zeros(nranks, dtype=np.int64)
    top_rank = np.empty(ntop, dtype=np.int64)
    holder_bounds = np.zeros(ntop + 1, dtype=np.int64)
    holder_ranks = np.empty(4 * ntop + nranks + 1, dtype=np.int64)
    gathered = np.zeros(nranks, dtype=np.bool_)
    for k in range(ntop):
        t = top[k]
        row = tops.row[t]
        begin = end = holder_bounds[k]
        if begin + nranks + 1 > len(holder_ranks):  # room for every rank
            holder_ranks = _grown(holder_ranks)
        for c in range(tops.kid_bounds[row], tops.kid_bounds[row + 1]):
            child = slot[tops.kids[c]]
            if child >= 0:  # a top supernode: its holders
                ranks = holder_ranks[holder_bounds[child]:holder_bounds[child + 1]]
            else:  # the root of candidate subtree -1 - child: its rank
                ranks = root_rank[-1 - child:-child]
            for q in ranks:
                if not gathered[q]:
                    gathered[q] = True
                    holder_ranks[end] = q
                    end += 1
        # each holder's updates of t from its own top supernodes (taken off its list), then
        # its block
        d = tops.depth[row]
        ready = 0.0  # times are never negative
        for h in range(begin, end):
            q = holder_ranks[h]
            e = position[q, d]
            if e >= 0:
                free[q] += queue[q, e]
                queue[q, e] = 0.0
                queue_depth[q, e] = -1
                position[q, d] = -1
                summed[q] = min(summed[q], e)
            ready = max(ready, free[q])
        if len(owner):
            r = owner[t]
        else:
            r, best_finish, best_load = -1, 0.0, 0.0
            for h in range(begin, end):
                q = holder_ranks[h]
                finish = max(ready, free[q])
                if rule == _LOOKAHEAD:  # plus the rank's pending updates
                    total = running[q, summed[q] - 1] if summed[q] else 0.0
                    for e in range(summed[q], queued[q]):
                        total += queue[q, e]
                        running[q, e] = total
                    summed[q] = queued[q]
                    finish += total
                if r < 0 or finish < best_finish or (finish == best_finish and (
                        load[q] < best_load or (load[q] == best_load and q < r))):
                    r, best_finish, best_load = q, finish, load[q]
        free[r] = max(ready, free[r]) + tops.factor[row]
        load[r] += tops.work[row]
        changed = summed[r]  # kept here: the loop runs faster on a local
        for u in range(tops.update_bounds[row], tops.update_bounds[row + 1]):
            d = tops.update_depth[u]
            e = position[r, d]
            if e < 0:  # new: queued last
                if queued[r] == queue.shape[1]:
                    _drop_taken(queue, queue_depth, queued, position, r)
                    changed = 0
                e = position[r, d] = queued[r]
                queue[r, e] = 0.0
                queue_depth[r, e] = d
                queued[r] += 1
            queue[r, e] += tops.update_cost[u]
            changed = min(changed, e)
        summed[r] = changed
        top_rank[k] = r
        if not gathered[r]:
            holder_ranks[end] = r
            end += 1
        for h in range(begin, end):
            gathered[holder_ranks[h]] = False
        holder_bounds[k + 1] = end
    makespan = 0.0
    for q in range(nranks):
        makespan = max(makespan, free[q])
    return top_rank, holder_bounds, holder_ranks[:holder_bounds[ntop]], makespan


@compiled
def _drop_taken(queue, queue_depth, queued, position, rank):
    """Close the gaps the updates taken off left in ``rank``'s row of :func:`_assign`'s queue,
    full (at most one update per depth is left, and not the one of the depth to come)."""
    kept = 0
    for e in range(queued[rank]):
        d = queue_depth[rank, e]
        if d >= 0:
            queue[rank, kept] = queue[rank, e]
            queue_depth[rank, kept] = d
            position[rank, d] = kept
            kept += 1
    queued[rank] = kept


@compiled
def _split(by_work, n, s, kids, subtree):
    """Move candidate ``s`` to the top: the candidates ``by_work[:n]`` (by decreasing subtree
    work, equal works in the order they became candidates: the order in which the deal takes
    them and the heaviest is picked) lose s and gain its children ``kids``. Returns their
    count."""
    k = 0
    while by_work[k] != s:
        k += 1
    for i in range(k, n - 1):
        by_work[i] = by_work[i + 1]
    n -= 1
    for child in kids:
        k = n
        while k > 0 and subtree[by_work[k - 1]] < subtree[child]:
            by_work[k] = by_work[k - 1]
            k -= 1
        by_work[k] = child
        n += 1
    return n


@compiled
def _grow_top(roots, parent, size, subtree, nranks, max_top):
    """The supernodes the cut can move to the top, in the order it moves them (see the module
    docstring): the candidate subtree of most work (the first among equals), from ``roots``
    (by decreasing work, equal works in their order) until the heaviest is one supernode or
    ``max_top`` are moved with at least ``nranks`` candidates. Returns them, every
    supernode's position among them (``row``: -1 for the others) and :func:`_top_tree`'s
    ``(kid_bounds, kids, depth)`` of them."""
    ns = len(parent)
    by_work, n = _first_candidates(roots, ns)
    split = np.empty(ns, dtype=np.int64)
    row = np.full(ns, -1, dtype=np.int64)
    kids = np.empty(ns, dtype=np.int64)
    nsplit = 0
    while n > 0 and not (n >= nranks and nsplit >= max_top):
        s = by_work[0]
        if size[s] == 1:
            break  # the heaviest subtree is one supernode: nothing left to split
        n = _split(by_work, n, s, kids[:_children_of(s, size, kids)], subtree)
        row[s] = nsplit
        split[nsplit] = s
        nsplit += 1
    split = split[:nsplit].copy()
    kid_bounds, kids, depth = _top_tree(split, row, parent, size)
    return split, row, kid_bounds, kids, depth


@compiled
def _first_candidates(roots, ns):
    """The candidates before the first cut, ``by_work[:n]`` (room for all ``ns`` supernodes):
    the roots (by decreasing work, equal works in their order). Returns ``(by_work, n)``."""
    by_work = np.empty(ns, dtype=np.int64)
    for c in range(len(roots)):
        by_work[c] = roots[c]
    return by_work, len(roots)


@compiled
def _insert_sorted(array, n, value):
    """Insert ``value`` into ``array[:n]`` (ascending), which grows by one."""
    k = n
    while k > 0 and array[k - 1] > value:
        array[k] = array[k - 1]
        k -= 1
    array[k] = value


@compiled
def _cut_makespans(roots, split, tops, subtree, nranks):
    """The estimated time (:func:`_assign`) of every cut passed, with every rule of
    :data:`OWNER_RULES`: row ``k`` for the cut of top ``split[:k]`` (NaN where it leaves fewer
    candidates than ranks, not estimated). ``roots`` and ``split`` as :func:`_grow_top` takes
    and gives them."""
    ns = len(subtree)
    by_work, n = _first_candidates(roots, ns)  # the candidates, as the deal takes them
    top = np.empty(len(split), dtype=np.int64)  # ascending
    slot = np.empty(ns, dtype=np.int64)
    no_owner = np.zeros(0, dtype=np.int64)
    makespans = np.full((len(split) + 1, _NRULES), np.nan)
    for size in range(len(split) + 1):
        if n >= nranks:
            candidates = by_work[:n]
            root_rank, load = _deal_in_order(subtree[candidates], nranks)
            for rule in range(_NRULES):
                makespans[size, rule] = _assign(top[:size], candidates, root_rank, load, slot,
                                                tops, no_owner, rule)[3]
        if size < len(split):
            s = split[size]
            row = tops.row[s]
            n = _split(by_work, n, s, tops.kids[tops.kid_bounds[row]:tops.kid_bounds[row + 1]],
                       subtree)
            _insert_sorted(top, size, s)
    return makespans


@compiled
def _cut(roots, split, tops, subtree, nranks, tolerance):
    """The cut (see the module docstring) and its ranks: of the cuts passed
    (:func:`_cut_makespans`), the first whose estimated time is within ``tolerance`` of the
    least, simulated once more with its owner rule (:func:`_assign`), its candidates dealt as
    the list of them ascending was. The one call from Python of the cut's compiled loops: each
    is loaded from Numba's disk cache at its process's first call, milliseconds apiece.

    Returns ``(top, dealt, root_rank, top_rank, holder_bounds, holder_ranks, makespan)``: the
    top supernodes ascending, the candidates (the subtrees' roots) in the order they were
    dealt and their ranks, and :func:`_assign`'s results."""
    estimates = _cut_makespans(roots, split, tops, subtree, nranks).ravel()  # cut by cut
    least = np.inf
    for k in range(len(estimates)):
        if estimates[k] < least:  # never true for NaN (not estimated)
            least = estimates[k]
    first = len(split) * _NRULES  # none estimated: the whole split, the first rule
    for k in range(len(estimates) - 1, -1, -1):
        if estimates[k] <= tolerance * least:
            first = k
    chosen, rule = first // _NRULES, first % _NRULES
    ns = len(subtree)
    by_work, n = _first_candidates(roots, ns)
    top = np.empty(chosen, dtype=np.int64)
    for size in range(chosen):
        s = split[size]
        row = tops.row[s]
        n = _split(by_work, n, s, tops.kids[tops.kid_bounds[row]:tops.kid_bounds[row + 1]],
                   subtree)
        _insert_sorted(top, size, s)
    dealt = _equal_works_ascending(by_work[:n], subtree)
    root_rank, load = _deal_in_order(subtree[dealt], nranks)
    top_rank, holder_bounds, holder_ranks, makespan = _assign(
        top, dealt, root_rank, load, np.empty(ns, dtype=np.int64), tops,
        np.zeros(0, dtype=np.int64), rule)
    return top, dealt, root_rank, top_rank, holder_bounds, holder_ranks, makespan


@compiled
def _equal_works_ascending(candidates, subtree):
    """``candidates`` (by decreasing work) with every run of equal works ascending: the order
    of a stable sort of them ascending by decreasing work. Each candidate goes to the next
    place of its run, the supernodes taken in order (no sort: a run can be long)."""
    place = np.full(len(subtree), -1, dtype=np.int64)  # the first place of the run
    first = 0
    for c in range(len(candidates)):
        if subtree[candidates[c]] != subtree[candidates[first]]:
            first = c
        place[candidates[c]] = first
    following = np.arange(len(candidates))  # the next place of the run that begins there
    ordered = np.empty(len(candidates), dtype=np.int64)
    for s in range(len(subtree)):
        if place[s] >= 0:
            ordered[following[place[s]]] = s
            following[place[s]] += 1
    return ordered


def subtree_mapping(sym, nranks):
    """The :class:`SubtreeMap` of ``sym``'s supernodal tree over ``nranks`` ranks."""
    ns = sym.nsuper
    sparent = sym.sparent.astype(np.int64)
    work = supernode_flops(sym)
    tree = _tree(sparent, work)
    split, row, kid_bounds, kids, depth = _grow_top(tree.roots, sparent, tree.size,
                                                    tree.subtree, nranks,
                                                    MAX_TOP_PER_RANK * nranks)
    tops = _top(tree, split, row, kid_bounds, kids, depth, *top_costs(sym, work, split))
    top, dealt, dealt_rank, top_rank, holder_bounds, holder_ranks, makespan = _cut(
        tree.roots, split, tops, tree.subtree, nranks, CUT_TOLERANCE)
    ascending = np.argsort(dealt)
    roots, root_rank = dealt[ascending], dealt_rank[ascending]
    holders = [np.sort(holder_ranks[begin:end]) for begin, end in
               zip(holder_bounds[:-1].tolist(), holder_bounds[1:].tolist())]
    owner = np.full(ns, -1, dtype=np.int64)
    # every supernode of a subtree takes its root's rank: the subtree of root c is the
    # contiguous postorder range ending at c
    for c, r, first in zip(roots.tolist(), root_rank.tolist(),
                           (roots - tree.size[roots] + 1).tolist()):
        owner[first:c + 1] = r
    owner[top] = top_rank
    rank_flops = np.bincount(owner, weights=work, minlength=nranks)
    nchild = np.diff(tops.kid_bounds)[tops.row[top]]
    return SubtreeMap(nranks=nranks, owner=owner, top=top, roots=roots, holders=holders,
                      rank_flops=rank_flops,
                      chains=_chains(sparent, top, nchild, owner, holders),
                      solve_chains=_chains(sparent, top, nchild, owner, holders,
                                           one_owner=False),
                      makespan=float(makespan))


def _makespan(sparent, top, owner, work, nranks):
    """The estimated time (:func:`_assign`'s simulation) of the mapping ``owner`` with top
    supernodes ``top``, a top supernode's work all its factorization's (no plan to split it)."""
    sparent = np.asarray(sparent, dtype=np.int64)
    top = np.asarray(top, dtype=np.int64)
    work = np.asarray(work, dtype=np.float64)
    owner = np.asarray(owner, dtype=np.int64)
    tree = _tree(sparent, work)
    parents_first = top[::-1].copy()
    row = np.full(len(sparent), -1, dtype=np.int64)
    row[parents_first] = np.arange(len(top))
    tops = _top(tree, parents_first, row, *_top_tree(parents_first, row, sparent, tree.size),
                factor=work[parents_first], update_bounds=np.zeros(len(top) + 1, np.int64),
                update_target=np.zeros(0, np.int64), update_cost=np.zeros(0))
    below = tops.kids[tops.row[tops.kids] < 0]
    roots = np.concatenate([np.sort(below), np.flatnonzero((sparent < 0) & (tops.row < 0))])
    load = np.bincount(owner[roots], weights=tree.subtree[roots], minlength=nranks)
    return float(_assign(top, roots, owner[roots], load, np.empty(len(sparent), np.int64), tops,
                         owner, 0)[3])


def _chains(sparent, top, nchild, owner, holders, one_owner=True):
    """The runs of :attr:`SubtreeMap.chains` (``one_owner``), or of
    :attr:`SubtreeMap.solve_chains` (``nchild``: how many children every top supernode has)."""
    parent = sparent[top].tolist()
    nchild = nchild.tolist()
    top_owner = owner[top].tolist()
    top = top.tolist()
    chains = []
    for k, t in enumerate(top):
        if (chains and top[k - 1] + 1 == t and parent[k - 1] == t and nchild[k] == 1
                and (top_owner[k] == top_owner[k - 1] or not one_owner)
                and np.array_equal(holders[k], holders[k - 1])):
            chains[-1][1] = k
        else:
            chains.append([k, k])
    return np.array(chains, dtype=np.int64).reshape(-1, 2)
