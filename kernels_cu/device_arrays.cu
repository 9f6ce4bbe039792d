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

// The SpMV plan's split of a rank's rows into its local and ghost blocks (app/gpu/_raw.py,
// RowsOnDevice.split): whether column's x entry is owned here -- in [first, first + count), or
// table[column] >= 0 with a table (use_table) -- and its local position there.
__device__ __forceinline__ bool owned_column(long long column, long long first, long long count,
                                             const long long* __restrict__ table, int use_table,
                                             long long* local)
{
    if (use_table) {
        *local = table[column];
        return *local >= 0;
    }
    *local = column - first;
    return *local >= 0 && *local < count;
}

// ghost[e] = 1 where entry e's x entry is another rank's (else 0), and marked[column] = 1 for
// those columns (threads may mark one column at once: each writes the same value).
extern "C" __global__ void mark_ghost_entries(const long long* __restrict__ columns,
                                              long long total, long long first, long long count,
                                              const long long* __restrict__ table,
                                              int use_table, long long* __restrict__ ghost,
                                              long long* __restrict__ marked)
{
    long long local;
    for (long long e = global_thread_id(); e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long column = columns[e];
        const bool owned = owned_column(column, first, count, table, use_table, &local);
        ghost[e] = owned ? 0 : 1;
        if (!owned) marked[column] = 1;
    }
}

// Every entry to its block, in row order: before[e] (the exclusive sum of mark_ghost_entries'
// flags) ghost entries precede entry e, so an owned entry lands at e - before[e] of the local
// block at its local column, a ghost one at before[e] of the ghost block at column
// ghost_of[column] (the exclusive sum of the marked columns: ghost columns numbered in ascending
// order). With write_sources, each entry's place in the rows beside it (the values follow by a
// gather).
extern "C" __global__ void place_split_entries(const long long* __restrict__ columns,
                                               long long total, long long first, long long count,
                                               const long long* __restrict__ table,
                                               int use_table,
                                               const long long* __restrict__ before,
                                               const long long* __restrict__ ghost_of,
                                               long long* __restrict__ local_columns,
                                               long long* __restrict__ ghost_columns,
                                               int write_sources,
                                               long long* __restrict__ local_sources,
                                               long long* __restrict__ ghost_sources)
{
    long long local;
    for (long long e = global_thread_id(); e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long column = columns[e];
        const long long ghosts_before = before[e];
        if (owned_column(column, first, count, table, use_table, &local)) {
            local_columns[e - ghosts_before] = local;
            if (write_sources) local_sources[e - ghosts_before] = e;
        } else {
            ghost_columns[ghosts_before] = ghost_of[column];
            if (write_sources) ghost_sources[ghosts_before] = e;
        }
    }
}

// out[prefix[i]] = i for every i in [0, n) where prefix[i + 1] > prefix[i] (prefix: the exclusive
// sum of 0/1 flags, n + 1 entries): the flagged positions, ascending.
extern "C" __global__ void flagged_positions(const long long* __restrict__ prefix, long long n,
                                             long long* __restrict__ out)
{
    for (long long i = global_thread_id(); i < n; i += (long long)gridDim.x * blockDim.x)
        if (prefix[i + 1] > prefix[i]) out[prefix[i]] = i;
}
