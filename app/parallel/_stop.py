"""Signals: SIGINT and SIGTERM end a command, SIGUSR1 (the walltime warning the job script
forwards) stops a run early with its results; under MPI every rank leaves at the same phase
boundary.

One :class:`SignalGuard` per process, installed by the CLI before MPI starts: MPICH's
``MPI_Init`` keeps a handler that is already there, and would otherwise install its own for
SIGUSR1 and swallow the signal. The guard

- records each signal (a watcher thread reads them from a wake-up socket, so a rank blocked in an
  MPI call notices too, and a Python-level handler does the same in the main thread);
- deletes the temporary files registered with :meth:`SignalGuard.temporary` as soon as SIGINT or
  SIGTERM arrives, so a half-written file never survives;
- outside a run, raises :class:`~hisparse.errors.Interrupted` at once for SIGINT/SIGTERM;
- inside a run (:meth:`SignalGuard.collective`), defers them to the next phase boundary, where
  :meth:`StopRequest.agree` makes every rank take the same decision, and aborts the job if the
  ranks have not left together ``GRACE_SECONDS`` after the signal (a rank stuck in a long phase).
"""
import contextlib
import os
import signal
import socket
import threading

from ..errors import Interrupted
from ._mpi import abort

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_SIGNALS = INTERRUPT_SIGNALS + (signal.SIGUSR1,)

#: Seconds the ranks have, after SIGINT/SIGTERM, to reach a phase boundary together before the
#: job is aborted; well inside a scheduler's kill delay (Slurm KillWait: 30 s).
GRACE_SECONDS = 5.0

NONE, STOP, INTERRUPT = 0, 1, 2


def _level(signum):
    return INTERRUPT if signum in INTERRUPT_SIGNALS else STOP


class SignalGuard:
    """The process's handler for ``signals`` (see the module docstring).

    Parameters
    ----------
    signals : tuple of int
        Signals to handle (default SIGINT, SIGTERM, SIGUSR1).
    grace : float
        Seconds before a deferred SIGINT/SIGTERM aborts the job.
    """

    def __init__(self, signals=STOP_SIGNALS, grace=GRACE_SECONDS):
        self.signals = tuple(signals)
        self.grace = grace
        self.received = []
        self._lock = threading.RLock()
        self._temporaries = set()
        self._previous = {}
        self._scopes = []
        self._watchdog = None
        self._wakeup = None
        self._previous_wakeup = -1

    # -- installation ---------------------------------------------------------------------------
    def install(self):
        """Install the handlers (main thread only; elsewhere a no-op). Returns ``self``."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._previous_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)
        threading.Thread(target=self._watch, args=(reader,), name="hisparse-signals",
                         daemon=True).start()
        return self

    def uninstall(self):
        """Restore the previous handlers."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._wakeup[1].close()  # the watcher reads end-of-file and closes its end
            self._wakeup = None
        self._cancel_watchdog()

    def _watch(self, reader):
        with reader:
            while True:
                try:
                    data = reader.recv(64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum in self.signals:
                        self._note(signum)

    def _on_signal(self, signum, frame):
        self._note(signum)
        if _level(signum) == INTERRUPT and not self._scopes:
            raise Interrupted(signum)

    def _note(self, signum):
        with self._lock:
            first = signum not in self.received
            if first:
                self.received.append(signum)
            deferred = bool(self._scopes)
        if _level(signum) == INTERRUPT:
            self.remove_temporaries()
            if deferred:
                self._start_watchdog(signum)

    # -- state ----------------------------------------------------------------------------------
    def pending(self):
        """``(level, signum)`` of the most severe signal this rank has received: level
        ``NONE`` (0), ``STOP`` (1, SIGUSR1) or ``INTERRUPT`` (2, SIGINT/SIGTERM)."""
        with self._lock:
            return max(((_level(s), s) for s in self.received), default=(NONE, 0))

    def clear(self):
        """Forget the signals received (a finished run has consumed them)."""
        with self._lock:
            self.received.clear()

    # -- temporary files ------------------------------------------------------------------------
    @contextlib.contextmanager
    def temporary(self, path):
        """Register ``path`` for deletion on SIGINT/SIGTERM while the block runs."""
        with self._lock:
            self._temporaries.add(os.fspath(path))
        try:
            yield path
        finally:
            with self._lock:
                self._temporaries.discard(os.fspath(path))

    def remove_temporaries(self):
        with self._lock:
            paths = list(self._temporaries)
        for path in paths:
            try:
                os.remove(path)
            except OSError:
                pass

    # -- runs -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def collective(self, comm):
        """While the block runs, SIGINT/SIGTERM wait for the next phase boundary (where every
        rank of ``comm`` leaves together) instead of raising at once."""
        with self._lock:
            self._scopes.append(comm)
        try:
            yield self
        finally:
            with self._lock:
                self._scopes.pop()
                if not self._scopes:
                    self._cancel_watchdog()

    def _start_watchdog(self, signum):
        with self._lock:
            if self._watchdog is not None or not self._scopes:
                return
            self._watchdog = threading.Timer(self.grace, self._give_up,
                                             args=(self._scopes[-1], signum))
            self._watchdog.daemon = True
            self._watchdog.start()

    def _cancel_watchdog(self):
        with self._lock:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None

    def _give_up(self, comm, signum):
        with self._lock:
            if not self._scopes:
                return
        self.remove_temporaries()
        name = signal.Signals(signum).name
        abort(comm, f"hisparse: {name}: the ranks did not stop together within "
                    f"{self.grace:g} s; aborting the job", code=128 + signum, hard=True)


_GUARD = []


def install_signal_guard(signals=STOP_SIGNALS, grace=GRACE_SECONDS):
    """Install the process's :class:`SignalGuard` once (the CLI does, before MPI starts)."""
    if not _GUARD:
        _GUARD.append(SignalGuard(signals, grace).install())
    return _GUARD[0]


def remove_signal_guard():
    """Uninstall the process guard (tests; a library user who installed it)."""
    if _GUARD:
        _GUARD.pop().uninstall()


def signal_guard():
    """The installed process guard, or ``None``."""
    return _GUARD[0] if _GUARD else None


@contextlib.contextmanager
def temporary_file(path):
    """Register ``path`` with the process guard (if any) for deletion on SIGINT/SIGTERM."""
    guard = signal_guard()
    if guard is None:
        yield path
        return
    with guard.temporary(path):
        yield path


def interrupt_pending():
    """The signal number of a SIGINT/SIGTERM this process has received, else 0."""
    guard = signal_guard()
    if guard is None:
        return 0
    level, signum = guard.pending()
    return signum if level == INTERRUPT else 0


def agreed_stop(comm, pending, where):
    """The ranks' one answer to the signals they got (*collective*): ``pending`` is this rank's
    ``(level, signal number)``; raise :class:`~hisparse.errors.Interrupted` on every rank if any
    got SIGINT/SIGTERM, return whether any got SIGUSR1. ``where`` names the boundary."""
    level, signum = pending
    if comm is not None and comm.size > 1:
        from mpi4py import MPI
        level, signum = divmod(comm.allreduce(level * 256 + signum, op=MPI.MAX), 256)
    if level == INTERRUPT:
        raise Interrupted(signum, where, collective=True)
    return level == STOP


class StopRequest:
    """One run's view of the signals, agreed by every rank at phase boundaries::

        with StopRequest(comm, STOP_SIGNALS) as stops:
            ...one phase...
            if stops.agree("setup"):   # collective: every rank calls it
                ...stop early: skip to writing the results...

    :meth:`agree` raises :class:`~hisparse.errors.Interrupted` on every rank when any rank got
    SIGINT/SIGTERM, and returns True from the first boundary after any rank got SIGUSR1.

    Uses the process guard when the CLI installed one; otherwise installs handlers for
    ``signals`` for the duration of the block and restores the previous ones after.

    Parameters
    ----------
    comm : mpi4py communicator, optional
    signals : tuple of int
        Signals handled when there is no process guard (default SIGUSR1).
    """

    NONE, STOP, INTERRUPT = NONE, STOP, INTERRUPT

    def __init__(self, comm=None, signals=(signal.SIGUSR1,)):
        self.comm = comm
        self.signals = tuple(signals)
        self.stopped_at = None
        self.guard = None
        self._own = False
        self._scope = None

    def __enter__(self):
        self.guard = signal_guard()
        if self.guard is None:
            self.guard = SignalGuard(self.signals).install()
            self._own = True
        if any(s in INTERRUPT_SIGNALS for s in self.guard.signals):
            self._scope = self.guard.collective(self.comm)
            self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        if self._scope is not None:
            self._scope.__exit__(*exc)
            self._scope = None
        if self._own:
            self.guard.uninstall()
        elif exc[0] is None:
            self.guard.clear()
        return False

    @property
    def received(self):
        """The first signal this rank received, or ``None``."""
        received = self.guard.received if self.guard is not None else []
        return received[0] if received else None

    def local_level(self):
        """This rank's ``NONE``/``STOP``/``INTERRUPT`` without asking the others (for root-only
        phases, while the other ranks wait)."""
        return self.guard.pending()[0]

    def stopping(self):
        """Whether this run is to stop early, as far as this rank knows without asking the others
        (agreed at a boundary already, or a signal received here since)."""
        return self.stopped_at is not None or self.local_level() != NONE

    def requested(self, comm=None):
        """Whether any rank received a signal. *Collective* when ``comm`` is given."""
        local = self.guard.pending()[0] != NONE
        if comm is None or comm.size == 1:
            return local
        from mpi4py import MPI
        return bool(comm.allreduce(local, op=MPI.LOR))

    def agree(self, phase):
        """*Collective* decision at the boundary after ``phase``: raise
        :class:`~hisparse.errors.Interrupted` on every rank if any rank got SIGINT/SIGTERM;
        return True (from then on) once any rank got SIGUSR1."""
        if agreed_stop(self.comm, self.guard.pending(), phase) and self.stopped_at is None:
            self.stopped_at = phase
        return self.stopped_at is not None
