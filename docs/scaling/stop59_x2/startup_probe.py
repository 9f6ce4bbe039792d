"""Start-up steps of one process, in the order given on the command line, each with the
process's age after it (from /proc/self/stat): where a rank's start-up goes before hisparse's
first phase. Steps: numpy, mpi (mpi4py's MPI_Init), cuinit (ctypes cuInit), ctx (primary
context of device LOCAL_RANK), pycuda (import + init), cupy (import + a device array),
hisparse (import hisparse.driver), bgcupy / joincupy (cupy's import on a thread, joined). Rank 0 prints; every rank's line with PRINT_ALL=1."""
import os
import sys
import time


def age():
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


marks = [("launch", age())]
local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
for step in sys.argv[1:]:
    t = time.perf_counter()
    if step == "numpy":
        import numpy  # noqa: F401
    elif step == "mpi":
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
    elif step == "cuinit":
        import ctypes
        drv = ctypes.CDLL("libcuda.so.1")
        assert drv.cuInit(0) == 0
    elif step == "ctx":
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        drv.cuDeviceGet(ctypes.byref(dev), local)
        assert drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    elif step == "pycuda":
        import pycuda.driver as cuda
        cuda.init()
    elif step == "cupy":
        import cupy
        cupy.cuda.Device(local).use()
        cupy.zeros(1)
    elif step == "bgcupy":  # cupy imported on a thread while the next steps run
        import threading
        background = threading.Thread(target=lambda: __import__("cupy"))
        background.start()
    elif step == "joincupy":
        background.join()
    elif step == "nccl":
        from cupy.cuda import nccl  # noqa: F401
    elif step == "hisparse":
        import hisparse.driver  # noqa: F401
    marks.append((f"{step}:{time.perf_counter() - t:.3f}", age()))
if rank == 0 or os.environ.get("PRINT_ALL"):
    print(f"rank {rank}: " + "  ".join(f"{name}@{at:.3f}" for name, at in marks), flush=True)
