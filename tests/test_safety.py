"""Data safety (issue 16): outputs never destroy data, the output is checked before any input is
read, and every expected failure ends in one ``hisparse: error:`` line without a traceback.

Each test names the defect of issue 16 it covers (item N)."""
import gzip
import lzma
import os
import re
import time

import h5py
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from hisparse.config import config_from_dict
from hisparse.errors import ConfigError, InputError, OutputError
from hisparse.formats import CSRMatrix
from hisparse.io import (convert, read_matrix, read_results, read_tensor, write_matrix,
                         write_results)

from conftest import ROOT, run_hisparse
from helpers import write_config
from test_errors import coo_file, csr_file

QUICKSTART = ROOT / "inputs" / "quickstart.yaml"


def one_error_line(proc, needle):
    """The command failed with exactly one ``hisparse: error`` line holding ``needle`` and no
    traceback (not even one printed while the interpreter tidies up)."""
    assert proc.returncode not in (0, None), proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hisparse: error")]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    return lines[0]


def temporaries(directory):
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def _matrix(n=6, seed=0):
    return sp.random(n, n, density=0.5, random_state=seed, format="csr") + sp.eye(n)


def _dense(path, group="/"):
    return read_matrix(path, group).to_scipy().toarray()


# -- item 1: convert/generate never destroy existing data ---------------------------------------

def test_generate_refuses_an_existing_file_and_group_unless_overwrite(tmp_path):
    out = tmp_path / "a.h5"
    assert run_hisparse(["generate", "trefethen", out, "n=12"]).returncode == 0
    assert run_hisparse(["generate", "poisson", out, "dims=[3,3]", "--group", "/b"]
                        ).returncode == 0
    before = out.read_bytes()
    one_error_line(run_hisparse(["generate", "poisson", out, "dims=[4,4]"]), "the file exists")
    one_error_line(run_hisparse(["generate", "poisson", tmp_path / "c.h5", "dims"]),
                   "key 'dims': expected KEY=VALUE (e.g. dims=[64,64])")
    assert not (tmp_path / "c.h5").exists()
    one_error_line(run_hisparse(["generate", "poisson", out, "dims=[4,4]", "--group", "/b"]),
                   "group '/b' exists")
    assert out.read_bytes() == before
    # --overwrite replaces that group only
    proc = run_hisparse(["generate", "poisson", out, "dims=[4,4]", "--group", "/b", "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    from hisparse import generators
    np.testing.assert_array_equal(_dense(out, "/b"),
                                  generators.poisson([4, 4]).to_scipy().toarray())
    np.testing.assert_array_equal(_dense(out), generators.trefethen(12).to_scipy().toarray())
    assert temporaries(tmp_path) == []


def test_convert_into_a_results_file_keeps_its_groups_and_attributes(tmp_path):
    """The defect: the default --group / deleted /perf and /meta of a results file."""
    results = tmp_path / "r.h5"
    wall = np.ones((1, 1, 2))
    write_results(str(results), {"operation": "spmv"}, "x: 1", {}, ["kernel", "total"], wall,
                  wall, {"hostname": ["h"]})
    source = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(source), _matrix())
    proc = run_hisparse(["convert", source, results])
    one_error_line(proc, "pass --overwrite")
    proc = run_hisparse(["convert", source, results, "--group", "/m"])
    assert proc.returncode == 0, proc.stderr
    proc = run_hisparse(["convert", source, results, "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    run = read_results(str(results))  # /perf and /meta and the root attributes survive
    assert run["attrs"]["operation"] == "spmv" and run["config_yaml"] == "x: 1"
    np.testing.assert_allclose(_dense(results, "/m"), _matrix().toarray())
    np.testing.assert_allclose(_dense(results), _matrix().toarray())


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """Writes go through a temporary copy: a full disk in the middle changes nothing."""
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(_matrix()))
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(h5py.Group, "create_dataset", disk_full)
    with pytest.raises(OutputError, match="No space left on device"):
        write_matrix(path, CSRMatrix.from_scipy(_matrix(seed=1)), group="/b")
    with pytest.raises(OutputError, match="No space left on device"):
        write_matrix(tmp_path / "new.h5", CSRMatrix.from_scipy(_matrix()))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.h5"]


@pytest.mark.parametrize("args,needle", [
    (["missing_dir/x.h5"], "directory 'missing_dir' does not exist"),
    (["run.yaml/x.h5"], "'run.yaml' is not a directory"),
    (["run.yaml"], "is not an HDF5 file"),
])
def test_unwritable_convert_outputs_are_refused_before_reading(tmp_path, args, needle):
    (tmp_path / "run.yaml").write_text("run: {}\n")
    source = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(source), _matrix())
    proc = run_hisparse(["convert", source, *args], cwd=tmp_path)
    one_error_line(proc, needle)
    assert (tmp_path / "run.yaml").read_text() == "run: {}\n"


# -- item 2, 8: the output is checked at config load, on every rank, before the input ------------

@pytest.mark.parametrize("nprocs", [1, 2])
def test_output_dir_under_a_file_fails_before_the_input_is_read(tmp_path, nprocs):
    """The issue's example. The input does not exist either: the error must name output.dir,
    which proves the output was checked first."""
    start = time.monotonic()
    proc = run_hisparse(["run", QUICKSTART, "--set", "backend=cpu", "--set",
                         "output.dir=README.md/x", "--set", f"input.path={tmp_path}/none.h5"],
                        nprocs=nprocs, timeout=60)
    elapsed = time.monotonic() - start
    line = one_error_line(proc, "output.dir")
    assert "none.h5" not in line and "MPI_Abort" not in proc.stderr
    assert elapsed < 20  # the interpreter start-up, mostly; no compute ran


@pytest.mark.parametrize("key,value,needle", [
    ("output.filename", "{name.__class__}.h5", "placeholder {name.__class__}"),
    ("output.filename", "{name[0]}.h5", "placeholder {name[0]}"),
    ("output.filename", "{host}.h5", "placeholder {host}"),
    ("output.filename", "{nranks!r}.h5", "conversion"),
    ("output.filename", "{nranks:{name}}.h5", "nested"),
    ("output.filename", "{name", "not a valid name template"),
    ("output.filename", "../{name}.h5", "contains '/'"),
    ("output.filename", "sub/{name}.h5", "contains '/'"),
    ("output.filename", "..", "is not a file name"),
    ("output.filename", "x" * 256, "256 bytes"),
    ("run.name", "../../escape", "contains '/'"),
    ("run.name", "..", "is not a file name"),
    ("run.name", "a\nb", "control character"),
    ("run.name", "é" * 128, "256 bytes"),
])
def test_name_template_and_run_name_are_checked_at_load(key, value, needle):
    section, leaf = key.split(".")
    raw = {"operation": {"name": "spmv"}, "input": {"path": "a.h5"}, section: {leaf: value}}
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, "c.yaml")
    assert f"'{key}'" in str(info.value) and needle in str(info.value)


def test_a_long_run_name_that_fills_the_template_past_255_bytes_fails_before_the_input(tmp_path):
    config = write_config(tmp_path, "spmv", {}, run={"name": "n" * 240},
                          input={"path": str(tmp_path / "none.h5")}, backend="cpu")
    line = one_error_line(run_hisparse(["run", config]), "output.filename")
    assert "bytes long" in line and "none.h5" not in line


# -- item 5: results files never replace a file ---------------------------------------------------

def test_a_rerun_with_a_fixed_name_is_refused_before_any_work(tmp_path):
    config = write_config(tmp_path, "spmv", {}, input={"path": str(ROOT / "inputs/quickstart.h5")},
                          output={"dir": str(tmp_path / "out"), "filename": "fixed.h5"},
                          backend="cpu")
    assert run_hisparse(["run", config, "--quiet"]).returncode == 0
    first = (tmp_path / "out" / "fixed.h5").read_bytes()
    line = one_error_line(run_hisparse(["run", config, "--quiet"]), "exists already")
    assert "never replaced" in line
    assert (tmp_path / "out" / "fixed.h5").read_bytes() == first


def test_no_file_the_run_reads_can_be_the_results_file(tmp_path):
    data = tmp_path / "in.h5"
    write_matrix(data, CSRMatrix.from_scipy(_matrix(8)))
    before = data.read_bytes()
    config = write_config(tmp_path, "spmv", {}, input={"path": str(data)},
                          output={"dir": str(tmp_path), "filename": "in.h5"}, backend="cpu")
    one_error_line(run_hisparse(["run", config]), "exists already")
    assert data.read_bytes() == before
    # A file named in operation.params that does not exist yet (as a checkpoint may not).
    config = write_config(tmp_path, "spmv", {"x": f"{tmp_path}/x.h5:/x"}, input={"path": str(data)},
                          output={"dir": str(tmp_path), "filename": "x.h5"}, backend="cpu")
    one_error_line(run_hisparse(["run", config]), "would be the file of operation.params.x")


def test_a_results_name_taken_during_the_run_gets_the_run_id(tmp_path):
    """The name was free at the start; someone created it meanwhile: the results go beside it."""
    path = tmp_path / "r.h5"
    path.write_bytes(b"someone else's file")
    wall = np.ones((1, 1, 2))
    args = ({"operation": "spmv"}, "x: 1", {}, ["kernel", "total"], wall, wall,
            {"hostname": ["h"]})
    written = write_results(str(path), *args, run_id="0badcafe")
    assert written == str(tmp_path / "r__0badcafe.h5")
    assert read_results(written)["attrs"]["operation"] == "spmv"
    assert path.read_bytes() == b"someone else's file"
    with pytest.raises(OutputError, match="never replaced|appeared"):
        write_results(str(path), *args)
    assert path.read_bytes() == b"someone else's file" and temporaries(tmp_path) == []


# -- item 7: expected failures are one line (malformed HDF5 inputs: test_errors.py) -------------

def test_a_config_that_is_not_utf8_or_repeats_a_key(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"run: {name: t}\n# caf\xe9\noperation: {name: spmv}\n")
    one_error_line(run_hisparse(["run", latin]), "not UTF-8 text (byte 0xe9 on line 2)")
    twice = tmp_path / "twice.yaml"
    twice.write_text("run: {name: t, repeats: 2}\noperation: {name: spmv}\nrun: {warmup: 0}\n")
    line = one_error_line(run_hisparse(["run", twice]), "duplicate key 'run' (first on line 1)")
    assert "line 3" in line


def _gzip_truncated(path):
    data = gzip.compress(b"1 1 1 1.0\n2 2 2 2.0\n" * 50)
    path.write_bytes(data[: len(data) // 2])


def _not_gzip(path):
    path.write_bytes(b"plain text pretending")


def _xz_truncated(path):
    data = lzma.compress(b"1 1 1 1.0\n" * 50)
    path.write_bytes(data[:20])


def _bz2_garbage(path):
    path.write_bytes(b"BZh9garbage")


@pytest.mark.parametrize("name,make", [("t.tns.gz", _gzip_truncated), ("t.tns.gz", _not_gzip),
                                       ("t.tns.xz", _xz_truncated), ("t.tns.bz2", _bz2_garbage)])
def test_corrupt_compressed_sources_are_one_line(tmp_path, name, make):
    make(tmp_path / name)
    proc = run_hisparse(["convert", tmp_path / name, tmp_path / "o.h5"])
    one_error_line(proc, "corrupt or truncated compressed file")
    assert not (tmp_path / "o.h5").exists() and temporaries(tmp_path) == []


def test_a_binary_source_is_not_text(tmp_path):
    (tmp_path / "b.tns").write_bytes(b"1 1 \xff\xfe 1.0\n")
    one_error_line(run_hisparse(["convert", tmp_path / "b.tns", tmp_path / "o.h5"]),
                   "not a text file")


def test_info_on_a_malformed_group_says_what_is_wrong(tmp_path):
    path = tmp_path / "m.h5"
    write_matrix(path, CSRMatrix.from_scipy(_matrix()), group="/good")
    with h5py.File(path, "a") as handle:
        bad = handle.create_group("bad")
        bad.attrs["format"] = "csr"
        bad.attrs["shape"] = [3, 3]
        bad["indptr"] = np.zeros(4, int)
    proc = run_hisparse(["info", path])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "/bad: malformed csr group: dataset 'indices' missing" in proc.stdout
    assert "/good: CSR matrix 6 x 6" in proc.stdout


# -- item 9: bad values are refused, not accepted silently ---------------------------------------

@pytest.mark.parametrize("name,text,needle", [
    ("t.tns", "1 1 1 1.0\n2 2.5 1 2.0\n", "coordinates must be whole numbers; data line 2, "
                                          "column 2 holds 2.5"),
    ("g.txt", "# edges\n0 1\n1.5 2\n", "node ids must be whole numbers; data line 2, column 1"),
    ("u.data", "1\t10\t5\t86400.5\n", "user, movie and time ids must be whole numbers"),
])
def test_fractional_ids_are_refused(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=re.escape(needle)):
        convert(str(tmp_path / name), str(tmp_path / "o.h5"))
    assert not (tmp_path / "o.h5").exists()


def test_movielens_half_star_ratings_are_kept(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::10::3.5::86400\n2::10::4::86400\n")
    tensor = convert(str(tmp_path / "ratings.dat"), str(tmp_path / "o.h5"))
    assert sorted(tensor.values.tolist()) == [3.5, 4.0]


def test_skew_symmetric_mtx_is_expanded_and_not_marked_symmetric(tmp_path):
    lower = sp.tril(sp.random(7, 7, density=0.5, random_state=2), -1).tocoo()
    source = tmp_path / "s.mtx"
    scipy.io.mmwrite(str(source), lower, symmetry="skew-symmetric")
    convert(str(source), str(tmp_path / "s.h5"))
    back = read_matrix(tmp_path / "s.h5")
    assert not back.symmetric
    np.testing.assert_allclose(back.to_scipy().toarray(), (lower - lower.T).toarray())


def test_malformed_mtx_gives_one_line_and_no_late_traceback(tmp_path):
    """SciPy's reader threads outlived the closed handle and printed a traceback after the
    error line (item 11)."""
    source = tmp_path / "bad.mtx"
    source.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n2 x 2.0\n")
    one_error_line(run_hisparse(["convert", source, tmp_path / "o.h5"]), "malformed Matrix Market")
    source.write_text("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1.0 2.0\n")
    one_error_line(run_hisparse(["convert", source, tmp_path / "o.h5"]), "complex matrices")
    assert not (tmp_path / "o.h5").exists()


def _fp32_config(tmp_path, data):
    csr_file(tmp_path / "in.h5", [2, 2], np.array([0, 2, 3]), np.array([0, 1, 1]),
              np.array(data))
    return write_config(tmp_path, "spmv", {"x": "ones"}, input={"path": str(tmp_path / "in.h5")},
                        backend="cpu", precision="fp32")


def test_fp32_overflow_of_an_input_value_is_named(tmp_path):
    proc = run_hisparse(["run", _fp32_config(tmp_path, [1e300, 1.0, 1.0]), "--quiet"])
    # Read by rows (SpMV), the entry is named by its row and column.
    line = one_error_line(proc, "value 1e+300 at row 0, column 0 overflows fp32")
    assert "RuntimeWarning" not in proc.stderr and "in.h5" in line


def test_fp32_overflow_in_the_result_is_reported_as_overflow(tmp_path):
    # Each value fits fp32; their sum (6e38, row 0 of A @ ones) does not.
    proc = run_hisparse(["run", _fp32_config(tmp_path, [3e38, 3e38, 1.0]), "--quiet"])
    assert proc.returncode == 3
    line = one_error_line(proc, "the result holds 1 Inf/NaN values")
    assert "fp32 overflows" in line and "max relative error" not in line


# -- item 12: clear messages ---------------------------------------------------------------------

def test_report_on_a_directory_of_corrupt_files_says_so(tmp_path):
    (tmp_path / "a.h5").write_bytes(b"\x89HDF\r\n\x1a\n truncated after the signature")
    (tmp_path / "b.h5").write_bytes(b"not HDF5 at all")
    line = one_error_line(run_hisparse(["report", tmp_path]), "not readable HDF5")
    assert "2 .h5 file(s)" in line


def test_tensor_reader_names_mismatched_per_mode_datasets(tmp_path):
    coo_file(tmp_path / "t.h5", shape=[3, 3], index0=np.array([0, 1]), index1=np.array([0]),
              values=np.ones(2))
    with pytest.raises(InputError, match=r"index0 \(2,\), index1 \(1,\)"):
        read_tensor(tmp_path / "t.h5")


# -- issue 35, items 2 and 3: one guard for every file written ------------------------------------

def _cpals_config(tmp_path, checkpoint, input_path=None, name="ck.yaml", out="out", **params):
    """A two-iteration CP-ALS run on the amino-acid tensor writing ``checkpoint`` each iteration."""
    source = input_path or str(ROOT / "inputs" / "aminoacid.h5")
    params = dict({"rank": 2, "max_iters": 2, "tol": 0, "checkpoint_every": 1,
                   "checkpoint": str(checkpoint)}, **params)
    return write_config(tmp_path, "cpals", params, name=name, out=out,
                        run={"repeats": 1, "warmup": 0}, input={"path": source},
                        backend="cpu")


def _refused_before_the_compute(proc, tmp_path, *needles):
    line = one_error_line(proc, "operation.params.checkpoint")
    for needle in needles:
        assert needle in line, line
    assert "iteration" not in proc.stdout  # no ALS iteration ran
    assert not list((tmp_path / "out").glob("*.h5"))  # no results
    assert temporaries(tmp_path) == []
    return line


def test_a_checkpoint_never_replaces_a_foreign_file(tmp_path):
    """The issue's cases: the run's own input, another run's results file and a YAML config were
    each overwritten with a checkpoint, rc 0. Each is refused before the input is read, and
    left as it was."""
    tensor = tmp_path / "tensor.h5"
    tensor.write_bytes((ROOT / "inputs" / "aminoacid.h5").read_bytes())
    results = tmp_path / "results.h5"
    wall = np.ones((1, 1, 2))
    write_results(str(results), {"operation": "spmv", "schema": "hisparse.results"}, "x: 1", {},
                  ["kernel", "total"], wall, wall, {"hostname": ["h"]})
    yaml_file = tmp_path / "other.yaml"
    yaml_file.write_text("run: {name: other}\n")
    for victim, needle in ((tensor, "input.path, which the run reads"),
                           (results, "not a checkpoint of hisparse"),
                           (yaml_file, "not a checkpoint of hisparse")):
        before = victim.read_bytes()
        config = _cpals_config(tmp_path, victim, input_path=str(tensor))
        _refused_before_the_compute(run_hisparse(["run", config, "--quiet"]), tmp_path,
                                    str(victim), needle)
        assert victim.read_bytes() == before


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_bad_checkpoint_path_stops_every_rank_before_the_compute(tmp_path, nprocs):
    """A directory, a missing directory and a read-only directory were found only after the
    compute (a directory left a 1.3 MB temporary behind)."""
    (tmp_path / "adir").mkdir()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        cases = [(tmp_path / "adir", "is a directory"),
                 (tmp_path / "nowhere" / "ck.h5", "does not exist")]
        if not os.access(locked, os.W_OK):  # root writes anywhere
            cases.append((locked / "ck.h5", "cannot write"))
        for path, needle in cases:
            config = _cpals_config(tmp_path, path)
            proc = run_hisparse(["run", config, "--quiet"], nprocs=nprocs)
            _refused_before_the_compute(proc, tmp_path, needle)
            assert proc.returncode == 2
        assert os.listdir(tmp_path / "adir") == [] and os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_a_checkpoint_replaces_its_own_previous_checkpoint(tmp_path):
    checkpoint = tmp_path / "ck.h5"
    config = _cpals_config(tmp_path, checkpoint)
    assert run_hisparse(["run", config, "--quiet"]).returncode == 0
    with h5py.File(checkpoint, "r") as handle:
        assert handle.attrs["schema"] == "hisparse.cpals_checkpoint"
        assert handle.attrs["iteration"] == 2
    config = _cpals_config(tmp_path, checkpoint, max_iters=3)
    proc = run_hisparse(["run", config, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(checkpoint, "r") as handle:
        assert handle.attrs["iteration"] == 3
    assert temporaries(tmp_path) == []


def test_a_checkpoint_that_appears_during_the_run_is_not_replaced(tmp_path):
    """The guard checks again when it publishes: a foreign file created after the run's check."""
    from hisparse.io import atomic_file
    path = tmp_path / "ck.h5"
    with pytest.raises(OutputError, match="not a checkpoint of hisparse"):
        with atomic_file(path, what="checkpoint", replaces="hisparse.cpals_checkpoint") as out:
            out.h5().attrs["schema"] = "hisparse.cpals_checkpoint"
            path.write_text("appeared meanwhile")
    assert path.read_text() == "appeared meanwhile" and temporaries(tmp_path) == []


def _disk_full_after_writing(monkeypatch):
    """Make h5py's dataset creation write its data, then fail as a full disk does (ENOSPC)."""
    import errno
    original = h5py.Group.create_dataset

    def create_dataset(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(h5py.Group, "create_dataset", create_dataset)


def test_a_full_disk_in_each_writer_is_one_error_naming_the_file(tmp_path, monkeypatch):
    """convert (compressed), the results file (gzip /result) and a checkpoint: each raises one
    OutputError naming its file and saying the device is full, and leaves no temporary."""
    from hisparse.ops.cpals.checkpoint import write_checkpoint
    source = tmp_path / "m.mtx"
    scipy.io.mmwrite(str(source), _matrix(40))
    _disk_full_after_writing(monkeypatch)
    out = tmp_path / "m.h5"
    with pytest.raises(OutputError) as info:
        convert(str(source), str(out))
    assert str(out) in str(info.value) and "No space left on device" in str(info.value)
    wall = np.ones((1, 1, 2))
    results = tmp_path / "r.h5"
    with pytest.raises(OutputError) as info:
        write_results(str(results), {"operation": "spmv"}, "x: 1", {}, ["kernel", "total"],
                      wall, wall, {"hostname": ["h"]}, result={"y": np.arange(1000.0)},
                      compression="gzip")
    assert str(results) in str(info.value) and "No space left on device" in str(info.value)
    factors = [np.ones((3, 2)), np.ones((4, 2))]
    checkpoint = tmp_path / "ck.h5"
    with pytest.raises(OutputError) as info:
        write_checkpoint(str(checkpoint), {"factors": factors, "grams": [np.eye(2)] * 2,
                                           "lam": np.ones(2), "fits": [0.5],
                                           "fingerprint": {"rank": 2}})
    assert str(checkpoint) in str(info.value) and "checkpoint" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["m.mtx"]


def _file_size_limit(limit):
    """For a child process: writes past ``limit`` bytes fail with EFBIG, as on a full disk (a
    tiny file system needs root; the file size limit does not). Python ignores SIGXFSZ."""
    import resource

    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _run_limited(args, limit, cwd, warm_up):
    """``hisparse ARGS`` with writes limited to ``limit`` bytes per file, after ``warm_up`` (the
    same command on a small input, unlimited) has written the compiled-code caches, so the limit
    meets the output file and nothing else."""
    import subprocess
    import sys
    from conftest import mpi_env
    env = dict(mpi_env(), PYTHONDONTWRITEBYTECODE="1")
    warm = subprocess.run([sys.executable, "-m", "hisparse", *map(str, warm_up)],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert warm.returncode == 0, warm.stderr
    return subprocess.run([sys.executable, "-m", "hisparse", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
                          preexec_fn=_file_size_limit(limit))


def test_a_really_full_disk_during_a_compressed_write_is_one_line(tmp_path):
    """The issue's crash: HDF5's chunk cache met the full disk only when the file was closed,
    where h5py segfaulted (rc 139) and left the hidden temporary behind, keeping the disk full.
    ``generate`` (gzip datasets) and ``run`` with ``output.compression: gzip``."""
    out, warm = tmp_path / "big.h5", tmp_path / "warm" / "small.h5"
    warm.parent.mkdir()
    proc = _run_limited(["generate", "random_matrix", out, "rows=20000", "cols=20000",
                         "nnz_per_row=10"], 300_000, tmp_path,
                        warm_up=["generate", "random_matrix", warm, "rows=50", "cols=50"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc, str(out))
    assert "File too large" in line and "nothing was written" in line
    assert sorted(os.listdir(tmp_path)) == ["warm"]
    spec = {"generate": {"kind": "poisson", "dims": [300, 300]}}
    run = {"repeats": 1, "warmup": 0}
    config = write_config(tmp_path, "spmv", {}, out="res", backend="cpu", input=spec,
                          output={"dir": str(tmp_path / "res"), "compression": "gzip"}, run=run)
    small = write_config(tmp_path, "spmv", {}, name="small.yaml", out="warm", backend="cpu",
                         input={"generate": {"kind": "poisson", "dims": [10, 10]}}, run=run)
    proc = _run_limited(["run", config, "--quiet"], 200_000, tmp_path,
                        warm_up=["run", small, "--quiet"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    one_error_line(proc, "cannot write the results file")
    assert os.listdir(tmp_path / "res") == []


# -- issue 35, item 8: paths expand; broken links and missing files are one clear line -----------

def _hisparse_with_env(args, cwd, **env):
    import subprocess
    import sys
    from conftest import mpi_env
    return subprocess.run([sys.executable, "-m", "hisparse", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=dict(mpi_env(), **env))


def test_home_and_variables_expand_in_every_config_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HS_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("HS_UNSET", raising=False)
    raw = {"operation": {"name": "cpals", "params": {"checkpoint": "$HOME/ck.h5",
                                                     "checkpoint_every": 1,
                                                     "init": "${HS_DATA}/init.h5:/f"}},
           "input": {"path": "~/in.h5"}, "output": {"dir": "$HS_DATA/out"},
           "gpu": {"cache_dir": "~/cache"}}
    config = config_from_dict(raw)
    assert config["input.path"] == str(tmp_path / "home" / "in.h5")
    assert config["output.dir"] == str(tmp_path / "data" / "out")
    assert config["gpu.cache_dir"] == str(tmp_path / "home" / "cache")
    assert config["operation.params"]["checkpoint"] == str(tmp_path / "home" / "ck.h5")
    assert config["operation.params"]["init"] == str(tmp_path / "data" / "init.h5") + ":/f"
    spmv = config_from_dict({"operation": {"name": "spmv", "params": {"x": "~/x.h5:/x"}},
                             "input": {"path": "a.h5"}})
    assert spmv["operation.params"]["x"] == str(tmp_path / "home" / "x.h5") + ":/x"
    raw["output"]["dir"] = "$HS_UNSET/out"
    with pytest.raises(ConfigError, match="output.dir.*HS_UNSET, which is not set"):
        config_from_dict(raw)


def test_a_run_and_convert_write_under_home_not_into_a_folder_named_tilde(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    config = write_config(work, "spmv", {}, input={"path": "$HS_IN"},
                          output={"dir": "~/res"}, backend="cpu",
                          run={"repeats": 1, "warmup": 0})
    proc = _hisparse_with_env(["run", config, "--quiet"], work, HOME=str(home),
                              HS_IN=str(QUICKSTART.with_suffix(".h5")))
    assert proc.returncode == 0, proc.stderr
    assert len(list((home / "res").glob("*.h5"))) == 1
    source = work / "m.mtx"
    scipy.io.mmwrite(str(source), _matrix())
    proc = _hisparse_with_env(["convert", "$HS_SRC", "~/m.h5"], work, HOME=str(home),
                              HS_SRC=str(source))
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(_dense(home / "m.h5"), _matrix().toarray())
    assert sorted(os.listdir(work)) == ["m.mtx", "run.yaml"]  # no '~', '$HS_IN', '$HOME' folders
    proc = _hisparse_with_env(["generate", "poisson", "$HS_UNSET/p.h5", "dims=[3,3]"], work)
    assert proc.returncode == 2 and "HS_UNSET, which is not set" in proc.stderr


@pytest.mark.parametrize("group,needle", [
    ("dangling", "soft link '/dangling' -> '/nothing' dangles"),
    ("loop_a", "soft link '/loop_a' -> '/loop_b' loops"),
    ("ext", "external link '/ext' -> 'missing.h5:/g' cannot be followed"),
    ("ext_self/m", "external link '/ext_self' -> 'links.h5:/ext_self' loops"),
])
def test_broken_links_in_input_group_are_one_line_naming_file_and_link(tmp_path, group, needle):
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as handle:
        handle["dangling"] = h5py.SoftLink("/nothing")
        handle["loop_a"] = h5py.SoftLink("/loop_b")
        handle["loop_b"] = h5py.SoftLink("/loop_a")
        handle["ext"] = h5py.ExternalLink("missing.h5", "/g")
        handle["ext_self"] = h5py.ExternalLink("links.h5", "/ext_self")
    config = write_config(tmp_path, "spmv", {}, input={"path": str(path), "group": group},
                          backend="cpu")
    line = one_error_line(run_hisparse(["run", config], cwd=tmp_path), needle)
    assert str(path) in line and f"group '{group}'" in line


def test_a_missing_relative_input_says_where_it_was_looked_for(tmp_path):
    config = write_config(tmp_path, "spmv", {}, input={"path": "data/x.h5"}, backend="cpu")
    line = one_error_line(run_hisparse(["run", config], cwd=tmp_path),
                          "taken from the working directory")
    assert f"tried {tmp_path / 'data' / 'x.h5'}" in line


def test_broken_links_in_files_named_by_operation_params_are_one_line(tmp_path):
    """The same for an SpMV x vector and CP-ALS initial factors read from HDF5 files."""
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as handle:
        handle["dangling"] = h5py.SoftLink("/nothing")
        handle["ext"] = h5py.ExternalLink("missing.h5", "/g")
    config = write_config(tmp_path, "spmv", {"x": f"{path}:/dangling"}, backend="cpu",
                          input={"path": str(QUICKSTART.with_suffix(".h5"))})
    line = one_error_line(run_hisparse(["run", config], cwd=tmp_path),
                          "soft link '/dangling' -> '/nothing' dangles")
    assert "(operation.params.x)" in line and str(path) in line
    config = write_config(tmp_path, "cpals", {"rank": 2, "init": f"{path}:/ext"}, backend="cpu",
                          input={"path": str(ROOT / "inputs" / "aminoacid.h5")})
    line = one_error_line(run_hisparse(["run", config], cwd=tmp_path),
                          "external link '/ext' -> 'missing.h5:/g' cannot be followed")
    assert "(operation.params.init)" in line
