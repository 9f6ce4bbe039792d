"""stop 59: where R-MAT's read goes on a GPU (one process, no MPI): the host's block table and
vertex permutation, the device's whole unit rows (RmatRowsOnDevice.make, by CUDA-synchronised
steps where the probe can see them), this rank's columns to the host (download) and the unit
values (fill_into). argv: scale [ranks]: the part of rank 0 of `ranks` (nnz-balanced)."""
import sys
import time

import numpy as np

from hisparse import generators
from hisparse.generators import _permutation, _rmat_span, rmat_block_table
from hisparse.partition import nnz_balanced_blocks
from hisparse.threads import fill_into

scale = int(sys.argv[1])
ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 1
import cupy  # noqa: E402
cupy.zeros(1)
spec = generators.validate_spec({"kind": "rmat", "scale": scale, "edge_factor": 16, "seed": 0})
whole = generators.part_source(spec).whole_on_device
for attempt in range(2):
    marks = [("start", time.perf_counter())]

    def mark(label):
        cupy.cuda.Device().synchronize()
        marks.append((label, time.perf_counter()))
    n, nedges, blocks, _, _ = _rmat_span(scale, 16, None)
    rmat_block_table(scale, 16, 0, blocks)
    mark("block_table")
    _permutation(n, 0)
    mark("permutation")
    indptr, columns = whole.make()
    mark("make")
    bounds = nnz_balanced_blocks(indptr, ranks)
    first, last = int(indptr[bounds[0]]), int(indptr[bounds[1]])
    mine = whole.download(columns, first, last, np.int32)
    mark("download")
    del columns
    whole.release()
    mark("release")
    values = fill_into(np.empty(last - first), 1.0)
    mark("fill_ones")
    print(f"attempt {attempt} nnz {indptr[-1]} mine {last - first}: " + "  ".join(
        f"{label} {b - a:.3f}" for (_, a), (label, b) in zip(marks, marks[1:])), flush=True)
    del mine, values
