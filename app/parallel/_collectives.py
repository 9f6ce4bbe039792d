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

from ..arrays import is_device_array, sorted_distinct
from ._mpi import gather_arrays
from ._transport import MpiTransport, as_transport, cupy_stream


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


def _repeats(indices):
    """Whether ``indices`` holds a value twice: by marks in a byte table over the span of its
    values (a power-law graph's ghost list holds millions: a sort of them was most of the
    exchange's plan), or by sorting where the span is far larger than the list (or holds
    negative values)."""
    if not len(indices):
        return False
    low, high = int(indices.min()), int(indices.max())
    if low >= 0 and high - low < max(1 << 24, 8 * len(indices)):
        seen = np.zeros(high - low + 1, dtype=np.bool_)
        seen[indices - low] = True
        return int(np.count_nonzero(seen)) != len(indices)
    return len(sorted_distinct(indices)) != len(indices)


def _unique_ascending(indices):
    """``np.unique(indices)``, without the sort when they already rise strictly (the ghost
    columns of a block split do)."""
    if len(indices) < 2 or bool(np.all(indices[1:] > indices[:-1])):
        return indices
    return sorted_distinct(indices)


def _index_dtype(n_global):
    """The narrowest of int32 and int64 that holds every index of a vector of ``n_global``."""
    return np.dtype(np.int32 if int(n_global) <= np.iinfo(np.int32).max else np.int64)


def _rank_dtype(size):
    """A signed dtype for rank numbers (and -1, none) of ``size`` ranks: int16 keeps the
    grouping sort by owner a radix sort."""
    return np.dtype(np.int16 if size < np.iinfo(np.int16).max else np.int32)


#: Most runs of consecutive indices a rank's owned list may have for :class:`_Owners` to find
#: owners from every rank's runs; one rank with more puts every rank on the owner table's route
#: (an all-gather of every owned index and a table of the vector's length). The Cholesky subtree
#: mapping's owned columns are a few hundred runs (whole subtrees and separator pieces in
#: postorder).
MAX_OWNED_RUNS = 1 << 14


def _runs(owned):
    """``(starts, stops)`` (int64) of the runs of consecutive increasing indices in ``owned``,
    in its order."""
    if not len(owned):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    owned = np.asarray(owned, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(owned) != 1) + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks, [len(owned)]])
    return owned[first], owned[last - 1] + 1


class _Owners:
    """Which rank owns each global index of a distributed vector, for the ghosts a rank asks
    for: found from every rank's runs of consecutive indices (one range each for the row blocks
    of a square matrix or an even split of x; whole subtrees for the Cholesky subtree mapping)
    when every rank has at most :data:`MAX_OWNED_RUNS` and no index is claimed twice, so that no
    rank makes anything of the vector's length; else from an owner table of ``n_global`` small
    integers (int16 ranks), filled from every rank's owned list (one all-gather of int32
    indices where they fit)."""

    def __init__(self, comm, owned, n_global):
        self.size, self.n_global = comm.size, int(n_global)
        starts, stops = _runs(owned)
        # one range: a local position is a shift (an empty list's shift is never used)
        self.first = (int(starts[0]) if len(starts) else 0) if len(starts) <= 1 else None
        runs = comm.allgather((starts, stops) if len(starts) <= MAX_OWNED_RUNS else None)
        self.table = None
        if all(each is not None for each in runs) and self._disjoint(runs):
            return
        everyone, counts = all_gather_concatenated(comm, owned, n_global)
        self.table = np.full(self.n_global, -1, dtype=_rank_dtype(self.size))
        # a rank's entries after the lower ranks': where two claim one, the higher rank wins
        self.table[everyone] = np.repeat(np.arange(self.size, dtype=self.table.dtype), counts)

    def _disjoint(self, runs):
        """Keep every rank's runs sorted by start (``starts``, ``stops``, ``ranks``) and say
        whether they are disjoint (else the table decides, as it always did)."""
        starts = np.concatenate([each[0] for each in runs]).astype(np.int64)
        stops = np.concatenate([each[1] for each in runs]).astype(np.int64)
        ranks = np.repeat(np.arange(self.size, dtype=np.int64), [len(each[0]) for each in runs])
        order = np.argsort(starts, kind="stable")
        self.starts, self.stops, self.ranks = starts[order], stops[order], ranks[order]
        return bool(np.all(self.starts[1:] >= self.stops[:-1]))

    def of(self, indices):
        """The owner of each of ``indices`` (int64), -1 where no rank owns it."""
        dtype = _rank_dtype(self.size)
        inside = (indices >= 0) & (indices < self.n_global)
        if self.table is not None:
            return np.where(inside, self.table[np.where(inside, indices, 0)], -1).astype(dtype)
        which = np.searchsorted(self.starts, indices, side="right") - 1
        clipped = np.maximum(which, 0)
        covered = (which >= 0) & (indices < self.stops[clipped]) if len(self.starts) else \
            np.zeros(len(indices), dtype=bool)
        owner = self.ranks.astype(dtype)[clipped] if len(self.starts) else \
            np.zeros(len(indices), dtype)
        return np.where(covered & inside, owner, dtype.type(-1))

    def local_positions(self, owned, requested):
        """The local position of each of ``requested`` (global indices this rank owns) in its
        ``owned`` list: a shift for one range, else a search (sorted first where ``owned`` is
        not ascending)."""
        if self.first is not None:
            return requested.astype(np.int64) - self.first
        if len(owned) < 2 or bool(np.all(owned[1:] > owned[:-1])):
            return np.searchsorted(owned, requested).astype(np.int64)
        sorter = np.argsort(owned, kind="stable")
        return sorter[np.searchsorted(owned, requested, sorter=sorter)]


def all_gather_concatenated(comm, indices, n_global):
    """Every rank's ``indices`` (of a vector of ``n_global`` entries) concatenated in rank
    order, on every rank, as int32 where every index fits (else int64), and how many each rank
    gave: one all-gather of the counts, then the host transport's in-place all-gather of the
    indices (no pickling). *Collective* over ``comm`` (a communicator or a transport's)."""
    comm = as_transport(comm).comm
    counts = np.array(comm.allgather(len(indices)), dtype=np.int64)
    starts = _starts(counts)
    everyone = np.empty(int(counts.sum()), dtype=_index_dtype(n_global))
    everyone[starts[comm.rank]:starts[comm.rank] + len(indices)] = indices
    MpiTransport(comm).all_gatherv(everyone, counts, starts)
    return everyone, counts


def _exchange_requests(comm, wanted, recv_counts, dtype):
    """Every rank's requests to every other, through one all-to-all of counts and the host
    transport's exchange of the indices: ``wanted`` (grouped by owner, ``recv_counts[r]`` for
    rank ``r``) goes to the owners; returns ``(incoming, send_counts)``, the indices the others
    ask of this rank, in rank order, and how many each asks."""
    send_counts = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(np.ascontiguousarray(recv_counts, dtype=np.int64), send_counts)
    incoming = np.empty(int(send_counts.sum()), dtype=dtype)
    MpiTransport(comm).exchange(np.ascontiguousarray(wanted, dtype=dtype), recv_counts,
                                _starts(recv_counts), incoming, send_counts,
                                _starts(send_counts))
    return incoming, send_counts


def _starts(counts):
    """Exclusive running sum of ``counts`` (int64): each part's first place."""
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    return starts


class HaloExchange(_Collective):
    """The ghost entries of a distributed vector, planned once from a column pattern (as PETSc's
    MPIAIJ MatMult scatters only the off-process entries of x).

    Rank r owns the global entries ``owned`` of x (its local vector holds them in that order) and
    needs the global entries ``ghosts`` that other ranks own. Planning exchanges the requests
    once (MPI); each call moves only those entries: the owner packs them from its local vector,
    the receiver gets them in the order of ``ghosts``. The plan costs each rank its own lists
    (owned, ghosts, requests) where every rank owns one range of indices; other ownerships
    need a table over every index (:class:`_Owners`).

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
    receive_order : ndarray of int64
        Where each received entry sits in the ghost list asked for (``keep_order``) or in its
        ascending unique values: ``ghosts == asked[receive_order]``.
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
            ghosts = _unique_ascending(ghosts)
        elif _repeats(ghosts):
            raise ValueError("halo exchange: the ghost indices repeat (keep_order needs unique "
                             "indices)")
        size = comm.size
        self._device_index = None
        if size == 1:  # one rank owns every entry: nothing to plan (no n-sized owner table)
            # any ghost is wrong here: owned by this rank (0) or by none (-1)
            _check_ghost_owners(ghosts, np.where(np.isin(ghosts, owned), 0, -1), 0)
            empty = np.zeros(1, np.int64)
            self.ghosts = self.send_index = self.receive_order = np.zeros(0, np.int64)
            self.send_counts = self.recv_counts = self.send_displs = self.recv_displs = empty
            self.n_ghosts = self.n_send = 0
            return
        owners = _Owners(comm, owned, n_global)
        ghost_owner = owners.of(ghosts)
        _check_ghost_owners(ghosts, ghost_owner, comm.rank)
        # grouped by owner, the given (or ascending) order within each: a radix sort of int16
        self.receive_order = np.argsort(ghost_owner, kind="stable").astype(np.int64)
        self.ghosts = ghosts[self.receive_order]
        self.recv_counts = np.bincount(ghost_owner, minlength=size).astype(np.int64)
        incoming, self.send_counts = _exchange_requests(comm, self.ghosts, self.recv_counts,
                                                        _index_dtype(n_global))
        self.send_index = owners.local_positions(owned, incoming)
        self.send_displs = _starts(self.send_counts)
        self.recv_displs = _starts(self.recv_counts)
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

    def reverse(self, ghost_values, out, stream=None):
        """The transpose of a call (PETSc's reverse scatter): this rank's ``ghost_values`` (one
        per ghost index, in :attr:`ghosts` order) go to the indices' owners, and ``out``
        (``n_send`` entries) receives the values the other ranks hold for this rank's entries,
        in :attr:`send_index` order (an entry asked for by several ranks comes once from
        each). A checkerboard SpMV's fold: partial sums of rows sent to the rows' owners."""
        if self.comm.size == 1:
            return out
        return self.transport.exchange(ghost_values, self.recv_counts, self.recv_displs, out,
                                       self.send_counts, self.send_displs, stream)

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
