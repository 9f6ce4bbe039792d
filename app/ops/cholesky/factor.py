"""The result of the symbolic analysis (:func:`~.symbolic.analyze`): the pattern of the
supernodal factor and the plan of its numeric factorization.
"""
from dataclasses import dataclass, field

import numpy as np

from ...arrays import sorted_distinct


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
        complete their own shares (:func:`~.rank_plan.complete_plan`) from its
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
