"""stop 60: why rank 0's compiled-analysis load (Cholesky's warm_up) grows with the rank count
(0.68 s at 1 rank, 0.84-1.09 at 2, 1.23 at 4 on the 2xH200 host). Under mpirun -n N: rank 0
times warm_up(N) while the other ranks either sleep (OTHERS=sleep) or load their own
warm_up(1) at the same time (OTHERS=load, what _own_copy does); prints Numba's threading layer."""
import os
import sys
import time
from mpi4py import MPI

comm = MPI.COMM_WORLD
others = os.environ.get("OTHERS", "load")
comm.Barrier()
start = time.perf_counter()
from hisparse.ops.cholesky.symbolic import warm_up  # noqa: E402
imported = time.perf_counter() - start
if comm.rank == 0:
    took = warm_up(comm.size)
elif others == "load":
    took = warm_up(1)
else:
    time.sleep(1.5)
    took = float("nan")
import numba  # noqa: E402
times = comm.gather((imported, took), root=0)
if comm.rank == 0:
    print(f"n={comm.size} others={others} layer={numba.threading_layer()} "
          f"threads={numba.get_num_threads()} "
          + " ".join(f"r{k}: import {a:.3f} warm {b:.3f}" for k, (a, b) in enumerate(times)),
          flush=True)
