// MTTKRP for CP-ALS (ParSCP-ALS) on the CSR of the mode-n unfolding, and the kernels that build
// that CSR on the device (at the end). The small dense steps of one ALS mode update (solve, Gram,
// normalisation, fit) are in cpals_dense.cu.
//
// Layout (built by app/ops/cpals/state.py): the nonzeros of a tensor of order ORDER are sorted
// by the mode-n index (the unfolding's row), then by the other modes in increasing mode order.
// `indptr` (n_rows + 1) delimits rows; `values` (nnz) and ORDER-1 int32 coordinate arrays (one per
// other mode, in increasing mode order) are passed as a device array of pointers `other_idx`.
// Factor matrices are row-major (I_m x RANK); `factors` is a device array of the ORDER-1 pointers
// of the other modes' factors, in the same order as `other_idx`. The Khatri-Rao product is never
// formed: each nonzero multiplies its value with the Hadamard product of ORDER-1 factor rows.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T  float | double       value and factor type
//   INDEX_T  int | long long      row pointers and nonzero positions
//   ORDER    tensor order N >= 3 (2 also works)
//   RANK     CP rank R (columns of the factors), 1..1024
//   TEAM     lanes per nonzero team of mttkrp_nnz_team: a power of two <= 32

#include "hisparse_common.cuh"
#include "cpals_common.cuh"
#ifndef TEAM
#define TEAM 16
#endif

#define NOTHER (ORDER - 1)
#define COLS_PER_LANE ((RANK + TEAM - 1) / TEAM)

static_assert((TEAM & (TEAM - 1)) == 0 && TEAM <= 32, "TEAM must be a power of two <= 32");

// ---------------------------------------------------------------------------------------------
// Seed kernel (ParSCP-ALS): one thread block per row of the unfolding, one thread per rank
// column (blockDim.x == RANK). The block stages RANK nonzeros of its row at a time (value and
// the ORDER-1 coordinates) in shared memory, then every thread walks the staged entries and
// accumulates value * prod_m U_m[i_m, c] in a register. No atomics: each output entry has one
// writer. Short of threads for small R and serialised on long rows; kept as the seed design.
extern "C" __global__ void mttkrp_row_block(const INDEX_T n_rows,
                                            const INDEX_T* __restrict__ indptr,
                                            const VALUE_T* __restrict__ values,
                                            const int* const* __restrict__ other_idx,
                                            const VALUE_T* const* __restrict__ factors,
                                            VALUE_T* __restrict__ out)
{
    __shared__ VALUE_T s_val[RANK];
    __shared__ int s_idx[NOTHER][RANK];
    const INDEX_T row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block
    const int c = threadIdx.x;
    const INDEX_T start = indptr[row];
    const INDEX_T end = indptr[row + 1];
    const VALUE_T* f[NOTHER];
    const int* ix[NOTHER];
#pragma unroll
    for (int m = 0; m < NOTHER; ++m) { f[m] = factors[m]; ix[m] = other_idx[m]; }
    VALUE_T acc = 0;
    for (INDEX_T base = start; base < end; base += RANK) {
        const INDEX_T k = base + c;
        if (k < end) {
            s_val[c] = values[k];
#pragma unroll
            for (int m = 0; m < NOTHER; ++m) s_idx[m][c] = ix[m][k];
        }
        __syncthreads();
        const int count = (int)min((INDEX_T)RANK, end - base);
        for (int t = 0; t < count; ++t) {
            VALUE_T product = s_val[t];
#pragma unroll
            for (int m = 0; m < NOTHER; ++m) product *= f[m][(long long)s_idx[m][t] * RANK + c];
            acc += product;
        }
        __syncthreads();
    }
    out[(long long)row * RANK + c] = acc;
}

// ---------------------------------------------------------------------------------------------
// Faster design: nonzero-parallel teams with register accumulation ("segmented" CSR).
// The nonzeros are cut into equal chunks of `chunk` entries (a multiple of TEAM), one chunk per
// team of TEAM lanes, so work is balanced whatever the row lengths. Lane l of a team owns rank
// columns l, l + TEAM, ... (COLS_PER_LANE of them). The team loads TEAM nonzeros at a time with
// coalesced loads (one per lane) and broadcasts each in turn with warp shuffles; each lane
// accumulates its columns in registers while the row stays the same and flushes when the row
// changes. Rows that lie wholly inside the chunk are stored; the (at most two) rows cut by the
// chunk boundaries are added atomically, so `out` must be zeroed first; no other team touches a
// row wholly inside a chunk. (A block parted in two, the part that waits for the exchange of a
// factor's rows and the part that does not, runs as two launches into two buffers, which may
// overlap: the solve adds them.)
// The Hadamard product of all but the last other mode is cached in registers and recomputed
// only when one of those coordinates changes: with the nonzeros sorted by the other modes, runs
// of equal leading coordinates (fibers of the last mode) reuse it, like a CSF traversal.
__device__ __forceinline__ INDEX_T row_of(const INDEX_T* __restrict__ indptr, INDEX_T n_rows,
                                          INDEX_T position)
{
    // Last row r with indptr[r] <= position (skips empty rows).
    INDEX_T lo = 0, hi = n_rows;  // answer in [lo, hi)
    while (hi - lo > 1) {
        const INDEX_T mid = lo + (hi - lo) / 2;
        if (indptr[mid] <= position) lo = mid; else hi = mid;
    }
    return lo;
}

__device__ __forceinline__ void flush_row(VALUE_T* __restrict__ out, INDEX_T row, int lane,
                                          const VALUE_T (&acc)[COLS_PER_LANE], bool atomic)
{
#pragma unroll
    for (int j = 0; j < COLS_PER_LANE; ++j) {
        const int c = lane + j * TEAM;
        if (c < RANK) {
            VALUE_T* target = out + (long long)row * RANK + c;
            if (atomic) atomicAdd(target, acc[j]);
            else *target = acc[j];
        }
    }
}

extern "C" __global__ void mttkrp_nnz_team(const INDEX_T n_rows, const INDEX_T nnz,
                                           const INDEX_T chunk,
                                           const INDEX_T* __restrict__ indptr,
                                           const VALUE_T* __restrict__ values,
                                           const int* const* __restrict__ other_idx,
                                           const VALUE_T* const* __restrict__ factors,
                                           VALUE_T* __restrict__ out)
{
    const long long thread = global_thread_id();
    const long long team = thread / TEAM;
    const int lane = (int)(thread & (TEAM - 1));
    // Shuffle mask of this team's lanes within the warp.
    const unsigned mask = (TEAM == 32)
        ? FULL_MASK : (((1u << TEAM) - 1u) << ((threadIdx.x & 31) & ~(TEAM - 1)));
    const INDEX_T begin = (INDEX_T)(team * (long long)chunk);
    if (begin >= nnz || n_rows == 0) return;  // uniform over the team
    const INDEX_T end = min(begin + chunk, nnz);

    const VALUE_T* f[NOTHER];
    const int* ix[NOTHER];
#pragma unroll
    for (int m = 0; m < NOTHER; ++m) { f[m] = factors[m]; ix[m] = other_idx[m]; }

    INDEX_T row = row_of(indptr, n_rows, begin);
    INDEX_T row_start = indptr[row];
    INDEX_T row_end = indptr[row + 1];
    VALUE_T acc[COLS_PER_LANE];
    VALUE_T prefix[COLS_PER_LANE];  // prod of the first NOTHER-1 other modes' rows
    int cached[NOTHER > 1 ? NOTHER - 1 : 1];
#pragma unroll
    for (int j = 0; j < COLS_PER_LANE; ++j) { acc[j] = 0; prefix[j] = 1; }
#pragma unroll
    for (int m = 0; m < NOTHER - 1; ++m) cached[m] = -1;
    bool touched = false;

    for (INDEX_T base = begin; base < end; base += TEAM) {
        const INDEX_T k = base + lane;
        const bool valid = k < end;
        const VALUE_T my_value = valid ? values[k] : (VALUE_T)0;
        int my_idx[NOTHER];
#pragma unroll
        for (int m = 0; m < NOTHER; ++m) my_idx[m] = valid ? ix[m][k] : 0;
        const int count = (int)min((INDEX_T)TEAM, end - base);
        for (int t = 0; t < count; ++t) {
            const VALUE_T value = __shfl_sync(mask, my_value, t, TEAM);
            int idx[NOTHER];
#pragma unroll
            for (int m = 0; m < NOTHER; ++m) idx[m] = __shfl_sync(mask, my_idx[m], t, TEAM);
            const INDEX_T position = base + t;
            if (position >= row_end) {  // row change (uniform over the team)
                if (touched) flush_row(out, row, lane, acc,
                                       row_start < begin || row_end > end);
                row = row_of(indptr, n_rows, position);
                row_start = indptr[row];
                row_end = indptr[row + 1];
#pragma unroll
                for (int j = 0; j < COLS_PER_LANE; ++j) acc[j] = 0;
                touched = false;
            }
            bool changed = false;
#pragma unroll
            for (int m = 0; m < NOTHER - 1; ++m) changed |= (idx[m] != cached[m]);
            if (changed) {
#pragma unroll
                for (int m = 0; m < NOTHER - 1; ++m) cached[m] = idx[m];
#pragma unroll
                for (int j = 0; j < COLS_PER_LANE; ++j) {
                    const int c = lane + j * TEAM;
                    VALUE_T p = 1;
                    if (c < RANK) {
#pragma unroll
                        for (int m = 0; m < NOTHER - 1; ++m)
                            p *= f[m][(long long)idx[m] * RANK + c];
                    }
                    prefix[j] = p;
                }
            }
            const VALUE_T* last = f[NOTHER - 1] + (long long)idx[NOTHER - 1] * RANK;
#pragma unroll
            for (int j = 0; j < COLS_PER_LANE; ++j) {
                const int c = lane + j * TEAM;
                if (c < RANK) acc[j] += value * prefix[j] * last[c];
            }
            touched = true;
        }
    }
    if (touched) flush_row(out, row, lane, acc, row_start < begin || row_end > end);
}

// ---------------------------------------------------------------------------------------------
// The CSR of one rank's block of rows of the mode-`mode` unfolding, built on the device from that
// rank's nonzeros of the block, in any order (app/ops/cpals/device_sort.py; the NumPy builder
// state.mode_unfolding stays the reference, and the results are equal). `coo`: nnz x ORDER
// long long, row-major (a COOTensor's indices, global coordinates); `order` sorts them.
//   1. unfolding_keys   one 64-bit key per nonzero: (row in the block, then the other modes in
//                       increasing mode order) as a mixed-radix number, when it fits; parted
//                       (the 'fast' engine, several ranks), a nonzero whose coordinate of mode
//                       `late_mode` lies outside [late_lo, late_hi) (the rank's rows of that
//                       mode) gets `late_offset` (the radix's product) added, so the sort puts
//                       the early part first, each part in the block's order, and the early
//                       ones are counted
//   2. a stable device sort of the keys (CuPy / thrust; a lexsort of the coordinates when the
//                       key would overflow)
//   3. unfolding_gather the values and the other modes' int32 coordinates in sorted order, and
//                       the sorted rows
//   4. unfolding_indptr the row pointers, by binary search in the sorted rows; parted, each
//                       part's and the block's (their sum) in one launch

// keys[k] = ((i_mode - row_offset) * dims[m1] + i_m1) * dims[m2] + i_m2 ..., m1 < m2 < ... the
// other modes. dims: ORDER long longs.
// late_mode < 0: not parted (late_* and early_count unused).
extern "C" __global__ void unfolding_keys(const long long nnz, const int mode,
                                          const long long row_offset,
                                          const long long* __restrict__ coo,
                                          const long long* __restrict__ dims,
                                          const int late_mode, const long long late_lo,
                                          const long long late_hi,
                                          const unsigned long long late_offset,
                                          unsigned long long* __restrict__ early_count,
                                          unsigned long long* __restrict__ keys)
{
    const long long k = global_thread_id();
    bool early = false;
    if (k < nnz) {
        const long long* c = coo + k * ORDER;
        unsigned long long key = (unsigned long long)(c[mode] - row_offset);
#pragma unroll
        for (int m = 0; m < ORDER; ++m)
            if (m != mode) key = key * (unsigned long long)dims[m] + (unsigned long long)c[m];
        if (late_mode >= 0) {
            early = c[late_mode] >= late_lo && c[late_mode] < late_hi;
            if (!early) key += late_offset;
        }
        keys[k] = key;
    }
    if (late_mode < 0) return;  // uniform over the grid
    // one atomic per warp for its early nonzeros
    const unsigned ballot = __ballot_sync(FULL_MASK, early);
    if ((threadIdx.x & 31) == 0 && ballot)
        atomicAdd(early_count, (unsigned long long)__popc(ballot));
}

// Nonzero order[k] to position k: its value, its other modes' coordinates (other_idx: NOTHER
// rows of nnz int32, in increasing mode order) and its row in the block (rows, int32).
extern "C" __global__ void unfolding_gather(const long long nnz, const int mode,
                                            const long long row_offset,
                                            const long long* __restrict__ order,
                                            const long long* __restrict__ coo,
                                            const VALUE_T* __restrict__ values_in,
                                            VALUE_T* __restrict__ values,
                                            int* __restrict__ other_idx,
                                            int* __restrict__ rows)
{
    const long long k = global_thread_id();
    if (k >= nnz) return;
    const long long source = order[k];
    const long long* c = coo + source * ORDER;
    values[k] = values_in[source];
    int j = 0;
#pragma unroll
    for (int m = 0; m < ORDER; ++m) {
        if (m == mode) continue;
        other_idx[(long long)j * nnz + k] = (int)c[m];
        ++j;
    }
    rows[k] = (int)(c[mode] - row_offset);
}

// The first position at or after `first` (and before `last`) whose row is >= r (rows ascending
// over [first, last)).
__device__ __forceinline__ long long first_row_at_least(const int* __restrict__ rows,
                                                        long long first, long long last,
                                                        const long long r)
{
    while (first < last) {
        const long long mid = first + (last - first) / 2;
        if ((long long)rows[mid] < r) first = mid + 1; else last = mid;
    }
    return first;
}

// indptr[r] = the first position whose row is >= r, for r = 0..n_rows (rows ascending), so
// indptr[n_rows] = nnz and empty rows get empty ranges.
extern "C" __global__ void unfolding_indptr(const INDEX_T n_rows, const long long nnz,
                                            const int* __restrict__ rows,
                                            INDEX_T* __restrict__ indptr)
{
    const long long r = global_thread_id();
    if (r > (long long)n_rows) return;
    indptr[r] = (INDEX_T)first_row_at_least(rows, 0, nnz, r);
}

// A parted block (rows ascending over [0, n_early) and again over [n_early, nnz)): the early
// part's row pointers, the late part's (from 0, over its own nonzeros) and the block's, their
// sum: indptr[r] = the nonzeros of rows < r in both parts.
extern "C" __global__ void unfolding_indptr_parts(const INDEX_T n_rows, const long long n_early,
                                                  const long long nnz,
                                                  const int* __restrict__ rows,
                                                  INDEX_T* __restrict__ early_indptr,
                                                  INDEX_T* __restrict__ late_indptr,
                                                  INDEX_T* __restrict__ indptr)
{
    const long long r = global_thread_id();
    if (r > (long long)n_rows) return;
    const long long early = first_row_at_least(rows, 0, n_early, r);
    const long long late = first_row_at_least(rows, n_early, nnz, r) - n_early;
    early_indptr[r] = (INDEX_T)early;
    late_indptr[r] = (INDEX_T)late;
    indptr[r] = (INDEX_T)(early + late);
}
