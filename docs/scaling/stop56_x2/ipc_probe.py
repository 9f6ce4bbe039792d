"""The per-mode exchange of CP-ALS through peer-mapped memory (CUDA IPC) instead of NCCL: one
kernel per exchange writes this rank's rows and partials into every peer's buffers over NVLink,
raises the peer's flag to this exchange's epoch (system-scope release), and waits for every peer's
flag in its own memory (acquire). Timed as nccl_probe.py times NCCL (CUDA events, 300 reps),
checked for correctness on every rep's last exchange."""
import numpy as np
import cupy as cp
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
R, W = 16, 16 * 16 + 1 + 16
REPS = 300
SRC = r"""
extern "C" __global__ void exchange(double* rows, const long long my_first, const long long my_count,
    double* const* peer_rows, const double* partial, double* const* peer_slots, const int nranks,
    const int me, unsigned long long* const* peer_flags, unsigned long long* my_flags,
    unsigned long long* epoch_counter, const int width)
{
    __shared__ unsigned long long epoch;
    if (threadIdx.x == 0) epoch = epoch_counter[0] + 1;
    __syncthreads();
    const long long n2 = my_count * 16 / 2;  // double2 per row pair
    const double2* src = (const double2*)(rows + my_first * 16);
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const int parity = (int)(epoch & 1ull);
    for (int p = 0; p < nranks; ++p) {
        if (p == me) continue;
        double2* dst = (double2*)(peer_rows[p] + my_first * 16);
        for (long long i = tid; i < n2; i += stride) dst[i] = src[i];
        if (blockIdx.x == 0)
            for (int j = threadIdx.x; j < width; j += blockDim.x)
                peer_slots[p][(parity * nranks + me) * width + j] = partial[j];
    }
    __syncthreads();
    __threadfence_system();
    __syncthreads();
    // every block signals: the peer waits for nblocks signals of this epoch
    if (threadIdx.x == 0)
        for (int p = 0; p < nranks; ++p)
            if (p != me) atomicAdd_system(peer_flags[p] + me, 1ull);
    // wait: block 0 thread 0.. each block waits for all
    if (threadIdx.x < nranks && threadIdx.x != me) {
        const unsigned long long want = epoch * gridDim.x;
        volatile unsigned long long* f = my_flags + threadIdx.x;
        long long spins = 0;
        while (*f < want) { if (++spins > (1ll << 24)) __trap(); }
    }
    __syncthreads();
    __threadfence_system();
    if (blockIdx.x == 0 && threadIdx.x == 0) {}
    // the counter advances once all blocks have read it: last block (by a grid-wide count)
}
extern "C" __global__ void advance(unsigned long long* epoch_counter) { epoch_counter[0] += 1; }
"""
mod = cp.RawModule(code=SRC, options=("-std=c++17",))
kern, advance = mod.get_function("exchange"), mod.get_function("advance")
stream = cp.cuda.Stream(non_blocking=True)

def raw(n, dtype):
    """An array in its own cudaMalloc (CuPy's pool hands out offsets inside larger blocks, and an
    IPC handle maps the whole block)."""
    dtype = np.dtype(dtype)
    mem = cp.cuda.Memory(n * dtype.itemsize)
    return cp.ndarray((n,), dtype, cp.cuda.MemoryPointer(mem, 0))


def share(arr):
    h = cp.cuda.runtime.ipcGetMemHandle(arr.data.ptr)
    hs = comm.allgather(h)
    ptrs = []
    for p, hp in enumerate(hs):
        ptrs.append(arr.data.ptr if p == rank else
                    cp.cuda.runtime.ipcOpenMemHandle(hp, cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess))
    return cp.asarray(np.array(ptrs, dtype=np.uint64))

for rows_n in (12092, 9184, 28818):
    rows = raw(rows_n * R, cp.float64); rows.fill(0)
    counts = [rows_n // size + (r < rows_n % size) for r in range(size)]
    offs = np.concatenate([[0], np.cumsum(counts)])
    slots = raw(2 * size * W, cp.float64); slots.fill(0)
    flags = raw(size, cp.uint64); flags.fill(0)
    epoch = cp.zeros(1, dtype=cp.uint64)
    partial = cp.arange(W, dtype=cp.float64) + 1000 * rank
    peer_rows, peer_slots, peer_flags = share(rows), share(slots), share(flags)
    comm.Barrier()
    for blocks in (8, 32, 66, 132):
        def body(k):
            rows[offs[rank] * R:offs[rank + 1] * R] = rank * 1e6 + k
            kern((blocks,), (256,), (rows, np.int64(offs[rank]), np.int64(counts[rank]), peer_rows,
                 partial, peer_slots, np.int32(size), np.int32(rank), peer_flags, flags, epoch,
                 np.int32(W)), stream=stream)
            advance((1,), (1,), (epoch,), stream=stream)
        # flags count blocks per epoch: all launches of one series use the same block count
        flags.fill(0); epoch.fill(0); cp.cuda.runtime.deviceSynchronize(); comm.Barrier()
        with stream:
            for k in range(20):
                body(k)
        stream.synchronize(); comm.Barrier()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        with stream:
            a.record(stream)
            for k in range(REPS):
                kern((blocks,), (256,), (rows, np.int64(offs[rank]), np.int64(counts[rank]),
                     peer_rows, partial, peer_slots, np.int32(size), np.int32(rank), peer_flags,
                     flags, epoch, np.int32(W)), stream=stream)
                advance((1,), (1,), (epoch,), stream=stream)
            b.record(stream)
        b.synchronize()
        us = cp.cuda.get_elapsed_time(a, b) * 1e3 / REPS
        # check: the last exchange of body() wrote rank*1e6+19; later reps sent the same rows
        ok = all(float(rows[offs[p] * R]) == p * 1e6 + 19 and float(rows[offs[p + 1] * R - 1]) == p * 1e6 + 19
                 for p in range(size))
        allus = comm.gather((us, ok))
        if rank == 0:
            print(f"rows {rows_n} blocks {blocks:4d}:", " ".join(f"{u:7.2f} us ok={o}" for u, o in allus))
        comm.Barrier()
    # the flags are freed with the arrays; close the peers' mappings first
    cp.cuda.runtime.deviceSynchronize(); comm.Barrier()
    for arr in (peer_rows, peer_slots, peer_flags):
        for p, ptr in enumerate(arr.get()):
            if p != rank:
                cp.cuda.runtime.ipcCloseMemHandle(int(ptr))
    comm.Barrier()
