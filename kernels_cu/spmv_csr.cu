// CSR SpMV, y = A x: one group of THREADS_PER_ROW lanes per row ("CSR-vector"; 1 = scalar), and
// the small vector kernels of a distributed product: the ghost block's accumulate variant, the
// packing of x entries for the halo exchange, and the chain's sum of squares and scaling.
//
// Compile-time parameters (nvcc -D...):
//   VALUE_T          float | double
//   INDEX_T          int | long long
//   THREADS_PER_ROW  1, 2, 4, 8, 16 or 32 (a power of two dividing the warp)
//   UNIFORM_VALUES   defined when every stored value of A, local and ghost blocks, is the same
//                    (a graph's adjacency matrix): spmv_csr_vector's data is then that one
//                    value, data[0], multiplied once into each row's sum of gathered x entries
//                    (as in spmv_csr5.cu)
//
// Lanes of a group read consecutive entries of their row, so loads of indices/data coalesce
// when rows are long; the group reduces with warp shuffles. No atomics: each y entry is written
// by exactly one lane, and the reductions sum in a fixed order, so results are bitwise
// reproducible.

#include "hisparse_common.cuh"
#ifndef THREADS_PER_ROW
#define THREADS_PER_ROW 4
#endif

static_assert((THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0 && THREADS_PER_ROW <= 32,
              "THREADS_PER_ROW must be a power of two <= 32");

// CSR-vector product of rows [0, n_rows): row r's group of lanes sums data[j] * x[indices[j]]
// (lane-strided, then reduced into the group's first lane), which stores y[r] = sum, or, given a
// row list (rows != nullptr), adds y[rows[r]] += sum: the compressed ghost block of a distributed
// product (only the rows that have ghost entries; rows[] distinct), launched after the local
// block's product on the same stream, so each listed row is updated by one lane and needs no
// atomics. Rows past the end keep their lanes alive (no early return) so that the full-warp
// shuffle masks stay valid.
extern "C" __global__ void spmv_csr_vector(const INDEX_T n_rows,
                                           const INDEX_T* __restrict__ rows,
                                           const INDEX_T* __restrict__ indptr,
                                           const INDEX_T* __restrict__ indices,
                                           const VALUE_T* __restrict__ data,
                                           const VALUE_T* __restrict__ x,
                                           VALUE_T* __restrict__ y)
{
    const long long row = global_thread_id() / THREADS_PER_ROW;
    const int lane = threadIdx.x & (THREADS_PER_ROW - 1);
    const bool active = row < (long long)n_rows;
    VALUE_T sum = 0;
    if (active) {
        const INDEX_T end = indptr[row + 1];
        for (INDEX_T j = indptr[row] + lane; j < end; j += THREADS_PER_ROW) {
#ifdef UNIFORM_VALUES
            sum += __ldg(&x[indices[j]]);
#else
            sum += data[j] * __ldg(&x[indices[j]]);
#endif
        }
    }
    sum = group_sum_down<THREADS_PER_ROW>(sum);
#ifdef UNIFORM_VALUES
    sum *= data[0];
#endif
    if (active && lane == 0) {
        if (rows == nullptr) {
            y[row] = sum;
        } else {
            y[rows[row]] += sum;
        }
    }
}

// dest[i] = source[index[i]]: the entries of x the peers need, packed for the halo exchange.
extern "C" __global__ void gather_entries(const long long n,
                                          const INDEX_T* __restrict__ index,
                                          const VALUE_T* __restrict__ source,
                                          VALUE_T* __restrict__ dest)
{
    const long long i = global_thread_id();
    if (i < n) {
        dest[i] = source[index[i]];
    }
}

// hisparse_common.cuh's block_sum over this function's own scratch.
__device__ __forceinline__ VALUE_T block_sum(VALUE_T value)
{
    __shared__ VALUE_T warp_sums[32];
    return block_sum(value, warp_sums);
}

// The chain's step between two products, in one launch: x = y * s with s = 1 / sqrt(norm2[0])
// (s = 0 when norm2 is 0; s = 1 when `scaled` is 0, the first product of a chain), and
// norm2[0] = sum of x[i]^2 over this rank's entries, ready to be all-reduced with the next
// product's halo exchange. Folding the previous norm into this step (instead of scaling x before
// the next product) takes the all-reduce off the path to the next product: y_{k+1} =
// (A y_k) / ||y_k||.
// Each block writes its partial sum of a grid-stride share; the last block to finish (a
// counter, reset by that block for the next launch) sums the partials in block order. The grid
// is fixed for the vector's length and the partials are summed in a fixed order, so the result
// never changes between launches. norm2 is read and written in place: every block reads it
// before it counts itself done, and only the last block writes it, after all have counted.
extern "C" __global__ void scale_sum_squares(const long long n,
                                             const int scaled,
                                             const VALUE_T* __restrict__ y,
                                             VALUE_T* __restrict__ x,
                                             VALUE_T* __restrict__ partial,
                                             unsigned int* __restrict__ blocks_done,
                                             VALUE_T* norm2)
{
    __shared__ bool last_block;
    VALUE_T scale = VALUE_T(1);
    if (scaled) {
        const VALUE_T squared = norm2[0];
        scale = squared > VALUE_T(0) ? VALUE_T(1) / sqrt(squared) : VALUE_T(0);
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    VALUE_T sum = 0;
    for (long long i = global_thread_id(); i < n; i += stride) {
        const VALUE_T value = y[i] * scale;
        x[i] = value;
        sum += value * value;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
        // Make the partial visible device-wide before counting this block as done.
        __threadfence();
        last_block = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) {
        return;
    }
    sum = 0;
    for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        // volatile: read the other blocks' partials from memory, not a stale cache line
        sum += ((volatile VALUE_T*)partial)[b];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        norm2[0] = sum;
        *blocks_done = 0u;
    }
}
