"""Planned collectives of hisparse.parallel against NumPy, on 1, 2 and 4 ranks."""
import os

import numpy as np
import pytest

from hisparse.parallel import AllReduce, RowAllGather, RowGather, get_world


def _agree(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parallel(nprocs=[2, 4])
def test_row_allgather_fills_every_block(nprocs):
    comm = get_world()
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 9, size=comm.size)  # some ranks own no rows
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    width = 3
    expected = rng.standard_normal((int(counts.sum()), width))
    full = np.zeros_like(expected)
    lo, n = int(offsets[comm.rank]), int(counts[comm.rank])
    full[lo:lo + n] = expected[lo:lo + n]
    RowAllGather(comm, lo, n, width)(full)
    assert _agree(comm, np.array_equal(full, expected))


@pytest.mark.parallel(nprocs=[2, 4])
def test_allreduce_sums_in_place(nprocs):
    comm = get_world()
    local = np.full((2, 2), comm.rank + 1.0)
    AllReduce(comm)(local)
    total = comm.size * (comm.size + 1) / 2
    assert _agree(comm, np.all(local == total) and AllReduce(comm, "max").scalar(comm.rank)
                  == comm.size - 1)


@pytest.mark.parallel(nprocs=[2, 4])
def test_row_gather_puts_rows_in_global_order(nprocs):
    comm = get_world()
    n = 23
    rows = np.arange(comm.rank, n, comm.size)  # row-modulo ownership
    values = np.stack([rows * 10.0, -rows], axis=1)
    gathered = RowGather(comm, rows, n)(values)
    if comm.rank == 0:
        ok = np.array_equal(gathered, np.stack([np.arange(n) * 10.0, -np.arange(n)], axis=1))
    else:
        ok = gathered is None
    assert _agree(comm, ok)


def test_single_rank_collectives_are_identity():
    comm = get_world()
    full = np.arange(6.0).reshape(3, 2)
    assert RowAllGather(comm, 0, 3, 2)(full) is full
    rows = np.array([2, 0, 1])
    out = RowGather(comm, rows, 3)(np.array([20.0, 0.0, 10.0]))
    assert np.array_equal(out, [0.0, 10.0, 20.0])


@pytest.mark.parallel(nprocs=[2, 4])
@pytest.mark.parametrize("route", ["runs", "table"])
def test_halo_exchange_delivers_the_owners_values(nprocs, route, monkeypatch):
    comm = get_world()
    from hisparse.parallel import HaloExchange, _collectives
    if route == "table":  # every rank has more runs than this: the owner table's route
        monkeypatch.setattr(_collectives, "MAX_OWNED_RUNS", 1)
    n = 57
    rng = np.random.default_rng(11)  # same draw on every rank: a random ownership map
    owner = rng.integers(0, comm.size, size=n)
    owner[owner == comm.size - 1] = 0  # the last rank owns nothing
    x = rng.standard_normal(n)
    owned = np.flatnonzero(owner == comm.rank)
    local = x[owned]
    # Each rank needs a random subset of what others own; rank 1 needs nothing.
    mine = np.random.default_rng(100 + comm.rank)
    candidates = np.flatnonzero(owner != comm.rank)
    ghosts = mine.choice(candidates, size=min(9, len(candidates)), replace=False) \
        if comm.rank != 1 else np.zeros(0, np.int64)
    halo = HaloExchange(comm, owned, ghosts, n)
    out = np.full(halo.n_ghosts, np.nan)
    halo(local, out)
    ok = np.array_equal(out, x[halo.ghosts]) and set(halo.ghosts) == set(ghosts)
    ok = ok and np.all(np.diff(owner[halo.ghosts]) >= 0)  # grouped by owner
    assert _agree(comm, ok)


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("layout", ["ranges", "runs", "shuffled", "overlap", "empty"])
def test_owners_found_from_runs_equal_the_owner_table(nprocs, layout, monkeypatch):
    """Owners and local positions from every rank's runs of consecutive indices, against the
    owner table over every index (the route taken where runs are too many or overlap)."""
    from hisparse.parallel import _collectives
    comm = get_world()
    n = 1000
    if layout == "ranges":
        bounds = [0, 300, 310, n]
        owned = np.arange(bounds[comm.rank], bounds[comm.rank + 1])
    elif layout in ("runs", "shuffled"):  # interleaved blocks of 7..40 indices
        rng = np.random.default_rng(5)
        cuts = np.unique(np.concatenate([[0, n], rng.integers(1, n, 60)]))
        block_owner = rng.integers(0, comm.size, len(cuts) - 1)
        owned = np.concatenate([np.arange(cuts[b], cuts[b + 1])
                                for b in np.flatnonzero(block_owner == comm.rank)] or
                               [np.zeros(0, np.int64)])
        if layout == "shuffled":  # the local order is not ascending
            owned = owned[np.random.default_rng(comm.rank).permutation(len(owned))]
    elif layout == "overlap":  # ranks 0 and 1 both claim 100..199: the table decides
        owned = {0: np.arange(0, 200), 1: np.arange(100, 500), 2: np.arange(500, n)}[comm.rank]
    else:  # rank 1 owns nothing
        owned = {0: np.arange(0, 600), 1: np.arange(0), 2: np.arange(600, n)}[comm.rank]
    owned = owned.astype(np.int64)
    by_runs = _collectives._Owners(comm, owned, n)
    monkeypatch.setattr(_collectives, "MAX_OWNED_RUNS", 0)
    by_table = _collectives._Owners(comm, owned, n)
    assert by_table.table is not None
    assert (by_runs.table is None) == (layout != "overlap")
    probe = np.arange(-3, n + 3, dtype=np.int64)
    ok = np.array_equal(by_runs.of(probe), by_table.of(probe))
    mine = np.sort(owned)[::3]
    positions = by_runs.local_positions(owned, mine)
    ok = ok and np.array_equal(owned[positions], mine)
    assert _agree(comm, ok)


def test_halo_exchange_rejects_unowned_indices():
    from hisparse.parallel import HaloExchange
    comm = get_world()
    with pytest.raises(ValueError, match="owned by no rank"):
        HaloExchange(comm, np.arange(3), np.array([5]), 6)


def test_transport_choice():
    from hisparse.errors import HisparseError
    from hisparse.parallel import resolve_transport
    assert resolve_transport("auto", "cpu", 4) == "mpi"
    assert resolve_transport("auto", "gpu", 1) == "mpi"
    assert resolve_transport("mpi", "gpu", 4) == "mpi"
    with pytest.raises(HisparseError, match="backend: gpu"):
        resolve_transport("nccl", "cpu", 2)
    # an operation whose collectives all move host buffers gets MPI under auto
    assert resolve_transport("auto", "gpu", 4, device_collectives=False) == "mpi"


def test_ranks_share_a_gpu_only_when_bound_to_one_bus_id():
    """A node's ranks share a GPU when two are bound to one PCI bus id: not when each sees its
    own GPU alone as ordinal 0 (a per-rank CUDA_VISIBLE_DEVICES), which a count of the visible
    devices took for sharing."""
    from hisparse.parallel._transport import shares_a_gpu

    class Node:  # a node communicator whose ranks are bound to the GPUs ``buses``
        def __init__(self, buses):
            self.buses, self.size = buses, len(buses)

        def allgather(self, mine):
            return list(self.buses)

    own = ["0000:1A:00.0", "0000:2B:00.0", "0000:3C:00.0", "0000:4D:00.0"]
    assert not shares_a_gpu(Node(own), bound=lambda: own[0])
    assert shares_a_gpu(Node(own[:2] + own[:1]), bound=lambda: own[0])
    assert not shares_a_gpu(Node(own[:1]), bound=lambda: own[0])


def test_transport_modules_named_exactly_where_nccl_is_chosen(monkeypatch):
    """The driver imports CuPy's NCCL binding early (under CUDA's initialisation) exactly for
    the runs whose transport resolves to NCCL on a machine that has it, and nothing otherwise."""
    from hisparse.parallel import _nccl, resolve_transport, transport_modules
    monkeypatch.setattr(_nccl, "_nccl_module", lambda: None)  # as if CuPy had NCCL
    for requested in ("auto", "mpi", "nccl"):
        for backend in ("cpu", "gpu"):
            for size in (1, 2, 4):
                for device_collectives in (True, False):
                    wanted = transport_modules(requested, backend, size, device_collectives)
                    if backend == "cpu" and requested == "nccl":
                        assert wanted == ()  # refused by open_transport, nothing to import
                        continue
                    chosen = resolve_transport(requested, backend, size, False,
                                               device_collectives)
                    assert wanted == ((_nccl.NCCL_MODULES[0],) if chosen == "nccl" else ()), \
                        (requested, backend, size, device_collectives)


def test_operations_that_move_device_buffers_declare_it():
    """DEVICE_COLLECTIVES: true exactly where an operation's code moves device buffers between
    ranks (the planned collectives on GPU arrays, the nonzeros' routing on NCCL)."""
    from hisparse.ops import OPERATIONS, get_operation_class
    declared = {name: get_operation_class(name).DEVICE_COLLECTIVES for name in OPERATIONS}
    assert declared == {"spmv": True, "cpals": True, "sptv": False, "spgemm": False,
                        "cholesky": False}


def test_nccl_channel_limit_keeps_the_environments_value(monkeypatch):
    """parallel.nccl_channels sets NCCL_MAX_NCHANNELS (auto: the measured default; 0: NCCL's own
    choice, nothing set), and never replaces a value the job's environment already has."""
    from hisparse.parallel import _nccl as _transport
    monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    assert _transport.nccl_channel_limit(0) == 0 and "NCCL_MAX_NCHANNELS" not in os.environ
    assert _transport.nccl_channel_limit("auto") == _transport.AUTO_NCCL_CHANNELS
    assert os.environ["NCCL_MAX_NCHANNELS"] == str(_transport.AUTO_NCCL_CHANNELS)
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "12")  # the user's
    assert _transport.nccl_channel_limit(2) == 12 and os.environ["NCCL_MAX_NCHANNELS"] == "12"
    assert _transport.nccl_channels_in_force() == 12
    # under auto an operation's own count wins; an explicit setting wins over it
    assert _transport.nccl_channels_for("auto", 4) == 4
    assert _transport.nccl_channels_for("auto", None) == "auto"
    assert _transport.nccl_channels_for(8, 4) == 8 and _transport.nccl_channels_for(0, 4) == 0


@pytest.mark.parametrize("value, ok", [("auto", True), (0, True), (8, True), (-1, False),
                                       ("many", False)])
def test_nccl_channels_setting(tmp_path, value, ok):
    from hisparse.config import load_config
    from hisparse.errors import ConfigError
    path = tmp_path / "c.yaml"
    path.write_text("operation: {name: spmv}\ninput: {generate: {kind: poisson, dims: [4, 4]}}\n")
    if ok:
        config = load_config(str(path), [f"parallel.nccl_channels={value}"])
        assert config["parallel.nccl_channels"] == value
    else:
        with pytest.raises(ConfigError, match="nccl_channels"):
            load_config(str(path), [f"parallel.nccl_channels={value}"])


class _HostAsDevice:
    """A NumPy array posing as a device array (``gpudata``, ``get``, ``set``): the transports'
    staging of device buffers through host memory, run without a GPU."""

    def __init__(self, array):
        self.array = np.array(array)
        self.gpudata = 4096
        self.shape, self.dtype, self.size = self.array.shape, self.array.dtype, self.array.size

    def get(self):
        return self.array.copy()

    def set(self, host):
        assert host.shape == self.shape and host.dtype == self.dtype
        self.array[...] = host


@pytest.mark.parallel(nprocs=[2, 4])
def test_mpi_transport_stages_device_buffers_through_the_host(nprocs):
    """The MPI transport's primitives on (posing) device buffers give what they give on host
    buffers: all-gather of uneven blocks, all-reduce, and an exchange whose own part (not moved)
    keeps the receive buffer's contents."""
    from hisparse.parallel import MpiTransport
    comm = get_world()
    transport = MpiTransport(comm)
    size, rank = comm.size, comm.rank
    counts = np.array([3, 0, 5, 2][:size] if size > 2 else [4, 7])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    full = np.arange(int(counts.sum()) * 2, dtype=np.float64).reshape(-1, 2)
    mine = np.zeros_like(full)
    lo, n = int(displs[rank]), int(counts[rank])
    mine[lo:lo + n] = full[lo:lo + n]
    staged = _HostAsDevice(mine)
    ok = transport.all_gatherv(staged, counts * 2, displs * 2) is staged
    ok = ok and np.array_equal(staged.array, full)

    reduced = _HostAsDevice(np.full(3, rank + 1, dtype=np.int64))
    transport.all_reduce(reduced, "max")
    ok = ok and np.array_equal(reduced.array, [size] * 3)
    ok = ok and transport.reduce_number(rank, "min") == 0

    # rank r sends r + p + 1 copies of 100 r + p to rank p (its own pair included, not moved)
    send_counts = np.array([rank + p + 1 for p in range(size)])
    send_displs = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    send = np.concatenate([np.full(c, 100 * rank + p, np.int32) for p, c in enumerate(send_counts)])
    recv_counts = np.array([s + rank + 1 for s in range(size)])
    recv_displs = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    received = _HostAsDevice(np.full(int(recv_counts.sum()), -7, np.int32))
    transport.exchange(_HostAsDevice(send), send_counts, send_displs,
                       received, recv_counts, recv_displs)
    expected = np.concatenate([np.full(c, -7 if s == rank else 100 * s + rank, np.int32)
                               for s, c in enumerate(recv_counts)])
    ok = ok and np.array_equal(received.array, expected)
    host = np.full(int(recv_counts.sum()), -7, np.int32)
    transport.exchange(send, send_counts, send_displs, host, recv_counts, recv_displs)
    ok = ok and np.array_equal(host, expected)
    assert _agree(comm, ok)


class _RecordingNccl:
    """An NCCL communicator and module that record the calls the NCCL transport issues."""

    NCCL_FLOAT64, NCCL_FLOAT32, NCCL_INT64, NCCL_INT32, NCCL_UINT8 = "f8", "f4", "i8", "i4", "u1"
    NCCL_SUM, NCCL_MAX, NCCL_MIN = "sum", "max", "min"

    def __init__(self):
        self.calls = []

    def groupStart(self):
        self.calls.append(("group",))

    def groupEnd(self):
        self.calls.append(("end",))

    def send(self, pointer, count, kind, peer, stream):
        self.calls.append(("send", pointer, count, kind, peer, stream))

    def recv(self, pointer, count, kind, peer, stream):
        self.calls.append(("recv", pointer, count, kind, peer, stream))

    def allReduce(self, source, target, count, kind, op, stream):
        self.calls.append(("allreduce", source, target, count, kind, op, stream))


class _Stream:
    handle = 77


def _recording_transport(rank, size):
    from types import SimpleNamespace
    from hisparse.parallel import NcclTransport
    transport = NcclTransport.__new__(NcclTransport)  # no CuPy here: the module is the recorder
    transport.comm = SimpleNamespace(rank=rank, size=size)
    transport.timeout = 1.0
    transport.nccl = transport._lib = _RecordingNccl()
    return transport


def test_nccl_transport_issues_one_group_of_sends_and_receives_per_collective():
    """The NCCL transport's schedule, recorded: an all-gather is one group in which this rank
    sends its block to every peer and receives each peer's block in place (element offsets as
    byte addresses); an all-reduce is one call; a halo exchange sends only nonempty parts; host
    arrays go through MPI, not NCCL."""
    from hisparse.parallel import AllReduce, RowAllGather
    transport = _recording_transport(rank=1, size=3)
    full = _HostAsDevice(np.zeros((9, 2)))
    gather = RowAllGather.__new__(RowAllGather)
    gather.transport, gather.comm, gather.width = transport, transport.comm, 2
    gather.offset, gather.count = 2, 3
    gather.offsets, gather.counts = np.array([0, 2, 5]), np.array([2, 3, 4])
    gather(full, stream=_Stream())
    base = full.gpudata
    assert transport.nccl.calls == [
        ("group",),
        ("send", base + 4 * 8, 6, "f8", 0, 77), ("recv", base, 4, "f8", 0, 77),
        ("send", base + 4 * 8, 6, "f8", 2, 77), ("recv", base + 10 * 8, 8, "f8", 2, 77),
        ("end",)]
    transport.nccl.calls.clear()
    values = _HostAsDevice(np.zeros(5, np.float32))
    AllReduce(transport, "max")(values)
    assert transport.nccl.calls == [("allreduce", base, base, 5, "f4", "max", 0)]
    transport.nccl.calls.clear()
    transport.exchange(None, [0, 0, 0], [0, 0, 0], _HostAsDevice(np.zeros(4, np.int64)),
                       [3, 5, 1], [0, 3, 3])
    assert transport.nccl.calls == [("group",), ("recv", base, 3, "i8", 0, 0),
                                    ("recv", base + 3 * 8, 1, "i8", 2, 0), ("end",)]
    assert transport.carries(np.int32) and not transport.carries(np.int16)
    assert transport.describe()["transport"] == "nccl"


@pytest.mark.parallel(nprocs=[2])
def test_ranks_wait_for_rank_0_asleep(nprocs):
    # The ranks that wait while rank 0 works alone (the verification) leave it their cores: a
    # blocking barrier would spin, using about the wall time in CPU time.
    import time
    from hisparse.parallel import barrier_asleep
    comm = get_world()
    comm.Barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    if comm.rank == 0:
        time.sleep(0.5)
    barrier_asleep(comm)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    waited_asleep = comm.rank == 0 or (wall >= 0.45 and cpu < 0.5 * wall)
    assert _agree(comm, waited_asleep)
