"""The memory estimate before a run (hisparse.estimate, each operation's estimate_memory),
``hisparse run --dry-run`` and ``hisparse --version``."""
import numpy as np
import pytest
import yaml

import hisparse
from hisparse import estimate as est
from hisparse.config import config_from_dict
from hisparse.errors import ResourceError
from hisparse.generators import generate, validate_spec
from hisparse.io import read_matrix, read_tensor, write_matrix, write_tensor
from hisparse.ops import get_operation_class

from conftest import ROOT, run_hisparse

QUICKSTART = ROOT / "inputs" / "quickstart.yaml"


def _config(operation, params=None, **input_section):
    return config_from_dict({"run": {"name": "e"}, "backend": "cpu",
                             "operation": {"name": operation, "params": params or {}},
                             "input": input_section}, source="test.yaml")


def test_version():
    proc = run_hisparse(["--version"])
    assert proc.returncode == 0 and proc.stdout.strip() == f"hisparse {hisparse.__version__}"


# -- the input's header -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    {"kind": "poisson", "dims": [7, 5]}, {"kind": "poisson", "dims": [7, 5], "stencil": 9},
    {"kind": "poisson", "dims": [4, 3, 5]}, {"kind": "poisson", "dims": [4, 3, 5], "stencil": 27},
    {"kind": "trefethen", "n": 1}, {"kind": "trefethen", "n": 2}, {"kind": "trefethen", "n": 77},
    {"kind": "trefethen", "n": 128},
])
def test_generated_headers_count_the_nonzeros_the_generator_makes(spec):
    header = est.input_header(_config("spmv", generate=spec))
    matrix = generate(validate_spec(dict(spec)))
    assert header.exact and header.shape == tuple(matrix.shape) and header.nnz == matrix.nnz


def test_rmat_and_random_headers_bound_what_is_made():
    for spec in ({"kind": "rmat", "scale": 9, "edge_factor": 8},
                 {"kind": "random_matrix", "rows": 300, "nnz_per_row": 5},
                 {"kind": "random_matrix", "rows": 300, "cols": 20, "nnz_per_row": 12},
                 {"kind": "random_matrix", "rows": 300, "nnz_per_row": 9, "power_law": 1.2}):
        header = est.input_header(_config("spmv", generate=spec))
        made = generate(validate_spec(dict(spec))).nnz
        assert not header.exact and made / 2.5 <= header.nnz <= made, (spec, header.nnz, made)


def test_file_header_and_part_bytes_match_the_arrays_read(tmp_path):
    """Shape and nonzeros from the HDF5 group without reading it; the bytes of the whole
    matrix in the run's dtypes equal the arrays the run holds."""
    matrix = generate({"kind": "random_matrix", "rows": 500, "cols": 300, "nnz_per_row": 7})
    path = tmp_path / "m.h5"
    write_matrix(path, matrix, "/a")
    for precision, index_width in (("fp64", "auto"), ("fp32", "int64")):
        config = config_from_dict({"operation": {"name": "spmv"}, "precision": precision,
                                   "index_width": index_width,
                                   "input": {"path": str(path), "group": "/a"}})
        header = est.input_header(config)
        read = read_matrix(path, "/a")
        assert header.shape == (500, 300) and header.nnz == read.nnz
        value = np.dtype(np.float64 if precision == "fp64" else np.float32)
        index = np.dtype(np.int32 if index_width == "auto" else np.int64)
        held = ((read.nrows + 1) * index.itemsize + read.nnz * (index.itemsize + value.itemsize))
        assert header.part_bytes(1) == held
        assert header.part_bytes(4) < held / 3.9
    tensor = generate({"kind": "random_tensor", "dims": [20, 30, 10], "nnz": 400})
    write_tensor(tmp_path / "t.h5", tensor)
    header = est.input_header(_config("sptv", path=str(tmp_path / "t.h5")))
    read = read_tensor(tmp_path / "t.h5")
    assert header.kind == "tensor" and header.shape == (20, 30, 10) and header.nnz == read.nnz
    assert header.part_bytes(1) == read.indices.nbytes + read.values.nbytes
    # a missing file has no header: the read phase reports it
    assert est.input_header(_config("spmv", path=str(tmp_path / "none.h5"))) is None


# -- each operation's estimate ----------------------------------------------------------------------

def _estimate(operation, params, spec, nranks=1):
    config = _config(operation, params, generate=spec)
    header = est.input_header(config)
    return header, get_operation_class(operation).estimate_memory(config, header, nranks)


def test_the_keys_that_size_a_run_carry_their_bytes():
    header, need = _estimate("cholesky", {"nrhs": 1000}, {"kind": "poisson", "dims": [10, 10]})
    assert need.host["operation.params.nrhs"] == 2 * 100 * 1000 * 8
    header, need = _estimate("cpals", {"rank": 50},
                             {"kind": "random_tensor", "dims": [20, 30, 10], "nnz": 400})
    assert need.host["operation.params.rank"] == (60 + 30) * 50 * 8
    header, need = _estimate("spmv", {}, {"kind": "poisson", "dims": [64, 64]}, nranks=4)
    # a quarter of A (by rows and nonzeros, evenly), the whole x, a quarter of y
    assert need.host["input.generate"] == header.csr_bytes(1024, -(-header.nnz // 4)) + 4096 * 8
    assert need.host["result"] == 1024 * 8
    header, need = _estimate("spgemm", {}, {"kind": "poisson", "dims": [64, 64]}, nranks=2)
    assert need.host["operation.params.b"] == header.part_bytes(1)  # B = A, whole on each rank
    header, need = _estimate("sptv", {"mode": 1},
                             {"kind": "random_tensor", "dims": [20, 30, 10], "nnz": 400})
    assert need.host["operation.params.vector"] == 30 * 8


class _FakeDevice:
    def __init__(self, free):
        self.free = free

    def free_memory(self):
        return self.free


def test_check_fits_names_the_key_that_asks_for_most(monkeypatch):
    config = _config("cholesky", {"nrhs": 1000}, generate={"kind": "poisson", "dims": [10, 10]})
    op = get_operation_class("cholesky")
    monkeypatch.setattr(est, "host_memory_available", lambda: 10 ** 9)
    assert est.check_fits(config, op, 1) is not None  # 1.6 MB fits in 1 GB
    monkeypatch.setattr(est, "host_memory_available", lambda: 10 ** 6)
    with pytest.raises(ResourceError, match=r"operation\.params\.nrhs=1000 needs at least 1\.6 MB "
                                            r"of host memory per rank, this node has 1\.0 MB"):
        est.check_fits(config, op, 1)
    # Cholesky's arrays are rank 0's alone: four ranks on the node need no more
    monkeypatch.setattr(est, "host_memory_available", lambda: 2 * 10 ** 6)
    est.check_fits(config, op, 4, ranks_on_node=4)
    # SpMV's parts are on every rank: four ranks on the node share its memory
    spmv = _config("spmv", generate={"kind": "poisson", "dims": [100, 100]})
    need = get_operation_class("spmv").estimate_memory(spmv, est.input_header(spmv), 4)
    per_rank = sum(need.host.values())
    assert need.root_only == 0 and need.node_host_bytes(4) == 4 * per_rank
    monkeypatch.setattr(est, "host_memory_available", lambda: 3 * per_rank)
    est.check_fits(spmv, get_operation_class("spmv"), 4, ranks_on_node=2)
    with pytest.raises(ResourceError, match=r"\(4 ranks on this node: "):
        est.check_fits(spmv, get_operation_class("spmv"), 4, ranks_on_node=4)
    # what rank 0 alone holds (the factor, B and X) counts once on its node; A, which every
    # rank of strategy subtree reads (its own copy), on every rank, and under single on rank 0
    header = est.input_header(config)
    need = op.estimate_memory(config, header, 4)
    assert need.node_host_bytes(4) == sum(need.host.values()) + 3 * header.part_bytes(1)
    single = config_from_dict({"run": {"name": "e"}, "backend": "cpu",
                               "operation": {"name": "cholesky", "params": {"nrhs": 1000}},
                               "partition": {"strategy": "single"},
                               "input": {"generate": {"kind": "poisson", "dims": [10, 10]}}},
                              source="test.yaml")
    need = op.estimate_memory(single, header, 4)
    assert need.node_host_bytes(4) == sum(need.host.values())
    monkeypatch.setattr(est, "host_memory_available", lambda: 10 ** 6)
    # a large input, not a parameter: more ranks, not a smaller value
    big = _config("spmv", generate={"kind": "poisson", "dims": [300, 300]})
    with pytest.raises(ResourceError, match=r"the input input.generate \{kind: poisson\}.*more "
                                            r"ranks"):
        est.check_fits(big, get_operation_class("spmv"), 1)
    # the GPU: its free memory, only on the GPU backend
    monkeypatch.setattr(est, "host_memory_available", lambda: 10 ** 12)
    with pytest.raises(ResourceError, match="nrhs=1000 needs at least 1.6 MB of GPU memory per "
                                            "rank, this GPU has 1.0 MB free"):
        est.check_fits(config, op, 1, backend="gpu", device=_FakeDevice(10 ** 6))
    est.check_fits(config, op, 1, backend="cpu", device=_FakeDevice(10 ** 6))


def test_host_memory_available_is_what_the_kernel_says():
    available = est.host_memory_available()
    with open("/proc/meminfo") as handle:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle}
    assert 0 < available <= meminfo["MemTotal"]


# -- through the command ----------------------------------------------------------------------------

@pytest.mark.parametrize("config, key", [
    ({"operation": {"name": "cholesky", "params": {"nrhs": 1000000000}},
      "input": {"generate": {"kind": "poisson", "dims": [3, 3]}}},
     "operation.params.nrhs=1000000000 needs at least 144.0 GB"),
    ({"operation": {"name": "cpals", "params": {"rank": 100000000}},
      "input": {"generate": {"kind": "random_tensor", "dims": [20, 30, 10], "nnz": 500}}},
     "operation.params.rank=100000000 needs at least 72.0 GB"),
])
def test_a_run_that_cannot_fit_stops_in_one_line_before_reading(tmp_path, config, key):
    if est.host_memory_available() > 72e9:
        pytest.skip("this machine has room for the absurd run")
    path = tmp_path / "big.yaml"
    out = tmp_path / "out"
    path.write_text(yaml.safe_dump(dict(config, backend="cpu", output={"dir": str(out)})))
    proc = run_hisparse(["run", path], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("hisparse: error:") and "\n" not in line and key in line, line
    assert "of host memory per rank, this node has" in line
    assert not out.exists() or not list(out.iterdir())


def test_dry_run_prints_config_plan_and_estimate_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = run_hisparse(["run", QUICKSTART, "--dry-run", "--ranks", "2", "--set",
                         f"output.dir={out}", "--set", "backend=cpu"])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    config_text, _, rest = text.partition("\n# plan\n")
    resolved = yaml.safe_load(config_text)
    assert resolved["operation"]["name"] == "spmv" and resolved["output"]["dir"] == str(out)
    assert resolved["run"]["repeats"] == 5 and resolved["partition"]["strategy"] == "nnz_balanced"
    plan = dict(line.split(": ", 1) for line in rest.splitlines()[:5])
    assert plan == {"operation": "spmv", "ranks": "2", "partition": "nnz_balanced",
                    "backend": "cpu", "precision": "fp64"}
    assert "matrix (4096, 4096), 20,224 nonzeros" in rest
    # 2048 rows and 10,112 nonzeros of int32/fp64 CSR, x whole, y's 2048 values
    host = ((2048 + 1) * 4 + 10112 * 12 + 4096 * 8) + 2048 * 8
    assert f"host: {est.gigabytes(host)}" in rest and "ranks of this size fit" in rest
    assert "\nnote: " not in rest  # SpMV's estimate leaves nothing large out
    assert not out.exists()
    proc = run_hisparse(["run", QUICKSTART, "--ranks", "2"])
    assert proc.returncode == 2 and "--ranks plans a --dry-run" in proc.stderr
    # Cholesky's auto is subtree on several ranks (every rank then holds A), single on one
    cholesky = str(ROOT / "inputs" / "bench_cholesky_lap60.yaml")
    for ranks, strategy in ((1, "single"), (4, "subtree")):
        proc = run_hisparse(["run", cholesky, "--dry-run", "--ranks", str(ranks), "--set",
                             "backend=cpu"])
        assert proc.returncode == 0, proc.stderr
        assert f"\npartition: {strategy} (auto)\n" in proc.stdout
        # the factor's fill is not in the bytes: the dry run says so and where to get it
        assert "\nnote: Cholesky's factor is counted as A's lower triangle" in proc.stdout
        assert "jobs/cholesky_plan.py" in proc.stdout
