"""hisparse.compiled: functions compiled by Numba at their first call, calling each other
compiled, their prange loops parallel; the Python function stays reachable as .py_func."""
import numpy as np
import pytest

from hisparse.compiled import HAVE_NUMBA, compiled, compiled_parallel, prange

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="Numba is not installed")


@compiled
def _square_plus(value, extra):
    return value * value + extra


@compiled_parallel
def _squares(values, extra):
    out = np.empty_like(values)
    for i in prange(len(values)):
        out[i] = _square_plus(values[i], extra)
    return out


def test_a_compiled_function_calls_another_compiled_and_runs_prange_in_parallel():
    import numba
    values = np.arange(1000, dtype=np.float64)
    np.testing.assert_array_equal(_squares(values, 2.0), values * values + 2.0)
    np.testing.assert_array_equal(_squares.py_func(values, 2.0), values * values + 2.0)
    compiled_copy = _squares.dispatcher()
    assert compiled_copy.targetoptions.get("parallel")
    assert compiled_copy.py_func.__globals__["prange"] is numba.prange
    assert compiled_copy.py_func.__globals__["_square_plus"] is _square_plus.dispatcher()
    # The module's own names stay the lazy objects (Python callers keep their core cap).
    assert globals()["prange"] is prange and globals()["_square_plus"] is _square_plus
    assert _squares.__name__ == "_squares" and "prange" in _squares.py_func.__code__.co_names


@compiled_parallel
def _fill(out, value):
    for i in prange(len(out)):
        out[i] = value


def test_load_makes_the_version_for_the_arguments_without_running_it():
    """``load(*args)``: the compiled version for those arguments' types exists afterwards (one
    per dtype), and nothing ran (the output array is as it was); a call then runs it."""
    import numba
    out = np.zeros(5, dtype=np.float32)
    _fill.load(out, np.float32(2.0))
    assert np.all(out == 0)
    signatures = _fill.dispatcher().signatures
    assert (numba.typeof(out), numba.typeof(np.float32(2.0))) in signatures
    _fill(out, np.float32(2.0))
    assert np.all(out == 2) and len(_fill.dispatcher().signatures) == len(signatures)


def test_a_numba_that_does_not_import_leaves_the_function_python(monkeypatch):
    from hisparse import compiled as compiled_module
    monkeypatch.setattr(compiled_module, "_numba", lambda: None)
    fresh = compiled_module.compiled_parallel(_squares.py_func)
    values = np.arange(5, dtype=np.float64)
    np.testing.assert_array_equal(fresh(values, 1.0), values * values + 1.0)
    assert fresh.dispatcher() is _squares.py_func
    assert compiled_module.thread_count() == 1


def test_host_compile_seconds_count_a_compilation_not_a_call(tmp_path):
    """A function Numba must compile (its module new, in a fresh directory: no cache to load)
    adds its compilation to host_compile_seconds; calling it again adds nothing."""
    import importlib.util
    from hisparse.compiled import host_compile_seconds
    _squares(np.arange(3, dtype=np.float64), 1.0)  # Numba imported, its listener made
    source = tmp_path / "fresh_cubes.py"
    source.write_text("def cubes(values):\n    return values * values * values\n")
    spec = importlib.util.spec_from_file_location("fresh_cubes", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = compiled(module.cubes)
    before = host_compile_seconds()
    np.testing.assert_array_equal(fresh(np.arange(4.0)), np.arange(4.0) ** 3)
    after = host_compile_seconds()
    assert after > before
    fresh(np.arange(5.0))
    assert host_compile_seconds() == after


@pytest.mark.parametrize("value_dtype", [np.float64, np.float32])
def test_the_renumber_loader_makes_what_renumbered_then_runs(value_dtype):
    """``load_renumber_loops`` (the SpMV plan's warm-up thread) makes the compiled pass for the
    very types :meth:`CSRMatrix.renumbered` calls it with, for int32 and int64 columns: the
    renumbering that follows compiles nothing more, and renames and sorts as SciPy does."""
    import scipy.sparse as sp
    from hisparse.formats import CSRMatrix, load_renumber_loops
    from hisparse.formats._csr import _renumber_rows_in_blocks
    load_renumber_loops(value_dtype)
    made = set(_renumber_rows_in_blocks.dispatcher().signatures)
    rng = np.random.default_rng(5)
    dense = (rng.random((30, 30)) < 0.2) * rng.random((30, 30))
    rows, columns = rng.permutation(30), rng.permutation(30)
    new_column = np.empty(30, dtype=np.int64)
    new_column[columns] = np.arange(30)
    for index_dtype in (np.int32, np.int64):
        a = sp.csr_matrix(dense.astype(value_dtype))
        matrix = CSRMatrix(a.indptr.astype(np.int64), a.indices.astype(index_dtype), a.data,
                           a.shape)
        got = matrix.renumbered(rows, new_column)
        want = a[rows][:, columns]
        want.sort_indices()
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
    assert set(_renumber_rows_in_blocks.dispatcher().signatures) == made
