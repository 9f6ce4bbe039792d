// Array steps on CuPy arrays that CuPy's own routines would make with a scalar operand (app/gpu/
// _raw.py, one CuPy RawModule): CuPy loads cupyx, and with it SciPy's sparse package, at its
// first operation between an array and a scalar and in bincount (0.3-0.45 s of a process's
// set-up on the H200 host), which these kernels do not need.

#include "hisparse_common.cuh"

// Values each thread of count_values takes, consecutive: a run of equal values among them is
// one atomic addition (a generated tensor's coordinate columns hold runs of equal indices, one
// per fiber, and atomic additions to one address serialise).
#define COUNT_ITEMS 16

// counts[v] += the number of v in values (every value in [0, size); counts zeroed before).
extern "C" __global__ void count_values(const long long* __restrict__ values, long long count,
                                        unsigned long long* __restrict__ counts)
{
    const long long first = global_thread_id() * COUNT_ITEMS;
    if (first >= count) return;
    const long long last = first + COUNT_ITEMS < count ? first + COUNT_ITEMS : count;
    long long current = values[first];
    unsigned long long run = 1;
    for (long long i = first + 1; i < last; ++i) {
        const long long value = values[i];
        if (value == current) {
            ++run;
            continue;
        }
        atomicAdd(counts + current, run);
        current = value;
        run = 1;
    }
    atomicAdd(counts + current, run);
}
