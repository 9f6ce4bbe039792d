"""The random generators' device steps (``kernels_cu/generators.cu``) on CuPy arrays, as one
CuPy ``RawModule`` compiled by NVRTC and kept in CuPy's kernel cache.

The same steps written as CuPy array expressions (what :mod:`hisparse.generators` runs on NumPy)
took 44 elementwise kernels: a machine's first run compiled them for 6.1 s (H200 host), every
later process loaded them one by one, and their scalar operands made CuPy load SciPy's sparse
package (:mod:`._raw`). Here: one module, six kernels, no scalar operand. The host code that decides what to make (stream keys, the weight table, the
permutation's parameters) stays in :mod:`hisparse.generators`, which hands it over
(``Permutation``, ``FiberRecipe``).
"""
import numpy as np

from ._raw import last_value, launch

#: The kernels' source (one CuPy RawModule).
SOURCE = "generators.cu"


def _launch(cupy, kernel, count, *args):
    launch(cupy, SOURCE, kernel, count, *args)


def walk_operands(permutation, keys):
    """The keyed permutation's operands of every kernel that walks it (``feistel_walk``: limit,
    shift, low, the keys on the device, their count), from the host's
    :class:`hisparse.generators.Permutation` and ``keys``, its keys already on the device."""
    return (np.uint64(permutation.limit), np.uint64(permutation.shift),
            np.uint64(permutation.low), keys, np.int32(len(permutation.keys)))


def device_keyed_permutation(cupy, values, permutation):
    """:func:`hisparse.generators.keyed_permutation` of ``values`` (a CuPy uint64 array) on the
    device (uint64); ``permutation``: its parameters (``limit``, ``shift``, ``low``, ``keys``:
    :class:`hisparse.generators.Permutation`)."""
    out = cupy.empty(len(values), dtype=cupy.uint64)
    keys = cupy.asarray(permutation.keys)
    _launch(cupy, "keyed_permutation", len(values), values, np.int64(len(values)),
            *walk_operands(permutation, keys), out)
    return out


class DeviceFibers:
    """A random tensor's fibers made on the current GPU from a recipe (its tables uploaded
    once): :class:`hisparse.generators.FiberRecipe`, what the host decided."""

    def __init__(self, cupy, recipe):
        self.cupy, self.recipe = cupy, recipe
        self._table = cupy.asarray(recipe.table)
        self._steps = cupy.asarray(recipe.steps)
        self._permutation_keys = cupy.asarray(recipe.permutation.keys)
        self._extents = cupy.asarray(np.asarray(recipe.shape, dtype=np.int64))

    def coordinates(self, ids):
        """``(len(ids), N)`` int64: each fiber's coordinates, 0 in the fiber mode (``ids``: a
        CuPy uint64 array)."""
        cupy, recipe, count = self.cupy, self.recipe, len(ids)
        order = len(recipe.shape)
        out = cupy.empty((count, order), dtype=cupy.int64)
        permutation = recipe.permutation
        _launch(cupy, "fiber_coordinates", count, ids, np.int64(count),
                *walk_operands(permutation, self._permutation_keys), self._extents,
                np.int32(order), np.int32(recipe.mode), out)
        return out

    def fibers(self, ids):
        """``(indices (k, N) int64, values (k,) float64)`` of the fibers ``ids`` (a CuPy uint64
        array), grouped by fiber in the order of ``ids``, indices ascending inside a fiber."""
        cupy, recipe, count = self.cupy, self.recipe, len(ids)
        order, size = len(recipe.shape), int(recipe.shape[recipe.mode])
        draws = cupy.empty(count, dtype=cupy.int64)
        _launch(cupy, "fiber_draws", count, ids, np.int64(count), self._table, self._steps,
                np.int32(recipe.table_bits), np.float64(recipe.scale),
                np.uint64(recipe.keys["length"]), np.uint64(recipe.keys["rounding"]),
                np.uint64(recipe.keys["extra"]), np.int64(size), draws)
        ends = cupy.cumsum(draws)
        del draws
        total = last_value(ends)
        keys = cupy.empty(total, dtype=cupy.int64)
        _launch(cupy, "draw_keys", total, ids, ends, np.int64(count), np.int64(total),
                np.uint64(recipe.keys["index"]), np.int64(size), keys)
        del ends
        keys.sort()
        flags = cupy.empty(total, dtype=cupy.int64)
        _launch(cupy, "first_of_runs", total, keys, np.int64(total), flags)
        positions = cupy.cumsum(flags)
        kept = last_value(positions)
        coordinates = self.coordinates(ids)
        indices = cupy.empty((kept, order), dtype=cupy.int64)
        values = cupy.empty(kept, dtype=cupy.float64)
        _launch(cupy, "emit_nonzeros", total, keys, flags, positions, np.int64(total), ids,
                coordinates, np.int32(order), np.int32(recipe.mode), np.int64(size),
                np.uint64(recipe.keys["value"]), indices, values)
        return indices, values
