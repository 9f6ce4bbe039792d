"""Each rank's local plan under ``partition.strategy: subtree`` (host only, no MPI: :mod:`.op`
moves the plans and the blocks), from the mapping of :mod:`.mapping`.

A rank holds the panels of the supernodes it owns and of every top supernode above them (where
its updates go), renumbered into compact storage, so a rank's memory follows its share of the
factor: rank 0 cuts each rank's share of the structure (:func:`plan_structure`), each rank
takes its entries of A from its own copy (:func:`own_lower_entries`; :class:`LowerEntries` makes
every rank's at once) and completes its own numeric plan (:func:`complete_plan`: relative
indices, where its entries go) at the same time as the others; the top is left-looking
(:class:`TopUpdates`), and a rank's held supernodes become a plan of their own for its engine
(:func:`local_symbolic`).
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...compiled import compiled
from ...errors import HisparseError
from ...formats import index_dtype_for
from ...partition import group_by_owner
from ...threads import searchsorted_into
from .structure import entry_offsets, lower_entries, update_plan


def _row_groups(first, below):
    """The runs of a supernode's ``below`` rows (sorted) by the supernode they lie in
    (``first``: every supernode's first column, ascending): ``(target, begin, end)`` arrays,
    rows ``begin..end-1`` of ``below`` in supernode ``target``."""
    target = np.searchsorted(first, below, side="right") - 1
    begin = np.flatnonzero(np.concatenate([[True], target[1:] != target[:-1]]))[:len(below)]
    end = np.append(begin[1:], len(below))[:len(begin)].astype(np.int64)
    return target[begin], begin, end


@dataclass
class PlanStructure:
    """One rank's share of the factor's structure, renumbered into one compact value array (the
    layout of :class:`~.factor.SymbolicFactor`, restricted): what rank 0 sends it, from which
    the rank makes its own numeric plan (:func:`complete_plan`).

    Attributes (nh held supernodes, in ascending global order; int64)
    ----------
    n : int                  columns of the whole matrix
    rank : int
    supernodes : (nh,)       global ids of the held supernodes
    first : (nh,)            first (permuted) column of each
    ncols, nrows : (nh,)
    panel_offset : (nh + 1,) offsets in the local value array
    rows_offset : (nh + 1,), rows : global permuted rows of every held panel
    local : (nl,)            local ids of the supernodes factored without any exchange (the
        rank's subtrees), ascending
    top : (nt,)              local id of every top supernode held (-1 where not held), in the
        order of :attr:`SubtreeMap.top`
    top_owner : (nt,)        owner of every top supernode
    owned_columns : (nc,)    permuted columns of the supernodes the rank owns (b and x there)
    diag_pos : (nc,)         offset of each owned column's diagonal entry in the local array
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
    local: np.ndarray
    top: np.ndarray
    top_owner: np.ndarray
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


@dataclass
class LocalPlan(PlanStructure):
    """One rank's share of the numeric plan: its :class:`PlanStructure` and

    below_offset : (nh + 1,), col_base, col_rel : as in SymbolicFactor, into the local array
    rel : int32              the held supernodes' relative indices
    a_dest : (entries,)      offsets in the local array of the rank's entries of A
    """

    below_offset: np.ndarray = None
    col_base: np.ndarray = None
    col_rel: np.ndarray = None
    rel: np.ndarray = None
    a_dest: np.ndarray = None


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
    """The supernode of every entry of A's lower triangle in a complete plan (``sym.a_dest``'s
    panels)."""
    found = searchsorted_into(np.empty(len(sym.a_dest), dtype=np.int64), sym.panel_offset,
                              sym.a_dest, side="right")
    found -= 1
    return found


class LowerEntries:
    """A's entries of the permuted lower triangle (row, column and index in A's data, in the
    assembly map's order) grouped by the rank owning their column's supernode, made once for
    every rank's part: a rank's entries are then a slice, not a pass over all of A's entries
    per rank (:func:`~.structure.lower_entries`)."""

    def __init__(self, rows, cols, source, cuts):
        self.rows, self.cols, self.source, self.cuts = rows, cols, source, cuts

    @classmethod
    def of_factor(cls, sym, mapping):
        """The entries of ``sym`` (from its kept pattern, or where a complete plan puts them)
        by ``mapping``'s owners."""
        column_owner = np.repeat(mapping.owner, np.diff(sym.starts))
        if sym.positions is not None:
            return cls(*lower_entries(sym.positions, sym.iperm, index_dtype_for(sym.n),
                                      column_owner, mapping.nranks))
        # each entry's column and row from its place in its panel (in the map's order), then
        # grouped by owner
        s = entry_supernodes(sym)
        offset = sym.a_dest - sym.panel_offset[s]
        cols = sym.starts[s] + offset // sym.nrows[s]
        rows = sym.rows[sym.rows_offset[s] + offset % sym.nrows[s]]
        order, cuts = group_by_owner(column_owner[cols], mapping.nranks)
        return cls(rows[order], cols[order], sym.a_source[order], cuts)

    def of(self, rank):
        """``rank``'s entries: their rows, columns and indices in A's data, in order."""
        lo, hi = self.cuts[rank], self.cuts[rank + 1]
        return self.rows[lo:hi], self.cols[lo:hi], self.source[lo:hi]


def own_lower_entries(positions, iperm, owned_columns):
    """One rank's entries of the permuted lower triangle, from its own copy of A: their rows,
    columns and indices in A's data, the arrays :meth:`LowerEntries.of` gives for that rank
    (each rank's group is in A's row order whatever the others hold), made by one pass over A
    that keeps only the entries of ``owned_columns`` (the rank's permuted columns).
    ``positions``: :func:`~.structure.position_arrays` of A's sorted pattern; ``iperm``: the
    ordering, old to new."""
    n = len(iperm)
    part = np.full(n, -1, dtype=np.int64)
    part[np.asarray(owned_columns, dtype=np.int64)] = 0
    rows, cols, source, _ = lower_entries(positions, iperm, index_dtype_for(n), part, 1)
    return rows, cols, source


def plan_structure(sym, mapping, rank):
    """The :class:`PlanStructure` of ``rank``: the supernodes it owns and every top supernode
    above them, from ``sym``'s row structures (a plan complete or not)."""
    owner = mapping.owner
    held_top = np.array([rank in set(h.tolist()) for h in mapping.holders], dtype=bool)
    top_mask = np.zeros(sym.nsuper, dtype=bool)
    top_mask[mapping.top] = True
    held = owner == rank
    held[mapping.top[held_top]] = True
    supernodes = np.flatnonzero(held).astype(np.int64)
    loc = np.full(sym.nsuper, -1, dtype=np.int64)
    loc[supernodes] = np.arange(len(supernodes))
    first = sym.starts[supernodes]
    ncols = sym.starts[supernodes + 1] - first
    nrows = sym.nrows[supernodes]
    panel_offset = np.concatenate([[0], np.cumsum(nrows * ncols)]).astype(np.int64)
    rows_offset = np.concatenate([[0], np.cumsum(nrows)]).astype(np.int64)
    rows = _take_runs(sym.rows, sym.rows_offset[supernodes], sym.rows_offset[supernodes + 1])
    mine = owner[supernodes] == rank
    owned = np.flatnonzero(mine)  # local ids
    owned_columns = _ranges(first[owned], first[owned] + ncols[owned])
    col_sn = np.repeat(owned, ncols[owned])
    diag_pos = panel_offset[col_sn] + (owned_columns - first[col_sn]) * (nrows[col_sn] + 1)
    return PlanStructure(
        n=int(sym.n), rank=int(rank), supernodes=supernodes, first=first, ncols=ncols,
        nrows=nrows, panel_offset=panel_offset, rows_offset=rows_offset, rows=rows,
        local=np.flatnonzero(mine & ~top_mask[supernodes]).astype(np.int64),
        top=np.where(held_top, loc[mapping.top], -1).astype(np.int64),
        top_owner=owner[mapping.top].astype(np.int64), owned_columns=owned_columns,
        diag_pos=diag_pos)


class HeldLayout(NamedTuple):
    """A rank's held columns renumbered 0.. in order (:func:`held_layout`)."""

    columns: np.ndarray  # the held (global permuted) columns, ascending
    where: np.ndarray  # a global column's place among them (-1 where not held)
    rows: np.ndarray  # the held panels' rows, renamed
    starts: np.ndarray  # the held supernodes' first columns, renamed (and the end)
    sn_of: np.ndarray  # the held supernode of every held column


def held_layout(plan):
    """The :class:`HeldLayout` of a rank's plan (:class:`PlanStructure`): every row of a held
    panel is a held column (the supernodes above a held one are held), renamed by one lookup in
    a map over the columns, where a binary search among the held columns had been (2000^2 grid,
    2 ranks on the GPU host: each rank's engine set-up 0.96 s with the search, 0.44-0.61 s with
    the map). Shared by the rank's plan completion and its engine's own plan."""
    columns = _ranges(plan.first, plan.first + plan.ncols)
    where = np.full(plan.n, -1, dtype=index_dtype_for(len(columns)))
    where[columns] = np.arange(len(columns), dtype=where.dtype)
    return HeldLayout(columns, where, to_held(where, plan.rows, f"rank {plan.rank}'s panel rows"),
                      np.concatenate([[0], np.cumsum(plan.ncols)]).astype(np.int64),
                      np.repeat(np.arange(plan.nsuper, dtype=np.int64), plan.ncols))


def to_held(where, global_columns, what):
    """``global_columns`` renamed by :func:`held_layout`'s map; every one must be held:
    otherwise the mapping is inconsistent, and ``what`` is named."""
    found = where[global_columns]
    if len(found) and found.min() < 0:
        raise HisparseError(f"cholesky: {what} reach columns outside those the rank holds (an "
                            f"inconsistent mapping)")
    return found


def complete_plan(structure, entry_rows, entry_cols):
    """The :class:`LocalPlan` of a :class:`PlanStructure`, made by its rank: the relative
    indices of its supernodes' updates (:func:`~.structure.update_plan`) and the offsets of its
    entries of A (rows and permuted columns ``entry_rows``, ``entry_cols``, in the order of the
    values it holds) in its value array, over its :func:`held_layout`."""
    held = held_layout(structure)
    below_offset, col_base, col_rel, rel = update_plan(
        held.rows, structure.rows_offset, structure.nrows, structure.ncols, held.sn_of,
        held.starts, structure.panel_offset, len(held.columns))
    entries = f"rank {structure.rank}'s entries"
    a_dest = entry_offsets(to_held(held.where, np.asarray(entry_rows), entries),
                           to_held(held.where, np.asarray(entry_cols), entries), held.sn_of,
                           held.starts, structure.nrows, structure.panel_offset, held.rows,
                           structure.rows_offset)
    return LocalPlan(**vars(structure), below_offset=below_offset, col_base=col_base,
                     col_rel=col_rel, rel=rel, a_dest=a_dest)


def local_plan(sym, mapping, rank, entries=None):
    """The :class:`LocalPlan` of ``rank`` and the indices of its entries in A's data (the
    caller sends ``values[source]``), made in one place: :func:`plan_structure` then
    :func:`complete_plan`. ``entries``: :class:`LowerEntries` of ``sym`` and ``mapping``
    (made here when not given).

    Returns
    -------
    (LocalPlan, ndarray)
    """
    if entries is None:
        entries = LowerEntries.of_factor(sym, mapping)
    rows, cols, source = entries.of(rank)
    return complete_plan(plan_structure(sym, mapping, rank), rows, cols), source


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


def local_symbolic(plan, block_size):
    """The rank's :class:`LocalPlan` as a :class:`~.factor.SymbolicFactor` of its own: its
    held columns renumbered 0.. in order (every row of a held panel is a held column: the
    supernodes above a held one are held), so an engine written for a whole plan (the GPU
    engine) factors the rank's share. ``perm`` maps a local column to its global permuted
    column; ``counts`` and ``parent`` are not known here (zeros, -1)."""
    from .factor import SymbolicFactor
    held = held_layout(plan)
    columns, starts, sn_of = held.columns, held.starts, held.sn_of
    n = len(columns)
    rows = held.rows.astype(np.int64)
    nh = plan.nsuper
    has_below = plan.nrows > plan.ncols
    sparent = np.full(nh, -1, dtype=np.int64)
    first_below = rows[plan.rows_offset[:-1][has_below] + plan.ncols[has_below]]
    sparent[has_below] = np.searchsorted(starts, first_below, side="right") - 1
    level = _levels(sparent)
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
