// SpTV, y = X x_n v, on the fiber-compressed layout (P_f, Ind, Val) of one chunk of fibers.
//
// Inside a chunk the host lays the fibers out by bin (each bin keeping the stored fiber order), so
// that every kernel is fast for short and for very long fibers alike:
//   - fibers of up to LONG_FIBER nonzeros: bins of LANES = 1, 2, 4, 8, 16 or 32 lanes per fiber
//     (the next power of two of the length, 32 beyond that), one launch of sptv_fiber_groups for
//     all bins. A lane group handles FIBERS_PER_GROUP neighbouring-by-stride fibers and issues
//     their loads together: with one short fiber per group the kernel is bound by the latency of
//     its dependent loads (P_f -> Val/Ind -> v), not by bandwidth;
//   - longer fibers are cut into segments of at most SEGMENT_NNZ nonzeros, one block per segment
//     (sptv_segments) writing a partial sum, then one warp per long fiber adds its partials in a
//     fixed order (sptv_long_finish). No atomics: results are deterministic.
// Y is written to y[out_id[position]] / y[long_fiber[w]]: y is the rank's Y from the chunk's first
// fiber on, so chunk-local fibers land in stored order; the piece of a fiber that an earlier chunk
// started goes to a slot past the rank's fibers, and sptv_combine_split adds it after the chunks.
// sptv_checksums reduces Y (sum, sum of squares) after the products, when Y is not read back.
//
// Macros: VALUE_T (double|float), INDEX_T (int|long long: fiber pointers and segment bounds),
// FIBER_INDEX_T (unsigned short|int|long long: mode-n indices), BLOCK_SIZE (threads per block,
// a multiple of 32, at most 1024), FIBERS_PER_GROUP (fibers per lane group, >= 1).

#include "hisparse_common.cuh"
#ifndef FIBER_INDEX_T
#define FIBER_INDEX_T unsigned short
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 256
#endif
#ifndef FIBERS_PER_GROUP
#define FIBERS_PER_GROUP 4
#endif


// Bin table rows: first block of the bin, first layout position, fibers in the bin, lanes.
#define BIN_FIELDS 4

// A chunk's fibers in the binned layout and the product's vectors, as one parameter list
// (sptv_fiber_groups and fiber_group_dot) and the matching arguments: fiber pointers (P_f) by
// layout position, each nonzero's mode-n index and value, layout position -> the fiber's entry
// of y; v, y. The engine passes them in this order.
#define FIBER_GROUP_PARAMS                                                                  \
    const INDEX_T* __restrict__ ptr, const FIBER_INDEX_T* __restrict__ ind,                 \
        const VALUE_T* __restrict__ val, const int* __restrict__ out_id,                    \
        const VALUE_T* __restrict__ v, VALUE_T* __restrict__ y
#define FIBER_GROUP_ARGS ptr, ind, val, out_id, v, y

template <int LANES>
__device__ __forceinline__ void fiber_group_dot(int block_in_bin, int first_pos, int count,
                                                FIBER_GROUP_PARAMS)
{
    constexpr int GROUPS = BLOCK_SIZE / LANES;
    const int group = (int)threadIdx.x / LANES;
    const int lane = (int)threadIdx.x & (LANES - 1);
    // Fiber r of this group sits at bin position base + r * GROUPS: at each r the groups of a
    // warp read neighbouring fibers, i.e. neighbouring memory.
    const int base = block_in_bin * GROUPS * FIBERS_PER_GROUP + group;
    INDEX_T lo[FIBERS_PER_GROUP], hi[FIBERS_PER_GROUP];
#pragma unroll
    for (int r = 0; r < FIBERS_PER_GROUP; ++r) {
        const int position = base + r * GROUPS;
        if (position < count) {
            lo[r] = ptr[first_pos + position] + lane;
            hi[r] = ptr[first_pos + position + 1];
        } else {
            lo[r] = 0;
            hi[r] = 0;
        }
    }
    VALUE_T sum[FIBERS_PER_GROUP];
#pragma unroll
    for (int r = 0; r < FIBERS_PER_GROUP; ++r) {
        sum[r] = lo[r] < hi[r] ? val[lo[r]] * __ldg(v + ind[lo[r]]) : (VALUE_T)0;
    }
    if (LANES == 32) {  // only the widest bin holds fibers longer than their lane count
#pragma unroll
        for (int r = 0; r < FIBERS_PER_GROUP; ++r) {
            for (INDEX_T k = lo[r] + LANES; k < hi[r]; k += LANES) {
                sum[r] += val[k] * __ldg(v + ind[k]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < FIBERS_PER_GROUP; ++r) {
        // Every lane of the warp takes part in the shuffles (no early return above).
        sum[r] = group_sum_down<LANES>(sum[r]);
        const int position = base + r * GROUPS;
        if (lane == 0 && position < count) {
            y[out_id[first_pos + position]] = sum[r];
        }
    }
}

// One launch for every short fiber of a chunk: block b belongs to the last bin whose first block
// is <= b; the whole block shares that bin's lane count, so the switch does not diverge.
extern "C" __global__ void sptv_fiber_groups(int nbins, const int* __restrict__ table,
                                             FIBER_GROUP_PARAMS)
{
    const int block = (int)blockIdx.x;
    int bin = 0;
    while (bin + 1 < nbins && block >= table[(bin + 1) * BIN_FIELDS]) {
        ++bin;
    }
    const int* row = table + bin * BIN_FIELDS;
    const int block_in_bin = block - row[0];
    const int first_pos = row[1], count = row[2], lanes = row[3];
#define SPTV_GROUP_DOT(L) \
    fiber_group_dot<L>(block_in_bin, first_pos, count, FIBER_GROUP_ARGS)
    switch (lanes) {
        case 1: SPTV_GROUP_DOT(1); break;
        case 2: SPTV_GROUP_DOT(2); break;
        case 4: SPTV_GROUP_DOT(4); break;
        case 8: SPTV_GROUP_DOT(8); break;
        case 16: SPTV_GROUP_DOT(16); break;
        default: SPTV_GROUP_DOT(32); break;
    }
#undef SPTV_GROUP_DOT
}

// One block per segment [seg_lo[s], seg_hi[s]) of a long fiber; partial[s] = its dot product.
extern "C" __global__ void sptv_segments(int nseg, const INDEX_T* __restrict__ seg_lo,
                                         const INDEX_T* __restrict__ seg_hi,
                                         const FIBER_INDEX_T* __restrict__ ind,
                                         const VALUE_T* __restrict__ val,
                                         const VALUE_T* __restrict__ v,
                                         VALUE_T* __restrict__ partial)
{
    __shared__ VALUE_T warp_sums[BLOCK_SIZE / 32];
    const int segment = (int)blockIdx.x;
    if (segment >= nseg) {
        return;  // uniform over the block
    }
    const INDEX_T end = seg_hi[segment];
    VALUE_T sum = 0;
#pragma unroll 4
    for (INDEX_T k = seg_lo[segment] + threadIdx.x; k < end; k += BLOCK_SIZE) {
        sum += val[k] * __ldg(v + ind[k]);
    }
    sum = block_sum(sum, warp_sums);
    if (threadIdx.x == 0) {
        partial[segment] = sum;
    }
}

// One warp per long fiber: y[long_fiber[w]] = sum of partial[long_seg_ptr[w] : long_seg_ptr[w+1]].
extern "C" __global__ void sptv_long_finish(int nlong, const int* __restrict__ long_fiber,
                                            const int* __restrict__ long_seg_ptr,
                                            const VALUE_T* __restrict__ partial,
                                            VALUE_T* __restrict__ y)
{
    const int warp = (int)(global_thread_id() / 32);
    const int lane = (int)threadIdx.x & 31;
    if (warp >= nlong) {
        return;  // uniform over the warp
    }
    VALUE_T sum = 0;
    for (int s = long_seg_ptr[warp] + lane; s < long_seg_ptr[warp + 1]; s += 32) {
        sum += partial[s];
    }
    sum = warp_sum_down(sum);
    if (lane == 0) {
        y[long_fiber[warp]] = sum;
    }
}

// After every chunk of a product: y[split[i]] += y[split[nsplit + i]] for i in order (the pieces
// of fibers split over chunks, in chunk order). One thread: a handful of additions, in a fixed
// order, so the result is deterministic and equals the host's (np.add.at in the same order).
extern "C" __global__ void sptv_combine_split(int nsplit, const INDEX_T* __restrict__ split,
                                              VALUE_T* __restrict__ y)
{
    if (global_thread_id() != 0) {
        return;
    }
    for (int i = 0; i < nsplit; ++i) {
        y[split[i]] += y[split[nsplit + i]];
    }
}

// Checksums of y[0:n] in double: block b writes partial[2b] = its sum, partial[2b + 1] = its sum
// of squares (grid-stride loop over any grid; the host adds the blocks' pairs).
extern "C" __global__ void sptv_checksums(long long n, const VALUE_T* __restrict__ y,
                                          double* __restrict__ partial)
{
    __shared__ double warp_sums[2][BLOCK_SIZE / 32];
    double sum = 0, squares = 0;
    const long long stride = (long long)gridDim.x * BLOCK_SIZE;
    for (long long i = global_thread_id(); i < n; i += stride) {
        const double value = (double)y[i];
        sum += value;
        squares += value * value;
    }
    sum = block_sum(sum, warp_sums[0]);
    squares = block_sum(squares, warp_sums[1]);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = sum;
        partial[2 * blockIdx.x + 1] = squares;
    }
}
