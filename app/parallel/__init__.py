"""All MPI in hisparse lives here: the world communicator, node-local ranks, root-only work with
collective errors, array scatter/gather that survives messages over 2 GiB, planned collectives
(row all-gather, all-reduce, row gather) that operations compose with their engines' steps,
job-wide abort, and the walltime stop."""
from ._mpi import (CollectiveError, abort, all_call, allgather_arrays, bcast_arrays,
                   gather_arrays, get_world, node_local, root_call, scatter_arrays)
from ._collectives import AllReduce, RowAllGather, RowGather, gather_parts, max_over_ranks
from ._stop import StopRequest

__all__ = ["get_world", "node_local", "root_call", "all_call", "CollectiveError",
           "scatter_arrays", "gather_arrays", "allgather_arrays", "bcast_arrays", "abort",
           "StopRequest", "AllReduce", "RowAllGather", "RowGather", "gather_parts",
           "max_over_ranks"]
