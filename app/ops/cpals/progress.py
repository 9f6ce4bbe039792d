"""Between CP-ALS iterations: the ranks' agreement on a stop signal, and rank 0's progress lines.

A run of many iterations (``max_iters: 1e14`` is a legal way to say "until the walltime") must
stay responsive: the driver agrees on signals only between repeats, so the ALS asks after every
iteration itself. The progress lines say what the ALS is doing while it runs (fit, change, time
per iteration), and the summary line what it did.
"""
import time

from ...parallel import StopRequest, agreed_stop, signal_guard

#: Seconds between two progress lines when the iterations are quicker than that: a line for
#: every iteration of a fast ALS would flood the terminal (the first and last always print).
PROGRESS_SECONDS = 0.5


class IterationStops:
    """The walltime and interrupt signals, checked after every iteration on every rank.

    :meth:`stop_requested` is *collective* on several ranks (one small all-reduce of the most
    severe signal any rank received, as the driver's boundaries do), so every rank ends the ALS
    after the same iteration.

    Parameters
    ----------
    comm : mpi4py communicator
    """

    def __init__(self, comm):
        self.comm = comm

    def stop_requested(self, iteration):
        """True when any rank got SIGUSR1 (end the ALS here, keep its results); raise
        :class:`~hisparse.errors.Interrupted` on every rank when any got SIGINT/SIGTERM."""
        guard = signal_guard()
        pending = guard.pending() if guard is not None else (StopRequest.NONE, 0)
        return agreed_stop(self.comm, pending, f"CP-ALS iteration {iteration}")


class IterationProgress:
    """Rank 0's line per iteration while ``run.progress`` is on (``log`` prints on rank 0 only):
    ``<label> iteration k: fit F (change D), T per iteration``; where iterations are quicker than
    :data:`PROGRESS_SECONDS`, one line per that many seconds, plus the first and the last."""

    def __init__(self, log, enabled, label):
        self.log, self.enabled, self.label = log, bool(enabled), label
        self.last_line = None

    def iteration(self, number, fit, previous, seconds, last=False):
        """Report iteration ``number`` (1-based) with its ``fit``, the ``previous`` fit (None
        for the first) and its time in ``seconds``."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if not (last or self.last_line is None or now - self.last_line >= PROGRESS_SECONDS):
            return
        self.last_line = now
        change = "" if previous is None else f" (change {fit - previous:+.3e})"
        self.log(f"{self.label}iteration {number}: fit {fit:.6f}{change}, "
                 f"{_duration(seconds)} per iteration")


def _duration(seconds):
    return f"{seconds * 1e3:.3g} ms" if seconds < 1.0 else f"{seconds:.3g} s"


def outcome_line(fits, iterations_this_run, converged, stopped, tol):
    """One line for the end of the run: the final fit, the iterations and how the ALS ended."""
    if not fits:
        return "CP-ALS: no iteration ran"
    if stopped:
        how = "stopped by the walltime signal"
    elif converged:
        how = f"converged (|change| {abs(fits[-1] - fits[-2]):.2e} < tol {tol:g})"
    else:
        how = "not converged (max_iters reached)" if tol > 0 else "max_iters reached (tol 0)"
    resumed = len(fits) - iterations_this_run
    done = f"{len(fits)} iterations" + (f" ({resumed} before the resume)" if resumed else "")
    return f"CP-ALS: final fit {fits[-1]:.6f} after {done}, {how}"
