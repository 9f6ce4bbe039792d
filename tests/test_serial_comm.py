"""The one-rank world of a process no MPI launcher started (``hisparse.parallel._serial``): each
call gives what mpi4py's ``COMM_SELF`` gives (one test body on both, compared), and
``get_world`` picks it only without a launcher."""
import os
import subprocess
import sys

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI")

from hisparse.parallel._serial import SerialComm  # noqa: E402


def _exercise(comm):
    """Every call hisparse makes on its world, as it makes them; returns what each gave."""
    rng = np.random.default_rng(5)
    part = {"rows": rng.integers(0, 9, 7), "name": "p", "shape": (3, 4)}
    out = {"bcast": comm.bcast(part, root=0), "gather": comm.gather(part, root=0),
           "allgather": comm.allgather(part), "alltoall": comm.alltoall([part]),
           "allreduce": comm.allreduce(3.5, op=MPI.SUM), "max": comm.allreduce(7, op=MPI.MAX),
           "lor": comm.allreduce(False, op=MPI.LOR), "exscan": comm.exscan(4),
           "rank": comm.rank, "size": comm.size}
    out["copied"] = out["bcast"]["rows"] is not part["rows"]
    comm.Barrier()
    values = rng.random(6)
    reduced = np.zeros(6)
    comm.Allreduce([values, MPI.DOUBLE], [reduced, MPI.DOUBLE], op=MPI.SUM)
    in_place = values.copy()
    comm.Allreduce(MPI.IN_PLACE, [in_place, MPI.DOUBLE], op=MPI.MAX)
    out["Allreduce"], out["Allreduce_in_place"] = reduced, in_place
    full = rng.random(10)
    kept = full.copy()
    comm.Allgatherv(MPI.IN_PLACE, [full, ([10], [0]), MPI.DOUBLE])
    out["Allgatherv_in_place_kept"] = np.array_equal(full, kept)
    gathered = np.zeros(12)
    comm.Allgatherv([values, MPI.DOUBLE], [gathered, ([6], [3]), MPI.DOUBLE])
    out["Allgatherv"] = gathered
    send = rng.integers(0, 100, 8).astype(np.int64)
    recv = np.full(9, -1, dtype=np.int64)
    comm.Alltoallv([send, ([5], [2]), MPI.INT64_T], [recv, ([5], [4]), MPI.INT64_T])
    out["Alltoallv"] = recv
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    out["local"] = (local.rank, local.size, local.allgather(1))
    return out


def test_serial_world_answers_as_comm_self():
    ours, theirs = _exercise(SerialComm()), _exercise(MPI.COMM_SELF)
    assert ours.keys() == theirs.keys()
    for key in ours:
        a, b = ours[key], theirs[key]
        if key in ("bcast", "gather", "allgather", "alltoall"):
            first = (lambda x: x[0]) if isinstance(a, list) else (lambda x: x)
            assert len(np.atleast_1d(a)) == len(np.atleast_1d(b))
            np.testing.assert_array_equal(first(a)["rows"], first(b)["rows"])
            assert first(a)["shape"] == first(b)["shape"] and first(a)["name"] == "p"
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=key)
        else:
            assert a == b, key
    assert ours["copied"] and ours["rank"] == 0 and ours["size"] == 1


def test_serial_world_has_no_peer_to_message():
    with pytest.raises(RuntimeError, match="no peer"):
        SerialComm().send({"x": 1}, dest=0)
    with pytest.raises(ValueError, match="root 1"):
        SerialComm().bcast(1, root=1)


def _world_in_child(extra_env):
    from hisparse.parallel._launcher import LAUNCHERS, MPI_MODE_VARIABLE
    launched = {variable for _, variables in LAUNCHERS for variable in variables}
    env = {k: v for k, v in os.environ.items()
           if k not in launched and k != MPI_MODE_VARIABLE}
    env.update(extra_env)
    code = ("from hisparse.parallel import get_world; w = get_world(); from mpi4py import MPI; "
            "print(type(w).__name__, w.size, MPI.Is_initialized())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_get_world_initialises_mpi_only_under_a_launcher_or_when_asked():
    assert _world_in_child({}) == ["SerialComm", "1", "False"]
    assert _world_in_child({"HISPARSE_MPI": "always"}) == ["Intracomm", "1", "True"]
    proc_env = {"HISPARSE_MPI": "sometimes"}
    with pytest.raises(AssertionError, match="expected auto or always"):
        _world_in_child(proc_env)


def test_launched_process_with_mpi_left_uninitialised_is_told_so():
    code = ("import os, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "os.environ['HISPARSE_MPI'] = 'always'; from hisparse.parallel import get_world; "
            "get_world()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "MPI is not initialised" in proc.stderr
