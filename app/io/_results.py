"""The results file: one HDF5 file per run, written by rank 0, atomically, never over an
existing file.

Layout (see docs/results_schema.md)::

    /                      root attributes: flat run metadata and derived metrics
    /meta/config_yaml      the resolved configuration (exact text)
    /meta/environment_json launcher/scheduler/CUDA environment variables
    /perf                  netCDF4-compatible group with dimensions (repeat, rank, phase)
        wall_seconds(repeat, rank, phase), gpu_seconds(repeat, rank, phase)
        per-rank variables (rank,): hostname, gpu_name, nnz, ...
    /peers                 one attribute-carrying dataset per peer: seconds (repeat,)
    /result                operation-specific output arrays (optional); with
                           ``output.collect: parts`` virtual datasets joining the ranks' part
                           files ``STEM.partRANK.h5`` (:func:`write_result_part`)

Its name is planned before the run reads its input (:func:`plan_results_file`): the template's
fields are known, the name is a plain file name inside ``output.dir``, the directory takes a new
file, and no file of that name exists.
"""
import json
import os

import h5py
import numpy as np

from ..config import RESULTS_NAME_FIELDS, file_name_problem
from ..errors import ConfigError, OutputError
from ._atomic import atomic_file, output_problem, probe_directory

_STR = h5py.string_dtype("utf-8")


def _attr_value(value):
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if isinstance(value, str):
        # Some MPI libraries pad their version string with NULs, which HDF5 strings reject.
        return value.replace("\x00", "").strip()
    return value


def _dimension(group, name, values, dtype=None):
    data = np.asarray(values, dtype=dtype) if dtype is not _STR else np.asarray(values, dtype=object)
    dset = group.create_dataset(name, data=data, dtype=dtype if dtype is not None else data.dtype)
    dset.make_scale(name)
    return dset


def plan_results_file(config, fields):
    """The results file's path for ``config``, checked before the run starts.

    Parameters
    ----------
    config : Config
        Gives ``output.dir``, ``output.filename`` (whose placeholders the config loader checked),
        ``operation.params`` and the source named in messages.
    fields : dict
        A value for each of :data:`~hisparse.config.RESULTS_NAME_FIELDS`.

    Raises
    ------
    ConfigError
        Naming ``output.filename`` (the name is not a plain file name: ``/``, ``..``, more than
        255 bytes), ``output.dir`` (cannot be created or written) or both (a file of that name
        exists, or it is a file the run reads).
    """
    source, directory = config.source, config["output.dir"]
    name = config["output.filename"].format(**{k: fields[k] for k in RESULTS_NAME_FIELDS})
    problem = file_name_problem(name)
    if problem:
        raise ConfigError(source, "output.filename", f"gives the file name {name!r}, which "
                                                     f"{problem}")
    problem = probe_directory(directory)
    if problem:
        raise ConfigError(source, "output.dir", problem)
    path = os.path.join(directory, name)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise ConfigError(source, "output.filename", f"{name!r} leads out of output.dir")
    if os.path.lexists(path):
        raise ConfigError(source, "output.filename", f"the results file {path} exists already; "
                                                     f"results files are never replaced (keep "
                                                     f"{{run_id}} in output.filename, or choose "
                                                     f"another output.dir or run.name)")
    for key, value in _file_settings(config):
        if os.path.realpath(value) == os.path.realpath(path):
            raise ConfigError(source, "output.filename", f"the results file {path} would be the "
                                                         f"file of {key}")
    if config["output.collect"] == "parts":
        for part in part_file_paths(path, fields["nranks"]):
            if os.path.lexists(part):
                raise ConfigError(source, "output.collect", f"parts: the result part file "
                                                            f"{part} exists already; files are "
                                                            f"never replaced")
    return path


def plan_written_file(config, key, path, replaces=None, results_path=None):
    """Check, before the run reads its input, a file the operation writes besides the results
    (``key`` names it, e.g. ``operation.params.checkpoint``), through the guard of every written
    file (:func:`~hisparse.io.output_problem`): not a file the run reads (other than itself),
    not the results file, its directory exists and takes a new file, and an existing file is
    replaced only when of the same kind (``replaces``: its ``schema`` attribute).

    Raises
    ------
    ConfigError
        Naming ``key`` and the path.
    """
    reads = [(k, v) for k, v in _file_settings(config) if k != key]
    if results_path:
        reads.append(("the results file", results_path))
    problem = output_problem(path, what=key.rpartition(".")[2] or "file", replaces=replaces,
                             reads=reads)
    if problem:
        raise ConfigError(config.source, key, problem)
    return path


#: Input files up to this size get a checksum in the results file (rank 0 reads the whole file
#: again after the run; docs/results_schema.md gives its time); larger ones are recorded by size
#: and modification time.
CHECKSUM_LIMIT = 2 << 30


def input_identity(path, limit=CHECKSUM_LIMIT):
    """What identifies the input file ``path`` in the results file's root attributes.

    Returns
    -------
    dict
        ``input_path_absolute``, ``input_size_bytes`` (-1 when unreadable),
        ``input_mtime_utc`` (ISO 8601), ``input_checksum`` (``"blake2b-128:<hex>"`` of the
        whole file, or "") and ``input_checksum_skipped`` (why there is none, or "").
    """
    import datetime
    import hashlib
    out = {"input_path_absolute": os.path.abspath(path), "input_size_bytes": -1,
           "input_mtime_utc": "", "input_checksum": "", "input_checksum_skipped": ""}
    try:
        stat = os.stat(path)
    except OSError as exc:
        out["input_checksum_skipped"] = f"cannot stat the file ({exc.strerror or exc})"
        return out
    out["input_size_bytes"] = int(stat.st_size)
    out["input_mtime_utc"] = datetime.datetime.fromtimestamp(
        stat.st_mtime, datetime.timezone.utc).isoformat()
    if stat.st_size > limit:
        out["input_checksum_skipped"] = (f"larger than {limit} bytes: identified by size and "
                                         f"modification time")
        return out
    digest = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    except OSError as exc:
        out["input_checksum_skipped"] = f"cannot read the file ({exc.strerror or exc})"
        return out
    out["input_checksum"] = f"blake2b-128:{digest.hexdigest()}"
    return out


def part_file_paths(path, nranks):
    """The result part files of ``output.collect: parts`` for the results file ``path``:
    ``STEM.partRANK.h5`` beside it, one per rank."""
    stem, _ = os.path.splitext(path)
    return [f"{stem}.part{rank}.h5" for rank in range(nranks)]


def write_result_part(path, arrays):
    """Write one rank's part of the result, ``{name: array}``, as ``/result/<name>`` of a new
    file ``path`` (through the atomic writer: never over an existing file).

    Returns
    -------
    dict of str -> (tuple, str)
        ``{name: (shape, dtype string)}``: what the results file's virtual datasets need.
    """
    with atomic_file(path, what="result part file") as out:
        group = out.h5().create_group("result")
        for name, array in arrays.items():
            group.create_dataset(name, data=np.asarray(array))
    if out.path != path:  # never expected: atomic_file without fallbacks publishes at path
        raise OutputError(f"{path}: the result part file was written as {out.path}")
    return {name: (np.shape(array), np.asarray(array).dtype.str)
            for name, array in arrays.items()}


def row_placement(rows):
    """How a part's rows sit in the whole array: ``None`` (in rank order), ``(start, step)``
    (an arithmetic run, as contiguous blocks and row-modulo give) or the rows themselves."""
    if rows is None:
        return None
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) < 2:
        return (int(rows[0]), 1) if len(rows) else (0, 1)
    steps = np.diff(rows)
    if steps[0] > 0 and np.all(steps == steps[0]):
        return int(rows[0]), int(steps[0])
    return rows


def _virtual_result(handle, name, part_names, parts):
    """``/result/<name>``: a virtual dataset joining ``parts`` (per rank: shape, dtype and row
    placement) from the files ``part_names``. In global row order when every part is an
    arithmetic run of rows and together they cover every row once; else the parts in rank
    order, with ``/result/<name>_rows`` (the global row of each row) when their rows are known."""
    counts = [int(shape[0]) if len(shape) else 1 for shape, _, _ in parts]
    first_shape, dtype = parts[0][0], np.dtype(parts[0][1])
    total = int(sum(counts))
    layout = h5py.VirtualLayout(shape=(total,) + tuple(first_shape[1:]), dtype=dtype)
    placements = [placement for _, _, placement in parts]
    in_order = all(isinstance(p, tuple) for p in placements)
    if in_order:
        covered = np.zeros(total, dtype=np.int64)
        for (start, step), count in zip(placements, counts):
            stop = start + step * count
            if count and (start < 0 or stop - step >= total):
                in_order = False
                break
            covered[start:stop:step] += 1
        in_order = in_order and bool(np.all(covered == 1))
    offset = 0
    for file_name, (shape, _, placement), count in zip(part_names, parts, counts):
        if count:
            source = h5py.VirtualSource(file_name, f"result/{name}", shape=tuple(shape),
                                        dtype=dtype)
            if in_order:
                start, step = placement
                layout[start:start + step * count:step] = source
            else:
                layout[offset:offset + count] = source
        offset += count
    fill = np.nan if dtype.kind in "fc" else 0
    handle.create_virtual_dataset(name, layout, fillvalue=fill)
    if not in_order and all(p is not None for p in placements):
        rows = [np.arange(p[0], p[0] + p[1] * c, p[1]) if isinstance(p, tuple) else p
                for p, c in zip(placements, counts)]
        handle.create_dataset(f"{name}_rows", data=np.concatenate(rows).astype(np.int64))


def _file_settings(config):
    """``(key, path)`` of the input file and of every HDF5 file named in operation.params."""
    if config["input.path"]:
        yield "input.path", config["input.path"]
    for key, value in (config["operation.params"] or {}).items():
        if isinstance(value, str):
            path = value.partition(":")[0]
            if path.endswith((".h5", ".hdf5")):
                yield f"operation.params.{key}", path


def _fallback_names(path, run_id):
    """Names tried, in order, when ``path`` is taken at the end of a run: the run id added
    before the extension, then a counter."""
    stem, ext = os.path.splitext(path)
    yield f"{stem}__{run_id}{ext}"
    for count in range(2, 100):
        yield f"{stem}__{run_id}-{count}{ext}"


def write_results(path, attrs, config_yaml, environment, phases, wall, gpu, rank_vars,
                  peers=None, result=None, phase_kinds=None, phase_scopes=None, run_id=None,
                  result_parts=None, compression="none"):
    """Write a results file to ``path`` through a temporary name and an atomic rename that never
    replaces an existing file.

    Parameters
    ----------
    path : str
        Final file name.
    attrs : dict
        Root attributes (scalars and strings; dicts and lists are stored as JSON).
    config_yaml : str
        Resolved configuration text.
    environment : dict
        Selected environment variables.
    phases : list of str
        Phase names, the third dimension of the timing arrays.
    wall, gpu : ndarray, shape (repeats, nranks, len(phases)), float64
        Host wall-clock and CUDA-event seconds; NaN where a phase did not run.
    rank_vars : dict of str -> sequence of length nranks
        Per-rank variables (strings or numbers).
    peers : dict of str -> dict, optional
        ``{name: {"seconds": array (repeats,), **attributes}}``.
    result : dict of str -> ndarray, optional
        Operation output stored under ``/result``.
    phase_kinds, phase_scopes : dict of str -> str, optional
        Each phase's kind (compute, transfer, communication, setup, collect, io, total) and
        scope (setup: recorded once; repeat), stored as ``/perf/phase_kind`` and
        ``/perf/phase_scope`` along the phase dimension.
    run_id : str, optional
        When ``path`` was created by someone else during the run, the file is written as
        ``STEM__RUNID.h5`` instead (without ``run_id``: :class:`OutputError`).
    result_parts : tuple, optional
        ``(part_names, parts)`` of ``output.collect: parts``: the part files' names relative
        to the results file's directory, and per rank ``{name: (shape, dtype, placement)}``
        (:func:`write_result_part`, :func:`row_placement`); each name becomes a virtual
        dataset under ``/result`` joining the parts.
    compression : str
        The HDF5 filter of the ``/result`` arrays (``output.compression``: none, gzip, lzf;
        :data:`RESULT_FILTERS`).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    OutputError
        The file cannot be written, or its name is taken (and no ``run_id`` was given).
    Interrupted
        SIGINT/SIGTERM arrived while writing: the temporary file is gone, nothing was written.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fallbacks = list(_fallback_names(path, run_id)) if run_id else []
    with atomic_file(path, fallbacks=fallbacks, what="results file") as out:
        handle = out.h5()
        _write_content(handle, attrs, config_yaml, environment, phases, wall, gpu,
                       rank_vars, peers, result, phase_kinds, phase_scopes,
                       RESULT_FILTERS[compression])
        if result_parts is not None:
            part_names, parts = result_parts
            group = handle.require_group("result")
            for name in parts[0]:
                _virtual_result(group, name, part_names, [part[name] for part in parts])
    return out.path


#: ``output.compression`` -> the h5py filter arguments of the ``/result`` datasets.
RESULT_FILTERS = {"none": {}, "gzip": dict(compression="gzip", compression_opts=4, shuffle=True),
                  "lzf": dict(compression="lzf", shuffle=True)}


def _write_content(handle, attrs, config_yaml, environment, phases, wall, gpu, rank_vars, peers,
                   result, phase_kinds, phase_scopes, filters):
    for key, value in attrs.items():
        handle.attrs[key] = _attr_value(value)
    meta = handle.create_group("meta")
    meta.create_dataset("config_yaml", data=config_yaml, dtype=_STR)
    meta.create_dataset("environment_json", data=json.dumps(environment, sort_keys=True),
                        dtype=_STR)
    _write_perf(handle.create_group("perf"), phases, wall, gpu, rank_vars, phase_kinds,
                phase_scopes)
    peer_group = handle.create_group("peers")
    for name, info in (peers or {}).items():
        dset = peer_group.create_dataset(name, data=np.asarray(info["seconds"], float))
        for key, value in info.items():
            if key != "seconds":
                dset.attrs[key] = _attr_value(value)
    if result:
        out = handle.create_group("result")
        for name, array in result.items():
            array = np.asarray(array)
            # h5py refuses filters on scalar datasets
            out.create_dataset(name, data=array, **(filters if array.ndim else {}))


def _write_perf(perf, phases, wall, gpu, rank_vars, phase_kinds=None, phase_scopes=None):
    repeats, nranks, _ = wall.shape
    repeat_dim = _dimension(perf, "repeat", np.arange(repeats, dtype=np.int32))
    rank_dim = _dimension(perf, "rank", np.arange(nranks, dtype=np.int32))
    phase_dim = _dimension(perf, "phase", list(phases), dtype=_STR)
    for name, mapping in (("phase_kind", phase_kinds), ("phase_scope", phase_scopes)):
        if mapping:
            dset = perf.create_dataset(name, data=np.asarray([mapping.get(p, "") for p in phases],
                                                             dtype=object), dtype=_STR)
            dset.dims[0].attach_scale(phase_dim)
    for name, array, clock in (("wall_seconds", wall, "time.perf_counter"),
                               ("gpu_seconds", gpu, "cuda_event")):
        dset = perf.create_dataset(name, data=np.asarray(array, dtype=np.float64))
        dset.attrs["units"] = "s"
        dset.attrs["clock"] = clock
        for axis, dim in enumerate((repeat_dim, rank_dim, phase_dim)):
            dset.dims[axis].attach_scale(dim)
    for name, values in rank_vars.items():
        values = list(values)
        if values and isinstance(values[0], str):
            dset = perf.create_dataset(name, data=np.asarray(values, dtype=object), dtype=_STR)
        else:
            dset = perf.create_dataset(name, data=np.asarray(values))
        dset.dims[0].attach_scale(rank_dim)


def missing_result_parts(path):
    """The part files (``output.collect: parts``) that the results file ``path`` joins under
    ``/result`` and that are not where HDF5 looks for them (beside the results file, for the
    relative names hisparse writes). HDF5 reads a virtual dataset's rows from a missing source
    as its fill value (NaN, or 0 for integers) without an error, so the readers check."""
    with h5py.File(path, "r") as handle:
        return _missing_parts(handle, path)


def _missing_parts(handle, path):
    """:func:`missing_result_parts` of the open results file ``handle`` (at ``path``)."""
    missing = []
    result = handle.get("result")
    if not isinstance(result, h5py.Group):
        return missing
    for dset in result.values():
        if not isinstance(dset, h5py.Dataset) or not dset.is_virtual:
            continue
        for source in dset.virtual_sources():
            name = source.file_name
            where = name if os.path.isabs(name) else \
                os.path.join(os.path.dirname(os.path.abspath(path)), name)
            if name != "." and not os.path.exists(where) and where not in missing:
                missing.append(where)
    return missing


def read_results(path):
    """Load a results file into plain Python objects.

    Returns
    -------
    dict
        ``attrs`` (dict), ``phases`` (list of str), ``wall`` and ``gpu`` (ndarray, shape
        (repeats, nranks, phases)), ``rank_vars`` (dict), ``peers`` (dict name -> dict with
        ``seconds`` and attributes), ``config_yaml`` (str), ``phase_kinds`` and
        ``phase_scopes`` (dict phase -> str; empty for files written before they were recorded),
        ``missing_parts`` (list of str: :func:`missing_result_parts`).
    """
    def text(value):
        return value.decode() if isinstance(value, bytes) else value

    with h5py.File(path, "r") as handle:
        attrs = {k: (text(v) if isinstance(v, (bytes, str)) else
                     (v.item() if hasattr(v, "item") and np.ndim(v) == 0 else v))
                 for k, v in handle.attrs.items()}
        perf = handle["perf"]
        phases = [text(p) for p in perf["phase"][()]]
        rank_vars = {}
        for name, dset in perf.items():
            if name in ("repeat", "rank", "phase", "wall_seconds", "gpu_seconds", "phase_kind",
                        "phase_scope"):
                continue
            values = dset[()]
            rank_vars[name] = [text(v) for v in values] if values.dtype.kind in "OS" else values
        peers = {}
        for name, dset in handle.get("peers", {}).items():
            info = {k: text(v) if isinstance(v, (bytes, str)) else v for k, v in dset.attrs.items()}
            info["seconds"] = dset[()]
            peers[name] = info
        declared = {}
        for name in ("phase_kind", "phase_scope"):
            values = [text(v) for v in perf[name][()]] if name in perf else []
            declared[name] = dict(zip(phases, values))
        return {"path": path, "attrs": attrs, "phases": phases,
                "phase_kinds": declared["phase_kind"], "phase_scopes": declared["phase_scope"],
                "wall": perf["wall_seconds"][()], "gpu": perf["gpu_seconds"][()],
                "rank_vars": rank_vars, "peers": peers,
                "config_yaml": text(handle["meta/config_yaml"][()]),
                "missing_parts": _missing_parts(handle, path)}
