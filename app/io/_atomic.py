"""The one guard of every file hisparse writes: a failure never leaves a broken file under its
final name, and no data is replaced by accident.

Every file hisparse writes (results, result parts, ``convert``/``generate`` outputs, CP-ALS
checkpoints) goes through :func:`atomic_file`; its path is checked first, before the compute, by
:func:`output_problem` (the same rules :func:`atomic_file` applies again when it publishes).

- The file is written to a hidden temporary file in the same directory, then renamed onto its
  final name in one step. A new file is published with a hard link, which fails instead of
  replacing a file that appeared meanwhile; an update (a group added to an existing HDF5 file)
  starts from a copy of the file and replaces it only once the copy is complete.
- An existing file is replaced only when it is of the writer's own kind: an HDF5 file whose root
  attribute ``schema`` is the writer's (``replaces``; a CP-ALS checkpoint replaces only a
  previous checkpoint), never a file the run reads, a directory or a foreign file.
- The temporary file is deleted when the write fails, and by the signal guard as soon as SIGINT
  or SIGTERM arrives. HDF5 files are opened through :meth:`AtomicWrite.h5`, which writes chunks
  without HDF5's chunk cache: with the cache, a full disk surfaced only when the file was closed,
  where HDF5 2.0 / h5py 3.16 crashed (SIGSEGV); without it the write fails in Python, where the
  file is closed and its temporary removed. A full disk (ENOSPC, a quota, the file size limit)
  becomes one :class:`~hisparse.errors.OutputError` naming the file.
"""
import errno
import os
import secrets
import shutil
from contextlib import contextmanager

from ..errors import Interrupted, OutputError
from ..parallel import interrupt_pending, temporary_file

#: errno values of a device (or quota, or file size limit) that takes no more bytes
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def probe_directory(directory, create=True):
    """Check that ``directory`` exists (creating it when ``create``) and takes a new file.

    Returns
    -------
    str or None
        ``None`` when it can be written, else why not (for the caller's message).
    """
    directory = directory or "."
    if create:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            return f"cannot create directory '{directory}' ({exc.strerror or exc})"
    if not os.path.isdir(directory):
        return (f"'{directory}' is not a directory" if os.path.exists(directory)
                else f"directory '{directory}' does not exist")
    try:
        path = _new_temporary(os.path.join(directory, "probe"))
    except OSError as exc:
        return f"cannot write in directory '{directory}' ({exc.strerror or exc})"
    os.remove(path)
    return None


def _new_temporary(path):
    """Create an empty, uniquely named hidden file beside ``path`` (mode 0666 less the umask)."""
    directory, base = os.path.split(os.path.abspath(path))
    while True:
        candidate = os.path.join(directory, f".{base[:100]}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:
            continue


def schema_of(path):
    """The root attribute ``schema`` of the HDF5 file ``path``, or ``None`` (not HDF5, no such
    attribute, unreadable)."""
    import h5py
    try:
        if not h5py.is_hdf5(path):
            return None
        with h5py.File(path, "r") as handle:
            value = handle.attrs.get("schema")
    except (OSError, RuntimeError, ValueError):
        return None
    return value.decode() if isinstance(value, bytes) else (str(value) if value is not None
                                                              else None)


def output_problem(path, what="file", replaces=None, reads=(), create_parent=False):
    """Why ``path`` cannot take a new ``what``, checked before any work; ``None`` when it can.

    Parameters
    ----------
    path : str
    what : str
        What the file is, for the message ("results file", "checkpoint").
    replaces : str, optional
        The ``schema`` root attribute of an existing file the writer may replace (its own kind,
        e.g. a previous checkpoint); without it an existing file is never replaced.
    reads : iterable of (str, str)
        ``(key, path)`` of the files the run reads: none of them may be ``path``.
    create_parent : bool
        Create the parent directory when missing (``output.dir``), else it must exist.

    Returns
    -------
    str or None
        The reason, naming ``path`` (and the key of a file the run reads).
    """
    path = os.fspath(path)
    for key, other in reads:
        if other and os.path.realpath(other) == os.path.realpath(path):
            return f"{path} is the file of {key}, which the run reads; it is never overwritten"
    if os.path.isdir(path):
        return f"{path} is a directory; give a file name for the {what}"
    problem = probe_directory(os.path.dirname(path) or ".", create=create_parent)
    if problem:
        return f"{path}: cannot write the {what}: {problem}"
    if os.path.lexists(path):
        if replaces is None:
            return f"{path} exists; the {what} never replaces an existing file"
        if schema_of(path) != replaces:
            return (f"{path} exists and is not a {what} of hisparse (HDF5 attribute schema = "
                    f"{replaces!r}); it was not touched (choose another path)")
    return None


def check_output_path(path, what="file", replaces=None, reads=(), create_parent=False):
    """:func:`output_problem` as an :class:`~hisparse.errors.OutputError`."""
    problem = output_problem(path, what, replaces, reads, create_parent)
    if problem:
        raise OutputError(problem)


def full_disk(exc):
    """Whether ``exc`` (an ``OSError``, or the ``RuntimeError`` h5py raises for a failed write)
    says the device takes no more bytes."""
    return _full_code(exc) is not None


def _full_code(exc):
    """The errno of :data:`_FULL` that ``exc`` carries or names in its text, else None."""
    code = getattr(exc, "errno", None)
    if code in _FULL:
        return code
    text = str(exc)
    return next((c for c in _FULL if f"errno = {c}," in text or os.strerror(c) in text), None)


def publish(temporary, path, replace=False):
    """Move ``temporary`` to ``path`` in one step.

    With ``replace`` an existing ``path`` is replaced (``os.replace``); without, the move fails
    when ``path`` exists, even if it appeared a moment ago (a hard link cannot replace).

    Returns
    -------
    bool
        False when ``path`` exists and ``replace`` is not set (``temporary`` is left in place).
    """
    if replace:
        os.replace(temporary, path)
        return True
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK,
                             errno.ENOSYS):
            raise
        # A file system without hard links: check, then rename (not atomic against a racing
        # writer, still never replacing a file that exists now).
        if os.path.lexists(path):
            return False
        os.replace(temporary, path)
        return True
    os.remove(temporary)
    return True


class AtomicWrite:
    """What :func:`atomic_file` yields: write ``temporary`` (an HDF5 file through :meth:`h5`);
    after the block, ``path`` is the name it was published under."""

    def __init__(self, temporary, path):
        self.temporary, self.path = temporary, path
        self._handles = []

    def h5(self, mode="w"):
        """The temporary file opened with h5py (``mode`` "w" or "a"), chunks written at once
        (no chunk cache: see the module's note); closed by the guard if the block fails."""
        import h5py
        handle = h5py.File(self.temporary, mode, rdcc_nbytes=0)
        self._handles.append(handle)
        return handle

    def close_all(self, strict=False):
        """Close what :meth:`h5` opened; a close that fails (a full disk) is not retried, and
        raises its error only when ``strict`` (the write has not failed before)."""
        handles, self._handles = self._handles, []
        error = None
        for handle in handles:
            try:
                handle.close()
            except Exception as exc:  # with strict: the first is raised, once all are closed
                error = error or exc
        if strict and error is not None:
            raise error


@contextmanager
def atomic_file(path, update=False, replace=False, fallbacks=(), what="file", replaces=None):
    """Yield an :class:`AtomicWrite`; on success its temporary file becomes ``path``.

    Parameters
    ----------
    path : str
        Final name.
    update : bool
        The temporary file starts as a copy of the existing ``path``, which it replaces at the
        end; otherwise ``path`` must not exist when the write ends...
    replace : bool
        ...unless this is set (the caller means to replace the whole file).
    fallbacks : iterable of str
        Names tried in turn when ``path`` was created by someone else during the write (a new
        file only); without any, that is an :class:`~hisparse.errors.OutputError`.
    what : str
        What the file is, for messages.
    replaces : str, optional
        An existing ``path`` is replaced only when it is an HDF5 file with this ``schema`` root
        attribute (checked again at the end: see :func:`output_problem`); a missing ``path`` is
        created.

    Raises
    ------
    OutputError
        The file cannot be written (the message names it; a full disk says so), every name was
        taken, or an existing file is not of the writer's kind.
    Interrupted
        SIGINT/SIGTERM arrived while writing: nothing was published.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise OutputError(f"{path} is a directory; give a file name for the {what}")
    try:
        temporary = _new_temporary(path)
    except OSError as exc:
        raise OutputError(_cannot_write(path, what, exc)) from None
    out = AtomicWrite(temporary, None)
    with temporary_file(temporary):
        try:
            if update:
                shutil.copyfile(path, temporary)
                shutil.copymode(path, temporary)
            yield out
            out.close_all(strict=True)
            signum = interrupt_pending()
            if signum:
                raise Interrupted(signum, "write")
            replacing = update or replace
            if replaces is not None and os.path.lexists(path):
                check_output_path(path, what, replaces)  # a file that appeared meanwhile
                replacing = True
            for name in [path] if replacing else [path, *fallbacks]:
                if publish(temporary, name, replace=replacing):
                    out.path = name
                    break
            else:
                raise OutputError(f"{path}: a file of that name appeared while writing the "
                                  f"{what}; it was not replaced")
        except OSError as exc:
            raise OutputError(_cannot_write(path, what, exc)) from None
        except RuntimeError as exc:
            if not full_disk(exc):
                raise
            raise OutputError(_cannot_write(path, what, exc)) from None
        finally:
            out.close_all()  # what the block left open (a failed write), before the removal
            if os.path.lexists(temporary):
                os.remove(temporary)


def _cannot_write(path, what, exc):
    """The one line of a failed write of ``path``."""
    code = _full_code(exc)
    if code is not None:
        return (f"{path}: cannot write the {what}: {os.strerror(code)} (the device, a quota or "
                f"the file size limit takes no more bytes); nothing was written")
    return f"{path}: cannot write the {what} ({getattr(exc, 'strerror', None) or exc})"
