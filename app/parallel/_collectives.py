"""Planned collectives: each is set up once from the layout of the data (who owns which rows),
then every call is one collective on arrays of that layout (as mpi4py-fft plans its transfers).

Engines never see a communicator; an operation's ``run_once`` composes engine steps with these
objects. Each takes a :class:`~hisparse.parallel.Transport` (or a bare MPI communicator) and is
called with either a NumPy array (moved through MPI) or a PyCUDA ``GPUArray`` (moved GPU to GPU
through NCCL on the given stream when the transport has NCCL, else staged through host memory).
"""
import numpy as np

from ..arrays import is_device_array
from ._mpi import gather_arrays
from ._transport import as_transport


def _mpi_type(dtype):
    from mpi4py import MPI
    return MPI._typedict[np.dtype(dtype).char]


def _ptr(array, offset_elements=0):
    return int(array.gpudata) + int(offset_elements) * array.dtype.itemsize


def _peer_exchange(transport, kind, handle, transfers):
    """One NCCL group of point-to-point transfers with the other ranks, on stream ``handle``:
    ``transfers`` yields ``(peer, send pointer, send elements, receive pointer, receive
    elements)`` (pointers may be anything where the count is 0: those transfers are left out).
    The one loop of every NCCL all-to-all here (row all-gather, halo exchange, routing)."""
    nccl = transport.nccl
    with transport.group():
        for peer, send_ptr, sends, recv_ptr, receives in transfers:
            if sends:
                nccl.send(send_ptr, int(sends), kind, peer, handle)
            if receives:
                nccl.recv(recv_ptr, int(receives), kind, peer, handle)


def device_alltoallv(transport, grouped, send_cuts, recv_counts, what="all-to-all"):
    """Personalised all-to-all of the rows of one CuPy array, GPU to GPU: rank ``d`` gets
    ``grouped[send_cuts[d]:send_cuts[d + 1]]``, and this rank receives ``recv_counts[s]`` rows
    from each rank ``s`` (the counts exchanged beforehand). One NCCL group of sends and receives
    on CuPy's current stream, waited for (bounded by the transport's timeout). Returns the
    received rows in source rank order, this rank's own rows copied in place, as a new CuPy
    array. *Collective* over ``transport`` (device: NCCL)."""
    import cupy
    comm, rank = transport.comm, transport.comm.rank
    starts = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
    out = cupy.empty((int(starts[-1]),) + grouped.shape[1:], dtype=grouped.dtype)
    width = int(np.prod(grouped.shape[1:], dtype=np.int64))
    lo, hi = int(send_cuts[rank]), int(send_cuts[rank + 1])
    out[int(starts[rank]):int(starts[rank]) + hi - lo] = grouped[lo:hi]
    row_bytes = width * grouped.dtype.itemsize
    _peer_exchange(transport, transport.nccl_type(grouped.dtype),
                   cupy.cuda.get_current_stream().ptr,
                   ((peer, grouped.data.ptr + int(send_cuts[peer]) * row_bytes,
                     int(send_cuts[peer + 1] - send_cuts[peer]) * width,
                     out.data.ptr + int(starts[peer]) * row_bytes, int(recv_counts[peer]) * width)
                    for peer in range(comm.size) if peer != rank))
    transport.wait_cupy(what)
    return out


class _Collective:
    def __init__(self, transport):
        self.transport = as_transport(transport)
        self.comm = self.transport.comm

    def _device_path(self, array):
        return is_device_array(array) and self.transport.device

    def _staged(self, array, host_call, stream):
        """Host path for a device array: download, ``host_call(host)``, upload."""
        if stream is not None:
            stream.synchronize()
        host = array.get()
        host_call(host)
        array.set(host)
        return array


class RowAllGather(_Collective):
    """All-gather of row blocks: rank r owns ``counts[r]`` consecutive rows starting at
    ``offsets[r]`` of a ``(n_rows, width)`` array; after the call every rank holds all of it.

    Parameters
    ----------
    transport : Transport or mpi4py communicator
    offset, count : int
        This rank's first row and row count.
    width : int
        Columns per row (the same on every rank).

    Notes
    -----
    The rank's own block is read from ``full[offset:offset + count]``: an engine writes its rows
    in place, then calls the collective, so no separate send buffer is needed. On NCCL the
    blocks of unequal size move as one group of point-to-point sends and receives.
    """

    def __init__(self, transport, offset, count, width=1):
        super().__init__(transport)
        self.width = int(width)
        self.offset, self.count = int(offset), int(count)
        comm = self.comm
        blocks = comm.allgather((self.offset, self.count)) if comm.size > 1 else \
            [(self.offset, self.count)]
        self.offsets = np.array([b[0] for b in blocks], dtype=np.int64)
        self.counts = np.array([b[1] for b in blocks], dtype=np.int64)

    @property
    def trivial(self):
        """One rank: nothing to exchange."""
        return self.comm.size == 1

    def __call__(self, full, stream=None):
        """Fill every rank's ``full`` (C-contiguous, shape ``(rows, width)``) in place."""
        if self.trivial:
            return full
        if self._device_path(full):
            return self._nccl(full, stream)
        if is_device_array(full):
            return self._staged(full, self._host, stream)
        return self._host(full)

    def _host(self, full):
        from mpi4py import MPI
        kind = _mpi_type(full.dtype)
        counts = (self.counts * self.width).tolist()
        displs = (self.offsets * self.width).tolist()
        self.comm.Allgatherv(MPI.IN_PLACE, [full.reshape(-1), (counts, displs), kind])
        return full

    def _nccl(self, full, stream):
        # Point-to-point, not one broadcast per owner: every pair of ranks swaps its blocks at
        # once over its own link, where the broadcasts ran one after another (CP-ALS 20M on
        # 2xH200: its grouped exchange 34 -> 24.5 us per mode).
        t, width = self.transport, self.width
        _peer_exchange(t, t.nccl_type(full.dtype), t.stream_handle(stream),
                       ((peer, _ptr(full, self.offset * width), self.count * width,
                         _ptr(full, offset * width), count * width)
                        for peer, (offset, count) in enumerate(zip(self.offsets, self.counts))
                        if peer != self.comm.rank))
        return full


class AllReduce(_Collective):
    """Sum (or max/min) of same-shaped arrays over the ranks, in place."""

    def __init__(self, transport, op="sum"):
        super().__init__(transport)
        self.op_name = op

    def _op(self):
        from mpi4py import MPI
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[self.op_name]

    def __call__(self, array, stream=None):
        """Reduce ``array`` (contiguous) in place on every rank and return it."""
        if self.comm.size == 1:
            return array
        if self._device_path(array):
            t = self.transport
            if array.size:
                t.nccl.allReduce(_ptr(array), _ptr(array), int(array.size),
                                 t.nccl_type(array.dtype), t.nccl_op(self.op_name),
                                 t.stream_handle(stream))
            return array
        if is_device_array(array):
            return self._staged(array, self._host, stream)
        return self._host(array)

    def _host(self, array):
        from mpi4py import MPI
        self.comm.Allreduce(MPI.IN_PLACE, [array, _mpi_type(array.dtype)], op=self._op())
        return array

    def scalar(self, value):
        """Reduce one Python number (through MPI: a scalar is not worth a device round trip)."""
        if self.comm.size == 1:
            return value
        return self.comm.allreduce(value, op=self._op())


class RowGather(_Collective):
    """Gather of distributed rows to rank 0 in global row order (host buffers; a device array
    is downloaded first).

    Parameters
    ----------
    transport : Transport or mpi4py communicator
    rows : ndarray of int
        The global rows this rank holds, in the order of its local arrays.
    n_rows : int
        Global row count.
    """

    def __init__(self, transport, rows, n_rows):
        super().__init__(transport)
        self.n_rows = int(n_rows)
        self.rows = np.asarray(rows)

    def __call__(self, local):
        """Rank 0: the ``(n_rows, ...)`` array; other ranks: ``None``."""
        if is_device_array(local):
            local = local.get()
        if self.comm.size == 1:
            if len(self.rows) == self.n_rows and np.array_equal(self.rows, np.arange(self.n_rows)):
                return local
            return self._place([{"rows": self.rows, "values": local}], local)
        pieces = gather_arrays(self.comm, {"rows": self.rows, "values": local})
        if self.comm.rank != 0:
            return None
        return self._place(pieces, local)

    def _place(self, pieces, like):
        out = np.empty((self.n_rows,) + like.shape[1:], dtype=like.dtype)
        for piece in pieces:
            out[piece["rows"]] = piece["values"]
        return out


def _check_ghost_owners(ghosts, ghost_owner, rank):
    """A halo's ghost indices must each be owned by another rank (``ghost_owner``: the owner of
    each, -1 for none)."""
    if (ghost_owner < 0).any():
        missing = ghosts[ghost_owner < 0][:5]
        raise ValueError(f"halo exchange: indices {missing.tolist()} are owned by no rank")
    if (ghost_owner == rank).any():
        raise ValueError("halo exchange: a ghost index is owned by this rank")


class HaloExchange(_Collective):
    """The ghost entries of a distributed vector, planned once from a column pattern (as PETSc's
    MPIAIJ MatMult scatters only the off-process entries of x).

    Rank r owns the global entries ``owned`` of x (its local vector holds them in that order) and
    needs the global entries ``ghosts`` that other ranks own. Planning exchanges the requests
    once (MPI); each call moves only those entries: the owner packs them from its local vector,
    the receiver gets them in the order of ``ghosts``.

    Parameters
    ----------
    transport : Transport or mpi4py communicator
    owned : ndarray of int64
        Global indices this rank owns, in local order.
    ghosts : ndarray of int64
        Global indices this rank needs and does not own (unique; any order).
    n_global : int
        Global vector length.

    Attributes
    ----------
    ghosts : ndarray of int64
        The ghost indices in receive order (grouped by owning rank, ascending within a rank):
        column ``k`` of the ghost block corresponds to ``ghosts[k]``.
    send_index : ndarray of int64
        Local positions packed for the peers, concatenated in peer order.
    send_counts, recv_counts : ndarray of int64, length size
    """

    def __init__(self, transport, owned, ghosts, n_global):
        super().__init__(transport)
        comm = self.comm
        owned = np.asarray(owned, dtype=np.int64)
        ghosts = np.unique(np.asarray(ghosts, dtype=np.int64))
        size = comm.size
        self._device_index = None
        if size == 1:  # one rank owns every entry: nothing to plan (no n-sized owner table)
            # any ghost is wrong here: owned by this rank (0) or by none (-1)
            _check_ghost_owners(ghosts, np.where(np.isin(ghosts, owned), 0, -1), 0)
            empty = np.zeros(1, np.int64)
            self.ghosts = self.send_index = np.zeros(0, np.int64)
            self.send_counts = self.recv_counts = self.send_displs = self.recv_displs = empty
            self.n_ghosts = self.n_send = 0
            return
        # Owner of every global index: each rank contributes its owned list once.
        owner = np.full(int(n_global), -1, dtype=np.int64)
        for rank, indices in enumerate(comm.allgather(owned)):
            owner[indices] = rank
        _check_ghost_owners(ghosts, owner[ghosts], comm.rank)
        order = np.lexsort((ghosts, owner[ghosts])) if len(ghosts) else np.zeros(0, np.int64)
        self.ghosts = ghosts[order]
        ghost_owner = owner[self.ghosts]
        self.recv_counts = np.bincount(ghost_owner, minlength=size).astype(np.int64)
        requests = [self.ghosts[ghost_owner == r] for r in range(size)]
        incoming = comm.alltoall(requests)
        # Local position of each requested global index: a sorted search over this rank's list.
        sorter = np.argsort(owned, kind="stable")
        send = [sorter[np.searchsorted(owned, wanted, sorter=sorter)] for wanted in incoming]
        self.send_counts = np.array([len(s) for s in send], dtype=np.int64)
        self.send_index = np.concatenate(send) if send else np.zeros(0, np.int64)
        self.send_displs = np.concatenate([[0], np.cumsum(self.send_counts)[:-1]])
        self.recv_displs = np.concatenate([[0], np.cumsum(self.recv_counts)[:-1]])
        self.n_ghosts = int(len(self.ghosts))
        self.n_send = int(len(self.send_index))

    @property
    def bytes_per_call(self):
        """Entries this rank sends plus receives per call (multiply by the itemsize)."""
        return self.n_send + self.n_ghosts

    def __call__(self, local, ghost_out, stream=None, send_buffer=None, packed=False):
        """Fill ``ghost_out`` (length ``n_ghosts``) from the owners' ``local`` vectors.

        ``local`` and ``ghost_out`` are NumPy arrays (MPI) or GPUArrays (NCCL, on ``stream``;
        ``send_buffer`` a GPUArray of ``n_send`` entries, packed on the device).
        ``packed=True``: the caller already packed ``local[send_index]`` into ``send_buffer``
        (its own kernel on ``stream``, or NumPy), so only the exchange runs; a staged device
        call then downloads just those entries.
        """
        if self.comm.size == 1:
            return ghost_out
        if self._device_path(local):
            return self._nccl(local, ghost_out, stream, send_buffer, packed)
        if is_device_array(local):
            if stream is not None:
                stream.synchronize()
            host_ghosts = np.empty(self.n_ghosts, dtype=local.dtype)
            if packed:
                self._host(None, host_ghosts, send_buffer.get()[:self.n_send])
            else:
                self._host(local.get(), host_ghosts)
            if self.n_ghosts:
                ghost_out.set(host_ghosts)
            return ghost_out
        return self._host(local, ghost_out, send_buffer if packed else None)

    def _host(self, local, ghost_out, send=None):
        kind = _mpi_type(ghost_out.dtype)
        if send is None:
            send = local[self.send_index]
        send = np.ascontiguousarray(send[:self.n_send])
        self.comm.Alltoallv([send, (self.send_counts.tolist(), self.send_displs.tolist()), kind],
                            [ghost_out, (self.recv_counts.tolist(), self.recv_displs.tolist()),
                             kind])
        return ghost_out

    def device_send_index(self, arena=None):
        """The packing index on the device (uploaded once)."""
        if self._device_index is None:
            import pycuda.gpuarray as gpuarray
            index = self.send_index if self.n_send else np.zeros(1, np.int64)
            self._device_index = (arena.to_device(index, "halo send index") if arena is not None
                                  else gpuarray.to_gpu(index))
        return self._device_index

    def _nccl(self, local, ghost_out, stream, send_buffer, packed=False):
        import pycuda.gpuarray as gpuarray
        t = self.transport
        kind, handle = t.nccl_type(local.dtype), t.stream_handle(stream)
        if self.n_send and not packed:
            if send_buffer is None:
                send_buffer = gpuarray.empty(self.n_send, local.dtype)
            index = self.device_send_index()
            # PyCUDA's range needs an explicit step (it divides by it).
            _gather_kernel(local.dtype)(send_buffer, index, local,
                                        range=slice(0, self.n_send, 1), stream=stream)
        _peer_exchange(t, kind, handle,
                       ((peer, _ptr(send_buffer, self.send_displs[peer])
                         if self.send_counts[peer] else 0, self.send_counts[peer],
                         _ptr(ghost_out, self.recv_displs[peer])
                         if self.recv_counts[peer] else 0, self.recv_counts[peer])
                        for peer in range(self.comm.size)))
        return ghost_out


_GATHER_KERNELS = {}


def _gather_kernel(dtype):
    """``out[i] = src[index[i]]`` on the device (PyCUDA's ``gpuarray.take`` uses texture
    references, which CUDA 12 removed)."""
    dtype = np.dtype(dtype)
    if dtype not in _GATHER_KERNELS:
        from pycuda.elementwise import ElementwiseKernel
        from ..gpu import c_type
        value = c_type(dtype)
        _GATHER_KERNELS[dtype] = ElementwiseKernel(
            f"{value} *out, const long *index, const {value} *src",  # long: 64-bit (LP64)
            "out[i] = src[index[i]]", f"hisparse_gather_{dtype.name}")
    return _GATHER_KERNELS[dtype]


def gather_parts(comm, part):
    """Every rank's dict of arrays, in rank order, on rank 0 (``None`` elsewhere): for results
    whose parts differ in shape (a CSR block per rank)."""
    return gather_arrays(as_transport(comm).comm, part)


def max_over_ranks(comm, value):
    """The largest of one number over the ranks (e.g. the slowest rank's setup time)."""
    comm = as_transport(comm).comm
    return max(comm.allgather(value)) if comm.size > 1 else value
