"""The run driver: config -> output plan -> input -> partition -> distribute -> compute ->
gather -> verify -> record. One call of :func:`run` is one run; it is collective over the
communicator.

Everything about the output is checked on every rank before the input is read, so a run that
could not save its results never starts. Signals are honoured at the phase boundaries (read,
setup, each warm-up and timed repeat, verify and peers, write; see
:class:`~hisparse.parallel.StopRequest`): SIGINT/SIGTERM end the run on every rank at the same
boundary with no results file; SIGUSR1 (the walltime warning) skips what is left and writes the
results of the repeats done.
"""
import os
import time
import uuid
from dataclasses import dataclass

import numpy as np

from . import _metadata, threads
from .compiled import host_compile_seconds
from .config import load_config
from .context import RunContext, resolve_backend
from .estimate import check_fits
from .errors import ConfigError, HisparseError, VerificationError, same_on_every_rank, subject
from .layout import input_label
from .ops import get_operation_class
from .parallel import (STOP_SIGNALS, StopRequest, all_call, barrier_asleep, get_world,
                       node_local, open_transport, root_call, transport_modules)
from .timing import PhaseTimer, StepClock, event_else_wall, process_age_seconds


# -- the output, planned before any input is read -------------------------------------------------

def _plan_output(config, nranks, run_id, started):
    """The results file's path, checked on this rank (see :func:`hisparse.io.plan_results_file`)."""
    from .io import plan_results_file
    fields = dict(name=config["run.name"], op=config["operation.name"], nranks=nranks,
                  utc=started.strftime("%Y%m%dT%H%M%SZ"), run_id=run_id,
                  job_id=_metadata.scheduler_info()["job_id"] or "nojob")
    return plan_results_file(config, fields)


def _plan_written_files(config, op_cls, results_path):
    """Rank 0, which writes them: the files the operation writes besides the results (a CP-ALS
    checkpoint), checked before the input is read (:func:`hisparse.io.plan_written_file`)."""
    from .io import plan_written_file
    for key, path, schema in op_cls.files_written(config["operation.params"]):
        plan_written_file(config, key, path, schema, results_path)


def _load(comm, config_path, overrides, started):
    """The validated config, this run's id and its start time, the same on every rank. The start
    is rank 0's clock: the results file's name holds it (``{utc}``), and a rank whose clock read
    the next second named another file, so rank 0's ``/result`` joined part files that were
    never written (HDF5 reads them as NaN)."""
    if comm.size == 1:
        return load_config(config_path, list(overrides)), uuid.uuid4().hex[:8], started
    if comm.rank != 0:
        # The check imports the operation's package (0.3 s for Cholesky on the H200 host);
        # made here at the same time as rank 0's, not after it (2 ranks: this start-up step
        # 0.34 -> 0.97 s). Rank 0's config is the one every rank runs; this one is dropped, its
        # errors too (rank 0 reports them; a file only rank 0 can read is not one).
        try:
            load_config(config_path, list(overrides))
        except Exception:  # noqa: BLE001 - only a warm-up
            pass
    config = root_call(comm, load_config, config_path, list(overrides))
    return comm.bcast((config, uuid.uuid4().hex[:8], started) if comm.rank == 0 else None,
                      root=0)


# -- timing figures -------------------------------------------------------------------------------

def _compute_seconds(op_cls, phases, wall, gpu):
    """Per (repeat, rank) compute time: the sum of COMPUTE_PHASES, GPU-event time where recorded."""
    columns = [phases.index(p) for p in op_cls.COMPUTE_PHASES]
    return np.nansum(event_else_wall(wall[:, :, columns], gpu[:, :, columns]), axis=2)


def _time_to_solution(op_cls, phases, wall):
    """``time_to_solution_seconds`` (setup + the timed repeats + collect, slowest rank each) and
    its parts, by the report's definition (:func:`hisparse.report.time_to_solution`)."""
    from .report import time_to_solution
    parts = time_to_solution({"phases": phases, "wall": wall, "attrs": {},
                              "phase_scopes": op_cls.phase_scopes(),
                              "phase_kinds": op_cls.phase_kinds()})
    return {"time_to_solution_seconds": parts["tts_s"], "startup_seconds": parts["startup_s"],
            "setup_seconds": parts["setup_s"],
            "repeats_seconds": parts["repeats_s"], "collect_seconds": parts["collect_s"]}


def _derived(op_cls, phases, wall, gpu, work, bandwidth, repeats):
    """Derived metrics; ``bandwidth`` is ``(bytes/s, memories)`` (:func:`_aggregate_bandwidth`)."""
    bandwidth, memories = bandwidth or (0.0, 0)
    out = {"compute_phases": ",".join(op_cls.COMPUTE_PHASES),
           "flops": float(work.get("flops", 0.0)), "bytes_moved": float(work.get("bytes", 0.0)),
           "roofline_bandwidth_gbs": bandwidth / 1e9 if bandwidth else 0.0,
           "roofline_memories": int(memories)}
    if repeats == 0:  # stopped before the first timed repeat: no timing figures
        for key in ("median_total_seconds", "min_total_seconds", "median_compute_seconds",
                    "min_compute_seconds", "load_imbalance"):
            out[key] = float("nan")
        return out
    total = wall[:, :, phases.index("total")]
    compute = _compute_seconds(op_cls, phases, wall, gpu)
    critical = compute.max(axis=1)  # the slowest rank sets the pace of each repeat
    median_compute = float(np.median(critical))
    mean_over_ranks = compute.mean(axis=1)
    imbalance = float(np.median(critical / np.where(mean_over_ranks > 0, mean_over_ranks, 1.0)))
    out.update({
        "median_total_seconds": float(np.median(total.max(axis=1))),
        "min_total_seconds": float(np.min(total.max(axis=1))),
        "median_compute_seconds": median_compute,
        "min_compute_seconds": float(np.min(critical)),
        "load_imbalance": imbalance,
    })
    if median_compute > 0:
        out["gflops"] = out["flops"] / median_compute / 1e9
        out["gbytes_per_second"] = out["bytes_moved"] / median_compute / 1e9
    if bandwidth and median_compute > 0 and out["bytes_moved"] > 0:
        out["roofline_fraction"] = out["bytes_moved"] / median_compute / bandwidth
    return out


def _measure_bandwidth(backend):
    from .gpu import device_copy_bandwidth, host_copy_bandwidth
    return device_copy_bandwidth() if backend == "gpu" else host_copy_bandwidth()


def _aggregate_bandwidth(ctx):
    """The roofline of the whole run: the copy bandwidth of every distinct GPU its ranks compute
    on, measured by the first rank on each, summed (on the CPU backend every rank measures its
    own copy at the same time, so ranks sharing a host's memory share its bandwidth). A
    multi-rank run's bytes move through all of them at once: rank 0's device alone put its
    roofline fraction above 1. *Collective.*

    Returns
    -------
    tuple of (float, int) or None
        On rank 0, ``(bytes/s, number of memories)``; ``None`` elsewhere.
    """
    host = _metadata.rank_identity()["hostname"]
    if ctx.device is not None:
        info = ctx.device.info()
        key = (host, info.get("gpu_pci_bus_id") or info["gpu_ordinal"])
    else:
        key = (host, ctx.rank)
    keys = ctx.comm.allgather(key) if ctx.size > 1 else [key]
    mine = _measure_bandwidth(ctx.backend) if keys.index(key) == ctx.rank else 0.0
    measured = ctx.comm.gather(mine, root=0) if ctx.size > 1 else [mine]
    return (float(sum(measured)), len(set(keys))) if ctx.is_root else None


# -- the run --------------------------------------------------------------------------------------

@dataclass
class _Progress:
    """What this run has done so far, beyond the context: its id and planned results path, the
    signal view, whether the operation was set up and how many timed repeats ran."""

    started: object
    run_id: str
    path: str
    stops: StopRequest
    set_up: bool = False
    done: int = 0
    setup_peak_host_bytes: int = -1
    #: False when ``output.collect: none`` skipped the operation's collect (nothing to verify)
    collected: bool = True
    #: ``output.collect: parts``: this rank's ``local_result_arrays()``, taken before teardown
    local_parts: dict = None
    #: the part file this rank wrote (taken back if the run then fails to write its results)
    own_part: str = None
    #: this rank's start-up steps (``StepClock.seconds``) when the launch is counted
    launch_steps: dict = None


def run(config_path, overrides=(), comm=None, count_launch=False, cuda_warmup=None,
        launch_clock=None):
    """Execute one run described by a YAML config. *Collective.*

    Parameters
    ----------
    config_path : str
    overrides : list of str
        ``key.sub=value`` overrides.
    comm : mpi4py communicator, optional
        Default ``MPI.COMM_WORLD``.
    count_launch : bool
        Record the process's age when the run's timer starts as the setup phase ``startup`` (what
        ``hisparse run`` waited for before it: interpreter, imports, MPI, config, GPU binding), so
        the time to solution counts it. Only for a process that exists to make this run.
    cuda_warmup : hisparse.gpu._warmup.CudaWarmup, optional
        CUDA's initialisation started in the background by ``hisparse run``; finished (its
        primary-context reference dropped) once this rank is bound to its GPU, or knows it runs
        on the CPU.
    launch_clock : hisparse.timing.StepClock, optional
        The start-up steps ``hisparse run`` marked before this call; the run marks its own
        (``config``, ``device``, ``fits``) and, with ``count_launch``, records them per rank.

    Returns
    -------
    str or None
        The results file path on rank 0, ``None`` on other ranks.

    Raises
    ------
    HisparseError
        Raised on every rank for errors the user can fix (bad config, output that cannot be
        written, bad input, bad layout).
    Interrupted
        SIGINT/SIGTERM: raised on every rank at the same phase boundary; nothing is written.
    """
    comm = comm or get_world()
    started = _metadata.utc_now()
    launch = launch_clock or StepClock(since_launch=True)
    with StopRequest(comm, STOP_SIGNALS) as stops:
        config, run_id, started = _load(comm, config_path, overrides, started)
        path = all_call(comm, _plan_output, config, comm.size, run_id, started)
        local_comm = node_local(comm)
        threads.share_node(local_comm)  # unbound ranks of one node divide its cores
        op_cls = get_operation_class(config["operation.name"], config.source)
        root_call(comm, _plan_written_files, config, op_cls, path)
        with same_on_every_rank():  # the same config on every rank: the same error
            _check_collect(config, op_cls)
        backend = all_call(comm, resolve_backend, config["backend"])
        launch.mark("config")
        device = None
        if backend == "gpu":
            _import_early(op_cls.modules_for_setup(config, comm.size) + transport_modules(
                config["parallel.transport"], backend, comm.size, op_cls.DEVICE_COLLECTIVES))
            from .gpu import bind_device
            device = all_call(comm, bind_device, local_comm.rank)
        if cuda_warmup is not None:
            cuda_warmup.finish()  # after the binding took its own reference to the context
        launch.mark("device")
        # Before anything is read or allocated: a run that cannot fit stops in one line.
        all_call(comm, check_fits, config, op_cls, comm.size, backend, device, local_comm.size)
        launch.mark("fits")
        timer = PhaseTimer(op_cls.phases())
        launch_age = process_age_seconds() if count_launch else None
        if launch_age is not None:
            timer.add("startup", wall=launch_age)
        transport = None
        try:
            # Timed: a device transport's set-up is part of what a user waits for (the pairs'
            # connections it makes at their first send and receive land in the first repeat,
            # the warm-up when there is one).
            with timer.phase("connect"):
                # A device transport connects in the background while the input is read
                # (Operation.connected waits for it after the read, or in the operation's
                # setup before its first device collective; also timed as connect).
                transport = all_call(comm, open_transport, comm, local_comm, backend,
                                     config["parallel"], op_cls, True)
            ctx = RunContext(config=config, comm=comm, local_comm=local_comm, backend=backend,
                             timer=timer, device=device, transport=transport)
            with subject(input_label(config)):
                progress = _Progress(started, run_id, path, stops,
                                     launch_steps=launch.seconds if count_launch else None)
                return _run_pipeline(ctx, op_cls, progress)
        finally:
            if transport is not None:
                transport.close()
            if device is not None:
                device.release()


def _import_early(names):
    """Import the modules the operation's setup will need on the GPU (CuPy: 0.4-0.5 s with the
    SciPy it imports), before the GPU binding waits for CUDA's initialisation: ``hisparse run``
    started that in a background thread (:mod:`hisparse.gpu._warmup`), which goes on under the
    import. One that fails to import is left to the setup, which says what needs it."""
    import importlib
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _check_collect(config, op_cls):
    """``output.collect: parts`` needs an operation that can hand each rank's part."""
    if config["output.collect"] == "parts" and not op_cls.writes_parts():
        raise ConfigError(config.source, "output.collect",
                          f"parts: operation '{op_cls.NAME}' cannot write its result by parts "
                          f"(use gather or none)")


def _skips_collect(config, op):
    """``output.collect: none`` for an operation whose collect would gather a distributed result
    and that has no checksums of its own: nothing is collected (or verified)."""
    return (config["output.collect"] == "none" and "none" not in op.COLLECT_MODES
            and op.GATHERS_RESULT)


def _run_pipeline(ctx, op_cls, progress):
    stops = progress.stops
    with same_on_every_rank():  # made from the config alone: every rank fails alike
        op = op_cls(ctx)
    layout = op.layout()
    op.before_read()
    began = time.perf_counter()
    problem = _read_input(ctx, layout, op)
    _say_if_long(ctx, "read", began)
    if not op.CONNECTS_IN_SETUP:
        op.connected()
    if not stops.agree("read"):
        began, named = time.perf_counter(), ctx.timer.setup_wall()
        op.setup(problem)
        op.connected()
        # What the set-up did outside its named phases (kernels and compiled code loaded, the
        # analysis' warm-up, waits) is part of what the user waits for: ``prepare``, so the
        # time to solution counts the set-up's whole wall time (Cholesky: 0.8-0.9 s had gone
        # uncounted).
        ctx.timer.add("prepare", wall=max(0.0, time.perf_counter() - began
                                          - (ctx.timer.setup_wall() - named)))
        _say_if_long(ctx, "set up", began)
        progress.set_up = True
        progress.setup_peak_host_bytes = peak_host_bytes()
        ctx.maybe_fail("partition")
        if not stops.agree("setup"):
            progress.done = _time_repeats(ctx, op, stops)
            if progress.done:
                progress.collected = not _skips_collect(ctx.config, op)
                if progress.collected:
                    _collect(ctx, op)
                if ctx.config["output.collect"] == "parts":
                    progress.local_parts = op.local_result_arrays()
    ctx.maybe_fail("gather")
    if stops.stopped_at is not None:
        ctx.log(f"walltime signal during {stops.stopped_at}: writing the results of "
                f"{progress.done} of {ctx.config['run.repeats']} repeats")
    ctx.maybe_fail("verify")
    record = None
    if ctx.is_root:
        with threads.alone():  # the other ranks wait for rank 0's verification
            record = _root_record(ctx, op, op_cls, layout, problem, progress)
    ctx.maybe_fail("peers")
    if ctx.is_root:
        record["peers"] = _run_peers(ctx, op, problem, progress)
        # After the peers: a summary compares with what they measured (e.g. device memory).
        record["summary"] = op.summary() if progress.done else {}
    barrier_asleep(ctx.comm)  # the other ranks leave rank 0 their cores meanwhile
    bandwidth = _aggregate_bandwidth(ctx)
    gathered = ctx.comm.gather(_rank_record(ctx, op, progress), root=0)
    stops.agree("peers")  # SIGINT/SIGTERM during verification or peers: nobody writes
    if progress.set_up:
        op.teardown()
    return _write_and_conclude(ctx, op_cls, record, gathered, bandwidth, progress)


def _read_input(ctx, layout, op):
    """The input as ``layout`` reads it (every rank's own part, or the whole input on rank 0 and
    ``None`` elsewhere). Timed as ``read`` on every rank."""
    with ctx.timer.phase("read"):
        problem = layout.load(ctx, op)
    ctx.maybe_fail("read")
    return problem


def peak_host_bytes():
    """This process's peak resident host memory so far (max RSS), in bytes."""
    import resource
    import sys
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB else


def _collect(ctx, op):
    """Once, after the timed repeats: bring a result that stayed distributed (on the ranks'
    GPUs) to rank 0 (:meth:`~hisparse.ops._base.Operation.collect`), timed as the one-time phase
    ``collect``, outside the per-repeat total. *Collective.*"""
    ctx.timer.begin_repeat(PhaseTimer.SETUP)
    with ctx.timer.phase("collect"):
        op.collect()


def _say_if_long(ctx, what, began):
    """Rank 0's progress line for a step begun at ``began`` (``time.perf_counter``)."""
    took = time.perf_counter() - began
    ctx.progress(f"{what} ({took:.3g} s)", took)


def _time_repeats(ctx, op, stops):
    """Run the warm-up and the timed repeats; return how many timed repeats ran (fewer than
    ``run.repeats`` when the job script forwarded the walltime signal, SIGUSR1). Every rank
    agrees on the signals after each repetition, outside the timed region."""
    timer, repeats = ctx.timer, ctx.config["run.repeats"]
    timer.enabled = False
    for _ in range(ctx.config["run.warmup"]):
        op.run_once()
        if stops.agree("warmup"):
            timer.enabled = True
            return 0
    timer.enabled = True
    last = time.perf_counter()
    for index in range(repeats):
        timer.begin_repeat(index)
        start = time.perf_counter()
        op.run_once()
        if index == 0:
            ctx.maybe_fail("compute")
        timer.add("total", wall=time.perf_counter() - start)
        now = time.perf_counter()
        if ctx.progress(f"repeat {index + 1}/{repeats} ({now - start:.3g} s)", now - last):
            last = now
        if index + 1 < repeats and stops.agree("repeats"):
            return index + 1
    return repeats


def _rank_record(ctx, op, progress):
    """This rank's timings and identity, gathered into ``/perf``."""
    # One timing row at least: a run stopped before its first repeat keeps its setup phases.
    wall, gpu = ctx.timer.arrays(max(progress.done, 1))
    identity = dict(_metadata.rank_identity(), local_rank=ctx.local_comm.rank,
                    backend=ctx.backend, **(ctx.device.info() if ctx.device else {}),
                    compile_seconds=float(ctx.compile_stats.get("compile_seconds", 0.0)),
                    host_compile_seconds=host_compile_seconds(),
                    compile_cache_hit=int(bool(ctx.compile_stats.get("compile_cache_hit", True))),
                    peak_host_bytes=peak_host_bytes(),
                    peak_host_bytes_setup=progress.setup_peak_host_bytes,
                    **{f"startup_{step}_seconds": seconds
                       for step, seconds in (progress.launch_steps or {}).items()})
    if progress.set_up:
        identity.update(**op.engine_stats(), **op.rank_info())
    return wall, gpu, identity


# -- rank 0: verification, peers, what the results file records -----------------------------------

def _root_record(ctx, op, op_cls, layout, problem, progress):
    done = progress.done
    result = op.result() if done else None
    record = {"repeats": done, "work": op.work(problem), "problem": layout.describe(problem),
              "strategy": op.strategy,
              # gather only: parts are joined in the results file, none keeps no arrays
              "result_arrays": op.result_arrays(result)
              if done and ctx.config["output.collect"] == "gather" else {}}
    record.update(_verify(ctx, op, op_cls, problem, result, progress))
    return record


def _verify(ctx, op, op_cls, problem, result, progress):
    config, stops = ctx.config, progress.stops
    rtol = config["verify.rtol"] or op_cls.DEFAULT_RTOL[config["precision"]]
    out = {"verify_enabled": False, "verify_passed": True, "verify_error": float("nan"),
           "verify_rtol": rtol, "verify_skipped": "", "non_finite": 0}
    if not config["verify.enabled"]:
        return out
    if not progress.done:
        out["verify_skipped"] = "stopped before the first timed repeat"
        return out
    if stops.local_level() == StopRequest.INTERRUPT:
        return out  # the run ends at the next boundary; no file is written
    if not progress.collected:
        out["verify_skipped"] = (f"output.collect: none: operation '{op_cls.NAME}' keeps its "
                                 f"result on the ranks and has no checksums of it")
        return out
    started = time.perf_counter()
    error = op.compare(result, op.reference(problem))
    # Outside the time to solution, but the user waits for it: the whole input made or read
    # again on rank 0 (one rank's kept part of a slow-to-make matrix: layout.keeps_whole), and
    # the reference computed there.
    out["verify_seconds"] = time.perf_counter() - started
    out.update(verify_enabled=True, verify_error=error, verify_passed=bool(error <= rtol))
    if not np.isfinite(error):
        out["non_finite"] = _count_non_finite(op.result_arrays(result))
    return out


def _count_non_finite(arrays):
    """Inf/NaN entries in the result arrays (an overflow, typically in fp32)."""
    return int(sum(np.count_nonzero(~np.isfinite(a)) for a in arrays.values()
                   if isinstance(a, np.ndarray) and a.dtype.kind in "fc"))


def _run_peers(ctx, op, problem, progress):
    peers = {}
    for name in ctx.config["peers"]:
        if progress.stops.stopping():
            peers[name] = {"seconds": [np.nan], "skipped": "the run was stopped by a signal"}
            continue
        try:
            peers[name] = op.run_peer(name, problem, max(progress.done, 1))
        except HisparseError as exc:
            ctx.log(f"peer '{name}' skipped: {exc}")
            peers[name] = {"seconds": [np.nan], "skipped": str(exc)}
    return peers


def _verification_message(config, record, path):
    if record["verify_passed"]:
        return None
    if record["non_finite"]:
        overflow = " (fp32 overflows beyond 3.4e38: try precision: fp64)" \
            if config["precision"] == "fp32" else ""
        return (f"verification failed: the result holds {record['non_finite']} Inf/NaN "
                f"values{overflow} (results kept in {path})")
    return (f"verification failed: max relative error {record['verify_error']:.3e} > "
            f"rtol {record['verify_rtol']:.1e} (results kept in {path})")


def _write_and_conclude(ctx, op_cls, record, gathered, bandwidth, progress):
    """Rank 0 writes the results file (an interruption or a failure there reaches every rank);
    every rank then raises the verification failure, if any."""
    ctx.maybe_fail("write")
    try:
        result_parts = _write_parts(ctx, progress)
        path = root_call(ctx.comm, _write, ctx, op_cls, record, gathered, bandwidth, progress,
                         result_parts)
    except BaseException:
        # No results file joins the parts (a rank could not write its part, an error in the
        # results file, or SIGINT/SIGTERM: raised on every rank alike): each rank takes back
        # the part file it just wrote, if any.
        _discard_own_part(ctx, progress)
        raise
    message = _verification_message(ctx.config, record, path) if ctx.is_root else None
    message = ctx.comm.bcast(message, root=0) if ctx.size > 1 else message
    if message is not None:
        raise VerificationError(message)
    return path


def _write_parts(ctx, progress):
    """``output.collect: parts``: every rank writes its part file beside the results file (an
    error on any rank stops every rank); returns, on rank 0, ``(part file names, per rank
    {name: (shape, dtype, row placement)})`` for the results file's virtual datasets, else
    ``None``. *Collective.*"""
    from .io import part_file_paths, row_placement
    if ctx.config["output.collect"] != "parts" or progress.local_parts is None:
        return None
    local = progress.local_parts
    path = part_file_paths(progress.path, ctx.size)[ctx.rank]
    # An error on any rank reaches every rank; the caller then takes back this rank's part.
    written = all_call(ctx.comm, _write_own_part, ctx, progress, path,
                       {name: array for name, (array, _) in local.items()})
    mine = {name: (shape, dtype, row_placement(local[name][1]))
            for name, (shape, dtype) in written.items()}
    parts = ctx.comm.gather(mine, root=0) if ctx.size > 1 else [mine]
    if not ctx.is_root:
        return None
    return [os.path.basename(p) for p in part_file_paths(progress.path, ctx.size)], parts


def _write_own_part(ctx, progress, path, arrays):
    """Write this rank's part file and remember it, so a later failure can take it back."""
    from .io import write_result_part
    written = write_result_part(path, arrays)
    progress.own_part = path
    ctx.maybe_fail("parts")
    return written


def _discard_own_part(ctx, progress):
    """Remove the part file this rank wrote in this run (only that one: it was created new,
    never over an existing file), when the run ends without a results file to join it."""
    path = getattr(progress, "own_part", None)
    if path is not None and os.path.exists(path):
        os.remove(path)
        progress.own_part = None


def _write(ctx, op_cls, record, gathered, bandwidth, progress, result_parts=None):
    """Rank 0: the results file (joining the part files of ``output.collect: parts``)."""
    ctx.maybe_fail("results")
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
    derived = _derived(op_cls, phases, wall, gpu, record["work"], bandwidth, record["repeats"])
    peers = {}
    for name, info in record["peers"].items():
        seconds = np.asarray(info["seconds"], dtype=float)
        peer_median = float(np.nanmedian(seconds)) if np.isfinite(seconds).any() else float("nan")
        speedup = peer_median / derived["median_compute_seconds"] \
            if derived["median_compute_seconds"] > 0 else float("nan")
        peers[name] = dict(info, median_seconds=peer_median, speedup=speedup)
        derived[f"speedup_vs_{name}"] = speedup
        derived[f"peer_{name}_median_seconds"] = peer_median
    hosts = [ident["hostname"] for ident in identities]
    attrs = {"schema": "hisparse.results", "schema_version": "1.0", "run_id": progress.run_id,
             "name": config["run.name"], "operation": config["operation.name"],
             "study": config["run.study"], "study_id": config["run.study_id"] or "",
             "input": config["input.path"] or f"generate:{config['input.generate']}",
             "backend": ctx.backend, "precision": config["precision"],
             "partition": record["strategy"],
             "nranks": ctx.size, "nnodes": len(set(hosts)), "hostnames": ",".join(sorted(set(hosts))),
             "gpu_names": ",".join(str(i.get("gpu_name", "")) for i in identities),
             "gpu_binding": ",".join(f"{i['hostname']}:{i.get('gpu_ordinal', -1)}"
                                     for i in identities),
             "created_utc": progress.started.isoformat(),
             "finished_utc": _metadata.utc_now().isoformat(),
             "repeats": record["repeats"], "repeats_requested": config["run.repeats"],
             "stopped_early": record["repeats"] < config["run.repeats"],
             "stopped_at": progress.stops.stopped_at or "",
             "warmup": config["run.warmup"],
             "timing_clocks": "perf_counter+cuda_event",
             "verify_enabled": record["verify_enabled"], "verify_passed": record["verify_passed"],
             "verify_max_rel_error": record["verify_error"], "verify_rtol": record["verify_rtol"],
             "verify_skipped": record["verify_skipped"],
             "verify_non_finite": record["non_finite"]}
    if "verify_seconds" in record:
        attrs["verify_seconds"] = record["verify_seconds"]
    if config["input.path"]:
        from .io import input_identity
        attrs.update(input_identity(config["input.path"]))
    if ctx.device is not None:
        attrs["cuda_driver_version"] = ctx.device.driver_version
        attrs["cuda_version"] = ".".join(str(v) for v in ctx.device.cuda_version)
        attrs["cuda_arch"] = config["gpu.arch"] or ctx.device.arch
    attrs.update(record["problem"])
    attrs.update(_metadata.run_metadata())
    attrs.update(derived)
    attrs.update(_time_to_solution(op_cls, phases, wall))
    attrs.update(ctx.transport.describe())
    attrs.update(record["summary"])
    path = write_results(progress.path, attrs, config.to_yaml(),
                         _metadata.environment_subset(), phases, wall, gpu, rank_vars,
                         peers=peers, result=record["result_arrays"],
                         phase_kinds=op_cls.phase_kinds(), phase_scopes=op_cls.phase_scopes(),
                         run_id=progress.run_id, result_parts=result_parts,
                         compression=config["output.compression"])
    if path != progress.path:
        ctx.log(f"{progress.path} appeared during the run; results written to {path} instead")
    return path
