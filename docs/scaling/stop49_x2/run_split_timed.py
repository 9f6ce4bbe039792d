"""hisparse run with the compiled split timed per step, run twice (the first result dropped)."""
import sys, time
import numpy as np
import hisparse.distmatrix._row_blocks as rb
from hisparse.compiled import thread_count
orig = rb._split_compiled

def steps(matrix, position, n_owned):
    marks = [time.perf_counter()]
    def mark():
        marks.append(time.perf_counter())
    columns = matrix.indices
    index_dtype = columns.dtype
    indptr = np.asarray(matrix.indptr, dtype=np.int64)
    contiguous = position.first is not None
    first = int(position.first) if contiguous else 0
    table = np.zeros(0, np.int32) if contiguous else position._position
    row_cuts = rb.balanced_row_cuts(indptr)
    ghost_lengths = np.zeros(matrix.nrows, dtype=np.int64)
    marked = np.zeros(position.n_global, dtype=np.uint8); mark()
    rb._count_ghost_entries(indptr, columns, contiguous, first, position.count, table, row_cuts, ghost_lengths, marked); mark()
    ghosts = np.flatnonzero(marked)
    ghost_before = np.zeros(matrix.nrows + 1, dtype=np.int64)
    np.cumsum(ghost_lengths, out=ghost_before[1:])
    ghost_rows = np.flatnonzero(ghost_lengths)
    local_indptr = indptr - ghost_before
    ghost_of = np.empty(position.n_global, dtype=index_dtype)
    ghost_of[ghosts] = np.arange(len(ghosts), dtype=index_dtype)
    n_ghost = int(ghost_before[-1]); mark()
    local_indices = np.empty(matrix.nnz - n_ghost, dtype=index_dtype)
    local_values = np.empty(matrix.nnz - n_ghost, dtype=matrix.data.dtype)
    ghost_indices = np.empty(n_ghost, dtype=index_dtype)
    ghost_values = np.empty(n_ghost, dtype=matrix.data.dtype); mark()
    rb._place_block_entries(indptr, columns, matrix.data, contiguous, first, position.count,
        table, ghost_of, row_cuts, local_indptr, ghost_before, local_indices, local_values,
        ghost_indices, ghost_values); mark()
    local_indices[:] = 0; local_values[:] = 0; mark()
    return np.diff(marks)

def timed(matrix, position, n_owned, load_only=False):
    if load_only:
        return orig(matrix, position, n_owned, load_only)
    t = time.perf_counter()
    s = steps(matrix, position, n_owned)
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    out = orig(matrix, position, n_owned)
    t2 = time.perf_counter() - t
    print(f"threads {thread_count()} first {t1:.3f} [prep {s[0]:.3f} count {s[1]:.3f} tables {s[2]:.3f} alloc {s[3]:.4f} place {s[4]:.3f} rewrite {s[5]:.3f}] second {t2:.3f}", flush=True)
    return out
rb._split_compiled = timed
from hisparse.cli import main
sys.exit(main(sys.argv[1:]))
