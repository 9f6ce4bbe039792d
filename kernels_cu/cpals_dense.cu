// The small dense steps of one CP-ALS mode update, on the device so that an iteration never waits
// for the host (app/ops/cpals/gpu.py): the R x R solve, the factor solve, the Gram and column
// maxima of a factor, lambda and the normalised Gram, column scaling, <U, M> and the fit.
//
// Layout: factors and MTTKRP rows are row-major (rows x RANK, VALUE_T). Every mode's Gram is
// RANK x RANK fp64, stored one after another (`grams`: ORDER x RANK x RANK). lambda is fp64.
// Grams, lambda, <X, M> and the fit are fp64 whatever VALUE_T is, as on the host.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T  float | double       factor and MTTKRP type
//   INDEX_T  int | long long      row counts
//   ORDER    tensor order N >= 2
//   RANK     CP rank R, 1..1024

#include "hisparse_common.cuh"
#include "cpals_common.cuh"

// Sum of one value per thread over the block (blockDim.x a multiple of 32), valid in thread 0.
// The order is fixed for a fixed blockDim.x, so the sum is the same on every call and every
// rank. `scratch`: 32 doubles of shared memory; every thread must call it.
__device__ __forceinline__ double block_sum(double value, double* scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    value = warp_sum_down(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = 0.0;
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0;
        value = warp_sum_down(value);
    }
    __syncthreads();  // scratch may be reused by the next call
    return value;
}

// ---------------------------------------------------------------------------------------------
// The solve U_n = M V^-1 with V = *_{m != n} G_m.

// V = the Hadamard product of every Gram but `skip`, inverted in place by Gauss-Jordan
// elimination without pivoting and written to `vinv` (RANK x RANK, VALUE_T). V is symmetric
// positive definite (a Hadamard product of Grams of full-rank factors), so its pivots are
// positive Schur complements and need no exchange. One block; blockDim.x a multiple of 32.
// The matrix lives in dynamic shared memory ((RANK * RANK + RANK) doubles) when `work` is null,
// else in `work` (global, same size) for ranks whose matrix does not fit. A pivot that is not
// positive (V singular: the factors lost rank) sets status[0] = skip + 1 for the host to name
// the mode; the CPU backend uses a pseudo-inverse there instead.
extern "C" __global__ void gram_inverse(const int skip, const double* __restrict__ grams,
                                        double* work, VALUE_T* __restrict__ vinv,
                                        int* __restrict__ status)
{
    extern __shared__ double shared_work[];
    double* a = work != nullptr ? work : shared_work;
    double* factor = a + RANK * RANK;  // column k of the other rows: their elimination factors
    __shared__ double pivot;
    for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) {
        double v = 1.0;
        for (int m = 0; m < ORDER; ++m)
            if (m != skip) v *= grams[(long long)m * RANK * RANK + p];
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
        for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) {
            const int i = p / RANK, j = p - i * RANK;
            if (i != k) a[p] = (j == k ? 0.0 : a[p]) - factor[i] * a[k * RANK + j];
        }
        __syncthreads();
    }
    for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) vinv[p] = (VALUE_T)a[p];
}

// U[i, :] = M[i, :] * vinv for rows i < n_rows (vinv: RANK x RANK, row-major). One thread per
// output entry.
extern "C" __global__ void factor_solve(const INDEX_T n_rows, const VALUE_T* __restrict__ m_rows,
                                        const VALUE_T* __restrict__ vinv,
                                        VALUE_T* __restrict__ u_rows)
{
    const long long id = global_thread_id();
    if (id >= (long long)n_rows * RANK) return;
    const long long row = id / RANK;
    const int c = (int)(id - row * RANK);
    const VALUE_T* m = m_rows + row * RANK;
    VALUE_T sum = 0;
    for (int k = 0; k < RANK; ++k) sum += m[k] * vinv[k * RANK + c];
    u_rows[id] = sum;
}

// ---------------------------------------------------------------------------------------------
// Gram, lambda and normalisation of an updated factor.

// Per-block partials of A^T B (RANK x RANK, fp64) and of max_i |A[i, c]| (RANK) over rows
// [blockIdx.x * rows_per_block, ...). partial has gridDim.x rows of RANK*RANK + RANK doubles.
// Accumulated in fp64 whatever VALUE_T is (the fit is computed from these).
extern "C" __global__ void column_products(const INDEX_T n_rows, const INDEX_T rows_per_block,
                                           const VALUE_T* __restrict__ a,
                                           const VALUE_T* __restrict__ b,
                                           double* __restrict__ partial)
{
    const INDEX_T first = (INDEX_T)blockIdx.x * rows_per_block;
    const INDEX_T last = min(first + rows_per_block, n_rows);
    double* mine = partial + (long long)blockIdx.x * (RANK * RANK + RANK);
    for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) {
        const int ca = p / RANK, cb = p - ca * RANK;
        double sum = 0.0, largest = 0.0;
        for (INDEX_T i = first; i < last; ++i) {
            const double va = (double)a[(long long)i * RANK + ca];
            sum += va * (double)b[(long long)i * RANK + cb];
            if (cb == 0) largest = fmax(largest, fabs(va));
        }
        mine[p] = sum;
        if (cb == 0) mine[RANK * RANK + ca] = largest;
    }
}

// Sum (first RANK*RANK entries) or max (last RANK) of the partials over blocks, in block order
// so the result is deterministic.
extern "C" __global__ void reduce_partials(const int n_blocks, const double* __restrict__ partial,
                                           double* __restrict__ total)
{
    const int width = RANK * RANK + RANK;
    const int j = (int)global_thread_id();
    if (j >= width) return;
    double acc = 0.0;
    if (j < RANK * RANK) {
        for (int blk = 0; blk < n_blocks; ++blk) acc += partial[(long long)blk * width + j];
    } else {
        for (int blk = 0; blk < n_blocks; ++blk)
            acc = fmax(acc, partial[(long long)blk * width + j]);
    }
    total[j] = acc;
}

// From the products P = U^T U and column maxima of the unscaled factor (`total`, as
// reduce_partials leaves them): lambda (first iteration: the column 2-norms; later
// max(max_i |U[i, c]|, 1)) and the Gram of the scaled factor, P / (lambda lambda^T). One block.
extern "C" __global__ void normalize_gram(const int first_iteration,
                                          const double* __restrict__ total,
                                          double* __restrict__ lam, double* __restrict__ gram)
{
    for (int c = threadIdx.x; c < RANK; c += blockDim.x)
        lam[c] = first_iteration ? sqrt(total[c * RANK + c]) : fmax(total[RANK * RANK + c], 1.0);
    __syncthreads();
    for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) {
        const int a = p / RANK, b = p - a * RANK;
        gram[p] = total[p] / (lam[a] * lam[b]);
    }
}

// U[i, c] /= lam[c] (column normalisation; lambda rounded to VALUE_T first, as on the host).
extern "C" __global__ void scale_columns(const INDEX_T n_rows, VALUE_T* __restrict__ u,
                                         const double* __restrict__ lam)
{
    const long long id = global_thread_id();
    if (id >= (long long)n_rows * RANK) return;
    u[id] = u[id] / (VALUE_T)lam[id % RANK];
}

// ---------------------------------------------------------------------------------------------
// The fit.

// total[0] = sum_i a[i] * b[i] over `count` entries, in fp64 (<U_N, M_N> of this rank's rows).
// Each block sums a grid-strided share into partial[blockIdx.x]; the last block to finish
// (counted in blocks_done, which it resets for the next call) adds the partials. The order is
// fixed for a fixed grid, so the result is deterministic. blockDim.x a multiple of 32.
extern "C" __global__ void inner_product(const long long count, const VALUE_T* __restrict__ a,
                                         const VALUE_T* __restrict__ b, double* partial,
                                         unsigned int* blocks_done, double* __restrict__ total)
{
    __shared__ double scratch[32];
    __shared__ bool last_block;
    double sum = 0.0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = global_thread_id(); i < count; i += stride)
        sum += (double)a[i] * (double)b[i];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
        __threadfence();  // the partial is visible before this block is counted
        last_block = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;  // uniform over the block
    sum = 0.0;
    for (unsigned int blk = threadIdx.x; blk < gridDim.x; blk += blockDim.x)
        sum += __ldcg(partial + blk);  // from L2: other blocks wrote them
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        total[0] = sum;
        *blocks_done = 0;
    }
}

// fit[0] = 1 - sqrt(|norm_x^2 + |M|^2 - 2 <X, M>|) / norm_x, with |M|^2 = lam^T (*_m G_m) lam
// and <X, M> = inner[0] (already summed over the ranks). One block, blockDim.x a multiple of 32.
extern "C" __global__ void cp_fit(const double norm_x, const double* __restrict__ lam,
                                  const double* __restrict__ grams,
                                  const double* __restrict__ inner, double* __restrict__ fit)
{
    __shared__ double scratch[32];
    double sum = 0.0;
    for (int p = threadIdx.x; p < RANK * RANK; p += blockDim.x) {
        const int a = p / RANK, b = p - a * RANK;
        double term = lam[a] * lam[b];
        for (int m = 0; m < ORDER; ++m) term *= grams[(long long)m * RANK * RANK + p];
        sum += term;
    }
    const double norm_m2 = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        const double residual = sqrt(fabs(norm_x * norm_x + norm_m2 - 2.0 * inner[0]));
        fit[0] = norm_x > 0.0 ? 1.0 - residual / norm_x : 0.0;
    }
}
