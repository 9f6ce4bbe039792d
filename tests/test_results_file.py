"""The results file: schema, atomic write, per-rank phases, readable by h5py (and xarray when
installed)."""
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from hisparse.io import read_results, write_results

from conftest import ROOT, run_hisparse


def test_quickstart_two_ranks_same_y_as_one_and_full_schema(tmp_path):
    ys, files, elapsed = [], [], []
    for nprocs in (1, 2):
        out = tmp_path / f"r{nprocs}"
        began = time.perf_counter()
        proc = run_hisparse(["run", ROOT / "inputs/quickstart.yaml", "--set", f"output.dir={out}",
                             "--set", "backend=cpu"], nprocs=nprocs)
        elapsed.append(time.perf_counter() - began)
        assert proc.returncode == 0, proc.stderr
        (path,) = out.glob("*.h5")
        files.append(path)
        with h5py.File(path, "r") as handle:
            ys.append(handle["result/y"][()])
    np.testing.assert_allclose(ys[0], ys[1], rtol=1e-14)
    run = read_results(str(files[1]))
    attrs = run["attrs"]
    for key in ("run_id", "operation", "input", "nranks", "hostnames", "gpu_binding",
                "mpi_library_version", "git_sha", "created_utc", "app_version", "scheduler",
                "gflops", "roofline_fraction", "verify_max_rel_error", "speedup_vs_scipy"):
        assert key in attrs, key
    assert attrs["nranks"] == 2 and attrs["verify_passed"]
    # The roofline is the aggregate of the run's memories (issue 35 item 11): on the CPU every
    # rank's own copy bandwidth, so two ranks' fraction is not measured against one.
    assert attrs["roofline_memories"] == 2
    assert attrs["roofline_fraction"] == pytest.approx(
        attrs["bytes_moved"] / attrs["median_compute_seconds"]
        / (attrs["roofline_bandwidth_gbs"] * 1e9))
    assert run["wall"].shape == (5, 2, len(run["phases"]))
    for phase in ("read", "partition", "halo", "kernel", "collect", "total"):
        assert phase in run["phases"]
    kernel = run["phases"].index("kernel")
    assert np.all(run["wall"][:, :, kernel] > 0)
    # the transport's set-up is a timed setup phase, part of the time to solution
    connect = run["phases"].index("connect")
    assert np.all(run["wall"][0, :, connect] >= 0) and np.isnan(run["wall"][1:, :, connect]).all()
    # the set-up: the slowest rank's sum of its one-time phases, which with the driver's
    # ``prepare`` cover each rank's whole set-up
    once = [run["phases"].index(p) for p, scope in run["phase_scopes"].items()
            if scope == "setup" and p != "startup"]
    assert "prepare" in run["phases"]
    per_rank = np.nansum(run["wall"][0][:, once], axis=1)
    assert attrs["setup_seconds"] == pytest.approx(per_rank.max())
    assert np.all(per_rank >= np.nansum(run["wall"][0][:, [run["phases"].index(p) for p in (
        "connect", "read", "partition")]], axis=1))
    # hisparse run counts its process's launch (interpreter, imports, MPI) as ``startup``: once
    # per rank, within what the test waited for the whole job, part of the time to solution
    start = run["wall"][:, :, run["phases"].index("startup")]
    if sys.platform.startswith("linux"):
        assert np.all(start[0] > 0.01) and np.all(start[0] < elapsed[1])
        assert attrs["startup_seconds"] == pytest.approx(start[0].max())
        # its steps per rank, in order, summing to at most the startup phase (the timer starts
        # a moment after the last mark)
        steps = ("interpreter", "imports", "mpi_init", "config", "device", "fits")
        shares = np.array([run["rank_vars"][f"startup_{s}_seconds"] for s in steps])
        assert shares.shape == (len(steps), 2) and np.all(shares >= 0)
        assert np.all(shares[0] > 0.01) and np.all(shares.sum(axis=0) <= start[0] + 1e-9)
        assert np.all(shares.sum(axis=0) > 0.9 * start[0] - 0.02)
    assert np.isnan(start[1:]).all()
    assert attrs["time_to_solution_seconds"] == pytest.approx(
        attrs["startup_seconds"] + attrs["setup_seconds"] + attrs["collect_seconds"]
        + np.nansum(run["wall"][:, :, run["phases"].index("total")].max(axis=1)))
    assert "operation:" in run["config_yaml"]
    assert "scipy" in run["peers"]
    # hisparse report tabulates it
    proc = run_hisparse(["report", files[1]])
    assert proc.returncode == 0 and "spmv" in proc.stdout and "scipy" in proc.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_age_counts_from_the_launch():
    """A child that sleeps before asking: its age covers the sleep and fits in what the parent
    measured around the whole child."""
    code = ("import time; time.sleep(0.4); from hisparse.timing import process_age_seconds; "
            "print(process_age_seconds())")
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    waited = time.perf_counter() - began
    age = float(out.stdout)
    assert 0.4 <= age <= waited + 0.02  # /proc's launch time has 10 ms steps


def test_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.h5"
    wall = np.ones((1, 1, 2))

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("hisparse.io._results._write_perf", explode)
    with pytest.raises(RuntimeError):
        write_results(str(path), {"a": 1}, "x: 1", {}, ["kernel", "total"], wall, wall,
                      {"hostname": ["h"]})
    assert list(tmp_path.iterdir()) == []


def test_perf_group_opens_with_xarray(tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    path = tmp_path / "r.h5"
    wall = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2)
    write_results(str(path), {"operation": "spmv"}, "x: 1", {}, ["kernel", "total"], wall,
                  wall * 0.5, {"hostname": ["a", "b", "c"], "nnz": [1, 2, 3]})
    ds = xr.open_dataset(path, group="perf", engine="h5netcdf")
    assert dict(ds.sizes) == {"repeat": 2, "rank": 3, "phase": 2}
    assert float(ds.wall_seconds.sel(phase="total", rank=2, repeat=1)) == wall[1, 2, 1]


@pytest.mark.parametrize("compression", ["none", "gzip", "lzf"])
def test_result_arrays_are_written_with_the_chosen_filter(tmp_path, compression):
    """``output.compression``: the /result arrays carry the filter asked for (none: no filter),
    and read back equal, an empty array and a scalar included; perf is unaffected."""
    from hisparse.io._results import RESULT_FILTERS
    path = tmp_path / "r.h5"
    wall = np.ones((1, 1, 2))
    rng = np.random.default_rng(0)
    result = {"y": rng.random(1000), "indices": np.arange(5000, dtype=np.int32),
              "empty": np.zeros(0), "scalar": np.float64(2.5)}
    write_results(str(path), {"operation": "spmv"}, "x: 1", {}, ["kernel", "total"], wall, wall,
                  {"hostname": ["h"]}, result=result, compression=compression)
    with h5py.File(path, "r") as handle:
        for name, array in result.items():
            dset = handle["result"][name]
            np.testing.assert_array_equal(dset[()], array)
            expected = RESULT_FILTERS[compression].get("compression") if np.ndim(array) else None
            assert dset.compression == expected, name
        assert handle["perf/wall_seconds"].compression is None


def test_results_identify_the_input_by_absolute_path_size_and_checksum(tmp_path):
    """Issue 35 item 12: the input was recorded by the name the config gave only. A relative
    input.path is recorded as the absolute path it resolved to, with the file's size and an
    independent BLAKE2b of its bytes; above the size limit the checksum is skipped, saying why."""
    import hashlib
    import os
    import shutil
    from hisparse.io import input_identity
    shutil.copy(ROOT / "inputs" / "quickstart.h5", tmp_path / "in.h5")
    proc = run_hisparse(["run", ROOT / "inputs/quickstart.yaml", "--set", "input.path=in.h5",
                         "--set", f"output.dir={tmp_path / 'out'}", "--set", "backend=cpu",
                         "--set", "peers=[]", "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "out").glob("*.h5")
    attrs = read_results(str(path))["attrs"]
    data = (tmp_path / "in.h5").read_bytes()
    assert attrs["input"] == "in.h5"
    assert attrs["input_path_absolute"] == str(tmp_path / "in.h5")
    assert attrs["input_size_bytes"] == len(data)
    assert attrs["input_checksum"] == \
        "blake2b-128:" + hashlib.blake2b(data, digest_size=16).hexdigest()
    assert attrs["input_checksum_skipped"] == ""
    skipped = input_identity(str(tmp_path / "in.h5"), limit=len(data) - 1)
    assert skipped["input_checksum"] == "" and "larger than" in skipped["input_checksum_skipped"]
    assert skipped["input_size_bytes"] == len(data)
    assert skipped["input_mtime_utc"].startswith(
        time.strftime("%Y-%m-%d", time.gmtime(os.stat(tmp_path / "in.h5").st_mtime)))


def test_setup_work_outside_the_named_phases_counts_in_the_time_to_solution(tmp_path,
                                                                            monkeypatch):
    """Whatever an operation's set-up does outside its named phases (here a 0.3 s pause before
    them) is recorded as the driver's ``prepare`` phase, so the time to solution holds the
    set-up's whole wall time."""
    from hisparse import driver
    from hisparse.ops import get_operation_class

    from helpers import write_config
    spmv = get_operation_class("spmv")
    setup = spmv.setup

    def slow_setup(self, problem):
        time.sleep(0.3)  # no phase around it
        return setup(self, problem)

    monkeypatch.setattr(spmv, "setup", slow_setup)
    config = write_config(tmp_path, "spmv", {"x": "ones"}, backend="cpu",
                          input={"generate": {"kind": "poisson", "dims": [30, 30]}},
                          output={"dir": str(tmp_path / "out")}, verify={"enabled": False},
                          run={"repeats": 2, "warmup": 0})
    began = time.perf_counter()
    run = read_results(driver.run(str(config)))
    elapsed = time.perf_counter() - began
    phases, wall, attrs = run["phases"], run["wall"], run["attrs"]
    prepare = wall[0, 0, phases.index("prepare")]
    assert 0.3 <= prepare < 0.3 + 0.5 * elapsed
    assert np.isnan(wall[1:, 0, phases.index("prepare")]).all()
    assert run["phase_scopes"]["prepare"] == "setup"
    once = [p for p in phases if run["phase_scopes"][p] == "setup" and p != "startup"]
    assert attrs["setup_seconds"] == pytest.approx(
        np.nansum([wall[0, 0, phases.index(p)] for p in once]))
    assert attrs["setup_seconds"] >= 0.3
