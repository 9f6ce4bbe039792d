"""Subtree-to-rank mapping of the supernodal elimination tree (``partition.strategy: subtree``),
and each rank's local plan (host only, no MPI: :mod:`.op` moves the plans and the blocks).

The tree is cut near its top: starting from its roots, the candidate subtree of most work
(factor flops, CHOLMOD's sum of squared column counts) is split -- its root goes to the *top*
and its children become candidates -- until the heaviest candidate is one supernode or
:data:`MAX_TOP_PER_RANK` top supernodes per rank are reached; every cut passed is estimated by
simulating the schedule (:func:`_assign`) and the first within :data:`CUT_TOLERANCE` of the
least is taken. On a nested-dissection ordering the top is the separators of its first levels
(cut into pieces on several ranks: :func:`~.symbolic.cut_top_separators`) and the candidates
are the subdomains below them, so with P ranks about log2(P) levels are cut, and any P works
(not only powers of two). Every candidate subtree is factored by its rank alone; a top
supernode is owned by one of the ranks holding it (:data:`OWNER_RULES`) and factored by it once
the other holders have sent their update blocks. The top is left-looking (:class:`TopUpdates`):
a rank applies its own top supernodes' updates to a panel when it reaches it, so the pieces of
one separator dealt to several ranks are factored as a pipeline.

A rank holds the panels of the supernodes it owns and of every top supernode above them (where
its updates go); :func:`local_plan` renumbers the plan of :mod:`.symbolic` into that compact
storage, so a rank's memory follows its share of the factor.
"""
import heapq
from dataclasses import dataclass, field

import numpy as np

from ...compiled import compiled
from ...threads import searchsorted_into
from .symbolic import subtree_work

#: The first cut (fewest top supernodes: fewest exchanges, which the estimate leaves out) whose
#: estimated time is within this factor of the least of the cuts tried is taken.
CUT_TOLERANCE = 1.05
#: The most top supernodes per rank (each is one exchange), however unbalanced the tree.
MAX_TOP_PER_RANK = 32


def supernode_flops(sym):
    """Factor flops of every supernode: the sum of its columns' squared counts."""
    squares = sym.counts.astype(np.float64) ** 2
    cumulative = np.concatenate([[0.0], np.cumsum(squares)])
    return cumulative[sym.starts[1:]] - cumulative[sym.starts[:-1]]


def _deal(weights, nranks):
    """Longest-processing-time-first: the rank of every item, and every rank's load. The least
    loaded rank (the lowest numbered among equals) comes off a heap: an ``argmin`` over the
    ranks per item was most of the mapping's time on 10^5 subtrees."""
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


def top_costs(sym, s, work):
    """Supernode ``s``'s work ``work`` split as the top's schedule runs it: its factorization
    (potrf and trsm of its panel) and its update of every ancestor (the group of its below rows
    in that ancestor, the rows from there down: :func:`update_groups`), in proportion to their
    flops. Returns ``(factor, {target supernode: update})``."""
    nc = int(sym.starts[s + 1] - sym.starts[s])
    m = int(sym.nrows[s]) - nc
    target, begin, end = _row_groups(sym.starts, sym.rows[sym.rows_offset[s] + nc:
                                                          sym.rows_offset[s + 1]])
    length = end - begin
    # flops: potrf nc^3/3 + trsm nc^2 m; a group of g rows, h from its first to the last:
    # the g x g triangle and the (h - g) x g rectangle below it, nc g (2h - g)
    update = nc * length * (2.0 * (m - begin) - length)
    factor = nc ** 3 / 3.0 + float(nc) * nc * m
    scale = work / max(factor + update.sum(), 1.0)
    return factor * scale, dict(zip(target.tolist(), (update * scale).tolist()))


def _row_groups(first, below):
    """The runs of a supernode's ``below`` rows (sorted) by the supernode they lie in
    (``first``: every supernode's first column, ascending): ``(target, begin, end)`` arrays,
    rows ``begin..end-1`` of ``below`` in supernode ``target``."""
    target = np.searchsorted(first, below, side="right") - 1
    begin = np.flatnonzero(np.concatenate([[True], target[1:] != target[:-1]]))[:len(below)]
    end = np.append(begin[1:], len(below))[:len(begin)].astype(np.int64)
    return target[begin], begin, end


class _TopCosts(dict):
    """:func:`top_costs` of every supernode asked for, computed once."""

    def __init__(self, sym, work):
        super().__init__()
        self.sym, self.work = sym, work

    def __missing__(self, s):
        if self.sym is None:  # no plan: the whole work is the factorization's
            cost = self[s] = (float(self.work[s]), {})
        else:
            cost = self[s] = top_costs(self.sym, s, float(self.work[s]))
        return cost


#: How :func:`_assign` picks a top supernode's owner among its holders: the least loaded one
#: that would be free first, or the one that would be free first once the updates it still
#: has to apply are counted (a separator's pieces then go round the ranks). Each cut is
#: simulated with both; the shorter wins (neither is better on every tree).
OWNER_RULES = ("load", "lookahead")


def _assign(top, roots, kids, subtree, work, nranks, costs, owner=None, rule="load"):
    """Ranks of a cut (``top`` ascending, candidate ``roots``; ``kids[t]``: the children of top
    supernode t) and its estimated time, by simulating the schedule the operation runs:

    every rank factors its subtrees (the candidates, dealt longest-first), then goes through the
    top supernodes it holds in postorder; at each it first applies its own top supernodes'
    updates to it (``costs``: :class:`_TopCosts`), then sends its block (non-owner) or, once
    every holder's block is in, factors it (owner). The owner is picked among the holders by
    ``rule`` (:data:`OWNER_RULES`), unless ``owner`` (every supernode's rank) is given; the
    holders of a top supernode are its owner and the ranks owning a descendant. Communication
    is left out.

    Returns
    -------
    (root_rank, top_rank, holders, makespan): ``holders[t]`` a set of ranks
    """
    root_rank, load = _deal(subtree[roots], nranks)
    if owner is not None:
        root_rank = owner[roots]
        load = np.bincount(root_rank, weights=subtree[roots], minlength=nranks)
    rank_of = dict(zip(roots.tolist(), root_rank.tolist()))
    free = load.copy()
    top_rank, holders = {}, {}
    pending = [{} for _ in range(nranks)]  # rank -> {target: its updates' work}
    for t in top.tolist():
        held = set()
        for k in kids[t]:
            held |= holders[k] if k in holders else {rank_of[k]}
        for q in held:  # each holder's updates of t from its own top supernodes, then its block
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


def _cut(sparent, subtree, work, nranks, costs):
    """The top supernodes, the candidate subtrees' roots, every top supernode's children and
    the owner rule (see the module docstring): of the cuts passed, each simulated with every
    rule of :data:`OWNER_RULES`, the first whose estimated time (:func:`_assign`) is within
    :data:`CUT_TOLERANCE` of the least."""
    ns = len(sparent)
    nchild = np.bincount(sparent[sparent >= 0], minlength=ns)
    children = np.argsort(sparent, kind="stable")
    children = children[sparent[children] >= 0]
    bounds = np.concatenate([[0], np.cumsum(nchild)])
    candidates = list(np.flatnonzero(sparent < 0))
    top, kids = [], {}
    tried = []  # (estimated time, top, candidates)
    while candidates:
        if len(candidates) >= nranks:
            for rule in OWNER_RULES:
                _, _, _, makespan = _assign(np.array(sorted(top), dtype=np.int64),
                                            np.array(candidates, dtype=np.int64), kids,
                                            subtree, work, nranks, costs, rule=rule)
                tried.append((makespan, list(top), list(candidates), rule))
            if len(top) >= MAX_TOP_PER_RANK * nranks:
                break
        weights = subtree[candidates]
        heaviest = int(np.argmax(weights))
        s = int(candidates[heaviest])
        if nchild[s] == 0:
            break  # the heaviest subtree is one supernode: nothing left to split
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


def subtree_mapping(sym, nranks):
    """The :class:`SubtreeMap` of ``sym``'s supernodal tree over ``nranks`` ranks."""
    ns = sym.nsuper
    sparent = sym.sparent.astype(np.int64)
    work = supernode_flops(sym)
    subtree = subtree_work(work, sparent)
    costs = _TopCosts(sym, work)
    top, roots, kids, rule = _cut(sparent, subtree, work, nranks, costs)
    root_rank, top_rank, held, makespan = _assign(top, roots, kids, subtree, work, nranks,
                                                  costs, rule=rule)
    owner = np.full(ns, -1, dtype=np.int64)
    # every supernode of a subtree takes its root's rank: the subtree of root c is the
    # contiguous postorder range ending at c
    first = _first_descendant(sparent)
    for c, r in zip(roots, root_rank):
        owner[first[c]:c + 1] = r
    for t in top.tolist():
        owner[t] = top_rank[t]
    holders = [np.array(sorted(held[t]), dtype=np.int64) for t in top.tolist()]
    rank_flops = np.bincount(owner, weights=work, minlength=nranks)
    return SubtreeMap(nranks=nranks, owner=owner, top=top, roots=roots, holders=holders,
                      rank_flops=rank_flops, chains=_chains(sparent, top, owner, holders),
                      solve_chains=_chains(sparent, top, owner, holders, one_owner=False),
                      makespan=makespan)


def _makespan(sparent, top, owner, work, nranks):
    """The estimated time (:func:`_assign`'s simulation) of the mapping ``owner`` with top
    supernodes ``top``, a top supernode's work all its factorization's (no plan to split it)."""
    is_top = np.zeros(len(sparent), dtype=bool)
    is_top[top] = True
    kids = {t: np.flatnonzero(sparent == t).tolist() for t in top.tolist()}
    roots = np.array(sorted(k for t in top.tolist() for k in kids[t] if not is_top[k])
                     + np.flatnonzero((sparent < 0) & ~is_top).tolist(), dtype=np.int64)
    subtree = subtree_work(work, sparent.astype(np.int64))
    return _assign(top, roots, kids, subtree, work, nranks, _TopCosts(None, work), owner)[3]


def _chains(sparent, top, owner, holders, one_owner=True):
    """The runs of :attr:`SubtreeMap.chains` (``one_owner``), or of
    :attr:`SubtreeMap.solve_chains`."""
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


@compiled
def _first_descendant_loop(sparent):
    first = np.arange(len(sparent))
    for s in range(len(sparent)):
        p = sparent[s]
        if p >= 0 and first[s] < first[p]:
            first[p] = first[s]
    return first


def _first_descendant(sparent):
    """The first supernode (in postorder) of every supernode's subtree."""
    return _first_descendant_loop(sparent)


@dataclass
class LocalPlan:
    """One rank's share of the numeric plan: the panels it holds, renumbered into one compact
    value array (the layout of :class:`~.symbolic.SymbolicFactor`, restricted).

    Attributes (nh held supernodes, in ascending global order; int64 unless noted)
    ----------
    n : int                  columns of the whole matrix
    rank : int
    supernodes : (nh,)       global ids of the held supernodes
    first : (nh,)            first (permuted) column of each
    ncols, nrows : (nh,)
    panel_offset : (nh + 1,) offsets in the local value array
    rows_offset : (nh + 1,), rows : global permuted rows of every held panel
    below_offset : (nh + 1,), col_base, col_rel : as in SymbolicFactor, into the local array
    rel : int32              the held supernodes' relative indices
    local : (nl,)            local ids of the supernodes factored without any exchange (the
        rank's subtrees), ascending
    top : (nt,)              local id of every top supernode held (-1 where not held), in the
        order of :attr:`SubtreeMap.top`
    top_owner : (nt,)        owner of every top supernode
    a_dest : (entries,)      offsets in the local array of the rank's entries of A
    owned_columns : (nc,)    permuted columns of the supernodes the rank owns (b and x there)
    """

    n: int
    rank: int
    supernodes: np.ndarray
    first: np.ndarray
    ncols: np.ndarray
    nrows: np.ndarray
    panel_offset: np.ndarray
    rows_offset: np.ndarray
    rows: np.ndarray
    below_offset: np.ndarray
    col_base: np.ndarray
    col_rel: np.ndarray
    rel: np.ndarray
    local: np.ndarray
    top: np.ndarray
    top_owner: np.ndarray
    a_dest: np.ndarray
    owned_columns: np.ndarray
    diag_pos: np.ndarray

    @property
    def nsuper(self):
        return len(self.supernodes)

    def supernode_rows(self, i):
        return self.rows[self.rows_offset[i]:self.rows_offset[i + 1]]

    def nbytes(self):
        """Bytes of the plan's arrays."""
        return int(sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray)))

    def to_dict(self):
        return dict(vars(self))

    @classmethod
    def from_dict(cls, part):
        return cls(**{name: part[name] for name in cls.__dataclass_fields__})


def _ranges(starts, ends):
    """The concatenation of ``arange(starts[i], ends[i])``."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total, dtype=np.int64) + offsets


#: Most slices :func:`_take_runs` copies one by one; past it the index list is cheaper than the
#: interpreter's loop.
MAX_RUN_SLICES = 1 << 15


def _take_runs(array, starts, ends):
    """``array[_ranges(starts, ends)]`` without making the index list: runs that touch are
    merged and copied as slices. A rank's supernodes are whole subtrees, consecutive in
    postorder, so their runs of the plan's arrays mostly touch; gathering a rank's relative
    indices through the index list was most of its plan (100^3 Laplacian at 4 ranks: 0.36 of
    0.63 s)."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return array[:0].copy()
    first = np.flatnonzero(np.concatenate([[True], starts[1:] != ends[:-1]]))
    last = np.concatenate([first[1:], [len(starts)]]) - 1
    if len(first) > MAX_RUN_SLICES:
        return array[_ranges(starts, ends)]
    return np.concatenate([array[lo:hi] for lo, hi in zip(starts[first].tolist(),
                                                           ends[last].tolist())])


def entry_supernodes(sym):
    """The supernode of every entry of A's lower triangle in the plan (``sym.a_dest``'s
    panels): the same for every rank's :func:`local_plan`, so built once."""
    found = searchsorted_into(np.empty(len(sym.a_dest), dtype=np.int64), sym.panel_offset,
                              sym.a_dest, side="right")
    found -= 1
    return found


class EntryOwners:
    """A's entries (in ``sym.a_dest``'s order) grouped by the rank owning their supernode, made
    once for every rank's :func:`local_plan`: a rank's entries are then a slice, not a pass over
    all of A's entries per rank."""

    def __init__(self, sym, mapping):
        self.supernode = entry_supernodes(sym)
        owner = mapping.owner[self.supernode]
        # int16 ranks: the stable sort is a radix sort
        small = owner.astype(np.int16) if mapping.nranks < np.iinfo(np.int16).max else owner
        self.order = np.argsort(small, kind="stable")
        self.bounds = np.concatenate([[0], np.cumsum(np.bincount(owner,
                                                                 minlength=mapping.nranks))])

    def of(self, rank):
        """Positions of ``rank``'s entries (ascending) and their supernodes."""
        picked = self.order[self.bounds[rank]:self.bounds[rank + 1]]
        return picked, self.supernode[picked]


def local_plan(sym, mapping, rank, entries=None):
    """The :class:`LocalPlan` of ``rank`` and the indices of its entries in A's data
    (``sym.a_source`` restricted: the caller sends ``values[source]``). ``entries``:
    :class:`EntryOwners` of ``sym`` and ``mapping`` (made here when not given).

    Returns
    -------
    (LocalPlan, ndarray)
    """
    owner = mapping.owner
    held_top = np.array([rank in set(h.tolist()) for h in mapping.holders], dtype=bool)
    top_mask = np.zeros(sym.nsuper, dtype=bool)
    top_mask[mapping.top] = True
    held = (owner == rank) | np.isin(np.arange(sym.nsuper), mapping.top[held_top])
    supernodes = np.flatnonzero(held).astype(np.int64)
    loc = np.full(sym.nsuper, -1, dtype=np.int64)
    loc[supernodes] = np.arange(len(supernodes))
    first = sym.starts[supernodes]
    ncols = sym.starts[supernodes + 1] - first
    nrows = sym.nrows[supernodes]
    panel_offset = np.concatenate([[0], np.cumsum(nrows * ncols)]).astype(np.int64)
    rows_offset = np.concatenate([[0], np.cumsum(nrows)]).astype(np.int64)
    rows = _take_runs(sym.rows, sym.rows_offset[supernodes], sym.rows_offset[supernodes + 1])
    # below rows, their targets' panels moved to the local array
    m = nrows - ncols
    below_offset = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    below_begin, below_end = sym.below_offset[supernodes], sym.below_offset[supernodes + 1]
    sn_of = np.repeat(np.arange(sym.nsuper, dtype=np.int64), np.diff(sym.starts))
    below_rows = rows[_ranges(rows_offset[:-1] + ncols, rows_offset[1:])]
    target = sn_of[below_rows]
    col_base = _take_runs(sym.col_base, below_begin, below_end) - sym.panel_offset[target] + \
        panel_offset[loc[target]]
    # each supernode's relative indices are one contiguous run of sym.rel, from col_rel at its
    # first below row, as long as the sum of its groups' lengths
    rel_start = np.zeros(len(supernodes), dtype=np.int64)
    has_below = m > 0
    rel_start[has_below] = sym.col_rel[sym.below_offset[supernodes[has_below]]]
    rel_length = _rel_lengths(m, target)
    local_rel_offset = np.concatenate([[0], np.cumsum(rel_length)]).astype(np.int64)
    rel = _take_runs(sym.rel, rel_start, rel_start + rel_length)
    shift = np.repeat(local_rel_offset[:-1] - rel_start, m)
    col_rel = _take_runs(sym.col_rel, below_begin, below_end) + shift
    # A's entries of the supernodes this rank owns (the others' come with their updates)
    if entries is None:
        entries = EntryOwners(sym, mapping)
    mine, mine_sn = entries.of(rank)
    source = sym.a_source[mine]
    a_dest = sym.a_dest[mine] - sym.panel_offset[mine_sn] + panel_offset[loc[mine_sn]]
    owned = supernodes[owner[supernodes] == rank]
    owned_columns = _ranges(sym.starts[owned], sym.starts[owned + 1])
    col_sn = loc[sn_of[owned_columns]]
    diag_pos = panel_offset[col_sn] + (owned_columns - first[col_sn]) * (nrows[col_sn] + 1)
    local = loc[supernodes[(owner[supernodes] == rank) & ~top_mask[supernodes]]]
    plan = LocalPlan(
        n=int(sym.n), rank=int(rank), supernodes=supernodes, first=first, ncols=ncols,
        nrows=nrows, panel_offset=panel_offset, rows_offset=rows_offset, rows=rows,
        below_offset=below_offset, col_base=col_base, col_rel=col_rel, rel=rel, local=local,
        top=np.where(held_top, loc[mapping.top], -1).astype(np.int64),
        top_owner=owner[mapping.top].astype(np.int64), a_dest=a_dest,
        owned_columns=owned_columns, diag_pos=diag_pos)
    return plan, source


def update_groups(plan, i):
    """The groups of held supernode ``i``'s below rows by the held supernode they lie in:
    ``[(target, r0, r1)]``, rows ``r0..r1-1`` of its below rows (0 = its first row past its own
    columns) in ``target``, ascending. Its update of ``target`` is L[r0:] L[r0:r1]^T."""
    target, begin, end = _row_groups(plan.first, plan.supernode_rows(i)[int(plan.ncols[i]):])
    return list(zip(target.tolist(), begin.tolist(), end.tolist()))


class TopUpdates:
    """One rank's updates from the top supernodes it factored to the panels above them, due
    when the rank reaches the target (left-looking): then the target's owner receives blocks
    that hold them, and a separator cut into pieces on several ranks is factored as a pipeline
    (the owner of one piece updates the next one first, and every rank the pieces it owns).

    ``factored(i)`` after the rank factors top supernode ``i``; ``due(i)``: its ``(source, r0,
    r1)`` updates of held supernode ``i`` (:func:`update_groups`), each handed out once."""

    def __init__(self, plan):
        self.plan = plan
        self.pending = {}

    def factored(self, i):
        for target, r0, r1 in update_groups(self.plan, i):
            self.pending.setdefault(target, []).append((int(i), r0, r1))

    def due(self, i):
        return self.pending.pop(int(i), [])


def _rel_lengths(m, target):
    """Length of every supernode's run of relative indices, from ``m`` (below rows per
    supernode) and ``target`` (the supernode owning each below row, supernode after
    supernode): every update group (a run of below rows of one target) covers the rows from its
    start to the end of its supernode's below rows."""
    which = np.repeat(np.arange(len(m)), m)
    position = np.arange(len(target)) - np.repeat(np.cumsum(m) - m, m)
    begins = position == 0
    begins[1:] |= target[1:] != target[:-1]
    return np.bincount(which[begins], weights=(m[which] - position)[begins],
                       minlength=len(m)).astype(np.int64)


def local_symbolic(plan, block_size):
    """The rank's :class:`LocalPlan` as a :class:`~.symbolic.SymbolicFactor` of its own: its
    held columns renumbered 0.. in order (every row of a held panel is a held column: the
    supernodes above a held one are held), so an engine written for a whole plan (the GPU
    engine) factors the rank's share. ``perm`` maps a local column to its global permuted
    column; ``counts`` and ``parent`` are not known here (zeros, -1)."""
    from .symbolic import SymbolicFactor
    columns = _ranges(plan.first, plan.first + plan.ncols)
    n = len(columns)
    starts = np.concatenate([[0], np.cumsum(plan.ncols)]).astype(np.int64)
    rows = np.searchsorted(columns, plan.rows).astype(np.int64)
    nh = plan.nsuper
    has_below = plan.nrows > plan.ncols
    sparent = np.full(nh, -1, dtype=np.int64)
    first_below = rows[plan.rows_offset[:-1][has_below] + plan.ncols[has_below]]
    sparent[has_below] = np.searchsorted(starts, first_below, side="right") - 1
    level = _levels(sparent)
    sn_of = np.repeat(np.arange(nh, dtype=np.int64), plan.ncols)
    local = np.arange(n, dtype=np.int64)
    diag_pos = plan.panel_offset[sn_of] + (local - starts[sn_of]) * (plan.nrows[sn_of] + 1)
    return SymbolicFactor(
        n=n, perm=columns, iperm=np.zeros(0, dtype=np.int64), parent=np.full(n, -1),
        counts=np.zeros(n, dtype=np.int64), fundamental=0, starts=starts,
        nrows=plan.nrows, panel_offset=plan.panel_offset, rows_offset=plan.rows_offset,
        rows=rows, sparent=sparent, level=level, below_offset=plan.below_offset,
        col_base=plan.col_base, col_rel=plan.col_rel, rel=plan.rel,
        a_source=np.arange(len(plan.a_dest), dtype=np.int64), a_dest=plan.a_dest,
        diag_pos=diag_pos, block_size=int(block_size), ordering="local", relaxation="local")


@compiled
def _levels(sparent):
    """Tree level of every supernode (0 at leaves; children precede parents)."""
    level = np.zeros(len(sparent), dtype=np.int64)
    for s in range(len(sparent)):
        p = sparent[s]
        if p >= 0 and level[s] + 1 > level[p]:
            level[p] = level[s] + 1
    return level
