"""The host array helpers of :mod:`hisparse.arrays` against NumPy's own."""
import numpy as np
import pytest

from hisparse.arrays import distinct_of_sorted, sorted_distinct, with_sorted


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
