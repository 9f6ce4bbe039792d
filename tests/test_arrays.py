"""The host array helpers of :mod:`hisparse.arrays` against NumPy's own."""
import numpy as np
import pytest

from hisparse.arrays import distinct_of_sorted, sorted_distinct, with_sorted

from helpers import ARRAY_MODULES, array_module_named


@pytest.mark.parametrize("size,span", [(0, 1), (1, 1), (2, 1), (1000, 10), (100_000, 1 << 40),
                                       (50_000, 50_000)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_sorted_distinct_is_numpys_unique(size, span, dtype):
    rng = np.random.default_rng(size + span)
    values = (rng.integers(-span, span, size) if dtype != np.float64
              else rng.integers(-span, span, size) / 7.0).astype(dtype, copy=False)
    expected = np.unique(values)
    got = sorted_distinct(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(distinct_of_sorted(np.sort(values)), expected)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_with_sorted_is_the_sorted_union(dtype):
    """The few values inserted into a sorted distinct array: NumPy's union, its dtype kept,
    the input left alone; repeats, values already there, ends and an empty side."""
    rng = np.random.default_rng(3)
    for size, extra in ((0, 0), (0, 5), (1, 3), (50, 0), (1000, 7), (1000, 40)):
        values = np.unique(rng.integers(0, 3 * size + 2, size)).astype(dtype)
        more = rng.integers(-2, 3 * size + 5, extra)
        if size and extra:
            more[:2] = values[[0, -1]]  # already there
        before = values.copy()
        got = with_sorted(values, more)
        np.testing.assert_array_equal(got, np.union1d(values, more))
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(values, before)


def test_distinct_of_sorted_leaves_its_input_alone():
    values = np.array([1, 1, 2, 5, 5, 5], dtype=np.int64)
    kept = values.copy()
    assert distinct_of_sorted(values).tolist() == [1, 2, 5]
    np.testing.assert_array_equal(values, kept)
    single = distinct_of_sorted(values[:1])
    single[0] = 9  # a copy, as np.unique returns
    assert values[0] == 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.intp])
@pytest.mark.parametrize("case", ["zipf", "ties", "all_clipped", "one", "empty"])
def test_order_by_count_is_the_stable_descending_argsort(dtype, case):
    """order_by_count gives np.argsort(-counts, kind="stable") exactly: ties in index order,
    counts past 16 bits (several, tied among themselves too) ordered by their full value."""
    from hisparse.arrays import order_by_count
    rng = np.random.default_rng(7)
    counts = {"zipf": lambda: np.minimum(rng.zipf(1.5, 20000), 300000),
              "ties": lambda: rng.integers(0, 4, 5000),
              "all_clipped": lambda: rng.choice([65535, 65536, 70000, 10**6], 300),
              "one": lambda: np.array([3]),
              "empty": lambda: np.zeros(0)}[case]().astype(dtype)
    if case == "zipf":
        counts[[5, 9, 17]] = 70000  # tied hubs past the clip
        assert np.count_nonzero(counts >= 65535) > 3
    np.testing.assert_array_equal(order_by_count(counts), np.argsort(-counts, kind="stable"))


# -- the same code on NumPy and CuPy without scalar operands (arrays.operand, count_values,
# unravel) -------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ARRAY_MODULES)
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
def test_count_values_is_bincount(module, dtype):
    """Counts equal NumPy's bincount on random values, on runs of equal values longer and
    shorter than a device thread's share (16), on one value, and on none."""
    from hisparse.arrays import count_values
    xp, rng = array_module_named(module), np.random.default_rng(3)
    cases = [rng.integers(0, 50, size=10_000), np.repeat(rng.integers(0, 300, size=700),
                                                         rng.integers(1, 40, size=700)),
             np.full(1000, 7), np.zeros(0, dtype=np.int64), np.arange(33)]
    for values in cases:
        size = int(values.max()) + 3 if len(values) else 5
        got = count_values(xp.asarray(values.astype(dtype)), size)
        got = got.get() if xp is not np else got
        assert got.dtype == np.int64 and len(got) == size
        np.testing.assert_array_equal(got, np.bincount(values.astype(np.int64), minlength=size))
    with pytest.raises(ValueError):  # a negative value, on both modules
        count_values(xp.asarray(np.array([0, -1], dtype=dtype)), 5)
    with pytest.raises(ValueError, match=r"\(5\) is outside 0 \.\. 4"):  # past the counts
        count_values(xp.asarray(np.array([0, 5], dtype=dtype)), 5)


@pytest.mark.parametrize("threads_env", ["1", "3"])
def test_count_values_in_pieces_is_bincount(monkeypatch, threads_env):
    """From COUNT_PIECES_MIN values the host counts piece by piece (pieces of 1000 here, on 1
    and 3 threads): NumPy's bincount still, int64, and a value past the counts is named
    whichever piece holds it."""
    from hisparse import arrays, threads
    monkeypatch.setattr(arrays, "COUNT_PIECES_MIN", 100)
    monkeypatch.setattr(threads, "REDUCE_PIECE", 1000)
    monkeypatch.setenv("HISPARSE_HOST_THREADS", threads_env)
    rng = np.random.default_rng(7)
    for dtype in (np.int32, np.int64):
        values = rng.integers(0, 700, size=10_500).astype(dtype)
        got = arrays.count_values(values, 750)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.bincount(values, minlength=750))
        values[9_999] = 751  # in the tenth piece
        with pytest.raises(ValueError, match=r"\(751\) is outside 0 \.\. 749"):
            arrays.count_values(values, 750)


@pytest.mark.parametrize("module", ARRAY_MODULES)
def test_in_module_gives_the_arrays_values_in_the_modules_memory(module):
    """A host array (contiguous, strided, empty, 2-D) lands in the module's memory with its
    values, dtype and shape; an array already there is the same array."""
    from hisparse.arrays import host_array, in_module, is_cupy_array
    xp, rng = array_module_named(module), np.random.default_rng(6)
    for host in (rng.random(1000), rng.integers(0, 9, (50, 3)), rng.random((40, 6))[:, ::2],
                 np.zeros(0, dtype=np.int32)):
        got = in_module(xp, host)
        assert is_cupy_array(got) == (xp is not np)
        assert got.dtype == host.dtype and got.shape == host.shape
        np.testing.assert_array_equal(host_array(got), host)
        already = xp.asarray(host)
        same = in_module(xp, already)  # no copy: the same memory
        assert same is already if xp is np else same.data.ptr == already.data.ptr


@pytest.mark.parametrize("module", ARRAY_MODULES)
def test_unravel_is_numpys_unravel_index(module):
    """Each flat index's multi-index equals NumPy's unravel_index, stacked, for one to four
    dimensions, the last index of the space and no index at all."""
    from hisparse.arrays import operand, unravel
    xp = array_module_named(module)
    for dims in ([7], [5, 9], [3, 1, 11], [4, 6, 2, 5]):
        space = int(np.prod(dims))
        flat = np.concatenate([np.random.default_rng(len(dims)).integers(0, space, size=500),
                               [0, space - 1]])
        expected = np.stack(np.unravel_index(flat, dims), axis=1)
        for values in (flat, flat[:0]):
            got = unravel(xp.asarray(values), dims)
            got = got.get() if xp is not np else got
            assert got.shape == (len(values), len(dims)) and got.dtype == np.int64
            np.testing.assert_array_equal(got, expected[:len(values)])
    assert operand(np, 5) == 5  # NumPy keeps its scalar
    product = xp.arange(4) * operand(xp, 3)
    np.testing.assert_array_equal(product.get() if xp is not np else product, np.arange(4) * 3)


@pytest.mark.gpu
def test_the_tensor_set_up_steps_load_no_scipy_on_the_device():
    """The device steps of a tensor's set-up -- the generator, the grid's counts, the routing's
    grouping, SpTV's fiber format and chunk plan, CP-ALS's index counts -- load neither cupyx nor
    SciPy's sparse package (CuPy loads both at an operation between an array and a scalar, in
    bincount and in unravel_index: 0.3-0.45 s of a process's set-up), in a fresh process."""
    import subprocess
    import sys
    code = "\n".join([
        "import sys, cupy",
        "from hisparse import generators",
        "from hisparse.formats import fibers_by_sort",
        "from hisparse.ops.sptv.plan import build_plan",
        "from hisparse.ops.cpals.layout import index_counts",
        "from hisparse.partition import group_by_owner, partition_tensor",
        "s = generators.tensor_source([300, 200, 400], 300000, 0.14, mode=2, seed=1)",
        "i, v = s.fibers(xp=cupy)",
        "grid = partition_tensor(i, s.shape, 2, 4)",
        "order, cuts = group_by_owner(grid.part_of(i), 4)",
        "f = fibers_by_sort(cupy, i, v, s.shape, 2)",
        "plan = build_plan(f, 3, cupy.int32, 256, xp=cupy)",
        "counts = index_counts(cupy.ascontiguousarray(i[:, 0]), 300)",
        "cupy.cuda.Device().synchronize()",
        "print(int(cuts[-1]) == len(v), 'scipy.sparse' in sys.modules)"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


def test_repeated_values_read_as_an_array_and_take_no_memory():
    """One value repeated (a graph's unit values): every entry reads as the value, nothing can
    write into it, it is told apart from arrays that hold or view their entries, it becomes a
    writable array where code needs one, its fingerprint is its value and length, and the
    uniform-value test reads it without a pass."""
    from hisparse.arrays import materialized, repeated, repeated_value
    from hisparse.compiled import fingerprint
    from hisparse.formats._csr import uniform_value
    values = repeated(2.5, 1000, np.float32)
    assert values.dtype == np.float32 and values.shape == (1000,) and values.nbytes == 4000
    assert not values.flags.writeable and np.all(values == np.float32(2.5))
    with pytest.raises(ValueError):
        values[3] = 1.0
    np.testing.assert_array_equal(repeated_value(values), np.array([2.5], np.float32))
    for other in (np.full(1000, 2.5, np.float32), np.arange(5.0)[::2], np.zeros(0),
                  repeated(1.0, 1), np.float64(3.0)):
        assert repeated_value(other) is None
    made = materialized(values)
    assert made.flags.writeable and made.flags.c_contiguous and made.dtype == np.float32
    np.testing.assert_array_equal(made, values)
    plain = np.arange(4.0)
    assert materialized(plain) is plain
    for short in (0, 1):  # an array of its own, writable (code may write into what it is given)
        small = repeated(7.0, short)
        assert small.flags.writeable and list(small) == [7.0] * short
    assert fingerprint(values) == fingerprint(repeated(2.5, 1000, np.float32))
    assert fingerprint(values) != fingerprint(repeated(2.5, 999, np.float32))
    assert fingerprint(values) != fingerprint(repeated(3.5, 1000, np.float32))
    np.testing.assert_array_equal(uniform_value(values), [2.5])
    assert uniform_value(repeated(np.inf, 10)) is None
