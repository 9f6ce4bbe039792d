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

// Sum of `value` over the block, valid in thread 0 (blockDim.x a multiple of 32, at most 1024):
// warp sums, then the first warp sums the warps' results -- a fixed order for a fixed blockDim.x,
// so the same sum on every call and every rank. `scratch`: blockDim.x / 32 values of shared
// memory, one array per concurrent sum; every thread of the block must call it, and a barrier
// must pass before the scratch is written again.
template <typename T>
__device__ __forceinline__ T block_sum(T value, T* scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    value = warp_sum_down(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = T(0);
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? scratch[lane] : T(0);
        value = warp_sum_down(value);
    }
    return value;
}

// Addition as a scan's operator.
struct ScanAdd {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// Inclusive prefix of `value` over aligned groups of `width` lanes (a power of two <= 32) in lane
// order under `op` (associative): lane l of a group ends with op(prefix of lanes < l, its value),
// in log2(width) shuffle-up steps. `lane`: the lane's index in its group. Every lane of the warp
// must call it (FULL_MASK).
template <typename T, typename Op>
__device__ __forceinline__ T warp_inclusive_scan(T value, int lane, Op op, int width = 32)
{
#pragma unroll
    for (int d = 1; d < width; d <<= 1) {
        const T other = __shfl_up_sync(FULL_MASK, value, d, width);
        if (lane >= d) value = op(other, value);
    }
    return value;
}

template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T value, int lane, int width = 32)
{
    return warp_inclusive_scan(value, lane, ScanAdd(), width);
}
