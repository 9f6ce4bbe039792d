// Supernodal Cholesky kernels: assembly of A into the supernode panels, the batched
// factorization of small supernodes (one thread block each), the scatter-add ("modify") of
// update blocks through relative indices, and the batched triangular solves.
//
// Layout (see app/ops/cholesky/symbolic.py): supernode s owns a column-major panel of
// nrows[s] x ncols[s] values at L + panel_off[s]; its first ncols rows are its own columns.
// Its below-diagonal row r (0 <= r < nrows - ncols) updates, in column rows[.] of the target
// supernode owning that row, the entry at  col_base[r] + rel[col_rel[r] + i]  for rows i >= r.
// Offsets into the value array are 64-bit; row indices are INDEX_T.
#include "hisparse_common.cuh"
// Dynamic shared memory a small-supernode block may use for its panel (default 48 KiB).
#ifndef SMEM_BYTES
#define SMEM_BYTES 49152
#endif
#define SMEM_VALUES (SMEM_BYTES / (int)sizeof(VALUE_T))
#define NO_FAILURE 0x7FFFFFFF

// L[dst[k]] += values[src[k]]: A's permuted lower triangle into the zeroed panels.
// Atomic so duplicate entries (if any) add up.
extern "C" __global__ void assemble(long long nnz, const VALUE_T* __restrict__ values,
                                    const long long* __restrict__ src,
                                    const long long* __restrict__ dst, VALUE_T* L)
{
    const long long k = global_thread_id();
    if (k < nnz) atomicAdd(&L[dst[k]], values[src[k]]);
}

// One thread block per small supernode (ids in snodes[0:count]): dense right-looking
// Cholesky of the panel (in shared memory when it fits), then its update L21 L21^T
// subtracted from the ancestors with atomics (sibling supernodes of one level may hit the
// same target entries).
extern "C" __global__ void factor_small(int count, const int* __restrict__ snodes,
                                        const long long* __restrict__ starts,
                                        const long long* __restrict__ nrows_of,
                                        const long long* __restrict__ panel_off,
                                        const long long* __restrict__ below_off,
                                        const long long* __restrict__ col_base,
                                        const long long* __restrict__ col_rel,
                                        const int* __restrict__ rel, VALUE_T* L, int* failed)
{
    extern __shared__ unsigned char smem_raw[];
    VALUE_T* smem = reinterpret_cast<VALUE_T*>(smem_raw);
    __shared__ int bad;
    if (blockIdx.x >= count) return;
    const int s = snodes[blockIdx.x];
    const long long first = starts[s];
    const int nc = (int)(starts[s + 1] - first);
    const int nr = (int)nrows_of[s];
    VALUE_T* G = L + panel_off[s];
    const bool in_shared = (long long)nr * nc <= SMEM_VALUES;
    VALUE_T* P = in_shared ? smem : G;
    if (in_shared)
        for (int t = threadIdx.x; t < nr * nc; t += blockDim.x) P[t] = G[t];
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (int k = 0; k < nc; ++k) {
        if (threadIdx.x == 0) {
            VALUE_T d = P[k + (long long)k * nr];
            if (!(d > (VALUE_T)0)) {  // also catches NaN
                if (!bad) atomicMin(failed, (int)(first + k));
                bad = 1;
            }
            P[k + (long long)k * nr] = sqrt(d);
        }
        __syncthreads();
        const VALUE_T pivot = P[k + (long long)k * nr];
        for (int i = k + 1 + threadIdx.x; i < nr; i += blockDim.x) P[i + (long long)k * nr] /= pivot;
        __syncthreads();
        const int w = nc - k - 1;  // columns right of k inside the supernode
        const int h = nr - k - 1;  // rows below k
        for (int t = threadIdx.x; t < w * h; t += blockDim.x) {
            const int j = k + 1 + t / h;
            const int i = k + 1 + t % h;
            if (i >= j) P[i + (long long)j * nr] -= P[i + (long long)k * nr] * P[j + (long long)k * nr];
        }
        __syncthreads();
    }
    if (in_shared) {
        for (int t = threadIdx.x; t < nr * nc; t += blockDim.x) G[t] = P[t];
    }
    const int m = nr - nc;
    if (m <= 0) return;
    const long long* cb = col_base + below_off[s];
    const long long* cr = col_rel + below_off[s];
    // update entry (i, j), i >= j, of the m x m block: dot of below rows i and j
    for (long long t = threadIdx.x; t < (long long)m * m; t += blockDim.x) {
        const int j = (int)(t / m);
        const int i = (int)(t % m);
        if (i < j) continue;
        VALUE_T dot = 0;
        for (int k = 0; k < nc; ++k)
            dot += P[nc + i + (long long)k * nr] * P[nc + j + (long long)k * nr];
        atomicAdd(&L[cb[j] + rel[cr[j] + i]], -dot);
    }
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

// Forward substitution for the small supernodes of one level: x_s = L11^{-1} x_s, then
// x[rows below] -= L21 x_s (atomics: siblings update shared ancestors). X is n x nrhs,
// column-major with leading dimension ldx.
extern "C" __global__ void forward_small(int count, const int* __restrict__ snodes,
                                         const long long* __restrict__ starts,
                                         const long long* __restrict__ nrows_of,
                                         const long long* __restrict__ panel_off,
                                         const long long* __restrict__ rows_off,
                                         const INDEX_T* __restrict__ rows,
                                         const VALUE_T* __restrict__ L, int nrhs, int ldx,
                                         VALUE_T* X)
{
    if (blockIdx.x >= count) return;
    const int s = snodes[blockIdx.x];
    const long long first = starts[s];
    const int nc = (int)(starts[s + 1] - first);
    const int nr = (int)nrows_of[s];
    const VALUE_T* P = L + panel_off[s];
    const INDEX_T* R = rows + rows_off[s];
    for (int r = 0; r < nrhs; ++r) {
        VALUE_T* x = X + (long long)r * ldx;
        for (int k = 0; k < nc; ++k) {
            if (threadIdx.x == 0) x[first + k] /= P[k + (long long)k * nr];
            __syncthreads();
            const VALUE_T xk = x[first + k];
            for (int i = k + 1 + threadIdx.x; i < nc; i += blockDim.x)
                x[first + i] -= P[i + (long long)k * nr] * xk;
            __syncthreads();
        }
        for (int i = nc + threadIdx.x; i < nr; i += blockDim.x) {
            VALUE_T dot = 0;
            for (int k = 0; k < nc; ++k) dot += P[i + (long long)k * nr] * x[first + k];
            atomicAdd(&x[R[i]], -dot);
        }
        __syncthreads();
    }
}

// Backward substitution for the small supernodes of one level: x_s -= L21^T x[rows below]
// (final: ancestors were solved by earlier launches), then x_s = L11^{-T} x_s.
extern "C" __global__ void backward_small(int count, const int* __restrict__ snodes,
                                          const long long* __restrict__ starts,
                                          const long long* __restrict__ nrows_of,
                                          const long long* __restrict__ panel_off,
                                          const long long* __restrict__ rows_off,
                                          const INDEX_T* __restrict__ rows,
                                          const VALUE_T* __restrict__ L, int nrhs, int ldx,
                                          VALUE_T* X)
{
    if (blockIdx.x >= count) return;
    const int s = snodes[blockIdx.x];
    const long long first = starts[s];
    const int nc = (int)(starts[s + 1] - first);
    const int nr = (int)nrows_of[s];
    const VALUE_T* P = L + panel_off[s];
    const INDEX_T* R = rows + rows_off[s];
    for (int r = 0; r < nrhs; ++r) {
        VALUE_T* x = X + (long long)r * ldx;
        for (int k = threadIdx.x; k < nc; k += blockDim.x) {
            VALUE_T dot = 0;
            for (int i = nc; i < nr; ++i) dot += P[i + (long long)k * nr] * x[R[i]];
            x[first + k] -= dot;
        }
        __syncthreads();
        for (int k = nc - 1; k >= 0; --k) {
            if (threadIdx.x == 0) x[first + k] /= P[k + (long long)k * nr];
            __syncthreads();
            const VALUE_T xk = x[first + k];
            for (int i = threadIdx.x; i < k; i += blockDim.x)
                x[first + i] -= P[k + (long long)i * nr] * xk;
            __syncthreads();
        }
    }
}

// X[rows[i], r] -= T[i, r] for a large supernode's below rows (one stream, no conflicts).
extern "C" __global__ void sub_rows(int m, int nrhs, const VALUE_T* __restrict__ T, int ldt,
                                    const INDEX_T* __restrict__ rows, VALUE_T* X, int ldx)
{
    const long long t = global_thread_id();
    if (t >= (long long)m * nrhs) return;
    const int r = (int)(t / m), i = (int)(t % m);
    X[rows[i] + (long long)r * ldx] -= T[i + (long long)r * ldt];
}

// T[i, r] = X[rows[i], r]: gather a large supernode's below rows for the backward solve.
extern "C" __global__ void gather_rows(int m, int nrhs, const INDEX_T* __restrict__ rows,
                                       const VALUE_T* __restrict__ X, int ldx, VALUE_T* T,
                                       int ldt)
{
    const long long t = global_thread_id();
    if (t >= (long long)m * nrhs) return;
    const int r = (int)(t / m), i = (int)(t % m);
    T[i + (long long)r * ldt] = X[rows[i] + (long long)r * ldx];
}
