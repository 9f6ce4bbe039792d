"""FROSTT-like random tensors, made by fiber ranges on the host or on a GPU."""
import math
from dataclasses import dataclass

import numpy as np

from ..formats import COOTensor
from ._common import _threaded
from ._keyed_permutation import Permutation, _mix64, _permutation, keyed_permutation


# -- random tensors: every random number a hash of (seed, purpose, fiber, counter) ---------------
#
# Fiber f (0 <= f < nfibers) is made from its number alone: its coordinates outside the fiber mode
# are the f-th image of a keyed permutation of the fiber space (distinct fibers, uniform, in random
# order), its length a lognormal draw scaled by a constant known in advance, its mode-n indices
# and values hashes of (fiber, draw) and (fiber, index). Integer hashing and table lookups give
# the same bits in NumPy (the code below, the reference) and on a GPU (kernels_cu/generators.cu,
# through hisparse.gpu.DeviceFibers), so any range of fibers is made alone, on the host or on a
# GPU, and ranks that each make a range get together exactly the tensor of one process.

#: Fibers made per step on the host (bounds the temporaries: about 0.5 M nonzeros per step at 0.14
#: fibers per nonzero) and on a GPU (fewer, larger steps: launches and syncs cost more there than
#: memory). Any value gives the same tensor.
TENSOR_FIBER_STEP = 1 << 16
TENSOR_FIBER_STEP_GPU = 1 << 20

#: The lognormal weights are read from a table of ``2**bits + 1`` quantiles, linearly interpolated
#: (a lookup, a multiply and an add: the same bits on every array module, where ``exp`` and ``log``
#: may differ in the last place between libm and CUDA). Quantiles beyond ``2**-(bits + 2)`` from
#: either end are clamped there (z = +-5.0 at 20 bits: among ten million fibers about one is cut).
_WEIGHT_TABLE_BITS = 20

#: Hash purposes (distinct streams of one seed).
_LENGTH, _ROUNDING, _EXTRA, _INDEX, _VALUE = 1, 2, 3, 4, 5


def _stream_key(seed, purpose):
    """The uint64 key of one purpose's stream of ``seed`` (SplitMix64 on Python integers)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + purpose) & _WORD
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _WORD
    return np.uint64(x ^ (x >> 31))


_WORD = (1 << 64) - 1


def _hash(key, first):
    """Counter-based uint64 hash of ``(key, first)`` (uint64 arrays, NumPy or CuPy); a second
    counter is folded in by :func:`_hash_more`."""
    return _mix64(first * np.uint64(0x9E3779B97F4A7C15) ^ key)


def _hash_more(premixed, second):
    """The hash of ``(key, first, second)`` from ``premixed = _hash(key, first)``: a fiber's
    hash is mixed once and reused by each of its nonzeros."""
    return _mix64(premixed + second * np.uint64(0xD1B54A32D192ED03))


def _unit_float(bits):
    """Uniform float64 in [0, 1) from uint64 hashes (the top 53 bits: exact on every module)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)


def _normal_quantiles(q):
    """Standard normal quantiles of ``q`` in (0, 1) (Acklam's rational approximation, relative
    error below 1.2e-9: it defines the generator's weights, computed once on the host)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00)
    q = np.asarray(q, dtype=np.float64)
    z = np.empty_like(q)
    low, high = q < 0.02425, q > 1 - 0.02425
    middle = ~(low | high)
    r = q[middle] - 0.5
    s = r * r
    z[middle] = (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r / \
        (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)
    for where, sign, tail in ((low, 1.0, q[low]), (high, -1.0, 1 - q[high])):
        t = np.sqrt(-2 * np.log(tail))
        z[where] = sign * (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / \
            ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
    return z


def _weight_table(skew):
    """``(table, steps, mean)``: lognormal(0, ``skew``) quantiles at ``k / 2**bits`` (k = 0 ..
    2**bits, the ends clamped), the differences of neighbours, and the mean of the
    piecewise-linear law they define (what the fiber lengths are normalised by)."""
    count = 1 << _WEIGHT_TABLE_BITS
    clamp = 2.0 ** -(_WEIGHT_TABLE_BITS + 2)
    q = np.clip(np.arange(count + 1, dtype=np.float64) / count, clamp, 1 - clamp)
    table = np.exp(skew * _normal_quantiles(q))
    steps = table[1:] - table[:-1]
    mean = float((table[:-1] + table[1:]).sum() / (2 * count))
    return table, steps, mean


#: The keyed permutation's stream that places the fibers in the fiber space.
_COORDINATE_STREAM = 2


@dataclass
class FiberRecipe:
    """What a random tensor's fibers are made from on a GPU (:class:`hisparse.gpu.DeviceFibers`),
    decided on the host by :class:`TensorSource`: the weight ``table`` and its ``steps`` (float64,
    ``2**table_bits + 1`` and ``2**table_bits`` values), ``scale`` (a weight's share of the
    nonzeros), the stream ``keys`` by purpose (``length``, ``rounding``, ``extra``, ``index``,
    ``value``), the tensor's ``shape`` and fiber ``mode``, and the fiber space's
    :class:`Permutation`."""

    table: np.ndarray
    steps: np.ndarray
    table_bits: int
    scale: float
    keys: dict
    shape: tuple
    mode: int
    permutation: Permutation


@dataclass
class TensorSource:
    """How :func:`random_tensor`'s tensor is made by fiber ranges (ranks that each make a range
    get together the same tensor, whatever their number and array module).

    Attributes
    ----------
    shape : tuple of int
    mode : int
        The fiber mode.
    nfibers : int
        Fibers (numbered ``0 .. nfibers - 1``; every one holds at least one nonzero).
    """

    shape: tuple
    mode: int
    nfibers: int
    nnz: int
    seed: int
    skew: float

    def fibers(self, fibers=None, xp=np):
        """The nonzeros of fibers ``fibers`` (a range; default all) with array module ``xp``:
        ``(indices (k, N) int64, values (k,) float64)``, grouped by fiber in fiber order, mode-n
        indices ascending inside a fiber, no duplicate coordinates."""
        fibers = range(self.nfibers) if fibers is None else fibers
        return self.fibers_of(xp.arange(fibers.start, fibers.stop, dtype=xp.int64), xp)

    def fibers_of(self, ids, xp=np):
        """:meth:`fibers` of the fibers numbered ``ids`` (an ``xp`` integer array, any order, no
        repeats), grouped by fiber in the order of ``ids``: a fiber's nonzeros depend on its
        number alone, so a rank makes the fibers it owns without anyone sending them."""
        step = TENSOR_FIBER_STEP if xp is np else TENSOR_FIBER_STEP_GPU
        ids = ids.astype(xp.uint64)
        starts = range(0, len(ids), step)
        if xp is np:  # the steps on the process's cores (NumPy lets the interpreter's lock go)
            self._weights()
            pieces = [None] * len(starts)
            _threaded(lambda k: pieces.__setitem__(k, self._step(ids[starts[k]:starts[k] + step])),
                      range(len(starts)))
        else:  # one GPU: its steps in order, each in the device module's five launches
            device = self._on_device(xp)
            pieces = [device.fibers(ids[lo:lo + step]) for lo in starts]
        if not pieces:
            return (xp.zeros((0, len(self.shape)), dtype=xp.int64), xp.zeros(0, dtype=xp.float64))
        if len(pieces) == 1:
            return pieces[0]
        if xp is not np:
            return (xp.concatenate([p[0] for p in pieces]), xp.concatenate([p[1] for p in pieces]))
        # Joined by the threads too: one copy of the whole tensor is a second of memcpy at 77M.
        ends = np.cumsum([len(p[1]) for p in pieces])
        indices = np.empty((int(ends[-1]), len(self.shape)), dtype=np.int64)
        values = np.empty(int(ends[-1]), dtype=np.float64)

        def place(k):
            lo = int(ends[k - 1]) if k else 0
            indices[lo:int(ends[k])], values[lo:int(ends[k])] = pieces[k]
            pieces[k] = None

        _threaded(place, range(len(pieces)))
        return indices, values

    def fiber_coordinates(self, ids, xp=np):
        """The coordinates of the fibers numbered ``ids`` (an ``xp`` integer array): ``(len(ids),
        N)`` int64, 0 in the fiber mode's column. Distinct points of the fiber space, in random
        order (a keyed permutation of the numbers), so that where a fiber goes is known without
        making its nonzeros."""
        if xp is not np:
            return self._on_device(xp).coordinates(ids.astype(xp.uint64))
        shape, mode = self.shape, self.mode
        other = [m for m in range(len(shape)) if m != mode]
        sizes = [shape[m] for m in other]
        linear = keyed_permutation(ids.astype(np.int64), math.prod(sizes), self.seed,
                                   stream=_COORDINATE_STREAM)
        coords = np.zeros((len(ids), len(shape)), dtype=np.int64)
        for m, extent in zip(other[::-1], sizes[::-1]):
            coords[:, m] = linear % extent
            linear = linear // extent
        return coords

    def _on_device(self, cupy):
        """The :class:`hisparse.gpu.DeviceFibers` of this tensor on the current GPU (made once
        per device: the weight table uploaded once)."""
        from ..gpu import DeviceFibers
        made = self.__dict__.setdefault("_device_fibers", {})
        device = cupy.cuda.Device().id
        if device not in made:
            made[device] = DeviceFibers(cupy, self.recipe())
        return made[device]

    def recipe(self):
        """What the device makes the fibers from (:class:`FiberRecipe`): the host's decisions
        of :meth:`_lengths`, :meth:`_step` and :meth:`fiber_coordinates`, made once."""
        table, steps, mean = self._weights()
        space = math.prod(s for m, s in enumerate(self.shape) if m != self.mode)
        return FiberRecipe(
            table=table, steps=steps, table_bits=_WEIGHT_TABLE_BITS,
            scale=self._scale(mean),
            keys={purpose: int(_stream_key(self.seed, code)) for purpose, code in
                  (("length", _LENGTH), ("rounding", _ROUNDING), ("extra", _EXTRA),
                   ("index", _INDEX), ("value", _VALUE))},
            shape=tuple(self.shape), mode=self.mode,
            permutation=_permutation(space, self.seed, stream=_COORDINATE_STREAM))

    def _scale(self, mean):
        """A weight's share of the nonzeros: the expected total of the fibers' lengths is then
        ``nnz``."""
        return self.nnz / (self.nfibers * mean)

    def _weights(self):
        """:func:`_weight_table` of the skew, made once (before threads share it)."""
        if getattr(self, "_table", None) is None:
            self._table = _weight_table(self.skew)
        return self._table

    def _lengths(self, ids):
        """Nonzeros wanted in each fiber of ``ids`` (uint64): a lognormal weight times a constant
        (the expected total is ``nnz``), rounded up or down at random, in [1, I_n]."""
        table, steps, mean = self._weights()
        bits = _hash(_stream_key(self.seed, _LENGTH), ids)
        # The top bits pick the table slot, the rest place the weight inside it.
        slot = (bits >> np.uint64(64 - _WEIGHT_TABLE_BITS)).astype(np.int64)
        fraction = _unit_float(bits << np.uint64(_WEIGHT_TABLE_BITS))
        weight = table[slot] + fraction * steps[slot]
        share = weight * self._scale(mean)
        rounded = np.floor(share + _unit_float(_hash(_stream_key(self.seed, _ROUNDING), ids)))
        return np.clip(rounded, 1, self.shape[self.mode]).astype(np.int64)

    def _step(self, ids):
        """The nonzeros of the fibers ``ids`` (uint64), grouped in their order, on the host (the
        reference of the device module's steps)."""
        size = self.shape[self.mode]
        lengths = self._lengths(ids)
        # Draws with replacement, a few more than the length so that about `length` distinct
        # indices remain: L + L(L-1)/(2 I) (rounded at random, integer arithmetic only).
        capped = np.minimum(lengths, 1 << 31).astype(np.uint64)
        spare = _hash(_stream_key(self.seed, _EXTRA), ids) % np.uint64(2 * size)
        draws = lengths + ((capped * (capped - np.uint64(1)) + spare) //
                           np.uint64(2 * size)).astype(np.int64)
        total = int(draws.sum())
        local = np.repeat(np.arange(len(draws), dtype=np.int64), draws)  # each draw's fiber
        counter = np.arange(total, dtype=np.int64) - (np.cumsum(draws) - draws)[local]
        index = _hash_more(_hash(_stream_key(self.seed, _INDEX), ids)[local],
                           counter.astype(np.uint64)) % np.uint64(size)
        del counter
        # Distinct indices inside each fiber, ascending: sort (fiber, index) keys, drop repeats.
        keys = np.sort(local * size + index.astype(np.int64))
        del local, index
        if len(keys) > 1:
            keys = keys[np.concatenate([np.ones(1, dtype=bool), keys[1:] != keys[:-1]])]
        local, index = keys // size, keys % size
        values = _unit_float(_hash_more(_hash(_stream_key(self.seed, _VALUE), ids)[local],
                                        index.astype(np.uint64)))
        indices = self.fiber_coordinates(ids)[local]
        indices[:, self.mode] = index
        return indices, values


def tensor_source(dims, nnz, fibers_per_nnz=0.1, mode=None, seed=0, skew=1.0):
    """The :class:`TensorSource` of :func:`random_tensor`'s parameters."""
    dims = tuple(int(d) for d in dims)
    mode = len(dims) - 1 if mode is None else int(mode)
    space = float(np.prod([float(d) for m, d in enumerate(dims) if m != mode]))
    if space >= 2.0 ** 62:
        raise ValueError(f"random_tensor: the modes other than {mode} span {space:.3g} fibers; "
                         f"at most 2**62 are supported")
    largest_step = max(TENSOR_FIBER_STEP, TENSOR_FIBER_STEP_GPU)
    if dims[mode] >= 2 ** 62 // largest_step:  # (fiber in step, index) keys stay in int64
        raise ValueError(f"random_tensor: mode {mode} has {dims[mode]} indices; at most "
                         f"{2 ** 62 // largest_step - 1} are supported")
    nfibers = int(max(1, min(round(nnz * fibers_per_nnz), space, nnz)))
    return TensorSource(dims, mode, nfibers, int(nnz), int(seed), float(skew))


def random_tensor(dims, nnz, fibers_per_nnz=0.1, mode=None, seed=0, skew=1.0):
    """FROSTT-like random tensor with a target number of nonzeros and of mode-``mode`` fibers.

    ``round(fibers_per_nnz * nnz)`` distinct fibers (coordinate tuples of every mode but
    ``mode``) are drawn uniformly; fiber lengths follow a skewed (lognormal, ``skew`` = sigma)
    law, clipped to [1, I_mode], scaled so that they total ``nnz`` in expectation; indices along
    ``mode`` are drawn uniformly without clustering, a few extra draws making up for repeats,
    which are merged (so the result has about ``nnz`` nonzeros, not exactly). Nonzeros come
    grouped by fiber, the fibers in random order, indices ascending inside a fiber.

    Every random number is a counter-based hash of the seed and the fiber's number
    (:class:`TensorSource`): any range of fibers is made alone, with NumPy or CuPy, and gives
    exactly those fibers of this tensor.

    Parameters
    ----------
    dims : list of int
        Shape, order N >= 2.
    nnz : int
        Target nonzeros.
    fibers_per_nnz : float
        Target ratio of non-empty mode-``mode`` fibers to nonzeros, in (0, 1].
    mode : int, optional
        The fiber mode; default the last.
    """
    source = tensor_source(dims, nnz, fibers_per_nnz, mode, seed, skew)
    indices, values = source.fibers()
    return COOTensor(indices, values, source.shape)
