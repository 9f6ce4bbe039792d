"""Compile ``kernels_cu/*.cu`` with nvcc through PyCUDA, cached per node with atomic writes.

PyCUDA's own cache writes cubins in place, so ranks sharing a cache directory can read a
half-written file. We keep our own cache instead: the key hashes the source, every header in
``kernels_cu/``, the options, the target architecture and which nvcc compiles (its path, size and
time); the cubin is written to a temporary name and renamed. Node-local rank 0 compiles first and
the other local ranks wait at a barrier, then load from the cache.
"""
import hashlib
import os
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from ..errors import HisparseError

DEFAULT_OPTIONS = ("-O3", "-std=c++17", "--use_fast_math")


def kernel_source_dir():
    """Directory holding the ``.cu`` files (``$HISPARSE_KERNELS_DIR`` overrides)."""
    override = os.environ.get("HISPARSE_KERNELS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "kernels_cu"


def default_cache_dir():
    base = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(base, f"hisparse-cache-{os.getuid()}")


@lru_cache(maxsize=None)
def nvcc_identity(nvcc="nvcc"):
    """Which nvcc compiles: its resolved path, size and modification time ('' when it is
    missing). A stat, where ``nvcc --version`` was a 40 ms subprocess in every process's set-up
    (H100 host); an upgraded or switched toolkit is another file or another path."""
    found = shutil.which(nvcc)
    if found is None:
        return ""
    real = os.path.realpath(found)
    try:
        stat = os.stat(real)
    except OSError:
        return ""
    return f"{real}:{stat.st_size}:{stat.st_mtime_ns}"


def _cache_key(source, options, arch):
    digest = hashlib.sha256()
    digest.update(source.encode())
    for header in sorted(kernel_source_dir().glob("*.cuh")):
        digest.update(header.name.encode())
        digest.update(header.read_bytes())
    digest.update("\0".join(options).encode())
    digest.update(arch.encode())
    digest.update(nvcc_identity().encode())
    return digest.hexdigest()[:32]


def _compile_cubin(source, options, arch, name):
    from pycuda.compiler import compile as nvcc_compile
    try:
        return nvcc_compile(source, options=list(options), arch=arch, no_extern_c=True,
                            include_dirs=[str(kernel_source_dir())], cache_dir=False)
    except Exception as exc:  # pycuda.driver.CompileError carries nvcc's stderr
        stderr = getattr(exc, "stderr", "") or ""
        raise HisparseError(f"nvcc failed on kernels_cu/{name}.cu: {exc}\n{stderr}") from None


def _announce(line):
    """Say on stderr, from the world's rank 0 only, that compiling starts: nvcc takes seconds
    per module, which a first run on a fresh install would otherwise spend in silence."""
    import sys
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and \
            mpi.COMM_WORLD.rank != 0:
        return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _cubin(name, defines, arch, cache_dir, extra_options):
    path = kernel_source_dir() / f"{name}.cu"
    if not path.exists():
        raise HisparseError(f"kernel source {path} not found")
    source = path.read_text()
    options = list(DEFAULT_OPTIONS) + [f"-D{k}={v}" for k, v in sorted(defines.items())] + \
        list(extra_options)
    key = _cache_key(source, options, arch)
    os.makedirs(cache_dir, exist_ok=True)
    cached = os.path.join(cache_dir, f"{name}-{key}.cubin")
    if os.path.exists(cached):
        with open(cached, "rb") as handle:
            return handle.read(), True
    _announce(f"hisparse: compiling kernels_cu/{name}.cu for {arch} (first run only; cached in "
              f"{cache_dir})...")
    cubin = _compile_cubin(source, options, arch, name)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(cubin)
    os.replace(tmp, cached)
    return cubin, False


def load_module(name, defines=None, arch=None, cache_dir=None, local_comm=None,
                extra_options=(), stats=None):
    """Compile (or load from cache) ``kernels_cu/<name>.cu`` and load it into the current context.

    Parameters
    ----------
    name : str
        Kernel family, the file's stem.
    defines : dict, optional
        Preprocessor macros (``-DKEY=VALUE``), e.g. ``{"VALUE_T": "double"}``.
    arch : str, optional
        ``sm_XY``; default the current device's.
    cache_dir : str, optional
        Node-local cache directory; default ``$TMPDIR/hisparse-cache-<uid>``.
    local_comm : mpi4py communicator, optional
        Node-local communicator: its rank 0 compiles first, the others then hit the cache. Every
        rank of it must call ``load_module`` with the same arguments.
    stats : dict, optional
        Receives ``compile_seconds`` (added) and ``compile_cache_hit`` (and-ed).

    Returns
    -------
    pycuda.driver.Module
    """
    import pycuda.driver as cuda
    if arch is None:
        major, minor = cuda.Context.get_device().compute_capability()
        arch = f"sm_{major}{minor}"
    cache_dir = cache_dir or default_cache_dir()
    start = time.perf_counter()
    if local_comm is not None and local_comm.size > 1:
        if local_comm.rank == 0:
            cubin, hit = _cubin(name, defines or {}, arch, cache_dir, extra_options)
        local_comm.Barrier()
        if local_comm.rank != 0:
            cubin, hit = _cubin(name, defines or {}, arch, cache_dir, extra_options)
    else:
        cubin, hit = _cubin(name, defines or {}, arch, cache_dir, extra_options)
    module = cuda.module_from_buffer(cubin)
    if stats is not None:
        stats["compile_seconds"] = stats.get("compile_seconds", 0.0) + time.perf_counter() - start
        stats["compile_cache_hit"] = stats.get("compile_cache_hit", True) and hit
    return module
