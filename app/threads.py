"""Host threads: how many cores this process may use, and a pool that runs NumPy work on them
(NumPy releases the interpreter's lock in its array operations).

Ranks that a launcher left unbound (``mpirun --bind-to none``, the jobs' default) all see every
core of the node; each one's pools then took a thread per core, and 4 ranks ran 64 threads on 16
cores in the set-up steps every rank does at once (divided, R-MAT 22 at 4 ranks on that host:
``read`` 5.38 -> 4.68 s, ``plan`` 1.49 -> 1.25 s). :func:`share_node` counts the ranks of the
node whose CPU sets overlap this one's, and :func:`usable_cores` divides the cores among them;
inside :func:`alone` (rank 0's work while the others wait: the Cholesky analysis, the
verification) the rank uses them all; :func:`at_most` caps them for work of tiny parallel loops.
``HISPARSE_HOST_THREADS`` sets the count outright.
"""
import atexit
import os
import threading
import time
from contextlib import contextmanager

#: ranks of this node whose CPU sets overlap this process's (the most on any of its cores)
_ranks_sharing = 1
#: depth of :func:`alone` sections
_alone = 0
#: the caps of the :func:`at_most` sections entered (innermost last)
_caps = []


def _affinity():
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def usable_cores():
    """CPU cores this process may use: its affinity mask (not the machine's count), shared with
    the node's other ranks on the same cores (:func:`share_node`) unless in :func:`alone`, at
    most the caps of :func:`at_most`; or ``HISPARSE_HOST_THREADS``. What the threads of a
    host-side builder or the worker processes of an ordering may take."""
    explicit = os.environ.get("HISPARSE_HOST_THREADS")
    if explicit:
        try:
            return max(1, int(explicit))
        except ValueError:
            pass  # not a number: the rule below
    cores = len(_affinity())
    if not (_alone or _ranks_sharing <= 1):
        cores = max(1, cores // _ranks_sharing)
    return min(cores, *_caps) if _caps else cores


def share_node(local_comm):
    """Count the ranks of this node (``local_comm``) whose CPU sets overlap this process's: the
    most that share any one of its cores. *Collective* over ``local_comm``. Returns the count."""
    global _ranks_sharing
    mine = _affinity()
    masks = [set(mask) for mask in local_comm.allgather(sorted(mine))]
    _ranks_sharing = max((sum(core in mask for mask in masks) for core in mine), default=1)
    return _ranks_sharing


@contextmanager
def alone():
    """While the node's other ranks wait on this one: :func:`usable_cores` gives every core of
    this process's set."""
    global _alone
    _alone += 1
    try:
        yield
    finally:
        _alone -= 1


@contextmanager
def at_most(cores):
    """:func:`usable_cores` at most ``cores`` inside (in :func:`alone` too): work of many tiny
    parallel loops that would only wake threads, beside other busy processes.

    Why: each parallel loop of Numba's OpenMP layer ends with its threads spinning awhile (GNU
    OpenMP's default), and a process whose threads spin on every core slows its own main thread
    as soon as another process wants a core. Cholesky's load of its compiled analysis (a tiny
    analysis, many small parallel loops) took rank 0 0.40-0.49 s on the 2xH200 host with the
    other ranks asleep, 0.87 s beside one rank loading its own at once and 1.41-1.48 s beside
    three (``docs/scaling/stop60_x2/warmup_probe.py``); on the 2-core development host, rank 0's
    on both cores beside a rank loading on one: 0.61-0.74 s, on one thread 0.36-0.48 s."""
    _caps.append(max(1, int(cores)))
    try:
        yield
    finally:
        _caps.pop()


def threaded(work, items, most=32, name="hisparse"):
    """``work(item)`` for every item, by a pool of threads when there are several (at most
    ``most``, and the cores this process may use): NumPy lets the interpreter's lock go in its
    array operations, so host-side builders run on several cores at once. Each item must
    write only its own slices of preallocated arrays, so that the result does not depend on
    the number of threads. The first exception of an item is raised here."""
    from concurrent.futures import ThreadPoolExecutor
    items = list(items)
    workers = min(usable_cores(), most, len(items))
    if workers <= 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        list(pool.map(work, items))


#: Elements per piece of :func:`copy_into` and :func:`take_into` (8 MB of float64: enough to
#: amortise a task, small enough to spread a 100 MB copy over every core).
COPY_PIECE = 1 << 20


def _row_pieces(rows, row_elements, piece=None):
    """``[(start, stop), ...]`` over ``rows`` rows of ``row_elements`` each, in pieces of
    about ``piece`` elements (:data:`COPY_PIECE` when None)."""
    step = max(1, (COPY_PIECE if piece is None else piece) // max(int(row_elements), 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _in_pieces(work, rows, row_elements, name):
    """``work((start, stop))`` over ``rows`` rows of ``row_elements`` elements each: at once
    where they fit one piece, else piece by piece (:func:`_row_pieces`) on the host's threads;
    every piece writes only its own rows."""
    if rows * row_elements <= COPY_PIECE:
        work((0, rows))
    else:
        threaded(work, _row_pieces(rows, row_elements), name=name)


def copy_into(out, source):
    """``out[...] = source`` (same shape), piece by piece along the first axis on the host's
    threads: one NumPy copy runs on one core, and a copy into page-locked memory before an
    upload is host time every repeat (Cholesky's values, 160 MB on the 2000^2 grid)."""
    import numpy as np
    source = np.asarray(source)
    if out.shape != source.shape:
        raise ValueError(f"copy_into: shapes {out.shape} and {source.shape} differ")
    if out.ndim == 0:
        out[...] = source
        return out

    def piece(bounds):
        out[bounds[0]:bounds[1]] = source[bounds[0]:bounds[1]]
    _in_pieces(piece, out.shape[0], out.size // max(out.shape[0], 1), "hisparse-copy")
    return out


def take_into(out, source, index):
    """``out[...] = source[index]`` (a gather along the first axis), piece by piece on the
    host's threads; ``out`` has ``len(index)`` rows of ``source``'s shape."""
    import numpy as np
    index = np.asarray(index)

    def piece(bounds):
        np.take(source, index[bounds[0]:bounds[1]], axis=0, out=out[bounds[0]:bounds[1]])
    _in_pieces(piece, len(index), out.size // max(len(index), 1), "hisparse-take")
    return out


def arange_into(out):
    """``out[...] = np.arange(len(out))``, piece by piece on the host's threads: where ``out``
    is fresh memory its first touch (page faults, about 1 GB/s a core on the hosts measured)
    is most of the time, and the pieces fault in parallel."""
    import numpy as np

    def piece(bounds):
        out[bounds[0]:bounds[1]] = np.arange(bounds[0], bounds[1], dtype=out.dtype)
    _in_pieces(piece, len(out), 1, "hisparse-arange")
    return out


def fill_into(out, value):
    """``out[...] = value`` (a 1-D array), piece by piece on the host's threads: fresh memory's
    first touch faults in parallel (:func:`arange_into`). A generated graph's unit values, 1 GB
    of float64 for R-MAT 23's 131M entries, were a quarter of a second of its read on one
    core."""
    def piece(bounds):
        out[bounds[0]:bounds[1]] = value
    _in_pieces(piece, len(out), 1, "hisparse-fill")
    return out


#: bytes between the writes of :func:`touch_pages` (the smallest page size of the hosts)
PAGE_BYTES = 4096


def touch_pages(out):
    """Write one byte of every page of the C-contiguous array ``out`` (its contents are then
    undefined), piece by piece on the host's threads: fresh memory's page faults taken in
    parallel before a copy that would take them on one core (a device-to-host copy into
    pageable memory: the driver's staging copies fault the pages in as they go)."""
    import numpy as np
    raw = out.reshape(-1).view(np.uint8)

    def piece(pages):  # pages[0] .. pages[1] - 1
        raw[pages[0] * PAGE_BYTES:pages[1] * PAGE_BYTES:PAGE_BYTES] = 0
    _in_pieces(piece, -(-len(raw) // PAGE_BYTES), PAGE_BYTES, "hisparse-touch")
    return out


def searchsorted_into(out, sorted_values, queries, side="left"):
    """``out[...] = np.searchsorted(sorted_values, queries, side)``, piece by piece on the
    host's threads (NumPy lets the interpreter's lock go in the search): the supernode of each
    of A's entries, a search of millions among thousands of panel offsets, was a quarter of a
    second on one core (100^3 Laplacian)."""
    import numpy as np
    queries = np.asarray(queries)

    def piece(bounds):
        out[bounds[0]:bounds[1]] = np.searchsorted(sorted_values, queries[bounds[0]:bounds[1]],
                                                   side=side)
    _in_pieces(piece, len(queries), 1, "hisparse-search")
    return out


#: Elements per piece of :func:`over_pieces` (a pass over 4M values is a few ms: enough to
#: amortise a task).
REDUCE_PIECE = 1 << 22


def over_pieces(work, n, name="hisparse-pass"):
    """``[work(lo, hi), ...]`` over consecutive pieces of ``range(n)`` (in order), on the host's
    threads where there are several pieces of :data:`REDUCE_PIECE` elements: a check or a
    reduction over a read's 100M entries (its indices' range, its values' finiteness, whether
    its rows are sorted) is one NumPy pass a core, which lets the interpreter's lock go, so the
    pieces run at once. ``work`` must only read (or write its own slice)."""
    pieces = _row_pieces(int(n), 1, REDUCE_PIECE) or [(0, 0)]  # one (empty) piece for n = 0
    results = [None] * len(pieces)

    def piece(k):
        results[k] = work(*pieces[k])
    threaded(piece, range(len(pieces)), name=name)
    return results


#: Threads of :func:`in_background` not yet joined at the interpreter's exit
_background = set()
#: Seconds the exit waits for them, all together
EXIT_JOIN_SECONDS = 60.0


@atexit.register
def _join_background():
    """Let the background steps still running finish before the interpreter exits. A run that
    stops early (an error every rank meets in the read, say) left its compiled-code loader
    running in native code (Numba's LLVM) while the process tore down under it: about one exit
    in six hung there under the CI's load, and the other rank with it in ``MPI_Finalize``
    (``mpi4py`` finalises after these handlers). Bounded: a step that never returns is left."""
    deadline = time.monotonic() + EXIT_JOIN_SECONDS
    for thread in list(_background):
        thread.join(max(0.0, deadline - time.monotonic()))


def in_background(steps, name):
    """Run the callables ``steps`` one after another in a daemon thread and return the thread
    (``join`` it before what it prepares is used; ``thread.seconds``: what the steps took,
    NaN when one raised, which ends them quietly: whoever needs what they prepare meets and
    reports the same error). The project's warm-ups (the GPU libraries' import, compiled loops
    loaded from Numba's cache) and its clean-ups run here; the interpreter's exit waits for
    them (:func:`_join_background`)."""

    def run():
        began = time.perf_counter()
        try:
            for step in steps:
                try:
                    step()
                except Exception:  # noqa: BLE001 - met and reported where it is used
                    return
            thread.seconds = time.perf_counter() - began
        finally:
            _background.discard(thread)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.seconds = float("nan")
    _background.add(thread)
    thread.start()
    return thread
