"""Transports: how the planned collectives move bytes.

- :class:`Transport` with ``nccl=None`` moves host (NumPy) buffers through MPI: the CPU backend,
  or a GPU run where NCCL is missing or ``parallel.transport: mpi``. A device buffer handed to it
  is staged through host memory (download, MPI, upload).
- With an NCCL communicator (CuPy's ``cupy.cuda.nccl``, bootstrapped by broadcasting its unique
  id through mpi4py) device buffers move GPU to GPU, on the caller's CUDA stream, never touching
  host memory. NCCL works on PyCUDA allocations in the same primary context (see
  ``shared/device/README.md``: 139x the host path for a 537 MB all-gather on 2x H200).

NCCL blocks forever on a dead peer. :meth:`Transport.wait` replaces a plain stream
synchronisation after collectives: it polls the stream and, past ``timeout`` seconds, aborts the
NCCL communicator and raises, so the job ends with one line instead of hanging.
"""
import contextlib
import os
import time

import numpy as np

from ..errors import HisparseError

TRANSPORTS = ("auto", "nccl", "mpi")
#: NCCL channels a communicator may use (NCCL_MAX_NCHANNELS) for ``parallel.nccl_channels:
#: auto``. NCCL connects a pair of ranks on every channel, lazily: at their first send/recv and
#: again at the first all-reduce. With NCCL's own choice on 2x H200 (NCCL 2.28) those took
#: 1.21 s and 0.92 s after a 0.53 s creation; with 4 channels 0.16 s and 0.16 s. In the
#: operations (2 ranks, no warm-up; docs/scaling/README.md, "NCCL's set-up"): CP-ALS 20M time
#: to solution 3.7-3.9 s with NCCL's choice, 2.6-2.9 s with 16, 1.9-2.8 s with 8, 2.2-2.8 s
#: with 4; its time per repeat 11.6-11.8 / 11.66-11.71 / 11.88-11.95 / 12.42-12.44 ms. SpMV
#: 160^3: 4.3-4.8 / 3.3-3.4 / 2.7-3.1 / 2.9-3.5 s, its repeats unchanged. 16 keeps the repeats
#: as fast as NCCL's choice; 8 and 4 trade them for set-up.
AUTO_NCCL_CHANNELS = 16


def _nccl_module():
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise HisparseError(f"parallel.transport: nccl needs CuPy with NCCL ({exc}); install "
                            f"the gpu extra or use parallel.transport: mpi") from None
    if not getattr(nccl, "available", True):
        raise HisparseError("parallel.transport: nccl: this CuPy was built without NCCL; use "
                            "parallel.transport: mpi")
    return nccl


def nccl_available():
    """Whether CuPy's NCCL binding imports here."""
    try:
        _nccl_module()
        return True
    except HisparseError:
        return False


class Transport:
    """One run's transport: the MPI communicator and, for device buffers, an NCCL communicator.

    Parameters
    ----------
    comm : mpi4py communicator
    nccl_comm : cupy.cuda.nccl.NcclCommunicator or None
    timeout : float
        Seconds :meth:`wait` lets an NCCL collective run before it declares a peer dead.
    """

    SPIN_S = 0.05

    def __init__(self, comm, nccl_comm=None, timeout=600.0):
        self.comm = comm
        self.nccl = nccl_comm
        self.timeout = float(timeout)
        self._nccl_mod = _nccl_module() if nccl_comm is not None else None

    @property
    def name(self):
        return "nccl" if self.nccl is not None else "mpi"

    @property
    def device(self):
        """Device buffers move GPU to GPU (NCCL)."""
        return self.nccl is not None

    # -- NCCL primitives (device pointers as ints, counts in elements) ----------------------
    def nccl_type(self, dtype):
        nccl = self._nccl_mod
        types = {np.dtype(np.float64): nccl.NCCL_FLOAT64, np.dtype(np.float32): nccl.NCCL_FLOAT32,
                 np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.int32): nccl.NCCL_INT32,
                 np.dtype(np.uint8): nccl.NCCL_UINT8}
        try:
            return types[np.dtype(dtype)]
        except KeyError:
            raise HisparseError(f"NCCL transport: no NCCL type for {np.dtype(dtype)}") from None

    def nccl_op(self, op):
        nccl = self._nccl_mod
        return {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[op]

    def group(self):
        """Context manager around grouped NCCL calls (send/recv pairs of an all-to-all, or
        collectives issued together as one launch); nothing on the MPI transport, whose calls
        complete one by one."""
        if self.nccl is None:
            return contextlib.nullcontext()
        return _NcclGroup(self._nccl_mod)

    @staticmethod
    def stream_handle(stream):
        return 0 if stream is None else stream.handle

    def wait(self, stream, what="collective"):
        """Wait for ``stream`` (PyCUDA) to drain; with NCCL, bounded by :attr:`timeout`."""
        if stream is None:
            import pycuda.driver as cuda
            cuda.Context.synchronize()
            return
        start = time.monotonic()
        # Spin first: work of a few hundred microseconds must not pay a sleep's (or a blocking
        # synchronize's) wake-up latency.
        while time.monotonic() - start < self.SPIN_S and not stream.is_done():
            pass
        if self.nccl is None:
            stream.synchronize()
            return
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

    def wait_cupy(self, what="collective"):
        """:meth:`wait` for CuPy's current stream (where CuPy-array collectives run)."""
        import cupy
        stream = cupy.cuda.get_current_stream()
        self.wait(_CupyStream(stream), what)

    def abort(self):
        """Abort the NCCL communicator (releases ranks blocked in NCCL kernels)."""
        if self.nccl is not None:
            try:
                self.nccl.abort()
            except Exception:  # already torn down; nothing more to release
                pass
            self.nccl = None

    def close(self):
        if self.nccl is not None:
            try:
                self.nccl.destroy()
            except Exception:
                pass
            self.nccl = None


class _CupyStream:
    """A CuPy stream seen as the PyCUDA stream :meth:`Transport.wait` polls."""

    def __init__(self, stream):
        self.stream, self.handle = stream, stream.ptr

    def is_done(self):
        return self.stream.done

    def synchronize(self):
        self.stream.synchronize()


class _NcclGroup:
    def __init__(self, nccl):
        self.nccl = nccl

    def __enter__(self):
        self.nccl.groupStart()
        return self

    def __exit__(self, *exc):
        self.nccl.groupEnd()
        return False


def resolve_transport(requested, backend, size, shared_gpus=False, device_collectives=True):
    """``"nccl"`` or ``"mpi"`` for ``parallel.transport`` (auto: NCCL for a multi-rank GPU run
    of an operation that moves device buffers between ranks, when CuPy's NCCL imports and every
    rank has a GPU of its own, else MPI).

    ``shared_gpus``: some ranks of a node share a GPU (more local ranks than visible GPUs), which
    NCCL refuses ("duplicate GPU"); auto then picks MPI and an explicit ``nccl`` is an error.
    ``device_collectives``: the operation's :attr:`~hisparse.ops.Operation.DEVICE_COLLECTIVES`;
    without them auto picks MPI, whose set-up is free (an NCCL communicator costs 0.5-0.7 s to
    make at 2 ranks on 2x H200, the connections more).
    """
    if requested == "mpi" or (requested == "auto" and (size == 1 or not device_collectives)):
        return "mpi"
    if requested == "nccl":
        if backend != "gpu":
            raise HisparseError("parallel.transport: nccl needs backend: gpu (the CPU backend "
                                "moves host buffers through MPI)")
        if shared_gpus:
            raise HisparseError("parallel.transport: nccl needs one GPU per rank, but ranks of "
                                "this node share a GPU; use parallel.transport: mpi or fewer "
                                "ranks per node")
        _nccl_module()
        return "nccl"
    return "nccl" if backend == "gpu" and not shared_gpus and nccl_available() else "mpi"


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


def make_transport(comm, kind, timeout=600.0, channels="auto"):
    """The run's :class:`Transport` (*collective*): for ``"nccl"`` rank 0 makes the unique id and
    broadcasts it through MPI, then every rank joins the NCCL communicator on its bound GPU,
    with its channels limited by ``channels`` (:func:`nccl_channel_limit`)."""
    if kind != "nccl":
        return Transport(comm, None, timeout)
    nccl = _nccl_module()
    nccl_channel_limit(channels)
    uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None, root=0)
    return Transport(comm, nccl.NcclCommunicator(comm.size, uid, comm.rank), timeout)


def as_transport(comm_or_transport):
    """Collectives accept a :class:`Transport` or a bare MPI communicator (host buffers)."""
    if isinstance(comm_or_transport, Transport):
        return comm_or_transport
    return Transport(comm_or_transport, None)
