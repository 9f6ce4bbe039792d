"""Device transports: the planned collectives on GPUArrays through NCCL (one rank per GPU) and
staged through host MPI, compared with the host collectives on the same data."""
import numpy as np
import pytest

from hisparse.parallel import AllReduce, HaloExchange, RowAllGather

from helpers import agree, gpu_transport


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2])
@pytest.mark.parametrize("kind", ["nccl", "mpi"])
def test_device_collectives_match_host(nprocs, kind):
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    with gpu_transport(kind) as (comm, device, transport):
        stream = cuda.Stream()
        rng = np.random.default_rng(5)
        counts = np.array([3, 0, 5, 2][:comm.size] if comm.size > 2 else [4, 7])
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        full = rng.standard_normal((int(counts.sum()), 4))
        lo, n = int(offsets[comm.rank]), int(counts[comm.rank])
        mine = np.zeros_like(full)
        mine[lo:lo + n] = full[lo:lo + n]
        dev = gpuarray.to_gpu(mine)
        RowAllGather(transport, lo, n, 4)(dev, stream=stream)
        transport.wait(stream)
        ok = np.array_equal(dev.get(), full)

        values = gpuarray.to_gpu(np.arange(6.0) * (comm.rank + 1))
        AllReduce(transport)(values, stream=stream)
        transport.wait(stream)
        ok = ok and np.allclose(values.get(), np.arange(6.0) * comm.size * (comm.size + 1) / 2)

        n_global = 40
        owner = np.arange(n_global) % comm.size
        x = rng.standard_normal(n_global)
        owned = np.flatnonzero(owner == comm.rank)
        ghosts = np.flatnonzero(owner != comm.rank)[::3]
        halo = HaloExchange(transport, owned, ghosts, n_global)
        ghost_dev = gpuarray.empty(halo.n_ghosts, np.float64)
        halo(gpuarray.to_gpu(x[owned]), ghost_dev, stream=stream)
        transport.wait(stream)
        ok = ok and np.array_equal(ghost_dev.get(), x[halo.ghosts])
        assert agree(comm, ok)


class _ByColumn:
    """Owners of nonzeros: coordinate 1 modulo the rank count, except that every nonzero of rank
    0's own slice (coordinate 0 below 0) stays there -- so some pieces are empty."""

    def __init__(self, nparts):
        self.nparts = nparts

    def part_of(self, indices):
        from hisparse.arrays import array_module
        xp = array_module(indices)
        owner = indices[:, 1] % self.nparts
        return xp.where(indices[:, 0] < 0, 0, owner)


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2])
def test_device_routing_of_nonzeros_matches_the_host_routing(nprocs):
    """route_nonzeros on an NCCL transport (CuPy arrays, GPU to GPU) gives every rank the same
    nonzeros in the same order as the host route through MPI: source rank order, each source's
    in its own order; a rank that sends nothing to a peer, and 2-D coordinates, included."""
    cupy = pytest.importorskip("cupy")
    from hisparse.layout import route_nonzeros
    with gpu_transport("nccl") as (comm, device, transport):
        rng = np.random.default_rng(40 + comm.rank)
        k = 1000 + 137 * comm.rank
        indices = rng.integers(0, 50, size=(k, 3)).astype(np.int64)
        if comm.rank == 0:
            indices[:, 0] = -1  # rank 0 keeps all of its own
        values = rng.standard_normal(k)
        grid = _ByColumn(comm.size)
        host = route_nonzeros(comm, grid, {"indices": indices.copy(), "values": values.copy()})
        moved = route_nonzeros(comm, grid, {"indices": cupy.asarray(indices),
                                            "values": cupy.asarray(values)}, transport)
        ok = (isinstance(moved["values"], cupy.ndarray)
              and np.array_equal(cupy.asnumpy(moved["indices"]), host["indices"])
              and np.array_equal(cupy.asnumpy(moved["values"]), host["values"]))
        assert agree(comm, ok)


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2, 3])
def test_early_connections_on_the_join_thread_then_collectives_work(nprocs):
    """parallel.connect_early: the NCCL communicator made on its thread in the background, the
    pairs connected there (an exchange with every peer and an all-reduce), then the planned
    collectives on the main thread's stream give the host's results."""
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from hisparse.gpu import bind_device
    from hisparse.parallel import get_world, make_transport, node_local
    comm = get_world()
    cuda.init()
    if cuda.Device.count() < node_local(comm).size:
        pytest.skip("NCCL needs one GPU per rank")
    device = bind_device(node_local(comm).rank)
    transport = make_transport(comm, "nccl", timeout=60, background=True, connect_early=True)
    try:
        transport.ready()
        stream = cuda.Stream()
        values = gpuarray.to_gpu(np.arange(5.0) + comm.rank)
        AllReduce(transport)(values, stream=stream)
        transport.wait(stream)
        expected = np.arange(5.0) * comm.size + comm.size * (comm.size - 1) / 2
        ok = np.allclose(values.get(), expected)
        n_global = 30
        owned = np.flatnonzero(np.arange(n_global) % comm.size == comm.rank)
        ghosts = np.setdiff1d(np.arange(n_global), owned)
        x = np.arange(n_global, dtype=np.float64) * 1.5
        halo = HaloExchange(transport, owned, ghosts, n_global)
        ghost_dev = gpuarray.empty(halo.n_ghosts, np.float64)
        halo(gpuarray.to_gpu(x[owned]), ghost_dev, stream=stream)
        transport.wait(stream)
        ok = ok and np.array_equal(ghost_dev.get(), x[halo.ghosts])
    finally:
        transport.close()
        device.release()
    assert agree(comm, ok)
