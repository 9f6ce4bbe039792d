"""Exceptions that end a run with one clear line, and the one place that maps expected failures
to them.

Every error a user can cause (a bad config, a broken input file, an impossible run layout, an
output that would replace data) is a :class:`HisparseError`. The CLI prints
``hisparse: error: <message>`` for it and exits with status 2. Failures of the environment that
a user can also fix (out of memory, an I/O error, a corrupt compressed file, a file that is not
text) are turned into a :class:`HisparseError` by :func:`as_user_error` at the CLI boundary and
in the root-only and all-rank calls of :mod:`hisparse.parallel`; anything else is a bug and is
reported with its type and the rank it happened on.

A stop by SIGINT or SIGTERM is :class:`Interrupted` (a ``KeyboardInterrupt``): not an error, it
exits with 128 + the signal number.
"""
import contextlib
import lzma
import zlib

__all__ = ["HisparseError", "ConfigError", "InputError", "OutputError", "LayoutError",
           "ResourceError", "VerificationError", "Interrupted", "as_user_error", "subject",
           "same_on_every_rank"]


class HisparseError(Exception):
    """Base class of every user-facing error; its message is the one line the user sees."""

    #: True when every rank raises the same error at the same point, so rank 0 alone reports it
    #: and the ranks exit together; otherwise the failing rank aborts the whole job.
    collective = False


@contextlib.contextmanager
def same_on_every_rank():
    """Mark a :class:`HisparseError` raised inside as collective. For checks of the run's
    config alone, which every rank makes alike and fails alike: rank 0 then reports it once and
    the ranks leave together, where each rank would otherwise abort the job with its own copy
    of the line. Never around work whose outcome may differ between ranks (reading, data): a
    rank left waiting in a collective for one that left quietly would hang."""
    try:
        yield
    except HisparseError as exc:
        exc.collective = True
        raise


class ConfigError(HisparseError):
    """A run configuration is malformed: names the file and the key at fault."""

    def __init__(self, source, key, problem):
        self.source, self.key, self.problem = source, key, problem
        where = f"{source}: " if source else ""
        keypart = f"key '{key}': " if key else ""
        super().__init__(f"{where}{keypart}{problem}")


class InputError(HisparseError):
    """An input file (HDF5, Matrix Market, ...) is missing, malformed or holds invalid values."""


class OutputError(HisparseError):
    """An output file cannot be written, or writing it would replace existing data."""


class LayoutError(HisparseError):
    """The requested parallel layout cannot work (e.g. more ranks than rows)."""


class ResourceError(HisparseError):
    """The machine cannot hold what the input asks for (an allocation too large)."""


class VerificationError(HisparseError):
    """A result disagrees with the reference beyond the configured tolerance (raised on every
    rank once rank 0 has written the results file)."""

    collective = True


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM ended the command.

    ``collective`` is True when every rank raised it at the same phase boundary (they leave
    together and exit cleanly); otherwise the interrupted rank must abort the job.
    """

    def __init__(self, signum, phase=None, collective=False):
        import signal
        self.signum, self.phase, self.collective = int(signum), phase, collective
        self.signal_name = signal.Signals(self.signum).name
        where = f" during {phase}" if phase else ""
        super().__init__(f"interrupted by {self.signal_name}{where}")

    @property
    def exit_status(self):
        return 128 + self.signum


# -- the mapping of expected failures -------------------------------------------------------------

_SUBJECT = []


@contextlib.contextmanager
def subject(label):
    """Name ``label`` (e.g. the input file) in the messages :func:`as_user_error` builds for
    failures that carry no file name of their own (out of memory) while the block runs."""
    _SUBJECT.append(label)
    try:
        yield
    finally:
        _SUBJECT.pop()


def _bytes(count):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if count < 1024 or unit == "EiB":
            return f"{count:.3g} {unit}"
        count /= 1024.0


def _memory_message(exc):
    shape, dtype = getattr(exc, "shape", None), getattr(exc, "dtype", None)
    if shape is not None and dtype is not None:
        import numpy as np
        need = float(np.prod(np.asarray(shape, dtype=np.float64))) * np.dtype(dtype).itemsize
        return (f"out of memory: cannot allocate {_bytes(need)} (array of shape {tuple(shape)}, "
                f"{dtype}); is a size in the input too large for this machine?")
    return "out of memory; is a size in the input too large for this machine?"


#: numpy's ValueError texts for an allocation that cannot exist (a size beyond the address space).
_TOO_BIG = ("array is too big", "Maximum allowed dimension exceeded", "maximum supported dimension")


def as_user_error(exc):
    """The expected failure ``exc`` as a :class:`HisparseError`, or ``None`` when it is a bug.

    Maps MemoryError and numpy's "array is too big" to :class:`ResourceError`, I/O errors
    (``OSError``) to a :class:`HisparseError` naming the file, corrupt compressed data and text that
    is not UTF-8 to :class:`InputError`. A :class:`HisparseError` is returned as it is.
    """
    if isinstance(exc, HisparseError):
        return exc
    where = f"{_SUBJECT[-1]}: " if _SUBJECT else ""
    if isinstance(exc, MemoryError):
        return ResourceError(where + _memory_message(exc))
    if isinstance(exc, ValueError) and any(text in str(exc) for text in _TOO_BIG):
        return ResourceError(f"{where}out of memory: {str(exc).rstrip('.')}; is a size in the "
                             f"input too large for this machine?")
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"{where}not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start})")
    if isinstance(exc, (EOFError, zlib.error, lzma.LZMAError)):
        return InputError(f"{where}compressed data is corrupt or truncated ({exc})")
    if isinstance(exc, OSError):
        name = exc.filename if exc.filename is not None else _SUBJECT[-1] if _SUBJECT else None
        reason = exc.strerror or str(exc)
        return HisparseError(f"{name}: {reason}" if name else f"I/O error: {reason}")
    return None
