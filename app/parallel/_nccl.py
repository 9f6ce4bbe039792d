"""The NCCL transport: device buffers GPU to GPU, on the caller's CUDA stream, never touching
host memory (CuPy's NCCL binding, bootstrapped by broadcasting its unique id through mpi4py).
NCCL works on PyCUDA allocations in the same primary context (see ``shared/device/README.md``:
139x the host path for a 537 MB all-gather on 2x H200). Host buffers still go through MPI
(:class:`~._transport.MpiTransport`).

NCCL blocks forever on a dead peer: :meth:`NcclTransport.wait` polls the stream and, past
``timeout`` seconds, aborts the NCCL communicator and raises, so the job ends with one line
instead of hanging.
"""
import os
import threading
import time

import numpy as np

from ..errors import HisparseError
from ._transport import MpiTransport, device_pointer, on_device, stream_handle

#: NCCL channels a communicator may use (NCCL_MAX_NCHANNELS) for ``parallel.nccl_channels:
#: auto``. NCCL connects a pair of ranks on every channel, lazily: at their first send/recv and
#: again at the first all-reduce; fewer channels make those connections cheaper, and 16 keeps
#: the repeats as fast as NCCL's own choice (figures: docs/scaling/README.md, "NCCL's set-up").
AUTO_NCCL_CHANNELS = 16


#: CuPy's NCCL binding, first as its back-end module alone (0.08 s to import on the H200 host),
#: then through CuPy (``cupy.cuda.nccl`` imports all of CuPy first: 0.9 s cold, 0.27 s of a
#: 2-rank start-up), for an installation whose NCCL only CuPy's own preload finds
NCCL_MODULES = ("cupy_backends.cuda.libs.nccl", "cupy.cuda.nccl")
#: the CUDA runtime's bindings, in the same order (the current device of the joining thread)
RUNTIME_MODULES = ("cupy_backends.cuda.api.runtime", "cupy.cuda.runtime")


def _first_importable(names):
    """The first of the modules ``names`` that imports; raises the last one's ImportError."""
    import importlib
    error = None
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            error = exc
    raise error


def _nccl_module():
    try:
        nccl = _first_importable(NCCL_MODULES)
    except ImportError as exc:
        raise HisparseError(f"parallel.transport: nccl needs CuPy with NCCL ({exc}); install "
                            f"the gpu extra or use parallel.transport: mpi") from None
    if not getattr(nccl, "available", True):
        raise HisparseError("parallel.transport: nccl: this CuPy was built without NCCL; use "
                            "parallel.transport: mpi")
    return nccl


def _runtime():
    return _first_importable(RUNTIME_MODULES)


class _NcclGroup:
    def __init__(self, nccl):
        self.nccl = nccl

    def __enter__(self):
        self.nccl.groupStart()
        return self

    def __exit__(self, *exc):
        self.nccl.groupEnd()
        return False


def _current_device():
    """The CUDA runtime's current device on this thread (the GPU the rank is bound to)."""
    return _runtime().getDevice()


def _make_current(device):
    _runtime().setDevice(device)


#: bytes each rank sends every peer in the early connection's exchange: enough for NCCL to
#: use (and so connect) every channel it would use for an operation's exchanges
CONNECT_BYTES = 4 << 20


def _connect_pairs(nccl, communicator, size, rank):
    """One exchange with every peer and one all-reduce on a stream of the calling thread, waited
    for: NCCL connects a pair (and the all-reduce's ring) lazily, at first use, on every channel
    (0.1-1.2 s at 2-4 ranks, more with more channels), which would otherwise land in the
    operation's first exchange; here it runs while the main thread reads the input."""
    runtime = _runtime()  # raw buffers and a stream: CuPy's arrays would import all of CuPy
    count = CONNECT_BYTES // 8
    stream = runtime.streamCreateWithFlags(runtime.streamNonBlocking)
    send = runtime.malloc(CONNECT_BYTES)
    received = runtime.malloc(CONNECT_BYTES * size)
    try:
        runtime.memsetAsync(send, 0, CONNECT_BYTES, stream)
        nccl.groupStart()
        for peer in range(size):
            if peer != rank:
                communicator.send(send, count, nccl.NCCL_FLOAT64, peer, stream)
                communicator.recv(received + peer * CONNECT_BYTES, count, nccl.NCCL_FLOAT64,
                                  peer, stream)
        nccl.groupEnd()
        communicator.allReduce(send, received + rank * CONNECT_BYTES, count, nccl.NCCL_FLOAT64,
                               nccl.NCCL_SUM, stream)
        runtime.streamSynchronize(stream)
    finally:
        runtime.free(send)
        runtime.free(received)
        runtime.streamDestroy(stream)


class _Joining:
    """An NCCL communicator being made on a thread of its own: ``ncclCommInitRank`` waits for
    every rank and sets up its bootstrap and device resources (0.5-1.3 s at 2-4 ranks), time the
    run can spend reading its input instead; with ``connect`` the thread then makes NCCL's
    lazy connections too (:func:`_connect_pairs`). The thread makes the caller's GPU current
    first (the CUDA runtime's current device is per thread) and touches no MPI, so the main
    thread's MPI calls stay the only ones."""

    def __init__(self, nccl, size, uid, rank, connect=False):
        device = _current_device()  # the rank's bound GPU, current on the calling thread
        self._result, self._error = None, None

        def join():
            try:
                _make_current(device)
                communicator = nccl.NcclCommunicator(size, uid, rank)
                if connect and size > 1:
                    _connect_pairs(nccl, communicator, size, rank)
                self._result = communicator
            except BaseException as exc:  # raised again where the communicator is wanted
                self._error = exc

        self._thread = threading.Thread(target=join, name="hisparse-nccl-join", daemon=True)
        self._thread.start()

    def result(self, timeout, rank):
        """The communicator, once every rank has joined; raises what the join raised, or a
        :class:`HisparseError` after ``timeout`` seconds (a peer that never joins)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise HisparseError(f"rank {rank}: the NCCL communicator was not made within "
                                f"{timeout:.0f} s (parallel.timeout_s): a peer rank died or hangs")
        if self._error is not None:
            raise self._error
        return self._result


class NcclTransport(MpiTransport):
    """Device buffers through an NCCL communicator; host buffers through MPI.

    Parameters
    ----------
    comm : mpi4py communicator
    nccl_comm : NcclCommunicator of CuPy's NCCL binding
    timeout : float
        Seconds :meth:`wait` lets an NCCL collective run before it declares a peer dead.
    """

    name = "nccl"
    device = True

    def __init__(self, comm, nccl_comm, timeout=600.0):
        super().__init__(comm, timeout)
        self._comm_or_join = nccl_comm  # a communicator, or a _Joining one
        self._lib = _nccl_module()

    @property
    def nccl(self):
        """The NCCL communicator (waits for a background join to finish)."""
        if isinstance(self._comm_or_join, _Joining):
            joining, self._comm_or_join = self._comm_or_join, None
            self._comm_or_join = joining.result(self.timeout, self.comm.rank)
        return self._comm_or_join

    @nccl.setter
    def nccl(self, value):
        self._comm_or_join = value

    def ready(self):
        self.nccl  # noqa: B018 - the wait is the point

    @classmethod
    def unusable(cls, backend, shared_gpus):
        if backend != "gpu":
            return ("parallel.transport: nccl needs backend: gpu (the CPU backend moves host "
                    "buffers through MPI)")
        if shared_gpus:  # NCCL refuses a communicator with two ranks on one GPU
            return ("parallel.transport: nccl needs one GPU per rank, but ranks of this node "
                    "share a GPU; use parallel.transport: mpi or fewer ranks per node")
        try:
            _nccl_module()
        except HisparseError as exc:
            return str(exc)
        return None

    @classmethod
    def open(cls, comm, settings):
        """Rank 0 makes the unique id and broadcasts it through MPI, then every rank joins the
        NCCL communicator on its bound GPU, its channels limited by ``nccl_channels``
        (:func:`nccl_channel_limit`); in the background (and, with ``connect_early``, making
        NCCL's pair connections there too) when ``background``."""
        nccl = _nccl_module()
        nccl_channel_limit(settings.get("nccl_channels", "auto"))
        uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None, root=0)
        if settings.get("background"):
            communicator = _Joining(nccl, comm.size, uid, comm.rank,
                                    connect=settings.get("connect_early", False))
        else:
            communicator = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        return cls(comm, communicator, settings.get("timeout_s", 600.0))

    def _type(self, dtype):
        nccl = self._lib
        types = {np.dtype(np.float64): nccl.NCCL_FLOAT64, np.dtype(np.float32): nccl.NCCL_FLOAT32,
                 np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.int32): nccl.NCCL_INT32,
                 np.dtype(np.uint8): nccl.NCCL_UINT8}
        try:
            return types[np.dtype(dtype)]
        except KeyError:
            raise HisparseError(f"NCCL transport: no NCCL type for {np.dtype(dtype)}") from None

    def carries(self, dtype):
        try:
            self._type(dtype)
        except HisparseError:
            return False
        return True

    def group(self):
        """Grouped NCCL calls (the send/recv pairs of an exchange, or collectives issued
        together) are one launch."""
        return _NcclGroup(self._lib)

    # -- the primitives on device buffers (host buffers: MPI) --------------------------------
    def all_gatherv(self, buffer, counts, displs, stream=None):
        if not on_device(buffer):
            return super().all_gatherv(buffer, counts, displs, stream)
        # Point-to-point, not one broadcast per owner: every pair of ranks swaps its blocks at
        # once over its own link, where the broadcasts ran one after another.
        rank, size = self.comm.rank, self.comm.size
        return self.exchange(buffer, [counts[rank]] * size, [displs[rank]] * size,
                             buffer, counts, displs, stream)

    def all_reduce(self, buffer, op="sum", stream=None):
        if not on_device(buffer):
            return super().all_reduce(buffer, op, stream)
        if buffer.size:
            ops = {"sum": self._lib.NCCL_SUM, "max": self._lib.NCCL_MAX,
                   "min": self._lib.NCCL_MIN}
            self.nccl.allReduce(device_pointer(buffer), device_pointer(buffer), int(buffer.size),
                                self._type(buffer.dtype), ops[op], stream_handle(stream))
        return buffer

    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                 stream=None):
        if not (on_device(send) or on_device(recv)):
            return super().exchange(send, send_counts, send_displs, recv, recv_counts,
                                    recv_displs, stream)
        kind, handle = self._type(recv.dtype), stream_handle(stream)
        with self.group():
            for peer in range(self.comm.size):
                if peer == self.comm.rank:
                    continue
                if send_counts[peer]:
                    self.nccl.send(device_pointer(send, send_displs[peer]), int(send_counts[peer]),
                                   kind, peer, handle)
                if recv_counts[peer]:
                    self.nccl.recv(device_pointer(recv, recv_displs[peer]), int(recv_counts[peer]),
                                   kind, peer, handle)
        return recv

    # -- waiting and closing ------------------------------------------------------------------
    def _drain(self, stream, start, what):
        deadline = start + self.timeout
        # After SPIN_S, sleep in steps of at most 50 us (a late wake-up costs the repeat that
        # much), bounded by the timeout: a dead peer leaves NCCL kernels waiting forever.
        delay = 0.0
        while not stream.is_done():
            now = time.monotonic()
            if now - start > self.SPIN_S:
                delay = min(max(delay * 2, 1e-5), 5e-5)
                time.sleep(delay)
            if now > deadline:
                self.abort()
                raise HisparseError(f"rank {self.comm.rank}: NCCL {what} did not complete within "
                                    f"{self.timeout:.0f} s (parallel.timeout_s): a peer rank "
                                    f"died or hangs; NCCL communicator aborted")
        error = getattr(self.nccl, "check_async_error", None)
        if error is not None:
            error()

    def describe(self):
        # NCCL's channel limit (parallel.nccl_channels; 0: its own choice)
        return {"transport": self.name, "nccl_max_channels": nccl_channels_in_force()}

    def abort(self):
        """Abort the NCCL communicator (releases ranks blocked in NCCL kernels)."""
        if isinstance(self._comm_or_join, _Joining):  # still joining: nothing to abort yet
            self._comm_or_join = None
        if self.nccl is not None:
            try:
                self.nccl.abort()
            except Exception:  # already torn down; nothing more to release
                pass
            self.nccl = None

    def close(self):
        if isinstance(self._comm_or_join, _Joining):
            try:  # a communicator can only be destroyed once made
                self.ready()
            except Exception:  # the join failed or timed out: nothing to destroy
                self._comm_or_join = None
        if self.nccl is not None:
            try:
                self.nccl.destroy()
            except Exception:
                pass
            self.nccl = None


def nccl_channel_limit(channels):
    """Limit NCCL's channels per communicator (``parallel.nccl_channels``: ``auto`` =
    :data:`AUTO_NCCL_CHANNELS`, 0 = NCCL's own choice) through ``NCCL_MAX_NCHANNELS``, which
    NCCL reads when the process first uses it. A value already in the environment (the user's,
    or one set for an earlier communicator of this process) is kept. Returns the limit in
    force (:func:`nccl_channels_in_force`)."""
    if channels == "auto":
        channels = AUTO_NCCL_CHANNELS
    if int(channels) > 0:
        os.environ.setdefault("NCCL_MAX_NCHANNELS", str(int(channels)))
    return nccl_channels_in_force()


def nccl_channels_for(requested, preferred=None):
    """The ``channels`` of :func:`nccl_channel_limit` for ``parallel.nccl_channels`` =
    ``requested``: under ``auto`` the operation's ``preferred`` count when it has one."""
    return preferred if requested == "auto" and preferred else requested


def nccl_channels_in_force():
    """The NCCL channel limit of this process's environment (0: NCCL's own choice)."""
    limit = os.environ.get("NCCL_MAX_NCHANNELS", "").strip()
    return int(limit) if limit.isdigit() else 0
