"""CP-ALS's per-mode exchange at 2+ ranks, by its pieces (CuPy NCCL, CUDA events, 300 reps):
rows of U_n (rank r's share of I_n x 16 fp64) with and without the two small all-reduces."""
import sys
import numpy as np
import cupy as cp
from cupy.cuda import nccl
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None)
nc = nccl.NcclCommunicator(size, uid, rank)
stream = cp.cuda.Stream(non_blocking=True)
R = 16
F64 = nccl.NCCL_FLOAT64
REPS = 300


def timed(name, body):
    for _ in range(20):
        body()
    stream.synchronize(); comm.Barrier()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(stream)
    for _ in range(REPS):
        body()
    b.record(stream); b.synchronize()
    us = cp.cuda.get_elapsed_time(a, b) * 1e3 / REPS
    allus = comm.gather(us)
    if rank == 0:
        print(f"  {name:48s}", " ".join(f"{u:7.2f}" for u in allus), "us")


for rows in (12092, 9184, 28818):
    full = cp.zeros((rows * R,), dtype=cp.float64)
    counts = [rows // size + (r < rows % size) for r in range(size)]
    offs = np.concatenate([[0], np.cumsum(counts)])
    sums = cp.ones(R * R + 1, dtype=cp.float64)
    maxima = cp.ones(R, dtype=cp.float64)
    parts = cp.ones((size, R * R + 1 + R), dtype=cp.float64)
    h = stream.ptr

    def rows_p2p():
        for p in range(size):
            if p == rank:
                continue
            nc.send(full.data.ptr + int(offs[rank] * R * 8), int(counts[rank] * R), F64, p, h)
            nc.recv(full.data.ptr + int(offs[p] * R * 8), int(counts[p] * R), F64, p, h)

    def parts_p2p():
        w = parts.shape[1]
        for p in range(size):
            if p == rank:
                continue
            nc.send(parts.data.ptr + rank * w * 8, w, F64, p, h)
            nc.recv(parts.data.ptr + p * w * 8, w, F64, p, h)

    def today():
        nccl.groupStart()
        nc.allReduce(sums.data.ptr, sums.data.ptr, sums.size, F64, nccl.NCCL_SUM, h)
        nc.allReduce(maxima.data.ptr, maxima.data.ptr, maxima.size, F64, nccl.NCCL_MAX, h)
        rows_p2p()
        nccl.groupEnd()

    def rows_only():
        nccl.groupStart(); rows_p2p(); nccl.groupEnd()

    def rows_and_parts():
        nccl.groupStart(); rows_p2p(); parts_p2p(); nccl.groupEnd()

    def reduces_only():
        nccl.groupStart()
        nc.allReduce(sums.data.ptr, sums.data.ptr, sums.size, F64, nccl.NCCL_SUM, h)
        nc.allReduce(maxima.data.ptr, maxima.data.ptr, maxima.size, F64, nccl.NCCL_MAX, h)
        nccl.groupEnd()

    def one_reduce():
        nc.allReduce(parts.data.ptr, parts.data.ptr, R * R + 1 + R, F64, nccl.NCCL_SUM, h)

    def parts_only():
        nccl.groupStart(); parts_p2p(); nccl.groupEnd()

    eq = max(counts) * R
    padded = cp.zeros(eq * size, dtype=cp.float64)

    def allgather():
        nc.allGather(padded.data.ptr + rank * eq * 8, padded.data.ptr, eq, F64, h)

    if rank == 0:
        print(f"rows {rows} x {R} fp64, {size} ranks, share {counts[0] * R * 8 / 1e6:.2f} MB")
    for name, body in [("group: 2 all-reduces + rows p2p (today)", today),
                       ("group: rows p2p", rows_only),
                       ("group: rows p2p + partials p2p", rows_and_parts),
                       ("group: 2 all-reduces", reduces_only),
                       ("one all-reduce of 273", one_reduce),
                       ("group: partials p2p", parts_only),
                       ("allGather equal shares", allgather)]:
        timed(name, body)
