"""Transports: how the planned collectives move bytes between ranks.

:class:`Transport` is the interface: a handful of primitives that the planned collectives
(:mod:`._collectives`) call, one each -- an in-place all-gather of blocks (``all_gatherv``), an
in-place reduction (``all_reduce``), a grouped point-to-point exchange with the other ranks
(``exchange``) -- plus ``group``, ``wait`` and ``close``. Each transport is one class:

- :class:`MpiTransport` moves host (NumPy) buffers through MPI: the CPU backend, or a GPU run
  where no device transport is available or ``parallel.transport: mpi``. A device buffer handed
  to it is staged through host memory (download, MPI, upload).
- :class:`~._nccl.NcclTransport` moves device buffers GPU to GPU on the caller's CUDA stream
  (host buffers still go through MPI), with a bounded wait that aborts on a dead peer.

Adding a transport (CUDA-aware MPI, NVSHMEM) is one class implementing the primitives and one
entry in :func:`_classes`.
"""
import contextlib
import time
from abc import ABC, abstractmethod

import numpy as np

from ..arrays import is_cupy_array, is_device_array
from ..errors import HisparseError


def _mpi_type(dtype):
    from mpi4py import MPI
    return MPI._typedict[np.dtype(dtype).char]


def _mpi_op(op):
    from mpi4py import MPI
    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def on_device(array):
    """Whether ``array`` lives on the GPU (a PyCUDA GPUArray or a CuPy array)."""
    return array is not None and (is_device_array(array) or is_cupy_array(array))


def device_pointer(array, offset_elements=0):
    """The device address of element ``offset_elements`` of a PyCUDA or CuPy array."""
    base = int(array.gpudata) if is_device_array(array) else int(array.data.ptr)
    return base + int(offset_elements) * array.dtype.itemsize


def stream_handle(stream):
    """The CUDA stream handle of a PyCUDA stream (or :func:`cupy_stream`); 0 for the default."""
    return 0 if stream is None else stream.handle


class _CupyStream:
    """A CuPy stream seen as the PyCUDA stream the transports poll and synchronise."""

    def __init__(self, stream):
        self.stream, self.handle = stream, stream.ptr

    def is_done(self):
        return self.stream.done

    def synchronize(self):
        self.stream.synchronize()


def cupy_stream():
    """CuPy's current stream (where CuPy-array collectives run), as the transports take it."""
    import cupy
    return _CupyStream(cupy.cuda.get_current_stream())


def _without_self(counts, rank):
    """``counts`` as a list of ints with this rank's own entry 0: an exchange is with the other
    ranks only (the caller places its own part)."""
    counts = [int(c) for c in counts]
    counts[rank] = 0
    return counts


class Transport(ABC):
    """One run's transport: the MPI communicator every transport has (object collectives, host
    buffers), and the primitives the planned collectives call.

    Counts and displacements are in elements of the buffer's dtype. Calls with device buffers
    are issued on ``stream`` (a PyCUDA stream, or :func:`cupy_stream`); :meth:`wait` is where the
    host waits for them.

    Parameters
    ----------
    comm : mpi4py communicator
    timeout : float
        Seconds :meth:`wait` lets a device collective run before it declares a peer dead
        (``parallel.timeout_s``).
    """

    #: the ``parallel.transport`` value this class is chosen by (and the results file records)
    name = None
    #: whether device buffers move GPU to GPU (an operation may then leave them on the device)
    device = False
    SPIN_S = 0.05

    def __init__(self, comm, timeout=600.0):
        self.comm = comm
        self.timeout = float(timeout)

    @classmethod
    def unusable(cls, backend, shared_gpus):
        """Why this transport cannot serve a run of ``backend`` (a message), or None."""
        return None

    @classmethod
    def open(cls, comm, settings):
        """The run's transport of this class (*collective*); ``settings``: the ``parallel``
        section of the config."""
        return cls(comm, settings.get("timeout_s", 600.0))

    # -- the primitives ---------------------------------------------------------------------
    @abstractmethod
    def all_gatherv(self, buffer, counts, displs, stream=None):
        """In place: rank r's ``counts[r]`` elements at ``displs[r]`` of the flat ``buffer``
        (C-contiguous) land at the same place on every rank. Returns ``buffer``."""

    @abstractmethod
    def all_reduce(self, buffer, op="sum", stream=None):
        """In place: ``buffer`` (contiguous) reduced elementwise over the ranks with ``op``
        (``sum``, ``max`` or ``min``). Returns ``buffer``."""

    @abstractmethod
    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                 stream=None):
        """Grouped point-to-point exchange with the other ranks (a personalised all-to-all):
        ``send_counts[p]`` elements from ``send_displs[p]`` of ``send`` go to rank ``p``, and
        ``recv_counts[p]`` elements from rank ``p`` land at ``recv_displs[p]`` of ``recv``. This
        rank's own pair is not moved (the caller places its own part). ``send`` may be None
        where it sends nothing. Returns ``recv``."""

    def reduce_number(self, value, op="sum"):
        """One Python number reduced over the ranks (through MPI: a scalar is not worth a device
        round trip)."""
        return self.comm.allreduce(value, op=_mpi_op(op))

    def carries(self, dtype):
        """Whether device buffers of ``dtype`` move GPU to GPU on this transport."""
        return False

    def group(self):
        """Context manager around calls issued together (one launch on a device transport);
        nothing where calls complete one by one."""
        return contextlib.nullcontext()

    # -- waiting and closing ------------------------------------------------------------------
    def wait(self, stream, what="collective"):
        """Wait for ``stream`` (PyCUDA, or :func:`cupy_stream`) to drain."""
        if stream is None:
            import pycuda.driver as cuda
            cuda.Context.synchronize()
            return
        start = time.monotonic()
        # Spin first: work of a few hundred microseconds must not pay a sleep's (or a blocking
        # synchronize's) wake-up latency.
        while time.monotonic() - start < self.SPIN_S and not stream.is_done():
            pass
        self._drain(stream, start, what)

    def _drain(self, stream, start, what):
        """The rest of :meth:`wait` after its spin."""
        stream.synchronize()

    def ready(self):
        """Wait until the transport can move data (a device transport may still be connecting
        in the background, :meth:`open` with ``background``); immediate here."""

    def describe(self):
        """Attributes of the results file that say how this run's collectives moved data."""
        return {"transport": self.name}

    def abort(self):
        """Release ranks blocked in this transport's device collectives (nothing to release
        here)."""

    def close(self):
        """Free what the transport holds (nothing here)."""


class MpiTransport(Transport):
    """Host buffers through MPI; device buffers staged through host memory."""

    name = "mpi"

    def all_gatherv(self, buffer, counts, displs, stream=None):
        if on_device(buffer):
            return self._staged(buffer, stream, lambda host: self.all_gatherv(host, counts, displs))
        from mpi4py import MPI
        spec = ([int(c) for c in counts], [int(d) for d in displs])
        self.comm.Allgatherv(MPI.IN_PLACE, [buffer.reshape(-1), spec, _mpi_type(buffer.dtype)])
        return buffer

    def all_reduce(self, buffer, op="sum", stream=None):
        if on_device(buffer):
            return self._staged(buffer, stream, lambda host: self.all_reduce(host, op))
        from mpi4py import MPI
        self.comm.Allreduce(MPI.IN_PLACE, [buffer, _mpi_type(buffer.dtype)], op=_mpi_op(op))
        return buffer

    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                 stream=None):
        rank = self.comm.rank
        send_counts = _without_self(send_counts, rank)
        recv_counts = _without_self(recv_counts, rank)
        spec_send = (send_counts, [int(d) for d in send_displs])
        spec_recv = (recv_counts, [int(d) for d in recv_displs])
        if not (on_device(send) or on_device(recv)):
            self._alltoallv(send, spec_send, recv, spec_recv)
            return recv
        if stream is not None:
            stream.synchronize()
        host_send = np.zeros(0, recv.dtype) if send is None or not send.size else \
            (send.get() if on_device(send) else send)
        # Parts of recv that no peer fills keep their contents (its own part, say).
        gaps = sum(recv_counts) < recv.size
        host_recv = recv.get() if gaps else np.empty(recv.shape, recv.dtype)
        self._alltoallv(host_send, spec_send, host_recv, spec_recv)
        if recv.size:
            recv.set(host_recv)
        return recv

    def _alltoallv(self, send, spec_send, recv, spec_recv):
        kind = _mpi_type(recv.dtype)
        self.comm.Alltoallv([np.ascontiguousarray(send), spec_send, kind], [recv, spec_recv, kind])

    @staticmethod
    def _staged(buffer, stream, host_call):
        """A device buffer through host memory: download, ``host_call(host)``, upload."""
        if stream is not None:
            stream.synchronize()
        host = buffer.get()
        host_call(host)
        buffer.set(host)
        return buffer


def _classes():
    """``parallel.transport`` value -> transport class (``auto`` tries them in this order
    before MPI)."""
    from ._nccl import NcclTransport
    return {"nccl": NcclTransport, "mpi": MpiTransport}


def _host_only(requested, size, device_collectives):
    """Whether ``parallel.transport: requested`` is MPI whatever the machine has: asked for, or
    ``auto`` on one rank or for an operation whose collectives all move host buffers."""
    return requested == "mpi" or (requested == "auto" and (size == 1 or not device_collectives))


def resolve_transport(requested, backend, size, shared_gpus=False, device_collectives=True):
    """The ``parallel.transport`` to use for ``requested`` (auto: the first device transport
    that can serve a multi-rank GPU run of an operation that moves device buffers between
    ranks, else MPI).

    ``shared_gpus``: some ranks of a node share a GPU (more local ranks than visible GPUs).
    ``device_collectives``: the operation's :attr:`~hisparse.ops.Operation.DEVICE_COLLECTIVES`;
    without them auto picks MPI, whose set-up is free (a device communicator costs its
    creation and connections).
    """
    if _host_only(requested, size, device_collectives):
        return "mpi"
    classes = _classes()
    if requested != "auto":
        reason = classes[requested].unusable(backend, shared_gpus)
        if reason:
            raise HisparseError(reason)
        return requested
    return next((name for name, cls in classes.items()
                 if cls.device and not cls.unusable(backend, shared_gpus)), "mpi")


def transport_modules(requested, backend, size, device_collectives=True):
    """Names of the modules the run's transport will import when it is opened (CuPy's NCCL
    binding, where ``requested`` may resolve to NCCL: a GPU run of several ranks whose operation
    moves device buffers), for the driver to import while CUDA initialises in the background;
    otherwise the import lands in ``connect``. The binding's own module (:data:`NCCL_MODULES`'
    first), not CuPy's ``cupy.cuda.nccl``, which imports all of CuPy (0.27 s of a 2-rank
    start-up on 2xH200, against 0.08 s).
    Only a hint, like :meth:`~hisparse.ops.Operation.modules_for_setup`: ``open_transport``
    decides the transport and reports what is missing."""
    if backend != "gpu" or _host_only(requested, size, device_collectives):
        return ()
    from ._nccl import NCCL_MODULES
    return NCCL_MODULES[:1]


def make_transport(comm, kind, timeout=600.0, channels="auto", background=False,
                   connect_early=False):
    """The :class:`Transport` of ``kind`` (*collective*); ``channels``: a device transport's
    connection channels (``parallel.nccl_channels``, already resolved for the operation);
    ``background``: a device transport connects on a thread of its own while the caller goes
    on (:meth:`Transport.ready` waits for it; its first collective does too), and with
    ``connect_early`` also makes the connections to every peer there, which it would otherwise
    make at its first exchange."""
    return _classes()[kind].open(comm, {"timeout_s": timeout, "nccl_channels": channels,
                                        "background": background,
                                        "connect_early": connect_early})


def _bound_gpu():
    """The PCI bus id of the GPU this rank is bound to (its current context's device), or
    ``None`` where no context is current."""
    import pycuda.driver as cuda
    try:
        return cuda.Context.get_device().pci_bus_id()
    except cuda.Error:
        return None


def shares_a_gpu(local_comm, bound=_bound_gpu):
    """Whether two ranks of this node are bound to one GPU (*collective* over ``local_comm``):
    their devices' PCI bus ids compared. A launcher that shows each rank its own GPU alone
    (Slurm's ``--gpus-per-task=1``, a per-rank ``CUDA_VISIBLE_DEVICES``) gives every rank
    ordinal 0 of one visible device: counting the visible devices against the node's ranks took
    that for sharing and ran the device collectives through MPI. Without a current context
    (``bound`` answers ``None``), that count decides."""
    mine = bound()
    ids = local_comm.allgather(mine)
    if any(bus is None for bus in ids):
        import pycuda.driver as cuda
        return cuda.Device.count() < local_comm.size
    return len(set(ids)) < len(ids)


def open_transport(comm, local_comm, backend, settings, operation, background=False):
    """The run's transport for the ``parallel`` config section ``settings`` (*collective*):
    resolved the same on every rank (or some would wait in a device transport's set-up
    forever), then made. ``operation``: the operation class (whether its collectives move
    device buffers, and the channels it prefers); ``background``: see :func:`make_transport`."""
    shared = shares_a_gpu(local_comm) if backend == "gpu" else False
    shared = any(comm.allgather(shared)) if comm.size > 1 else shared
    kind = resolve_transport(settings["transport"], backend, comm.size, shared,
                             operation.DEVICE_COLLECTIVES)
    from ._nccl import nccl_channels_for
    channels = nccl_channels_for(settings["nccl_channels"], operation.NCCL_CHANNELS)
    early = settings["connect_early"]
    if early == "auto":
        # One node's ranks only (every rank's node holds the whole world, or none does): the
        # early connections join every pair of ranks (NCCL's buffers for each peer and channel
        # on every GPU), where across nodes an operation's exchanges may reach a few neighbours.
        early = operation.CONNECT_EARLY and local_comm.size == comm.size
    return make_transport(comm, kind, settings["timeout_s"], channels, background, bool(early))


def as_transport(comm_or_transport):
    """Collectives accept a :class:`Transport` or a bare MPI communicator (host buffers)."""
    if isinstance(comm_or_transport, Transport):
        return comm_or_transport
    return MpiTransport(comm_or_transport)
