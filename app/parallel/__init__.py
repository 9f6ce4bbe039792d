"""All MPI in hisparse lives here: the world communicator, node-local ranks, root-only work with
collective errors, array scatter/gather that survives messages over 2 GiB, planned collectives
(row all-gather, all-reduce, row gather, halo exchange) that operations compose with their
engines' steps, each a primitive of the run's transport (MPI for host buffers, NCCL for device
buffers: one class each),
job-wide abort, and the walltime stop."""
from ..lazy import lazy_getattr

# Imported on first use (PEP 562): `hisparse run` asks :mod:`._launcher` whether a launcher
# started it before NumPy is imported (hisparse.gpu._warmup).
_WHERE = {}
for _module, _names in (
        ("._mpi", ("CollectiveError", "abort", "all_call", "allgather_arrays", "alltoall_arrays",
                   "alltoall_concatenated",
                   "barrier_asleep", "bcast_arrays", "gather_arrays", "get_world", "isend_array",
                   "min_over_ranks", "node_local", "recv_array_into", "root_call",
                   "scatter_arrays", "wait_requests")),
        ("._launcher", ("guess_local_rank", "launched_by_mpi", "launcher_name")),
        ("._collectives", ("AllReduce", "HaloExchange", "RowAllGather", "RowGather",
                           "all_gather_concatenated", "device_alltoallv", "gather_parts", "is_device_array",
                           "max_over_ranks")),
        ("._transport", ("MpiTransport", "Transport", "make_transport",
                         "open_transport", "resolve_transport",
                         "transport_modules")),
        ("._nccl", ("NcclTransport",)),
        ("._stop", ("STOP_SIGNALS", "SignalGuard", "StopRequest", "agreed_stop",
                    "install_signal_guard",
                    "interrupt_pending", "remove_signal_guard", "signal_guard",
                    "temporary_file"))):
    _WHERE.update(dict.fromkeys(_names, _module))
del _module, _names

__all__ = list(_WHERE)
__getattr__ = lazy_getattr(__name__, _WHERE)
