"""METIS's nested dissection (``METIS_NodeND``) and recursive bisection
(``METIS_PartGraphRecursive``) called directly, through ctypes, in the METIS library that pymetis
ships (pymetis stays the dependency; this only calls it more cheaply).

Why not ``pymetis.nested_dissection``: its wrapper copies the adjacency into METIS's arrays
element by element and holds the GIL while METIS runs. Called here on the same arrays with the
same options, METIS returns the same permutation or partition (``tests/test_cholesky.py``) in
less time --
measured on the 2-core development machine, plain nested dissection with ``niter`` 1:
Trefethen_20000 0.273-0.289 s against 0.319-0.363 s, the 60^3 Laplacian 1.84-2.15 s against
1.95-2.67 s. When the library or its symbols cannot be found, :func:`node_nd` and
:func:`bisection` return None and the caller uses pymetis's own API.

METIS keeps its random number generator in process-global state, so calls are not run from
several threads at once (the parallel ordering uses processes).
"""

import ctypes
import glob
import os

import numpy as np

from ...errors import HisparseError

#: Positions in METIS's options array (metis.h, METIS 5: METIS_OPTION_*).
OPTION_INDEX = {"ctype": 2, "iptype": 3, "rtype": 4, "niter": 6, "seed": 8, "no2hop": 9,
                "compress": 12, "ccorder": 13, "pfactor": 14, "nseps": 15, "ufactor": 16}
#: METIS_NOPTIONS.
OPTIONS_LENGTH = 40
#: METIS's return codes (rstatus_et).
_STATUS = {1: "ok", -2: "input error", -3: "out of memory", -4: "error"}

_library = None  # None: not looked for yet; False: not found; else the entry points and idx_t


def _address(array):
    return array.ctypes.data_as(ctypes.c_void_p)


def _load():
    """The METIS entry points in pymetis's extension module and METIS's index type, or None."""
    global _library
    if _library is None:
        _library = False
        try:
            import pymetis
            paths = sorted(glob.glob(os.path.join(os.path.dirname(pymetis.__file__),
                                                  "_internal*")))
            library = ctypes.CDLL(paths[0])
            node_nd, set_defaults = library.METIS_NodeND, library.METIS_SetDefaultOptions
            recursive = library.METIS_PartGraphRecursive
        except (ImportError, IndexError, OSError, AttributeError):
            return None
        node_nd.restype = set_defaults.restype = recursive.restype = ctypes.c_int
        # idx_t is 32 or 64 bits as METIS was built: the defaults (all -1) fill 40 idx_t, so
        # the last of 80 int32 is -1 only when idx_t has 64 bits.
        probe = np.zeros(2 * OPTIONS_LENGTH, dtype=np.int32)
        set_defaults(_address(probe))
        index = np.dtype(np.int64 if probe[-1] == -1 else np.int32)
        _library = {"node_nd": node_nd, "set_defaults": set_defaults, "recursive": recursive,
                    "index": index}
    return _library or None


def available():
    """Whether :func:`node_nd` can call METIS directly here."""
    return _load() is not None


def _settings(library, options):
    """METIS's options array: its defaults, then ``options`` (names of :data:`OPTION_INDEX`)."""
    settings = np.empty(OPTIONS_LENGTH, dtype=library["index"])
    library["set_defaults"](_address(settings))
    for name, value in options.items():
        settings[OPTION_INDEX[name]] = value
    return settings


def _check(status, what, n, entries):
    if status != 1:
        raise HisparseError(f"cholesky: {what} failed on a graph of {n} vertices and {entries} "
                            f"adjacency entries: {_STATUS.get(status, f'status {status}')}")


def node_nd(indptr, indices, options):
    """METIS's nested dissection of the CSR graph ``(indptr, indices)`` (no self loops, both
    directions of every edge) with ``options`` (names of :data:`OPTION_INDEX` -> values; the
    others METIS's defaults). Returns the new-to-old permutation (int64: row ``k`` of the
    permuted matrix is row ``perm[k]``), or None when METIS cannot be called directly here."""
    library = _load()
    if library is None:
        return None
    index = library["index"]
    n = len(indptr) - 1
    settings = _settings(library, options)
    xadj = np.ascontiguousarray(indptr, dtype=index)
    adjncy = np.ascontiguousarray(indices, dtype=index)
    count = np.array([n], dtype=index)
    perm, iperm = np.empty(n, dtype=index), np.empty(n, dtype=index)
    status = library["node_nd"](_address(count), _address(xadj), _address(adjncy), None,
                                _address(settings), _address(perm), _address(iperm))
    _check(status, "METIS_NodeND", n, len(indices))
    return perm.astype(np.int64)


def bisection(indptr, indices, options):
    """METIS's recursive bisection of the CSR graph into 2 parts (what
    ``pymetis.part_graph(2, ...)`` runs) with ``options``: the part of every vertex (int8),
    or None when METIS cannot be called directly here."""
    library = _load()
    if library is None:
        return None
    index = library["index"]
    n = len(indptr) - 1
    settings = _settings(library, options)
    xadj = np.ascontiguousarray(indptr, dtype=index)
    adjncy = np.ascontiguousarray(indices, dtype=index)
    count, constraints, parts = (np.array([v], dtype=index) for v in (n, 1, 2))
    cut, part = np.zeros(1, dtype=index), np.empty(n, dtype=index)
    status = library["recursive"](
        _address(count), _address(constraints), _address(xadj), _address(adjncy), None, None,
        None, _address(parts), None, None, _address(settings), _address(cut), _address(part))
    _check(status, "METIS_PartGraphRecursive", n, len(indices))
    return part.astype(np.int8)
