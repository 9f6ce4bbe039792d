"""GPU plumbing (PyCUDA): device binding, kernel compilation with a node-local cache, streams,
events, pinned buffers and bandwidth measurement.

Nothing here imports ``pycuda`` at module import time: :func:`gpu_available` probes lazily, and
the other functions import it when called, raising a :class:`~hisparse.errors.HisparseError` that
says how to install it when it is missing.
"""
from ._device import GpuDevice, bind_device, gpu_available, require_pycuda, select_device_ordinal
from ._compile import kernel_source_dir, load_module

__all__ = ["GpuDevice", "bind_device", "gpu_available", "require_pycuda",
           "select_device_ordinal", "load_module", "kernel_source_dir"]
