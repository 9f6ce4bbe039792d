"""Which array library holds an array, told without importing CuPy unless it made the array: the
one home of the helpers that let host code take NumPy arrays, CuPy arrays and PyCUDA GPUArrays."""
import numpy as np

from .threads import over_pieces


def host_array(array):
    """``array`` as a NumPy array (a CuPy array is copied to the host; NumPy passes through)."""
    return array.get() if hasattr(array, "get") else array


def is_cupy_array(array):
    """Whether CuPy made ``array`` (told without importing CuPy)."""
    return type(array).__module__.startswith("cupy")


def array_module(array):
    """NumPy or CuPy, whichever made ``array`` (CuPy is imported only when it made the array):
    the partition, the generator and the routing of tensor input run where the nonzeros are."""
    if is_cupy_array(array):
        import cupy
        return cupy
    return np


def in_module(xp, array):
    """``array`` in ``xp``'s memory: NumPy's ``asarray`` for NumPy; for CuPy, a CuPy array as it
    is and a host array copied through page-locked pieces (:func:`hisparse.gpu.host_to_device`,
    twice the rate of ``cupy.asarray`` for the large COO of a tensor read from a file)."""
    if xp is np or is_cupy_array(array):
        return xp.asarray(array)
    from .gpu import host_to_device
    return host_to_device(xp, np.asarray(array))


def as_cupy(cupy, array):
    """A CuPy view of a PyCUDA ``GPUArray``'s memory (no copy; ``array`` keeps it alive)."""
    memory = cupy.cuda.UnownedMemory(int(array.gpudata), array.nbytes, array)
    return cupy.ndarray(array.shape, array.dtype, cupy.cuda.MemoryPointer(memory, 0))


def inverse_permutation(perm):
    """The inverse of a permutation (``inverse[perm[i]] = i``), int64."""
    inverse = np.empty(len(perm), dtype=np.int64)
    inverse[perm] = np.arange(len(perm), dtype=np.int64)
    return inverse


# -- one value many times, without the memory ---------------------------------------------------
# A graph's unit values are one value per entry: R-MAT 23's 131M float64 ones are 1 GB of host
# memory (its one-GPU run's peak 3.30 -> 2.25 GB without them, 2xH200), and copies in the split,
# for values that the GPU engines of a uniform matrix never read (they keep the one value). A
# repeated array is a read-only view of one element (stride 0): readers see every entry, nothing
# can write into it, and :func:`materialized` makes it a real array where code needs one.

def repeated(value, length, dtype=np.float64):
    """``value`` ``length`` times as a read-only 1-D view of one element (no memory); an array
    of its own below two entries (where :func:`repeated_value` would not tell it apart, and
    code that writes into arrays it is given may meet it)."""
    if int(length) < 2:
        return np.full(int(length), value, dtype=dtype)
    return np.broadcast_to(np.asarray(value, dtype=dtype), (int(length),))


def repeated_value(array):
    """The one value of a :func:`repeated` array (a 1-element array of its dtype), or ``None``
    for any other array (one that owns or views its entries)."""
    if isinstance(array, np.ndarray) and array.ndim == 1 and len(array) > 1 \
            and array.strides[0] == 0:
        return np.array(array[:1])
    return None


def materialized(array):
    """A :func:`repeated` array as a writable contiguous array (filled on the host's threads);
    any other array as it is."""
    value = repeated_value(array)
    if value is None:
        return array
    from .threads import fill_into
    return fill_into(np.empty(len(array), dtype=array.dtype), value[0])


# -- the same code on NumPy and CuPy, without CuPy's scalar operands --------------------------------
# CuPy loads cupyx, and with it SciPy's sparse package, at its first operation between an array
# and a scalar, in bincount and in unravel_index (0.3-0.45 s of a process's set-up on the H200
# host, docs/ops/sptv.md "Stop 52"); code that runs on either module takes these instead.

def operand(xp, value, dtype=np.int64):
    """``value`` as the other operand of an arithmetic operation with ``xp`` arrays: the scalar
    itself for NumPy, a one-element array for CuPy (an array-array operation, broadcast)."""
    if xp is np:
        return value
    return xp.asarray(np.array([value], dtype=dtype))


#: values from which :func:`count_values` counts NumPy arrays piece by piece on the host's
#: threads: the SpMV plan's column uses of a power-law graph's blocks (33M ghost entries a
#: rank of R-MAT 23 at 2 ranks) were one single-threaded ``bincount`` each
COUNT_PIECES_MIN = 1 << 23


def count_values(values, size):
    """How many times each of ``0 .. size - 1`` occurs in ``values`` (int64):
    ``bincount(values, minlength=size)``, on the device for CuPy arrays.

    Raises
    ------
    ValueError
        A value outside ``0 .. size - 1``, on either module (bincount would lengthen its
        result, the device count has no room for it)."""
    xp = array_module(values)
    if xp is not np:
        from .gpu import device_counts
        return device_counts(xp, values, size)
    if len(values) < COUNT_PIECES_MIN:
        parts = [np.bincount(values, minlength=size)]
    else:  # each piece's counts on a thread (NumPy lets the interpreter's lock go), then summed
        parts = over_pieces(lambda lo, hi: np.bincount(values[lo:hi], minlength=size),
                            len(values), name="hisparse-count")
    longest = max(len(part) for part in parts)
    if longest > size:
        raise ValueError(f"a value to count ({longest - 1}) is outside 0 .. {int(size) - 1}")
    counts = parts[0].astype(np.int64, copy=False)
    for part in parts[1:]:
        counts += part
    return counts


def unravel(flat, dims):
    """``(len(flat), len(dims))`` int64: the multi-index of each of ``flat`` (row-major in
    ``dims``, as ``unravel_index`` stacked), NumPy or CuPy."""
    xp = array_module(flat)
    if xp is np:
        return np.stack(np.unravel_index(flat, tuple(dims)), axis=1).astype(np.int64) \
            .reshape(-1, len(dims))
    out = xp.empty((len(flat), len(dims)), dtype=xp.int64)
    rest = flat.astype(xp.int64)
    for k in range(len(dims) - 1, -1, -1):
        extent = operand(xp, int(dims[k]))
        quotient = rest // extent
        out[:, k] = rest - quotient * extent
        rest = quotient
    return out


def min_max(values):
    """``(values.min(), values.max())`` of a non-empty array: a NumPy one in pieces on the host's
    threads (:func:`~hisparse.threads.over_pieces`; a NaN anywhere makes both NaN, as NumPy's
    own reductions do), a CuPy one by its own reductions."""
    if is_cupy_array(values):
        return values.min(), values.max()
    values = np.asarray(values).reshape(-1)
    bounds = over_pieces(lambda lo, hi: (values[lo:hi].min(), values[lo:hi].max()), len(values),
                         "hisparse-minmax")
    lows, highs = zip(*bounds)
    return np.min(np.array(lows, dtype=values.dtype)), np.max(np.array(highs, dtype=values.dtype))


def all_finite(values):
    """Whether every element of a floating-point array is finite: a NumPy one in pieces on the
    host's threads (:func:`~hisparse.threads.over_pieces`), a CuPy one by its own module."""
    if is_cupy_array(values):
        return bool(array_module(values).isfinite(values).all())
    values = np.asarray(values).reshape(-1)
    return all(over_pieces(lambda lo, hi: bool(np.isfinite(values[lo:hi]).all()), len(values),
                           "hisparse-finite"))


def is_device_array(array):
    """A PyCUDA GPUArray (anything with ``gpudata``)."""
    return hasattr(array, "gpudata")


def distinct_of_sorted(values):
    """The distinct values of a sorted 1-D array, in order."""
    if len(values) < 2:
        return values.copy()
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def sorted_distinct(values):
    """``np.unique(values)`` of a 1-D host array (sorted distinct values), by a sort and one
    comparison pass. NumPy 2.3 made ``np.unique`` without ``return_*`` hash-based, which is
    10-16x slower on integer arrays (NumPy 2.4: 0.60 s against 0.04 s for 730k int64, 8.7 s
    against 0.7 s for 10M); the analysis and the halo plans call it on millions of ids."""
    return distinct_of_sorted(np.sort(np.asarray(values).ravel()))


def with_sorted(values, extra):
    """The sorted distinct union of ``values`` (sorted, distinct, 1-D) and ``extra`` (a few
    values in any order), with ``values``' dtype: the few inserted where they belong, not the
    whole sorted again (supernode boundaries with a handful of cuts added: 730k of them, 0.03 s
    a sort)."""
    values = np.asarray(values)
    extra = sorted_distinct(np.asarray(extra, dtype=values.dtype))
    if not len(extra):
        return values.copy()
    at = np.searchsorted(values, extra)
    new = (at == len(values)) | (values[np.minimum(at, len(values) - 1)] != extra) \
        if len(values) else np.ones(len(extra), dtype=bool)
    return np.insert(values, at[new], extra[new])


#: the widest unsigned key a stable NumPy sort orders by radix (one pass per byte) rather than
#: by timsort
_RADIX_KEY = np.uint16


def order_by_count(counts):
    """``np.argsort(-counts, kind="stable")`` of non-negative integer ``counts`` (row lengths,
    column uses): most first, ties in index order. By a radix sort of the counts clipped to
    16 bits, then the few clipped ones (the hubs of a power-law graph) ordered by their full
    counts: the SpMV plan orders millions of rows and ghost columns this way at set-up (R-MAT
    at 4.2M rows: 0.24 s against 0.13 s on the development host)."""
    counts = np.asarray(counts)
    top = np.iinfo(_RADIX_KEY).max
    key = np.subtract(top, np.minimum(counts, top), dtype=np.int64).astype(_RADIX_KEY)
    order = np.argsort(key, kind="stable")
    clipped = int(np.count_nonzero(key == 0))  # counts >= top, first, in index order
    if clipped > 1:
        heavy = order[:clipped]
        order[:clipped] = heavy[np.argsort(-counts[heavy], kind="stable")]
    return order
