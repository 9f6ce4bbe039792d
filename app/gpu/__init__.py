"""GPU plumbing (PyCUDA), the one layer every GPU engine goes through: device binding, kernel
compilation with a node-local cache, kernel tables with signatures derived from the sources
(:mod:`._kernels`), the device-memory arena (:mod:`._memory`), CUDA graphs (:mod:`._graphs`), and the one adapter to CuPy's
libraries (:mod:`._blas`: cuBLAS/cuSOLVER handles and the cuSPARSE peers).

Nothing here imports ``pycuda`` or ``cupy`` at module import time: :func:`gpu_available` probes
lazily, and the other functions import it when called, raising a
:class:`~hisparse.errors.HisparseError` that says how to install it when it is missing.
"""
from ._device import GpuDevice, bind_device, gpu_available, require_pycuda, select_device_ordinal
from ._compile import kernel_source_dir, load_module
from ._kernels import (C_TYPES, KernelTable, Kernels, c_type, grid_1d, index_scalar,
                       kernel_declarations, type_defines)
from ._graphs import CapturedWork, GraphCache, ReplayPlan
from ._memory import DeviceArena, DeviceBuffer

__all__ = ["GpuDevice", "bind_device", "gpu_available", "require_pycuda",
           "select_device_ordinal", "load_module", "kernel_source_dir", "C_TYPES", "KernelTable",
           "Kernels", "c_type", "grid_1d", "index_scalar", "kernel_declarations", "type_defines",
           "DeviceArena", "DeviceBuffer", "CapturedWork", "GraphCache", "ReplayPlan"]
