"""Shared test helpers: write a run config (``yaml.safe_dump``), run it (in-process or under
mpiexec), and read back the results file and its ``/result`` arrays.

Every test that drives ``hisparse run`` builds its config here, so the config shape lives in one
place::

    cfg = write_config(tmp_path, "spmv", {"x": "ones"}, input={"path": str(h5)}, backend="cpu")
    run, arrays = run_config(tmp_path, cfg, nprocs=2)
"""
import copy
from contextlib import contextmanager

import h5py
import numpy as np
import pytest
import yaml

from hisparse.io import read_results

from conftest import run_hisparse

BASE_RUN = {"name": "t", "repeats": 2, "warmup": 1}


def config_dict(tmp_path, operation, params=None, out="out", run=None, **sections):
    """The config mapping: ``operation`` with ``params``, results under ``tmp_path/out``, and
    any other top-level sections (``input={...}``, ``backend="cpu"``, ``peers=[...]``)."""
    data = {"run": dict(BASE_RUN, **(run or {})),
            "operation": {"name": operation, "params": copy.deepcopy(params or {})},
            "output": {"dir": str(tmp_path / out)}}
    for key, value in sections.items():
        data[key] = copy.deepcopy(value)
    return data


def write_config(tmp_path, operation, params=None, name="run.yaml", out="out", run=None,
                 **sections):
    """Write :func:`config_dict`'s mapping as YAML to ``tmp_path/name``; returns the path."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config_dict(tmp_path, operation, params, out, run,
                                               **sections)))
    return path


def results_in(directory):
    """The one results file in ``directory`` (asserts there is exactly one)."""
    files = sorted(directory.glob("*.h5"))
    assert len(files) == 1, f"expected one results file in {directory}, found {files}"
    return files[0]


def read_run(path):
    """``(read_results(path), {name: array} of /result)``."""
    with h5py.File(path, "r") as handle:
        arrays = {k: handle["result"][k][()] for k in handle.get("result", {})}
    return read_results(str(path)), arrays


def run_config(tmp_path, config_path, nprocs=1, out="out", extra_args=(), expect_rc=0):
    """Run ``hisparse run CONFIG`` (under mpiexec when ``nprocs > 1``) and read its results.

    Returns ``(run, arrays)`` when the run is expected to succeed, else the CompletedProcess.
    """
    proc = run_hisparse(["run", config_path, "--quiet", *extra_args], nprocs=nprocs)
    assert proc.returncode == expect_rc, proc.stderr[-4000:]
    if expect_rc != 0:
        return proc
    return read_run(results_in(tmp_path / out))


def run_context(tmp_path, operation, params=None, backend="cpu", device=None, comm=None,
                **sections):
    """This process as a run of ``operation`` with ``params`` on ``backend`` (``sections`` as
    :func:`config_dict` takes them): the RunContext the operation's setup gets, with the
    operation's phase timer, on ``comm`` -- by default the world (one rank without mpiexec, or
    every rank under it); no communicator is faked."""
    from hisparse.config import config_from_dict
    from hisparse.context import RunContext
    from hisparse.ops import get_operation_class
    from hisparse.parallel import get_world, node_local
    from hisparse.timing import PhaseTimer
    comm = get_world() if comm is None else comm
    config = config_from_dict(config_dict(tmp_path, operation, params, backend=backend,
                                          **sections))
    return RunContext(config=config, comm=comm, local_comm=node_local(comm), backend=backend,
                      timer=PhaseTimer(get_operation_class(operation).phases()), device=device)


def bind_gpu(backend, ordinal=0):
    """GPU ``ordinal`` bound for the ``gpu`` backend (the caller releases it), None for cpu."""
    if backend != "gpu":
        return None
    from hisparse.gpu import bind_device
    return bind_device(ordinal)


@contextmanager
def gpu_bound(ordinal=0):
    """GPU ``ordinal`` bound for the block, released after it."""
    device = bind_gpu("gpu", ordinal)
    try:
        yield device
    finally:
        device.release()


#: One test body on NumPy and on CuPy (the GPU case marked ``gpu``): parametrize ``module`` with
#: this and take the module from :func:`array_module_named`.
ARRAY_MODULES = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def array_module_named(name):
    """``numpy``, or CuPy for ``"cupy"``."""
    if name == "numpy":
        return np
    from hisparse.gpu._blas import import_cupy
    return import_cupy("test")


def host_values(array):
    """An engine's array (NumPy, or a PyCUDA / CuPy device array) as a NumPy copy."""
    return array.get() if hasattr(array, "get") else np.array(array)


def engine_for(ctx, local, *choice):
    """The engine the operation of ``ctx`` picks for its backend on ``local`` (``choice``:
    ``pick_engine``'s further arguments, e.g. SpMV's format), as the operation's setup picks it
    (not uploaded)."""
    from hisparse.ops import get_operation_class
    return get_operation_class(ctx.config["operation.name"])(ctx).pick_engine(local, *choice)


@contextmanager
def gpu_transport(kind):
    """``(comm, device, transport)`` inside a test run under mpiexec: this rank's GPU bound and
    the transport of ``kind`` ("nccl" or "mpi") made; both released on exit. NCCL needs a GPU
    per rank: the test is skipped when the node has fewer."""
    import pycuda.driver as cuda
    from hisparse.gpu import bind_device
    from hisparse.parallel import get_world, make_transport, node_local
    comm = get_world()
    cuda.init()
    if kind == "nccl" and cuda.Device.count() < node_local(comm).size:
        pytest.skip("NCCL needs one GPU per rank")
    device = bind_device(node_local(comm).rank)
    transport = make_transport(comm, kind, timeout=60)
    try:
        yield comm, device, transport
    finally:
        transport.close()
        device.release()


def agree(comm, ok):
    """Whether ``ok`` holds on every rank (collective: one failing rank fails them all)."""
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


def random_spd(n, density, seed):
    """A random symmetric positive definite matrix (SciPy CSR): a random pattern made symmetric,
    strictly diagonally dominant."""
    import numpy as np
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    b = sp.random(n, n, density=density, random_state=rng, format="csr")
    a = b + b.T
    a = a + sp.diags(np.asarray(abs(a).sum(axis=1)).ravel() + 1.0)
    return sp.csr_matrix(a)
