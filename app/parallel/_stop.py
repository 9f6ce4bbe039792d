"""A walltime warning signal turned into a stop that all ranks agree on."""
import signal


class StopRequest:
    """Turn SIGUSR1 (the walltime warning forwarded by the job script) into a flag that the ranks
    agree on at a repeat boundary, so a run near its walltime stops early and still writes its
    results file. Used by ``driver._time_repeats``::

        with StopRequest() as stop:
            for index in range(repeats):
                ...one timed repeat...
                if stop.requested(ctx.comm):   # collective: every rank calls it
                    break

    Parameters
    ----------
    signals : tuple of int
        Signals that request the stop (default SIGUSR1).
    """

    def __init__(self, signals=(signal.SIGUSR1,)):
        self.signals = tuple(signals)
        self.received = None
        self._previous = {}

    def _handle(self, signum, frame):
        self.received = signum

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        return False

    def requested(self, comm=None):
        """Whether any rank received a stop signal. *Collective* when ``comm`` is given."""
        local = self.received is not None
        if comm is None or comm.size == 1:
            return local
        from mpi4py import MPI
        return bool(comm.allreduce(local, op=MPI.LOR))


# -- command line --------------------------------------------------------------------------------
