"""All MPI in hisparse lives here: the world communicator, node-local ranks, root-only work with
collective errors, array scatter/gather that survives messages over 2 GiB, planned collectives
(row all-gather, all-reduce, row gather, halo exchange) that operations compose with their
engines' steps, on host buffers through MPI or device buffers through NCCL (transports),
job-wide abort, and the walltime stop."""
from ._mpi import (CollectiveError, abort, all_call, allgather_arrays, alltoall_arrays,
                   bcast_arrays, gather_arrays, get_world, node_local, root_call, scatter_arrays)
from ._collectives import (AllReduce, HaloExchange, RowAllGather, RowGather, device_alltoallv,
                           gather_parts, is_device_array, max_over_ranks)
from ._transport import (TRANSPORTS, Transport, make_transport, nccl_channels_for,
                         nccl_channels_in_force, resolve_transport)
from ._stop import (STOP_SIGNALS, SignalGuard, StopRequest, install_signal_guard,
                    interrupt_pending, remove_signal_guard, signal_guard, temporary_file)

__all__ = ["get_world", "node_local", "root_call", "all_call", "CollectiveError",
           "scatter_arrays", "gather_arrays", "allgather_arrays", "alltoall_arrays",
           "bcast_arrays", "abort", "StopRequest", "SignalGuard", "STOP_SIGNALS",
           "install_signal_guard", "signal_guard",
           "remove_signal_guard", "temporary_file", "interrupt_pending", "AllReduce",
           "HaloExchange", "RowAllGather", "RowGather", "device_alltoallv", "gather_parts",
           "is_device_array", "max_over_ranks", "TRANSPORTS", "Transport", "make_transport",
           "nccl_channels_for", "nccl_channels_in_force", "resolve_transport"]
