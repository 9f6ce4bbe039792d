// CSR5 SpMV, y = A x (Liu & Vinter, ICS'15): CSR -> CSR5 conversion and the product.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T  float | double
//   INDEX_T  int | long long   (indices, row pointers, tile_ptr, empty_offset, chains)
//   SIGMA    tile height, 1..32 (a tile is OMEGA x SIGMA nonzeros, OMEGA = 32 = one warp)
//   COL_T    the product's column index type (default INDEX_T; "unsigned short" when every
//            column index fits: csr5_narrow_columns copies the converted col into it)
//   UNIFORM_VALUES  defined when every stored value of A is the same (a graph's adjacency
//            matrix): val is then that one value, val[0], not an array. The conversion leaves it
//            alone and the product reads only col, 8 (fp64) or 4 (fp32) bytes per nonzero fewer
//            (SuiteSparse:GraphBLAS's "iso-valued" matrices keep one value the same way); each
//            row's sum of gathered x entries is multiplied by the value once, where it is stored.
//
// Layout (see app/formats/_csr5.py, whose NumPy builder this converter must reproduce bit for
// bit): full tiles hold col/val transposed (lane l, step i at tile*TILE + i*32 + l); the tail
// after the last full tile stays in CSR order. tile_ptr[t] = row of the tile's first entry, sign
// bit set when empty rows lie strictly inside (tile_ptr[t], tile_ptr[t+1]). tile_desc[t] holds per
// lane NUM_PACKET words, read as one big-endian bit string: y_offset (BIT_Y bits), seg_offset
// (5 bits), then SIGMA row-start flags.
//
// Product (two launches on one stream): csr5_spmv, whose first blocks take the full tiles (one
// warp per tile: segmented sum with warp shuffles; rows starting in the tile are written with
// '=', a tile's leading partial of a row begun earlier goes to calibrator[t]), whose next blocks
// the tail (thread per row: the tail, the rows before the first nonzero and after the last) and
// whose last blocks the empty rows inside tiles that span long runs of them (thread per row);
// then csr5_calibrate (a thread per row continuing across tiles, a warp for those that
// span many: adds its calibrator range in a fixed order). Every y
// entry has exactly one writer per launch and there are no atomics, so y is bitwise identical
// from run to run.

#include "hisparse_common.cuh"
#ifndef SIGMA
#define SIGMA 16
#endif

#ifndef COL_T
#define COL_T INDEX_T
#endif

#define OMEGA 32
#define SEG_BITS 5

// The value every nonzero holds under UNIFORM_VALUES (read once per thread), else 1: the product's
// sums then scale by it where they are stored, and val[k] multiplies each term otherwise.
#ifdef UNIFORM_VALUES
__device__ __forceinline__ VALUE_T stored_scale(const VALUE_T* __restrict__ val) { return val[0]; }
#else
__device__ __forceinline__ VALUE_T stored_scale(const VALUE_T* __restrict__) { return VALUE_T(1); }
#endif

typedef unsigned long long u64;

constexpr int ceil_log2(int v)
{
    int bits = 0;
    while ((1 << bits) < v) {
        ++bits;
    }
    return bits;
}

constexpr int TILE = OMEGA * SIGMA;
constexpr int BIT_Y = ceil_log2(TILE);
constexpr int NUM_PACKET = (BIT_Y + SEG_BITS + SIGMA + 31) / 32;
// Flag of step i sits at bit FLAG_SHIFT + SIGMA - 1 - i of the 64-bit descriptor.
constexpr int FLAG_SHIFT = 64 - BIT_Y - SEG_BITS - SIGMA;
constexpr unsigned SIGMA_MASK = SIGMA == 32 ? FULL_MASK : ((1u << SIGMA) - 1u);

static_assert(SIGMA >= 1 && SIGMA <= 32, "SIGMA must lie in [1, 32]");
static_assert(NUM_PACKET <= 2, "descriptor must fit in two 32-bit packets");

// tile_ptr's empty-row flag is the sign bit of INDEX_T.
#define ROW_MASK ((INDEX_T)((1ull << (8 * sizeof(INDEX_T) - 1)) - 1ull))

__device__ __forceinline__ long long tile_row(INDEX_T entry) { return (long long)(entry & ROW_MASK); }

// Where the product puts row r's sum v: y[r] = v, or, given a row map (the compressed ghost block
// of a distributed product, added after the local block's product on the same stream), y[rows[r]]
// += v. Rows of the map are distinct and each row has one writer per launch, so no atomics.
__device__ __forceinline__ void put_row(VALUE_T* __restrict__ y, const INDEX_T* __restrict__ rows,
                                        const long long r, const VALUE_T v)
{
    if (rows == nullptr) {
        y[r] = v;
    } else {
        y[rows[r]] += v;
    }
}

// First index in [lo, hi) with a[index] > value (hi if none).
__device__ long long upper_bound(const INDEX_T* __restrict__ a, long long lo, long long hi,
                                 long long value)
{
    while (lo < hi) {
        const long long mid = (lo + hi) >> 1;
        if ((long long)a[mid] <= value) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

__device__ __forceinline__ u64 load_descriptor(const unsigned* __restrict__ tile_desc,
                                               long long tile, int lane)
{
    u64 desc = (u64)tile_desc[(tile * NUM_PACKET) * OMEGA + lane] << 32;
    if (NUM_PACKET == 2) {
        desc |= tile_desc[(tile * NUM_PACKET + 1) * OMEGA + lane];
    }
    return desc;
}

// ---------------------------------------------------------------------------------------------
// Conversion CSR -> CSR5
// ---------------------------------------------------------------------------------------------

// tile_ptr[t] = upper_bound(indptr, t * TILE) - 1 for t in [0, n_entries); n_entries = p + 1.
extern "C" __global__ void csr5_tile_ptr(const long long n_entries, const long long n_rows,
                                         const INDEX_T* __restrict__ indptr,
                                         INDEX_T* __restrict__ tile_ptr)
{
    const long long t = global_thread_id();
    if (t < n_entries) {
        tile_ptr[t] = (INDEX_T)(upper_bound(indptr, 0, n_rows + 1, t * TILE) - 1);
    }
}

// The row-start flags of one lane's SIGMA entries starting at position q, and the row holding q.
// Calls visit(step, row) for every real row start, in order.
template <typename Visit>
__device__ __forceinline__ unsigned lane_row_starts(const INDEX_T* __restrict__ indptr,
                                                    long long n_rows, long long first_row,
                                                    long long last_row, long long q,
                                                    long long* row_of_q, Visit visit)
{
    const long long hi = min(last_row + 2, n_rows + 1);
    const long long r = upper_bound(indptr, first_row, hi, q) - 1;
    *row_of_q = r;
    unsigned flags = 0;
    if ((long long)indptr[r] == q) {
        flags |= 1u;
        visit(0, r);
    }
    for (long long rr = r + 1; rr < n_rows; ++rr) {
        const long long start = indptr[rr];
        if (start >= q + SIGMA) {
            break;
        }
        if (start < (long long)indptr[rr + 1]) {  // empty rows share their successor's start
            flags |= 1u << (start - q);
            visit((int)(start - q), rr);
        }
    }
    return flags;
}

// One warp per full tile: descriptors, and per tile its segment count and
// tile_info = has_row_start | lead_open << 1 | has_empty_rows << 2.
extern "C" __global__ void csr5_tile_desc(const long long n_tiles, const long long n_rows,
                                          const INDEX_T* __restrict__ indptr,
                                          const INDEX_T* __restrict__ tile_ptr,
                                          unsigned* __restrict__ tile_desc,
                                          int* __restrict__ seg_count,
                                          unsigned char* __restrict__ tile_info)
{
    const long long tile = global_thread_id() >> 5;
    const int lane = threadIdx.x & 31;
    if (tile >= n_tiles) {
        return;  // whole warps leave together (blockDim is a multiple of 32)
    }
    const long long first_row = tile_row(tile_ptr[tile]);
    const long long last_row = tile_row(tile_ptr[tile + 1]);
    const long long base = tile * TILE;
    long long row_of_q;
    const unsigned flags = lane_row_starts(indptr, n_rows, first_row, last_row,
                                           base + (long long)lane * SIGMA, &row_of_q,
                                           [](int, long long) {});
    const int real = __popc(flags);
    const bool real0 = __shfl_sync(FULL_MASK, flags & 1u, 0) != 0;
    // Lane 0's first entry always opens a segment (a row start or the carry from earlier tiles).
    const int opened = real + ((lane == 0 && !real0) ? 1 : 0);
    const int inclusive = warp_inclusive_sum(opened, lane);
    const int y_offset = inclusive - opened;
    const unsigned opening_lanes = __ballot_sync(FULL_MASK, opened > 0);
    const unsigned later = lane == 31 ? 0u : (opening_lanes >> (lane + 1));
    const int seg_offset = later ? __ffs(later) - 1 : 31 - lane;
    const unsigned msb_flags = __brev(flags) >> (32 - SIGMA);  // step i -> bit SIGMA-1-i
    const u64 desc = ((u64)y_offset << (64 - BIT_Y)) |
                     ((u64)seg_offset << (64 - BIT_Y - SEG_BITS)) |
                     ((u64)msb_flags << FLAG_SHIFT);
    tile_desc[(tile * NUM_PACKET) * OMEGA + lane] = (unsigned)(desc >> 32);
    if (NUM_PACKET == 2) {
        tile_desc[(tile * NUM_PACKET + 1) * OMEGA + lane] = (unsigned)desc;
    }
    const int total = warp_sum_all(real);
    if (lane == 0) {
        // Empty rows strictly inside (first_row, last_row): the rows there minus the nonempty
        // ones, which all start in this tile (last_row too, when it starts past the tile's
        // first entry and before the next tile).
        const long long inner_starts = total - (real0 ? 1 : 0);
        bool last_starts_here = false;
        if (last_row != first_row && last_row < n_rows) {
            const long long start = indptr[last_row];
            last_starts_here = start > base && start < base + TILE;
        }
        const long long inner_rows = last_row > first_row + 1 ? last_row - first_row - 1 : 0;
        const long long empties = inner_rows - (inner_starts - (last_starts_here ? 1 : 0));
        seg_count[tile] = 1 + (int)inner_starts;
        tile_info[tile] = (unsigned char)((total > 0 ? 1 : 0) | (real0 ? 0 : 2) |
                                          (empties > 0 ? 4 : 0));
    }
}

// One warp per tile with empty rows: empty_offset[offset_ptr[t] + j] = row of segment j.
extern "C" __global__ void csr5_empty_offset(const long long n_tiles, const long long n_rows,
                                             const INDEX_T* __restrict__ indptr,
                                             const INDEX_T* __restrict__ tile_ptr,
                                             const unsigned* __restrict__ tile_desc,
                                             const unsigned char* __restrict__ tile_info,
                                             const long long* __restrict__ offset_ptr,
                                             INDEX_T* __restrict__ empty_offset)
{
    const long long tile = global_thread_id() >> 5;
    const int lane = threadIdx.x & 31;
    if (tile >= n_tiles || !(tile_info[tile] & 4)) {
        return;
    }
    const long long first_row = tile_row(tile_ptr[tile]);
    const long long last_row = tile_row(tile_ptr[tile + 1]);
    const long long out = offset_ptr[tile] +
                          (long long)(load_descriptor(tile_desc, tile, lane) >> (64 - BIT_Y));
    // Segment 0 (lane 0's first entry, forced or real) is the tile's first row.
    int next = 0;
    if (lane == 0) {
        empty_offset[out] = (INDEX_T)first_row;
        next = 1;
    }
    long long row_of_q;
    lane_row_starts(indptr, n_rows, first_row, last_row, tile * TILE + (long long)lane * SIGMA,
                    &row_of_q, [&](int step, long long row) {
                        if (lane != 0 || step != 0) {
                            empty_offset[out + next] = (INDEX_T)row;
                            ++next;
                        }
                    });
}

// Sets the empty-row flag (sign bit) of tile_ptr[t]; a separate pass so that no kernel reads a
// tile_ptr entry another thread is changing.
extern "C" __global__ void csr5_mark_empty(const long long n_tiles,
                                           const unsigned char* __restrict__ tile_info,
                                           INDEX_T* __restrict__ tile_ptr)
{
    const long long t = global_thread_id();
    if (t < n_tiles && (tile_info[t] & 4)) {
        tile_ptr[t] = (INDEX_T)(tile_ptr[t] | ~ROW_MASK);
    }
}

// ---- offset_ptr and the calibration chains, on the device (no host round trip) ----------------

// Threads per block of csr5_tile_totals and csr5_tile_scan (a multiple of 32, at most 1024).
#define SCAN_THREADS 512

struct ScanSum {
    __device__ long long operator()(long long a, long long b) const { return a + b; }
};
struct ScanMax {
    __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

// Exclusive prefix of `value` over the block's threads in thread order under `op` (associative,
// `identity` its neutral element); `*total` receives the whole block's. Every thread of the block
// calls it (blockDim.x a multiple of 32); `shared` holds 32 entries.
template <typename Op>
__device__ long long block_exclusive_scan(long long value, long long identity, Op op,
                                          long long* shared, long long* total)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const long long inclusive = warp_inclusive_scan(value, lane, op);
    if (lane == 31) {
        shared[warp] = inclusive;
    }
    __syncthreads();
    if (warp == 0) {
        const long long warp_total = lane < warps ? shared[lane] : identity;
        shared[lane] = warp_inclusive_scan(warp_total, lane, op);  // inclusive over the warps
    }
    __syncthreads();
    long long before = __shfl_up_sync(FULL_MASK, inclusive, 1);
    if (lane == 0) {
        before = identity;
    }
    const long long result = warp ? op(shared[warp - 1], before) : before;
    *total = shared[warps - 1];
    __syncthreads();  // `shared` is free for the next call
    return result;
}

// The units of the calibration chains: the full tiles, then the tail when there is one
// (calibration_chains and tail_unit in app/formats/_csr5.py define them; this is the same rule).
struct ChainUnits {
    long long n_tiles, count;
    bool tail_has_start, tail_lead_open;
    const unsigned char* __restrict__ tile_info;

    __device__ ChainUnits(long long tiles, long long nnz, const INDEX_T* __restrict__ indptr,
                          const INDEX_T* __restrict__ tile_ptr,
                          const unsigned char* __restrict__ info)
        : n_tiles(tiles), tile_info(info)
    {
        const long long tail_start = n_tiles * TILE;
        count = n_tiles + (tail_start < nnz ? 1 : 0);
        // The tail: its lead is open when its first entry does not start a row; a row starts in
        // it when its lead is closed or a later row holds entries.
        const long long tail_row = tile_row(tile_ptr[n_tiles]);
        tail_lead_open = count > n_tiles && (long long)indptr[tail_row] != tail_start;
        tail_has_start = count > n_tiles &&
                         (!tail_lead_open || (long long)indptr[tail_row + 1] < nnz);
    }
    __device__ bool has_start(long long u) const
    {
        return u < n_tiles ? (tile_info[u] & 1) != 0 : tail_has_start;
    }
    __device__ bool lead_open(long long u) const
    {
        return u < n_tiles ? (tile_info[u] & 2) != 0 : tail_lead_open;
    }
    // A chain begins at an open-lead unit whose predecessor holds a row start ...
    __device__ bool begins(long long u) const { return u > 0 && lead_open(u) && has_start(u - 1); }
    // ... and runs on through units without a row start, while the next unit's lead is open.
    __device__ bool stops(long long u) const
    {
        return has_start(u) || u + 1 == count || !lead_open(u + 1);
    }
    // Unit u's terms of the three scans (all 0 past the last unit): its entries of empty_offset
    // (tiles with empty rows), whether a chain begins there, and its chain event, coded
    // 2 (u + 1) + 1 for a chain left open at u, 2 (u + 1) for a unit that closes any chain, 0 for
    // neither: the largest code before a unit is the last event before it.
    __device__ void terms(long long u, const int* __restrict__ seg_count, long long* offsets,
                          long long* beginning, long long* event) const
    {
        *offsets = *beginning = *event = 0;
        if (u >= count) {
            return;
        }
        if (u < n_tiles && (tile_info[u] & 4)) {
            *offsets = seg_count[u];
        }
        *beginning = begins(u);
        if (stops(u)) {
            *event = 2 * (u + 1);
        } else if (*beginning) {
            *event = 2 * (u + 1) + 1;
        }
    }
};

// offset_ptr and the calibration chains in two launches, a unit per thread (decoupled from the
// host: nothing is copied back in between). csr5_tile_totals: per block, the sums of the offsets
// and of the chain beginnings and the last chain event of its units, into
// block_totals[3 * block + {0, 1, 2}].
extern "C" __global__ __launch_bounds__(SCAN_THREADS) void csr5_tile_totals(
    const long long n_tiles, const long long nnz, const INDEX_T* __restrict__ indptr,
    const INDEX_T* __restrict__ tile_ptr, const int* __restrict__ seg_count,
    const unsigned char* __restrict__ tile_info, long long* __restrict__ block_totals)
{
    __shared__ long long shared[32];
    const ChainUnits units(n_tiles, nnz, indptr, tile_ptr, tile_info);
    long long offsets, beginning, event, total;
    units.terms(global_thread_id(), seg_count, &offsets, &beginning, &event);
    block_exclusive_scan(offsets, 0LL, ScanSum(), shared, &total);
    if (threadIdx.x == 0) {
        block_totals[3 * (long long)blockIdx.x] = total;
    }
    block_exclusive_scan(beginning, 0LL, ScanSum(), shared, &total);
    if (threadIdx.x == 0) {
        block_totals[3 * (long long)blockIdx.x + 1] = total;
    }
    block_exclusive_scan(event, 0LL, ScanMax(), shared, &total);
    if (threadIdx.x == 0) {
        block_totals[3 * (long long)blockIdx.x + 2] = total;
    }
}

// csr5_tile_scan, the same grid after csr5_tile_totals: each block folds the totals of the
// blocks before it, scans its units and writes offset_ptr[t] (the entries of empty_offset of
// the tiles before t that have empty rows), the chains (chain k: its row, first and last unit)
// and, in the last block, offset_ptr[p] and summary = {offset_ptr[p], chains, tile_ptr[0],
// tile_ptr[p]}: the four numbers the host reads back (array and launch sizes). Runs before
// csr5_mark_empty (tile_ptr's rows without flags).
extern "C" __global__ __launch_bounds__(SCAN_THREADS) void csr5_tile_scan(
    const long long n_tiles, const long long nnz, const INDEX_T* __restrict__ indptr,
    const INDEX_T* __restrict__ tile_ptr, const int* __restrict__ seg_count,
    const unsigned char* __restrict__ tile_info, const long long* __restrict__ block_totals,
    long long* __restrict__ offset_ptr, INDEX_T* __restrict__ chain_row,
    INDEX_T* __restrict__ chain_first, INDEX_T* __restrict__ chain_last,
    long long* __restrict__ summary)
{
    __shared__ long long shared[32];
    const ChainUnits units(n_tiles, nnz, indptr, tile_ptr, tile_info);
    // The blocks before this one.
    long long offsets_before = 0, chains_before = 0, event_before = 0;
    for (long long b = threadIdx.x; b < blockIdx.x; b += blockDim.x) {
        offsets_before += block_totals[3 * b];
        chains_before += block_totals[3 * b + 1];
        event_before = max(event_before, block_totals[3 * b + 2]);
    }
    long long unused;
    block_exclusive_scan(offsets_before, 0LL, ScanSum(), shared, &offsets_before);
    block_exclusive_scan(chains_before, 0LL, ScanSum(), shared, &chains_before);
    block_exclusive_scan(event_before, 0LL, ScanMax(), shared, &event_before);

    const long long u = global_thread_id();
    long long offsets, beginning, event, block_offsets, block_chains;
    units.terms(u, seg_count, &offsets, &beginning, &event);
    const long long offset = offsets_before +
        block_exclusive_scan(offsets, 0LL, ScanSum(), shared, &block_offsets);
    const long long chain = chains_before +
        block_exclusive_scan(beginning, 0LL, ScanSum(), shared, &block_chains);
    const long long last_event = max(event_before,
                                     block_exclusive_scan(event, 0LL, ScanMax(), shared, &unused));
    if (u < units.count) {
        if (u < n_tiles) {
            offset_ptr[u] = offset;
        }
        if (beginning) {
            chain_row[chain] = (INDEX_T)tile_row(tile_ptr[u]);
            chain_first[chain] = (INDEX_T)u;
        }
        // Chain `chain` begins here, or chain - 1 is still open: it ends here if u stops it.
        if ((beginning || (last_event & 1)) && units.stops(u)) {
            chain_last[chain + beginning - 1] = (INDEX_T)u;
        }
    }
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) {
        const long long total_offsets = offsets_before + block_offsets;
        offset_ptr[n_tiles] = total_offsets;
        summary[0] = total_offsets;
        summary[1] = chains_before + block_chains;
        summary[2] = tile_row(tile_ptr[0]);
        summary[3] = tile_row(tile_ptr[n_tiles]);
    }
}

// Shared-memory slot of a tile's k-th entry in csr5_transpose. The transposed read of lane l
// takes entry l * SIGMA + i, a stride of SIGMA: conflict-free for odd SIGMA, but up to 32-way
// bank conflicts for even ones (SIGMA = 16: every lane in one bank), so those leave one slot free
// after every 32 entries.
constexpr int TRANSPOSE_PAD = SIGMA % 2 == 0 ? 1 : 0;
__device__ __forceinline__ int transpose_slot(int k) { return k + TRANSPOSE_PAD * (k / OMEGA); }

// One block per full tile: transpose the tile's col/val in place through shared memory, so lane
// l's step i lands at i*32 + l (coalesced loads in the product). Tiles are disjoint and each
// block reads its whole tile before writing, so in place is safe; the tail is left as it is.
extern "C" __global__ void csr5_transpose(const long long n_tiles, INDEX_T* __restrict__ col,
                                          VALUE_T* __restrict__ val)
{
    __shared__ VALUE_T val_tile[TILE + TRANSPOSE_PAD * SIGMA];
    __shared__ INDEX_T col_tile[TILE + TRANSPOSE_PAD * SIGMA];
    if (blockIdx.x >= n_tiles) {
        return;  // whole block
    }
    const long long base = (long long)blockIdx.x * TILE;
#ifdef UNIFORM_VALUES
    constexpr bool values = false;  // val is the one value, not an array
#else
    constexpr bool values = true;
#endif
    for (int k = threadIdx.x; k < TILE; k += blockDim.x) {
        if (values) {
            val_tile[transpose_slot(k)] = val[base + k];
        }
        col_tile[transpose_slot(k)] = col[base + k];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < TILE; k += blockDim.x) {
        const int source = transpose_slot((k % OMEGA) * SIGMA + k / OMEGA);
        if (values) {
            val[base + k] = val_tile[source];
        }
        col[base + k] = col_tile[source];
    }
}

// The converted col (INDEX_T) copied into the product's COL_T array. Why: the product streams col
// once per repeat, and on short rows (SpTV's fibers: ~7 entries) its loads are a third of the
// bytes; 16-bit indices cut them by half where the columns allow (the conversion itself keeps
// INDEX_T, so its output still equals the NumPy builder's).
extern "C" __global__ void csr5_narrow_columns(const long long nnz,
                                               const INDEX_T* __restrict__ col,
                                               COL_T* __restrict__ narrow)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = global_thread_id(); k < nnz; k += stride) {
        narrow[k] = (COL_T)col[k];
    }
}

// ---------------------------------------------------------------------------------------------
// Product
// ---------------------------------------------------------------------------------------------

// The product's arrays, as parameter lists shared by csr5_spmv and its two parts (each array a
// __restrict__ kernel parameter: its loads take the read-only path) with the matching arguments.
// The matrix: tile pointers (negative: the tile has empty rows), tile descriptors, columns and
// values in tile order, the row of each segment of the tiles with empty rows (tile t's from
// empty_offset[offset_ptr[t]]), the CSR row pointers.
// The product: x, y, y's row map (null: y's own rows; the ghost block's rows otherwise) and the
// calibrator (the partial sums of rows that cross tiles). The engine passes them in this order.
#define CSR5_MATRIX_PARAMS                                                                  \
    const INDEX_T* __restrict__ tile_ptr, const unsigned* __restrict__ tile_desc,           \
        const COL_T* __restrict__ col, const VALUE_T* __restrict__ val,                     \
        const long long* __restrict__ offset_ptr, const INDEX_T* __restrict__ empty_offset, \
        const INDEX_T* __restrict__ indptr
#define CSR5_MATRIX_ARGS tile_ptr, tile_desc, col, val, offset_ptr, empty_offset, indptr
#define CSR5_PRODUCT_PARAMS                                                                 \
    const VALUE_T* __restrict__ x, VALUE_T* __restrict__ y, const INDEX_T* __restrict__ rows, \
        VALUE_T* __restrict__ calibrator
#define CSR5_PRODUCT_ARGS x, y, rows, calibrator

// One warp per full tile; `thread` numbers the tile blocks' threads.
__device__ __forceinline__ void tile_product(const long long thread, const long long n_tiles,
                                             const long long wide_span, CSR5_MATRIX_PARAMS,
                                             CSR5_PRODUCT_PARAMS)
{
    const long long tile = thread >> 5;
    const int lane = threadIdx.x & 31;
    if (tile >= n_tiles) {
        return;  // whole warps leave together
    }
    const INDEX_T entry = tile_ptr[tile];
    const bool has_empty = entry < 0;
    const long long first_row = tile_row(entry);
    const u64 desc = load_descriptor(tile_desc, tile, lane);
    int segment = (int)(desc >> (64 - BIT_Y));  // index of the next segment this lane opens
    unsigned flags = (unsigned)(desc >> FLAG_SHIFT) & SIGMA_MASK;
    const bool real0 = __shfl_sync(FULL_MASK, (flags >> (SIGMA - 1)) & 1u, 0) != 0;
    if (lane == 0) {
        flags |= 1u << (SIGMA - 1);  // the tile's first entry always opens a segment
    }
    const long long map = has_empty ? offset_ptr[tile] : 0;
    const VALUE_T scale = stored_scale(val);

    // Segment s of the tile ends with partial sum v: its row gets it, except a leading partial
    // of a row begun in an earlier tile, which waits in the calibrator.
    auto store = [&](int s, VALUE_T v) {
        v *= scale;
        if (s == 0 && !real0) {
            calibrator[tile] = v;
        } else {
            const long long row = has_empty ? (long long)empty_offset[map + s] : first_row + s;
            put_row(y, rows, row, v);
        }
    };

    // All loads of the lane first (col/val streamed past L1/L2 with evict-first hints so x keeps
    // the cache), then the x gathers, then the segment logic: many loads in flight per warp.
    const long long base = tile * TILE + lane;
    VALUE_T product[SIGMA];
    COL_T column[SIGMA];
#pragma unroll
    for (int i = 0; i < SIGMA; ++i) {
        column[i] = __ldcs(&col[base + (long long)i * OMEGA]);
#ifndef UNIFORM_VALUES
        product[i] = __ldcs(&val[base + (long long)i * OMEGA]);
#endif
    }
#pragma unroll
    for (int i = 0; i < SIGMA; ++i) {
#ifdef UNIFORM_VALUES
        product[i] = __ldg(&x[column[i]]);
#else
        product[i] *= __ldg(&x[column[i]]);
#endif
    }
    VALUE_T sum = 0;
    VALUE_T head = 0;  // entries before this lane's first row start: the previous segment's
    bool opened = false;
#pragma unroll
    for (int i = 0; i < SIGMA; ++i) {
        if ((flags >> (SIGMA - 1 - i)) & 1u) {
            if (opened) {
                store(segment - 1, sum);
            } else {
                head = sum;
            }
            opened = true;
            sum = 0;
            ++segment;
        }
        sum += product[i];
    }
    if (!opened) {
        head = sum;
    }
    // Segmented suffix sum of the heads: carry[l] = head[l] + (lane l opens nothing ?
    // carry[l+1] : 0). Hillis-Steele over windows; 'closed' = the window holds an opening lane.
    VALUE_T carry = head;
    bool closed = opened;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const VALUE_T other = __shfl_down_sync(FULL_MASK, carry, d);
        const bool other_closed = __shfl_down_sync(FULL_MASK, (int)closed, d) != 0;
        if (!closed && lane + d < 32) {
            carry += other;
            closed = other_closed;
        }
    }
    VALUE_T incoming = __shfl_down_sync(FULL_MASK, carry, 1);
    if (lane == 31) {
        incoming = 0;  // the next tile's leading partial goes through the calibrator
    }
    if (opened) {
        store(segment - 1, sum + incoming);
    }
    if (has_empty && rows == nullptr) {
        // Empty rows strictly inside the tile's row range belong to this tile: write their 0
        // (adding to mapped rows, there is nothing to add), unless there are more than
        // wide_span rows inside: then the launch's last blocks write them (wide_zero), a thread
        // per row, so that no warp walks a long run of empty rows alone.
        const long long last_row = tile_row(tile_ptr[tile + 1]);
        if (last_row - first_row - 1 > wide_span) {
            return;
        }
        for (long long r = first_row + 1 + lane; r < last_row; r += OMEGA) {
            if (indptr[r] == indptr[r + 1]) {
                y[r] = 0;
            }
        }
    }
}

// Thread per row of: the n_lead rows before the first nonzero (empty: 0), and rows
// [tail_row, n_rows) (the tail, in CSR order, and empty rows after the last nonzero). The tail's
// part of a row begun in a full tile goes to calibrator[n_tiles].
__device__ __forceinline__ void tail_product(const long long i, const long long n_lead,
                                             const long long tail_row, const long long n_rows,
                                             const long long tail_start, const long long n_tiles,
                                             const INDEX_T* __restrict__ indptr,
                                             const COL_T* __restrict__ col,
                                             const VALUE_T* __restrict__ val,
                                             CSR5_PRODUCT_PARAMS)
{
    if (i >= n_lead + (n_rows - tail_row)) {
        return;
    }
    if (i < n_lead) {
        if (rows == nullptr) {
            y[i] = 0;
        }
        return;
    }
    const long long row = tail_row + (i - n_lead);
    const long long begin = indptr[row];
    const long long end = indptr[row + 1];
    VALUE_T sum = 0;
    for (long long j = max(begin, tail_start); j < end; ++j) {
#ifdef UNIFORM_VALUES
        sum += __ldg(&x[col[j]]);
#else
        sum += val[j] * __ldg(&x[col[j]]);
#endif
    }
    sum *= stored_scale(val);
    if (begin < tail_start) {
        calibrator[n_tiles] = sum;
    } else if (begin < end || rows == nullptr) {
        put_row(y, rows, row, sum);
    }
}

// The 0 of the empty rows inside the wide tiles (more than wide_span rows inside their row
// range, listed at conversion): thread i takes row i of their interiors laid end to end, wide
// tile k's from wide_prefix[k], beginning at row wide_start[k].
__device__ __forceinline__ void wide_zero(const long long i, const long long n_wide,
                                          const INDEX_T* __restrict__ wide_start,
                                          const INDEX_T* __restrict__ wide_prefix,
                                          const INDEX_T* __restrict__ indptr,
                                          VALUE_T* __restrict__ y)
{
    if (n_wide == 0 || i >= (long long)wide_prefix[n_wide]) {
        return;
    }
    const long long k = upper_bound(wide_prefix, 0, n_wide + 1, i) - 1;
    const long long r = (long long)wide_start[k] + (i - (long long)wide_prefix[k]);
    if (indptr[r] == indptr[r + 1]) {
        y[r] = 0;
    }
}

// The tiles, the tail and the wide tiles' empty rows in one launch: blocks [0, tile_blocks) take
// the tiles (a warp each), the next ones the tail's rows (a thread each), the last ones the
// empty rows inside the wide tiles (a thread each; none given a row map). The parts write
// disjoint entries of y and of the calibrator, so they need no order; one launch instead of
// several halves the fixed cost of a small product.
extern "C" __global__ void csr5_spmv(const long long n_tiles, const long long tile_blocks,
                                     const long long n_lead, const long long tail_row,
                                     const long long n_rows, const long long tail_start,
                                     const long long n_wide, const long long wide_span,
                                     CSR5_MATRIX_PARAMS, const INDEX_T* __restrict__ wide_start,
                                     const INDEX_T* __restrict__ wide_prefix,
                                     CSR5_PRODUCT_PARAMS)
{
    const long long block = blockIdx.x;  // block-uniform branches: whole warps take one
    const long long tail_blocks = (n_lead + (n_rows - tail_row) + blockDim.x - 1) / blockDim.x;
    if (block < tile_blocks) {
        tile_product(block * blockDim.x + threadIdx.x, n_tiles, wide_span, CSR5_MATRIX_ARGS,
                     CSR5_PRODUCT_ARGS);
    } else if (block < tile_blocks + tail_blocks) {
        tail_product((block - tile_blocks) * blockDim.x + threadIdx.x, n_lead, tail_row, n_rows,
                     tail_start, n_tiles, indptr, col, val, CSR5_PRODUCT_ARGS);
    } else if (rows == nullptr) {
        wide_zero((block - tile_blocks - tail_blocks) * blockDim.x + threadIdx.x, n_wide,
                  wide_start, wide_prefix, indptr, y);
    }
}

// Rows continuing across tiles: y[row] += sum(calibrator[first..last]) for each chain. Threads
// [0, n_chains) take a chain each, those of at most long_terms terms (most: a row crossing one
// or two tile boundaries), summed in index order; then, from the next multiple of 32, a warp per
// chain of long_chains (the longer ones, listed at conversion), summed lane-strided and reduced by
// a shuffle tree. Each chain has one writer and a fixed order, so y stays bitwise repeatable.
// (A warp for every chain left 31 lanes idle on most: 14 us of R-MAT 21's 240 us product. A
// thread per chain whose warp then took its lanes' long chains one after another was slower
// still, 20 us: degree order puts the hub rows' long chains next to each other.)
extern "C" __global__ void csr5_calibrate(const long long n_chains, const long long long_terms,
                                          const long long n_long,
                                          const INDEX_T* __restrict__ long_chains,
                                          const INDEX_T* __restrict__ chain_row,
                                          const INDEX_T* __restrict__ chain_first,
                                          const INDEX_T* __restrict__ chain_last,
                                          const VALUE_T* __restrict__ calibrator,
                                          VALUE_T* __restrict__ y,
                                          const INDEX_T* __restrict__ rows)
{
    const long long thread = global_thread_id();
    if (thread < n_chains) {
        const long long first = chain_first[thread];
        const long long last = chain_last[thread];
        if (last - first + 1 > long_terms) {
            return;  // a warp of the second part takes it
        }
        VALUE_T sum = 0;
        for (long long k = first; k <= last; ++k) {
            sum += calibrator[k];
        }
        const long long row = chain_row[thread];
        VALUE_T* out = rows == nullptr ? &y[row] : &y[rows[row]];
        *out = *out + sum;
        return;
    }
    const long long warps_from = (n_chains + 31) & ~31LL;  // whole warps from here on
    if (thread < warps_from) {
        return;
    }
    const long long index = (thread - warps_from) >> 5;
    if (index >= n_long) {
        return;  // the whole warp
    }
    const int lane = threadIdx.x & 31;
    const long long chain = long_chains[index];
    const long long last = chain_last[chain];
    VALUE_T sum = 0;
    for (long long k = chain_first[chain] + lane; k <= last; k += 32) {
        sum += calibrator[k];
    }
    sum = warp_sum_down(sum);
    if (lane == 0) {
        const long long row = chain_row[chain];
        VALUE_T* out = rows == nullptr ? &y[row] : &y[rows[row]];
        *out = *out + sum;
    }
}
