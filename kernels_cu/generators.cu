// The random generators' steps on the GPU (app/generators.py; loaded by app/gpu/_generate.py as
// one CuPy RawModule): the keyed permutation (a Feistel network with cycle walking) and the
// random tensor's fibers (TensorSource), the same bits as the NumPy code they mirror.
//
// Every random number is a counter-based hash (SplitMix64's finaliser) of a stream key and a
// counter, in wrapping 64-bit integer arithmetic, and the few floating-point steps are written
// with round-to-nearest intrinsics (__dmul_rn, __dadd_rn) so that no multiply-add is contracted:
// NumPy rounds each operation on its own, and so must this code.
//
// A random tensor's fibers are made in five launches over one step of fiber ids (the host
// steps through them): the draws of each fiber (fiber_draws), the (fiber, index) key of every
// draw (draw_keys; the host sorts them), the first of each run of equal keys (first_of_runs; the
// host scans the flags), the coordinates of every fiber (fiber_coordinates) and the nonzeros
// (emit_nonzeros: one per distinct key, indices row-major by nonzero, values).
//
// R-MAT (generators.rmat_edges_on_device, generators.RmatRowsOnDevice): one thread per edge
// jumps its block's PCG64 stream to the edge's draws (rmat_edge), and either writes the edge
// (rmat_edges, PyCUDA) or its unit-matrix key (rmat_edge_keys); the sorted keys' first of each
// run (first_of_runs, a scan) become the matrix's entries (unit_entries).

#include "hisparse_common.cuh"

typedef unsigned long long u64;
typedef long long i64;

__device__ __forceinline__ u64 mix64(u64 x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// generators._hash: the hash of (key, first).
__device__ __forceinline__ u64 hash_first(u64 key, u64 first)
{
    return mix64((first * 0x9E3779B97F4A7C15ULL) ^ key);
}

// generators._hash_more: a second counter folded into a premixed hash.
__device__ __forceinline__ u64 hash_more(u64 premixed, u64 second)
{
    return mix64(premixed + second * 0xD1B54A32D192ED03ULL);
}

// generators._unit_float: uniform in [0, 1) from the top 53 bits (exact).
__device__ __forceinline__ double unit_float(u64 bits)
{
    return __dmul_rn((double)(bits >> 11), 1.0 / 9007199254740992.0);
}

// generators.keyed_permutation's network on one id, walked until it lands in [0, limit).
__device__ __forceinline__ u64 feistel_walk(u64 v, u64 limit, u64 shift, u64 low,
                                            const u64* __restrict__ keys, int rounds)
{
    do {
        u64 left = v >> shift, right = v & low;
        for (int r = 0; r < rounds; ++r) {
            const u64 next = left ^ (mix64(right ^ keys[r]) & low);
            left = right;
            right = next;
        }
        v = (left << shift) | right;
    } while (v >= limit);
    return v;
}

extern "C" __global__ void keyed_permutation(const u64* __restrict__ values, i64 count, u64 limit,
                                             u64 shift, u64 low, const u64* __restrict__ keys,
                                             int rounds, u64* __restrict__ out)
{
    for (i64 i = global_thread_id(); i < count; i += (i64)gridDim.x * blockDim.x)
        out[i] = feistel_walk(values[i], limit, shift, low, keys, rounds);
}

// Draws of each fiber (TensorSource._lengths, then _step's extra draws): a lognormal weight read
// from the quantile table, scaled to the wanted total, rounded up or down at random, clipped to
// [1, size]; then a few more draws so that about that many distinct indices remain.
extern "C" __global__ void fiber_draws(const u64* __restrict__ ids, i64 count,
                                       const double* __restrict__ table,
                                       const double* __restrict__ steps, int table_bits,
                                       double scale, u64 length_key, u64 rounding_key,
                                       u64 extra_key, i64 size, i64* __restrict__ draws)
{
    for (i64 i = global_thread_id(); i < count; i += (i64)gridDim.x * blockDim.x) {
        const u64 id = ids[i];
        const u64 bits = hash_first(length_key, id);
        const i64 slot = (i64)(bits >> (64 - table_bits));
        const double fraction = unit_float(bits << table_bits);
        const double weight = __dadd_rn(table[slot], __dmul_rn(fraction, steps[slot]));
        const double share = __dmul_rn(weight, scale);
        double rounded = floor(__dadd_rn(share, unit_float(hash_first(rounding_key, id))));
        rounded = fmin(fmax(rounded, 1.0), (double)size);
        const i64 length = (i64)rounded;
        const u64 capped = (u64)(length < (1LL << 31) ? length : (1LL << 31));
        const u64 twice = 2ULL * (u64)size;
        const u64 spare = hash_first(extra_key, id) % twice;
        draws[i] = length + (i64)((capped * (capped - 1ULL) + spare) / twice);
    }
}

// The key (fiber position in the step) * size + index of every draw; ends: the inclusive sums
// of the draws. One thread a draw, its fiber found by binary search (fibers are of any length).
extern "C" __global__ void draw_keys(const u64* __restrict__ ids, const i64* __restrict__ ends,
                                     i64 count, i64 total, u64 index_key, i64 size,
                                     i64* __restrict__ keys)
{
    for (i64 j = global_thread_id(); j < total; j += (i64)gridDim.x * blockDim.x) {
        i64 low = 0, high = count - 1;  // the first fiber whose end is past j
        while (low < high) {
            const i64 middle = low + ((high - low) >> 1);
            if (ends[middle] > j) high = middle; else low = middle + 1;
        }
        const u64 counter = (u64)(j - (low ? ends[low - 1] : 0));
        const u64 index = hash_more(hash_first(index_key, ids[low]), counter) % (u64)size;
        keys[j] = low * size + (i64)index;
    }
}

// 1 where a sorted key differs from the one before it (the first of its run), else 0.
extern "C" __global__ void first_of_runs(const i64* __restrict__ keys, i64 total,
                                         i64* __restrict__ flags)
{
    for (i64 j = global_thread_id(); j < total; j += (i64)gridDim.x * blockDim.x)
        flags[j] = (j == 0 || keys[j] != keys[j - 1]) ? 1 : 0;
}

// TensorSource.fiber_coordinates: the keyed permutation of each fiber's id over the fiber space,
// written in the modes other than `mode` (the last mode varying fastest), 0 in `mode`.
extern "C" __global__ void fiber_coordinates(const u64* __restrict__ ids, i64 count, u64 limit,
                                             u64 shift, u64 low, const u64* __restrict__ keys,
                                             int rounds, const i64* __restrict__ extents,
                                             int order, int mode,
                                             i64* __restrict__ coordinates)
{
    for (i64 i = global_thread_id(); i < count; i += (i64)gridDim.x * blockDim.x) {
        u64 linear = feistel_walk(ids[i], limit, shift, low, keys, rounds);
        for (int m = order - 1; m >= 0; --m) {
            if (m == mode) {
                coordinates[i * order + m] = 0;
                continue;
            }
            const u64 extent = (u64)extents[m];
            coordinates[i * order + m] = (i64)(linear % extent);
            linear /= extent;
        }
    }
}

// One nonzero per distinct sorted key: positions are the inclusive sums of the flags, so the
// first of a run goes to positions - 1. Its coordinates are its fiber's with the index in
// `mode`; its value a hash of (fiber id, index).
extern "C" __global__ void emit_nonzeros(const i64* __restrict__ keys,
                                         const i64* __restrict__ flags,
                                         const i64* __restrict__ positions, i64 total,
                                         const u64* __restrict__ ids,
                                         const i64* __restrict__ coordinates, int order, int mode,
                                         i64 size, u64 value_key, i64* __restrict__ indices,
                                         double* __restrict__ values)
{
    for (i64 j = global_thread_id(); j < total; j += (i64)gridDim.x * blockDim.x) {
        if (!flags[j]) continue;
        const i64 out = positions[j] - 1, key = keys[j];
        const i64 fiber = key / size, index = key % size;
        for (int m = 0; m < order; ++m)
            indices[out * order + m] = m == mode ? index : coordinates[fiber * order + m];
        values[out] = unit_float(hash_more(hash_first(value_key, ids[fiber]), (u64)index));
    }
}

// ---------------------------------------------------------------------------------------------
// R-MAT edges (generators.rmat_edges_on_device): the host's edges, bit for bit. The host draws
// every block's levels from NumPy's PCG64 seeded by (seed, 0, block), level after level (draw
// l * count + e is level l of edge e); here one thread makes one edge: it jumps its block's
// stream to the edge's first draw (O(log e) squarings, Brown's jump-ahead) and then one level at
// a time by the block's level jump (the table's multiplier and increment, count steps), sets the
// edge's bits as the host does and permutes both ids.

struct u128 {
    u64 high, low;
};

__device__ __forceinline__ u128 add128(u128 a, u128 b)
{
    u128 sum;
    sum.low = a.low + b.low;
    sum.high = a.high + b.high + (sum.low < a.low);
    return sum;
}

// a * b modulo 2^128
__device__ __forceinline__ u128 mul128(u128 a, u128 b)
{
    u128 product;
    product.low = a.low * b.low;
    product.high = __umul64hi(a.low, b.low) + a.low * b.high + a.high * b.low;
    return product;
}

// PCG64's XSL-RR output of a state
__device__ __forceinline__ u64 pcg64_output(u128 state)
{
    const u64 word = state.high ^ state.low;
    const unsigned turn = (unsigned)(state.high >> 58);
    return (word >> turn) | (word << ((64u - turn) & 63u));
}

// table: per block (from the first of this launch) state, increment, level multiplier, level
// increment as (high, low) words (generators.rmat_block_table). Edge i of this launch is edge
// first_edge + i of the graph (first_edge: a block's first); blocks hold block_edges edges.
// thresholds: a, a + b, a + b + c. The edge's permuted (source, destination) into *source_out,
// *target_out.
__device__ __forceinline__ void rmat_edge(const u64* __restrict__ table, i64 first_edge, i64 i,
                                          i64 block_edges, int levels, double low,
                                          double middle, double high, u64 limit, u64 shift,
                                          u64 low_mask, const u64* __restrict__ keys,
                                          int rounds, u64* source_out, u64* target_out)
{
    const u128 multiplier = {0x2360ED051FC65DA4ULL, 0x4385DF649FCCF645ULL};  // PCG64's
    const u128 one = {0ULL, 1ULL};
    const i64 edge = first_edge + i;
    const u64* row = table + (edge / block_edges - first_edge / block_edges) * 8;
    u128 state = {row[0], row[1]};
    const u128 increment = {row[2], row[3]};
    const u128 level_multiplier = {row[4], row[5]}, level_increment = {row[6], row[7]};
    // generators.lcg_jump(e + 1): to the state after the edge's first draw
    u128 jump_multiplier = one, jump_increment = {0ULL, 0ULL};
    u128 step_multiplier = multiplier, step_increment = increment;
    for (u64 steps = (u64)(edge % block_edges) + 1; steps; steps >>= 1) {
        if (steps & 1) {
            jump_multiplier = mul128(jump_multiplier, step_multiplier);
            jump_increment = add128(mul128(jump_increment, step_multiplier), step_increment);
        }
        step_increment = mul128(add128(step_multiplier, one), step_increment);
        step_multiplier = mul128(step_multiplier, step_multiplier);
    }
    state = add128(mul128(jump_multiplier, state), jump_increment);
    u64 source = 0, target = 0;
    for (int level = 0; level < levels; ++level) {
        if (level) state = add128(mul128(level_multiplier, state), level_increment);
        const double r = unit_float(pcg64_output(state));
        source |= (u64)(r >= middle) << level;
        target |= (u64)((r >= low && r < middle) || r >= high) << level;
    }
    *source_out = feistel_walk(source, limit, shift, low_mask, keys, rounds);
    *target_out = feistel_walk(target, limit, shift, low_mask, keys, rounds);
}

extern "C" __global__ void rmat_edges(const u64* __restrict__ table, i64 first_edge, i64 count,
                                      i64 block_edges, int levels, double low, double middle,
                                      double high, u64 limit, u64 shift, u64 low_mask,
                                      const u64* __restrict__ keys, int rounds,
                                      i64* __restrict__ src, i64* __restrict__ dst)
{
    for (i64 i = global_thread_id(); i < count; i += (i64)gridDim.x * blockDim.x) {
        u64 source, target;
        rmat_edge(table, first_edge, i, block_edges, levels, low, middle, high, limit, shift,
                  low_mask, keys, rounds, &source, &target);
        src[i] = (i64)source;
        dst[i] = (i64)target;
    }
}

// The unit matrix's key of each edge, (source << levels) | destination (2**levels vertices, at
// most 32 levels: the key fits in 64 bits), into unit_keys[i]; with `reverse`, the reversed
// edge's key as well, into unit_keys[count + i] (a symmetric R-MAT's, generators.rmat_unit_rows
// on the device: the rows are then sorted keys, and no edge list is made).
extern "C" __global__ void rmat_edge_keys(const u64* __restrict__ table, i64 first_edge,
                                          i64 count, i64 block_edges, int levels, double low,
                                          double middle, double high, u64 limit, u64 shift,
                                          u64 low_mask, const u64* __restrict__ keys,
                                          int rounds, int reverse,
                                          u64* __restrict__ unit_keys)
{
    for (i64 i = global_thread_id(); i < count; i += (i64)gridDim.x * blockDim.x) {
        u64 source, target;
        rmat_edge(table, first_edge, i, block_edges, levels, low, middle, high, limit, shift,
                  low_mask, keys, rounds, &source, &target);
        unit_keys[i] = (source << levels) | target;
        if (reverse) unit_keys[count + i] = (target << levels) | source;
    }
}

// From the sorted keys of a unit matrix ((row << levels) | column) and the inclusive sums of
// their first_of_runs flags (`positions`): each distinct key's column at its place in the rows
// (positions - 1), and each row's first place in row_first (rows without an entry are left as
// they are: the host fills them in).
extern "C" __global__ void unit_entries(const u64* __restrict__ keys,
                                        const i64* __restrict__ positions, i64 total,
                                        int levels, i64* __restrict__ columns,
                                        i64* __restrict__ row_first)
{
    const u64 column_mask = (1ULL << levels) - 1ULL;
    for (i64 j = global_thread_id(); j < total; j += (i64)gridDim.x * blockDim.x) {
        if (j > 0 && positions[j] == positions[j - 1]) continue;  // a repeat of the key before
        const u64 key = keys[j];
        const i64 place = positions[j] - 1;
        columns[place] = (i64)(key & column_mask);
        if (j == 0 || (key >> levels) != (keys[j - 1] >> levels)) row_first[key >> levels] = place;
    }
}
