"""Planned collectives: each is set up once from the layout of the data (who owns which rows),
then every call is one primitive of the run's transport on arrays of that layout (as mpi4py-fft
plans its transfers).

Engines never see a communicator; an operation's ``run_once`` composes engine steps with these
objects. Each takes a :class:`~hisparse.parallel.Transport` (or a bare MPI communicator: host
buffers) and is called with a NumPy array or a device array (a PyCUDA ``GPUArray``; CuPy for
:func:`device_alltoallv`), which the transport moves GPU to GPU on the given stream where it can,
else through host memory.
"""
import numpy as np

from ..arrays import is_device_array
from ._mpi import gather_arrays
from ._transport import as_transport, cupy_stream


def device_alltoallv(transport, grouped, send_cuts, recv_counts, what="all-to-all"):
    """Personalised all-to-all of the rows of one CuPy array: rank ``d`` gets
    ``grouped[send_cuts[d]:send_cuts[d + 1]]``, and this rank receives ``recv_counts[s]`` rows
    from each rank ``s`` (the counts exchanged beforehand). One grouped exchange on CuPy's
    current stream (GPU to GPU on a device transport), waited for (bounded by the transport's
    timeout). Returns the received rows in source rank order, this rank's own rows copied in
    place, as a new CuPy array. *Collective* over ``transport``."""
    import cupy
    rank = transport.comm.rank
    starts = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
    out = cupy.empty((int(starts[-1]),) + grouped.shape[1:], dtype=grouped.dtype)
    width = int(np.prod(grouped.shape[1:], dtype=np.int64))
    lo, hi = int(send_cuts[rank]), int(send_cuts[rank + 1])
    out[int(starts[rank]):int(starts[rank]) + hi - lo] = grouped[lo:hi]
    send_cuts = np.asarray(send_cuts, dtype=np.int64)
    stream = cupy_stream()
    transport.exchange(grouped, np.diff(send_cuts) * width, send_cuts[:-1] * width,
                       out, np.asarray(recv_counts, dtype=np.int64) * width, starts[:-1] * width,
                       stream)
    transport.wait(stream, what)
    return out


class _Collective:
    def __init__(self, transport):
        self.transport = as_transport(transport)
        self.comm = self.transport.comm


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
    in place, then calls the collective, so no separate send buffer is needed.
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
        flags = getattr(full, "flags", None)
        if flags is not None and not flags.c_contiguous:  # a flat view would be a copy
            raise ValueError(f"RowAllGather fills a C-contiguous array in place; got one of "
                             f"shape {full.shape} that is not")
        return self.transport.all_gatherv(full, self.counts * self.width,
                                          self.offsets * self.width, stream)


class AllReduce(_Collective):
    """Sum (or max/min) of same-shaped arrays over the ranks, in place."""

    def __init__(self, transport, op="sum"):
        super().__init__(transport)
        self.op_name = op

    def __call__(self, array, stream=None):
        """Reduce ``array`` (contiguous) in place on every rank and return it."""
        if self.comm.size == 1:
            return array
        return self.transport.all_reduce(array, self.op_name, stream)

    def scalar(self, value):
        """Reduce one Python number."""
        if self.comm.size == 1:
            return value
        return self.transport.reduce_number(value, self.op_name)


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


def _repeats(indices, n):
    """Whether ``indices`` holds a value twice: by marks in an ``n``-entry table where every
    value is in ``[0, n)`` (a power-law graph's ghost list holds millions: a sort of them was
    most of the exchange's plan), else (``n`` 0 included) by sorting."""
    if not len(indices):
        return False
    if indices.min() >= 0 and indices.max() < n:
        seen = np.zeros(n, dtype=np.bool_)
        seen[indices] = True
        return int(np.count_nonzero(seen)) != len(indices)
    return len(np.unique(indices)) != len(indices)


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
    keep_order : bool
        Receive each owner's entries in the order they have in ``ghosts`` (e.g. most used
        first, for the locality of a product's gathers) instead of ascending.

    Attributes
    ----------
    ghosts : ndarray of int64
        The ghost indices in receive order (grouped by owning rank, ascending within a rank or
        in the given order): column ``k`` of the ghost block corresponds to ``ghosts[k]``.
    send_index : ndarray of int64
        Local positions packed for the peers, concatenated in peer order.
    send_counts, recv_counts : ndarray of int64, length size
    """

    def __init__(self, transport, owned, ghosts, n_global, keep_order=False):
        super().__init__(transport)
        comm = self.comm
        owned = np.asarray(owned, dtype=np.int64)
        ghosts = np.asarray(ghosts, dtype=np.int64)
        if not keep_order:
            ghosts = np.unique(ghosts)
        # marks over every index only where the n-entry owner table below is made too
        elif _repeats(ghosts, int(n_global) if comm.size > 1 else 0):
            raise ValueError("halo exchange: the ghost indices repeat (keep_order needs unique "
                             "indices)")
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
        if not len(ghosts):
            order = np.zeros(0, np.int64)
        elif keep_order:  # grouped by owner, the given order within each
            order = np.argsort(owner[ghosts], kind="stable")
        else:
            order = np.lexsort((ghosts, owner[ghosts]))
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

        ``local`` and ``ghost_out`` are NumPy arrays or GPUArrays (on ``stream``; a device
        ``local`` is packed on the device into ``send_buffer``, a GPUArray of ``n_send``
        entries, made here when not given). ``packed=True``: the caller already packed
        ``local[send_index]`` into ``send_buffer`` (its own kernel on ``stream``, or NumPy), so
        only the exchange runs.
        """
        if self.comm.size == 1:
            return ghost_out
        if not packed:
            send_buffer = self._pack(local, stream, send_buffer)
        return self.transport.exchange(send_buffer, self.send_counts, self.send_displs,
                                       ghost_out, self.recv_counts, self.recv_displs, stream)

    def pair(self, send_buffer, ghost_out, send_peer, recv_peer, stream=None):
        """One round of the exchange in rounds: the entries packed for ``send_peer`` sent (from
        ``send_buffer``, packed as ``__call__``'s) and those of ``recv_peer`` received into their
        places in ``ghost_out``. With every rank sending to ``rank + k`` and receiving from
        ``rank - k`` in round ``k`` (k = 1 .. size - 1), the rounds move what one call moves,
        and the entries of each owner can be used as soon as its round is done."""
        size = self.comm.size
        send_counts = np.zeros(size, dtype=np.int64)
        recv_counts = np.zeros(size, dtype=np.int64)
        send_counts[send_peer] = self.send_counts[send_peer]
        recv_counts[recv_peer] = self.recv_counts[recv_peer]
        return self.transport.exchange(send_buffer, send_counts, self.send_displs, ghost_out,
                                       recv_counts, self.recv_displs, stream)

    def _pack(self, local, stream, send_buffer):
        """``local[send_index]``: on the host, or on the device into ``send_buffer``."""
        if not is_device_array(local):
            return local[self.send_index]
        if not self.n_send:
            return send_buffer
        import pycuda.gpuarray as gpuarray
        if send_buffer is None:
            send_buffer = gpuarray.empty(self.n_send, local.dtype)
        # PyCUDA's range needs an explicit step (it divides by it).
        _gather_kernel(local.dtype)(send_buffer, self.device_send_index(), local,
                                    range=slice(0, self.n_send, 1), stream=stream)
        return send_buffer

    def device_send_index(self, arena=None):
        """The packing index on the device (uploaded once)."""
        if self._device_index is None:
            import pycuda.gpuarray as gpuarray
            index = self.send_index if self.n_send else np.zeros(1, np.int64)
            self._device_index = (arena.to_device(index, "halo send index") if arena is not None
                                  else gpuarray.to_gpu(index))
        return self._device_index


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
