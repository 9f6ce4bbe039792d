"""Time generate_row_part's steps for R-MAT per rank (mpirun -n N python gen_probe.py SCALE)."""
import sys, time
import numpy as np
from mpi4py import MPI
from hisparse import generators
from hisparse.layout._rows import (redistribute_rows, _owners, rows_of_rank, equal_blocks,
                                   group_by_owner, share_of)
from hisparse.parallel import alltoall_concatenated
from hisparse import threads
comm = MPI.COMM_WORLD
threads.share_node(comm)
scale = int(sys.argv[1])
spec = generators.validate_spec({"kind": "rmat", "scale": scale, "edge_factor": 16, "seed": 0})
source = generators.part_source(spec)
nrows, ncols = source.shape
size, rank = comm.size, comm.rank
comm.Barrier()
t = [time.perf_counter()]
blocks = range(*share_of(source.nblocks, rank, size))
src, dst = source.edges(blocks); t.append(time.perf_counter())
bounds = equal_blocks(nrows, size)
if size > 1:
    if len(sys.argv) > 2:
        order, cuts = group_by_owner(_owners("row_blocks", bounds, src, size), size)
        src, dst = src[order], dst[order]
    else:
        from hisparse.partition import group_pairs
        src, dst, cuts = group_pairs(src, dst, bounds, size)
    t.append(time.perf_counter())
    received, _ = alltoall_concatenated(comm, [{"src": src[cuts[d]:cuts[d + 1]], "dst": dst[cuts[d]:cuts[d + 1]]} for d in range(size)])
    t.append(time.perf_counter())
    src, dst = received["src"], received["dst"]
    del received
else:
    t.append(t[-1]); t.append(t[-1])
t.append(time.perf_counter())
rows = rows_of_rank("row_blocks", bounds, nrows, rank, size)
block = generators.unit_rows(src, dst, rows, ncols); t.append(time.perf_counter())
del src, dst
part = redistribute_rows(comm, int(bounds[rank]), block, source.shape, "nnz_balanced", source.symmetric)
t.append(time.perf_counter())
names = ["edges", "group", "alltoall", "concat", "unit_rows", "balance"]
print(f"rank {rank}/{size} scale {scale} cores {threads.usable_cores()}:",
      " ".join(f"{n} {b - a:.3f}" for n, a, b in zip(names, t, t[1:])), f"total {t[-1]-t[0]:.3f} nnz {part.local_nnz}", flush=True)
