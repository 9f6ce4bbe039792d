"""Host threads: how many cores this process may use, and a pool that runs NumPy work on them
(NumPy releases the interpreter's lock in its array operations)."""
import os


def usable_cores():
    """CPU cores this process may use (its affinity mask, not the machine's count): what the
    threads of a host-side builder or the worker processes of an ordering may take."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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
