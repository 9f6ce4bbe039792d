"""``hisparse report`` on a study: results files with known timings are written here, and the
expected speedup, efficiency, imbalance and phase shares are computed plainly in the tests."""
import io
import os
import sys

import h5py
import numpy as np
import pytest

from hisparse.io import write_results
from hisparse.report import phase_category, report, run_rows, study_rows

from conftest import run_hisparse

PHASES = ["read", "partition", "distribute", "upload", "h2d", "kernel", "d2h", "gather", "total"]
PER_REPEAT = ["h2d", "kernel", "d2h", "gather"]


def _timings(rng, nranks, repeats, scale):
    """Wall seconds (repeats, nranks, phases): one-time phases in repeat 0 only; total = the
    per-repeat phases plus some unaccounted time."""
    wall = np.full((repeats, nranks, len(PHASES)), np.nan)
    for p in ("read", "partition", "distribute", "upload"):
        wall[0, :, PHASES.index(p)] = rng.uniform(0.01, 0.02, nranks)
    for p in PER_REPEAT:
        wall[:, :, PHASES.index(p)] = scale * rng.uniform(0.5, 1.5, (repeats, nranks))
    parts = wall[:, :, [PHASES.index(p) for p in PER_REPEAT]].sum(axis=2)
    wall[:, :, PHASES.index("total")] = parts + scale * rng.uniform(0.0, 0.2, (repeats, nranks))
    return wall


def _write(path, wall, study="strong", study_id="st", operation="spmv", peer=None,
           input_name="in.h5", flops=None, compile_seconds=None, host_compile_seconds=None):
    repeats, nranks, _ = wall.shape
    kernel = wall[:, :, PHASES.index("kernel")]
    attrs = {"schema": "hisparse.results", "study": study, "study_id": study_id, "name": "t",
             "operation": operation, "input": input_name, "backend": "cpu", "precision": "fp64",
             "nranks": nranks, "nnodes": 1, "compute_phases": "kernel",
             "median_compute_seconds": float(np.median(kernel.max(axis=1))),
             "median_total_seconds": float(np.median(wall[:, :, -1].max(axis=1))),
             "verify_enabled": True, "verify_passed": True, "verify_max_rel_error": 1e-15}
    if flops is not None:
        attrs["flops"] = float(flops)
    peers = {}
    if peer is not None:
        peers["scipy"] = {"seconds": [peer] * repeats, "median_seconds": peer, "speedup": 1.0}
    rank_vars = {"hostname": ["h"] * nranks}
    if compile_seconds is not None:
        rank_vars["compile_seconds"] = np.asarray(compile_seconds, dtype=float)
    if host_compile_seconds is not None:
        rank_vars["host_compile_seconds"] = np.asarray(host_compile_seconds, dtype=float)
    write_results(str(path), attrs, "run: {}\n", {}, PHASES, wall, np.full_like(wall, np.nan),
                  rank_vars, peers=peers)


def _expected(wall):
    """T(p), the slowest rank's per-category seconds (each repeat's, then the median over
    repeats), and the compute imbalance, written out."""
    total = wall[:, :, PHASES.index("total")]
    slowest = total.argmax(axis=1)
    rows = np.arange(wall.shape[0])
    t = np.median(total[rows, slowest])

    def at(p):
        return wall[rows, slowest, PHASES.index(p)]

    parts = {"compute": at("kernel"), "communication": at("gather"),
             "transfer": at("h2d") + at("d2h")}
    parts["other"] = total[rows, slowest] - sum(parts.values())  # these timings never overlap
    category = {name: np.median(seconds) for name, seconds in parts.items()}
    kernel = wall[:, :, PHASES.index("kernel")]
    imbalance = np.median(kernel.max(axis=1) / kernel.mean(axis=1))
    return t, category, imbalance


@pytest.fixture
def strong_study(tmp_path):
    rng = np.random.default_rng(7)
    walls = {}
    for nranks, scale in ((1, 1.0), (2, 0.6), (4, 0.4)):
        walls[nranks] = _timings(rng, nranks, repeats=5, scale=scale)
        _write(tmp_path / f"r{nranks}.h5", walls[nranks], peer=0.9)
    return tmp_path, walls


def test_strong_study_speedup_efficiency_imbalance_and_phases(strong_study):
    directory, walls = strong_study
    rows = study_rows([str(directory)])
    assert [r["nranks"] for r in rows] == [1, 2, 4]
    t1 = _expected(walls[1])[0]
    for row in rows:
        t, category, imbalance = _expected(walls[row["nranks"]])
        assert row["total_s"] == pytest.approx(t)
        assert row["speedup"] == pytest.approx(t1 / t)
        assert row["efficiency"] == pytest.approx(t1 / t / row["nranks"])
        assert row["imbalance"] == pytest.approx(imbalance)
        for name, seconds in category.items():
            assert row[f"{name}_part_s"] == pytest.approx(seconds)
            assert row[f"{name}_pct"] == pytest.approx(100 * seconds / sum(category.values()))
        setup = sum(np.max(walls[row["nranks"]][0, :, PHASES.index(p)])
                    for p in ("read", "partition", "distribute", "upload"))
        assert row["setup_s"] == pytest.approx(setup)
        assert row["peer_scipy_s"] == pytest.approx(0.9)


def test_weak_study_efficiency_is_the_time_ratio(tmp_path):
    rng = np.random.default_rng(3)
    walls = {p: _timings(rng, p, 3, 1.0 + 0.1 * p) for p in (2, 4)}
    for p, wall in walls.items():  # the input grows with the ranks: still one series
        _write(tmp_path / f"w{p}.h5", wall, study="weak", study_id="wk", input_name=f"in{p}.h5")
    rows = study_rows([str(tmp_path)])
    assert len({row["series"] for row in rows}) == 1
    t2, t4 = _expected(walls[2])[0], _expected(walls[4])[0]
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["efficiency"] == pytest.approx(t2 / t4)
    assert rows[1]["speedup"] == pytest.approx(t2 / t4 * 4 / 2)
    assert all(np.isnan(row["work_efficiency"]) for row in rows)  # no work recorded


def test_weak_study_work_efficiency_is_each_ranks_rate(tmp_path):
    """A weak series whose work per rank grows (SpGEMM on R-MAT: products grow faster than the
    input): work_efficiency compares each rank's rate of work, not the times."""
    rng = np.random.default_rng(5)
    work = {1: 2.0e8, 2: 5.2e8, 4: 1.36e9}
    walls = {p: _timings(rng, p, 3, 1.0 + 0.5 * p) for p in work}
    for p, wall in walls.items():
        _write(tmp_path / f"w{p}.h5", wall, study="weak", study_id="wk", input_name=f"in{p}.h5",
               flops=work[p])
    rows = {row["nranks"]: row for row in study_rows([str(tmp_path)])}
    t = {p: _expected(walls[p])[0] for p in work}
    for p in work:
        expected = (work[p] / (p * t[p])) / (work[1] / t[1])
        assert rows[p]["work_efficiency"] == pytest.approx(expected)
        assert rows[p]["efficiency"] == pytest.approx(t[1] / t[p])


def test_repeated_runs_keep_the_median_and_series_stay_apart(tmp_path):
    rng = np.random.default_rng(11)
    walls = [_timings(rng, 2, 3, s) for s in (1.0, 2.0, 3.0)]
    for i, wall in enumerate(walls):
        _write(tmp_path / f"again{i}.h5", wall)
    _write(tmp_path / "other.h5", _timings(rng, 2, 3, 1.0), study_id="other")
    rows = study_rows([str(tmp_path)])
    assert [(r["study_id"], r["runs"]) for r in rows] == [("other", 1), ("st", 3)]
    assert rows[1]["total_s"] == pytest.approx(_expected(walls[1])[0])


def test_phase_categories():
    assert phase_category("kernel", ("kernel",)) == "compute"
    assert phase_category("gather") == "communication"
    assert phase_category("allreduce_factors") == "communication"
    assert phase_category("h2d") == "transfer" and phase_category("upload") == "transfer"
    assert phase_category("mttkrp", ("mttkrp",)) == "compute"
    assert phase_category("normalize") == "other"


def test_report_writes_table_csv_plots_and_names_missing_runs(strong_study, tmp_path):
    directory, _ = strong_study
    spec = directory / "jobs" / "st"
    spec.mkdir(parents=True)
    (spec / "study.yaml").write_text("id: st\nranks: [1, 2, 4, 8]\n")
    with h5py.File(directory / "input.h5", "w") as handle:  # not a results file: left out
        handle["x"] = np.arange(3)
    out, err = io.StringIO(), io.StringIO()
    assert report([str(directory)], output=str(tmp_path / "out"), stdout=out, stderr=err) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:2] == ["study_id", "study"] and len(lines) == 5
    assert "study st: no results for 8 rank(s)" in err.getvalue()
    csv_lines = (tmp_path / "out" / "study.csv").read_text().splitlines()
    assert len(csv_lines) == 4 and "phase_kernel_s" in csv_lines[0]
    assert (tmp_path / "out" / "runs.csv").exists()
    assert (tmp_path / "out" / "report.txt").read_text().startswith(lines[0])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plots skipped: matplotlib is not installed" in err.getvalue()
    else:
        for name in ("scaling.png", "phases.png"):
            assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"


def test_plots_are_skipped_with_a_message_without_matplotlib(strong_study, tmp_path,
                                                            monkeypatch):
    directory, _ = strong_study
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out, err = io.StringIO(), io.StringIO()
    assert report([str(directory)], plots=str(tmp_path / "plots"), stdout=out, stderr=err) == 0
    assert "plots skipped: matplotlib is not installed" in err.getvalue()
    assert not (tmp_path / "plots" / "scaling.png").exists()


def test_cli_single_runs_get_one_row_per_run_unless_asked(tmp_path):
    rng = np.random.default_rng(5)
    for p in (1, 2):
        _write(tmp_path / f"s{p}.h5", _timings(rng, p, 2, 1.0), study="single", study_id="")
    proc = run_hisparse(["report", tmp_path], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.split()[0] == "operation"
    proc = run_hisparse(["report", tmp_path, "--study", "--csv"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("study_id,study,")
    assert proc.stdout.count("\n") == 3


def test_startup_is_counted_in_time_to_solution_apart_from_setup(tmp_path):
    """A file with the ``startup`` phase (hisparse run's) and its scopes and kinds: ``tts_s`` is
    startup + setup + repeats, ``setup_s`` leaves startup out; the study's tts efficiency sees it."""
    rng = np.random.default_rng(11)
    phases = ["startup"] + PHASES
    scopes = {p: "setup" for p in ("startup", "read", "partition", "distribute", "upload")}
    scopes.update({p: "repeat" for p in PER_REPEAT + ["total"]})
    kinds = {"startup": "startup", "read": "io", "partition": "other", "distribute": "other",
             "upload": "transfer", "h2d": "transfer", "kernel": "compute", "d2h": "transfer",
             "gather": "communication", "total": "total"}
    expected = {}
    for nranks in (1, 2):
        timing = _timings(rng, nranks, repeats=3, scale=1.0 / nranks)
        startup = np.full((3, nranks, 1), np.nan)
        startup[0, :, 0] = rng.uniform(0.4, 0.6, nranks)
        wall = np.concatenate([startup, timing], axis=2)
        attrs = {"schema": "hisparse.results", "study": "strong", "study_id": "su", "name": "t",
                 "operation": "spmv", "input": "in.h5", "backend": "cpu", "precision": "fp64",
                 "nranks": nranks, "nnodes": 1, "compute_phases": "kernel",
                 "verify_enabled": False}
        write_results(str(tmp_path / f"s{nranks}.h5"), attrs, "run: {}\n", {}, phases, wall,
                      np.full_like(wall, np.nan), {"hostname": ["h"] * nranks},
                      phase_kinds=kinds, phase_scopes=scopes)
        setup = sum(np.max(wall[0, :, phases.index(p)])
                    for p in ("read", "partition", "distribute", "upload"))
        repeats = np.sum(np.max(wall[:, :, phases.index("total")], axis=1))
        expected[nranks] = (np.max(wall[0, :, 0]), setup, repeats)
    rows = study_rows([str(tmp_path)])
    assert [r["nranks"] for r in rows] == [1, 2]
    for row in rows:
        startup, setup, repeats = expected[row["nranks"]]
        assert row["startup_s"] == pytest.approx(startup)
        assert row["setup_s"] == pytest.approx(setup)
        assert row["tts_s"] == pytest.approx(startup + setup + repeats)
    tts = {n: sum(expected[n]) for n in expected}
    assert rows[1]["tts_efficiency"] == pytest.approx(tts[1] / tts[2] / 2)


def test_run_rows_show_the_verification_time_where_recorded(tmp_path):
    """``verify_s`` is the file's ``verify_seconds`` (rank 0's verification, outside tts_s), and
    "-" for a run without it (not verified, or written before it was recorded)."""
    from hisparse.report import format_table, run_rows
    rng = np.random.default_rng(5)
    _write(tmp_path / "plain.h5", _timings(rng, 1, repeats=2, scale=1.0))
    wall = _timings(rng, 1, repeats=2, scale=1.0)
    attrs = {"schema": "hisparse.results", "study": "", "name": "t", "operation": "spmv",
             "input": "in.h5", "backend": "cpu", "precision": "fp64", "nranks": 1, "nnodes": 1,
             "compute_phases": "kernel", "verify_enabled": True, "verify_passed": True,
             "verify_max_rel_error": 1e-15, "verify_seconds": 4.25}
    write_results(str(tmp_path / "timed.h5"), attrs, "run: {}\n", {}, PHASES, wall,
                  np.full_like(wall, np.nan), {"hostname": ["h"]})
    rows = {os.path.basename(r["file"]): r for r in run_rows([str(tmp_path)])}
    assert rows["timed.h5"]["verify_s"] == 4.25
    assert np.isnan(rows["plain.h5"]["verify_s"])
    table = format_table(list(rows.values()))
    assert "verify_s" in table.splitlines()[0] and "4.25" in table


# -- issue 35, item 11 ----------------------------------------------------------------------------

def _write_timed(path, wall, gpu, nranks=1, **attrs):
    """A results file with the phases of PHASES, its wall and GPU-event seconds."""
    base = {"schema": "hisparse.results", "study": "strong", "study_id": "ov", "name": "t",
            "operation": "spmv", "input": "in.h5", "backend": "gpu", "precision": "fp64",
            "nranks": nranks, "nnodes": 1, "compute_phases": "kernel",
            "median_compute_seconds": 0.9, "median_total_seconds": 1.0,
            "verify_enabled": True, "verify_passed": True}
    rank_vars = attrs.pop("rank_vars", {})
    base.update(attrs)
    write_results(str(path), base, "run: {}\n", {}, PHASES, wall, gpu,
                  {"hostname": ["h"] * wall.shape[1], **rank_vars})


def _overlapping(repeats, kernel_gpu, gather_wall):
    """Per repeat (total 1 s): the kernel's CUDA events say ``kernel_gpu``; h2d and d2h 0.02 s
    each on their events; ``gather`` is wall-timed and holds the wait for the kernel."""
    wall = np.full((repeats, 1, len(PHASES)), np.nan)
    gpu = np.full_like(wall, np.nan)
    wall[0, :, :4] = 0.01
    for p, launch in (("h2d", 0.001), ("kernel", 0.001), ("d2h", 0.001)):
        wall[:, :, PHASES.index(p)] = launch
    gpu[:, :, PHASES.index("h2d")] = gpu[:, :, PHASES.index("d2h")] = 0.02
    gpu[:, :, PHASES.index("kernel")] = kernel_gpu
    wall[:, :, PHASES.index("gather")] = gather_wall
    wall[:, :, PHASES.index("total")] = 1.0
    return wall, gpu


def test_phase_shares_never_exceed_the_repeat_when_a_wait_counts_gpu_work_again(tmp_path):
    """The kernel's device time (0.9 s, its events) was counted again in the wall time of the
    gather that waited for it (0.95 s): shares of 90% + 95%. The wait is taken out of the
    wall-timed phase: compute 90%, transfers 4%, communication 6%, other 0%."""
    wall, gpu = _overlapping(3, kernel_gpu=0.9, gather_wall=0.95)
    _write_timed(tmp_path / "a.h5", wall, gpu)
    (row,) = study_rows([str(tmp_path)])
    assert row["compute_part_s"] == pytest.approx(0.9)
    assert row["transfer_part_s"] == pytest.approx(0.04)
    assert row["communication_part_s"] == pytest.approx(0.06)
    assert row["other_part_s"] == pytest.approx(0.0)
    assert row["compute_pct"] == pytest.approx(90.0)
    assert sum(row[f"{c}_pct"] for c in ("compute", "communication", "transfer", "other")) \
        == pytest.approx(100.0)


def test_overlapping_gpu_phases_share_the_repeat_in_proportion(tmp_path):
    """Streams overlap: the events add up to 1.08 s of a 1 s repeat (the issue's 108% compute
    share with 0% other). Nothing wall-timed waited, so the phases are scaled to the repeat."""
    wall, gpu = _overlapping(3, kernel_gpu=1.04, gather_wall=0.0)
    _write_timed(tmp_path / "a.h5", wall, gpu)
    (row,) = study_rows([str(tmp_path)])
    assert row["compute_pct"] == pytest.approx(100 * 1.04 / 1.08)
    assert row["transfer_pct"] == pytest.approx(100 * 0.04 / 1.08)
    assert row["compute_part_s"] + row["transfer_part_s"] == pytest.approx(1.0)
    assert row["other_pct"] == pytest.approx(0.0)


def test_single_runs_are_not_labelled_strong_and_series_show_precision_and_exchange(tmp_path):
    wall, gpu = _overlapping(2, kernel_gpu=0.5, gather_wall=0.1)
    for precision in ("fp32", "fp64"):
        _write_timed(tmp_path / f"{precision}.h5", wall, gpu, nranks=1, study="single",
                     study_id="", precision=precision)
    wall2 = np.concatenate([wall, wall], axis=1)
    gpu2 = np.concatenate([gpu, gpu], axis=1)
    _write_timed(tmp_path / "two.h5", wall2, gpu2, nranks=2, study="single", study_id="",
                 precision="fp64", rank_vars={"halo_bytes_per_product": [1000, 2400]})
    rows = study_rows([str(tmp_path)])
    assert {r["study"] for r in rows} == {"single"}
    assert sorted((r["precision"], r["nranks"]) for r in rows) == \
        [("fp32", 1), ("fp64", 1), ("fp64", 2)]
    exchange = {(r["precision"], r["nranks"]): r["exchange_bytes"] for r in rows}
    assert exchange[("fp64", 2)] == 3400 and np.isnan(exchange[("fp32", 1)])
    out = io.StringIO()
    assert report([str(tmp_path)], study=True, stdout=out, stderr=io.StringIO()) == 0
    header, _, *lines = out.getvalue().splitlines()
    columns = header.split()
    assert "precision" in columns and "exchange_bytes" in columns
    assert "strong" not in out.getvalue()
    assert sorted(line.split()[columns.index("precision") - 1] for line in lines) == \
        ["fp32", "fp64", "fp64"]  # study_id is empty: one cell fewer


def test_roofline_of_an_older_multi_gpu_file_uses_every_gpu(tmp_path):
    """Files written before the aggregate roofline hold rank 0's GPU alone: a 4-GPU run showed
    a fraction of 2.4. The report divides by the GPUs of its binding; new files record the
    aggregate and how many memories it covers (roofline_memories), used as they are."""
    wall, gpu = _overlapping(2, kernel_gpu=0.5, gather_wall=0.1)
    wall4, gpu4 = (np.concatenate([a] * 4, axis=1) for a in (wall, gpu))
    _write_timed(tmp_path / "old.h5", wall4, gpu4, nranks=4, roofline_fraction=2.4,
                 gpu_binding="n1:0,n1:1,n2:0,n2:1")
    _write_timed(tmp_path / "new.h5", wall4, gpu4, nranks=4, roofline_fraction=0.6,
                 roofline_memories=4, gpu_binding="n1:0,n1:1,n2:0,n2:1")
    rows = {os.path.basename(r["file"]): r for r in run_rows([str(tmp_path)])}
    assert rows["old.h5"]["roofline"] == pytest.approx(0.6)
    assert rows["new.h5"]["roofline"] == pytest.approx(0.6)


def test_a_truncated_or_malformed_results_file_is_named_not_skipped_silently(tmp_path):
    wall, gpu = _overlapping(2, kernel_gpu=0.5, gather_wall=0.1)
    _write_timed(tmp_path / "good.h5", wall, gpu, study="single", study_id="")
    data = (tmp_path / "good.h5").read_bytes()
    (tmp_path / "truncated.h5").write_bytes(data[:len(data) // 2])
    _write_timed(tmp_path / "bad.h5", wall, gpu, study="single", study_id="", nranks="many")
    proc = run_hisparse(["report", tmp_path], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert any(str(tmp_path / "truncated.h5") in w and "skipped" in w for w in warnings)
    assert any(str(tmp_path / "bad.h5") in w and "attribute 'nranks'" in w and "'many'" in w
               for w in warnings), warnings
    assert len(proc.stdout.strip().splitlines()) == 3  # header, rule, good.h5
    proc = run_hisparse(["report", tmp_path / "bad.h5"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "attribute 'nranks'" in proc.stderr and "bad.h5" in proc.stderr


def test_compile_seconds_shown_apart_inside_the_setup(tmp_path):
    """A run that compiled kernels (a first run on a machine): its slowest rank's compile time
    is reported as compile_s, still counted in setup_s and tts_s; a run without the record
    reports 0."""
    rng = np.random.default_rng(9)
    wall = _timings(rng, 2, 3, 1.0)
    _write(tmp_path / "compiled.h5", wall, compile_seconds=[0.004, 1.7], study_id="c")
    _write(tmp_path / "cached.h5", _timings(rng, 2, 3, 1.0), study_id="d")
    # Numba's host code too, per rank: the slowest rank's sum
    _write(tmp_path / "host.h5", _timings(rng, 2, 3, 1.0), compile_seconds=[0.5, 0.2],
           host_compile_seconds=[0.1, 0.6], study_id="h")
    rows = {row["study_id"]: row for row in study_rows([str(tmp_path)])}
    assert rows["c"]["compile_s"] == pytest.approx(1.7)
    assert rows["d"]["compile_s"] == 0.0
    assert rows["h"]["compile_s"] == pytest.approx(0.8)
    setup = sum(np.max(wall[0, :, PHASES.index(p)])
                for p in ("read", "partition", "distribute", "upload"))
    assert rows["c"]["setup_s"] == pytest.approx(setup)


def test_setup_table_shows_each_one_time_phase_on_its_slowest_rank(tmp_path, capsys):
    """``hisparse report --setup``: one row per run with every one-time phase (the slowest
    rank's seconds) beside its time to solution, as a table and as CSV; --output writes it as
    setup.csv."""
    from hisparse.report import report
    rng = np.random.default_rng(13)
    walls = {p: _timings(rng, p, 3, 1.0) for p in (1, 2)}
    for p, wall in walls.items():
        _write(tmp_path / f"s{p}.h5", wall, study_id="s")
    assert report([str(tmp_path)], setup=True, csv_out=True) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = lines[0].split(",")
    assert header[:4] == ["file", "operation", "input", "nranks"]
    assert [name for name in header if name in ("read", "partition", "distribute", "upload")] \
        == ["read", "partition", "distribute", "upload"]
    import csv as csv_module
    rows = {int(r["nranks"]): r for r in csv_module.DictReader(lines)}
    for p, wall in walls.items():
        for phase in ("read", "partition", "distribute", "upload"):
            assert float(rows[p][phase]) == pytest.approx(wall[0, :, PHASES.index(phase)].max())
        assert "kernel" not in rows[p]  # a per-repeat phase is not set-up
    out = tmp_path / "out"
    report([str(tmp_path)], setup=False, output=str(out), no_plots=True)
    assert (out / "setup.csv").read_text().splitlines()[0].startswith("file,operation")


def test_setup_with_prepare_is_the_slowest_ranks_whole_set_up(tmp_path):
    """Where the file records the driver's ``prepare`` (each rank's set-up outside its named
    phases: rank 1's wait while rank 0 analyses), the set-up is the slowest rank's sum of its
    one-time phases: rank 0's analysis and rank 1's wait for it are not both counted."""
    from hisparse.report import time_to_solution
    phases = ["startup", "read", "analysis", "distribute", "prepare", "numeric", "total"]
    nan = np.nan
    wall = np.full((2, 2, len(phases)), nan)
    # rank 0: read 0.1, analysis 2.0, distribute 0.3, prepare 0.6; rank 1: read 0.1, no
    # analysis, distribute 0.3, prepare 2.6 (the wait for rank 0's analysis and its own load)
    wall[0, 0, :5] = [0.5, 0.1, 2.0, 0.3, 0.6]
    wall[0, 1, :5] = [0.6, 0.1, nan, 0.3, 2.6]
    wall[:, :, 5] = 0.2
    wall[:, :, 6] = 0.25
    scopes = {p: "setup" for p in phases[:5]}
    scopes.update(numeric="repeat", total="repeat")
    kinds = {"startup": "startup", "read": "io", "analysis": "setup", "distribute":
             "communication", "prepare": "setup", "numeric": "compute", "total": "total"}
    run = {"phases": phases, "wall": wall, "attrs": {}, "phase_kinds": kinds,
           "phase_scopes": scopes}
    parts = time_to_solution(run)
    assert parts["setup_s"] == pytest.approx(max(0.1 + 2.0 + 0.3 + 0.6, 0.1 + 0.3 + 2.6))
    assert parts["startup_s"] == pytest.approx(0.6)
    assert parts["tts_s"] == pytest.approx(0.6 + 3.0 + 0.5)
    # without prepare (an older file): each phase's slowest rank, summed
    older = dict(run, phases=phases[:4] + phases[5:],
                 wall=np.delete(wall, phases.index("prepare"), axis=2))
    assert time_to_solution(older)["setup_s"] == pytest.approx(0.1 + 2.0 + 0.3)
