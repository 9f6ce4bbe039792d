"""MPI helpers built on mpi4py.

Arrays travel as raw buffers (upper-case mpi4py methods) in chunks of at most 1 GiB, so a part
larger than MPI's 2**31-element count limit still moves; the small metadata around them travels
pickled.
"""
import contextlib
import os
import sys
import time

import numpy as np

from ..errors import HisparseError, Interrupted, as_user_error
from ._launcher import check_world_size, launched_by_mpi

_CHUNK_BYTES = 1 << 30
#: Seconds a rank sleeps between polls while it waits for a point-to-point message or a
#: reduction (:func:`wait_requests`, :func:`recv_array_into`, :func:`min_over_ranks`): MPI's
#: blocking waits spin on a core, and where the ranks have fewer cores than they use (BLAS
#: threads, a shared host) the spinning slows the very rank it waits for (docs/ops/cholesky.md,
#: "Where the multi-rank time went").
POLL_SECONDS = 2e-4
_TAG = 7301


def get_world():
    """The run's world: ``MPI.COMM_WORLD`` when a launcher started this process or MPI is
    already initialised here; otherwise the one-rank :data:`~._serial.SERIAL_WORLD`, without
    initialising MPI (a singleton's start-up is 0.57 s on the H100 host; ``_serial``)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None and not launched_by_mpi():
        import mpi4py
        # Import the bindings (constants, datatypes, version queries) without MPI_Init, and
        # leave nothing for exit to finalise.
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI as mpi
    if mpi is None:
        from mpi4py import MPI as mpi
    if mpi.Is_initialized() and not mpi.Is_finalized():
        if mpi.COMM_WORLD.size == 1:
            check_world_size(1, _library_version(mpi))
        return mpi.COMM_WORLD
    if launched_by_mpi():
        # Someone imported mpi4py with rc.initialize off (or this process chose the serial world
        # before HISPARSE_MPI=always was set): MPI cannot be started behind their back.
        raise HisparseError("an MPI launcher started this process but MPI is not initialised "
                            "(mpi4py imported with rc.initialize = False?): initialise MPI "
                            "(MPI.Init_thread()) before hisparse.run")
    from ._serial import SERIAL_WORLD
    return SERIAL_WORLD


def _library_version(mpi):
    """The first line of the MPI library's version string, or None."""
    try:
        return " ".join(mpi.Get_library_version().strip().splitlines()[0].split())
    except Exception:  # an MPI without the call: the message goes without it
        return None


def node_local(comm):
    """The communicator of the ranks sharing this node's memory (``COMM_TYPE_SHARED``)."""
    from mpi4py import MPI
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)


class CollectiveError(HisparseError):
    """An error raised on the root and re-raised on every rank, so all ranks stop together."""

    collective = True


def root_call(comm, func, *args, **kwargs):
    """Run ``func`` on rank 0 and broadcast its outcome.

    If ``func`` raises a :class:`HisparseError` on rank 0 (or an expected failure that
    :func:`~hisparse.errors.as_user_error` maps to one: out of memory, an I/O error), every rank
    raises a :class:`CollectiveError` carrying the same message, so the job stops with one line
    and without an abort; if it is interrupted (SIGINT/SIGTERM), every rank raises
    :class:`~hisparse.errors.Interrupted`. Other exceptions are re-raised on rank 0 only (and are
    treated as bugs: the caller's guard aborts the job). Returns ``func``'s result on rank 0 and
    ``None`` elsewhere.
    """
    result, outcome = None, ("ok", None)
    if comm.rank == 0:
        try:
            result = func(*args, **kwargs)
        except Interrupted as exc:
            if comm.size == 1:
                raise
            outcome = ("interrupted", (exc.signum, exc.phase))
        except BaseException as exc:
            error = as_user_error(exc) if isinstance(exc, Exception) else None
            if error is None:
                _announce(comm, ("bug", None))
                raise
            outcome = ("error", str(error))
        _announce(comm, outcome)
    else:
        # rank 0 works alone meanwhile (reading, analysing, writing): the others wait asleep
        # and leave it their cores, where a blocking broadcast would spin on one each
        barrier_asleep(comm)
        outcome = comm.bcast(None, root=0)
        if outcome[0] == "bug":
            # Rank 0 hit an unexpected error and is aborting the job; wait for that.
            comm.Barrier()
    status, detail = outcome
    if status == "interrupted":
        raise Interrupted(*detail, collective=True)
    if status == "error":
        raise CollectiveError(detail)
    return result


def _announce(comm, outcome):
    """Rank 0 of :func:`root_call`: the others (waiting in :func:`barrier_asleep`) get
    ``outcome``."""
    if comm.size > 1:
        barrier_asleep(comm)
        comm.bcast(outcome, root=0)


def all_call(comm, func, *args, **kwargs):
    """Run ``func`` on every rank; if it raises a :class:`HisparseError` (or an expected failure,
    see :func:`root_call`) on any rank, every rank raises a :class:`CollectiveError` naming the
    first failing rank and its message (no rank when every rank failed alike)."""
    result, message = None, None
    try:
        result = func(*args, **kwargs)
    except Exception as exc:
        error = as_user_error(exc)
        if error is None:
            raise
        message = str(error)
    messages = comm.allgather(message) if comm.size > 1 else [message]
    if len(set(messages)) == 1 and message is not None:
        raise CollectiveError(message)  # the same on every rank: no rank to name
    for rank, text in enumerate(messages):
        if text is not None:
            raise CollectiveError(f"rank {rank}: {text}")
    return result


def _isend_part(comm, part, dest):
    """Start sending ``part`` (a dict of arrays and small values) to rank ``dest``: one pickled
    header (the names, dtypes and shapes of its arrays, and its other values), then each array's
    bytes (:func:`isend_array`). Returns the requests and the arrays sent, which must stay as
    they are until :func:`wait_requests` has the requests done."""
    # (reshaped: np.ascontiguousarray makes a 0-d array 1-d)
    arrays = {k: np.ascontiguousarray(v).reshape(v.shape) for k, v in part.items()
              if isinstance(v, np.ndarray)}
    others = {k: v for k, v in part.items() if not isinstance(v, np.ndarray)}
    header = (list(arrays), [(a.dtype.str, a.shape) for a in arrays.values()], others)
    requests = [comm.isend(header, dest=dest, tag=_TAG)]
    for array in arrays.values():
        requests += isend_array(comm, array, dest, _TAG)
    return requests, arrays


def _send_parts(comm, parts_by_dest):
    """Send each ``(dest, part)`` of ``parts_by_dest`` at once, and wait until all are sent:
    the receivers copy their parts concurrently (shared-memory MPI's single copy is made by
    the receiver), where sending them one after the other made each wait for the last."""
    requests, keep = [], []
    for dest, part in parts_by_dest:
        sent, arrays = _isend_part(comm, part, dest)
        requests += sent
        keep.append(arrays)
    wait_requests(requests)


def _send_part(comm, part, dest):
    _send_parts(comm, [(dest, part)])


def _recv_part(comm, source):
    names, shapes, part = comm.recv(source=source, tag=_TAG)
    for name, (dtype, shape) in zip(names, shapes):
        array = np.empty(shape, dtype=np.dtype(dtype))
        part[name] = recv_array_into(comm, array, source, _TAG) if array.size else array
    return part


def isend_array(comm, array, dest, tag):
    """Start sending the bytes of a contiguous ``array`` to rank ``dest`` (in chunks of at most
    1 GiB, so a block over MPI's count limit moves); the receiver knows its size and posts
    :func:`recv_array_into`. Returns the requests: ``array`` must stay as it is until
    :func:`wait_requests` has them done."""
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return [comm.Isend(flat[start:start + _CHUNK_BYTES], dest=dest, tag=tag)
            for start in range(0, len(flat), _CHUNK_BYTES)]


def irecv_array_into(comm, out, source, tag):
    """Start receiving into the contiguous array ``out`` what :func:`isend_array` sends from
    ``source`` (chunk by chunk as it was sent). Returns the requests."""
    flat = out.reshape(-1).view(np.uint8)
    return [comm.Irecv(flat[start:start + _CHUNK_BYTES], source=source, tag=tag)
            for start in range(0, len(flat), _CHUNK_BYTES)]


def _poll_asleep(done):
    """Return once ``done()`` is true, asleep :data:`POLL_SECONDS` between the polls."""
    while not done():
        time.sleep(POLL_SECONDS)


def recv_array_into(comm, out, source, tag):
    """Receive into the contiguous array ``out`` what :func:`isend_array` sent from ``source``,
    waiting for the message asleep between polls."""
    _poll_asleep(lambda: comm.Iprobe(source=source, tag=tag))
    flat = out.reshape(-1).view(np.uint8)
    for start in range(0, len(flat), _CHUNK_BYTES):
        comm.Recv(flat[start:start + _CHUNK_BYTES], source=source, tag=tag)
    return out


def wait_requests(requests):
    """Wait for every request of :func:`isend_array`, asleep between polls."""
    if requests:
        from mpi4py import MPI
        _poll_asleep(lambda: MPI.Request.Testall(requests))


def barrier_asleep(comm):
    """Wait until every rank has come here, asleep between polls: the ranks that wait while one
    works alone (rank 0's verification and peers, :func:`root_call`) leave it their cores,
    where a blocking collective would spin on one each. SIGINT/SIGTERM wait for the next phase
    boundary meanwhile, as they do in a blocking collective (the ranks then stop together)."""
    if comm.size == 1:
        return
    from ._stop import signal_guard  # here: _stop imports this module
    guard = signal_guard()
    with guard.collective(comm) if guard is not None else contextlib.nullcontext():
        _poll_asleep(comm.Ibarrier().Test)


def min_over_ranks(comm, value):
    """The smallest of an integer over the ranks, waited for asleep between polls."""
    from mpi4py import MPI
    mine, out = np.array([value], dtype=np.int64), np.empty(1, dtype=np.int64)
    request = comm.Iallreduce(mine, out, op=MPI.MIN)
    _poll_asleep(request.Test)
    return int(out[0])


def scatter_arrays(comm, parts):
    """Send ``parts[r]`` (a dict of arrays and small values) from rank 0 to rank ``r``.

    Parameters
    ----------
    parts : list of dict, length comm.size, on rank 0 (ignored elsewhere)

    Returns
    -------
    dict
        This rank's part.
    """
    if comm.rank == 0:
        _send_parts(comm, [(dest, parts[dest]) for dest in range(1, comm.size)])
        return parts[0]
    return _recv_part(comm, 0)


def gather_arrays(comm, part):
    """Gather every rank's dict of arrays on rank 0 (list in rank order); ``None`` elsewhere."""
    if comm.rank == 0:
        return [part] + [_recv_part(comm, source) for source in range(1, comm.size)]
    _send_part(comm, part, 0)
    return None


def bcast_arrays(comm, part):
    """Broadcast rank 0's dict of arrays to every rank."""
    if comm.size == 1:
        return part
    if comm.rank == 0:
        _send_parts(comm, [(dest, part) for dest in range(1, comm.size)])
        return part
    return _recv_part(comm, 0)


def allgather_arrays(comm, part):
    """Every rank gets the list of all ranks' dicts (gather to 0, then broadcast)."""
    parts = gather_arrays(comm, part)
    if comm.size == 1:
        return parts
    if comm.rank == 0:
        for dest in range(1, comm.size):
            comm.send(len(parts), dest=dest, tag=_TAG)
        _send_parts(comm, [(dest, p) for dest in range(1, comm.size) for p in parts])
        return parts
    count = comm.recv(source=0, tag=_TAG)
    return [_recv_part(comm, 0) for _ in range(count)]


def alltoall_arrays(comm, parts):
    """Personalised all-to-all of dicts of arrays: ``parts[d]`` goes to rank ``d``. *Collective.*

    Arrays of any size travel as raw bytes in chunks of at most 1 GiB (nonblocking, so no pair of
    ranks waits on the other); small values travel pickled.

    Parameters
    ----------
    parts : list of dict, length comm.size
        What this rank sends to each rank (``parts[comm.rank]`` stays here, uncopied).

    Returns
    -------
    list of dict
        What each rank sent here, in source rank order.
    """
    from mpi4py import MPI
    if comm.size == 1:
        return [parts[0]]
    sends = []
    for part in parts:
        arrays = {k: np.ascontiguousarray(v) for k, v in part.items()
                  if isinstance(v, np.ndarray)}
        sends.append((arrays, {k: v for k, v in part.items() if not isinstance(v, np.ndarray)}))
    layouts = comm.alltoall([([(k, a.dtype.str, a.shape) for k, a in arrays.items()], others)
                             for arrays, others in sends])
    received, requests = [], []
    for source, (names, others) in enumerate(layouts):
        part = dict(others)
        for name, dtype, shape in names:
            if source == comm.rank:
                part[name] = sends[source][0][name]
                continue
            part[name] = np.empty(shape, dtype=np.dtype(dtype))
            requests += irecv_array_into(comm, part[name], source, _TAG)
        received.append(part)
    for dest, (arrays, _) in enumerate(sends):
        if dest == comm.rank:
            continue
        for array in arrays.values():  # the same order as the receiver's layout
            requests += isend_array(comm, array, dest, _TAG)
    MPI.Request.Waitall(requests)
    return received


#: Seconds a rank waits between printing its last words and ``MPI_Abort``: the launcher forwards
#: a rank's stderr through a pipe and kills every process on abort, dropping what it has not read
#: yet (seen with MPICH's Hydra: only the first line of a traceback reached the user).
ABORT_DRAIN_S = 0.3


def alltoall_concatenated(comm, parts):
    """:func:`alltoall_arrays` for parts of arrays only, each name's pieces received straight
    into one array in source rank order, where concatenating the received pieces after the
    exchange copied all of them once more (R-MAT 23's edges at 2 ranks: 0.3 s a rank). This
    rank's own piece is copied into its place on the host's threads while the messages travel;
    when no other rank sends it anything of a name, that piece is returned as it is (no copy).
    Pieces of one name in different dtypes on different ranks travel in their common type, as
    a concatenation would give. *Collective.*

    Parameters
    ----------
    parts : list of dict, length comm.size
        ``parts[d]``: the arrays (at least 1-D) this rank sends to rank ``d``; every rank's
        parts have the same names, each with one shape past the first axis.

    Returns
    -------
    (dict, dict)
        The received arrays by name, and by name the rows (first axis) each source sent.
    """
    from mpi4py import MPI
    from ..threads import copy_into
    size, rank = comm.size, comm.rank
    names = list(parts[rank])
    kinds = [(np.result_type(*[part[name] for part in parts]).str,
              tuple(np.shape(parts[rank][name])[1:])) for name in names]
    everyone = comm.allgather((names, kinds)) if size > 1 else [(names, kinds)]
    for source, (their_names, their_kinds) in enumerate(everyone):
        if their_names != names or [trail for _, trail in their_kinds] != \
                [trail for _, trail in kinds]:
            raise ValueError(f"alltoall_concatenated: rank {source} sends {their_names} "
                             f"{their_kinds}, rank {rank} {names} {kinds} (the same names "
                             f"and shapes past the first axis expected)")
    dtypes = [np.result_type(*[np.dtype(theirs[k][0]) for _, theirs in everyone])
              for k in range(len(names))]
    sends = [{name: np.ascontiguousarray(part[name], dtype=dtype)
              for name, dtype in zip(names, dtypes)} for part in parts]
    lengths = [[len(send[name]) for name in names] for send in sends]
    rows_from = np.array(comm.alltoall(lengths) if size > 1 else lengths,
                         dtype=np.int64).reshape(size, len(names))
    received, counts, requests, own_copies = {}, {}, [], []
    for k, name in enumerate(names):
        rows = rows_from[:, k]
        counts[name] = rows.copy()
        own = sends[rank][name]
        if rows.sum() == rows[rank]:  # only this rank's own piece: kept as it is
            received[name] = own
            continue
        starts = np.concatenate([[0], np.cumsum(rows)])
        array = np.empty((int(starts[-1]),) + own.shape[1:], dtype=own.dtype)
        for source in range(size):
            piece = array[int(starts[source]):int(starts[source + 1])]
            if source == rank:
                own_copies.append((piece, own))
                continue
            requests += irecv_array_into(comm, piece, source, _TAG)
        received[name] = array
    for dest in range(size):
        if dest != rank:
            for name in names:  # the order the receiver posted its receives in
                requests += isend_array(comm, sends[dest][name], dest, _TAG)
    for piece, own in own_copies:
        copy_into(piece, own)
    MPI.Request.Waitall(requests)
    return received, counts


def abort(comm, message, code=1, hard=False):
    """Print ``message`` on stderr and end the whole job (``MPI_Abort`` when several ranks).

    The message goes out in one ``write`` on the raw descriptor, so the launcher's forwarder reads
    it whole (a pipe write of up to 4 KiB is atomic), then the rank pauses briefly before the
    abort so the forwarder has read it before the processes are killed. ``hard``: called from a
    thread other than the main one (a watchdog), so the process ends by ``os._exit``, not by
    raising ``SystemExit``."""
    sys.stderr.flush()
    data = (message.rstrip("\n") + "\n").encode(errors="replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass  # stderr closed: nothing more can be said
    if comm is not None and comm.size > 1:
        time.sleep(ABORT_DRAIN_S)
        comm.Abort(code)
    if hard:
        os._exit(code)
    raise SystemExit(code)
