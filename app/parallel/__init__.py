"""MPI plumbing: the world communicator, node-local ranks, root-only work with collective errors,
array scatter/gather that survives messages over 2 GiB, and job-wide abort."""
from ._mpi import (CollectiveError, abort, all_call, allgather_arrays, gather_arrays, get_world, node_local, root_call,
                   scatter_arrays, bcast_arrays)

__all__ = ["CollectiveError", "all_call", "get_world", "node_local", "root_call", "scatter_arrays", "gather_arrays",
           "allgather_arrays", "bcast_arrays", "abort"]
