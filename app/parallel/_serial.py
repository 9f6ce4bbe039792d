"""The world of a process that no MPI launcher started: one rank, and no MPI library initialised.

Open MPI's start-up as a singleton (no ``mpirun``) took 0.57 s on the H100 host, 0.24 s under
``mpirun``: half of a small run's time to solution, for a communicator of one rank. When
:func:`~hisparse.parallel.get_world` finds no launcher it hands out :data:`SERIAL_WORLD` instead.
It implements the part of mpi4py's ``Comm`` that hisparse calls, with mpi4py's results at size 1:
the object methods return a pickled copy (as mpi4py's do, on the root too), the buffer methods
copy the send buffer to the receive buffer (nothing for ``MPI.IN_PLACE``).
"""
import os
import pickle
import sys

import numpy as np


def _copy(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _is_in_place(buffer):
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and buffer is mpi.IN_PLACE


def _spec(buffer):
    """``(flat array, counts, displacements)`` of an mpi4py buffer argument: ``array``,
    ``[array, type]``, ``[array, count, type]`` or ``[array, (counts, displs), type]``."""
    if not isinstance(buffer, (list, tuple)):
        return np.asarray(buffer).reshape(-1), None, None
    array = np.asarray(buffer[0]).reshape(-1)
    if len(buffer) == 3 and isinstance(buffer[1], (list, tuple)):
        counts, displs = buffer[1]
        return array, list(counts), list(displs)
    return array, None, None


class SerialComm:
    """A one-rank stand-in for ``MPI.COMM_WORLD`` (and its node-local split): see the module
    docstring. Point-to-point messages have no peer here and raise."""

    rank = 0
    size = 1

    def _check_root(self, root):
        if root != 0:
            raise ValueError(f"root {root} outside a one-rank communicator")

    # -- object collectives (pickled, as mpi4py's lower-case methods) -----------------------------
    def bcast(self, obj, root=0):
        self._check_root(root)
        return _copy(obj)

    def gather(self, obj, root=0):
        self._check_root(root)
        return [_copy(obj)]

    def allgather(self, obj):
        return [_copy(obj)]

    def alltoall(self, objs):
        if len(objs) != 1:
            raise ValueError(f"alltoall needs one item per rank (1), got {len(objs)}")
        return [_copy(objs[0])]

    def allreduce(self, obj, op=None):
        return _copy(obj)

    def exscan(self, obj, op=None):
        return None  # undefined on rank 0, which mpi4py returns as None

    def Barrier(self):
        return None

    # -- buffer collectives ----------------------------------------------------------------------
    def Allreduce(self, sendbuf, recvbuf, op=None):
        if not _is_in_place(sendbuf):
            send, recv = _spec(sendbuf)[0], _spec(recvbuf)[0]
            recv[:send.size] = send

    def Allgatherv(self, sendbuf, recvbuf):
        if _is_in_place(sendbuf):
            return
        send = _spec(sendbuf)[0]
        recv, _, displs = _spec(recvbuf)
        start = displs[0] if displs else 0
        recv[start:start + send.size] = send

    def Alltoallv(self, sendbuf, recvbuf):
        send, send_counts, send_displs = _spec(sendbuf)
        recv, recv_counts, recv_displs = _spec(recvbuf)
        count = send_counts[0] if send_counts else send.size
        if recv_counts is not None and recv_counts[0] != count:
            raise ValueError(f"Alltoallv: sending {count} to itself, expecting {recv_counts[0]}")
        source = send_displs[0] if send_displs else 0
        target = recv_displs[0] if recv_displs else 0
        recv[target:target + count] = send[source:source + count]

    # -- communicators and the end -----------------------------------------------------------------
    def Split_type(self, split_type, key=0):
        return self

    def Abort(self, errorcode=1):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(errorcode)

    def _no_peer(self, *args, **kwargs):
        raise RuntimeError("point-to-point message in a one-rank run (no peer to reach)")

    send = recv = Send = Recv = Isend = Irecv = _no_peer


#: The one serial world of this process.
SERIAL_WORLD = SerialComm()
