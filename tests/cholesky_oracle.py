"""The symbolic analysis as it was before it was compiled (commit 7742e5a, pure Python loops):
the oracle that the compiled analysis must reproduce exactly. Tests only."""
import numpy as np
import scipy.sparse as sp

from hisparse.errors import HisparseError
from hisparse.ops.cholesky.symbolic import SymbolicFactor, fundamental_supernodes

# Guard against plans whose relative indices would not fit in memory (int32 each).
_MAX_RELATIVE_INDICES = 400_000_000

# CHOLMOD's defaults (Utility/t_cholmod_defaults.c): nrelax and zrelax
_CHOLMOD_NRELAX = (4, 16, 48)
_CHOLMOD_ZRELAX = (0.8, 0.1, 0.05)


def _offdiagonal_pattern(matrix):
    """The symmetric pattern of ``matrix`` without its diagonal, CSR with sorted indices."""
    pattern = sp.csr_matrix((np.ones(matrix.nnz, dtype=np.int8), matrix.indices, matrix.indptr),
                            shape=matrix.shape)
    pattern = (pattern + pattern.T).tocsr()
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    pattern.sort_indices()
    return pattern


def fill_reducing_order(matrix, method="auto"):
    """A fill-reducing permutation of a symmetric matrix.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix, shape (n, n)
    method : {"auto", "metis", "rcm", "natural"}
        ``auto`` = METIS when ``pymetis`` imports, else RCM.

    Returns
    -------
    perm : ndarray, shape (n,), int64
        New-to-old order: row/column ``k`` of the permuted matrix is ``perm[k]`` of ``matrix``.
    used : str
        The method actually used.
    """
    n = matrix.shape[0]
    if method == "auto":
        method = "metis"
    if method == "natural" or n <= 1:
        return np.arange(n, dtype=np.int64), "natural"
    pattern = _offdiagonal_pattern(matrix)
    if method == "metis":
        try:
            import pymetis
        except ImportError:
            raise HisparseError("operation.params.ordering: 'metis' needs pymetis (pip install "
                                "pymetis, or the 'pymetis' extra); use 'rcm' or 'auto'") from None
        if pattern.nnz == 0:
            return np.arange(n, dtype=np.int64), "metis"
        adjacency = pymetis.CSRAdjacency(pattern.indptr.astype(np.int32),
                                         pattern.indices.astype(np.int32)) \
            if hasattr(pymetis, "CSRAdjacency") else None
        if adjacency is not None:
            perm, _iperm = pymetis.nested_dissection(adjacency=adjacency)
        else:
            perm, _iperm = pymetis.nested_dissection(xadj=pattern.indptr, adjncy=pattern.indices)
        # pymetis returns (perm, iperm); perm is new-to-old (the pitfall: iperm is not).
        return np.asarray(perm, dtype=np.int64), "metis"
    if method == "rcm":
        from scipy.sparse.csgraph import reverse_cuthill_mckee
        return np.asarray(reverse_cuthill_mckee(pattern, symmetric_mode=True),
                          dtype=np.int64), "rcm"
    raise HisparseError(f"unknown ordering {method!r}")


def elimination_tree(upper):
    """Elimination tree of a symmetric matrix from its upper triangle.

    Parameters
    ----------
    upper : scipy.sparse.csc_matrix, shape (n, n)
        Column ``k`` holds the rows ``i < k`` of A's pattern (others are ignored).

    Returns
    -------
    ndarray, shape (n,), int64
        ``parent[k]``, -1 at roots.
    """
    n = upper.shape[0]
    indptr = upper.indptr.tolist()
    indices = upper.indices.tolist()
    parent = [-1] * n
    ancestor = [-1] * n
    for k in range(n):
        for p in range(indptr[k], indptr[k + 1]):
            i = indices[p]
            # climb from i to the root of its current subtree, compressing the path onto k
            while i != -1 and i < k:
                nxt = ancestor[i]
                ancestor[i] = k
                if nxt == -1:
                    parent[i] = k
                i = nxt
    return np.asarray(parent, dtype=np.int64)


def tree_postorder(parent):
    """Depth-first postorder of a forest (children visited in increasing index order).

    Returns
    -------
    ndarray, shape (n,), int64
        ``post[k]`` = the node visited k-th.
    """
    n = len(parent)
    children = [[] for _ in range(n)]
    roots = []
    for node, par in enumerate(parent.tolist()):
        (roots if par < 0 else children[par]).append(node)
    post = []
    for root in roots:
        stack = [(root, 0)]
        while stack:
            node, index = stack.pop()
            kids = children[node]
            if index < len(kids):
                stack.append((node, index + 1))
                stack.append((kids[index], 0))
            else:
                post.append(node)
    return np.asarray(post, dtype=np.int64)


def column_counts(lower, parent):
    """Nonzeros per column of the Cholesky factor L (diagonal included), Gilbert-Ng-Peyton.

    Parameters
    ----------
    lower : scipy.sparse.csc_matrix, shape (n, n)
        Column ``j`` holds the rows of A's pattern (rows ``i > j`` are used). The matrix must be
        postordered: ``parent[j] > j`` and every subtree a contiguous range.
    parent : ndarray, shape (n,), int64

    Returns
    -------
    ndarray, shape (n,), int64
    """
    n = len(parent)
    par = parent.tolist()
    indptr = lower.indptr.tolist()
    indices = lower.indices.tolist()
    # first[j]: first (smallest) descendant of j; in postorder = j - subtree size + 1
    size = [1] * n
    for j in range(n):
        if par[j] >= 0:
            size[par[j]] += size[j]
    first = [j - size[j] + 1 for j in range(n)]
    delta = [1 if size[j] == 1 else 0 for j in range(n)]  # leaves start at 1
    maxfirst = [-1] * n
    prevleaf = [-1] * n
    ancestor = list(range(n))
    for j in range(n):
        if par[j] >= 0:
            delta[par[j]] -= 1
        fj = first[j]
        for p in range(indptr[j], indptr[j + 1]):
            i = indices[p]
            if i <= j or fj <= maxfirst[i]:
                continue  # not a leaf of row i's subtree
            maxfirst[i] = fj
            jprev = prevleaf[i]
            prevleaf[i] = j
            delta[j] += 1
            if jprev != -1:
                # least common ancestor of jprev and j: root of jprev's current set
                q = jprev
                while q != ancestor[q]:
                    q = ancestor[q]
                s = jprev
                while s != q:
                    nxt = ancestor[s]
                    ancestor[s] = q
                    s = nxt
                delta[q] -= 1
        if par[j] >= 0:
            ancestor[j] = par[j]
    counts = delta
    for j in range(n):
        if par[j] >= 0:
            counts[par[j]] += counts[j]
    return np.asarray(counts, dtype=np.int64)


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
    last = starts[1:] - 1
    sn_of = np.repeat(np.arange(nf), np.diff(starts))
    sparent = np.where(parent[last] >= 0, sn_of[np.maximum(parent[last], 0)], -1).tolist()
    nscol = np.diff(starts).tolist()
    snz = counts[starts[:-1]].tolist()
    zeros = [0.0] * nf
    merged = [-1] * nf
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
        nscol0, nscol1 = nscol[j], nscol[j + 1]
        ns = nscol0 + nscol1
        lnz0, lnz1 = snz[j], snz[j + 1]
        newzeros = nscol0 * (lnz1 + nscol0 - lnz0)
        totzeros = zeros[j + 1] + newzeros
        if rule == "threshold":
            merge = nscol0 < merge_threshold and nscol1 < merge_threshold
        else:
            if ns <= _CHOLMOD_NRELAX[0] or newzeros == 0:
                merge = True
            else:
                z = totzeros / (ns * (ns + 1) / 2.0 + ns * (lnz1 - nscol1))
                merge = ((ns <= _CHOLMOD_NRELAX[1] and z < _CHOLMOD_ZRELAX[0])
                         or (ns <= _CHOLMOD_NRELAX[2] and z < _CHOLMOD_ZRELAX[1])
                         or z < _CHOLMOD_ZRELAX[2])
        if merge:
            zeros[j] = totzeros
            merged[j + 1] = j
            snz[j] = nscol0 + lnz1
            nscol[j] = ns
    keep = np.array([m == -1 for m in merged])
    return np.concatenate([starts[:-1][keep], starts[-1:]]).astype(np.int64)


def analyze(matrix, ordering="auto", relaxation="threshold", merge_threshold=64,
            block_size=1024):
    """Full symbolic analysis of a symmetric sparse matrix.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix, shape (n, n), float
        Both triangles stored; only the pattern is used, plus the positions of its entries (for
        the value map of the numeric factorization).
    ordering : {"auto", "metis", "rcm", "natural"}
    relaxation : {"threshold", "cholmod", "none"}
    merge_threshold : int
        Column threshold of the ``threshold`` rule.
    block_size : int
        Columns per block task of big supernodes.

    Returns
    -------
    SymbolicFactor
    """
    matrix = sp.csr_matrix(matrix)
    n = matrix.shape[0]
    # Track where every (sorted) entry sits in the caller's CSR data, for the value map.
    positions = sp.csr_matrix((np.arange(matrix.nnz, dtype=np.float64), matrix.indices.copy(),
                              matrix.indptr.copy()), shape=matrix.shape)
    positions.sort_indices()
    matrix = positions
    order, used = fill_reducing_order(matrix, ordering)
    # Etree of the permuted pattern, then compose the ordering with the etree postorder.
    pattern = sp.csr_matrix((np.ones(matrix.nnz), matrix.indices, matrix.indptr), shape=(n, n))
    permuted = pattern[order][:, order]
    parent = elimination_tree(sp.triu(permuted, k=1, format="csc"))
    post = tree_postorder(parent)
    perm = order[post]
    iperm = np.empty(n, dtype=np.int64)
    iperm[perm] = np.arange(n)
    ipost = np.empty(n, dtype=np.int64)
    ipost[post] = np.arange(n)
    parent = np.where(parent[post] >= 0, ipost[np.maximum(parent[post], 0)], -1)
    permuted = pattern[perm][:, perm]
    lower = sp.tril(permuted, k=-1, format="csc")
    lower.sort_indices()
    counts = column_counts(lower, parent)
    fund = fundamental_supernodes(parent, counts)
    starts = relaxed_supernodes(fund, parent, counts, relaxation, merge_threshold)
    return _build_plan(matrix, perm, iperm, parent, counts, len(fund) - 1, starts, lower,
                       block_size, used, relaxation)


def _build_plan(matrix, perm, iperm, parent, counts, nfund, starts, lower, block_size, used,
                relaxation):
    n = len(perm)
    ns = len(starts) - 1
    ncols = np.diff(starts)
    sn_of = np.repeat(np.arange(ns, dtype=np.int64), ncols)
    last = starts[1:] - 1
    sparent = np.where(parent[last] >= 0, sn_of[np.maximum(parent[last], 0)], -1) \
        if ns else np.zeros(0, dtype=np.int64)
    # Row structure of each relaxed supernode: its own columns, A's rows below them, and the
    # children's rows beyond its last column (children have smaller indices in postorder).
    children = [[] for _ in range(ns)]
    for s, p in enumerate(sparent.tolist()):
        if p >= 0:
            children[p].append(s)
    lindptr, lindices = lower.indptr, lower.indices
    structs = [None] * ns
    level = np.zeros(ns, dtype=np.int64)
    for s in range(ns):
        f, l1 = int(starts[s]), int(starts[s + 1])
        pieces = [np.arange(f, l1, dtype=np.int64), lindices[lindptr[f]:lindptr[l1]]]
        for c in children[s]:
            rows_c = structs[c]
            pieces.append(rows_c[rows_c >= l1])
            level[s] = max(level[s], level[c] + 1)
        rows_s = np.unique(np.concatenate(pieces).astype(np.int64))
        structs[s] = rows_s
    nrows = np.array([len(r) for r in structs], dtype=np.int64)
    rows_offset = np.concatenate([[0], np.cumsum(nrows)]).astype(np.int64)
    rows = np.concatenate(structs).astype(np.int64) if ns else np.zeros(0, dtype=np.int64)
    panel_offset = np.concatenate([[0], np.cumsum(nrows * ncols)]).astype(np.int64)
    # Every (supernode, row) pair as one sorted key, so that "position of row r in supernode
    # t's row list" is one vectorized binary search: searchsorted(keys, t * n + r) - offset[t].
    owner = np.repeat(np.arange(ns, dtype=np.int64), nrows)
    keys = owner * n + rows

    def positions_in(targets, query_rows):
        return np.searchsorted(keys, targets * n + query_rows) - rows_offset[targets]

    # Relative indices of every supernode's update into its ancestors. The below-diagonal rows
    # of s are grouped by the target supernode owning them; group g (rows g0..g1 of s's below
    # list, target t) needs the positions in t of s's below rows g0..m (all of them lie in t by
    # the structure theorem).
    m = nrows - ncols
    below_offset = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    below_mask = (np.arange(len(rows)) - rows_offset[owner]) >= ncols[owner]
    below = rows[below_mask]
    below_owner = owner[below_mask]
    target = sn_of[below]
    nb = len(below)
    new_group = np.ones(nb, dtype=bool)
    if nb > 1:
        new_group[1:] = (below_owner[1:] != below_owner[:-1]) | (target[1:] != target[:-1])
    group_begin = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1
    group_target = target[group_begin]
    group_segment_end = below_offset[below_owner[group_begin] + 1]
    group_lengths = group_segment_end - group_begin
    total = int(group_lengths.sum())
    if total > _MAX_RELATIVE_INDICES:
        raise HisparseError(
            f"cholesky: the relative-index plan needs {total:.2e} entries (> "
            f"{_MAX_RELATIVE_INDICES:.0e}); use operation.params.relaxation 'threshold' or "
            f"'cholmod' (fewer, larger supernodes)")
    group_rel_start = np.concatenate([[0], np.cumsum(group_lengths)[:-1]]).astype(np.int64)
    # concatenated ranges [group_begin, segment_end) of every group
    query = np.repeat(group_begin - group_rel_start, group_lengths) + np.arange(total)
    rel = positions_in(np.repeat(group_target, group_lengths), below[query]).astype(np.int32)
    segment_begin = below_offset[below_owner]
    col_rel = (group_rel_start[group_of] - (group_begin[group_of] - segment_begin)
               ).astype(np.int64)
    col_base = (panel_offset[target] + (below - starts[target]) * nrows[target]).astype(np.int64)
    # Map of A's entries (lower triangle of the permuted matrix) into the panels.
    coo = matrix.tocoo()
    new_r, new_c = iperm[coo.row], iperm[coo.col]
    keep = np.flatnonzero(new_r >= new_c)
    a_source = coo.data[keep].astype(np.int64)  # the entry's index in the caller's CSR data
    r, c = new_r[keep], new_c[keep]
    s_of = sn_of[c]
    a_dest = panel_offset[s_of] + (c - starts[s_of]) * nrows[s_of] + positions_in(s_of, r)
    j = np.arange(n, dtype=np.int64)
    diag_pos = panel_offset[sn_of] + (j - starts[sn_of]) * nrows[sn_of] + (j - starts[sn_of])
    factor = SymbolicFactor(
        n=n, perm=perm, iperm=iperm, parent=parent, counts=counts, fundamental=nfund,
        starts=starts, nrows=nrows, panel_offset=panel_offset, rows_offset=rows_offset,
        rows=rows, sparent=sparent, level=level, below_offset=below_offset, col_base=col_base,
        col_rel=col_rel, rel=rel, a_source=a_source, a_dest=a_dest, diag_pos=diag_pos,
        block_size=int(block_size), ordering=used, relaxation=relaxation)
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
