"""Kernels of ``kernels_cu/`` on CuPy arrays: each source one CuPy ``RawModule`` (compiled by
NVRTC, kept in CuPy's kernel cache, loaded once a process), for the device steps that hold CuPy
arrays (the generators, :mod:`._generate`; counts, :func:`device_counts`).

Why not CuPy's own routines there: CuPy loads ``cupyx``, and with it SciPy's sparse package, at
its first operation between an array and a scalar, in ``bincount`` and in ``unravel_index``
(0.3-0.45 s of a process's set-up on the H200 host; array-array operations, sorts, scans,
gathers, ``unique``, ``searchsorted`` and raw kernels with scalar arguments do not:
``docs/scaling/stop52_x2/probe55.py``, ``probe57.py``), and chains of its array expressions are
one kernel each to compile and load.
"""
import re

import numpy as np

from ._compile import kernel_source_dir

#: Threads per block of every launch (grid-stride loops or fixed items a thread: any count fits).
BLOCK = 256
#: Blocks at most per grid-stride launch (each thread then loops).
MAX_BLOCKS = 65536
#: Values a thread of ``count_values`` takes (COUNT_ITEMS in kernels_cu/device_arrays.cu).
COUNT_ITEMS = 16

_MODULES = {}


def _source_with_headers(name):
    """``kernels_cu/<name>`` with its ``#include "x.cuh"`` lines replaced by the headers' text,
    so that CuPy's cache key (the code's hash) changes when a header does."""
    directory = kernel_source_dir()
    return re.sub(r'^#include "([^"]+\.cuh)"\s*$',
                  lambda match: (directory / match.group(1)).read_text(),
                  (directory / name).read_text(), flags=re.M)


def raw_module(cupy, source):
    """The module of ``kernels_cu/<source>`` (compiled once a process; CuPy loads it on each
    device it is used on)."""
    if source not in _MODULES:
        _MODULES[source] = cupy.RawModule(code=_source_with_headers(source),
                                          options=("-std=c++17",))
    return _MODULES[source]


def launch(cupy, source, kernel, count, *args, items=None):
    """``kernel`` of ``source`` over ``count`` items on CuPy's current stream: a grid-stride
    launch, or with ``items`` a thread for every ``items`` items."""
    if count <= 0:
        return
    threads = count if items is None else (count + items - 1) // items
    blocks = (threads + BLOCK - 1) // BLOCK
    if items is None:
        blocks = min(MAX_BLOCKS, blocks)
    raw_module(cupy, source).get_function(kernel)((int(blocks),), (BLOCK,), args)


def last_value(array):
    """The last element of a CuPy array as an int (0 when empty), by a slice's copy to the
    host (no scalar operation)."""
    return int(array[len(array) - 1:].get()[0]) if len(array) else 0


def device_counts(cupy, values, size):
    """How many times each of ``0 .. size - 1`` occurs in ``values`` (a CuPy integer array):
    ``bincount(values, minlength=size)`` as int64, on the device.

    Raises
    ------
    ValueError
        A value outside ``0 .. size - 1`` (the kernel would add outside the counts), named.
    """
    values = cupy.ascontiguousarray(values).astype(cupy.int64, copy=False)
    if len(values):
        low, high = int(values.min()), int(values.max())  # reductions: no scalar operand
        if low < 0 or high >= size:
            raise ValueError(f"a value to count ({low if low < 0 else high}) is outside "
                             f"0 .. {int(size) - 1}")
    counts = cupy.zeros(int(size), dtype=cupy.uint64)
    launch(cupy, "device_arrays.cu", "count_values", len(values), values,
           np.int64(len(values)), counts, items=COUNT_ITEMS)
    return counts.view(cupy.int64)
