"""Which array library holds an array, told without importing CuPy unless it made the array: the
one home of the helpers that let host code take NumPy arrays, CuPy arrays and PyCUDA GPUArrays."""
import numpy as np


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


def as_cupy(cupy, array):
    """A CuPy view of a PyCUDA ``GPUArray``'s memory (no copy; ``array`` keeps it alive)."""
    memory = cupy.cuda.UnownedMemory(int(array.gpudata), array.nbytes, array)
    return cupy.ndarray(array.shape, array.dtype, cupy.cuda.MemoryPointer(memory, 0))


def is_device_array(array):
    """A PyCUDA GPUArray (anything with ``gpudata``)."""
    return hasattr(array, "gpudata")
