"""Per-phase timing on one rank: host wall-clock and, for GPU work, CUDA events.

A run has one-time setup phases (``read``, ``partition``, ``distribute``, ...) and per-repeat
phases (``h2d``, ``kernel``, ``d2h``, ``gather``, ...). Each timed call of a phase adds to that
phase's total in the current repeat, so a phase issued per chunk or per stream sums its pieces;
GPU time sums the event intervals, which counts overlapped work on several streams once per
stream (busy time). ``total`` is measured around the whole repeat, never summed.

``startup`` (recorded by ``hisparse run``, :func:`process_age_seconds`) is what the process took
before the run's first timed phase: the interpreter, the imports, MPI's initialisation, the config
and binding the GPU.
"""
import os
import time
from contextlib import contextmanager

import numpy as np


def process_age_seconds():
    """Seconds since this process was launched, or ``None`` where that cannot be read (the
    launch time comes from ``/proc/self/stat``, Linux only, in clock ticks: 10 ms steps)."""
    try:
        with open("/proc/self/stat") as handle:
            # The command name (field 2) may hold spaces and parentheses: split after its end.
            fields = handle.read().rsplit(")", 1)[1].split()
        launched = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - launched
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    # Beyond a day the clocks disagree (a container's view of the boot time), not the process.
    return age if 0.0 <= age < 86400.0 else None


def event_else_wall(wall, gpu):
    """What a phase cost, in seconds: its CUDA-event time where one was recorded (finite), else
    its wall time -- GPU work is launched asynchronously, so its wall time is only the launch.
    Elementwise over arrays of one shape (NaN where neither was recorded), or two numbers."""
    return np.where(np.isfinite(gpu), gpu, wall)


def time_on_host(body, repeats):
    """Seconds of ``body()`` per repeat on the host's wall clock: the host twin of
    :func:`hisparse.gpu.time_with_events`, which peers on the GPU use.

    Returns
    -------
    list of float, length ``repeats``
    """
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        body()
        seconds.append(time.perf_counter() - start)
    return seconds


class StepClock:
    """Wall seconds of the consecutive steps inside one phase, by name (``mark(step)`` ends the
    step that began at the previous mark; a name marked again adds up), for ``/perf``: where a
    rank's set-up or numeric phase went, which multi-rank set-up time is made of. Host time:
    for GPU work, each step must end in a wait for it. ``since_launch``: the first step began
    at the process's launch (:func:`process_age_seconds`; at the clock's making where that
    cannot be read): the steps of ``hisparse run``'s start-up."""

    def __init__(self, since_launch=False):
        self.seconds = {}
        age = process_age_seconds() if since_launch else None
        self._last = time.perf_counter() - (age or 0.0)

    def mark(self, step):
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now


class PhaseTimer:
    """Collects phase times for this rank.

    Parameters
    ----------
    phases : sequence of str
        Every phase name that may be recorded (the results file's phase dimension).
    """

    SETUP = -1  # pseudo-repeat index of one-time phases

    def __init__(self, phases):
        self.phases = list(phases)
        self._wall = {}
        self._pending = []  # (repeat, phase, start_event, end_event)
        self._gpu = {}
        self.repeat = self.SETUP
        self.enabled = True

    def begin_repeat(self, index):
        self.repeat = index

    @contextmanager
    def phase(self, name, stream=None, gpu=False):
        """Time a block. With ``stream`` (or ``gpu=True`` for the default stream) CUDA events are
        recorded around it too, and resolved at :meth:`resolve`."""
        if name not in self.phases:
            raise KeyError(f"phase '{name}' is not declared (declared: {self.phases})")
        if not self.enabled:
            yield
            return
        events = None
        if stream is not None or gpu:
            import pycuda.driver as cuda
            events = (cuda.Event(), cuda.Event())
            events[0].record(stream)
        start = time.perf_counter()
        try:
            yield
        finally:
            if events is not None:
                events[1].record(stream)
                self._pending.append((self.repeat, name, events[0], events[1]))
            self.add(name, wall=time.perf_counter() - start)

    def add(self, name, wall=None, gpu=None):
        """Add measured seconds to a phase of the current repeat."""
        if not self.enabled:
            return
        key = (self.repeat, name)
        if wall is not None:
            self._wall[key] = self._wall.get(key, 0.0) + wall
        if gpu is not None:
            self._gpu[key] = self._gpu.get(key, 0.0) + gpu

    def setup_wall(self):
        """Wall seconds recorded so far in the one-time phases."""
        return sum(seconds for (repeat, _), seconds in self._wall.items()
                   if repeat == self.SETUP)

    def resolve(self):
        """Turn recorded CUDA events into seconds (synchronises on each end event)."""
        for repeat, name, start, end in self._pending:
            end.synchronize()
            key = (repeat, name)
            self._gpu[key] = self._gpu.get(key, 0.0) + end.time_since(start) * 1e-3
        self._pending.clear()

    def arrays(self, repeats):
        """Wall and GPU seconds as arrays of shape (repeats, len(phases)).

        One-time phases are stored in repeat 0 and are NaN in later repeats; phases that did not
        run are NaN.
        """
        self.resolve()
        wall = np.full((repeats, len(self.phases)), np.nan)
        gpu = np.full((repeats, len(self.phases)), np.nan)
        for target, source in ((wall, self._wall), (gpu, self._gpu)):
            for (repeat, name), seconds in source.items():
                row = 0 if repeat == self.SETUP else repeat
                if 0 <= row < repeats:
                    target[row, self.phases.index(name)] = seconds
        return wall, gpu
