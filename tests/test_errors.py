"""User errors end the run with one clear line and a non-zero exit, within seconds, on one rank
and under mpiexec; a failing or killed rank takes the job down without a hang or a results file."""
import time

import h5py
import numpy as np
import pytest

from hisparse.formats import CSRMatrix
from hisparse.io import write_matrix

from conftest import run_hisparse

GOOD = {
    "run": "{name: t, repeats: 1, warmup: 0}",
    "operation": "{name: spmv}",
    "backend": "cpu",
}


def _small_matrix(path, nrows=6):
    dense = np.eye(nrows) * 2.0
    write_matrix(path, CSRMatrix.from_scipy(__import__("scipy.sparse").sparse.csr_matrix(dense)))


def csr_file(path, shape, indptr, indices, data):
    """A CSR group at the root of ``path`` holding exactly these (possibly malformed) arrays."""
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "csr"
        handle.attrs["shape"] = shape
        handle["indptr"], handle["indices"], handle["data"] = indptr, indices, data


def coo_file(path, **datasets):
    """A COO group at the root of ``path``: ``shape=`` and the datasets given."""
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = datasets.pop("shape")
        for name, value in datasets.items():
            handle[name] = value


def _write_config(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def _config_text(tmp_path, input_path, **sections):
    body = dict(GOOD, input=f"{{path: {input_path}}}", output=f"{{dir: {tmp_path / 'out'}}}")
    body.update(sections)
    return "\n".join(f"{k}: {v}" for k, v in body.items()) + "\n"


def _case_missing_input(tmp_path):
    return _write_config(tmp_path, _config_text(tmp_path, tmp_path / "nope.h5")), "nope.h5"


def _case_malformed_yaml(tmp_path):
    return _write_config(tmp_path, "run: {name: t\noperation: [\n"), "malformed YAML"


def _case_unknown_key(tmp_path):
    _small_matrix(tmp_path / "a.h5")
    text = _config_text(tmp_path, tmp_path / "a.h5", run="{name: t, repeets: 3}")
    return _write_config(tmp_path, text), "run.repeets"


def _case_wrong_type(tmp_path):
    _small_matrix(tmp_path / "a.h5")
    text = _config_text(tmp_path, tmp_path / "a.h5", run="{name: t, repeats: many}")
    return _write_config(tmp_path, text), "run.repeats"


def _case_missing_dataset(tmp_path):
    path = tmp_path / "a.h5"
    _small_matrix(path)
    with h5py.File(path, "a") as handle:
        del handle["indices"]
    return _write_config(tmp_path, _config_text(tmp_path, path)), "indices"


def _matrix_with_changed_dataset(tmp_path, name, index, value):
    """The small matrix with entry ``index`` of dataset ``name`` set to ``value``; its config."""
    path = tmp_path / "a.h5"
    _small_matrix(path)
    with h5py.File(path, "a") as handle:
        array = handle[name][()]
        array[index] = value
        del handle[name]
        handle[name] = array
    return _write_config(tmp_path, _config_text(tmp_path, path))


def _case_index_out_of_range(tmp_path):
    return _matrix_with_changed_dataset(tmp_path, "indices", 3, 99), "column index 99"


def _case_nan_value(tmp_path):
    return _matrix_with_changed_dataset(tmp_path, "data", 2, np.nan), "NaN"


def _case_x_wrong_length(tmp_path):
    path = tmp_path / "a.h5"
    _small_matrix(path)
    with h5py.File(tmp_path / "x.h5", "w") as handle:
        handle["x"] = np.ones(5)
    text = _config_text(tmp_path, path,
                        operation=f"{{name: spmv, params: {{x: '{tmp_path / 'x.h5'}:/x'}}}}")
    return _write_config(tmp_path, text), "expected (6,)"


def _case_more_ranks_than_rows(tmp_path):
    path = tmp_path / "a.h5"
    _small_matrix(path, nrows=1)
    return _write_config(tmp_path, _config_text(tmp_path, path)), "more ranks"


def _case_huge_shape(tmp_path):
    # A valid structure whose column count cannot be allocated (x has one entry per column).
    csr_file(tmp_path / "a.h5", [4, 2 ** 55], np.arange(5), np.arange(4), np.ones(4))
    # Refused before the read by the memory estimate (hisparse.estimate), or out of memory.
    return _write_config(tmp_path, _config_text(tmp_path, tmp_path / "a.h5")), "memory"


def _case_shape_beyond_int64(tmp_path):
    csr_file(tmp_path / "a.h5", [4, 1e30], np.arange(5), np.arange(4), np.ones(4))
    return _write_config(tmp_path, _config_text(tmp_path, tmp_path / "a.h5")), "sizes must lie"


def _case_two_dimensional_indptr(tmp_path):
    csr_file(tmp_path / "a.h5", [8, 8], np.zeros((3, 3), int), np.zeros(0, int), np.zeros(0))
    return (_write_config(tmp_path, _config_text(tmp_path, tmp_path / "a.h5")),
            "indptr must be 1-D, got shape (3, 3)")


def _case_empty_matrix(tmp_path):
    csr_file(tmp_path / "a.h5", [0, 0], np.zeros(1, int), np.zeros(0, int), np.zeros(0))
    return (_write_config(tmp_path, _config_text(tmp_path, tmp_path / "a.h5")),
            "the matrix has no rows")


def _case_two_dimensional_values(tmp_path):
    coo_file(tmp_path / "a.h5", shape=[3, 3, 3], indices=np.array([[0, 1, 2], [1, 1, 1]]),
             values=np.ones((2, 2)))
    text = _config_text(tmp_path, tmp_path / "a.h5", operation="{name: sptv}")
    return _write_config(tmp_path, text), "values must be 1-D"


def _case_per_mode_lengths(tmp_path):
    coo_file(tmp_path / "a.h5", shape=[3, 3, 3], index0=np.array([0, 1]),
             index1=np.array([0, 1, 2]), index2=np.array([0, 1]), values=np.ones(2))
    text = _config_text(tmp_path, tmp_path / "a.h5", operation="{name: sptv}")
    return _write_config(tmp_path, text), "index1 (3,)"


CASES = {
    # issue 16, item 7: malformed sizes and shapes are one line too, not a traceback
    "huge_shape": _case_huge_shape,
    "shape_beyond_int64": _case_shape_beyond_int64,
    "two_dimensional_indptr": _case_two_dimensional_indptr,
    "empty_matrix": _case_empty_matrix,
    "two_dimensional_values": _case_two_dimensional_values,
    "per_mode_lengths": _case_per_mode_lengths,
    "missing_input": _case_missing_input,
    "malformed_yaml": _case_malformed_yaml,
    "unknown_key": _case_unknown_key,
    "wrong_type": _case_wrong_type,
    "missing_dataset": _case_missing_dataset,
    "index_out_of_range": _case_index_out_of_range,
    "nan_value": _case_nan_value,
    "x_wrong_length": _case_x_wrong_length,
    "more_ranks_than_rows": _case_more_ranks_than_rows,
}


@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_user_error_gives_one_clear_line(tmp_path, case, nprocs):
    if case == "more_ranks_than_rows" and nprocs == 1:
        pytest.skip("one rank always has enough rows")
    config, needle = CASES[case](tmp_path)
    start = time.monotonic()
    proc = run_hisparse(["run", config], nprocs=nprocs, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("hisparse: error")]
    assert len(error_lines) == 1, proc.stderr
    assert needle in error_lines[0]
    assert "Traceback" not in proc.stderr and "MPI_Abort" not in proc.stderr
    assert elapsed < 30
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.h5"))


def test_unknown_key_suggests_the_right_one(tmp_path):
    config, _ = _case_unknown_key(tmp_path)
    proc = run_hisparse(["run", config])
    assert "did you mean 'run.repeats'" in proc.stderr
    assert str(config) in proc.stderr


@pytest.mark.parametrize("mode", ["raise", "kill"])
@pytest.mark.parametrize("phase", ["read", "compute", "gather"])
def test_failing_rank_aborts_job_without_hang_or_results(tmp_path, mode, phase):
    path = tmp_path / "a.h5"
    _small_matrix(path, nrows=40)
    text = _config_text(tmp_path, path, debug=f"{{fail_rank: 1, fail_phase: {phase}, "
                                              f"fail_mode: {mode}}}")
    config = _write_config(tmp_path, text)
    start = time.monotonic()
    proc = run_hisparse(["run", config], nprocs=2, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - start < 45
    if mode == "raise":
        assert "rank 1" in proc.stderr and "injected fault" in proc.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.h5*"))


@pytest.mark.parametrize("fail_rank,phase", [(1, "parts"), (0, "parts"), (0, "results")])
def test_full_disk_while_writing_parts_leaves_no_part_files(tmp_path, fail_rank, phase):
    """output.collect: parts, and a rank's disk fills (ENOSPC) while writing its part file, or
    rank 0's while writing the results file after every part was written: one clear error line,
    no hang, and no orphan part files (each rank takes back the part it wrote in this run)."""
    path = tmp_path / "a.h5"
    _small_matrix(path, nrows=40)
    text = _config_text(tmp_path, path, output=f"{{dir: {tmp_path / 'out'}, collect: parts}}",
                        debug=f"{{fail_rank: {fail_rank}, fail_phase: {phase}, "
                              f"fail_mode: enospc}}")
    proc = run_hisparse(["run", _write_config(tmp_path, text)], nprocs=2, timeout=60)
    assert proc.returncode != 0
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("hisparse: error")]
    assert len(error_lines) == 1, proc.stderr
    assert "no space left on device" in error_lines[0] and "MPI_Abort" not in proc.stderr
    assert not list((tmp_path / "out").glob("*.h5*")), list((tmp_path / "out").iterdir())


def test_sigterm_while_writing_parts_leaves_nothing(tmp_path):
    """SIGTERM reaches rank 0 while the part files are written: the job stops before the
    results file, says nothing was written, and indeed leaves no part file behind."""
    path = tmp_path / "a.h5"
    _small_matrix(path, nrows=40)
    text = _config_text(tmp_path, path, output=f"{{dir: {tmp_path / 'out'}, collect: parts}}",
                        debug="{fail_rank: 0, fail_phase: parts, fail_mode: sigterm}")
    proc = run_hisparse(["run", _write_config(tmp_path, text)], nprocs=2, timeout=60)
    assert proc.returncode == 128 + 15, proc.stderr
    assert "SIGTERM" in proc.stderr and "nothing written" in proc.stderr
    assert not list((tmp_path / "out").glob("*.h5*")), list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("nprocs", [1, 2])
def test_failed_verification_keeps_results_and_exits_3_on_every_rank(tmp_path, nprocs):
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(
        __import__("scipy.sparse").sparse.random(50, 40, density=0.3, random_state=1,
                                                 format="csr")))
    # fp32 values against the fp64 reference cannot meet a 1e-15 tolerance.
    text = _config_text(tmp_path, path, precision="fp32", verify="{enabled: true, rtol: 1.0e-15}")
    proc = run_hisparse(["run", _write_config(tmp_path, text)], nprocs=nprocs, timeout=60)
    assert proc.returncode == 3, proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("hisparse: error")]
    assert len(error_lines) == 1 and "verification failed" in error_lines[0], proc.stderr
    assert "MPI_Abort" not in proc.stderr
    assert len(list((tmp_path / "out").glob("*.h5"))) == 1
