"""Host threads per rank: unbound ranks of one node divide its cores (hisparse.threads), rank 0
takes them all while the others wait, and HISPARSE_HOST_THREADS sets the count outright."""
import numpy as np
import pytest

from hisparse import arrays, threads
from helpers import ARRAY_MODULES, array_module_named


class _NodeOf:
    """A node-local communicator's allgather, answered with the CPU sets of the node's ranks."""

    def __init__(self, masks):
        self.masks = masks

    def allgather(self, mine):
        return [sorted(mask) for mask in self.masks]


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.delenv("HISPARSE_HOST_THREADS", raising=False)
    monkeypatch.setattr(threads, "_affinity", lambda: set(range(16)))
    monkeypatch.setattr(threads, "_ranks_sharing", 1)
    return set(range(16))


def test_unbound_ranks_of_a_node_divide_its_cores(sixteen_cores):
    assert threads.usable_cores() == 16
    assert threads.share_node(_NodeOf([sixteen_cores] * 4)) == 4
    assert threads.usable_cores() == 4
    with threads.alone():  # rank 0 while the others wait
        assert threads.usable_cores() == 16
        with threads.alone():
            assert threads.usable_cores() == 16
        assert threads.usable_cores() == 16
    assert threads.usable_cores() == 4


def test_at_most_caps_the_cores_even_alone(sixteen_cores, monkeypatch):
    """at_most caps usable_cores inside it (alone too, nested caps the smallest), and the
    count comes back after it; an explicit thread count still wins."""
    assert threads.share_node(_NodeOf([sixteen_cores] * 2)) == 2
    with threads.at_most(3):
        assert threads.usable_cores() == 3
        with threads.alone():
            assert threads.usable_cores() == 3
            with threads.at_most(1):
                assert threads.usable_cores() == 1
            with threads.at_most(12):
                assert threads.usable_cores() == 3
        monkeypatch.setenv("HISPARSE_HOST_THREADS", "5")
        assert threads.usable_cores() == 5
    monkeypatch.delenv("HISPARSE_HOST_THREADS")
    assert threads.usable_cores() == 8
    with threads.alone():
        assert threads.usable_cores() == 16
    with pytest.raises(RuntimeError):
        with threads.at_most(2):
            raise RuntimeError("the cap goes with the section")
    assert threads.usable_cores() == 8


def test_ranks_bound_to_their_own_cores_keep_them(sixteen_cores, monkeypatch):
    # Four ranks bound to 4 cores each: no core is shared, each keeps its 4.
    monkeypatch.setattr(threads, "_affinity", lambda: set(range(4)))
    node = _NodeOf([set(range(4 * r, 4 * r + 4)) for r in range(4)])
    assert threads.share_node(node) == 1
    assert threads.usable_cores() == 4


def test_overlapping_sets_count_the_busiest_core(sixteen_cores):
    # This rank (all 16) overlaps one rank bound to cores 0-7 and one to 4-11: cores 4-7 are in
    # three sets, so its 16 cores are divided by 3.
    node = _NodeOf([sixteen_cores, set(range(8)), set(range(4, 12))])
    assert threads.share_node(node) == 3
    assert threads.usable_cores() == 5


def test_an_explicit_thread_count_wins(sixteen_cores, monkeypatch):
    threads.share_node(_NodeOf([sixteen_cores] * 4))
    monkeypatch.setenv("HISPARSE_HOST_THREADS", "7")
    assert threads.usable_cores() == 7
    with threads.alone():
        assert threads.usable_cores() == 7
    monkeypatch.setenv("HISPARSE_HOST_THREADS", "many")  # not a number: the node rule
    assert threads.usable_cores() == 4


@pytest.mark.parametrize("threads_env", ["1", "4"])
def test_copy_into_and_take_into_match_numpy(monkeypatch, threads_env):
    """The threaded copies give NumPy's results: a cast into another dtype, a transposed source
    (the right-hand sides into their pinned buffer), and a gather by a permutation, on arrays of
    several pieces and on one smaller than a piece."""
    from hisparse import threads
    monkeypatch.setenv("HISPARSE_HOST_THREADS", threads_env)
    rng = np.random.default_rng(3)
    for size in (threads.COPY_PIECE * 3 + 17, 1000):
        source = rng.standard_normal(size)
        cast = threads.copy_into(np.empty(size, np.float32), source)
        np.testing.assert_array_equal(cast, source.astype(np.float32))
        wide = rng.standard_normal((size, 3))
        transposed = threads.copy_into(np.empty((3, size)), wide.T)
        np.testing.assert_array_equal(transposed, wide.T)
        perm = rng.permutation(size)
        np.testing.assert_array_equal(threads.take_into(np.empty(size), wide[:, 1], perm),
                                      wide[perm, 1])
        np.testing.assert_array_equal(threads.take_into(np.empty((size, 3)), wide, perm),
                                      wide[perm])
    with pytest.raises(ValueError, match="shapes"):
        threads.copy_into(np.empty(4), np.empty(5))
    for size, dtype in ((threads.COPY_PIECE * 2 + 5, np.int64), (1000, np.int32), (0, np.int64)):
        made = threads.arange_into(np.empty(size, dtype=dtype))
        np.testing.assert_array_equal(made, np.arange(size))
        assert made.dtype == dtype
        filled = threads.fill_into(np.empty(size, dtype=dtype), 7)
        np.testing.assert_array_equal(filled, np.full(size, 7, dtype=dtype))
        # touched pages hold a zero at each page's start; the rest is left as it was
        marked = np.full(size, -1, dtype=dtype)
        assert threads.touch_pages(marked) is marked
        raw = marked.view(np.uint8)
        np.testing.assert_array_equal(raw[::threads.PAGE_BYTES], 0)
        untouched = np.ones(len(raw), dtype=bool)
        untouched[::threads.PAGE_BYTES] = False
        assert np.all(raw[untouched] == 0xFF)
    two_d = threads.touch_pages(np.full((3, threads.PAGE_BYTES), 0x0505, dtype=np.int16))
    assert np.count_nonzero(two_d.view(np.uint8) == 0) == 6  # 24 KiB: pages 0 .. 5


@pytest.mark.parametrize("threads_env", ["1", "4"])
def test_searchsorted_into_matches_numpy(monkeypatch, threads_env):
    """The threaded search gives NumPy's positions on both sides, ties and values outside the
    sorted range included, on several pieces and on fewer queries than a piece."""
    from hisparse import threads
    monkeypatch.setenv("HISPARSE_HOST_THREADS", threads_env)
    rng = np.random.default_rng(4)
    offsets = np.unique(rng.integers(0, 10_000, 500))
    for size in (threads.COPY_PIECE * 2 + 5, 999):
        queries = rng.integers(-5, 10_010, size)
        queries[:50] = offsets[:50]  # ties: side decides
        for side in ("left", "right"):
            found = threads.searchsorted_into(np.empty(size, np.int64), offsets, queries, side)
            np.testing.assert_array_equal(found, np.searchsorted(offsets, queries, side=side))


@pytest.mark.parametrize("threads_env", ["1", "4"])
def test_passes_over_pieces_match_numpy(monkeypatch, threads_env):
    """min_max and all_finite over pieces on the host's threads give NumPy's answers: integers,
    floats with a NaN or an infinity in any piece (NaN makes both bounds NaN, as NumPy's
    reductions do), one element, and arrays smaller than a piece; over_pieces hands back the
    pieces' results in order, covering the range once."""
    monkeypatch.setenv("HISPARSE_HOST_THREADS", threads_env)
    monkeypatch.setattr(threads, "REDUCE_PIECE", 1000)
    rng = np.random.default_rng(5)
    cuts = threads.over_pieces(lambda lo, hi: (lo, hi), 10_007)
    assert cuts[0][0] == 0 and cuts[-1][1] == 10_007 and len(cuts) > 1
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    for size in (10_007, 999, 1):
        ints = rng.integers(-10**12, 10**12, size)
        assert arrays.min_max(ints) == (ints.min(), ints.max())
        values = rng.standard_normal(size)
        assert arrays.min_max(values) == (values.min(), values.max())
        assert arrays.all_finite(values)
        for bad in (np.inf, -np.inf, np.nan):
            for where in {0, size // 2, size - 1}:
                spoiled = values.copy()
                spoiled[where] = bad
                assert not arrays.all_finite(spoiled)
                low, high = arrays.min_max(spoiled)
                np.testing.assert_array_equal([low, high], [spoiled.min(), spoiled.max()])


@pytest.mark.parametrize("module", ARRAY_MODULES)
def test_min_max_and_all_finite_on_either_module(module):
    """One test body on NumPy and CuPy (a device array is reduced by its own module): the
    bounds and finiteness of float and integer arrays, with an infinity."""
    xp = array_module_named(module)
    values = xp.asarray(np.linspace(-3.0, 5.0, 1001))
    low, high = arrays.min_max(values)
    assert float(low) == -3.0 and float(high) == 5.0
    assert arrays.all_finite(values)
    values[7] = np.inf
    assert not arrays.all_finite(values)
    ints = xp.asarray(np.arange(-4, 9, dtype=np.int32))
    assert [int(b) for b in arrays.min_max(ints)] == [-4, 8]


def test_the_interpreters_exit_waits_for_background_steps(tmp_path):
    """A process that ends while a step of ``in_background`` still runs (a run stopped by an
    error in its read while its compiled-code loader works) lets the step finish before the
    interpreter tears down: the step's file is written although the main thread exited at
    once. (Torn down under a loader in native code, about one exit in six hung under CI's
    load, and the other rank in ``MPI_Finalize`` with it.)"""
    import subprocess
    import sys
    done = tmp_path / "done"
    script = ("import time\nfrom hisparse.threads import in_background\n"
              f"in_background([lambda: time.sleep(0.5), lambda: open({str(done)!r}, 'w').close()],"
              " 'test-step')\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert done.exists()
