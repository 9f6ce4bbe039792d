"""What a two-dimensional (checkerboard) partition of SpMV would move on an R-MAT graph, against
the one-dimensional row blocks hisparse uses (issue 33's 2-D question, answered on the host).

    python jobs/spmv_2d_volume.py SCALE [P ...]      (P: squares, default 4 16 64)

The vector is cut into P equal blocks, block p owned by rank p. 1-D: rank p holds the rows of
block p and receives the distinct columns of them that it does not own (the point-to-point
halo). 2-D on a sqrt(P) x sqrt(P) grid (Boman, Devine & Rajamanickam, SC'13): rank (i, j) holds
the rows of grid row i's blocks and the columns of grid column j's blocks; it receives the
distinct columns of its part that it does not own (expand) and sends the partial sums of the
distinct rows of its part that it does not own (fold). Entries per rank and product; the graph
as generated (vertex ids permuted, no degree order).
"""
import math
import sys
import time

import numpy as np

from hisparse.generators import generate


def owners(n, nranks):
    """Rank of each vector entry: P equal consecutive blocks."""
    bounds = np.linspace(0, n, nranks + 1).astype(np.int64)
    return np.searchsorted(bounds, np.arange(n), side="right") - 1


def distinct_per_rank(rank, index, n, nranks, owner):
    """For each rank, the distinct ``index`` values among its entries that it does not own."""
    pairs = np.unique(rank * n + index)
    holder, value = pairs // n, pairs % n
    return np.bincount(holder[owner[value] != holder], minlength=nranks)


def volumes(rows, cols, n, nranks):
    side = math.isqrt(nranks)
    if side * side != nranks:
        raise SystemExit(f"P = {nranks} is not a square")
    owner = owners(n, nranks)
    row_rank, col_rank = owner[rows], owner[cols]
    one_d = distinct_per_rank(row_rank, cols, n, nranks, owner)
    grid_rank = (row_rank // side) * side + col_rank // side
    expand = distinct_per_rank(grid_rank, cols, n, nranks, owner)
    fold = distinct_per_rank(grid_rank, rows, n, nranks, owner)
    return one_d, expand, fold


def main(argv):
    scale = int(argv[0])
    counts = [int(p) for p in argv[1:]] or [4, 16, 64]
    start = time.perf_counter()
    matrix = generate({"kind": "rmat", "scale": scale, "edge_factor": 16, "seed": 0}).to_scipy()
    coo = matrix.tocoo()
    rows, cols = coo.row.astype(np.int64), coo.col.astype(np.int64)
    n = matrix.shape[0]
    print(f"R-MAT {scale}: n {n:,}, nnz {matrix.nnz:,} ({time.perf_counter() - start:.1f} s)")
    print("P | 1-D received, max / mean | 2-D expand + fold, max / mean | 2-D / 1-D (max)")
    for nranks in counts:
        one_d, expand, fold = volumes(rows, cols, n, nranks)
        two_d = expand + fold
        print(f"{nranks} | {one_d.max():,} / {one_d.mean():,.0f} | {two_d.max():,} / "
              f"{two_d.mean():,.0f} ({expand.mean():,.0f} + {fold.mean():,.0f}) | "
              f"{two_d.max() / max(one_d.max(), 1):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
