"""The host array helpers of :mod:`hisparse.arrays` against NumPy's own."""
import numpy as np
import pytest

from hisparse.arrays import distinct_of_sorted, sorted_distinct


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
