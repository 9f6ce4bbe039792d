// CSR SpMV, y = A x: one group of THREADS_PER_ROW lanes per row ("CSR-vector"; 1 = scalar).
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T          float | double
//   INDEX_T          int | long long
//   THREADS_PER_ROW  1, 2, 4, 8, 16 or 32 (a power of two dividing the warp)
//
// Lanes of a group read consecutive entries of their row, so loads of indices/data coalesce
// when rows are long; the group reduces with warp shuffles. No atomics: each y entry is written
// by exactly one lane, so results are bitwise reproducible.

#include "hisparse_common.cuh"
#ifndef THREADS_PER_ROW
#define THREADS_PER_ROW 4
#endif

static_assert((THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0 && THREADS_PER_ROW <= 32,
              "THREADS_PER_ROW must be a power of two <= 32");

extern "C" __global__ void spmv_csr_vector(const INDEX_T n_rows,
                                           const INDEX_T* __restrict__ indptr,
                                           const INDEX_T* __restrict__ indices,
                                           const VALUE_T* __restrict__ data,
                                           const VALUE_T* __restrict__ x,
                                           VALUE_T* __restrict__ y)
{
    const long long row = global_thread_id() / THREADS_PER_ROW;
    const int lane = threadIdx.x & (THREADS_PER_ROW - 1);
    // Rows past the end keep their lanes alive (no early return) so that the full-warp shuffle
    // masks below stay valid.
    const bool active = row < (long long)n_rows;
    VALUE_T sum = 0;
    if (active) {
        const INDEX_T end = indptr[row + 1];
        for (INDEX_T j = indptr[row] + lane; j < end; j += THREADS_PER_ROW) {
            sum += data[j] * __ldg(&x[indices[j]]);
        }
    }
    sum = group_sum_down<THREADS_PER_ROW>(sum);
    if (active && lane == 0) {
        y[row] = sum;
    }
}
