// Hash SpGEMM, C = A B, in two phases over binned rows (nsparse / OpSparse scheme).
//
//   1. row_products + scatter_bins: intermediate products of each row of A, a symbolic bin per
//      row from min(products, ncols(B)) (an upper bound of the row's output), bins filled with
//      block-aggregated atomics.
//   2. symbolic_shared / symbolic_dense / symbolic_global: distinct output columns per row,
//      counted in a hash table of column keys (shared memory, sized per bin), or in a shared
//      bitmap of B's columns for rows whose table would be larger than that bitmap (a
//      global-memory table for rows that overflow the largest shared table without one).
//   3. scan_*: row pointers of C (int64) from the per-row counts.
//   4. numeric_bins + scatter_bins: numeric bins by the exact output size of each row.
//   5. numeric_shared: accumulate a_ik * b_kj into (column, value) hash tables in shared memory,
//      then write the row to C in column order: by rank in a bitmap of B's columns where that
//      bitmap fits beside the table (write_row_by_rank: no sort), else compaction + rank or
//      bitonic sort of the entries (small tables) or bitonic sort of the whole table (one row
//      per block). Rows beyond the largest shared table: numeric_window (dense accumulators over
//      column windows in shared memory, written in column order; each window's products found
//      by binary search in B's sorted rows) when B is narrow enough for them, else
//      numeric_global (global hash tables, bitonic-sorted).
//
// Bounded output (small products, where launches and the read-back of nnz(C) outweigh the
// symbolic work): steps 1-4 are skipped. Each row's bin comes from its bound min(products,
// ncols(B)), fixed for the run; numeric_shared / numeric_window write the row at its slot in a
// buffer laid out by the bounds and report its entry count (row_nnz_out); scan_* give C's row
// pointers and compact_rows packs the rows in place, so C is the front of that buffer.
//
// One-row-per-block groups on power-law B deal a row's products to their warps in chunks of 32
// (warp_products, ``balanced``): the products sit on a few hub rows of B, which one warp per A
// entry walked alone.
//
// Bin row lists are built on the device (scatter_bins finds each bin's start from the counts),
// so launching a bin needs no read-back from the host beyond its size.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T  float | double       (values of A, B and C)
//   INDEX_T  int | long long      (row pointers and column indices of A and B, columns of C)
//   B_TEAM   1, 2, 4, 8, 16 or 32 (default 32): lanes that walk one B row together. A warp (or a
//            smaller group) is split into teams of B_TEAM lanes that take A's entries in turn, so
//            B rows shorter than a warp do not leave most lanes idle (the host sizes it from B's
//            row length averaged over the products, app/ops/spgemm/gpu.py
//            product_weighted_row_length).
// Row pointers of C and product counts are always 64-bit.
//
// Shared-memory tables are dynamic: the host passes the table size per row and the number of
// rows per block ("group" of threads per row), and raises the kernel's dynamic shared memory
// limit for the bins above 48 KB. Every thread of a block reaches every __syncthreads: inactive
// rows are masked, never returned early.

#include "hisparse_common.cuh"

typedef VALUE_T value_t;
typedef INDEX_T index_t;
typedef long long offset_t;

#ifndef B_TEAM
#define B_TEAM 32
#endif
static_assert(B_TEAM >= 1 && B_TEAM <= 32 && (B_TEAM & (B_TEAM - 1)) == 0,
              "B_TEAM must be a power of two <= 32");

// Lanes per team in a group of group_size lanes (a power of two; 32 for a whole warp): B_TEAM,
// or the whole group when it is smaller. The symbolic and numeric rows and warp_products size
// their teams by this one rule.
__device__ __forceinline__ int team_lanes(int group_size)
{
    return group_size < B_TEAM ? group_size : B_TEAM;
}

template <int N> struct UnsignedOf;
template <> struct UnsignedOf<4> { typedef unsigned int type; };
template <> struct UnsignedOf<8> { typedef unsigned long long type; };
// Keys compared as unsigned put the empty key (-1, all ones) after every column index.
typedef UnsignedOf<sizeof(index_t)>::type ukey_t;

// The numeric kernels' operands and output, each as one parameter list (each array a
// __restrict__ kernel parameter, so its loads take the read-only path) with the matching
// arguments: A and B in CSR; C's row pointers (int64, of the whole product), the first entry
// the column and value arrays hold (c_base: row r starts at c_indptr[r] - c_base), and those
// arrays. The engine passes them in this order.
#define A_B_PARAMS                                                                          \
    const index_t* __restrict__ a_indptr, const index_t* __restrict__ a_indices,            \
        const value_t* __restrict__ a_data, const index_t* __restrict__ b_indptr,           \
        const index_t* __restrict__ b_indices, const value_t* __restrict__ b_data
#define A_B_ARGS a_indptr, a_indices, a_data, b_indptr, b_indices, b_data
#define C_OUT_PARAMS                                                                        \
    const long long* __restrict__ c_indptr, const long long c_base,                         \
        index_t* __restrict__ c_indices, value_t* __restrict__ c_data

#define EMPTY_KEY ((index_t)-1)
#define MAX_BINS 32
// 2^32 / the golden ratio, odd: Fibonacci hashing's multiplier
#define HASH_MULTIPLIER 2654435769u

// The home slot of ``col`` in a table of mask + 1 slots (a power of two): the top log2(size)
// bits of the low 32 bits of col * HASH_MULTIPLIER (Fibonacci hashing). A stencil's columns in
// one row of C differ by sums of its grid's strides; the low bits of col * 107 (the hash until
// stop 64) put every stride that is a multiple of the table size on one slot (a 27-point row's
// three planes: at least three probes an insert, 2187-2955 for a row's 729 products in tables
// of 512-1024 slots, against 729-803 with these bits: docs/ops/spgemm.md, "Stop 64").
__device__ __forceinline__ unsigned int hash_slot(index_t col, unsigned int mask)
{
    const unsigned int mixed = (unsigned int)(unsigned long long)col * HASH_MULTIPLIER;
    return mask ? mixed >> __clz(mask) : 0u;  // (a one-slot table: no shift by 32)
}

__device__ __forceinline__ index_t cas_key(index_t* address, index_t expected, index_t value)
{
    return (index_t)atomicCAS((ukey_t*)address, (ukey_t)expected, (ukey_t)value);
}

// Insert ``col`` into an open-addressing table (linear probing). Returns the slot, or -1 when
// the table is full (only possible for the symbolic fallback bin); ``inserted`` says whether
// this call claimed a new slot.
__device__ __forceinline__ long long hash_insert(index_t* table, unsigned int size, index_t col,
                                                 bool& inserted)
{
    volatile index_t* keys = table;
    const unsigned int mask = size - 1;
    unsigned int slot = hash_slot(col, mask);
    inserted = false;
    for (unsigned int probe = 0; probe < size; ++probe) {
        index_t key = keys[slot];
        if (key == col) return slot;
        if (key == EMPTY_KEY) {
            key = cas_key(table + slot, EMPTY_KEY, col);
            if (key == EMPTY_KEY) { inserted = true; return slot; }
            if (key == col) return slot;
        }
        slot = (slot + 1) & mask;
    }
    return -1;
}

// ------------------------------------------------------------------------------------------
// Analysis and binning
// ------------------------------------------------------------------------------------------

// group_sum_down over groups of ``lanes`` lanes, a launch argument (a power of two <= 32), so
// the width is picked at run time; it is the same for every thread of the grid, so the whole
// warp takes one branch.
__device__ __forceinline__ long long lanes_sum_down(long long value, int lanes)
{
    switch (lanes) {
    case 32: return group_sum_down<32>(value);
    case 16: return group_sum_down<16>(value);
    case 8: return group_sum_down<8>(value);
    case 4: return group_sum_down<4>(value);
    case 2: return group_sum_down<2>(value);
    default: return value;  // one lane per row
    }
}

// Products of rows row_begin .. row_begin + n_rows - 1 of A (``lanes`` threads per row, a power
// of two <= 32) and their symbolic bin: the first b with min(products, n_cols_b) <= limits[b];
// rows beyond the last limit go to the last bin. Rows without products get bin -1 and
// row_nnz = 0. bin_counts (length n_bins) is incremented once per block and bin.
extern "C" __global__ void row_products(const long long row_begin, const long long n_rows,
                                        const index_t* __restrict__ a_indptr,
                                        const index_t* __restrict__ a_indices,
                                        const index_t* __restrict__ b_indptr,
                                        const long long n_cols_b, const int lanes,
                                        const long long* __restrict__ limits, const int n_bins,
                                        int* __restrict__ row_bin, index_t* __restrict__ row_nnz,
                                        int* __restrict__ bin_counts)
{
    __shared__ int block_counts[MAX_BINS];
    if (threadIdx.x < MAX_BINS) block_counts[threadIdx.x] = 0;
    __syncthreads();
    const long long thread = global_thread_id();
    const long long local = thread / lanes;
    const int lane = threadIdx.x & (lanes - 1);
    const bool active = local < n_rows;
    long long products = 0;
    if (active) {
        const long long row = row_begin + local;
        for (index_t j = a_indptr[row] + lane; j < a_indptr[row + 1]; j += lanes) {
            const index_t k = a_indices[j];
            products += (long long)(b_indptr[k + 1] - b_indptr[k]);
        }
    }
    products = lanes_sum_down(products, lanes);
    if (active && lane == 0) {
        const long long bound = products < n_cols_b ? products : n_cols_b;
        int bin = -1;
        if (bound > 0) {
            bin = n_bins - 1;
            for (int b = 0; b < n_bins; ++b) {
                if (bound <= limits[b]) { bin = b; break; }
            }
            atomicAdd(&block_counts[bin], 1);
        } else {
            row_nnz[row_begin + local] = 0;
        }
        row_bin[local] = bin;
    }
    __syncthreads();
    if (threadIdx.x < n_bins && block_counts[threadIdx.x] > 0) {
        atomicAdd(&bin_counts[threadIdx.x], block_counts[threadIdx.x]);
    }
}

// Numeric bin of rows row_begin .. + n_rows - 1 from their exact output size. Bins: the tables
// (0 .. n_bins - 4: the first with row_nnz <= limits[b]), then three for dense accumulators and
// global tables:
//   n_bins - 3  rows a table would take but whose output is dense in B's columns: B fits one
//               window (short_ratio > 0) and n_cols_b <= short_ratio x row_nnz;
//   n_bins - 2  rows above the largest table with n_cols_b <= window_ratio x row_nnz
//               (window_ratio > 0): dense accumulators over column windows (numeric_window);
//   n_bins - 1  the other long rows: global hash tables.
// Empty rows get bin -1.
extern "C" __global__ void numeric_bins(const long long row_begin, const long long n_rows,
                                        const index_t* __restrict__ row_nnz,
                                        const long long* __restrict__ limits, const int n_bins,
                                        const long long n_cols_b, const long long short_ratio,
                                        const long long window_ratio,
                                        int* __restrict__ row_bin, int* __restrict__ bin_counts)
{
    __shared__ int block_counts[MAX_BINS];
    if (threadIdx.x < MAX_BINS) block_counts[threadIdx.x] = 0;
    __syncthreads();
    const long long local = global_thread_id();
    if (local < n_rows) {
        const long long nnz = (long long)row_nnz[row_begin + local];
        int bin = -1;
        if (nnz > 0) {
            bin = n_bins - 1;
            for (int b = 0; b < n_bins - 3; ++b) {
                if (nnz <= limits[b]) { bin = b; break; }
            }
            if (bin < n_bins - 3) {
                if (short_ratio > 0 && n_cols_b <= short_ratio * nnz) bin = n_bins - 3;
            } else if (window_ratio > 0 && n_cols_b <= window_ratio * nnz) {
                bin = n_bins - 2;
            }
            atomicAdd(&block_counts[bin], 1);
        }
        row_bin[local] = bin;
    }
    __syncthreads();
    if (threadIdx.x < n_bins && block_counts[threadIdx.x] > 0) {
        atomicAdd(&bin_counts[threadIdx.x], block_counts[threadIdx.x]);
    }
}

// Row ids (row_begin + local) grouped by bin, bins in order: bin b starts at the sum of
// bin_counts[0 .. b-1] (computed here, so the host needs no read-back to scatter); bin_cursor
// (zeroed) advances once per block and bin (order within a bin is not significant).
extern "C" __global__ void scatter_bins(const long long row_begin, const long long n_rows,
                                        const int* __restrict__ row_bin, const int n_bins,
                                        const int* __restrict__ bin_counts,
                                        int* __restrict__ bin_cursor,
                                        index_t* __restrict__ bin_rows)
{
    __shared__ int block_counts[MAX_BINS];
    __shared__ int block_base[MAX_BINS];
    __shared__ int bin_start[MAX_BINS];
    if (threadIdx.x < MAX_BINS) block_counts[threadIdx.x] = 0;
    if (threadIdx.x == 0) {
        int start = 0;
        for (int b = 0; b < n_bins; ++b) {
            bin_start[b] = start;
            start += bin_counts[b];
        }
    }
    __syncthreads();
    const long long local = global_thread_id();
    int bin = -1, rank = 0;
    if (local < n_rows) {
        bin = row_bin[local];
        if (bin >= 0) rank = atomicAdd(&block_counts[bin], 1);
    }
    __syncthreads();
    if (threadIdx.x < n_bins && block_counts[threadIdx.x] > 0) {
        block_base[threadIdx.x] = bin_start[threadIdx.x] +
                                  atomicAdd(&bin_cursor[threadIdx.x], block_counts[threadIdx.x]);
    }
    __syncthreads();
    if (bin >= 0) bin_rows[block_base[bin] + rank] = (index_t)(row_begin + local);
}

// ------------------------------------------------------------------------------------------
// Walking a row's products
// ------------------------------------------------------------------------------------------

// The whole B row of A's entry k: positions [b_indptr[k], b_indptr[k + 1]) of B's arrays.
struct WholeRow {
    const index_t* __restrict__ b_indptr;
    __device__ __forceinline__ void operator()(index_t, index_t k, index_t& begin,
                                               index_t& end) const
    {
        begin = b_indptr[k];
        end = b_indptr[k + 1];
    }
};

// Call visit(j, p) for every product of A's entries a_begin .. a_end - 1 (one row's, or a segment
// of them; j: position in A's arrays, p: in B's, in the range ``b_range(j, k, begin, end)``
// gives for the entry's B row k) with the ``warps`` warps of a group (this lane is lane ``lane``
// of warp ``warp``). Every lane of the warp calls it with the same entries (the shuffles).
//   balanced == 0: each warp's teams of B_TEAM lanes take one A entry at a time and walk that B
//     row (B_TEAM = 32: the whole warp walks one B row).
//   balanced != 0: the row's products are dealt to the group's warps in chunks of 32, whatever
//     B row they lie on. Every warp reads the same 32 A entries at a time and scans their B row
//     lengths; the batch's chunks go round-robin over the warps, continuing across batches, and
//     lane l of a chunk finds its A entry by a binary search of the scan with shuffles. On
//     power-law B a row's products sit on a few hub rows, which one warp per A entry walked
//     while the group's other warps idled (R-MAT: the slowest warp had 9-13x the mean work in
//     the one-row-per-block bins); dealt in chunks, every warp gets its share.
template <typename Range, typename Visit>
__device__ __forceinline__ void warp_products(index_t a_begin, index_t a_end, int warp, int warps,
                                              int lane, int balanced,
                                              const index_t* __restrict__ a_indices,
                                              Range b_range, Visit visit)
{
    if (!balanced) {
        const int team = team_lanes(32), teams = 32 / team, team_lane = lane % team;
        const index_t stride = (index_t)warps * teams;
        for (index_t j = a_begin + (index_t)warp * teams + lane / team; j < a_end; j += stride) {
            index_t begin, end;
            b_range(j, a_indices[j], begin, end);
            for (index_t p = begin + team_lane; p < end; p += team) visit(j, (long long)p);
        }
        return;
    }
    // Index-width arithmetic (a batch's products are at most nnz(B)), so the walk costs the
    // kernels no more registers than the per-entry walk: they bound the table bins' occupancy.
    int first_warp = 0;  // the warp that takes the batch's first chunk (the same in every warp)
    for (index_t base = a_begin; base < a_end; base += 32) {
        const index_t j = base + lane;
        index_t b_begin = 0, length = 0;
        if (j < a_end) {
            index_t end;
            b_range(j, a_indices[j], b_begin, end);
            length = end - b_begin;
        }
        const index_t inclusive = warp_inclusive_sum(length, lane);
        const index_t total = __shfl_sync(FULL_MASK, inclusive, 31);
        const index_t chunks = (total + 31) >> 5;
        // Chunk c of the batch goes to warp (first_warp + c) mod warps.
        for (index_t chunk = (warp - first_warp + warps) % warps; chunk < chunks;
             chunk += warps) {
            const index_t q = (chunk << 5) + lane;
            int owner = 0;  // the lane whose A entry holds product q: ends <= q before it
            for (int step = 16; step > 0; step >>= 1) {
                if (__shfl_sync(FULL_MASK, inclusive, owner + step - 1) <= q) owner += step;
            }
            const index_t owner_end = __shfl_sync(FULL_MASK, inclusive, owner);
            const index_t owner_length = __shfl_sync(FULL_MASK, length, owner);
            const index_t owner_b = __shfl_sync(FULL_MASK, b_begin, owner);
            const index_t owner_start = owner_end - owner_length;
            if (q < total) visit(base + owner, (long long)(owner_b + (q - owner_start)));
        }
        first_warp = (int)((first_warp + chunks) % warps);
    }
}

// warp_products over all of row ``row``'s entries and whole B rows.
template <typename Visit>
__device__ __forceinline__ void row_products_walk(long long row, int warp, int warps, int lane,
                                                  int balanced,
                                                  const index_t* __restrict__ a_indptr,
                                                  const index_t* __restrict__ a_indices,
                                                  const index_t* __restrict__ b_indptr,
                                                  Visit visit)
{
    warp_products(a_indptr[row], a_indptr[row + 1], warp, warps, lane, balanced, a_indices,
                  WholeRow{b_indptr}, visit);
}

// ------------------------------------------------------------------------------------------
// Symbolic phase
// ------------------------------------------------------------------------------------------

// Insert the distinct columns of one row into ``table`` (size a power of two). The group's
// threads form teams of up to 32 lanes: teams take A's entries in turn, lanes walk the B row.
// With ``count`` non-null every new key increments *count; once it passes ``limit`` (or a probe
// finds the table full) *overflow is set and the group stops early, before linear probing
// degenerates. Without it (a table sized for the row's bound, which cannot fill) the caller
// counts the occupied slots afterwards: no shared counter every insert contends for.
__device__ __forceinline__ void symbolic_row(long long row, index_t* table, unsigned int size,
                                             int lane, int group_size,
                                             const index_t* __restrict__ a_indptr,
                                             const index_t* __restrict__ a_indices,
                                             const index_t* __restrict__ b_indptr,
                                             const index_t* __restrict__ b_indices,
                                             int* count, const int limit,
                                             volatile int* overflow, int balanced)
{
    if (!count && group_size >= 32) {  // whole warps
        row_products_walk(row, lane >> 5, group_size >> 5, lane & 31, balanced, a_indptr,
                          a_indices, b_indptr, [&](index_t, long long p) {
                          bool inserted;
                          hash_insert(table, size, b_indices[p], inserted);
                      });
        return;
    }
    const int team = team_lanes(group_size < 32 ? group_size : 32);
    const int teams = group_size / team;
    const int team_id = lane / team, team_lane = lane % team;
    for (index_t j = a_indptr[row] + team_id; j < a_indptr[row + 1]; j += teams) {
        if (*overflow) return;
        const index_t k = a_indices[j];
        const index_t end = b_indptr[k + 1];
        for (index_t p = b_indptr[k] + team_lane; p < end; p += team) {
            bool inserted;
            if (hash_insert(table, size, b_indices[p], inserted) < 0) { *overflow = 1; return; }
            if (count && inserted && atomicAdd(count, 1) >= limit) { *overflow = 1; return; }
        }
    }
}

// The row of a bin that this thread's group takes in the shared-table kernels: bin_rows[slot],
// slot = blockIdx.x * groups + group; past the bin's end active is false and the row 0.
__device__ __forceinline__ long long bin_row(const index_t* __restrict__ bin_rows,
                                             const int bin_size, const int groups,
                                             const int group, bool& active)
{
    const long long slot = (long long)blockIdx.x * groups + group;
    active = slot < bin_size;
    return active ? (long long)bin_rows[slot] : 0;
}

// One bin of rows with shared-memory tables of ``table_size`` keys. ``group_size`` threads per
// row: either <= 32 (several rows per block) or equal to blockDim.x (one row per block).
// check_overflow != 0 (the bin of rows whose bound passes the largest table): rows whose table
// overflows are appended to fail_rows (redone with global tables); otherwise every row's bound
// fits its table and the count is the number of occupied slots.
extern "C" __global__ void symbolic_shared(const index_t* __restrict__ bin_rows, const int bin_size,
                                           const index_t* __restrict__ a_indptr,
                                           const index_t* __restrict__ a_indices,
                                           const index_t* __restrict__ b_indptr,
                                           const index_t* __restrict__ b_indices,
                                           const int group_size, const int table_size,
                                           const int check_overflow, const int balanced,
                                           index_t* __restrict__ row_nnz,
                                           index_t* __restrict__ fail_rows,
                                           int* __restrict__ fail_count)
{
    extern __shared__ unsigned long long shared_words[];
    const int groups = blockDim.x / group_size;
    const int group = threadIdx.x / group_size;
    const int lane = threadIdx.x % group_size;
    index_t* table = (index_t*)shared_words + (long long)group * table_size;
    int* counters = (int*)((index_t*)shared_words + (long long)groups * table_size);
    for (int i = lane; i < table_size; i += group_size) table[i] = EMPTY_KEY;
    if (lane == 0) { counters[2 * group] = 0; counters[2 * group + 1] = 0; }
    __syncthreads();
    bool active;
    const long long row = bin_row(bin_rows, bin_size, groups, group, active);
    if (active) {
        // Stop at 7/8 load: beyond it the row is cheaper to redo in a larger table.
        symbolic_row(row, table, table_size, lane, group_size, a_indptr, a_indices, b_indptr,
                     b_indices, check_overflow ? counters + 2 * group : (int*)0,
                     table_size - table_size / 8, counters + 2 * group + 1, balanced);
    }
    __syncthreads();
    if (!check_overflow) {  // uniform over the block
        int occupied = 0;
        for (int i = lane; i < table_size; i += group_size) occupied += table[i] != EMPTY_KEY;
        const int width = group_size < 32 ? group_size : 32;
        occupied = (int)lanes_sum_down(occupied, width);
        if ((lane & (width - 1)) == 0 && occupied) atomicAdd(counters + 2 * group, occupied);
        __syncthreads();
    }
    if (active && lane == 0) {
        if (counters[2 * group + 1]) {
            fail_rows[atomicAdd(fail_count, 1)] = (index_t)row;
        } else {
            row_nnz[row] = (index_t)counters[2 * group];
        }
    }
}

// Rows too long for shared memory: one block per row, its table in global memory at
// tables + table_offset[i] with table_size[i] (a power of two >= the row's output bound).
extern "C" __global__ void symbolic_global(const index_t* __restrict__ rows, const int n_rows,
                                           const index_t* __restrict__ a_indptr,
                                           const index_t* __restrict__ a_indices,
                                           const index_t* __restrict__ b_indptr,
                                           const index_t* __restrict__ b_indices,
                                           index_t* __restrict__ tables,
                                           const long long* __restrict__ table_offset,
                                           const long long* __restrict__ table_size,
                                           index_t* __restrict__ row_nnz)
{
    __shared__ int counters[2];
    if (blockIdx.x >= n_rows) return;  // uniform over the block
    const long long row = rows[blockIdx.x];
    index_t* table = tables + table_offset[blockIdx.x];
    const unsigned int size = (unsigned int)table_size[blockIdx.x];
    for (unsigned int i = threadIdx.x; i < size; i += blockDim.x) table[i] = EMPTY_KEY;
    if (threadIdx.x == 0) { counters[0] = 0; counters[1] = 0; }
    __syncthreads();
    symbolic_row(row, table, size, threadIdx.x, blockDim.x, a_indptr, a_indices, b_indptr,
                 b_indices, counters, (int)size, counters + 1, 0);  // sized never to overflow
    __syncthreads();
    if (threadIdx.x == 0) row_nnz[row] = (index_t)counters[0];
}

// ------------------------------------------------------------------------------------------
// Row pointers of C: exclusive scan of row_nnz[row_begin ..] into c_indptr (n_rows + 1, int64)
// ------------------------------------------------------------------------------------------

#define SCAN_THREADS 1024

__device__ __forceinline__ long long block_inclusive_scan(long long value, long long* warp_sums)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    value = warp_inclusive_sum(value, lane);
    if (lane == 31) warp_sums[warp] = value;
    __syncthreads();
    if (warp == 0) {
        const long long total = lane < (blockDim.x >> 5) ? warp_sums[lane] : 0;
        warp_sums[lane] = warp_inclusive_sum(total, lane);
    }
    __syncthreads();
    if (warp > 0) value += warp_sums[warp - 1];
    return value;
}

// Pass 1: inclusive scan inside each block of SCAN_THREADS rows; block totals to block_sums.
extern "C" __global__ void scan_blocks(const long long row_begin, const long long n_rows,
                                       const index_t* __restrict__ row_nnz,
                                       long long* __restrict__ c_indptr,
                                       long long* __restrict__ block_sums)
{
    __shared__ long long warp_sums[32];
    const long long i = global_thread_id();
    const long long value = i < n_rows ? (long long)row_nnz[row_begin + i] : 0;
    const long long inclusive = block_inclusive_scan(value, warp_sums);
    if (i < n_rows) c_indptr[i + 1] = inclusive;
    if (threadIdx.x == blockDim.x - 1) block_sums[blockIdx.x] = inclusive;
    if (i == 0) c_indptr[0] = 0;
}

// Pass 2 (one block): exclusive scan of the block totals in place, carried over tiles.
extern "C" __global__ void scan_block_sums(long long* __restrict__ block_sums, const long long n)
{
    __shared__ long long warp_sums[32];
    __shared__ long long carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (long long base = 0; base < n; base += blockDim.x) {
        const long long i = base + threadIdx.x;
        const long long value = i < n ? block_sums[i] : 0;
        const long long inclusive = block_inclusive_scan(value, warp_sums);
        const long long start = carry;
        __syncthreads();
        if (i < n) block_sums[i] = start + inclusive - value;
        if (threadIdx.x == blockDim.x - 1) carry = start + inclusive;
        __syncthreads();
    }
}

// Pass 3: add each block's offset.
extern "C" __global__ void scan_add(const long long n_rows, long long* __restrict__ c_indptr,
                                    const long long* __restrict__ block_sums)
{
    const long long i = global_thread_id();
    if (i < n_rows) c_indptr[i + 1] += block_sums[blockIdx.x];
}

// ------------------------------------------------------------------------------------------
// Numeric phase
// ------------------------------------------------------------------------------------------

// Accumulate a_ik * b_kj of one row into (keys, values): whole warps as warp_products walks the
// row, a group within a warp one B row at a time.
__device__ __forceinline__ void numeric_row(long long row, index_t* keys, value_t* values,
                                            unsigned int size, int lane, int group_size,
                                            A_B_PARAMS, int balanced)
{
    if (group_size >= 32) {  // whole warps
        row_products_walk(row, lane >> 5, group_size >> 5, lane & 31, balanced, a_indptr,
                          a_indices, b_indptr, [&](index_t j, long long p) {
                          bool inserted;
                          // The table holds the row's output (symbolic phase): never full.
                          const long long slot = hash_insert(keys, size, b_indices[p], inserted);
                          atomicAdd(&values[slot], a_data[j] * b_data[p]);
                      });
        return;
    }
    // A group within a warp (small tables): its teams of up to B_TEAM lanes take A's entries in
    // turn and walk their B rows.
    const int team = team_lanes(group_size);
    const int teams = group_size / team, team_lane = lane % team;
    for (index_t j = a_indptr[row] + lane / team; j < a_indptr[row + 1]; j += teams) {
        const index_t k = a_indices[j];
        const value_t a = a_data[j];
        const index_t end = b_indptr[k + 1];
        for (index_t p = b_indptr[k] + team_lane; p < end; p += team) {
            bool inserted;
            // The table holds at least the row's output (from the symbolic phase): never full.
            const long long slot = hash_insert(keys, size, b_indices[p], inserted);
            atomicAdd(&values[slot], a * b_data[p]);
        }
    }
}

// Bitonic sort of a whole table (size a power of two) by unsigned key, by one block: the
// row's columns come first in ascending order, the empty slots last.
__device__ void bitonic_sort_table(index_t* keys, value_t* values, unsigned int size)
{
    for (unsigned int k = 2; k <= size; k <<= 1) {
        for (unsigned int j = k >> 1; j > 0; j >>= 1) {
            for (unsigned int i = threadIdx.x; i < size; i += blockDim.x) {
                const unsigned int partner = i ^ j;
                if (partner > i) {
                    const ukey_t left = (ukey_t)keys[i], right = (ukey_t)keys[partner];
                    const bool ascending = (i & k) == 0;
                    if ((left > right) == ascending) {
                        keys[i] = (index_t)right;
                        keys[partner] = (index_t)left;
                        const value_t swap = values[i];
                        values[i] = values[partner];
                        values[partner] = swap;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Exclusive prefix sum of ``value`` over the group_size threads of a group: a block (group_size
// > 32, the group is the block) or aligned lanes of one warp. Every thread of the block calls it.
__device__ __forceinline__ long long group_exclusive_scan(long long value, int lane, int group_size,
                                                          long long* warp_sums)
{
    if (group_size > 32) return block_inclusive_scan(value, warp_sums) - value;
    return warp_inclusive_sum(value, lane, group_size) - value;
}

// Write a row held in a hash table to C in column order without sorting: mark its columns in a
// bitmap of B's columns (rank_words words, a multiple of RANK_CHUNK), sum the bits per chunk of
// RANK_CHUNK words, scan the chunk sums over the group; an entry's position is its chunk's start
// plus the bits before it in the chunk. Every thread of the block calls it (the barriers).
#define RANK_CHUNK 16
__device__ __forceinline__ void write_row_by_rank(const index_t* keys, const value_t* values,
                                                  int table_size, unsigned int* bitmap,
                                                  int* chunk_start, int rank_words, int lane,
                                                  int group_size, bool active, long long start,
                                                  long long* warp_sums,
                                                  index_t* __restrict__ c_indices,
                                                  value_t* __restrict__ c_data)
{
    for (int i = lane; i < table_size; i += group_size) {
        const index_t key = keys[i];
        if (key != EMPTY_KEY) atomicOr(&bitmap[key >> 5], 1u << (key & 31));
    }
    __syncthreads();
    // Each thread owns a contiguous run of chunks: its bit count, then the group's scan.
    const int chunks = rank_words / RANK_CHUNK;
    const int per_lane = (chunks + group_size - 1) / group_size;
    const int first = min(lane * per_lane, chunks), last = min(first + per_lane, chunks);
    int total = 0;
    for (int c = first; c < last; ++c) {
        int bits = 0;
        // lanes start at different words of their chunks: no 16-way bank conflicts
        for (int w = 0; w < RANK_CHUNK; ++w)
            bits += __popc(bitmap[c * RANK_CHUNK + ((w + lane) & (RANK_CHUNK - 1))]);
        chunk_start[c] = bits;
        total += bits;
    }
    int running = (int)group_exclusive_scan(total, lane, group_size, warp_sums);
    for (int c = first; c < last; ++c) {
        const int bits = chunk_start[c];
        chunk_start[c] = running;
        running += bits;
    }
    __syncthreads();
    if (!active) return;
    for (int i = lane; i < table_size; i += group_size) {
        const index_t key = keys[i];
        if (key == EMPTY_KEY) continue;
        const int word = (int)(key >> 5);
        const int chunk = word / RANK_CHUNK;
        int rank = chunk_start[chunk];
        for (int w = chunk * RANK_CHUNK; w < word; ++w) rank += __popc(bitmap[w]);
        rank += __popc(bitmap[word] & ((1u << (key & 31)) - 1u));
        c_indices[start + rank] = key;
        c_data[start + rank] = values[i];
    }
}

// One bin of rows with shared (column, value) tables of ``table_size`` entries; group_size as
// in symbolic_shared. rank_words > 0: each row also gets a bitmap of B's columns and is written
// by rank (write_row_by_rank). Otherwise groups of <= 32 threads compact their table in slot
// order with warp ballots, then place each entry by its rank among the row's columns (groups <
// 32) or bitonic-sort the compacted entries (a full warp per row); one-row-per-block bins
// bitonic-sort the whole table. Row r is written to C at c_indptr[r] - c_base. With row_nnz_out
// (the bounded-output pass: c_indptr holds each row's upper-bound slot, not its exact start) the
// row's entry count is written there too.
extern "C" __global__ void numeric_shared(const index_t* __restrict__ bin_rows, const int bin_size,
                                          A_B_PARAMS,
                                          const int group_size, const int table_size,
                                          const int rank_words, const int balanced,
                                          C_OUT_PARAMS,
                                          index_t* __restrict__ row_nnz_out)
{
    extern __shared__ unsigned long long shared_words[];
    __shared__ long long warp_sums[32];
    const int groups = blockDim.x / group_size;
    const int group = threadIdx.x / group_size;
    const int lane = threadIdx.x % group_size;
    // Values first: they need 8-byte alignment when double; then keys, bitmaps, chunk starts.
    value_t* values = (value_t*)shared_words + (long long)group * table_size;
    index_t* all_keys = (index_t*)((value_t*)shared_words + (long long)groups * table_size);
    index_t* keys = all_keys + (long long)group * table_size;
    unsigned int* all_bitmaps = (unsigned int*)(all_keys + (long long)groups * table_size);
    unsigned int* bitmap = all_bitmaps + (long long)group * rank_words;
    int* chunk_start = (int*)(all_bitmaps + (long long)groups * rank_words) +
                       (long long)group * (rank_words / RANK_CHUNK);
    for (int i = lane; i < table_size; i += group_size) {
        keys[i] = EMPTY_KEY;
        values[i] = 0;
    }
    for (int w = lane; w < rank_words; w += group_size) bitmap[w] = 0u;
    __syncthreads();
    bool active;
    const long long row = bin_row(bin_rows, bin_size, groups, group, active);
    if (active) {
        numeric_row(row, keys, values, table_size, lane, group_size, A_B_ARGS, balanced);
    }
    __syncthreads();
    const long long start = active ? c_indptr[row] - c_base : 0;
    if (rank_words > 0) {  // uniform over the block
        write_row_by_rank(keys, values, table_size, bitmap, chunk_start, rank_words, lane,
                          group_size, active, start, warp_sums, c_indices, c_data);
        if (active && row_nnz_out != nullptr && lane == 0) {
            // the last chunk's start plus its bits (counted here, not carried through the
            // write: that cost 8 registers)
            const int last = rank_words / RANK_CHUNK - 1;
            int total = chunk_start[last];
            for (int w = 0; w < RANK_CHUNK; ++w) total += __popc(bitmap[last * RANK_CHUNK + w]);
            row_nnz_out[row] = (index_t)total;
        }
        return;
    }
    if (group_size == (int)blockDim.x && group_size > 32) {
        bitonic_sort_table(keys, values, table_size);
        if (active) {
            // the row's entries are the sorted table's prefix of occupied slots
            for (int i = threadIdx.x; i < table_size; i += blockDim.x) {
                const index_t key = keys[i];
                if (key == EMPTY_KEY) continue;
                c_indices[start + i] = key;
                c_data[start + i] = values[i];
                if (row_nnz_out != nullptr && (i + 1 == table_size || keys[i + 1] == EMPTY_KEY))
                    row_nnz_out[row] = (index_t)(i + 1);
            }
        }
        return;
    }
    // Groups within one warp: compact occupied slots to the front, in slot order. A slot is
    // only ever written at a position <= its own, after every lane has read its tile.
    const int warp_lane = threadIdx.x & 31;
    const unsigned int group_mask =
        group_size == 32 ? FULL_MASK
                         : ((1u << group_size) - 1u) << (warp_lane / group_size * group_size);
    const unsigned int lower_lanes = (1u << warp_lane) - 1u;
    int count = 0;
    for (int base = 0; base < table_size; base += group_size) {
        const index_t key = keys[base + lane];
        const value_t value = values[base + lane];
        const bool occupied = key != EMPTY_KEY;
        const unsigned int ballot = __ballot_sync(FULL_MASK, occupied) & group_mask;
        __syncwarp();
        if (occupied) {
            const int position = count + __popc(ballot & lower_lanes);
            keys[position] = key;
            values[position] = value;
        }
        count += __popc(ballot);
        __syncwarp();
    }
    if (active && row_nnz_out != nullptr && lane == 0) row_nnz_out[row] = (index_t)count;
    if (group_size < 32) {
        // Several rows per warp: place each entry by its rank among the row's columns (no
        // synchronisation, so the warp's groups do not diverge on partial-mask barriers).
        if (active) {
            for (int i = lane; i < count; i += group_size) {
                const ukey_t key = (ukey_t)keys[i];
                int rank = 0;
                for (int j = 0; j < count; ++j) rank += (ukey_t)keys[j] < key;
                c_indices[start + rank] = (index_t)key;
                c_data[start + rank] = values[i];
            }
        }
        return;
    }
    // A full warp per row: bitonic sort of the compacted entries, padded with empty keys to a
    // power of two (<= the table size).
    int padded = 1;
    while (padded < count) padded <<= 1;
    for (int i = count + lane; i < padded; i += group_size) keys[i] = EMPTY_KEY;
    __syncwarp(group_mask);
    for (int k = 2; k <= padded; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = lane; i < padded; i += group_size) {
                const int partner = i ^ j;
                if (partner > i) {
                    const ukey_t left = (ukey_t)keys[i], right = (ukey_t)keys[partner];
                    if ((left > right) == ((i & k) == 0)) {
                        keys[i] = (index_t)right;
                        keys[partner] = (index_t)left;
                        const value_t swap = values[i];
                        values[i] = values[partner];
                        values[partner] = swap;
                    }
                }
            }
            __syncwarp(group_mask);
        }
    }
    if (active) {
        for (int i = lane; i < count; i += group_size) {
            c_indices[start + i] = keys[i];
            c_data[start + i] = values[i];
        }
    }
}

// Rows too long for shared memory: one block per row; its (key, value) table lives at
// table_offset[i] in the global work arrays, size table_size[i] (a power of two >= 2 nnz).
extern "C" __global__ void numeric_global(const index_t* __restrict__ rows, const int n_rows,
                                          A_B_PARAMS,
                                          index_t* __restrict__ table_keys,
                                          value_t* __restrict__ table_values,
                                          const long long* __restrict__ table_offset,
                                          const long long* __restrict__ table_size,
                                          C_OUT_PARAMS,
                                          const int balanced)
{
    if (blockIdx.x >= n_rows) return;  // uniform over the block
    const long long row = rows[blockIdx.x];
    index_t* keys = table_keys + table_offset[blockIdx.x];
    value_t* values = table_values + table_offset[blockIdx.x];
    const unsigned int size = (unsigned int)table_size[blockIdx.x];
    for (unsigned int i = threadIdx.x; i < size; i += blockDim.x) {
        keys[i] = EMPTY_KEY;
        values[i] = 0;
    }
    __syncthreads();
    numeric_row(row, keys, values, size, threadIdx.x, blockDim.x, A_B_ARGS, balanced);
    __syncthreads();
    bitonic_sort_table(keys, values, size);
    const long long start = c_indptr[row] - c_base;
    const long long nnz = c_indptr[row + 1] - c_indptr[row];
    for (long long i = threadIdx.x; i < nnz; i += blockDim.x) {
        c_indices[start + i] = keys[i];
        c_data[start + i] = values[i];
    }
}

// ------------------------------------------------------------------------------------------
// Long rows over a narrow B: a bitmap of B's columns in shared memory
// ------------------------------------------------------------------------------------------

// Mark the columns of one row in ``bitmap``; one block per row (warp_products).
__device__ __forceinline__ void dense_row(long long row, unsigned int* bitmap, int balanced,
                                          const index_t* __restrict__ a_indptr,
                                          const index_t* __restrict__ a_indices,
                                          const index_t* __restrict__ b_indptr,
                                          const index_t* __restrict__ b_indices)
{
    row_products_walk(row, threadIdx.x >> 5, blockDim.x >> 5, threadIdx.x & 31, balanced,
                      a_indptr, a_indices, b_indptr, [&](index_t, long long p) {
                      const index_t col = b_indices[p];
                      atomicOr(&bitmap[col >> 5], 1u << (col & 31));
                  });
}

// Symbolic phase of rows beyond the largest shared hash table when B has at most
// 8 x (shared bytes) columns: count = popcount of the row's column bitmap.
extern "C" __global__ void symbolic_dense(const index_t* __restrict__ rows, const int n_rows,
                                          const index_t* __restrict__ a_indptr,
                                          const index_t* __restrict__ a_indices,
                                          const index_t* __restrict__ b_indptr,
                                          const index_t* __restrict__ b_indices,
                                          const long long n_cols_b, const int balanced,
                                          index_t* __restrict__ row_nnz)
{
    extern __shared__ unsigned long long shared_words[];
    __shared__ long long warp_sums[32];
    unsigned int* bitmap = (unsigned int*)shared_words;
    const int n_words = (int)((n_cols_b + 31) >> 5);
    if (blockIdx.x >= n_rows) return;  // uniform over the block
    const long long row = rows[blockIdx.x];
    for (int w = threadIdx.x; w < n_words; w += blockDim.x) bitmap[w] = 0u;
    __syncthreads();
    dense_row(row, bitmap, balanced, a_indptr, a_indices, b_indptr, b_indices);
    __syncthreads();
    long long count = 0;
    for (int w = threadIdx.x; w < n_words; w += blockDim.x) count += __popc(bitmap[w]);
    count = block_inclusive_scan(count, warp_sums);
    if (threadIdx.x == blockDim.x - 1) row_nnz[row] = (index_t)count;
}

// First position p in [begin, end) with b_indices[p] >= column (end when none): a binary search
// of a B row sorted by column.
__device__ __forceinline__ index_t lower_bound(const index_t* __restrict__ b_indices,
                                               index_t begin, index_t end, long long column)
{
    while (begin < end) {
        const index_t middle = begin + ((end - begin) >> 1);
        if ((long long)b_indices[middle] < column) begin = middle + 1;
        else end = middle;
    }
    return begin;
}

// Entries of a long row whose window ranges are found together (numeric_window), and the B row
// length from which an entry's range is searched rather than read whole and filtered.
#define WINDOW_SEGMENT 256
#define WINDOW_SEARCH_MIN 64

// The B range of the entries segment_first .. + WINDOW_SEGMENT - 1, from shared arrays.
struct SegmentRange {
    const index_t* begins;
    const index_t* ends;
    index_t segment_first;
    __device__ __forceinline__ void operator()(index_t j, index_t, index_t& begin,
                                               index_t& end) const
    {
        begin = begins[j - segment_first];
        end = ends[j - segment_first];
    }
};

// Numeric phase of rows whose output is dense enough in B's columns (long rows, or any row when B
// fits one window): B's columns in windows of window_cols (a multiple of 32), one block per row.
// Per window a dense accumulator and a bitmap in shared memory take the products that fall in it;
// the window's entries are then written in column order by a block-wide scan of the bitmap's
// popcounts (each thread owns a contiguous run of words). No hash table, no sort, no global
// workspace. With ``sorted_b`` (B's rows sorted by column, checked on the host; only worth it
// with several windows) each window walks only its own products of the long B rows, found by
// binary search; otherwise every product of the row is read once per window and those outside
// it are skipped.
extern "C" __global__ void numeric_window(const index_t* __restrict__ rows, const int n_rows,
                                          A_B_PARAMS,
                                          const long long n_cols_b, const int window_cols,
                                          const int balanced, const int sorted_b,
                                          C_OUT_PARAMS,
                                          index_t* __restrict__ row_nnz_out)
{
    extern __shared__ unsigned long long shared_words[];
    __shared__ long long warp_sums[32];
    __shared__ long long window_total;
    __shared__ index_t segment_begins[WINDOW_SEGMENT], segment_ends[WINDOW_SEGMENT];
    value_t* values = (value_t*)shared_words;
    unsigned int* bitmap = (unsigned int*)(values + window_cols);
    const int n_words = window_cols >> 5;
    if (blockIdx.x >= n_rows) return;  // uniform over the block
    const long long row = rows[blockIdx.x];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int per_thread = (n_words + blockDim.x - 1) / blockDim.x;
    const int first = min((int)threadIdx.x * per_thread, n_words);
    const int last = min(first + per_thread, n_words);
    const index_t a_begin = a_indptr[row], a_end = a_indptr[row + 1];
    long long position = c_indptr[row] - c_base;
    for (long long window = 0; window < n_cols_b; window += window_cols) {
        for (int i = threadIdx.x; i < window_cols; i += blockDim.x) values[i] = 0;
        for (int w = threadIdx.x; w < n_words; w += blockDim.x) bitmap[w] = 0u;
        __syncthreads();
        const auto visit = [&](index_t j, long long p) {
            const long long col = (long long)b_indices[p] - window;
            if (col >= 0 && col < window_cols) {
                atomicOr(&bitmap[col >> 5], 1u << (col & 31));
                atomicAdd(&values[col], a_data[j] * b_data[p]);
            }
        };
        if (!sorted_b) {
            warp_products(a_begin, a_end, warp, warps, lane, balanced, a_indices,
                          WholeRow{b_indptr}, visit);
        } else {
            // Segments of the row's entries: the block finds each entry's window range once
            // (two binary searches for long B rows; short ones are read whole and filtered),
            // then walks them. Searching in the walk instead would repeat it in every warp.
            for (index_t segment = a_begin; segment < a_end; segment += WINDOW_SEGMENT) {
                const index_t segment_end = min(segment + (index_t)WINDOW_SEGMENT, a_end);
                __syncthreads();  // the previous segment's walk has read its ranges
                for (index_t t = threadIdx.x; t < segment_end - segment; t += blockDim.x) {
                    const index_t k = a_indices[segment + t];
                    index_t begin = b_indptr[k], end = b_indptr[k + 1];
                    if (end - begin > WINDOW_SEARCH_MIN) {
                        begin = lower_bound(b_indices, begin, end, window);
                        end = lower_bound(b_indices, begin, end, window + window_cols);
                    }
                    segment_begins[t] = begin;
                    segment_ends[t] = end;
                }
                __syncthreads();
                warp_products(segment, segment_end, warp, warps, lane, balanced, a_indices,
                              SegmentRange{segment_begins, segment_ends, segment}, visit);
            }
        }
        __syncthreads();
        long long count = 0;
        for (int w = first; w < last; ++w) count += __popc(bitmap[w]);
        const long long inclusive = block_inclusive_scan(count, warp_sums);
        if (threadIdx.x == blockDim.x - 1) window_total = inclusive;
        long long out = position + inclusive - count;
        for (int w = first; w < last; ++w) {
            unsigned int bits = bitmap[w];
            while (bits) {
                const int bit = __ffs(bits) - 1;
                bits &= bits - 1;
                const int col = (w << 5) + bit;
                c_indices[out] = (index_t)(window + col);
                c_data[out] = values[col];
                ++out;
            }
        }
        __syncthreads();
        position += window_total;
    }
    if (row_nnz_out != nullptr && threadIdx.x == 0)
        row_nnz_out[row] = (index_t)(position - (c_indptr[row] - c_base));
}

// The bounded-output pass's last step: the rows move from their bound-sized slots (row r at
// slots[r], the exclusive sum of min(products, ncols(B))) to c_indptr[r] in the same arrays, so C
// needs no second buffer. A row only moves down (c_indptr[r] <= slots[r]), over slots of rows
// before it. One block per group of consecutive rows (group_rows, fixed on the host: at most
// ``capacity`` slot entries each), taken in ticket order: a block copies its group's entries
// into shared memory, flags that it has read them, waits until every earlier group whose slots
// reach into its destination has read its own, then writes. A block waits only on blocks that
// took earlier tickets and never wait on it, so the waits end. ``progress`` (zeroed before the
// launch): [0] the ticket counter, [1 + g] set once group g has read its entries.
extern "C" __global__ void compact_rows(const long long n_groups, const int capacity,
                                        const long long* __restrict__ group_rows,
                                        const long long* __restrict__ slots,
                                        const long long* __restrict__ c_indptr,
                                        index_t* indices, value_t* data, int* progress)
{
    extern __shared__ unsigned long long shared_words[];
    __shared__ long long ticket;
    value_t* held_values = (value_t*)shared_words;
    index_t* held_indices = (index_t*)(held_values + capacity);
    if (threadIdx.x == 0) ticket = atomicAdd(&progress[0], 1);
    __syncthreads();
    const long long group = ticket;
    if (group >= n_groups) return;  // uniform over the block
    const long long first = group_rows[group], last = group_rows[group + 1];
    const long long base = c_indptr[first];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (long long row = first + warp; row < last; row += warps) {
        const long long from = slots[row], to = c_indptr[row] - base;
        const long long count = c_indptr[row + 1] - c_indptr[row];
        for (long long i = lane; i < count; i += 32) {
            held_indices[to + i] = indices[from + i];
            held_values[to + i] = data[from + i];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(&progress[1 + group], 1);
    }
    if (warp == 0) {
        // The earlier groups whose slots end above this group's destination start: from the
        // first whose last slot passes ``base`` (slots grow with the row) to group - 1.
        long long low = 0, high = group;
        while (low < high) {
            const long long middle = (low + high) >> 1;
            if (slots[group_rows[middle + 1]] > base) high = middle;
            else low = middle + 1;
        }
        for (long long earlier = low + lane; earlier < group; earlier += 32)
            wait_until_at_least(progress + 1 + earlier, 1);
        __syncwarp();
    }
    __syncthreads();
    const long long count = c_indptr[last] - base;
    for (long long i = threadIdx.x; i < count; i += blockDim.x) {
        indices[base + i] = held_indices[i];
        data[base + i] = held_values[i];
    }
}

// Weight of column `column` in the weighted row checksums: 1 + (h >> 8) / 2^24 in [1, 2), h the
// MurmurHash3 32-bit finaliser of the column (mod 2^32). checksums.column_weights in
// app/ops/spgemm/ computes the same weights on the host; both are exact in double.
__device__ __forceinline__ double column_weight(const index_t column)
{
    unsigned int h = (unsigned int)column;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return 1.0 + (double)(h >> 8) * (1.0 / 16777216.0);
}

// Per-row checksums of a CSR block of C, to verify a C that stays distributed: the sum of the
// row's values (a wrong value changes it) and their sum weighted by column_weight (a value in a
// wrong column changes it). One warp per row; whole warps leave together (blockDim.x is a
// multiple of 32), so every lane reaches the shuffles.
extern "C" __global__ void row_checksums(const long long n_rows,
                                         const long long* __restrict__ c_indptr,
                                         const index_t* __restrict__ c_indices,
                                         const value_t* __restrict__ c_data,
                                         double* __restrict__ sums,
                                         double* __restrict__ weighted)
{
    const long long row = global_thread_id() / 32;
    const int lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    double sum = 0, weighted_sum = 0;
    for (long long i = c_indptr[row] + lane; i < c_indptr[row + 1]; i += 32) {
        const double value = (double)c_data[i];
        sum += value;
        weighted_sum += value * column_weight(c_indices[i]);
    }
    sum = warp_sum_down(sum);
    weighted_sum = warp_sum_down(weighted_sum);
    if (lane == 0) {
        sums[row] = sum;
        weighted[row] = weighted_sum;
    }
}
