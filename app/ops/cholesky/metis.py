"""METIS's nested dissection (``METIS_NodeND``), recursive bisection
(``METIS_PartGraphRecursive``) and vertex separator called directly, through ctypes, in the METIS
library that pymetis ships (pymetis stays the dependency; this only calls it more cheaply).

Why not ``pymetis.nested_dissection``: its wrapper copies the adjacency into METIS's arrays
element by element and holds the GIL while METIS runs. Called here on the same arrays with the
same options, METIS returns the same permutation or partition (``tests/test_cholesky.py``) in
less time (docs/ops/cholesky.md, "Figures moved out of the code"). When the library or its symbols cannot be found, :func:`node_nd` and
:func:`bisection` return None and the caller uses pymetis's own API.

METIS keeps its random number generator in process-global state, so calls are not run from
several threads at once (the parallel ordering uses processes).

The vertex separator is the one ``METIS_NodeND`` computes at every level of its dissection
(``MlevelNodeBisectionMultiple``): what ``METIS_ComputeVertexSeparator`` returns, but pymetis's
build does not export that entry point, only METIS's internal functions (``libmetis__*``).
:func:`vertex_separator` calls those as ``METIS_ComputeVertexSeparator`` does and reads the
result from METIS's graph structure (METIS 5.1/5.2 layout). Because that is not METIS's public
interface, every call checks what it reads: the structure's header must hold the arrays it was
given, and the result must be a separator (sides 0/1, 2 on the separator, the part sizes METIS
counted, no edge joining 0 and 1); otherwise it returns None and the caller falls back.
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
#: moptype_et METIS_OP_OMETIS: the ordering's control settings (defaults, balance).
_OP_ORDERING = 2
#: METIS's internal functions :func:`vertex_separator` calls, as ``METIS_ComputeVertexSeparator``.
_SEPARATOR_ENTRIES = ("SetupCtrl", "SetupGraph", "InitRandom", "AllocateWorkSpace",
                      "MlevelNodeBisectionMultiple", "FreeGraph", "FreeCtrl")

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
                    "index": index, "separator": _separator_entries(library, index)}
    return _library or None


def _graph_structure(index_ctype):
    """The first fields of METIS's ``graph_t`` (struct.h of METIS 5.1 and 5.2), up to the
    partition (``where``) and the part weights (``pwgts``)."""
    pointer = ctypes.c_void_p
    fields = [("nvtxs", index_ctype), ("nedges", index_ctype), ("ncon", index_ctype)]
    fields += [(name, pointer) for name in ("xadj", "vwgt", "vsize", "adjncy", "adjwgt",
                                            "tvwgt", "invtvwgt")]
    fields += [("free_flags", ctypes.c_int * 5), ("label", pointer), ("cmap", pointer),
               ("mincut", index_ctype), ("minvol", index_ctype), ("where", pointer),
               ("pwgts", pointer)]
    return type("MetisGraph", (ctypes.Structure,), {"_fields_": fields})


def _separator_entries(library, index):
    """The internal functions :func:`vertex_separator` calls, typed, with the graph structure
    and METIS's index ctype; None when the library does not export them."""
    try:
        entries = {name: getattr(library, "libmetis__" + name) for name in _SEPARATOR_ENTRIES}
    except AttributeError:
        return None
    idx, pointer = (ctypes.c_int64 if index == np.int64 else ctypes.c_int32), ctypes.c_void_p
    signatures = {"SetupCtrl": (pointer, [ctypes.c_int, pointer, idx, idx, pointer, pointer]),
                  "SetupGraph": (pointer, [pointer, idx, idx] + [pointer] * 5),
                  "InitRandom": (None, [idx]),
                  "AllocateWorkSpace": (None, [pointer, pointer]),
                  "MlevelNodeBisectionMultiple": (None, [pointer, pointer]),
                  "FreeGraph": (None, [pointer]), "FreeCtrl": (None, [pointer])}
    for name, (result, arguments) in signatures.items():
        entries[name].restype, entries[name].argtypes = result, arguments
    entries["graph"], entries["idx"] = _graph_structure(idx), idx
    return entries


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


def _call(entry, indptr, indices, options, layout):
    """Call METIS's ``entry`` on the CSR graph ``(indptr, indices)`` with ``options`` (names of
    :data:`OPTION_INDEX` -> values; the others METIS's defaults), or return None when METIS
    cannot be called directly here. ``layout`` lists the entry's arguments: ``"nvtxs"``,
    ``"xadj"``, ``"adjncy"``, ``"options"``, ``None`` (a NULL pointer), an int (a pointer to
    that idx_t) or ``"out"`` (a new idx_t array of one entry per vertex); the ``"out"`` arrays
    are returned, in order."""
    library = _load()
    if library is None:
        return None
    index = library["index"]
    n = len(indptr) - 1
    settings = _settings(library, options)
    named = {"nvtxs": np.array([n], dtype=index), "options": settings,
             "xadj": np.ascontiguousarray(indptr, dtype=index),
             "adjncy": np.ascontiguousarray(indices, dtype=index)}
    arrays = []  # every argument's array, alive through the call
    for item in layout:
        if item is None:
            arrays.append(None)
        elif item == "out":
            arrays.append(np.empty(n, dtype=index))
        elif isinstance(item, int):
            arrays.append(np.array([item], dtype=index))
        else:
            arrays.append(named[item])
    status = library[entry](*[None if a is None else _address(a) for a in arrays])
    if status != 1:
        raise HisparseError(f"cholesky: METIS ({entry}) failed on a graph of {n} vertices and "
                            f"{len(indices)} adjacency entries: "
                            f"{_STATUS.get(status, f'status {status}')}")
    return [array for item, array in zip(layout, arrays) if item == "out"]


def node_nd(indptr, indices, options):
    """METIS's nested dissection of the CSR graph ``(indptr, indices)`` (no self loops, both
    directions of every edge) with ``options``. Returns the new-to-old permutation (int64: row
    ``k`` of the permuted matrix is row ``perm[k]``), or None when METIS cannot be called
    directly here."""
    # METIS_NodeND(nvtxs, xadj, adjncy, vwgt, options, perm, iperm)
    out = _call("node_nd", indptr, indices, options,
                ["nvtxs", "xadj", "adjncy", None, "options", "out", "out"])
    return None if out is None else out[0].astype(np.int64)


def bisection(indptr, indices, options):
    """METIS's recursive bisection of the CSR graph into 2 parts (what
    ``pymetis.part_graph(2, ...)`` runs) with ``options``: the part of every vertex (int8),
    or None when METIS cannot be called directly here."""
    # METIS_PartGraphRecursive(nvtxs, ncon, xadj, adjncy, vwgt, vsize, adjwgt, nparts, tpwgts,
    #                          ubvec, options, objval, part)
    out = _call("recursive", indptr, indices, options,
                ["nvtxs", 1, "xadj", "adjncy", None, None, None, 2, None, None, "options", 0,
                 "out"])
    return None if out is None else out[0].astype(np.int8)


def vertex_separator(indptr, indices, options):
    """METIS's vertex separator of the CSR graph ``(indptr, indices)`` (no self loops, both
    directions of every edge) with ``options`` (those of :func:`node_nd`: the separator is the
    one its dissection would compute at the top level): the side of every vertex (int8: 0 or
    1, and 2 on the separator), or None when it cannot be computed directly here (see the
    module's docstring)."""
    library = _load()
    entries = None if library is None else library["separator"]
    if entries is None:
        return None
    index, n = library["index"], len(indptr) - 1
    settings = _settings(library, options)
    xadj = np.array(indptr, dtype=index)  # copies: METIS is handed them for its own use
    adjncy = np.array(indices, dtype=index)
    ctrl = ctypes.c_void_p(entries["SetupCtrl"](_OP_ORDERING, _address(settings), 1, 3,
                                                None, None))
    if not ctrl.value:
        raise HisparseError(f"cholesky: METIS rejected the options of a vertex separator on a "
                            f"graph of {n} vertices")
    graph = ctypes.c_void_p()
    try:
        entries["InitRandom"](int(settings[OPTION_INDEX["seed"]]))  # as METIS_NodeND does
        graph.value = entries["SetupGraph"](ctrl, n, 1, _address(xadj), _address(adjncy),
                                            None, None, None)
        header = entries["graph"].from_address(graph.value)
        if (header.nvtxs, header.xadj, header.adjncy) != (n, xadj.ctypes.data,
                                                         adjncy.ctypes.data):
            return None  # not the layout this module knows
        entries["AllocateWorkSpace"](ctrl, graph)
        entries["MlevelNodeBisectionMultiple"](ctrl, graph)
        header = entries["graph"].from_address(graph.value)
        words = ctypes.POINTER(entries["idx"])
        side = np.ctypeslib.as_array(ctypes.cast(header.where, words), (n,)).astype(np.int8)
        weights = np.ctypeslib.as_array(ctypes.cast(header.pwgts, words), (3,)).copy()
    finally:
        if graph.value:
            entries["FreeGraph"](ctypes.byref(graph))
        entries["FreeCtrl"](ctypes.byref(ctrl))
    return side if is_separator(indptr, indices, side, weights) else None


def is_separator(indptr, indices, side, weights=None):
    """Whether ``side`` (0/1, 2 on the separator) separates the graph: no edge joins sides 0
    and 1 (and, given METIS's part ``weights``, the sides have those sizes)."""
    if len(side) != len(indptr) - 1 or (len(side) and (side.min() < 0 or side.max() > 2)):
        return False
    if weights is not None and not np.array_equal(np.bincount(side, minlength=3), weights):
        return False
    row_side = np.repeat(side, np.diff(indptr))
    return not np.any((row_side == 0) & (side[indices] == 1))
