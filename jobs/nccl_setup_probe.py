"""Where NCCL's set-up time goes on this machine: the communicator's creation, the first
send/recv between ranks (NCCL connects a pair lazily, on every channel it may use), the first
all-reduce (its own connections), and the second of each. For choosing
``parallel.nccl_channels`` on a new cluster (docs/scaling/README.md, "NCCL's set-up").

    mpirun -n 2 python jobs/nccl_setup_probe.py                     # NCCL's own channel count
    NCCL_MAX_NCHANNELS=16 mpirun -n 2 python jobs/nccl_setup_probe.py

One rank per GPU of a node (ranks bound round-robin to the visible GPUs). Prints, on rank 0,
the milliseconds of each step (every rank waits at a barrier before and after it).
"""
import os
import time


def main():
    from mpi4py import MPI
    import pycuda.driver as cuda
    cuda.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    ordinal = rank % cuda.Device.count()
    context = cuda.Device(ordinal).retain_primary_context()
    context.push()
    try:
        import cupy
        from cupy.cuda import nccl
        cupy.cuda.Device(ordinal).use()
        stream = cuda.Stream()
        source, target = cuda.mem_alloc(8 << 20), cuda.mem_alloc(8 << 20)
        made = {}

        def timed(label, step):
            comm.Barrier()
            start = time.perf_counter()
            step()
            stream.synchronize()
            comm.Barrier()
            if rank == 0:
                print(f"  {label:24s} {1e3 * (time.perf_counter() - start):9.1f} ms", flush=True)

        def create():
            uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
            made["comm"] = nccl.NcclCommunicator(size, uid, rank)

        def send_recv(count=1 << 10):
            peer_to, peer_from = (rank + 1) % size, (rank - 1) % size
            nccl.groupStart()
            made["comm"].send(int(source), count, nccl.NCCL_FLOAT64, peer_to, stream.handle)
            made["comm"].recv(int(target), count, nccl.NCCL_FLOAT64, peer_from, stream.handle)
            nccl.groupEnd()

        def all_reduce():
            made["comm"].allReduce(int(source), int(target), 1 << 10, nccl.NCCL_FLOAT64,
                                   nccl.NCCL_SUM, stream.handle)

        if rank == 0:
            limits = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
            print(f"{size} ranks, NCCL {nccl.get_version()}, environment {limits}", flush=True)
        timed("create communicator", create)
        timed("first send/recv", send_recv)
        timed("second send/recv", send_recv)
        timed("first all-reduce", all_reduce)
        timed("second all-reduce", all_reduce)
        timed("send/recv of 8 MB", lambda: send_recv(1 << 20))
        made["comm"].destroy()
    finally:
        context.pop()


if __name__ == "__main__":
    main()
