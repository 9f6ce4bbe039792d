"""HDF5 input schema round trips and validation; converters from text formats."""
import gzip
import lzma

import h5py
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from hisparse.errors import InputError
from hisparse.formats import COOTensor, CSRMatrix
from hisparse.io import (convert, describe, input_kind, read_matrix, read_tensor, write_matrix,
                         write_tensor)


def _random_csr(m=30, n=20, density=0.2, seed=0):
    return sp.random(m, n, density=density, random_state=seed, format="csr")


def test_matrix_round_trip(tmp_path):
    matrix = _random_csr()
    path = tmp_path / "m.h5"
    write_matrix(path, CSRMatrix.from_scipy(matrix), group="/mats/a")
    back = read_matrix(path, "/mats/a")
    assert input_kind(path, "/mats/a") == "matrix"
    assert (back.to_scipy() != matrix).nnz == 0
    assert back.shape == matrix.shape


def test_matrix_unsorted_duplicates_are_summed_or_rejected(tmp_path):
    path = tmp_path / "d.h5"
    # row 0 holds column 2 twice, in unsorted order
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "csr"
        handle.attrs["shape"] = [2, 3]
        handle["indptr"] = np.array([0, 3, 4])
        handle["indices"] = np.array([2, 0, 2, 1])
        handle["data"] = np.array([1.0, 2.0, 3.0, 4.0])
    summed = read_matrix(path).to_scipy().toarray()
    np.testing.assert_array_equal(summed, [[2.0, 0.0, 4.0], [0.0, 4.0, 0.0]])
    with pytest.raises(InputError, match="duplicate entries in row 0"):
        read_matrix(path, duplicates="reject")


@pytest.mark.parametrize("stored", [np.int64, np.int32])
def test_canonical_matrix_reads_as_scipy_would_make_it(tmp_path, stored):
    """A file already in canonical form (sorted rows, no duplicates, empty rows) is read without
    SciPy: the same arrays, and the index dtype SciPy's constructor would give (int32 where the
    shape and nnz fit), as an unsorted file's canonicalisation through SciPy gives."""
    keep = np.ones(40)
    keep[5] = 0  # an empty row
    matrix = (sp.diags(keep) @ _random_csr(40, 25, 0.3, seed=3)).tocsr()
    matrix.eliminate_zeros()
    matrix.sum_duplicates()  # sorts the rows (a product's may come unsorted)
    assert matrix.has_canonical_format and np.diff(matrix.indptr)[5] == 0
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "csr"
        handle.attrs["shape"] = list(matrix.shape)
        handle["indptr"] = matrix.indptr.astype(stored)
        handle["indices"] = matrix.indices.astype(stored)
        handle["data"] = matrix.data
    back = read_matrix(path)
    expected = sp.csr_matrix((matrix.data, matrix.indices.astype(stored),
                              matrix.indptr.astype(stored)), shape=matrix.shape)
    assert back.indices.dtype == expected.indices.dtype == np.int32
    assert back.indptr.dtype == expected.indptr.dtype
    np.testing.assert_array_equal(back.indptr, matrix.indptr)
    np.testing.assert_array_equal(back.indices, matrix.indices)
    np.testing.assert_array_equal(back.data, matrix.data)
    assert back.shape == matrix.shape and all(type(n) is int for n in back.shape)


@pytest.mark.parametrize("mutate,needle", [
    (lambda h: h.attrs.__setitem__("shape", [3, 3]), "indptr has length"),
    (lambda h: h.__delitem__("data"), "dataset '/data' not found"),
    (lambda h: h.attrs.__delitem__("shape"), "no 'shape' attribute"),
])
def test_matrix_validation_names_the_problem(tmp_path, mutate, needle):
    path = tmp_path / "m.h5"
    write_matrix(path, CSRMatrix.from_scipy(_random_csr(4, 4, 0.5)))
    with h5py.File(path, "a") as handle:
        mutate(handle)
    with pytest.raises(InputError, match=needle):
        read_matrix(path)


def test_missing_group_and_non_hdf5(tmp_path):
    path = tmp_path / "m.h5"
    write_matrix(path, CSRMatrix.from_scipy(_random_csr()))
    with pytest.raises(InputError, match="group '/other' not found"):
        read_matrix(path, "/other")
    bogus = tmp_path / "x.h5"
    bogus.write_text("not hdf5")
    with pytest.raises(InputError, match="not a readable HDF5"):
        read_matrix(bogus)


def test_tensor_round_trip_and_duplicates(tmp_path):
    coords = np.array([[0, 1, 2], [1, 0, 0], [0, 1, 2], [2, 2, 1]])
    tensor = COOTensor(coords, np.array([1.0, 2.0, 3.0, 4.0]), (3, 3, 3))
    path = tmp_path / "t.h5"
    write_tensor(path, tensor)
    back = read_tensor(path)
    assert input_kind(path) == "tensor"
    assert back.nnz == 3
    lookup = {tuple(c): v for c, v in zip(back.indices.tolist(), back.values)}
    assert lookup == {(0, 1, 2): 4.0, (1, 0, 0): 2.0, (2, 2, 1): 4.0}
    with pytest.raises(InputError, match="duplicate coordinates"):
        tensor.validate("t", "reject")


def test_tensor_per_mode_datasets_and_range_check(tmp_path):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = [2, 2, 2, 2]
        for mode in range(4):
            handle[f"index{mode}"] = np.array([0, 1])
        handle["values"] = np.array([1.0, 2.0])
    assert read_tensor(path).order == 4
    with h5py.File(path, "a") as handle:
        del handle["index2"]
        handle["index2"] = np.array([0, 5])
    with pytest.raises(InputError, match="index 5 out of range \\[0, 2\\) in mode 2"):
        read_tensor(path)


def test_describe_lists_groups(tmp_path):
    path = tmp_path / "m.h5"
    write_matrix(path, CSRMatrix.from_scipy(_random_csr(10, 10, 0.3)), group="/a")
    (line,) = describe(str(path))
    assert "CSR matrix 10 x 10" in line


# -- converters ------------------------------------------------------------------------------

@pytest.mark.parametrize("opener,suffix", [(open, ""), (gzip.open, ".gz"), (lzma.open, ".xz")])
def test_convert_mtx_symmetric_and_compressed(tmp_path, opener, suffix):
    lower = sp.tril(_random_csr(12, 12, 0.3, seed=4) + sp.eye(12)).tocoo()
    full = (lower + sp.tril(lower, -1).T).tocsr()
    plain = tmp_path / "a.mtx"
    scipy.io.mmwrite(str(plain), lower, symmetry="symmetric")
    source = tmp_path / f"b.mtx{suffix}"
    with opener(source, "wb") as handle:
        handle.write(plain.read_bytes())
    out = tmp_path / "a.h5"
    convert(str(source), str(out))
    back = read_matrix(out)
    assert back.symmetric
    np.testing.assert_allclose(back.to_scipy().toarray(), full.toarray())


def test_convert_snap_edge_list(tmp_path):
    source = tmp_path / "g.txt.gz"
    with gzip.open(source, "wt") as handle:
        handle.write("# comment\n# FromNodeId\tToNodeId\n0\t1\n1\t2\n0\t1\n4\t0\n")
    convert(str(source), str(tmp_path / "g.h5"))
    dense = read_matrix(tmp_path / "g.h5").to_scipy().toarray()
    expected = np.zeros((5, 5))
    expected[0, 1] = expected[1, 2] = expected[4, 0] = 1.0
    np.testing.assert_array_equal(dense, expected)
    convert(str(source), str(tmp_path / "s.h5"), symmetric=True)
    sym = read_matrix(tmp_path / "s.h5").to_scipy().toarray()
    np.testing.assert_array_equal(sym, np.maximum(expected, expected.T))


def test_convert_frostt_tns(tmp_path):
    source = tmp_path / "t.tns"
    source.write_text("1 1 1 1.5\n2 3 1 2.0\n1 2 4 -1.0\n")
    tensor = convert(str(source), str(tmp_path / "t.h5"))
    assert tensor.shape == (2, 3, 4)
    back = read_tensor(tmp_path / "t.h5")
    lookup = {tuple(c): v for c, v in zip(back.indices.tolist(), back.values)}
    assert lookup == {(0, 0, 0): 1.5, (1, 2, 0): 2.0, (0, 1, 3): -1.0}


def test_convert_genten_sptensor(tmp_path):
    source = tmp_path / "aminoacid_data.txt"
    source.write_text("sptensor\n3\n2 3 2\n3\n0 0 0 1.5\n1 2 1 2.0\n0 1 1 -1.0\n")
    tensor = convert(str(source), str(tmp_path / "g.h5"))
    assert tensor.shape == (2, 3, 2)
    lookup = {tuple(c): v for c, v in zip(tensor.indices.tolist(), tensor.values)}
    assert lookup == {(0, 0, 0): 1.5, (1, 2, 1): 2.0, (0, 1, 1): -1.0}
    bad = tmp_path / "bad.txt"
    bad.write_text("sptensor\n3\n2 3 2\n5\n0 0 0 1.5\n")
    with pytest.raises(InputError, match="header says order 3"):
        convert(str(bad), str(tmp_path / "b.h5"), fmt="genten")


@pytest.mark.parametrize("name,sep", [("u.data", "\t"), ("ratings.dat", "::")])
def test_convert_movielens(tmp_path, name, sep):
    day = 86400
    rows = [(1, 10, 5, 3 * day), (2, 10, 3, 3 * day + 5), (1, 3, 4, 9 * day)]
    source = tmp_path / name
    source.write_text("".join(sep.join(str(v) for v in r) + "\n" for r in rows))
    tensor = convert(str(source), str(tmp_path / "m.h5"))
    assert tensor.shape == (2, 10, 2)  # two distinct days
    lookup = {tuple(c): v for c, v in zip(tensor.indices.tolist(), tensor.values)}
    assert lookup == {(0, 9, 0): 5.0, (1, 9, 0): 3.0, (0, 2, 1): 4.0}


def test_convert_lastfm(tmp_path):
    source = tmp_path / "user_taggedartists.dat"
    source.write_text("userID\tartistID\ttagID\tday\tmonth\tyear\n2\t52\t13\t1\t4\t2009\n"
                      "2\t52\t15\t1\t4\t2009\n3\t1\t13\t1\t1\t2010\n")
    tensor = convert(str(source), str(tmp_path / "l.h5"))
    assert tensor.shape == (3, 52, 15)
    assert tensor.nnz == 3 and np.all(tensor.values == 1.0)


def test_convert_unknown_format_is_explained(tmp_path):
    source = tmp_path / "data.bin"
    source.write_text("1 2\n")
    with pytest.raises(InputError, match="--format"):
        convert(str(source), str(tmp_path / "o.h5"))


@pytest.mark.skipif(not __import__("os").path.exists("/work/shared/data") and
                    not __import__("os").path.exists("../shared/data"), reason="no shared data")
def test_convert_real_matrix_market_file(tmp_path):
    import os
    base = "/work/shared/data" if os.path.exists("/work/shared/data") else "../shared/data"
    source = os.path.join(base, "matrices/spd/1138_bus.mtx")
    matrix = convert(source, str(tmp_path / "b.h5"))
    assert matrix.shape == (1138, 1138) and matrix.nnz == 4054


def test_writers_add_groups_and_replace_only_with_overwrite(tmp_path):
    from hisparse.errors import OutputError
    path = tmp_path / "m.h5"
    a, b = _random_csr(seed=1), _random_csr(seed=2)
    write_matrix(path, CSRMatrix.from_scipy(a))
    write_matrix(path, CSRMatrix.from_scipy(a), group="/sub")
    with pytest.raises(OutputError, match="group '/sub' exists"):
        write_matrix(path, CSRMatrix.from_scipy(b), group="/sub")
    with pytest.raises(OutputError, match="the file exists"):
        write_matrix(path, CSRMatrix.from_scipy(b))
    write_matrix(path, CSRMatrix.from_scipy(b), overwrite=True)  # the root's matrix only
    assert (read_matrix(path).to_scipy() != b).nnz == 0
    assert (read_matrix(path, "/sub").to_scipy() != a).nnz == 0
    tensor = COOTensor(np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0]), (2, 2))
    write_tensor(path, tensor, mode="w")  # a new file in place of the old one
    assert input_kind(path) == "tensor"
    with h5py.File(path, "r") as handle:
        assert "sub" not in handle
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.h5"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("filters", [dict(compression="gzip", shuffle=True),
                                     dict(compression="gzip", compression_opts=1),
                                     dict(compression="lzf"), {}],
                         ids=["gzip-shuffle", "gzip", "lzf", "plain"])
def test_threaded_reads_equal_h5py_slices(tmp_path, monkeypatch, dtype, filters):
    # read_range inflates gzip chunks on threads (any other pipeline goes through h5py): every
    # range, partial chunks at both ends included, equals h5py's own slice, bit for bit.
    from hisparse import threads
    from hisparse.io import _hdf5
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    # small ranges threaded, small tasks (a few chunks), one ahead per thread: the read-ahead
    # bound is exercised too
    monkeypatch.setattr(_hdf5, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(_hdf5, "TASK_BYTES", 3 * 257 * 8)
    monkeypatch.setattr(_hdf5, "TASKS_AHEAD", 1)
    inflated = []
    original = _hdf5._ChunkInflater.__call__
    monkeypatch.setattr(_hdf5._ChunkInflater, "__call__",
                        lambda self, batch: inflated.append(len(batch)) or original(self, batch))
    rng = np.random.default_rng(3)
    flat = (rng.standard_normal(20_000) * 1000).astype(dtype)
    table = (rng.integers(0, 1 << 20, (6_000, 3))).astype(dtype)
    path = tmp_path / "ranges.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("flat", data=flat, chunks=(257,), **filters)
        f.create_dataset("columns", data=table, chunks=(101, 1), **filters)
        f.create_dataset("rows", data=table, chunks=(101, 3), **filters)
    with h5py.File(path, "r") as f:
        for name, n in (("flat", 20_000), ("columns", 6_000), ("rows", 6_000)):
            dataset = f[name]
            for lo, hi in ((0, None), (1, n - 1), (257 * 3, 257 * 40), (5, 9000), (n - 3, n)):
                got = _hdf5.read_range(dataset, lo, hi)
                expected = dataset[lo:hi]
                assert got.dtype == expected.dtype and got.shape == expected.shape
                np.testing.assert_array_equal(got, expected)
    # the gzip pipelines went through the threads, the others through h5py
    assert bool(inflated) == (filters.get("compression") == "gzip")


def test_a_matrix_read_with_threaded_chunks_equals_the_written_one(tmp_path, monkeypatch):
    from hisparse import generators, threads
    from hisparse.io import _hdf5
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    monkeypatch.setattr(_hdf5, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(_hdf5, "WRITE_CHUNK_BYTES", 4096)  # many chunks a dataset
    matrix = generators.poisson([30, 30, 30], stencil=27)
    path = tmp_path / "p30.h5"
    write_matrix(str(path), matrix)
    with h5py.File(path, "r") as f:  # the writer's chunks: WRITE_CHUNK_BYTES each
        assert f["data"].chunks == (512,) and f["indices"].chunks[0] * 4 <= 4096
    read = read_matrix(str(path))
    np.testing.assert_array_equal(read.indptr, matrix.indptr)
    np.testing.assert_array_equal(read.indices, matrix.indices)
    np.testing.assert_array_equal(read.data, matrix.data)
