"""Compile ``kernels_cu/*.cu`` with nvcc through PyCUDA, cached (per user, atomic writes).

PyCUDA's own cache writes cubins in place, so ranks sharing a cache directory can read a
half-written file. We keep our own cache instead: the key hashes the source, every header in
``kernels_cu/``, the options, the target architecture and which nvcc compiles (its path, size and
time); the cubin is written to a temporary name and renamed. The processes of a node that need
the same entry take turns on its lock file: the first compiles, the others then read the cache.
Loading is not a collective (a barrier once deadlocked two ranks of which only one needed a
kernel variant).
"""
import contextlib
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
    """Where compiled kernels are kept between runs: ``$HISPARSE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/hisparse/kernels`` (``~/.cache/hisparse/kernels``). A home cache outlives
    the job: a cluster's ``$TMPDIR`` is often a per-job directory emptied at its end, and every
    job then compiled its kernels again (1-3 s of its time to solution). Where the home cache
    cannot be made or written, ``$TMPDIR/hisparse-cache-<uid>``."""
    override = os.environ.get("HISPARSE_CACHE_DIR")
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = os.path.join(base, "hisparse", "kernels")
    try:
        os.makedirs(home, exist_ok=True)
        if os.access(home, os.W_OK | os.X_OK):
            return home
    except OSError:
        pass
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(tmp, f"hisparse-cache-{os.getuid()}")


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
    def read_cached():
        with open(cached, "rb") as handle:
            return handle.read(), True
    if os.path.exists(cached):
        return read_cached()
    with _entry_lock(cached):
        if os.path.exists(cached):  # another process compiled it while this one waited
            return read_cached()
        _announce(f"hisparse: compiling kernels_cu/{name}.cu for {arch} (first run only; cached "
                  f"in {cache_dir})...")
        cubin = _compile_cubin(source, options, arch, name)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(cubin)
        os.replace(tmp, cached)
    return cubin, False


@contextlib.contextmanager
def _entry_lock(cached):
    """Hold an exclusive lock on ``cached``'s lock file while the entry is compiled, so that of
    the processes of a node that need the same module one compiles and the others wait for it,
    then read the cache. A lock the file system refuses (some network file systems) is skipped:
    each process then compiles, and the atomic rename still leaves one whole entry."""
    import fcntl
    try:
        handle = open(cached + ".lock", "a")
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield  # closing the file releases the lock


def load_module(name, defines=None, arch=None, cache_dir=None, extra_options=(), stats=None):
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
        Cache directory; default :func:`default_cache_dir`.
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
    # Not a collective: ranks may need different variants (a rank without ghost entries loads
    # no ghost-block kernels); the cache entry's file lock keeps the node to one compile each.
    cubin, hit = _cubin(name, defines or {}, arch, cache_dir, extra_options)
    module = cuda.module_from_buffer(cubin)
    if stats is not None:
        stats["compile_seconds"] = stats.get("compile_seconds", 0.0) + time.perf_counter() - start
        stats["compile_cache_hit"] = stats.get("compile_cache_hit", True) and hit
    return module
