// The small dense steps of one CP-ALS mode update, on the device so that an iteration never waits
// for the host (app/ops/cpals/gpu.py). Two launches per mode around the MTTKRP:
//
//   solve_rows        U = M V^-1 for this rank's rows, and in the same pass this rank's share of
//                     the column products: U^T U, <U, M> and the column maxima of |U|
//   (the operation sums the products and takes the maxima over the ranks, an R x R all-reduce,
//    and all-gathers the rows of U, in one NCCL group)
//   normalize_factor  lambda, U /= lambda, the Gram of the scaled factor, and the fit after the
//                     last mode
//   gram_inverse      V^-1 of the next mode, on a side stream after every normalize_factor (and
//                     for the first mode of a run), so that the inversion overlaps the next
//                     MTTKRP instead of delaying it
//   deferred_normalize  for a mode whose factor the next MTTKRP reads unnormalised: lambda and
//                     the Gram from the reduced products, and the next mode's V^-1 with its rows
//                     divided by lambda (the next solve's W), on the side stream; for an
//                     iteration's last mode (read so by the next iteration's first MTTKRP), the
//                     fit too
//   scale_columns     U /= lambda, once the next MTTKRP has read the unnormalised factor
//
// so no rank forms a Gram from the whole factor: the work that does not shrink with more ranks
// is O(R^2) + O(R^3) per mode, plus the element-wise scaling of the gathered factor (I_n R).
//
// Layout: factors and MTTKRP rows are row-major (rows x RANK, VALUE_T). Every mode's Gram is
// RANK x RANK fp64, stored one after another (`grams`: ORDER x RANK x RANK). lambda is fp64.
// The column products of one rank (`total`, TOTAL_WIDTH doubles): U^T U (RANK * RANK), <U, M>
// (1), then the column maxima (RANK): the first SUM_WIDTH entries are summed over the ranks, the
// last RANK maximised. Grams, lambda, <X, M> and the fit are fp64 whatever VALUE_T is.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T  float | double       factor and MTTKRP type
//   INDEX_T  int | long long      row counts
//   ORDER    tensor order N >= 2
//   RANK     CP rank R, 1..1024

#include "hisparse_common.cuh"
#include "cpals_common.cuh"

#define PRODUCTS (RANK * RANK)
#define SUM_WIDTH (PRODUCTS + 1)
#define TOTAL_WIDTH (SUM_WIDTH + RANK)

// ---------------------------------------------------------------------------------------------
// V^-1 for the solve U_n = M V^-1, V = *_{m != n} G_m.

// V = the Hadamard product of every Gram but `skip`, inverted in place by Gauss-Jordan
// elimination without pivoting and written to `vinv` (RANK x RANK, VALUE_T). V is symmetric
// positive definite (a Hadamard product of Grams of full-rank factors), so its pivots are
// positive Schur complements and need no exchange. Called by every thread of one block
// (blockDim.x a multiple of 32). `a`: (RANK * RANK + RANK) doubles of shared or global memory.
// `grams` may have been written by this block just before (after a __syncthreads), so it is read
// through the coherent path (no __restrict__). A pivot that is not positive (V singular: the
// factors lost rank) sets status[0] = skip + 1 for the host to name the mode; the CPU backend
// uses a pseudo-inverse there instead. With `row_scale` (RANK doubles, may be null) row k of the
// inverse is divided by row_scale[k] before it is rounded to VALUE_T.
__device__ void invert_hadamard(const int skip, const double* grams, double* a,
                                VALUE_T* __restrict__ vinv, int* __restrict__ status,
                                const double* row_scale)
{
    __shared__ double pivot;
    double* factor = a + PRODUCTS;  // column k of the other rows: their elimination factors
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
        double v = 1.0;
        for (int m = 0; m < ORDER; ++m)
            if (m != skip) v *= grams[(long long)m * PRODUCTS + p];
        a[p] = v;
    }
    __syncthreads();
    for (int k = 0; k < RANK; ++k) {
        if (threadIdx.x == 0) {
            pivot = a[k * RANK + k];
            if (!(pivot > 0.0)) status[0] = skip + 1;  // also catches NaN
        }
        __syncthreads();
        // Row k is divided by the pivot (its diagonal becoming 1 / pivot); column k of the other
        // rows is kept: the two touch different entries.
        for (int j = threadIdx.x; j < RANK; j += blockDim.x) {
            a[k * RANK + j] = (j == k ? 1.0 : a[k * RANK + j]) / pivot;
            factor[j] = j == k ? 0.0 : a[j * RANK + k];
        }
        __syncthreads();
        for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
            const int i = p / RANK, j = p - i * RANK;
            if (i != k) a[p] = (j == k ? 0.0 : a[p]) - factor[i] * a[k * RANK + j];
        }
        __syncthreads();
    }
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x)
        vinv[p] = (VALUE_T)(row_scale != nullptr ? a[p] / row_scale[p / RANK] : a[p]);
}

// V^-1 of mode `skip` on its own (one block). The matrix lives in dynamic shared memory
// ((RANK * RANK + RANK) doubles) when `work` is null, else in `work` (global, same size) for
// ranks whose matrix does not fit.
extern "C" __global__ void gram_inverse(const int skip, const double* __restrict__ grams,
                                        double* work, VALUE_T* __restrict__ vinv,
                                        int* __restrict__ status)
{
    extern __shared__ double shared_work[];
    invert_hadamard(skip, grams, work != nullptr ? work : shared_work, vinv, status, nullptr);
}

// lambda of column c from the products reduced over the ranks (`total`): the first iteration's
// column 2-norm sqrt((U^T U)[c, c]), later max(max_i |U[i, c]|, 1).
__device__ __forceinline__ double column_lambda(const double* __restrict__ total, const int c,
                                                const int first_iteration)
{
    return first_iteration ? sqrt(total[c * RANK + c]) : fmax(total[SUM_WIDTH + c], 1.0);
}

// lambda of every column into s_lam (shared, RANK) and, where `lam` is not null, into `lam` too;
// then the Gram of the normalised factor, U^T U / (lambda lambda^T), into `gram`, from the
// products in `total`. Called by every thread of the block; s_lam is complete on return.
__device__ void lambda_and_gram(const double* __restrict__ total, const int first_iteration,
                                double* s_lam, double* __restrict__ lam, double* gram)
{
    for (int c = threadIdx.x; c < RANK; c += blockDim.x) {
        s_lam[c] = column_lambda(total, c, first_iteration);
        if (lam != nullptr) lam[c] = s_lam[c];
    }
    __syncthreads();
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
        const int a = p / RANK, b = p - a * RANK;
        gram[p] = total[p] / (s_lam[a] * s_lam[b]);
    }
}

// Rows [0, n_rows) of U divided by lambda column by column (lambda rounded to VALUE_T first, as
// on the host), by the threads numbered `thread` of `threads` (a grid-stride loop).
__device__ __forceinline__ void divide_columns(const INDEX_T n_rows, VALUE_T* __restrict__ u_rows,
                                               const double* s_lam, const long long thread,
                                               const long long threads)
{
    const long long count = (long long)n_rows * RANK;
    for (long long id = thread; id < count; id += threads)
        u_rows[id] = u_rows[id] / (VALUE_T)s_lam[id % RANK];
}

// The fit after an iteration's last mode, from lambda (s_lam) and every mode's Gram as now
// normalised (`grams`, this block's writes visible: after a __syncthreads):
//     fit[0] = 1 - sqrt(|norm_x^2 + |M|^2 - 2 <X, M>|) / norm_x,
//     |M|^2 = lam^T (*_m G_m) lam, <X, M> = total[PRODUCTS] (<U, M> of the unscaled update),
// and fit[1] = status[0] as it stands (before the next mode's inversion: a failure of the next
// iteration's first system is reported with that iteration, as when it is solved). Called by
// every thread of one block; `scratch`: 32 doubles of shared memory.
__device__ void model_fit(const double* __restrict__ total, const double* s_lam,
                          const double* grams, const int* status, const double norm_x,
                          double* __restrict__ fit, double* scratch)
{
    double sum = 0.0;
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
        const int a = p / RANK, b = p - a * RANK;
        double term = s_lam[a] * s_lam[b];
        for (int m = 0; m < ORDER; ++m) term *= grams[(long long)m * PRODUCTS + p];
        sum += term;
    }
    const double norm_m2 = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        const double residual = sqrt(fabs(norm_x * norm_x + norm_m2 - 2.0 * total[PRODUCTS]));
        fit[0] = norm_x > 0.0 ? 1.0 - residual / norm_x : 0.0;
        fit[1] = (double)status[0];
    }
}

// The normalisation of mode `mode` deferred past the next MTTKRP (one block, on the side stream
// once the products are reduced): the next MTTKRP reads the solved factor U' = U diag(lambda)
// unnormalised, so its rows come out M' = M diag(lambda) (each Khatri-Rao column scaled by
// lambda[c]), and the next solve U_next = M V^-1 = M' W takes W = diag(1 / lambda) V^-1. Here:
// lambda into lam_modes[mode] (for the next solve's <U, M> and the factor's scaling,
// scale_columns), the Gram of the normalised factor U'^T U' / (lambda lambda^T) into
// grams[mode], and W of mode `next` into `vinv` (V^-1 of `next` as gram_inverse makes it, rows
// divided by lambda). Dynamic shared memory and `work` as in gram_inverse. With norm_x >= 0
// (an iteration's last mode, its normalisation deferred into the next iteration's first
// MTTKRP) also lambda into `lam` (the iteration's lambda) and the fit into `fit`, as
// normalize_factor does.
extern "C" __global__ void deferred_normalize(const int mode, const int next,
                                              const int first_iteration,
                                              const double* __restrict__ total,
                                              double* __restrict__ lam_modes, double* grams,
                                              double* work, VALUE_T* __restrict__ vinv,
                                              int* status, const double norm_x,
                                              double* __restrict__ lam, double* __restrict__ fit)
{
    extern __shared__ double shared_work[];
    __shared__ double s_lam[RANK];
    __shared__ double scratch[32];
    lambda_and_gram(total, first_iteration, s_lam, lam_modes + (long long)mode * RANK,
                    grams + (long long)mode * PRODUCTS);
    __syncthreads();  // the new Gram is visible to the whole block before the inversion reads it
    if (norm_x >= 0.0) {
        for (int c = threadIdx.x; c < RANK; c += blockDim.x) lam[c] = s_lam[c];
        model_fit(total, s_lam, grams, status, norm_x, fit, scratch);  // status before it moves
        __syncthreads();  // thread 0 has read status before the inversion's may write it
    }
    invert_hadamard(next, grams, work != nullptr ? work : shared_work, vinv, status, s_lam);
}

// U[i, c] /= lambda[c] over the n_rows rows of a factor (the whole factor, gathered), lambda
// rounded to VALUE_T first as normalize_factor does: the deferred normalisation's last step.
extern "C" __global__ void scale_columns(const INDEX_T n_rows, VALUE_T* __restrict__ u_rows,
                                         const double* __restrict__ lam)
{
    __shared__ double s_lam[RANK];
    for (int c = threadIdx.x; c < RANK; c += blockDim.x) s_lam[c] = lam[c];
    __syncthreads();
    divide_columns(n_rows, u_rows, s_lam, (long long)blockIdx.x * blockDim.x + threadIdx.x,
                   (long long)gridDim.x * blockDim.x);
}

// ---------------------------------------------------------------------------------------------
// The solve and this rank's column products, one pass.

// Block b takes rows [b * rows_per_block, ...) of this rank's n_rows, a tile of TILE_ROWS rows
// at a time: U[i, :] = M[i, :] V^-1 (one thread per output entry; V^-1 in shared memory where it
// is small), kept in shared memory as well, then those rows of M zeroed (the 'fast' MTTKRP adds
// into zeros, so no memset is needed before the next mode). The tile's column products are read
// from shared memory by register tiles: each thread holds a PAIR x PAIR block of U^T U over one
// of ROW_GROUPS interleaved groups of the rows, and one column's max |U| over one of MAX_GROUPS
// groups, kept in registers across the block's tiles; at the block's end the groups are added
// (maximised) in group order into this block's partial[b] (U^T U, <U, M>, max |U|, fp64). One
// product per thread summed over all the tile's rows in turn made a chain of ~240 dependent
// steps per thread and left half the threads idle: that, and the last block's serial reduction,
// made this launch latency-bound (Nsight Compute, stop 56: 18-28 us, 25 % occupancy, 0.38
// instructions issued per cycle; docs/scaling/stop56_x2/solve_probe.py times the pieces).
// The last block to finish (counted in blocks_done, which it resets for the next launch) reduces
// the partials into `total` (TOTAL_WIDTH): REDUCE_WARPS warps take the blocks in turn and their
// lanes the columns, then the warps' sums are added in warp order, so the result is the same on
// every launch of the same grid. n_rows = 0 (a rank without rows of this mode): one block,
// total = zeros. With `m_early` (may be null) M is the sum of two buffers, `m_rows` and
// `m_early` (the 'fast' MTTKRP's two parts, one before the exchange of a factor and one after
// it, written by launches that may overlap): each tile adds m_early into m_rows first and zeroes
// it. With `m_scale` (RANK doubles, may be null) the rows of M are M diag(m_scale)
// (the MTTKRP read a factor left unnormalised, deferred_normalize) and <U, M> is taken of M
// itself; `vinv` then is W, which gives U from them directly.
// Launched with SOLVE_THREADS threads per block. M and U are read and written
// here, so they are not __restrict__. TILE_DOUBLES and VINV_SHARED can be set with -D (the probe
// compares them; 4096 doubles let 15 warps add up the partials at R = 16, 2048 only 7: 5-9 us
// slower).
#ifndef SOLVE_THREADS
#define SOLVE_THREADS 512
#endif
#ifndef TILE_DOUBLES
#define TILE_DOUBLES 4096
#endif
#define TILE_ROWS (TILE_DOUBLES / RANK > 0 ? TILE_DOUBLES / RANK : 1)
#define PAIR (RANK % 2 == 0 ? 2 : 1)
#define PAIRS (RANK / PAIR)
#define PAIR_TILES (PAIRS * PAIRS)
// Every thread holds at most one register tile of the products (else each pass loops over tiles
// and adds into the block's partial in global memory: ranks above 44).
#define TILES_IN_REGISTERS (PAIR_TILES <= SOLVE_THREADS)
#define ROW_GROUPS (TILES_IN_REGISTERS ? SOLVE_THREADS / PAIR_TILES : 1)
#define MAXIMA_IN_REGISTERS (RANK <= SOLVE_THREADS)
#define MAX_GROUPS (MAXIMA_IN_REGISTERS ? SOLVE_THREADS / RANK : 1)
#ifndef VINV_SHARED
#define VINV_SHARED (RANK <= 32)
#endif
// The last block's warps that add up the partials (each warp's sums need TOTAL_WIDTH doubles of
// the tile), and the columns of a partial row per lane.
#define REDUCE_WARPS (TILE_DOUBLES / TOTAL_WIDTH < SOLVE_THREADS / 32 ? TILE_DOUBLES / TOTAL_WIDTH \
                                                                  : SOLVE_THREADS / 32)
#define LANE_COLUMNS ((TOTAL_WIDTH + 31) / 32)
static_assert(SOLVE_THREADS % 32 == 0 && SOLVE_THREADS <= 1024, "SOLVE_THREADS: warps, <= 1024");
static_assert(!TILES_IN_REGISTERS || ROW_GROUPS * PRODUCTS <= TILE_DOUBLES,
              "the row groups' products are added up in the tile's shared memory");
static_assert(!MAXIMA_IN_REGISTERS || MAX_GROUPS * RANK <= TILE_DOUBLES,
              "the row groups' maxima are combined in the tile's shared memory");
extern "C" __global__ __launch_bounds__(SOLVE_THREADS) void solve_rows(
    const INDEX_T n_rows, const INDEX_T rows_per_block, VALUE_T* m_rows,
    const VALUE_T* __restrict__ vinv, VALUE_T* u_rows, double* partial,
    unsigned int* blocks_done, double* total, VALUE_T* __restrict__ m_early,
    const double* __restrict__ m_scale)
{
    __shared__ double scratch[32];
    __shared__ double tile[TILE_DOUBLES];
    __shared__ bool last_block;
#if VINV_SHARED
    __shared__ VALUE_T v_inverse[PRODUCTS];
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) v_inverse[p] = vinv[p];
    __syncthreads();
#else
    const VALUE_T* v_inverse = vinv;
#endif
    const long long first = (long long)blockIdx.x * rows_per_block;
    const long long last = max(first, min(first + (long long)rows_per_block, (long long)n_rows));
    double* mine = partial + (long long)blockIdx.x * TOTAL_WIDTH;
    double inner = 0.0;
#if TILES_IN_REGISTERS
    // This thread's register tile: products (pa + x, pb + y) over the tile rows group,
    // group + ROW_GROUPS, ...
    const int pair_tile = threadIdx.x % PAIR_TILES, group = threadIdx.x / PAIR_TILES;
    const int pa = (pair_tile / PAIRS) * PAIR, pb = (pair_tile % PAIRS) * PAIR;
    const bool grouped = group < ROW_GROUPS;
    double products[PAIR][PAIR];
#pragma unroll
    for (int x = 0; x < PAIR; ++x)
#pragma unroll
        for (int y = 0; y < PAIR; ++y) products[x][y] = 0.0;
#endif
#if MAXIMA_IN_REGISTERS
    const int max_column = threadIdx.x % RANK, max_group = threadIdx.x / RANK;
    double largest = 0.0;
#endif
    for (long long tile_first = first; tile_first < last || tile_first == first;
         tile_first += TILE_ROWS) {
        const long long tile_last = min(tile_first + (long long)TILE_ROWS, last);
        const long long begin = tile_first * RANK, end = max(begin, tile_last * RANK);
        if (m_early != nullptr) {  // uniform over the launch
            for (long long id = begin + threadIdx.x; id < end; id += blockDim.x) {
                m_rows[id] += m_early[id];
                m_early[id] = (VALUE_T)0;
            }
            __syncthreads();  // the tile's rows of M are whole before any thread reads them
        }
        for (long long id = begin + threadIdx.x; id < end; id += blockDim.x) {
            const long long row = id / RANK;
            const int c = (int)(id - row * RANK);
            const VALUE_T* m = m_rows + row * RANK;
            VALUE_T sum = 0;
#pragma unroll 16
            for (int k = 0; k < RANK; ++k) sum += m[k] * v_inverse[k * RANK + c];
            u_rows[id] = sum;
            tile[id - begin] = (double)sum;
            // <U, M>: M' = M diag(m_scale) where the MTTKRP read a factor unnormalised
            inner += m_scale != nullptr ? (double)sum * (double)m[c] / m_scale[c]
                                        : (double)sum * (double)m[c];
        }
        __syncthreads();  // the tile's rows of M are read and its rows of U in shared memory
        for (long long id = begin + threadIdx.x; id < end; id += blockDim.x)
            m_rows[id] = (VALUE_T)0;
        const int rows = (int)(tile_last - tile_first);
#if TILES_IN_REGISTERS
        if (grouped) {
            for (int i = group; i < rows; i += ROW_GROUPS) {
                double a[PAIR], b[PAIR];
#pragma unroll
                for (int x = 0; x < PAIR; ++x) {
                    a[x] = tile[i * RANK + pa + x];
                    b[x] = tile[i * RANK + pb + x];
                }
#pragma unroll
                for (int x = 0; x < PAIR; ++x)
#pragma unroll
                    for (int y = 0; y < PAIR; ++y) products[x][y] += a[x] * b[y];
            }
        }
#else
        for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
            const int ca = p / RANK, cb = p - ca * RANK;
            double sum = 0.0;
#pragma unroll 4
            for (int i = 0; i < rows; ++i) sum += tile[i * RANK + ca] * tile[i * RANK + cb];
            mine[p] = tile_first == first ? sum : mine[p] + sum;  // the first tile writes
        }
#endif
#if MAXIMA_IN_REGISTERS
        if (max_group < MAX_GROUPS)
            for (int i = max_group; i < rows; i += MAX_GROUPS)
                largest = fmax(largest, fabs(tile[i * RANK + max_column]));
#else
        for (int c = threadIdx.x; c < RANK; c += blockDim.x) {
            double column = 0.0;
            for (int i = 0; i < rows; ++i) column = fmax(column, fabs(tile[i * RANK + c]));
            mine[SUM_WIDTH + c] = tile_first == first ? column : fmax(mine[SUM_WIDTH + c], column);
        }
#endif
        __syncthreads();  // the tile is read before the next one overwrites it
        if (tile_last >= last) break;
    }
    // The row groups combined in group order, through the tile's shared memory (free now).
#if TILES_IN_REGISTERS
    if (grouped)
#pragma unroll
        for (int x = 0; x < PAIR; ++x)
#pragma unroll
            for (int y = 0; y < PAIR; ++y)
                tile[group * PRODUCTS + (pa + x) * RANK + pb + y] = products[x][y];
    __syncthreads();
    for (int p = threadIdx.x; p < PRODUCTS; p += blockDim.x) {
        double sum = 0.0;
        for (int g = 0; g < ROW_GROUPS; ++g) sum += tile[g * PRODUCTS + p];
        mine[p] = sum;
    }
    __syncthreads();  // read before the maxima overwrite it
#endif
#if MAXIMA_IN_REGISTERS
    if (max_group < MAX_GROUPS) tile[max_group * RANK + max_column] = largest;
    __syncthreads();
    for (int c = threadIdx.x; c < RANK; c += blockDim.x) {
        double column = 0.0;
        for (int g = 0; g < MAX_GROUPS; ++g) column = fmax(column, tile[g * RANK + c]);
        mine[SUM_WIDTH + c] = column;
    }
#endif
    inner = block_sum(inner, scratch);
    if (threadIdx.x == 0) mine[PRODUCTS] = inner;
    __threadfence();  // every thread's partials are visible device-wide before the block counts
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last_block) return;  // uniform over the block
#if REDUCE_WARPS >= 2
    // Warps take the blocks' partials in turn, lanes their columns (coalesced: a lane per column
    // read the columns 32 blocks apart, one sector a lane, and took 20 us); the warps' sums are
    // added up in warp order through the tile's shared memory (free again).
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < REDUCE_WARPS) {
        double acc[LANE_COLUMNS];
#pragma unroll
        for (int x = 0; x < LANE_COLUMNS; ++x) acc[x] = 0.0;
#pragma unroll 2
        for (unsigned int blk = warp; blk < gridDim.x; blk += REDUCE_WARPS) {
            const double* slot = partial + (long long)blk * TOTAL_WIDTH;
#pragma unroll
            for (int x = 0; x < LANE_COLUMNS; ++x) {
                const int j = lane + 32 * x;
                if (j < TOTAL_WIDTH) {
                    const double v = __ldcg(slot + j);  // L2: other blocks' partials
                    acc[x] = j >= SUM_WIDTH ? fmax(acc[x], v) : acc[x] + v;
                }
            }
        }
#pragma unroll
        for (int x = 0; x < LANE_COLUMNS; ++x)
            if (lane + 32 * x < TOTAL_WIDTH) tile[warp * TOTAL_WIDTH + lane + 32 * x] = acc[x];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < TOTAL_WIDTH; j += blockDim.x) {
        double acc = 0.0;
        for (int w = 0; w < REDUCE_WARPS; ++w) {
            const double v = tile[w * TOTAL_WIDTH + j];
            acc = j >= SUM_WIDTH ? fmax(acc, v) : acc + v;
        }
        total[j] = acc;
    }
#else
    // Ranks whose partial row does not fit the tile twice: a thread per column, over the blocks.
    for (int j = threadIdx.x; j < TOTAL_WIDTH; j += blockDim.x) {
        double acc = 0.0;
#pragma unroll 8
        for (unsigned int blk = 0; blk < gridDim.x; ++blk) {
            const double v = __ldcg(partial + (long long)blk * TOTAL_WIDTH + j);
            acc = j >= SUM_WIDTH ? fmax(acc, v) : acc + v;
        }
        total[j] = acc;
    }
#endif
    if (threadIdx.x == 0) *blocks_done = 0;
}

// ---------------------------------------------------------------------------------------------
// lambda, normalisation, Gram and fit: one launch.

// From `total` summed and maximised over the ranks: every block computes lambda (first
// iteration: the column 2-norms sqrt(diag(U^T U)); later max(max_i |U[i, c]|, 1)). Blocks 1..
// divide the n_rows rows of U (the whole factor, gathered) by lambda (rounded to VALUE_T first,
// as on the host). Block 0
// stores lambda and the Gram of the scaled factor, U^T U / (lambda lambda^T), into grams[mode];
// with norm_x >= 0 (after the last mode) the fit (model_fit; the engine issues the next mode's
// inversion after this launch). blockDim.x a multiple of 32; grid = 1 + the blocks that scale.
extern "C" __global__ void normalize_factor(const int mode, const int first_iteration,
                                            const INDEX_T n_rows, VALUE_T* __restrict__ u_rows,
                                            const double* __restrict__ total,
                                            double* __restrict__ lam, double* grams,
                                            const int* __restrict__ status, const double norm_x,
                                            double* __restrict__ fit)
{
    __shared__ double scratch[32];
    __shared__ double s_lam[RANK];
    if (blockIdx.x > 0) {
        for (int c = threadIdx.x; c < RANK; c += blockDim.x)
            s_lam[c] = column_lambda(total, c, first_iteration);
        __syncthreads();
        divide_columns(n_rows, u_rows, s_lam,
                       (long long)(blockIdx.x - 1) * blockDim.x + threadIdx.x,
                       (long long)(gridDim.x - 1) * blockDim.x);
        return;
    }
    lambda_and_gram(total, first_iteration, s_lam, lam, grams + (long long)mode * PRODUCTS);
    __syncthreads();  // the new Gram is visible to the whole block
    if (norm_x >= 0.0) model_fit(total, s_lam, grams, status, norm_x, fit, scratch);
}
