"""The supernodes of the symbolic analysis (step 4 of :mod:`.symbolic`): fundamental
supernodes, relaxed amalgamation (the ``threshold`` rule or CHOLMOD's), and on several ranks the
top boundaries kept apart and the top separators cut into pieces; the supernodal tree and the
work of every supernode and subtree (CHOLMOD's sum of squared column counts), which the subtree
mapping weighs too (:mod:`.mapping`).

The loops are compiled by Numba when it is there (``@_compiled``; see :mod:`.symbolic`).
"""
import numpy as np

from ...arrays import with_sorted

# The sequential loops below are compiled when Numba is there (see :mod:`.symbolic`).
from ...compiled import compiled as _compiled

RELAXATIONS = ("threshold", "cholmod", "none")

# CHOLMOD's defaults (Utility/t_cholmod_defaults.c): nrelax and zrelax
_CHOLMOD_NRELAX = (4, 16, 48)
_CHOLMOD_ZRELAX = (0.8, 0.1, 0.05)


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
