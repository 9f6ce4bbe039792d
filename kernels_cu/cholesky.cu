// Supernodal Cholesky kernels: assembly of A into the supernode panels, the chunked batched
// factorization (one launch pair per chunk level: factor_panels, update_tiles), the scatter-add
// ("modify") of a large supernode's update blocks through relative indices, and the chunked
// level-scheduled triangular solves (solve_forward, solve_backward; the dataflow ones), and the
// residual and update of iterative refinement (residual, add_correction).
//
// Layout (see app/ops/cholesky/symbolic.py): supernode s owns a column-major panel of
// nrows[s] x ncols[s] values at L + panel_off[s]; its first ncols rows are its own columns.
// Its below-diagonal row r (0 <= r < nrows - ncols) updates, in column rows[.] of the target
// supernode owning that row, the entry at  col_base[r] + rel[col_rel[r] + i]  for rows i >= r.
// Offsets into the value array are 64-bit; row indices are INDEX_T.
//
// Chunks (app/ops/cholesky/gpu.py, chunk_plan): a supernode is cut into column chunks of at
// most CHUNK columns; chunk v = (supernode chunk_sup[v], first column chunk_c0[v] inside it,
// width chunk_w[v]). Its "below rows" are the rows of the supernode's row list after the
// chunk's own columns: the supernode's later columns first, then the rows of its ancestors.
// Chunks of one level are independent; a launch covers one level. A level's task list is
// `vlist` (chunk ids) and `prefix` (count + 1 entries: the first block of every task; the
// last entry is the grid size); every block finds its task by binary search.
#include "hisparse_common.cuh"
#ifndef CHUNK
#define CHUNK 64
#endif
// Rows of the below block that one block of factor_panels / the solves handles (its threads).
#define CHUNK_THREADS 256
// Update tiles are TILE x TILE entries of a chunk's lower-triangular update.
#define TILE 32
// Columns of a below row that factor_panels keeps in registers at a time.
#define SOLVE_BLOCK 16
// Right-hand sides solved together by the solve kernels (one warp each in the small solves).
#define RHS_TILE (CHUNK_THREADS / 32)
#define NO_FAILURE 0x7FFFFFFF

// The task (index into the level's vlist) of block `b`: the last task whose first block <= b.
__device__ __forceinline__ int find_task(const long long* __restrict__ prefix, int count,
                                         long long b)
{
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (prefix[mid] <= b) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The chunk of a level launch that block `blockIdx.x` works on (vlist[task], the task found by
// find_task), which of the chunk's `nblocks` blocks it is (`part`).
struct LevelTask {
    int v, part, nblocks;
};

__device__ __forceinline__ LevelTask level_task(int count, const int* __restrict__ vlist,
                                                const long long* __restrict__ prefix)
{
    const int task = find_task(prefix, count, blockIdx.x);
    LevelTask t;
    t.v = vlist[task];
    t.part = (int)(blockIdx.x - prefix[task]);
    t.nblocks = (int)(prefix[task + 1] - prefix[task]);
    return t;
}

// Geometry of chunk v: its diagonal block at L + diag (leading dimension ld), `width` columns,
// `m` below rows, first (permuted) column `first`, and the local index `local0` of its first
// below row in the supernode's row list.
struct Chunk {
    long long diag, first, rows_at;
    int s, ld, width, m, local0, ncols;
};

// The chunk and supernode tables every chunk kernel reads, as one parameter list (the kernels
// and chunk_of take them as __restrict__ arrays, so their loads use the read-only path) and the
// matching arguments: chunk -> its supernode, first column inside it and width; supernode ->
// first permuted column (one entry more), rows of its panel, offset of its panel in L and of
// its row list in rows[]. The engine passes them in this order.
#define CHUNK_TABLE_PARAMS                                                                  \
    const int* __restrict__ chunk_sup, const int* __restrict__ chunk_c0,                    \
        const int* __restrict__ chunk_w, const long long* __restrict__ starts,              \
        const long long* __restrict__ nrows_of, const long long* __restrict__ panel_off,    \
        const long long* __restrict__ rows_off
#define CHUNK_TABLE_ARGS chunk_sup, chunk_c0, chunk_w, starts, nrows_of, panel_off, rows_off

__device__ __forceinline__ Chunk chunk_of(int v, CHUNK_TABLE_PARAMS)
{
    Chunk c;
    c.s = chunk_sup[v];
    const int c0 = chunk_c0[v];
    c.width = chunk_w[v];
    c.ld = (int)nrows_of[c.s];
    c.ncols = (int)(starts[c.s + 1] - starts[c.s]);
    c.diag = panel_off[c.s] + (long long)c0 * c.ld + c0;
    c.first = starts[c.s] + c0;
    c.local0 = c0 + c.width;
    c.m = c.ld - c.local0;
    c.rows_at = rows_off[c.s] + c.local0;
    return c;
}

// Loads a thread keeps in flight before it uses them: global loads in a loop whose next
// iteration waits on the previous one cost a full memory latency each.
#define IN_FLIGHT 8

// Copy the lower triangle of a chunk's diagonal block (global, leading dimension ld) to D.
__device__ __forceinline__ void load_diagonal(VALUE_T (*D)[CHUNK + 1], const VALUE_T* G, int ld,
                                              int width)
{
    const int total = width * width;
    for (int e0 = threadIdx.x; e0 < total; e0 += IN_FLIGHT * blockDim.x) {
        VALUE_T v[IN_FLIGHT];
#pragma unroll
        for (int q = 0; q < IN_FLIGHT; ++q) {
            const int e = e0 + q * blockDim.x;
            const int j = e / width, i = e % width;
            v[q] = e < total && i >= j ? G[i + (long long)j * ld] : (VALUE_T)0;
        }
#pragma unroll
        for (int q = 0; q < IN_FLIGHT; ++q) {
            const int e = e0 + q * blockDim.x;
            const int j = e / width, i = e % width;
            if (e < total && i >= j) D[i][j] = v[q];
        }
    }
}

// One warp solves L11 x = y (forward) in shared memory for one right-hand side `y` (the
// chunk's w <= CHUNK entries), L11 = D with its diagonal's inverses: lanes hold entries lane
// and lane + 32, entry k is final after step k and broadcast by a shuffle.
__device__ __forceinline__ void forward_diagonal(VALUE_T* y, const VALUE_T (*D)[CHUNK + 1],
                                                 const VALUE_T* inverse, int w)
{
    const int lane = threadIdx.x & 31;
    VALUE_T a = lane < w ? y[lane] : (VALUE_T)0;
    VALUE_T b = lane + 32 < w ? y[lane + 32] : (VALUE_T)0;
    for (int k = 0; k < w; ++k) {
        const VALUE_T xk = __shfl_sync(FULL_MASK, k < 32 ? a : b, k & 31) * inverse[k];
        if (lane == k) a = xk;
        else if (lane > k && lane < w) a -= D[lane][k] * xk;
        if (lane + 32 == k) b = xk;
        else if (lane + 32 > k && lane + 32 < w) b -= D[lane + 32][k] * xk;
    }
    if (lane < w) y[lane] = a;
    if (lane + 32 < w) y[lane + 32] = b;
}

// acc[j] += sum over k in [k_first, w) of row[k * ld] * ys[j][k]: a row of the chunk's
// below-diagonal block times the solved tile, 16 loads of the row in flight (k < CHUNK).
// The level and the flow solve kernels both accumulate this way.
__device__ __forceinline__ void add_row_products(VALUE_T (&acc)[RHS_TILE],
                                                 const VALUE_T* row, const long long ld,
                                                 const VALUE_T (*ys)[CHUNK], const int k_first,
                                                 const int w)
{
    for (int k0 = k_first; k0 < w; k0 += 16) {
        VALUE_T l[16];
#pragma unroll
        for (int q = 0; q < 16; ++q)
            l[q] = k0 + q < w ? row[(long long)(k0 + q) * ld] : (VALUE_T)0;
#pragma unroll
        for (int q = 0; q < 16; ++q)
            if (k0 + q < w) {
#pragma unroll
                for (int j = 0; j < RHS_TILE; ++j) acc[j] += l[q] * ys[j][k0 + q];
            }
    }
}

// A block's forward solve of a chunk's diagonal block for right-hand sides r0 .. r0 + tile - 1
// (X, Y at the chunk's first column of right-hand side r0): ys = X (through L2: other blocks'
// atomics went there), one warp per right-hand side solves, and Y = ys unless Y is null.
// Ends with ys solved and visible to the whole block.
__device__ __forceinline__ void forward_tile(VALUE_T (*ys)[CHUNK], const VALUE_T (*D)[CHUNK + 1],
                                            const VALUE_T* inverse, const VALUE_T* X,
                                            VALUE_T* Y, int ldx, int w, int tile)
{
    for (int e = threadIdx.x; e < tile * w; e += blockDim.x) {
        const int j = e / w, k = e % w;
        ys[j][k] = __ldcg(X + k + (long long)j * ldx);
    }
    __syncthreads();
    if ((int)(threadIdx.x >> 5) < tile) forward_diagonal(ys[threadIdx.x >> 5], D, inverse, w);
    __syncthreads();
    if (Y != nullptr) {
        for (int e = threadIdx.x; e < tile * w; e += blockDim.x) {
            const int j = e / w, k = e % w;
            Y[k + (long long)j * ldx] = ys[j][k];
        }
    }
}

// One warp solves L11^T x = y in place in global memory for one right-hand side `y` (read
// through L2: other blocks' atomics went there), entry k final after step k (k = w-1 .. 0).
__device__ __forceinline__ void backward_diagonal(VALUE_T* y, const VALUE_T (*D)[CHUNK + 1],
                                                  const VALUE_T* inverse, int w)
{
    const int lane = threadIdx.x & 31;
    VALUE_T a = lane < w ? __ldcg(y + lane) : (VALUE_T)0;
    VALUE_T b = lane + 32 < w ? __ldcg(y + lane + 32) : (VALUE_T)0;
    for (int k = w - 1; k >= 0; --k) {
        const VALUE_T xk = __shfl_sync(FULL_MASK, k < 32 ? a : b, k & 31) * inverse[k];
        if (lane == k) a = xk;
        else if (lane < k) a -= D[k][lane] * xk;
        if (lane + 32 == k) b = xk;
        else if (lane + 32 < k) b -= D[k][lane + 32] * xk;
    }
    if (lane < w) y[lane] = a;
    if (lane + 32 < w) y[lane + 32] = b;
}

// The end of a chunk's backward solve, D (its diagonal block, in shared memory) visible to the
// whole block: the inverses of D's diagonal, then one warp per right-hand side solves in place
// at Y (the chunk's first column, right-hand side 0; leading dimension ldx).
__device__ __forceinline__ void backward_diagonal_tiles(VALUE_T* Y, const VALUE_T (*D)[CHUNK + 1],
                                                        VALUE_T* inverse, int w, int nrhs,
                                                        int ldx)
{
    if (threadIdx.x < w) inverse[threadIdx.x] = (VALUE_T)1 / D[threadIdx.x][threadIdx.x];
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    for (int r0 = 0; r0 < nrhs; r0 += RHS_TILE) {
        const int tile = min(RHS_TILE, nrhs - r0);
        if (warp < tile) backward_diagonal(Y + (long long)(r0 + warp) * ldx, D, inverse, w);
    }
}

// Factorization of one level's chunks, part 1 (grid: per chunk, one block per CHUNK_THREADS
// below rows, at least one): every block loads the chunk's diagonal block, factors it in
// shared memory (the few blocks of one chunk do it redundantly: CHUNK^3/3 flops each), and
// solves its rows of the below block, L21 = A21 L11^{-T}. The last block of the chunk to have
// loaded the diagonal block (a ticket in counters[v], reset to 0 for the next factorization)
// writes the factored block back, so no block reads a half-written one. A pivot that is not
// positive (or NaN) sets *failed to the smallest such permuted column.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS) void factor_panels(
    int count, const int* __restrict__ vlist, const long long* __restrict__ prefix,
    CHUNK_TABLE_PARAMS, int* counters, VALUE_T* L, int* failed)
{
    __shared__ VALUE_T D[CHUNK][CHUNK + 1];
    __shared__ int last;
    const LevelTask task = level_task(count, vlist, prefix);
    const int v = task.v, part = task.part, nblocks = task.nblocks;
    const Chunk c = chunk_of(v, CHUNK_TABLE_ARGS);
    const int w = c.width;
    VALUE_T* G = L + c.diag;
    load_diagonal(D, G, c.ld, w);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&counters[v], 1) == nblocks - 1;
    }
    for (int k = 0; k < w; ++k) {
        if (threadIdx.x == 0) {
            const VALUE_T d = D[k][k];
            if (!(d > (VALUE_T)0) && part == 0) atomicMin(failed, (int)(c.first + k));
            D[k][k] = sqrt(d);
        }
        __syncthreads();
        const VALUE_T pivot = D[k][k];
        for (int i = k + 1 + threadIdx.x; i < w; i += blockDim.x) D[i][k] /= pivot;
        __syncthreads();
        const int h = w - k - 1;
        for (int e = threadIdx.x; e < h * h; e += blockDim.x) {
            const int j = k + 1 + e / h, i = k + 1 + e % h;
            if (i >= j) D[i][j] -= D[i][k] * D[j][k];
        }
        __syncthreads();
    }
    // This block's below rows: x L11^T = a, one row per thread, SOLVE_BLOCK columns at a time
    // in registers (the solved columns are re-read from the row itself).
    const int r = part * CHUNK_THREADS + threadIdx.x;
    if (r < c.m) {
        VALUE_T* row = G + w + r;
        for (int kb = 0; kb < w; kb += SOLVE_BLOCK) {
            VALUE_T x[SOLVE_BLOCK];
#pragma unroll
            for (int jj = 0; jj < SOLVE_BLOCK; ++jj)
                x[jj] = kb + jj < w ? row[(long long)(kb + jj) * c.ld] : (VALUE_T)0;
            for (int k0 = 0; k0 < kb; k0 += SOLVE_BLOCK) {  // kb is a multiple of SOLVE_BLOCK
                VALUE_T solved[SOLVE_BLOCK];
#pragma unroll
                for (int q = 0; q < SOLVE_BLOCK; ++q) solved[q] = row[(long long)(k0 + q) * c.ld];
#pragma unroll
                for (int q = 0; q < SOLVE_BLOCK; ++q)
#pragma unroll
                    for (int jj = 0; jj < SOLVE_BLOCK; ++jj)
                        if (kb + jj < w) x[jj] -= solved[q] * D[kb + jj][k0 + q];
            }
#pragma unroll
            for (int jj = 0; jj < SOLVE_BLOCK; ++jj) {
                if (kb + jj < w) {
                    const VALUE_T xk = x[jj] / D[kb + jj][kb + jj];
                    x[jj] = xk;
#pragma unroll
                    for (int ii = jj + 1; ii < SOLVE_BLOCK; ++ii)
                        if (kb + ii < w) x[ii] -= xk * D[kb + ii][kb + jj];
                }
            }
#pragma unroll
            for (int jj = 0; jj < SOLVE_BLOCK; ++jj)
                if (kb + jj < w) row[(long long)(kb + jj) * c.ld] = x[jj];
        }
    }
    __syncthreads();
    if (last) {
        for (int e = threadIdx.x; e < w * w; e += blockDim.x) {
            const int j = e / w, i = e % w;
            if (i >= j) G[i + (long long)j * c.ld] = D[i][j];
        }
        if (threadIdx.x == 0) counters[v] = 0;
    }
}

// Factorization of one level's chunks, part 2 (grid: per chunk with below rows, one block per
// TILE x TILE tile of the lower triangle of its m x m update L21 L21^T): the tile's product
// over the chunk's width, subtracted with atomics (chunks of one level may share targets) from
// the supernode's own later columns (local target column < ncols) or from its ancestors
// through the relative indices.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS) void update_tiles(
    int count, const int* __restrict__ vlist, const long long* __restrict__ prefix,
    CHUNK_TABLE_PARAMS, const long long* __restrict__ below_off,
    const long long* __restrict__ col_base, const long long* __restrict__ col_rel,
    const int* __restrict__ rel, VALUE_T* L)
{
    __shared__ VALUE_T A[TILE][CHUNK + 1];  // tile rows i of L21
    __shared__ VALUE_T B[TILE][CHUNK + 1];  // tile rows j of L21 (the target columns)
    const int task = find_task(prefix, count, blockIdx.x);
    const int v = vlist[task];
    const long long local = blockIdx.x - prefix[task];
    // local = ti (ti + 1) / 2 + tj with tj <= ti
    int ti = (int)((sqrt(8.0 * (double)local + 1.0) - 1.0) * 0.5);
    while ((long long)(ti + 1) * (ti + 2) / 2 <= local) ++ti;
    while ((long long)ti * (ti + 1) / 2 > local) --ti;
    const int tj = (int)(local - (long long)ti * (ti + 1) / 2);
    const Chunk c = chunk_of(v, CHUNK_TABLE_ARGS);
    const int w = c.width, m = c.m;
    const VALUE_T* L21 = L + c.diag + w;  // row 0 of the below block, column 0 of the chunk
    const int i0 = ti * TILE, j0 = tj * TILE;
    {
        constexpr int LOADS = TILE * CHUNK / CHUNK_THREADS;  // per thread, all in flight
        VALUE_T a[LOADS], b[LOADS];
#pragma unroll
        for (int q = 0; q < LOADS; ++q) {
            const int e = threadIdx.x + q * CHUNK_THREADS;
            const int k = e / TILE, i = e % TILE;
            a[q] = k < w && i0 + i < m ? L21[(i0 + i) + (long long)k * c.ld] : (VALUE_T)0;
            b[q] = k < w && j0 + i < m ? L21[(j0 + i) + (long long)k * c.ld] : (VALUE_T)0;
        }
#pragma unroll
        for (int q = 0; q < LOADS; ++q) {
            const int e = threadIdx.x + q * CHUNK_THREADS;
            A[e % TILE][e / TILE] = a[q];
            B[e % TILE][e / TILE] = b[q];
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, group = threadIdx.x >> 5;  // row i0 + lane
    constexpr int PER_THREAD = TILE * TILE / CHUNK_THREADS;       // columns j0 + group + 8 q
    VALUE_T acc[PER_THREAD];
#pragma unroll
    for (int q = 0; q < PER_THREAD; ++q) acc[q] = 0;
    for (int k = 0; k < w; ++k) {
        const VALUE_T a = A[lane][k];
#pragma unroll
        for (int q = 0; q < PER_THREAD; ++q) acc[q] += a * B[group + q * (CHUNK_THREADS / 32)][k];
    }
    const int i = i0 + lane;
    if (i >= m) return;
    const int il = c.local0 + i;  // local row in the supernode's row list
    const long long b0 = below_off[c.s];
#pragma unroll
    for (int q = 0; q < PER_THREAD; ++q) {
        const int j = j0 + group + q * (CHUNK_THREADS / 32);
        if (j >= m || i < j) continue;
        const int jl = c.local0 + j;
        long long target;
        if (jl < c.ncols) {  // the supernode's own later column jl
            target = panel_off[c.s] + (long long)jl * c.ld + il;
        } else {              // an ancestor's column, through the relative indices
            const long long r = b0 + (jl - c.ncols);
            target = col_base[r] + rel[col_rel[r] + (il - c.ncols)];
        }
        atomicAdd(&L[target], -acc[q]);
    }
}

// L[dst[k]] += values[src[k]]: A's permuted lower triangle into the zeroed panels.
// Atomic so duplicate entries (if any) add up.
extern "C" __global__ void assemble(long long nnz, const VALUE_T* __restrict__ values,
                                    const long long* __restrict__ src,
                                    const long long* __restrict__ dst, VALUE_T* L)
{
    const long long k = global_thread_id();
    if (k < nnz) atomicAdd(&L[dst[k]], values[src[k]]);
}

// Modify step of a large supernode, one row chunk: C holds rows r0..m-1 (leading dimension
// ldc) of columns r0..r0+width-1 of the update L21 L21^T; subtract its lower part from the
// ancestors. Distinct (i, j) reach distinct entries and large supernodes run one at a time,
// so plain stores suffice.
extern "C" __global__ void scatter_update(int m, int r0, int width, const VALUE_T* __restrict__ C,
                                          int ldc, const long long* __restrict__ col_base,
                                          const long long* __restrict__ col_rel,
                                          const int* __restrict__ rel, VALUE_T* L)
{
    const long long t = global_thread_id();
    const int height = m - r0;
    if (t >= (long long)height * width) return;
    const int jj = (int)(t / height);
    const int ii = (int)(t % height);
    const int j = r0 + jj, i = r0 + ii;
    if (i < j) return;
    L[col_base[j] + rel[col_rel[j] + i]] -= C[ii + (long long)jj * ldc];
}

// cuSOLVER potrf reports the first failing pivot (1-based) in *info; keep the smallest
// failing column of the whole factorization.
extern "C" __global__ void record_potrf_info(const int* info, int first_col, int* failed)
{
    if (threadIdx.x == 0 && *info > 0) atomicMin(failed, first_col + *info - 1);
}

extern "C" __global__ void gather_diag(int n, const long long* __restrict__ diag_pos,
                                       const VALUE_T* __restrict__ L, VALUE_T* out)
{
    const long long j = global_thread_id();
    if (j < n) out[j] = L[diag_pos[j]];
}


// Forward substitution L y = b over one level's chunks (grid as factor_panels): every block
// solves the chunk's diagonal block for its right-hand sides (one warp per right-hand side;
// redundantly in the few blocks of one chunk), block 0 stores the result in Y, and every block
// subtracts L21 y from X at its below rows (atomics: chunks of one level share ancestors).
// X (accumulating right-hand sides) and Y are n x nrhs, column-major, leading dimension ldx.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS) void solve_forward(
    int count, const int* __restrict__ vlist, const long long* __restrict__ prefix,
    CHUNK_TABLE_PARAMS, const INDEX_T* __restrict__ rows,
    const VALUE_T* __restrict__ L, int nrhs, int ldx, VALUE_T* X, VALUE_T* Y)
{
    __shared__ VALUE_T D[CHUNK][CHUNK + 1];
    __shared__ VALUE_T inverse[CHUNK];  // 1 / D[k][k]
    __shared__ VALUE_T ys[RHS_TILE][CHUNK];
    const LevelTask task = level_task(count, vlist, prefix);
    const int part = task.part;
    const Chunk c = chunk_of(task.v, CHUNK_TABLE_ARGS);
    const int w = c.width;
    const VALUE_T* G = L + c.diag;
    load_diagonal(D, G, c.ld, w);
    __syncthreads();
    if (threadIdx.x < w) inverse[threadIdx.x] = (VALUE_T)1 / D[threadIdx.x][threadIdx.x];
    const int r = part * CHUNK_THREADS + threadIdx.x;  // this thread's below row
    for (int r0 = 0; r0 < nrhs; r0 += RHS_TILE) {
        const int tile = min(RHS_TILE, nrhs - r0);
        forward_tile(ys, D, inverse, X + c.first + (long long)r0 * ldx,
                     part == 0 ? Y + c.first + (long long)r0 * ldx : nullptr, ldx, w, tile);
        if (r < c.m) {
            const VALUE_T* row = G + w + r;
            VALUE_T acc[RHS_TILE];
#pragma unroll
            for (int j = 0; j < RHS_TILE; ++j) acc[j] = 0;
            add_row_products(acc, row, c.ld, ys, 0, w);
            const long long target = rows[c.rows_at + r];
#pragma unroll
            for (int j = 0; j < RHS_TILE; ++j)
                if (j < tile) atomicAdd(&X[target + (long long)(r0 + j) * ldx], -acc[j]);
        }
        __syncthreads();
    }
}

// Backward substitution L^T x = y over one level's chunks, top-down (grid as factor_panels):
// every block subtracts its below rows' share of L21^T x from Y at the chunk's columns (one
// warp per column at a time, atomics across the blocks of the chunk); the last block of the
// chunk to finish (a ticket in counters[v], reset for the next solve) then solves with the
// diagonal block in place. The below rows' x are final: they belong to later chunks of the
// supernode or to its ancestors, solved by earlier launches.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS) void solve_backward(
    int count, const int* __restrict__ vlist, const long long* __restrict__ prefix,
    CHUNK_TABLE_PARAMS, const INDEX_T* __restrict__ rows,
    const VALUE_T* __restrict__ L, int nrhs, int ldx, VALUE_T* Y, int* counters)
{
    // One buffer, two uses: the block's below-row values, then (last block) the diagonal block.
    __shared__ VALUE_T buffer[CHUNK * (CHUNK + 1)];
    __shared__ VALUE_T inverse[CHUNK];  // 1 / D[k][k]
    __shared__ int last;
    VALUE_T (*xs)[CHUNK_THREADS] = reinterpret_cast<VALUE_T (*)[CHUNK_THREADS]>(buffer);
    VALUE_T (*D)[CHUNK + 1] = reinterpret_cast<VALUE_T (*)[CHUNK + 1]>(buffer);
    const LevelTask task = level_task(count, vlist, prefix);
    const int v = task.v, part = task.part, nblocks = task.nblocks;
    const Chunk c = chunk_of(v, CHUNK_TABLE_ARGS);
    const int w = c.width;
    const VALUE_T* G = L + c.diag;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = part * CHUNK_THREADS;
    const int height = max(0, min(CHUNK_THREADS, c.m - row0));  // this block's below rows
    if (height > 0) {
        for (int r0 = 0; r0 < nrhs; r0 += RHS_TILE) {
            const int tile = min(RHS_TILE, nrhs - r0);
            const int i = threadIdx.x;
            if (i < height) {
                const long long row = rows[c.rows_at + row0 + i];
                for (int j = 0; j < tile; ++j) xs[j][i] = Y[row + (long long)(r0 + j) * ldx];
            }
            __syncthreads();
            for (int k = warp; k < w; k += CHUNK_THREADS / 32) {
                const VALUE_T* col = G + w + row0 + (long long)k * c.ld;
                VALUE_T acc[RHS_TILE];
#pragma unroll
                for (int j = 0; j < RHS_TILE; ++j) acc[j] = 0;
                VALUE_T l[CHUNK_THREADS / 32];  // this lane's rows of column k, all in flight
#pragma unroll
                for (int t = 0; t < CHUNK_THREADS / 32; ++t)
                    l[t] = lane + 32 * t < height ? col[lane + 32 * t] : (VALUE_T)0;
#pragma unroll
                for (int t = 0; t < CHUNK_THREADS / 32; ++t)
                    if (lane + 32 * t < height) {
#pragma unroll
                        for (int j = 0; j < RHS_TILE; ++j)
                            if (j < tile) acc[j] += l[t] * xs[j][lane + 32 * t];
                    }
#pragma unroll
                for (int j = 0; j < RHS_TILE; ++j) {
                    const VALUE_T sum = warp_sum_down(acc[j]);
                    if (lane == 0 && j < tile)
                        atomicAdd(&Y[c.first + k + (long long)(r0 + j) * ldx], -sum);
                }
            }
            __syncthreads();
        }
    }
    __threadfence();  // every thread's atomics reach the device before the ticket is taken
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[v], 1) == nblocks - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) counters[v] = 0;
    __threadfence();
    load_diagonal(D, G, c.ld, w);
    __syncthreads();
    backward_diagonal_tiles(Y + c.first, D, inverse, w, nrhs, ldx);
}


// -- Dataflow solves: one launch per direction over every chunk ----------------------------
// The level-by-level solves above pay a launch boundary (and the memory latencies that follow
// it) per chunk level, and a whole block per chunk part. Here one launch covers all chunks.
// Units: (chunk v, part p of CHUNK_THREADS below rows), in chunk-level order (app/ops/cholesky/
// gpu.py, flow_tasks); a block takes the next task from a ticket counter (forward: tasks in
// order; backward: in reverse order): either one unit (unit_part >= 0: the whole block works
// on it) or up to WARPS "small" units of one level (unit_part = -1: chunk width <= 32 and at
// most 32 below rows; one warp each, warps independent). Every unit's producers sit in earlier
// tasks, which took their tickets before it and wait on nothing later: no deadlock whatever the
// scheduling. A unit first loads what does not depend on the right-hand sides (its rows of L21,
// the diagonal block), then waits on per-chunk counters: forward, until every unit whose below
// rows include chunk v's columns has added its share (arrived[v] == expected[v]); backward,
// until every chunk its below rows belong to is solved. Unit u's below rows lie in the chunks
// target_chunk[target_ptr[u] .. target_ptr[u + 1]). `sync` is zeroed before each solve:
// [forward ticket, backward ticket, arrived[nchunks], contributed[nchunks], solved[nchunks]].

// Backward right-hand sides per pass of a whole-block unit (shared x: BACK_RHS x CHUNK_THREADS).
#define BACK_RHS 4
#define WARPS (CHUNK_THREADS / 32)
// Columns of a unit's rows kept in registers from before the wait (the rest are loaded after).
#define EARLY_COLS 32

// The flow launches' task list, as one parameter list (as CHUNK_TABLE_PARAMS): task -> its
// first unit (one entry more); unit -> its chunk and its part of the chunk's below rows (-1: a
// small unit, one warp); unit -> its range of target_chunk (one entry more), the chunks its
// below rows belong to; chunk -> how many units add to it (forward). The engine passes them in
// this order.
#define FLOW_TASK_PARAMS                                                                    \
    const int* __restrict__ task_unit, const int* __restrict__ unit_chunk,                  \
        const int* __restrict__ unit_part, const long long* __restrict__ target_ptr,        \
        const int* __restrict__ target_chunk, const int* __restrict__ expected

// This block's ticket in a flow launch (*counter counts them): the order blocks take tasks in.
__device__ __forceinline__ int next_ticket(int* counter)
{
    __shared__ int ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(counter, 1);
    __syncthreads();
    return ticket;
}

// In a flow task of small units (one warp each, from u0 on), this warp's unit; -1 where the task
// has fewer units than the block has warps.
__device__ __forceinline__ int small_unit(int task, int u0, const int* __restrict__ task_unit)
{
    const int u = u0 + (int)(threadIdx.x >> 5);
    return u < task_unit[task + 1] ? u : -1;
}

// A small unit, forward, by one warp (lane = row of the diagonal block / below row).
__device__ __forceinline__ void forward_small(
    int v, const long long* __restrict__ target_ptr, const int* __restrict__ target_chunk,
    int u, const int* __restrict__ expected, const Chunk& c, const INDEX_T* __restrict__ rows,
    const VALUE_T* __restrict__ L, int nrhs, int ldx, VALUE_T* X, VALUE_T* Y, int* arrived)
{
    const int lane = threadIdx.x & 31, w = c.width, m = c.m;
    const VALUE_T* G = L + c.diag;
    VALUE_T below[32], diagonal_row[32];
#pragma unroll
    for (int q = 0; q < 32; ++q) {
        below[q] = lane < m && q < w ? G[w + lane + (long long)q * c.ld] : (VALUE_T)0;
        diagonal_row[q] = lane < w && q < lane ? G[lane + (long long)q * c.ld] : (VALUE_T)0;
    }
    const VALUE_T inverse = lane < w ? (VALUE_T)1 / G[lane + (long long)lane * c.ld] : (VALUE_T)1;
    const long long target = lane < m ? (long long)rows[c.rows_at + lane] : 0;
    if (lane == 0) wait_until_at_least(arrived + v, expected[v]);
    __syncwarp();
    for (int j = 0; j < nrhs; ++j) {
        VALUE_T a = lane < w ? __ldcg(X + c.first + lane + (long long)j * ldx) : (VALUE_T)0;
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            if (k < w) {  // uniform in the warp
                const VALUE_T xk = __shfl_sync(FULL_MASK, a * inverse, k);
                if (lane == k) a = xk;
                else if (lane > k) a -= diagonal_row[k] * xk;
            }
        }
        if (lane < w) Y[c.first + lane + (long long)j * ldx] = a;
        VALUE_T acc = 0;
#pragma unroll
        for (int q = 0; q < 32; ++q)
            if (q < w) acc += below[q] * __shfl_sync(FULL_MASK, a, q);
        if (lane < m) atomicAdd(&X[target + (long long)j * ldx], -acc);
    }
    __threadfence();  // the atomics reach the device before the counts below
    __syncwarp();
    for (long long t = target_ptr[u] + lane; t < target_ptr[u + 1]; t += 32)
        atomicAdd(arrived + target_chunk[t], 1);
}

// Forward substitution L y = b, all chunks in one launch (grid: one block per task). A
// whole-block unit solves its chunk's diagonal block for the right-hand sides (redundantly in
// the parts of a chunk; part 0 stores y in Y) and subtracts L21 y from X at its below rows
// (atomics); every unit then counts itself in arrived[] of the chunks of its below rows.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS, 2) void solve_forward_flow(
    int ntasks, FLOW_TASK_PARAMS,
    CHUNK_TABLE_PARAMS, const INDEX_T* __restrict__ rows,
    const VALUE_T* __restrict__ L, int nrhs, int ldx, VALUE_T* X, VALUE_T* Y, int* sync,
    int nchunks)
{
    __shared__ VALUE_T D[CHUNK][CHUNK + 1];
    __shared__ VALUE_T inverse[CHUNK];  // 1 / D[k][k]
    __shared__ VALUE_T ys[RHS_TILE][CHUNK];
    int* arrived = sync + 2;
    const int task = next_ticket(&sync[0]);
    if (task >= ntasks) return;
    const int u0 = task_unit[task];
    if (unit_part[u0] < 0) {
        const int u = small_unit(task, u0, task_unit);
        if (u < 0) return;
        forward_small(unit_chunk[u], target_ptr, target_chunk, u, expected,
                      chunk_of(unit_chunk[u], CHUNK_TABLE_ARGS), rows, L, nrhs, ldx, X, Y,
                      arrived);
        return;
    }
    const int v = unit_chunk[u0], part = unit_part[u0];  // a whole-block unit
    const Chunk c = chunk_of(v, CHUNK_TABLE_ARGS);
    const VALUE_T* G = L + c.diag;
    const int w = c.width;
    const int r = part * CHUNK_THREADS + threadIdx.x;  // this thread's below row
    const VALUE_T* row = G + w + r;
    // Independent of the right-hand sides, so in flight before the wait: the first columns of
    // the row of L21, its target, and the diagonal block.
    VALUE_T l[EARLY_COLS];
#pragma unroll
    for (int q = 0; q < EARLY_COLS; ++q)
        l[q] = r < c.m && q < w ? row[(long long)q * c.ld] : (VALUE_T)0;
    long long target = 0;
    if (r < c.m) target = rows[c.rows_at + r];
    load_diagonal(D, G, c.ld, w);
    if (threadIdx.x == 0) wait_until_at_least(arrived + v, expected[v]);
    __syncthreads();
    if (threadIdx.x < w) inverse[threadIdx.x] = (VALUE_T)1 / D[threadIdx.x][threadIdx.x];
    for (int r0 = 0; r0 < nrhs; r0 += RHS_TILE) {
        const int tile = min(RHS_TILE, nrhs - r0);
        forward_tile(ys, D, inverse, X + c.first + (long long)r0 * ldx,
                     part == 0 ? Y + c.first + (long long)r0 * ldx : nullptr, ldx, w, tile);
        if (r < c.m) {
            VALUE_T acc[RHS_TILE];
#pragma unroll
            for (int j = 0; j < RHS_TILE; ++j) acc[j] = 0;
#pragma unroll
            for (int q = 0; q < EARLY_COLS; ++q)
                if (q < w) {
#pragma unroll
                    for (int j = 0; j < RHS_TILE; ++j) acc[j] += l[q] * ys[j][q];
                }
            add_row_products(acc, row, c.ld, ys, EARLY_COLS, w);
#pragma unroll
            for (int j = 0; j < RHS_TILE; ++j)
                if (j < tile) atomicAdd(&X[target + (long long)(r0 + j) * ldx], -acc[j]);
        }
        __syncthreads();
    }
    __threadfence();  // this thread's atomics reach the device before the counts below
    __syncthreads();
    for (long long t = target_ptr[u0] + threadIdx.x; t < target_ptr[u0 + 1]; t += blockDim.x)
        atomicAdd(arrived + target_chunk[t], 1);
}

// A small unit, backward, by one warp (lane = column of the diagonal block / below row).
__device__ __forceinline__ void backward_small(
    int v, const long long* __restrict__ target_ptr, const int* __restrict__ target_chunk,
    int u, const Chunk& c, const INDEX_T* __restrict__ rows, const VALUE_T* __restrict__ L,
    int nrhs, int ldx, VALUE_T* Y, int* solved)
{
    const int lane = threadIdx.x & 31, w = c.width, m = c.m;
    const VALUE_T* G = L + c.diag;
    VALUE_T below[32], diagonal_column[32];  // L21[lane][q]; D[q][lane]
#pragma unroll
    for (int q = 0; q < 32; ++q) {
        below[q] = lane < m && q < w ? G[w + lane + (long long)q * c.ld] : (VALUE_T)0;
        diagonal_column[q] = lane < w && q < w && q > lane ? G[q + (long long)lane * c.ld]
                                                           : (VALUE_T)0;
    }
    const VALUE_T inverse = lane < w ? (VALUE_T)1 / G[lane + (long long)lane * c.ld] : (VALUE_T)1;
    const long long row = lane < m ? (long long)rows[c.rows_at + lane] : 0;
    for (long long t = target_ptr[u] + lane; t < target_ptr[u + 1]; t += 32)
        wait_until_at_least(solved + target_chunk[t], 1);
    __syncwarp();
    for (int j = 0; j < nrhs; ++j) {
        const VALUE_T x = lane < m ? __ldcg(Y + row + (long long)j * ldx) : (VALUE_T)0;
        VALUE_T share = 0;  // lane q: sum_i L21[i][q] x_i
#pragma unroll
        for (int q = 0; q < 32; ++q)
            if (q < w) {
                const VALUE_T sum = warp_sum_all(below[q] * x);
                if (lane == q) share = sum;
            }
        VALUE_T a = lane < w ? Y[c.first + lane + (long long)j * ldx] - share : (VALUE_T)0;
#pragma unroll
        for (int k = 31; k >= 0; --k) {
            if (k < w) {  // uniform in the warp
                const VALUE_T xk = __shfl_sync(FULL_MASK, a * inverse, k);
                if (lane == k) a = xk;
                else if (lane < k) a -= diagonal_column[k] * xk;
            }
        }
        if (lane < w) Y[c.first + lane + (long long)j * ldx] = a;
    }
    __threadfence();  // the solved entries reach the device before the flag
    __syncwarp();
    if (lane == 0) atomicExch(solved + v, 1);
}

// Backward substitution L^T x = y, all chunks in one launch, top-down (grid: one block per
// task; tasks in the reverse order of the forward list). A whole-block unit waits until the
// chunks of its below rows are solved, subtracts its rows' share of L21^T x from Y at the
// chunk's columns (one warp per column at a time, atomics) and counts itself in
// contributed[v]; part 0 of the chunk (its last unit in this order) then waits for the other
// parts, solves with the diagonal block in place and marks the chunk solved.
extern "C" __global__ __launch_bounds__(CHUNK_THREADS, 2) void solve_backward_flow(
    int ntasks, FLOW_TASK_PARAMS,
    CHUNK_TABLE_PARAMS, const INDEX_T* __restrict__ rows,
    const VALUE_T* __restrict__ L, int nrhs, int ldx, VALUE_T* Y, int* sync, int nchunks)
{
    __shared__ VALUE_T D[CHUNK][CHUNK + 1];
    __shared__ VALUE_T inverse[CHUNK];
    __shared__ VALUE_T xs[BACK_RHS][CHUNK_THREADS];
    int* contributed = sync + 2 + nchunks;
    int* solved = sync + 2 + 2 * (long long)nchunks;
    const int ticket = next_ticket(&sync[1]);
    if (ticket >= ntasks) return;
    const int task = ntasks - 1 - ticket;
    const int u0 = task_unit[task];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (unit_part[u0] < 0) {
        const int u = small_unit(task, u0, task_unit);
        if (u < 0) return;
        backward_small(unit_chunk[u], target_ptr, target_chunk, u,
                       chunk_of(unit_chunk[u], CHUNK_TABLE_ARGS), rows, L, nrhs, ldx, Y, solved);
        return;
    }
    const int v = unit_chunk[u0], part = unit_part[u0];  // a whole-block unit
    const Chunk c = chunk_of(v, CHUNK_TABLE_ARGS);
    const int w = c.width;
    const VALUE_T* G = L + c.diag;
    const int row0 = part * CHUNK_THREADS;
    const int height = max(0, min(CHUNK_THREADS, c.m - row0));  // this block's below rows
    const VALUE_T* block_rows = G + w + row0;
    // In flight before the wait: this warp's first columns k = warp + WARPS e (k < EARLY_COLS)
    // of the block's rows (lane + 32 t), the row indices, and (part 0) the diagonal block.
    constexpr int EARLY = EARLY_COLS / WARPS;
    VALUE_T l[EARLY][CHUNK_THREADS / 32];
#pragma unroll
    for (int e = 0; e < EARLY; ++e)
#pragma unroll
        for (int t = 0; t < CHUNK_THREADS / 32; ++t) {
            const int k = warp + WARPS * e, i = lane + 32 * t;
            l[e][t] = k < w && i < height ? block_rows[i + (long long)k * c.ld] : (VALUE_T)0;
        }
    long long row = 0;
    if (threadIdx.x < height) row = rows[c.rows_at + row0 + threadIdx.x];
    if (part == 0) load_diagonal(D, G, c.ld, w);
    for (long long t = target_ptr[u0] + threadIdx.x; t < target_ptr[u0 + 1]; t += blockDim.x)
        wait_until_at_least(solved + target_chunk[t], 1);
    __syncthreads();
    if (height > 0) {
        for (int r0 = 0; r0 < nrhs; r0 += BACK_RHS) {
            const int tile = min(BACK_RHS, nrhs - r0);
            // Every entry is written, zeros past the block's rows: the products below read all
            // CHUNK_THREADS of them (their L21 entries are zeros there), and 0 * a stale NaN
            // left in shared memory by an earlier block is NaN (the split-ordered 700^2 grid).
            for (int j = 0; j < tile; ++j)
                xs[j][threadIdx.x] = threadIdx.x < height
                    ? __ldcg(Y + row + (long long)(r0 + j) * ldx) : (VALUE_T)0;
            __syncthreads();
            for (int k = warp; k < w; k += WARPS) {
                VALUE_T col[CHUNK_THREADS / 32];  // this lane's rows of column k
                const int e = k / WARPS;
                if (e < EARLY) {
#pragma unroll
                    for (int t = 0; t < CHUNK_THREADS / 32; ++t) {
                        // static register indices: select the early column e
                        VALUE_T value = 0;
#pragma unroll
                        for (int q = 0; q < EARLY; ++q)
                            if (q == e) value = l[q][t];
                        col[t] = value;
                    }
                } else {
#pragma unroll
                    for (int t = 0; t < CHUNK_THREADS / 32; ++t)
                        col[t] = lane + 32 * t < height
                            ? block_rows[lane + 32 * t + (long long)k * c.ld] : (VALUE_T)0;
                }
                for (int j = 0; j < tile; ++j) {
                    VALUE_T acc = 0;
#pragma unroll
                    for (int t = 0; t < CHUNK_THREADS / 32; ++t)
                        acc += col[t] * xs[j][lane + 32 * t];
                    const VALUE_T sum = warp_sum_down(acc);
                    if (lane == 0) atomicAdd(&Y[c.first + k + (long long)(r0 + j) * ldx], -sum);
                }
            }
            __syncthreads();
        }
    }
    __threadfence();  // this thread's atomics reach the device before the counts below
    __syncthreads();
    if (part != 0) {
        if (threadIdx.x == 0) atomicAdd(contributed + v, 1);
        return;
    }
    const int parts = max(1, (c.m + CHUNK_THREADS - 1) / CHUNK_THREADS);
    if (threadIdx.x == 0) wait_until_at_least(contributed + v, parts - 1);
    backward_diagonal_tiles(Y + c.first, D, inverse, w, nrhs, ldx);
    __threadfence();  // the solved entries reach the device before the flag
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(solved + v, 1);
}

// Iterative refinement, residual: R = B - A X in the permuted numbering (row k of P A P^T is row
// perm[k] of A, its entries a_ptr[perm[k]] .. a_ptr[perm[k] + 1] of A's CSR data `values`, their
// permuted columns in a_cols), summed in double whatever VALUE_T; B, X, R are nrhs x n with
// leading dimension n. R is the forward pass's (consumed) input. *error gets the componentwise
// backward error max |r_k| / (|A| |x| + |b|)_k of X over all rows and right-hand sides, as the
// bits of a non-negative double (their integer order is the order of the values), by atomicMax;
// the caller zeroes it. One thread per row.
extern "C" __global__ void residual(int n, int nrhs, const INDEX_T* __restrict__ perm,
                                    const long long* __restrict__ a_ptr,
                                    const INDEX_T* __restrict__ a_cols,
                                    const VALUE_T* __restrict__ values,
                                    const VALUE_T* __restrict__ B, const VALUE_T* __restrict__ X,
                                    VALUE_T* R, unsigned long long* error)
{
    const long long k = global_thread_id();
    double worst = 0.0;
    if (k < n) {
        const long long begin = a_ptr[perm[k]], end = a_ptr[perm[k] + 1];
        for (int j = 0; j < nrhs; ++j) {
            const long long at = k + (long long)j * n;
            const double b = (double)B[at];
            double r = b, scale = fabs(b);
            for (long long p = begin; p < end; ++p) {
                const double term = (double)values[p] * (double)X[a_cols[p] + (long long)j * n];
                r -= term;
                scale += fabs(term);
            }
            R[at] = (VALUE_T)r;
            // a row with no scale but a residual is infinitely wrong (as the host's check); so
            // is a NaN (its scale compares false)
            const double ratio = scale > 0.0 ? fabs(r) / scale : (r != 0.0 ? HUGE_VAL : 0.0);
            worst = fmax(worst, ratio);
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        worst = fmax(worst, __shfl_down_sync(FULL_MASK, worst, offset));
    if ((threadIdx.x & 31) == 0 && worst > 0.0)
        atomicMax(error, (unsigned long long)__double_as_longlong(worst));
}

// Iterative refinement, update: X += D (count entries).
extern "C" __global__ void add_correction(long long count, const VALUE_T* __restrict__ D,
                                          VALUE_T* X)
{
    const long long k = global_thread_id();
    if (k < count) X[k] += D[k];
}
