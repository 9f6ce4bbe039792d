"""Writing a file so that a failure never leaves a broken file under its final name and never
replaces data by accident.

Every file hisparse writes (results, ``convert``/``generate`` outputs) is written to a hidden
temporary file in the same directory, then renamed onto its final name in one step. A new file is
published with a hard link, which fails instead of replacing a file that appeared meanwhile; an
update (a group added to an existing HDF5 file) starts from a copy of the file and replaces it
only once the copy is complete. The temporary file is deleted when the write fails, and by the
signal guard as soon as SIGINT or SIGTERM arrives.
"""
import errno
import os
import secrets
import shutil
from contextlib import contextmanager

from ..errors import Interrupted, OutputError
from ..parallel import interrupt_pending, temporary_file


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
    """What :func:`atomic_file` yields: write ``temporary``; after the block, ``path`` is the
    name it was published under."""

    def __init__(self, temporary, path):
        self.temporary, self.path = temporary, path


@contextmanager
def atomic_file(path, update=False, replace=False, fallbacks=(), what="file"):
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

    Raises
    ------
    OutputError
        The file cannot be written (the message names it), or every name was taken.
    Interrupted
        SIGINT/SIGTERM arrived while writing: nothing was published.
    """
    path = os.fspath(path)
    try:
        temporary = _new_temporary(path)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the {what} ({exc.strerror or exc})") from None
    out = AtomicWrite(temporary, None)
    with temporary_file(temporary):
        try:
            if update:
                shutil.copyfile(path, temporary)
                shutil.copymode(path, temporary)
            yield out
            signum = interrupt_pending()
            if signum:
                raise Interrupted(signum, "write")
            for name in [path] if update or replace else [path, *fallbacks]:
                if publish(temporary, name, replace=update or replace):
                    out.path = name
                    break
            else:
                raise OutputError(f"{path}: a file of that name appeared while writing the "
                                  f"{what}; it was not replaced")
        except OSError as exc:
            raise OutputError(f"{path}: cannot write the {what} ({exc.strerror or exc})") \
                from None
        finally:
            if os.path.lexists(temporary):
                os.remove(temporary)
