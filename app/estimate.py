"""A run's memory, estimated before anything is allocated, and ``hisparse run --dry-run``.

The estimate comes from the config and the input's *header*: an HDF5 group's ``shape``
attribute and the lengths of its datasets (no array is read), or a generator's parameters. Each
operation turns it into bytes per rank (:meth:`hisparse.ops.Operation.estimate_memory`), by the
config key that makes them, as a lower bound: what the run holds at least (its part of the
input, the vectors, factors or right-hand sides its parameters size), not the working space of
its kernels. A run whose bound exceeds what the node (or the job's cgroup) has available, or
what its GPU has free, stops before it reads its input, in one line naming the key that asks
for most of it.
"""
import math
import os
from dataclasses import dataclass

from .errors import ResourceError

#: Bytes of one index in a COO tensor (hisparse keeps tensor coordinates as int64).
TENSOR_INDEX_BYTES = 8


@dataclass(frozen=True)
class InputHeader:
    """What a run's input is, known without reading it.

    ``key`` is the config key it comes from (``input.path`` or ``input.generate``) and
    ``label`` how messages name it; ``index_bytes`` and ``value_bytes`` are the sizes the run
    stores it in (``index_width``, ``precision``); ``exact`` is False for a generator whose
    nonzero count is a bound (R-MAT's duplicate edges are merged).
    """

    kind: str
    shape: tuple
    nnz: int
    index_bytes: int
    value_bytes: int
    key: str
    label: str
    exact: bool = True

    @property
    def nrows(self):
        return self.shape[0]

    def part_rows(self, nranks):
        """Rows of the largest rank's part (rows split evenly: a lower bound of the busiest)."""
        return -(-self.shape[0] // nranks)

    def part_nnz(self, nranks):
        """Nonzeros of the largest rank's part (nonzeros split evenly)."""
        return -(-self.nnz // nranks)

    def csr_bytes(self, rows, nnz):
        """Bytes of a CSR block of ``rows`` rows and ``nnz`` entries in the run's sizes."""
        return (rows + 1) * self.index_bytes + nnz * (self.index_bytes + self.value_bytes)

    def coo_bytes(self, nnz):
        """Bytes of ``nnz`` tensor nonzeros (coordinates and values)."""
        return nnz * (len(self.shape) * TENSOR_INDEX_BYTES + self.value_bytes)

    def part_bytes(self, nranks):
        """Bytes of one rank's share of the input."""
        if self.kind == "matrix":
            return self.csr_bytes(self.part_rows(nranks), self.part_nnz(nranks))
        return self.coo_bytes(self.part_nnz(nranks))


def _stencil_nnz(dims, stencil):
    """Exact entries of a Poisson stencil matrix: every offset's in-grid positions."""
    if stencil in (9, 27):  # the full 3**d neighbourhood
        return math.prod(3 * n - 2 for n in dims)
    total = math.prod(dims)
    return total + sum(2 * (total // n) * (n - 1) for n in dims)  # the 2d axis neighbours


def _generated(spec):
    """``(kind, shape, nnz, exact)`` of a validated generator spec, from its parameters."""
    kind = spec["kind"]
    if kind == "poisson":
        dims = spec["dims"]
        stencil = spec["stencil"] or (5 if len(dims) == 2 else 7)
        n = math.prod(dims)
        return "matrix", (n, n), _stencil_nnz(dims, stencil), True
    if kind == "trefethen":
        n = spec["n"]
        steps = [1 << k for k in range(max(n - 1, 1).bit_length()) if (1 << k) < n]
        return "matrix", (n, n), n + 2 * sum(n - s for s in steps), True
    if kind == "random_matrix":
        rows, cols, k = spec["rows"], spec["cols"] or spec["rows"], spec["nnz_per_row"]
        # Repeated columns of a row are merged: a row of k draws keeps c (1 - (1 - 1/c)^k) on
        # average; 90% of that (half with skewed row lengths, whose long rows repeat more).
        distinct = cols * -math.expm1(k * math.log1p(-1 / cols)) if cols > 1 else 1
        share = 0.5 if spec["power_law"] > 0 else 0.9
        return "matrix", (rows, cols), int(rows * min(distinct, k) * share), False
    if kind == "rmat":
        n = 1 << spec["scale"]
        edges = n * spec["edge_factor"] * (2 if spec["symmetric"] else 1)
        # Merged duplicates leave about 60-90% of the drawn edges: half is a lower bound.
        return "matrix", (n, n), edges // 2, False
    if kind == "random_tensor":
        return "tensor", tuple(spec["dims"]), spec["nnz"], False
    return None


def _file_header(path, group):
    """``(kind, shape, nnz)`` from an HDF5 group's attributes and dataset lengths, or None when
    the file does not say (the read reports a broken file with its own message)."""
    import h5py
    import numpy as np
    with h5py.File(path, "r") as handle:
        grp = handle[group]
        raw = np.atleast_1d(grp.attrs["shape"])
        if raw.ndim != 1 or not np.issubdtype(raw.dtype, np.integer) or \
                (len(raw) and (raw.min() < 0 or raw.max() > 2 ** 62)):
            return None  # a shape the reader refuses, with its own message
        shape = tuple(int(s) for s in raw)
        if "indptr" in grp:
            return "matrix", shape, int(grp["indices"].shape[0])
        if "values" in grp:
            return "tensor", shape, int(grp["values"].shape[0])
    return None


def input_header(config):
    """The :class:`InputHeader` of ``config``'s input, or None when it cannot be known without
    reading (a missing or malformed file: the run's read phase says what is wrong)."""
    from .context import VALUE_DTYPES
    import numpy as np
    from .formats import index_dtype_for
    section = config["input"]
    exact = True
    try:
        if section["generate"] is not None:
            found = _generated(section["generate"])
            if found is None:
                return None
            kind, shape, nnz, exact = found
            key, label = "input.generate", f"input.generate {{kind: {section['generate']['kind']}}}"
        else:
            found = _file_header(section["path"], section["group"])  # expanded by the config
            if found is None:
                return None
            kind, shape, nnz = found
            key, label = "input.path", section["path"]
    except Exception:  # the read phase reports an unreadable input with its own context
        return None
    if not shape or min(shape) < 0 or nnz < 0:
        return None
    value_bytes = np.dtype(VALUE_DTYPES[config["precision"]]).itemsize
    if kind == "matrix":
        try:
            index_bytes = np.dtype(index_dtype_for(max(nnz, *shape), config["index_width"])).itemsize
        except Exception:  # a forced int32 that overflows: the read says so
            index_bytes = 8
    else:
        index_bytes = TENSOR_INDEX_BYTES
    return InputHeader(kind, shape, nnz, index_bytes, value_bytes, key, label, exact)


# -- what the machine has -------------------------------------------------------------------------

def host_memory_available():
    """Bytes this process may still allocate on the host: the kernel's MemAvailable, lowered to
    the job's cgroup limit (Slurm, containers) where one is set; None when unknown."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _cgroup_room():
    """The cgroup (v2) memory limit less what the group uses, or None without a limit."""
    try:
        with open("/proc/self/cgroup") as handle:
            line = next((l for l in handle if l.startswith("0::")), None)
        if line is None:
            return None
        base = os.path.join("/sys/fs/cgroup", line.strip()[3:].lstrip("/"))
        with open(os.path.join(base, "memory.max")) as handle:
            text = handle.read().strip()
        if text == "max":
            return None
        with open(os.path.join(base, "memory.current")) as handle:
            used = int(handle.read().strip())
        return max(int(text) - used, 0)
    except (OSError, ValueError):
        return None


def gigabytes(nbytes):
    """``nbytes`` as the messages write it (decimal TB, GB, MB or kB)."""
    if nbytes >= 1e13:
        return f"{nbytes / 1e12:.3g} TB"
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.1f} GB"
    if nbytes >= 1e6:
        return f"{nbytes / 1e6:.1f} MB"
    return f"{nbytes / 1e3:.1f} kB"


# -- the check ------------------------------------------------------------------------------------

def estimate(config, op_cls, nranks):
    """``(header, MemoryEstimate)`` of a run, or ``(None, None)`` when the input's header is not
    known without reading it."""
    from .errors import HisparseError
    header = input_header(config)
    if header is None:
        return None, None
    try:
        return header, op_cls.estimate_memory(config, header, nranks)
    except HisparseError:
        raise
    except Exception:  # an estimate that cannot be made must not stop a run it only advises
        return None, None


def _blame(config, terms, header):
    """The config key (with its value) that asks for the most of ``terms``, and what to do."""
    key = max(terms, key=terms.get)
    if key == "result" or key == header.key:
        return (f"the input {header.label} ({header.shape} with {header.nnz:,} nonzeros)",
                "run it on more ranks, with fewer ranks per node")
    value = config.get(key, None)
    return (f"{key}={value}" if value is not None else key), "lower it"


def check_fits(config, op_cls, nranks, backend="cpu", device=None, ranks_on_node=1):
    """Raise :class:`~hisparse.errors.ResourceError` when the run's estimate exceeds what this
    node (host, shared by ``ranks_on_node`` ranks, rank 0's own arrays counted once) or this
    rank's GPU (``device``) has free.
    Called on every rank before the input is read; returns the estimate (or None)."""
    header, need = estimate(config, op_cls, nranks)
    if need is None:
        return None
    host = sum(need.host.values())
    node = need.node_host_bytes(ranks_on_node)
    available = host_memory_available()
    if available is not None and node > available:
        share = (f" ({ranks_on_node} ranks on this node: {gigabytes(node)})"
                 if node > host else "")
        culprit, remedy = _blame(config, need.host, header)
        raise ResourceError(f"{config.source}: {culprit} needs at least {gigabytes(host)} of "
                            f"host memory per rank{share}, this node has {gigabytes(available)} "
                            f"available; {remedy} (hisparse run --dry-run shows the estimate)")
    if backend == "gpu" and device is not None:
        on_device = sum(need.device.values())
        try:
            free = int(device.free_memory())
        except Exception:  # a device that cannot say: its allocations will
            free = None
        if free is not None and on_device > free:
            culprit, remedy = _blame(config, need.device, header)
            raise ResourceError(f"{config.source}: {culprit} needs at least "
                                f"{gigabytes(on_device)} of GPU memory per rank, this GPU has "
                                f"{gigabytes(free)} free; {remedy} (hisparse run --dry-run "
                                f"shows the estimate)")
    return need


# -- hisparse run --dry-run -----------------------------------------------------------------------

def dry_run_text(config, nranks):
    """What ``hisparse run CONFIG --dry-run`` prints: the resolved config, the plan and the
    memory estimate per rank, against this machine."""
    from .context import resolve_backend
    from .ops import get_operation_class
    op_cls = get_operation_class(config["operation.name"], config.source)
    strategy = config["partition.strategy"]
    if strategy == "auto" and op_cls.PARTITIONS:
        strategy = f"{op_cls.auto_strategy(nranks)} (auto)"
    try:
        backend = resolve_backend(config["backend"])
    except Exception as exc:  # e.g. backend: gpu without a device: said, not fatal here
        backend = f"{config['backend']} (not available here: {exc})"
    lines = ["# hisparse run --dry-run: the resolved config", config.to_yaml().rstrip(), "",
             "# plan",
             f"operation: {config['operation.name']}",
             f"ranks: {nranks}",
             f"partition: {strategy}",
             f"backend: {backend}",
             f"precision: {config['precision']}"]
    header, need = estimate(config, op_cls, nranks)
    if need is None:
        where = (f"{config['input.path']} (from {os.getcwd()})" if config["input.path"]
                 else "its header")
        lines.append(f"input: {where} cannot be read (the run's read phase will say why); "
                     f"no memory estimate")
        return "\n".join(lines) + "\n"
    kind = "nonzeros" if header.exact else "nonzeros (estimated)"
    lines += [f"input: {header.label}: {header.kind} {header.shape}, {header.nnz:,} {kind}, "
              f"index {header.index_bytes * 8}-bit, values {header.value_bytes * 8}-bit",
              "", "# memory per rank (a lower bound: arrays the run holds, not kernel "
                  "work space)"]
    for where, terms in (("host", need.host), ("device", need.device)):
        if where == "device" and not str(backend).startswith("gpu"):
            continue
        total = sum(terms.values())
        parts = ", ".join(f"{key} {gigabytes(n)}" for key, n in terms.items() if n)
        lines.append(f"{where}: {gigabytes(total)} ({parts})")
    available = host_memory_available()
    if available is not None:
        host = sum(need.host.values())
        if host > available:
            verdict = "one rank DOES NOT FIT: the run would stop before reading its input"
        else:
            verdict = f"{available // max(host, 1):,} ranks of this size fit"
        lines.append(f"this node: {gigabytes(available)} of host memory available; {verdict}")
    if str(backend).startswith("gpu"):
        total = _device_memory()
        if total is not None:
            on_device = sum(need.device.values())
            verdict = "fits" if on_device <= total else "DOES NOT FIT"
            lines.append(f"this GPU: {gigabytes(total)} of device memory; one rank {verdict}")
    lines += [f"note: {text}" for text in need.notes]
    return "\n".join(lines) + "\n"


def _device_memory():
    """Device 0's memory in bytes (the dry run makes no context), or None without a GPU."""
    try:
        import pycuda.driver as cuda
        cuda.init()
        return int(cuda.Device(0).total_memory())
    except Exception:  # no PyCUDA or no device: nothing to compare with
        return None
