"""The per-rank run context handed to operations: config, communicators, backend, device, dtypes,
timer and kernel loading."""
import errno
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import HisparseError

#: A step of a run (the read, the setup, Cholesky's analysis, a repeat) longer than this many
#: seconds gets a progress line on rank 0 (:meth:`RunContext.progress`).
PROGRESS_SECONDS = 1.0

VALUE_DTYPES = {"fp64": np.dtype(np.float64), "fp32": np.dtype(np.float32)}


def resolve_backend(requested):
    """Map ``auto`` / ``gpu`` / ``cpu`` to the backend this rank will use.

    ``auto`` picks ``gpu`` when PyCUDA imports and a device is visible, else ``cpu``; ``gpu``
    raises a helpful error when that is not the case.
    """
    from .gpu import gpu_available, require_pycuda
    if requested == "cpu":
        return "cpu"
    if requested == "gpu":
        cuda = require_pycuda()
        if cuda.Device.count() == 0:
            raise HisparseError("backend 'gpu' requested but no CUDA device is visible")
        return "gpu"
    return "gpu" if gpu_available() else "cpu"


class _Precision:
    """The value dtype and index width a config asks for (shared by both contexts)."""

    @property
    def value_dtype(self):
        return VALUE_DTYPES[self.config["precision"]]

    @property
    def index_width(self):
        return self.config["index_width"]


@dataclass
class RunContext(_Precision):
    """Everything an operation needs on one rank.

    Attributes
    ----------
    config : Config
    comm, local_comm : mpi4py communicators (world, node-local)
    transport : Transport (MPI host buffers, or NCCL device buffers) for planned collectives
    backend : {"cpu", "gpu"}
    device : GpuDevice or None
    value_dtype : numpy.dtype (float32 or float64)
    timer : PhaseTimer
    """

    config: object
    comm: object
    local_comm: object
    backend: str
    timer: object
    device: object = None
    compile_stats: dict = field(default_factory=dict)
    #: how planned collectives move bytes (hisparse.parallel.Transport); the driver makes it
    #: (a device transport for a multi-rank GPU run where available); default: MPI.
    transport: object = None

    def __post_init__(self):
        if self.transport is None:
            from .parallel import MpiTransport
            self.transport = MpiTransport(self.comm)

    @property
    def rank(self):
        return self.comm.rank

    @property
    def size(self):
        return self.comm.size

    @property
    def is_root(self):
        return self.comm.rank == 0

    def load_kernels(self, name, defines=None, extra_options=()):
        """Compile/load ``kernels_cu/<name>.cu`` for this rank's device (not collective: the
        node's ranks share the cache, one compiling an entry while the others wait for it)."""
        from .gpu import load_module
        return load_module(name, defines=defines, arch=self.config["gpu.arch"],
                           cache_dir=self.config["gpu.cache_dir"], extra_options=extra_options,
                           stats=self.compile_stats)

    def engine_context(self):
        """The view of this context an engine gets: no communicator."""
        return EngineContext(config=self.config, backend=self.backend, timer=self.timer,
                             device=self.device, rank=self.rank, load_kernels=self.load_kernels,
                             log=self.log, maybe_fail=self.maybe_fail)

    def log(self, message):
        """Progress line on stderr from rank 0."""
        if self.is_root:
            sys.stderr.write(f"hisparse: {message}\n")
            sys.stderr.flush()

    def progress(self, message, seconds):
        """:meth:`log` ``message`` for a step that took ``seconds`` (or for what ran since the
        last line), when that is longer than :data:`PROGRESS_SECONDS` and ``run.progress`` is
        on: a long run is never silent for long. Returns whether it said it."""
        said = bool(self.config["run.progress"]) and seconds > PROGRESS_SECONDS
        if said:
            self.log(message)
        return said

    def maybe_fail(self, phase, iteration=None):
        """Fault injection for tests: ``debug.fail_rank`` fails in ``debug.fail_phase`` (for
        ``iteration``, after iteration ``debug.fail_iteration``, 1-based)."""
        wanted = self.config["debug.fail_iteration"]
        if phase == "iteration" and wanted is not None and iteration != wanted:
            return
        if self.config["debug.fail_rank"] == self.rank and self.config["debug.fail_phase"] == phase:
            if self.config["debug.fail_mode"] == "kill":
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(5)
            if self.config["debug.fail_mode"] == "enospc":  # an expected I/O failure
                raise OSError(errno.ENOSPC, f"injected fault in phase '{phase}' "
                                            f"(debug.fail_rank): no space left on device")
            if self.config["debug.fail_mode"].startswith("sig"):  # a signal, as a job gets one
                os.kill(os.getpid(), getattr(signal, self.config["debug.fail_mode"].upper()))
                return
            raise RuntimeError(f"injected fault in phase '{phase}' (debug.fail_rank)")


@dataclass(frozen=True)
class EngineContext(_Precision):
    """What an engine may use of the run: config, backend, timer, device and kernel loading (the
    node-local compile barrier stays hidden in ``load_kernels``). It holds no communicator, so
    an engine cannot call MPI: collectives belong to the operation.

    ``rank`` is for messages and fault injection only.
    """

    config: object
    backend: str
    timer: object
    device: object
    rank: int
    load_kernels: object
    log: object
    maybe_fail: object
