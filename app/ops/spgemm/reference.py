"""The verification's C = A B on the host, compiled (:mod:`hisparse.compiled`): Gustavson's
row-by-row product with a dense accumulator per block of rows, the blocks on every core. Each
entry of C is summed in SciPy's order (A's row entries in turn, each through B's row), entries
that cancel to 0 are dropped as SciPy drops them and each row's columns come sorted, so the
result is SciPy's ``(A @ B)`` with sorted indices, array for array. SciPy's product runs on one
core, which made it most of the verification's time (docs/ops/spgemm.md, stop 29)."""
import numpy as np

from ...compiled import compiled_parallel, prange
from ... import threads
from ...formats import balanced_row_cuts, row_sums


@compiled_parallel
def _row_sizes(a_indptr, a_indices, b_indptr, b_indices, ncols, cuts, sizes):
    """``sizes[i]``: the distinct columns of row i of A B (before cancellation)."""
    for block in prange(len(cuts) - 1):
        seen = np.full(ncols, -1, dtype=np.int64)
        for row in range(cuts[block], cuts[block + 1]):
            count = 0
            for a_entry in range(a_indptr[row], a_indptr[row + 1]):
                middle = a_indices[a_entry]
                for b_entry in range(b_indptr[middle], b_indptr[middle + 1]):
                    column = b_indices[b_entry]
                    if seen[column] != row:
                        seen[column] = row
                        count += 1
            sizes[row] = count


@compiled_parallel
def _rows(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, ncols, cuts, starts,
          columns, values, kept):
    """Row i of A B at ``starts[i]`` of ``columns`` / ``values``: sorted, its nonzero sums
    first; ``kept[i]`` = how many are nonzero."""
    for block in prange(len(cuts) - 1):
        seen = np.full(ncols, -1, dtype=np.int64)
        sums = np.zeros(ncols, dtype=np.float64)
        for row in range(cuts[block], cuts[block + 1]):
            start, count = starts[row], 0
            for a_entry in range(a_indptr[row], a_indptr[row + 1]):
                middle, scale = a_indices[a_entry], a_data[a_entry]
                for b_entry in range(b_indptr[middle], b_indptr[middle + 1]):
                    column = b_indices[b_entry]
                    if seen[column] != row:
                        seen[column] = row
                        sums[column] = 0.0
                        columns[start + count] = column
                        count += 1
                    sums[column] += scale * b_data[b_entry]
            columns[start:start + count].sort()
            nonzero = 0
            for k in range(start, start + count):
                column = columns[k]
                if sums[column] != 0.0:
                    columns[start + nonzero] = column
                    values[start + nonzero] = sums[column]
                    nonzero += 1
            kept[row] = nonzero


@compiled_parallel
def _pack(starts, indptr, cuts, columns, values, out_columns, out_values):
    """The first ``indptr[i + 1] - indptr[i]`` entries of row i, from ``starts[i]``, packed."""
    for block in prange(len(cuts) - 1):
        for row in range(cuts[block], cuts[block + 1]):
            source, lo, hi = starts[row], indptr[row], indptr[row + 1]
            for k in range(hi - lo):
                out_columns[lo + k] = columns[source + k]
                out_values[lo + k] = values[source + k]


#: most bytes the threads' accumulators (16 bytes per column of B each) may take together; past
#: it (B with very many columns) SciPy's one-core product runs instead
ACCUMULATOR_BYTES = 4 << 30


def csr_matmat(a, b):
    """``A @ B`` of two SciPy CSR matrices in float64, sorted and without cancelled zeros (as a
    SciPy CSR matrix), on this process's cores."""
    import scipy.sparse as sp
    if 16 * b.shape[1] * threads.usable_cores() > ACCUMULATOR_BYTES:
        product = (a.astype(np.float64) @ b.astype(np.float64)).tocsr()
        product.sort_indices()
        return product
    a_indptr, b_indptr = (np.asarray(m.indptr, dtype=np.int64) for m in (a, b))
    a_data, b_data = (np.asarray(m.data, dtype=np.float64) for m in (a, b))
    nrows, ncols = a.shape[0], b.shape[1]
    # Rows dealt by their products (B's row lengths summed over A's row), not their entries.
    b_lengths = np.diff(b_indptr)
    products = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(row_sums(a_indptr, lambda lo, hi: b_lengths[a.indices[lo:hi]], np.int64),
              out=products[1:])
    cuts = balanced_row_cuts(products)
    sizes = np.zeros(nrows, dtype=np.int64)
    _row_sizes(a_indptr, a.indices, b_indptr, b.indices, ncols, cuts, sizes)
    starts = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    index_dtype = np.int64 if max(int(starts[-1]), ncols) > np.iinfo(np.int32).max else np.int32
    columns = np.empty(int(starts[-1]), dtype=index_dtype)
    values = np.empty(int(starts[-1]), dtype=np.float64)
    kept = np.zeros(nrows, dtype=np.int64)
    _rows(a_indptr, a.indices, a_data, b_indptr, b.indices, b_data, ncols, cuts, starts,
          columns, values, kept)
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(kept, out=indptr[1:])
    if indptr[-1] == starts[-1]:  # nothing cancelled: the arrays are C's already
        out_columns, out_values = columns, values
    else:
        out_columns = np.empty(int(indptr[-1]), dtype=index_dtype)
        out_values = np.empty(int(indptr[-1]), dtype=np.float64)
        _pack(starts, indptr, cuts, columns, values, out_columns, out_values)
    return sp.csr_matrix((out_values, out_columns, indptr.astype(index_dtype)),
                         shape=(nrows, ncols))


@compiled_parallel
def _compare_blocks(indptr, indices, values, ref_indptr, ref_indices, ref_values, cuts,
                    differs, largest, not_a_number):
    """Per block of rows: whether the structure differs from the reference's, and (while it
    does not) the largest absolute difference of values and whether one was NaN."""
    for block in prange(len(cuts) - 1):
        other, big, nan = False, 0.0, False
        for row in range(cuts[block], cuts[block + 1]):
            lo, hi = indptr[row], indptr[row + 1]
            if ref_indptr[row] != lo or ref_indptr[row + 1] != hi:
                other = True
                break
            for k in range(lo, hi):
                if indices[k] != ref_indices[k]:
                    other = True
                    break
                gap = abs(np.float64(values[k]) - ref_values[k])
                if gap != gap:
                    nan = True
                elif gap > big:
                    big = gap
            if other:
                break
        differs[block], largest[block], not_a_number[block] = other, big, nan


def same_structure_error(result, reference):
    """``(same_structure, largest)`` of C against the reference (CSR, the same shape), in one
    pass on every core: whether its row pointers and columns are the reference's, and, when
    they are, the largest absolute difference of the values (NaN if one is NaN)."""
    indptr = np.asarray(result.indptr, dtype=np.int64)
    ref_indptr = np.asarray(reference.indptr, dtype=np.int64)
    if len(ref_indptr) != len(indptr) or int(ref_indptr[-1]) != int(indptr[-1]):
        return False, float("nan")
    cuts = balanced_row_cuts(indptr)
    blocks = max(len(cuts) - 1, 0)
    differs, nan = np.zeros(blocks, dtype=np.bool_), np.zeros(blocks, dtype=np.bool_)
    largest = np.zeros(blocks, dtype=np.float64)
    if blocks:
        _compare_blocks(indptr, result.indices, result.data, ref_indptr, reference.indices,
                        np.asarray(reference.data, dtype=np.float64), cuts, differs, largest, nan)
    if differs.any():
        return False, float("nan")
    return True, float("nan") if nan.any() else float(largest.max(initial=0.0))
