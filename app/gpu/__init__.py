"""GPU plumbing (PyCUDA), the one layer every GPU engine goes through: device binding, kernel
compilation with a node-local cache, kernel tables with signatures derived from the sources
(:mod:`._kernels`), the device-memory arena (:mod:`._memory`), CUDA graphs (:mod:`._graphs`),
the one adapter to CuPy's libraries (:mod:`._blas`: cuBLAS/cuSOLVER handles and the cuSPARSE
peers), and the steps on CuPy arrays (:mod:`._raw`: our kernels through CuPy, staged copies
between the host and CuPy, the SpMV plan's renumbering; :mod:`._generate`, :mod:`._rmat`: the
generators).

Nothing here imports ``pycuda`` or ``cupy`` at module import time: :func:`gpu_available` probes
lazily, and the other functions import it when called, raising a
:class:`~hisparse.errors.HisparseError` that says how to install it when it is missing.
"""
from ..lazy import lazy_getattr

# Imported on first use (PEP 562), so that `hisparse run` can start CUDA's initialisation
# (:mod:`._warmup`) before NumPy and the rest are imported.
_WHERE = {"GpuDevice": "._device", "bind_device": "._device", "gpu_available": "._device",
          "require_pycuda": "._device", "select_device_ordinal": "._device",
          "load_module": "._compile", "kernel_source_dir": "._compile",
          "C_TYPES": "._kernels", "KernelTable": "._kernels", "Kernels": "._kernels",
          "c_type": "._kernels", "grid_1d": "._kernels", "index_scalar": "._kernels",
          "kernel_declarations": "._kernels", "type_defines": "._kernels",
          "CapturedWork": "._graphs", "GraphCache": "._graphs", "ReplayPlan": "._graphs",
          "background_work": "._graphs",
          "DeviceArena": "._memory", "DeviceBuffer": "._memory", "free_pinned": "._memory",
          "staged_download": "._memory", "CudaWarmup": "._warmup",
          "device_copy_bandwidth": "._bandwidth", "host_copy_bandwidth": "._bandwidth",
          "host_to_device_bandwidth": "._bandwidth",
          "DenseHandles": "._blas", "csr_to_cupy": "._blas", "cupy_libraries": "._blas",
          "import_cupy": "._blas", "optional_cupy": "._blas",
          "fits_free_memory": "._blas", "import_cupy_sparse": "._blas", "release_pool": "._blas",
          "start_library_import": "._blas", "time_with_events": "._blas",
          "DeviceFibers": "._generate", "device_keyed_permutation": "._generate",
          "device_rmat_edges": "._rmat", "device_rmat_unit_rows": "._rmat",
          "device_counts": "._raw", "RowsOnDevice": "._raw", "host_copy": "._raw",
          "host_to_device": "._raw",
          "CSR5_KERNELS": "._csr5", "Csr5Device": "._csr5", "csr5_column_dtype": "._csr5",
          "csr5_defines": "._csr5", "NARROW_COLUMNS_MAX": "._csr5"}

__all__ = list(_WHERE)
__getattr__ = lazy_getattr(__name__, _WHERE)
