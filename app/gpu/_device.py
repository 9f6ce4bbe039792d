"""Rank-to-GPU binding through the device's primary context (never ``pycuda.autoinit``)."""
import os
from dataclasses import dataclass, field

from ..errors import HisparseError


def require_pycuda():
    """Import and initialise ``pycuda.driver``; raise a helpful error when unavailable."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise HisparseError(
            f"backend 'gpu' needs PyCUDA and a CUDA driver ({exc}); install with "
            f"pip install 'hisparse[gpu]' or run with backend: cpu") from None
    try:
        cuda.init()
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError family
        raise HisparseError(f"CUDA driver initialisation failed: {exc}") from None
    return cuda


def gpu_available():
    """True when PyCUDA imports and at least one CUDA device is visible."""
    try:
        cuda = require_pycuda()
        return cuda.Device.count() > 0
    except HisparseError:
        return False


def select_device_ordinal(local_rank, device_count):
    """The device a rank uses: its node-local rank modulo the visible devices.

    With one visible device (e.g. ``srun --gpus-per-task=1``) every rank takes device 0; with
    several (``mpiexec`` inside an allocation) ranks spread round-robin over them. This single
    function is the whole rank-to-GPU policy.
    """
    if device_count <= 0:
        raise HisparseError("no CUDA device is visible (CUDA_VISIBLE_DEVICES="
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    return 0 if device_count == 1 else local_rank % device_count


@dataclass
class GpuDevice:
    """A bound GPU: its primary context is current on this thread until :meth:`release`."""

    ordinal: int
    name: str
    pci_bus_id: str
    compute_capability: tuple
    total_memory: int
    context: object = field(repr=False)
    driver_version: int = 0
    cuda_version: tuple = ()

    @property
    def arch(self):
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def free_memory(self):
        """Free bytes on this device now (the memory estimate's check before a run)."""
        import pycuda.driver as cuda
        return cuda.mem_get_info()[0]

    def release(self):
        """Pop and detach the primary context (idempotent)."""
        if self.context is not None:
            try:
                self.context.pop()
            finally:
                self.context.detach()
                self.context = None

    def info(self):
        """Flat description recorded per rank in the results file."""
        return {"gpu_ordinal": self.ordinal, "gpu_name": self.name,
                "gpu_pci_bus_id": self.pci_bus_id,
                "gpu_cc": "%d.%d" % self.compute_capability,
                "gpu_memory_bytes": int(self.total_memory)}


def bind_device(local_rank):
    """Bind this rank to its GPU and make the primary context current.

    Parameters
    ----------
    local_rank : int
        Rank within the node (from the shared-memory communicator).

    Returns
    -------
    GpuDevice
    """
    cuda = require_pycuda()
    ordinal = select_device_ordinal(local_rank, cuda.Device.count())
    device = cuda.Device(ordinal)
    context = device.retain_primary_context()
    context.push()
    return GpuDevice(ordinal=ordinal, name=device.name(), pci_bus_id=device.pci_bus_id(),
                     compute_capability=device.compute_capability(),
                     total_memory=device.total_memory(), context=context,
                     driver_version=cuda.get_driver_version(), cuda_version=cuda.get_version())
