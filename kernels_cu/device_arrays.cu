// Array steps on CuPy arrays that CuPy's own routines would make with a scalar operand (app/gpu/
// _raw.py, one CuPy RawModule): CuPy loads cupyx, and with it SciPy's sparse package, at its
// first operation between an array and a scalar and in bincount (0.3-0.45 s of a process's
// set-up on the H200 host), which these kernels do not need.

#include "hisparse_common.cuh"

// Values each thread of count_values takes, consecutive: a run of equal values among them is
// one atomic addition (a generated tensor's coordinate columns hold runs of equal indices, one
// per fiber, and atomic additions to one address serialise).
#define COUNT_ITEMS 16

// counts[v] += the number of v in values (every value in [0, size); counts zeroed before).
extern "C" __global__ void count_values(const long long* __restrict__ values, long long count,
                                        unsigned long long* __restrict__ counts)
{
    const long long first = global_thread_id() * COUNT_ITEMS;
    if (first >= count) return;
    const long long last = first + COUNT_ITEMS < count ? first + COUNT_ITEMS : count;
    long long current = values[first];
    unsigned long long run = 1;
    for (long long i = first + 1; i < last; ++i) {
        const long long value = values[i];
        if (value == current) {
            ++run;
            continue;
        }
        atomicAdd(counts + current, run);
        current = value;
        run = 1;
    }
    atomicAdd(counts + current, run);
}

// CSRMatrix.rows and CSRMatrix.renumbered on the device (app/gpu/_raw.py, RowsOnDevice): output
// entry j of the rows `row_ids` (new -> old), whose row pointers are new_indptr (nrows + 1, the
// last one the entry count), lies in row *row, the last row starting at or before j (empty rows
// share their start with the next row, hence the last); it is entry j - new_indptr[*row] of old
// row row_ids[*row]. Returns that entry's place in the old arrays.
__device__ __forceinline__ long long entry_source(const long long* __restrict__ indptr,
                                                  const long long* __restrict__ row_ids,
                                                  const long long* __restrict__ new_indptr,
                                                  long long nrows, long long j, long long* row)
{
    long long low = 0, high = nrows;  // new_indptr[low] <= j < new_indptr[high]
    while (high - low > 1) {
        const long long middle = low + (high - low) / 2;
        if (new_indptr[middle] <= j) low = middle;
        else high = middle;
    }
    *row = low;
    return indptr[row_ids[low]] + (j - new_indptr[low]);
}

// CSRMatrix.rows: the old place of every output entry (the columns and values are gathered from
// them).
extern "C" __global__ void row_sources(const long long* __restrict__ indptr,
                                       const long long* __restrict__ row_ids,
                                       const long long* __restrict__ new_indptr,
                                       long long nrows, long long total,
                                       long long* __restrict__ sources)
{
    long long row;
    for (long long j = global_thread_id(); j < total; j += (long long)gridDim.x * blockDim.x)
        sources[j] = entry_source(indptr, row_ids, new_indptr, nrows, j, &row);
}

// CSRMatrix.renumbered: the key of output entry j is (its row << column_bits) | new_column[its old
// column]; sorting the keys sorts every row by its new columns and keeps the rows in place
// (stable: duplicates keep their order). `sources`, where write_sources: the old place of each
// output entry, for the values to follow.
extern "C" __global__ void renumbered_keys(const long long* __restrict__ indptr,
                                           const long long* __restrict__ indices,
                                           const long long* __restrict__ row_ids,
                                           const long long* __restrict__ new_indptr,
                                           long long nrows,
                                           const long long* __restrict__ new_column,
                                           int column_bits, long long total,
                                           unsigned long long* __restrict__ keys,
                                           int write_sources, long long* __restrict__ sources)
{
    long long row;
    for (long long j = global_thread_id(); j < total; j += (long long)gridDim.x * blockDim.x) {
        const long long source = entry_source(indptr, row_ids, new_indptr, nrows, j, &row);
        keys[j] = ((unsigned long long)row << column_bits) |
                  (unsigned long long)new_column[indices[source]];
        if (write_sources) sources[j] = source;
    }
}

// The column of each sorted key of renumbered_keys (its low column_bits bits).
extern "C" __global__ void key_columns(const unsigned long long* __restrict__ keys,
                                       int column_bits, long long total,
                                       long long* __restrict__ columns)
{
    const unsigned long long mask = (1ULL << column_bits) - 1ULL;
    for (long long j = global_thread_id(); j < total; j += (long long)gridDim.x * blockDim.x)
        columns[j] = (long long)(keys[j] & mask);
}
