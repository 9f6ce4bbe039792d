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
