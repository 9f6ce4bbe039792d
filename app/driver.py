"""The run driver: config -> input -> partition -> distribute -> compute -> gather -> verify ->
record. One call of :func:`run` is one run; it is collective over the communicator."""
import os
import time
import uuid

import numpy as np

from . import _metadata
from .config import load_config
from .context import RunContext, resolve_backend
from .errors import HisparseError, InputError, VerificationError
from .formats import CSRMatrix, index_dtype_for
from .ops import get_operation_class
from .parallel import StopRequest, all_call, get_world, node_local, root_call
from .timing import PhaseTimer


def read_problem(config, op_cls):
    """Read or generate the input on this rank and cast it to the configured precision.

    Returns
    -------
    CSRMatrix or COOTensor
    """
    from . import generators
    from .io import input_kind, read_matrix, read_tensor
    section = config["input"]
    want = op_cls.INPUT_KIND
    if section["generate"] is not None:
        spec = section["generate"]
        have = generators.spec_kind(spec)
        if have != want:
            raise InputError(f"{config.source}: input.generate kind '{spec['kind']}' makes a {have}"
                             f", but operation '{op_cls.NAME}' needs a {want}")
        problem = generators.generate(spec)  # valid by construction: no validation pass
    else:
        path, group = section["path"], section["group"]
        have = input_kind(path, group)
        if have != want:
            raise InputError(f"{path}: group '{group}' holds a {have}, but operation "
                             f"'{op_cls.NAME}' needs a {want}")
        reader = read_matrix if want == "matrix" else read_tensor
        problem = reader(path, group, section["duplicates"])
    value_dtype = np.float64 if config["precision"] == "fp64" else np.float32
    if isinstance(problem, CSRMatrix):
        index_dtype = index_dtype_for(max(problem.nnz, *problem.shape), config["index_width"])
        return problem.astype(value_dtype, index_dtype)
    return problem.astype(value_dtype)


def _results_path(config, nranks, run_id, started):
    meta = _metadata.scheduler_info()
    name = config["output.filename"].format(
        name=config["run.name"], op=config["operation.name"], nranks=nranks,
        utc=started.strftime("%Y%m%dT%H%M%SZ"), run_id=run_id, job_id=meta["job_id"] or "nojob")
    return os.path.join(config["output.dir"], name)


def _compute_seconds(op_cls, phases, wall, gpu):
    """Per (repeat, rank) compute time: the sum of COMPUTE_PHASES, GPU-event time where recorded."""
    columns = [phases.index(p) for p in op_cls.COMPUTE_PHASES]
    chosen = np.where(np.isnan(gpu[:, :, columns]), wall[:, :, columns], gpu[:, :, columns])
    return np.nansum(chosen, axis=2)


def _derived(op_cls, phases, wall, gpu, work, bandwidth):
    total = wall[:, :, phases.index("total")]
    compute = _compute_seconds(op_cls, phases, wall, gpu)
    critical = compute.max(axis=1)  # the slowest rank sets the pace of each repeat
    median_compute = float(np.median(critical))
    mean_over_ranks = compute.mean(axis=1)
    imbalance = float(np.median(critical / np.where(mean_over_ranks > 0, mean_over_ranks, 1.0)))
    out = {
        "median_total_seconds": float(np.median(total.max(axis=1))),
        "min_total_seconds": float(np.min(total.max(axis=1))),
        "median_compute_seconds": median_compute,
        "min_compute_seconds": float(np.min(critical)),
        "compute_phases": ",".join(op_cls.COMPUTE_PHASES),
        "load_imbalance": imbalance,
        "flops": float(work.get("flops", 0.0)), "bytes_moved": float(work.get("bytes", 0.0)),
    }
    if median_compute > 0:
        out["gflops"] = out["flops"] / median_compute / 1e9
        out["gbytes_per_second"] = out["bytes_moved"] / median_compute / 1e9
    out["roofline_bandwidth_gbs"] = bandwidth / 1e9 if bandwidth else 0.0
    if bandwidth and median_compute > 0 and out["bytes_moved"] > 0:
        out["roofline_fraction"] = out["bytes_moved"] / median_compute / bandwidth
    return out


def _measure_bandwidth(backend):
    from .gpu._bandwidth import device_copy_bandwidth, host_copy_bandwidth
    return device_copy_bandwidth() if backend == "gpu" else host_copy_bandwidth()


def _time_repeats(ctx, op, repeats, warmup):
    """Run the warm-up and the timed repeats; return how many timed repeats ran (fewer than
    ``repeats`` when the job script forwarded the walltime signal, SIGUSR1)."""
    timer = ctx.timer
    timer.enabled = False
    for _ in range(warmup):
        op.run_once()
    timer.enabled = True
    progress_every = 1.0
    last = time.perf_counter()
    with StopRequest() as stop:
        for index in range(repeats):
            timer.begin_repeat(index)
            start = time.perf_counter()
            op.run_once()
            if index == 0:
                ctx.maybe_fail("compute")
            timer.add("total", wall=time.perf_counter() - start)
            if ctx.config["run.progress"] and time.perf_counter() - last > progress_every:
                last = time.perf_counter()
                ctx.log(f"repeat {index + 1}/{repeats} ({time.perf_counter() - start:.3g} s)")
            # Collective, outside the timed region: every rank leaves after the same repeat.
            if stop.requested(ctx.comm) and index + 1 < repeats:
                ctx.log(f"walltime signal: stopping after {index + 1} of {repeats} repeats")
                return index + 1
    return repeats


def run(config_path, overrides=(), comm=None):
    """Execute one run described by a YAML config. *Collective.*

    Parameters
    ----------
    config_path : str
    overrides : list of str
        ``key.sub=value`` overrides.
    comm : mpi4py communicator, optional
        Default ``MPI.COMM_WORLD``.

    Returns
    -------
    str or None
        The results file path on rank 0, ``None`` on other ranks.

    Raises
    ------
    HisparseError
        Raised on every rank for errors the user can fix (bad config, bad input, bad layout).
    """
    comm = comm or get_world()
    started = _metadata.utc_now()
    config = comm.bcast(root_call(comm, load_config, config_path, list(overrides)), root=0) \
        if comm.size > 1 else load_config(config_path, list(overrides))
    local_comm = node_local(comm)
    op_cls = get_operation_class(config["operation.name"], config.source)
    backend = all_call(comm, resolve_backend, config["backend"])
    device = None
    if backend == "gpu":
        from .gpu import bind_device
        device = all_call(comm, bind_device, local_comm.rank)
    timer = PhaseTimer(op_cls.phases())
    ctx = RunContext(config=config, comm=comm, local_comm=local_comm, backend=backend,
                     timer=timer, device=device)
    try:
        return _run_pipeline(ctx, op_cls, started)
    finally:
        if device is not None:
            device.release()


def _run_pipeline(ctx, op_cls, started):
    config, comm = ctx.config, ctx.comm
    op = op_cls(ctx)
    with ctx.timer.phase("read"):
        problem = root_call(comm, read_problem, config, op_cls)
    ctx.maybe_fail("read")
    op.setup(problem)
    ctx.maybe_fail("partition")
    done = _time_repeats(ctx, op, config["run.repeats"], config["run.warmup"])
    ctx.maybe_fail("gather")

    record = None
    if ctx.is_root:
        record = _root_summary(ctx, op, op_cls, problem, done)
    bandwidth = _measure_bandwidth(ctx.backend) if ctx.is_root else None
    wall, gpu = ctx.timer.arrays(done)
    identity = dict(_metadata.rank_identity(), local_rank=ctx.local_comm.rank,
                    backend=ctx.backend, **(ctx.device.info() if ctx.device else {}),
                    compile_seconds=float(ctx.compile_stats.get("compile_seconds", 0.0)),
                    compile_cache_hit=int(bool(ctx.compile_stats.get("compile_cache_hit", True))),
                    **op.engine_stats(), **op.rank_info())
    gathered = comm.gather((wall, gpu, identity), root=0)
    op.teardown()
    path, passed, message = None, True, None
    if ctx.is_root:
        path = _write(ctx, op_cls, record, gathered, bandwidth, started)
        passed = record["verify_passed"]
        if not passed:
            message = (f"verification failed: max relative error {record['verify_error']:.3e} > "
                       f"rtol {record['verify_rtol']:.1e} (results kept in {path})")
    passed, message = comm.bcast((passed, message), root=0)
    if not passed:
        raise VerificationError(message)
    return path


def _root_summary(ctx, op, op_cls, problem, repeats):
    config = ctx.config
    result = op.result()
    record = {"verify_enabled": config["verify.enabled"], "verify_passed": True,
              "verify_error": float("nan")}
    rtol = config["verify.rtol"] or op_cls.DEFAULT_RTOL[config["precision"]]
    record["verify_rtol"] = rtol
    if config["verify.enabled"]:
        error = op.compare(result, op.reference(problem))
        record.update(verify_error=error, verify_passed=bool(error <= rtol))
    record["work"] = op.work(problem)
    peers = {}
    for name in config["peers"]:
        try:
            peers[name] = op.run_peer(name, problem, repeats)
        except HisparseError as exc:
            ctx.log(f"peer '{name}' skipped: {exc}")
            peers[name] = {"seconds": [np.nan], "skipped": str(exc)}
    record["peers"] = peers
    record["repeats"] = repeats
    record["result_arrays"] = op.result_arrays(result)
    record["summary"] = op.summary()
    record["problem"] = _problem_attrs(problem)
    record["strategy"] = op.strategy
    return record


def _problem_attrs(problem):
    if isinstance(problem, CSRMatrix):
        return {"problem_kind": "matrix", "global_rows": problem.nrows,
                "global_cols": problem.ncols, "global_nnz": problem.nnz,
                "index_dtype": str(problem.indices.dtype), "value_dtype": str(problem.data.dtype)}
    return {"problem_kind": "tensor", "tensor_shape": list(problem.shape),
            "global_nnz": problem.nnz, "value_dtype": str(problem.values.dtype)}


def _write(ctx, op_cls, record, gathered, bandwidth, started):
    from .io import write_results
    config = ctx.config
    phases = list(op_cls.phases())
    wall = np.stack([g[0] for g in gathered], axis=1)
    gpu = np.stack([g[1] for g in gathered], axis=1)
    identities = [g[2] for g in gathered]
    keys = []
    for ident in identities:
        keys += [k for k in ident if k not in keys]
    rank_vars = {k: [ident.get(k, "" if isinstance(identities[0].get(k, ""), str) else -1)
                     for ident in identities] for k in keys}
    derived = _derived(op_cls, phases, wall, gpu, record["work"], bandwidth)
    peers = {}
    for name, info in record["peers"].items():
        seconds = np.asarray(info["seconds"], dtype=float)
        peer_median = float(np.nanmedian(seconds)) if np.isfinite(seconds).any() else float("nan")
        speedup = peer_median / derived["median_compute_seconds"] \
            if derived["median_compute_seconds"] > 0 else float("nan")
        peers[name] = dict(info, median_seconds=peer_median, speedup=speedup)
        derived[f"speedup_vs_{name}"] = speedup
        derived[f"peer_{name}_median_seconds"] = peer_median
    run_id = uuid.uuid4().hex[:8]
    hosts = [ident["hostname"] for ident in identities]
    attrs = {"schema": "hisparse.results", "schema_version": "1.0", "run_id": run_id,
             "name": config["run.name"], "operation": config["operation.name"],
             "study": config["run.study"], "study_id": config["run.study_id"] or "",
             "input": config["input.path"] or f"generate:{config['input.generate']}",
             "backend": ctx.backend, "precision": config["precision"],
             "partition": record["strategy"],
             "nranks": ctx.size, "nnodes": len(set(hosts)), "hostnames": ",".join(sorted(set(hosts))),
             "gpu_names": ",".join(str(i.get("gpu_name", "")) for i in identities),
             "gpu_binding": ",".join(f"{i['hostname']}:{i.get('gpu_ordinal', -1)}"
                                     for i in identities),
             "created_utc": started.isoformat(), "finished_utc": _metadata.utc_now().isoformat(),
             "repeats": record["repeats"], "repeats_requested": config["run.repeats"],
             "stopped_early": record["repeats"] < config["run.repeats"],
             "warmup": config["run.warmup"],
             "timing_clocks": "perf_counter+cuda_event",
             "verify_enabled": record["verify_enabled"], "verify_passed": record["verify_passed"],
             "verify_max_rel_error": record["verify_error"], "verify_rtol": record["verify_rtol"]}
    if ctx.device is not None:
        attrs["cuda_driver_version"] = ctx.device.driver_version
        attrs["cuda_version"] = ".".join(str(v) for v in ctx.device.cuda_version)
        attrs["cuda_arch"] = config["gpu.arch"] or ctx.device.arch
    attrs.update(record["problem"])
    attrs.update(_metadata.run_metadata())
    attrs.update(derived)
    attrs.update(record["summary"])
    path = _results_path(config, ctx.size, run_id, started)
    return write_results(path, attrs, config.to_yaml(), _metadata.environment_subset(), phases,
                         wall, gpu, rank_vars, peers=peers, result=record["result_arrays"],
                         phase_kinds=op_cls.phase_kinds(), phase_scopes=op_cls.phase_scopes())
