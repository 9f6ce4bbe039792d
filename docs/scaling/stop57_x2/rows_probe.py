"""Stop 57: where the read of R-MAT's rows made on the GPU goes (one process per GPU: run it
under mpirun -n 1 or 2). Each step of generate_row_part's device path timed on its own (with
the device synchronised), three times, then the whole generate_row_part and the cast."""
import sys
import time

import numpy as np

from hisparse import generators
from hisparse.gpu import bind_device, device_rmat_unit_rows, import_cupy
from hisparse.layout import cast_row_part, generate_row_part
from hisparse.parallel import get_world, node_local

scale = int(sys.argv[1]) if len(sys.argv) > 1 else 23
comm = get_world()
device = bind_device(node_local(comm).rank)
cupy = import_cupy("probe")
params = {"scale": scale, "edge_factor": 16, "a": 0.57, "b": 0.19, "c": 0.19, "seed": 0,
          "symmetric": False}


def timed(label, step):
    cupy.cuda.get_current_stream().synchronize()
    began = time.perf_counter()
    out = step()
    cupy.cuda.get_current_stream().synchronize()
    print(f"[rank {comm.rank}] {label:34s} {time.perf_counter() - began:7.3f} s", flush=True)
    return out


for trial in range(3):
    n, nedges, blocks, _, _ = generators._rmat_span(scale, 16, None)
    table = timed("block table (host)", lambda: generators.rmat_block_table(scale, 16, 0, blocks))
    perm = timed("permutation (host)", lambda: generators._permutation(n, 0))
    indptr, columns = timed("keys, sort, entries (device)", lambda: device_rmat_unit_rows(
        cupy, table, nedges, generators.RMAT_EDGE_BLOCK, scale, (0.57, 0.76, 0.95), perm, False))
    half = len(columns) // max(comm.size, 1)
    timed("download of 1/size of the columns", lambda: columns[:half].get())
    del columns
    timed("release pool", generators.RmatRowsOnDevice.release)
spec = {"kind": "rmat", "scale": scale, "edge_factor": 16, "seed": 0}


class Ctx:  # what generate_row_part asks of a GPU run's context: nothing (it is passed on)
    pass


for trial in range(2):
    comm.Barrier()
    began = time.perf_counter()
    part = generate_row_part(comm, spec, "nnz_balanced", device=Ctx())
    made = time.perf_counter() - began
    part = cast_row_part(comm, part, np.float64, "auto", "probe", "fp64")
    print(f"[rank {comm.rank}] generate_row_part {made:.3f} s, + cast {time.perf_counter() - began - made:.3f} s "
          f"(nnz {part.nnz}, rows {len(part.rows)})", flush=True)
device.release()
