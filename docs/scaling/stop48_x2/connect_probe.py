"""Where the driver's foreground 'connect' goes at N ranks: each step of opening the NCCL transport, timed."""
import os, time
t = [("start", time.perf_counter())]
def mark(name): t.append((name, time.perf_counter()))
from mpi4py import MPI
comm = MPI.COMM_WORLD; r, p = comm.rank, comm.size
mark("mpi")
import pycuda.driver as cuda
cuda.init(); n = cuda.Device.count()
ctx = cuda.Device(r % n).retain_primary_context(); ctx.push()
mark("cuda")
shared = any(comm.allgather(n < p)); mark("allgather")
import cupy; cupy.cuda.Device(r % n).use(); mark("cupy")
from cupy.cuda import nccl; mark("nccl_import")
os.environ.setdefault("NCCL_MAX_NCHANNELS", "32")
uid = nccl.get_unique_id() if r == 0 else None; mark("uid")
uid = comm.bcast(uid, root=0); mark("bcast")
c = nccl.NcclCommunicator(p, uid, r); mark("init")
from hisparse.parallel._nccl import _connect_pairs
_connect_pairs(nccl, c, p, r); mark("pairs")
steps = " ".join(f"{b[0]} {b[1]-a[1]:.3f}" for a, b in zip(t[:-1], t[1:]))
print(f"rank {r}: {steps}", flush=True)
