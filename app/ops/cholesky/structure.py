"""The supernodes' row structures and the numeric plan of the symbolic analysis (steps 4 and 5
of :mod:`.symbolic`): every supernode's row list, the map of A's entries into the panels
(:func:`lower_entries`, :func:`entry_offsets`), the update groups and their relative indices
(:func:`update_plan`), and :func:`_build_plan`, which makes them a
:class:`~.factor.SymbolicFactor`. A rank completing its own share of the plan
(:func:`~.rank_plan.complete_plan`) runs the same passes.

The loops are compiled by Numba when it is there (``@_compiled``; see :mod:`.symbolic`).
"""
import numpy as np
import scipy.sparse as sp

from ... import threads
from ...errors import HisparseError
from ...timing import StepClock

# The sequential loops below are compiled when Numba is there (see :mod:`.symbolic`).
from ...compiled import prange
from ...compiled import compiled as _compiled
from ...compiled import compiled_parallel as _compiled_parallel
from ...compiled import thread_count as _thread_count
from .etree import _parallel_pieces, _work_cuts
from .factor import SymbolicFactor

# Guard against plans whose relative indices would not fit in memory (int32 each, 16 GB at the
# limit; offsets into them are int64 on the host and the GPU). The 250^3 Laplacian needs 5.9e8.
_MAX_RELATIVE_INDICES = 4_000_000_000


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


def update_plan(rows, rows_offset, nrows, ncols, sn_of, starts, panel_offset, n):
    """Relative indices of every supernode's update into its ancestors: ``(below_offset,
    col_base, col_rel, rel)`` of :class:`SymbolicFactor`, for the supernodes whose columns are
    ``starts[s]:starts[s] + ncols[s]`` of ``n`` (``sn_of``: every column's supernode; every row
    of a list is a column of some supernode). The below-diagonal rows of s are grouped by the
    target supernode owning them; group g (rows g0..g1 of s's below list, target t) needs the
    positions in t of s's below rows g0..m (all of them lie in t by the structure theorem).
    The whole plan's (:func:`analyze`) or one rank's share (:func:`~.rank_plan.complete_plan`)."""
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
