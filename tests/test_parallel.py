"""MPI plumbing under mpiexec at 2 and 4 ranks (the ``parallel`` marker launches them)."""
import numpy as np
import pytest

from hisparse.errors import InputError
from hisparse.parallel import (CollectiveError, all_call, allgather_arrays, bcast_arrays,
                               gather_arrays, get_world, root_call, scatter_arrays)


def _all(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parallel(nprocs=[2, 4])
def test_scatter_gather_round_trip(nprocs):
    comm = get_world()
    assert comm.size == nprocs
    parts = None
    if comm.rank == 0:
        parts = [{"a": np.arange(r * 10, dtype=np.float64).reshape(r * 2, 5) if r else
                  np.zeros((0, 5)), "rows": np.arange(r, 100, nprocs), "tag": f"p{r}"}
                 for r in range(nprocs)]
    mine = scatter_arrays(comm, parts)
    ok = mine["tag"] == f"p{comm.rank}" and np.array_equal(mine["rows"],
                                                          np.arange(comm.rank, 100, nprocs))
    back = gather_arrays(comm, {"rows": mine["rows"] * 2})
    if comm.rank == 0:
        ok = ok and all(np.array_equal(b["rows"], np.arange(r, 100, nprocs) * 2)
                        for r, b in enumerate(back))
    else:
        ok = ok and back is None
    everyone = allgather_arrays(comm, {"r": np.array([comm.rank])})
    ok = ok and [int(e["r"][0]) for e in everyone] == list(range(nprocs))
    shared = bcast_arrays(comm, {"x": np.linspace(0, 1, 7)} if comm.rank == 0 else None)
    ok = ok and np.allclose(shared["x"], np.linspace(0, 1, 7))
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2, 4])
def test_parts_sent_at_once_arrive_whole(nprocs, monkeypatch):
    """Rank 0 sends every rank its part at once (scatter, broadcast, all-gather): each part
    arrives whole and in its own order, with empty, 0-d, strided and chunked arrays among
    them."""
    from hisparse.parallel import _mpi
    monkeypatch.setattr(_mpi, "_CHUNK_BYTES", 64)  # many chunks in flight at once

    def part_of(rank):
        rng = np.random.default_rng(rank)
        wide = rng.standard_normal((9, 8))
        return {"empty": np.zeros((0, 3), dtype=np.int32), "scalar": np.array(rank * 1.5),
                "strided": wide[:, ::3], "ints": rng.integers(0, 1 << 40, 50 + rank),
                "flags": rng.random(33) < 0.5, "rank": rank, "name": f"r{rank}"}

    def same(got, want):
        return set(got) == set(want) and all(
            (np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype
             and got[k].shape == want[k].shape) if isinstance(want[k], np.ndarray)
            else got[k] == want[k] for k in want)

    comm = get_world()
    parts = [part_of(r) for r in range(nprocs)] if comm.rank == 0 else None
    ok = same(scatter_arrays(comm, parts), part_of(comm.rank))
    ok = ok and same(bcast_arrays(comm, part_of(0) if comm.rank == 0 else None), part_of(0))
    everyone = allgather_arrays(comm, part_of(comm.rank))
    ok = ok and all(same(everyone[r], part_of(r)) for r in range(nprocs))
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2, 4])
def test_alltoall_concatenated_is_the_concatenation_of_the_pieces(nprocs, monkeypatch):
    """Each name's pieces arrive in source order in one array, as alltoall_arrays and a
    concatenation give them: 2-D pieces, empty pieces, chunked messages, a name only this rank
    sends itself (returned uncopied), and one name in int32 on some ranks and int64 on others
    (received in int64 everywhere, as the concatenation would be)."""
    from hisparse.parallel import _mpi, alltoall_arrays, alltoall_concatenated
    monkeypatch.setattr(_mpi, "_CHUNK_BYTES", 96)  # many chunks in flight at once
    comm = get_world()
    rank, size = comm.rank, comm.size

    def piece(source, dest):
        rng = np.random.default_rng(100 * source + dest)
        rows = (source + 2 * dest) % 4  # some pieces empty
        return {"ids": rng.integers(0, 1 << 40, rows).astype(np.int32 if source % 2 else
                                                              np.int64),
                "pairs": rng.standard_normal((rows + 1, 3)),
                "own": np.arange(5 * (source + 1)) if source == dest else np.zeros(0, int)}

    parts = [piece(rank, dest) for dest in range(size)]
    got, counts = alltoall_concatenated(comm, parts)
    reference = alltoall_arrays(comm, parts)
    ok = set(got) == {"ids", "pairs", "own"}
    for name in ("ids", "pairs", "own"):
        want = np.concatenate([part[name] for part in reference])
        ok = ok and np.array_equal(got[name], want) and got[name].shape == want.shape
        ok = ok and list(counts[name]) == [len(part[name]) for part in reference]
    ok = ok and got["ids"].dtype == np.int64 and got["own"] is parts[rank]["own"]
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2])
def test_large_array_travels_in_chunks(nprocs, monkeypatch):
    from hisparse.parallel import _mpi
    monkeypatch.setattr(_mpi, "_CHUNK_BYTES", 1000)  # force many chunks on a small array
    comm = get_world()
    data = np.random.default_rng(0).standard_normal(12345)
    got = bcast_arrays(comm, {"d": data} if comm.rank == 0 else None)["d"]
    assert _all(comm, np.array_equal(got, data))


@pytest.mark.parallel(nprocs=[2, 4])
def test_root_errors_become_collective(nprocs):
    comm = get_world()

    def fails_on_root():
        raise InputError("bad.h5: broken")

    with pytest.raises(CollectiveError, match="bad.h5: broken"):
        root_call(comm, fails_on_root)

    def fails_on_last_rank():
        if comm.rank == comm.size - 1:
            raise InputError("local problem")
        return comm.rank

    with pytest.raises(CollectiveError, match=f"rank {nprocs - 1}: local problem"):
        all_call(comm, fails_on_last_rank)
    assert root_call(comm, lambda: 42) == (42 if comm.rank == 0 else None)


@pytest.mark.parallel(nprocs=[2])
def test_expected_failures_and_interrupts_on_root_reach_every_rank(nprocs):
    """Out of memory on rank 0 is one collective error (no abort); an interruption there makes
    every rank raise Interrupted at the same call (issue 16)."""
    import signal
    from hisparse.errors import Interrupted
    comm = get_world()

    def allocate_too_much():
        return np.zeros(2 ** 50, dtype=np.float64)

    with pytest.raises(CollectiveError, match="out of memory: cannot allocate 8 PiB"):
        root_call(comm, allocate_too_much)

    def interrupted():
        raise Interrupted(signal.SIGTERM, "write")

    with pytest.raises(Interrupted) as info:
        root_call(comm, interrupted)
    assert info.value.collective and info.value.exit_status == 143

    def everyone_fails():
        raise InputError("same on every rank")

    with pytest.raises(CollectiveError) as same:
        all_call(comm, everyone_fails)
    assert str(same.value) == "same on every rank"


@pytest.mark.parallel(nprocs=[2])
def test_ranks_agree_on_a_signal_only_one_rank_got(nprocs):
    import signal
    from hisparse.errors import Interrupted
    from hisparse.parallel import STOP_SIGNALS, StopRequest
    comm = get_world()
    with StopRequest(comm, STOP_SIGNALS) as stops:
        assert not stops.agree("setup")
        if comm.rank == 1:
            stops.guard._note(signal.SIGUSR1)  # as the watcher thread records it
        stopped = stops.agree("repeats")
        ok = stopped and stops.stopped_at == "repeats"
        if comm.rank == 0:
            stops.guard._note(signal.SIGTERM)
        try:
            stops.agree("peers")
            ok = False
        except Interrupted as exc:
            ok = ok and exc.collective and exc.signum == signal.SIGTERM and exc.phase == "peers"
    assert _all(comm, ok)
