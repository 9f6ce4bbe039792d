// Helpers every hisparse kernel shares, defined once.
//
// Value and index types are chosen at compile time: the runtime passes -DVALUE_T=float|double and
// -DINDEX_T=int|"long long" (app/gpu/_kernels.py, type_defines); these defaults let each .cu file
// compile on its own (as the CI check with nvcc -cubin -arch=sm_90 does).
#pragma once

#ifndef VALUE_T
#define VALUE_T double
#endif
#ifndef INDEX_T
#define INDEX_T int
#endif

// Every lane of a warp takes part in the shuffle or vote.
#define FULL_MASK 0xffffffffu

// Global thread index, 64-bit: grids over nnz exceed 2^31 threads on large inputs.
__device__ __forceinline__ long long global_thread_id()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// Sum of `value` over aligned groups of WIDTH lanes (a power of two <= 32). ALL_LANES = false:
// the full sum lands in the group's first lane (shuffle down); true: every lane of the group ends
// with it (butterfly). Every lane of the warp must call it (FULL_MASK).
template <int WIDTH, bool ALL_LANES, typename T>
__device__ __forceinline__ T group_sum(T value)
{
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset >>= 1)
        value += ALL_LANES ? __shfl_xor_sync(FULL_MASK, value, offset, WIDTH)
                           : __shfl_down_sync(FULL_MASK, value, offset, WIDTH);
    return value;
}

template <int WIDTH, typename T>
__device__ __forceinline__ T group_sum_down(T value) { return group_sum<WIDTH, false>(value); }
template <int WIDTH, typename T>
__device__ __forceinline__ T group_sum_all(T value) { return group_sum<WIDTH, true>(value); }

// Whole-warp sums.
template <typename T>
__device__ __forceinline__ T warp_sum_down(T value) { return group_sum<32, false>(value); }
template <typename T>
__device__ __forceinline__ T warp_sum_all(T value) { return group_sum<32, true>(value); }

// Flags between blocks of one launch (a block waits for another's progress): a load that sees
// every write the other block made before its release (__threadfence, then the flag), and a
// wait on such a counter. The waited-for block must never wait on the waiter (take work in
// ticket order), or the wait can hang.
__device__ __forceinline__ int load_acquire(const int* p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void wait_until_at_least(const int* counter, int value)
{
    while (load_acquire(counter) < value) __nanosleep(32);
}
