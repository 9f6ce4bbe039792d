"""A fill-reducing permutation kept in an HDF5 file (``operation.params.ordering_file``), so that
runs of the same matrix (a scaling study's 1, 2 and 4 ranks, repeated jobs) compute the
ordering once: what MUMPS, PARDISO and cuDSS offer as a user-given permutation.

The ordering is most of the analysis, and the analysis most of a run's time to solution (120^3
Laplacian on a 16-core host: ordering about 5.5 of a 9 s analysis; docs/ops/cholesky.md,
"A saved ordering"). The first run computes the ordering and writes the file (a new file
only: :func:`~hisparse.io.atomic_file`); a later run reads it instead, once the file is shown
to belong to this matrix: same rows, same symmetric pattern (its digest), and the ordering
method the run asks for. Everything after the ordering (elimination tree, supernodes, the
subtree mapping of the ranks) is recomputed, so a file made at one rank count serves any other.
"""
import hashlib
import os

import numpy as np

from ...errors import InputError
from ...threads import threaded

#: The ``schema`` root attribute of an ordering file.
ORDERING_SCHEMA = "hisparse-cholesky-ordering-1"
#: The key that names the file in messages.
KEY = "operation.params.ordering_file"


#: int64 entries per piece of :func:`pattern_digest` (8 MiB: the pieces are hashed on threads).
DIGEST_PIECE = 1 << 20


def pattern_digest(indptr, indices):
    """``"blake2b-128:<hex>"`` of a CSR pattern (sorted within rows): the identity of the graph
    an ordering was computed for. Hashed as int64, so the same pattern gives the same digest
    whatever index dtype the matrix was stored with; in pieces of :data:`DIGEST_PIECE` entries
    on the host's threads (hashlib lets the interpreter's lock go), the digest of the pieces'
    digests (the 120^3 Laplacian's 12M entries: 0.11 s on one core)."""
    pieces = []
    for array in (indptr, indices):
        array = np.asarray(array)
        pieces += [(array, start, min(start + DIGEST_PIECE, len(array)))
                   for start in range(0, len(array), DIGEST_PIECE)] or [(array, 0, 0)]
    digests = [None] * len(pieces)

    def digest_piece(index):
        array, start, stop = pieces[index]
        digests[index] = hashlib.blake2b(
            np.ascontiguousarray(array[start:stop], dtype=np.int64), digest_size=16).digest()
    threaded(digest_piece, range(len(pieces)), name="hisparse-digest")
    whole = hashlib.blake2b(digest_size=16)
    whole.update(np.array([len(indptr), len(indices)], dtype=np.int64))
    for piece in digests:
        whole.update(piece)
    return "blake2b-128:" + whole.hexdigest()


def reads_saved_ordering(path):
    """Whether a run given ``ordering_file: path`` reads its ordering from there (the file
    exists) rather than computing it and writing the file (None, or a file not there yet)."""
    return bool(path) and os.path.exists(path)


class OrderingFile:
    """The ordering file at ``path``: :meth:`read` when it :meth:`exists`, else :meth:`write`.

    ``method`` is the ordering the run asks for (resolved: ``metis``, ``rcm``, ...); a file of
    another method is refused rather than used in its place."""

    def __init__(self, path, method):
        self.path = os.fspath(path)
        self.method = method

    def exists(self):
        return reads_saved_ordering(self.path)

    def read(self, n, digest):
        """The permutation stored for a matrix of ``n`` rows whose symmetric off-diagonal
        pattern has ``digest`` (:func:`pattern_digest`), new-to-old int64, and the method that
        made it.

        Raises
        ------
        InputError
            Naming the file (and the key): not HDF5 or not an ordering file, made for another
            matrix or with another ordering method, or a ``perm`` that is not a permutation of
            ``0..n-1``.
        """
        import h5py
        where = f"{self.path} ({KEY})"
        try:
            with h5py.File(self.path, "r") as handle:
                attrs = dict(handle.attrs)
                if attrs.get("schema") != ORDERING_SCHEMA:
                    raise InputError(f"{where}: not a hisparse Cholesky ordering file (no schema "
                                     f"attribute {ORDERING_SCHEMA!r})")
                rows, stored = int(attrs.get("rows", -1)), attrs.get("pattern_digest")
                if rows != n or stored != digest:
                    raise InputError(
                        f"{where}: made for another matrix ({rows} rows, pattern {stored}; this "
                        f"run's matrix: {n} rows, pattern {digest}); give another file name, or "
                        f"remove the file to compute the ordering again")
                made_by = str(attrs.get("ordering"))
                if made_by != self.method and n > 1:  # one row: every method is 'natural'
                    raise InputError(
                        f"{where}: holds a {made_by!r} ordering, the run asks for "
                        f"{self.method!r} (operation.params.ordering)")
                if "perm" not in handle:
                    raise InputError(f"{where}: dataset 'perm' missing")
                perm = handle["perm"][()]
        except OSError as exc:
            raise InputError(f"{where}: cannot read the ordering file ({exc})") from None
        if perm.ndim != 1 or len(perm) != n or perm.dtype.kind not in "iu" or \
                not _is_permutation(perm):
            raise InputError(f"{where}: dataset 'perm' is not a permutation of 0..{n - 1} "
                             f"(shape {perm.shape}, dtype {perm.dtype})")
        return perm.astype(np.int64, copy=False), made_by

    def write(self, perm, digest, made_by, details=None):
        """Store ``perm`` (new-to-old), made by the method ``made_by``, for the matrix of
        pattern ``digest``, as a new file (never over an existing one:
        :func:`~hisparse.io.atomic_file`); ``details`` (name -> scalar) are kept as attributes
        (the settings that made the ordering)."""
        import datetime
        from ... import __version__
        from ...io import atomic_file
        with atomic_file(self.path, what="ordering file") as out:
            handle = out.h5()
            handle.attrs["schema"] = ORDERING_SCHEMA
            handle.attrs["rows"] = len(perm)
            handle.attrs["pattern_digest"] = digest
            handle.attrs["ordering"] = made_by
            handle.attrs["hisparse_version"] = __version__
            handle.attrs["created_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
            for name, value in (details or {}).items():
                handle.attrs[name] = value
            handle.create_dataset("perm", data=np.asarray(perm, dtype=np.int64))


def _is_permutation(values):
    """Whether ``values`` holds every integer of ``0..len-1`` once."""
    n = len(values)
    if n == 0:
        return True
    if int(values.min()) < 0 or int(values.max()) >= n:
        return False
    return bool(np.all(np.bincount(values.astype(np.int64), minlength=n) == 1))
