"""SpMV as a distributed operator: the split of a rank's rows into local and ghost blocks, the
halo exchange of ghost entries of x against SciPy on random partitions (MPI, 2 and 4 ranks), the
chained products (x <- A x / ||A x||) against SciPy's power iteration, through the operation and
through whole runs; on the GPU at 1 rank and at 2 ranks (NCCL, and MPI staging)."""
import itertools
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.config import config_from_dict
from hisparse.context import RunContext
from hisparse.formats import CSRMatrix
from hisparse.ops.spmv import SpMV, chained_products
from hisparse.distmatrix import (OwnedColumns, ghost_columns, local_positions, locate_entries,
                                 renumber_columns, restore_rows, split_blocks, x_owners)
from hisparse.ops.spmv.local import SpmvLocal, reorder_local, use_order
from hisparse.parallel import HaloExchange, MpiTransport, get_world, node_local
from hisparse.timing import PhaseTimer

from helpers import agree, gpu_transport, run_config, write_config
from test_spmv import power_chain, run_x


# -- matrices -------------------------------------------------------------------------------------

def _matrix(name, size=4, seed=0):
    """The decomposition's cases, the same on every rank (``size``: ranks, for the layouts that
    follow the ownership)."""
    rng = np.random.default_rng(seed)
    if name == "square_random":
        return sp.random(120, 120, density=0.05, random_state=rng, format="csr")
    if name == "rectangular_wide":
        return sp.random(50, 170, density=0.08, random_state=rng, format="csr")
    if name == "rectangular_tall":
        return sp.random(170, 23, density=0.1, random_state=rng, format="csr")
    if name == "empty_rows":
        keep = (np.arange(90) % 7 != 0).astype(float)
        keep[30:55] = 0
        return sp.csr_matrix(sp.diags(keep) @ sp.random(90, 90, density=0.08, random_state=rng))
    if name == "block_diagonal":  # blocks aligned with an even contiguous split: no ghosts
        bounds = 96 * np.arange(size + 1) // size
        blocks = [sp.random(b - a, b - a, density=0.3, random_state=rng) + sp.eye(b - a)
                  for a, b in zip(bounds[:-1], bounds[1:])]
        return sp.block_diag(blocks, format="csr")
    if name == "arrow":  # the first rows touch every column, the others only the diagonal
        dense_rows = sp.random(3, 80, density=0.9, random_state=rng)
        return sp.csr_matrix(sp.vstack([dense_rows, sp.eye(80, format="csr")[3:]]))
    raise KeyError(name)


CASES = ["square_random", "rectangular_wide", "rectangular_tall", "empty_rows", "block_diagonal",
         "arrow"]


def _owners(name, matrix, size, rng):
    """Row owner and x owner of every index: random (non-contiguous) for most cases, even
    contiguous blocks where the case depends on it."""
    m, n = matrix.shape
    if name in ("block_diagonal", "arrow"):
        row_owner = np.repeat(np.arange(size), np.diff(m * np.arange(size + 1) // size))
    else:
        row_owner = rng.integers(0, size, m)
    x_owner = row_owner if m == n else rng.integers(0, size, n)
    return row_owner, x_owner


def _with_index_dtype(matrix, index_dtype):
    """SciPy ``matrix`` as a CSRMatrix with ``index_dtype`` row pointers and columns."""
    csr = CSRMatrix.from_scipy(matrix)
    return CSRMatrix(csr.indptr.astype(index_dtype), csr.indices.astype(index_dtype), csr.data,
                     csr.shape)


def _rank_row_blocks(csr, size):
    """``(rows, owned, block)`` of every rank of ``size`` even contiguous row blocks: its rows,
    the x entries it owns (:func:`x_owners`) and its rows of ``csr``."""
    m, n = csr.shape
    row_bounds = m * np.arange(size + 1) // size
    rows_per_rank = [np.arange(a, b) for a, b in zip(row_bounds[:-1], row_bounds[1:])]
    for rows, owned in zip(rows_per_rank, x_owners(rows_per_rank, m, n)):
        yield rows, owned, csr.rows(rows)


def _assert_same_split(got, expected):
    """Two splits (local and ghost blocks, then ghost rows and ghost columns when given) equal
    array for array, dtypes included."""
    for a, b in zip(got[:2], expected[:2]):
        assert a.shape == b.shape
        for field in ("indptr", "indices", "data"):
            assert getattr(a, field).dtype == getattr(b, field).dtype
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for a, b in zip(got[2:], expected[2:]):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def _split_case(name):
    """A matrix for the split tests: power-law rows (hubs and long empty runs: the pieces balance
    entries, not rows; float32), a 27-point stencil, a band with empty rows and a row whose
    every entry is far away, or one of the decomposition's cases."""
    if name == "power_law":
        return generators.random_matrix(400, 400, nnz_per_row=6, seed=3,
                                        power_law=1.2).to_scipy().astype(np.float32)
    if name == "poisson":
        return generators.poisson([5, 6, 4], 27).to_scipy()
    if name == "band_with_gaps":
        matrix = sp.diags([1.0, 2.0, 3.0, 4.0], [-90, -1, 0, 70], shape=(200, 200)).tolil()
        matrix[20:35] = 0
        matrix[120, :] = 0
        matrix[120, [0, 199]] = [5.0, 6.0]
        matrix = sp.csr_matrix(matrix)
        matrix.eliminate_zeros()
        return matrix
    return _matrix(name, 3)


# -- the split (NumPy) ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("tables", ["dense", "sorted"])
@pytest.mark.parametrize("piece", [None, 7])
def test_split_blocks_reassemble_each_ranks_rows(monkeypatch, name, size, tables, piece):
    """Either way of looking the remote columns up (tables over all of x, or sorts), and the
    passes over the entries in one piece or in many (threads), give blocks that multiply like
    the rows."""
    from hisparse.distmatrix import _row_blocks
    monkeypatch.setattr(_row_blocks, "_dense_tables", lambda n_global, entries: tables == "dense")
    if piece is not None:
        monkeypatch.setattr(_row_blocks, "ENTRY_PIECE", piece)
    matrix = _matrix(name, size)
    m, n = matrix.shape
    rng = np.random.default_rng(1)
    row_owner, x_owner = _owners(name, matrix, size, rng)
    x = rng.uniform(-1, 1, n)
    csr = CSRMatrix.from_scipy(matrix)
    for rank in range(size):
        rows, owned = np.flatnonzero(row_owner == rank), np.flatnonzero(x_owner == rank)
        block = csr.rows(rows)
        position = local_positions(owned, n)
        wanted = rng.permutation(ghost_columns(block, position))  # any receive order
        local, ghost, ghost_rows = split_blocks(block, position, len(owned), wanted)
        touched = np.unique(matrix[rows].indices)
        np.testing.assert_array_equal(np.sort(wanted), np.setdiff1d(touched, owned))
        assert local.shape == (len(rows), len(owned)) and ghost.shape == (len(ghost_rows),
                                                                           len(wanted))
        assert local.nnz + ghost.nnz == block.nnz
        assert np.all(np.diff(ghost.indptr) > 0)  # compressed: only rows with ghost entries
        y = local.to_scipy() @ x[owned]
        y[ghost_rows] += ghost.to_scipy() @ x[wanted]
        np.testing.assert_allclose(y, matrix[rows] @ x, rtol=1e-14, atol=1e-14)
        if name == "block_diagonal":
            assert len(wanted) == 0 and len(ghost_rows) == 0


@pytest.mark.parametrize("name", CASES + ["poisson"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("piece", [None, 5])
def test_contiguous_ownership_splits_as_the_table_does(monkeypatch, name, index_dtype, piece):
    """Contiguous row blocks (how ranks read by rows): the range lookup of the owned x entries
    (and, at one rank, the local block that is the rows themselves) gives array for array the
    blocks of the general table lookup, and the product of SciPy; in one piece or many."""
    if piece is not None:
        from hisparse.distmatrix import _row_blocks
        monkeypatch.setattr(_row_blocks, "ENTRY_PIECE", piece)
    matrix = generators.poisson([5, 6, 4], 27).to_scipy() if name == "poisson" else \
        _matrix(name, 3)
    m, n = matrix.shape
    x = np.random.default_rng(4).uniform(-1, 1, n)
    for size in (1, 2, 3):
        for rows, owned, block in _rank_row_blocks(_with_index_dtype(matrix, index_dtype), size):
            fast, table = local_positions(owned, n), OwnedColumns(owned, n, contiguous=False)
            assert fast.first == (owned[0] if len(owned) else 0) and table.first is None
            wanted = ghost_columns(block, table)
            np.testing.assert_array_equal(ghost_columns(block, fast), wanted)
            wanted = np.random.default_rng(5).permutation(wanted)  # any receive order
            expected = split_blocks(block, table, len(owned), wanted)
            got = split_blocks(block, fast, len(owned), wanted)
            _assert_same_split(got, expected)
            local, ghost, ghost_rows = got
            y = local.to_scipy() @ x[owned]
            y[ghost_rows] += ghost.to_scipy() @ x[wanted]
            np.testing.assert_allclose(y, matrix[rows] @ x, rtol=1e-14, atol=1e-14)
            if size == 1 and m == n:  # every column owned: the rows are the local block
                assert local.indices is block.indices and local.data is block.data


@pytest.mark.parametrize("name", CASES + ["poisson", "power_law"])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_compiled_split_equals_numpy_passes(monkeypatch, name, contiguous, index_dtype):
    """split_rows' two compiled passes (threshold lowered to every size) give array for array
    what the NumPy passes give (locate_entries, ghost_columns, split_blocks), and blocks that
    multiply like the rows, at 1 to 4 ranks' row blocks, over a range of owned x entries or a
    table, in one row piece or many, made in fresh arrays or (``reuse``) in the block's own;
    float32 values keep their dtype."""
    from hisparse.distmatrix import _row_blocks, split_rows
    from hisparse.formats import balanced_row_cuts
    matrix = _split_case(name)
    m, n = matrix.shape
    x = np.random.default_rng(4).uniform(-1, 1, n)
    for size in (1, 2, 4):
        for rows, owned, block in _rank_row_blocks(_with_index_dtype(matrix, index_dtype), size):
            position = OwnedColumns(owned, n, contiguous=contiguous)
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 1 << 62)
            expected = split_rows(block, position, len(owned))
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
            monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", -1.0)  # never the few-ghost split
            for pieces, reuse in itertools.product((1, 3, 7), (False, True)):
                monkeypatch.setattr(_row_blocks, "balanced_row_cuts",
                                    lambda indptr: balanced_row_cuts(indptr, pieces))
                given = CSRMatrix(block.indptr, block.indices.copy(), block.data.copy(),
                                  block.shape)
                got = split_rows(given, position, len(owned), reuse)
                _assert_same_split(got, expected)
                if not position.owns_all(block.indices):  # (else the rows themselves)
                    reused = reuse and got[0].nnz > 0
                    assert np.shares_memory(got[0].indices, given.indices) == reused
                    assert np.shares_memory(got[0].data, given.data) == reused
            local, ghost, ghost_rows, ghosts = got
            y = local.to_scipy() @ x[owned]
            y[ghost_rows] += ghost.to_scipy() @ x[ghosts]
            np.testing.assert_allclose(y, matrix[rows] @ x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["power_law", "poisson", "band_with_gaps", "empty_rows"])
@pytest.mark.parametrize("way", ["numpy", "few_ghosts", "compiled"])
@pytest.mark.parametrize("reuse", [False, True])
def test_split_of_repeated_values_moves_the_columns_alone(monkeypatch, name, way, reuse):
    """Rows whose values are one value repeated (a graph's unit values, no memory: hisparse.
    arrays.repeated) split into the same blocks as rows holding those values in an array, by
    every way of the split (NumPy passes, the few-ghost split, the compiled passes; fresh
    arrays or the rows' own), at 1 to 4 ranks' row blocks; the compiled and few-ghost ways keep
    the values repeated (nothing written), and the rows' repeated values are left as they
    were."""
    from hisparse.arrays import repeated, repeated_value
    from hisparse.compiled import HAVE_NUMBA
    from hisparse.distmatrix import _row_blocks, split_rows
    if way == "compiled" and not HAVE_NUMBA:
        pytest.skip("the compiled passes need Numba")
    matrix = _split_case(name).astype(np.float32)
    matrix.data[:] = 1.0
    m, n = matrix.shape
    for size in (1, 2, 4):
        for rows, owned, block in _rank_row_blocks(CSRMatrix.from_scipy(matrix), size):
            position = local_positions(owned, n)
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 1 << 62)
            expected = split_rows(block, position, len(owned))  # values in an array
            if way != "numpy":
                monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
                monkeypatch.setattr(_row_blocks, "CROSSING_SHARE",
                                    1.0 if way == "few_ghosts" else -1.0)
            values = repeated(1.0, block.nnz, np.float32)
            given = CSRMatrix(block.indptr, block.indices.copy(), values, block.shape)
            got = split_rows(given, position, len(owned), reuse)
            for made, want in zip(got[:2], expected[:2]):
                assert made.shape == want.shape and made.data.dtype == want.data.dtype
                np.testing.assert_array_equal(made.indptr, want.indptr)
                np.testing.assert_array_equal(made.indices, want.indices)
                np.testing.assert_array_equal(made.data, want.data)
                if way != "numpy" and len(made.data) > 1:
                    assert repeated_value(made.data) is not None
            for made, want in zip(got[2:], expected[2:]):
                np.testing.assert_array_equal(made, want)
            assert repeated_value(given.data) is not None and given.data[0] == 1.0
            monkeypatch.undo()


def _ownerships(matrix, size):
    """``(block, position, n_owned)`` of every rank of ``size``: contiguous row blocks with
    their range of x, the same looked up in a table, and row-modulo rows owning x modulo."""
    m, n = matrix.shape
    for rows, owned, block in _rank_row_blocks(matrix, size):
        yield block, local_positions(owned, n), len(owned)
        yield block, OwnedColumns(owned, n, contiguous=False), len(owned)
    for rank in range(size):
        owned = np.arange(rank, n, size)
        yield matrix.rows(np.arange(rank, m, size)), OwnedColumns(owned, n, contiguous=False), \
            len(owned)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["power_law", "poisson", "band_with_gaps", "empty_rows"])
@pytest.mark.parametrize("index_dtype, value_dtype", [(np.int32, np.float64),
                                                      (np.int64, np.float32)])
@pytest.mark.parametrize("values", ["array", "repeated"])
def test_the_gpus_split_is_the_hosts(monkeypatch, name, index_dtype, value_dtype, values):
    """The GPU's split (RowsOnDevice.split) gives array for array the NumPy passes' blocks, at 1
    to 4 ranks' row blocks (a range of owned x entries, a table, row-modulo owners), values in
    an array or one value repeated (kept repeated), dtypes kept; through split_rows as well
    (the few-ghost split off), where the thread loading the compiled passes is not waited for."""
    from hisparse.arrays import repeated, repeated_value
    from hisparse.distmatrix import _row_blocks, split_rows
    from hisparse.gpu import RowsOnDevice
    matrix = CSRMatrix.from_scipy(_split_case(name)).astype(value_dtype, index_dtype)
    if values == "repeated":
        matrix.data[:] = 0.5

    class Loading:
        def join(self):
            raise AssertionError("the GPU's split waited for the compiled passes' loader")

    for size in (1, 2, 4):
        for block, position, n_owned in _ownerships(matrix, size):
            if values == "repeated":  # (a selection of rows gathers its values into an array)
                block = CSRMatrix(block.indptr, block.indices,
                                  repeated(0.5, block.nnz, value_dtype), block.shape)
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 1 << 62)
            expected = split_rows(block, position, n_owned)  # the NumPy passes
            got = RowsOnDevice().split(block, position, n_owned)
            if block.nnz == 0:  # nothing to move: the host's
                assert got is None
                continue
            _assert_same_split(got, expected)
            if values == "repeated":
                assert all(repeated_value(made.data) is not None for made in got[:2]
                           if len(made.data) > 1)
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
            monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", -1.0)  # never the few-ghost one
            if position.owns_all(block.indices) or position.everything:
                continue  # (the rows themselves)
            _assert_same_split(split_rows(block, position, n_owned, loading=Loading(),
                                          device=RowsOnDevice()), expected)
            monkeypatch.undo()


def test_split_rows_takes_the_devices_blocks_and_falls_back_where_it_declines(monkeypatch):
    """split_rows hands the passes over every entry to ``device`` first (its blocks returned as
    they are), and where it declines (``None``) takes the host's passes, the same blocks as
    without a device."""
    from hisparse.distmatrix import _row_blocks, split_rows
    matrix = CSRMatrix.from_scipy(_split_case("power_law"))
    (rows, owned, block), _ = _rank_row_blocks(matrix, 2)
    position = local_positions(owned, matrix.ncols)
    expected = split_rows(block, position, len(owned))
    monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
    monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", -1.0)
    asked = []

    class Device:
        def __init__(self, answer):
            self.answer = answer

        def split(self, *args):
            asked.append(args)
            return self.answer

    _assert_same_split(split_rows(block, position, len(owned), device=Device(None)), expected)
    mine = ("local", "ghost", "ghost_rows", "ghosts")
    assert split_rows(block, position, len(owned), device=Device(mine)) is mine
    assert len(asked) == 2 and asked[0][0] is block and asked[0][2] == len(owned)


@pytest.mark.parametrize("few_ghosts", [True, False])
def test_split_waits_for_the_loading_thread_only_where_its_passes_run(monkeypatch, few_ghosts):
    """split_rows joins the thread loading its compiled passes (``loading``) exactly where it
    takes them, once, and not where the few-ghost split (a stencil's rows) needs none of them;
    the blocks are the same either way."""
    from hisparse.distmatrix import _row_blocks, split_rows
    from hisparse.compiled import HAVE_NUMBA
    if not HAVE_NUMBA and not few_ghosts:
        pytest.skip("the compiled passes need Numba")

    class Loading:
        joins = 0

        def join(self):
            Loading.joins += 1

    matrix = _split_case("poisson")
    m, n = matrix.shape
    (rows, owned, block), _ = _rank_row_blocks(CSRMatrix.from_scipy(matrix), 2)
    position = local_positions(owned, n)
    located = locate_entries(block, position)
    ghosts = ghost_columns(block, position, located)
    expected = (*split_blocks(block, position, len(owned), ghosts, located), ghosts)
    monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
    monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", 1.0 if few_ghosts else -1.0)
    got = split_rows(block, position, len(owned), loading=Loading())
    assert Loading.joins == (0 if few_ghosts else 1)
    _assert_same_split(got, expected)


@pytest.mark.parametrize("name", CASES + ["poisson", "power_law", "band_with_gaps"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("piece", [None, 7])
@pytest.mark.parametrize("reuse", [False, True])
def test_few_ghosts_split_equals_numpy_passes(monkeypatch, name, index_dtype, piece, reuse):
    """split_rows over a range of owned x entries where only the entries outside it are
    gathered (threshold and share lowered so that every block takes that way) gives array for
    array what the NumPy passes give, and blocks that multiply like the rows, at 1 to 4 ranks'
    row blocks, with empty rows and rows wholly outside the range, in one piece of entries or
    many, made in fresh arrays or (``reuse``) in the block's own; the entries found outside are
    exactly those the NumPy passes locate there, and a block with more than CROSSING_SHARE of
    its entries outside is not split that way."""
    from hisparse.distmatrix import _row_blocks, split_rows
    if piece is not None:
        monkeypatch.setattr(_row_blocks, "ENTRY_PIECE", piece)
    matrix = _split_case(name)
    m, n = matrix.shape
    x = np.random.default_rng(4).uniform(-1, 1, n)
    taken = []
    original = _row_blocks._split_few_ghosts
    monkeypatch.setattr(_row_blocks, "_split_few_ghosts",
                        lambda *args: taken.append(1) or original(*args))
    for size in (1, 2, 4):
        for rows, owned, block in _rank_row_blocks(_with_index_dtype(matrix, index_dtype), size):
            position = local_positions(owned, n)
            located = locate_entries(block, position)
            ghosts = ghost_columns(block, position, located)
            expected = (*split_blocks(block, position, len(owned), ghosts, located), ghosts)
            monkeypatch.setattr(_row_blocks, "SPLIT_COMPILED_MIN", 0)
            monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", 1.0)
            before = len(taken)
            given = CSRMatrix(block.indptr, block.indices.copy(), block.data.copy(), block.shape)
            got = split_rows(given, position, len(owned), reuse)
            assert len(taken) == before + (not position.owns_all(block.indices))
            if len(taken) > before:  # made in the given arrays exactly when asked
                for made, source in ((got[0].indices, given.indices), (got[0].data, given.data)):
                    assert np.shares_memory(made, source) == (reuse and len(made) > 0)
            _assert_same_split(got, expected)
            local, ghost, ghost_rows, ghosts = got
            y = local.to_scipy() @ x[owned]
            y[ghost_rows] += ghost.to_scipy() @ x[ghosts]
            np.testing.assert_allclose(y, matrix[rows] @ x, rtol=1e-5, atol=1e-5)
            outside = _row_blocks._outside_entries(block, position)
            if not position.owns_all(block.indices):  # found, and only those
                np.testing.assert_array_equal(outside, np.flatnonzero(~located[2]))
                monkeypatch.setattr(_row_blocks, "CROSSING_SHARE", 0.0)
                assert _row_blocks._outside_entries(block, position) is None
    assert taken


def test_compaction_pivot_moves_the_fewest_entries():
    """The pivot of a block made in place moves, against every other pivot, the fewest entries
    (each pivot's moves counted by replaying the rule on the pieces' places: a piece moves
    when its kept entries' place before the moves differs from after); ghost entries in one
    piece at a block's start or its end move nothing, in its first two only the first's."""
    from hisparse.distmatrix._row_blocks import _compaction_pivot
    rng = np.random.default_rng(7)

    def moved_by(pivot, kept, lost):
        starts = np.concatenate([[0], np.cumsum(kept + lost)])
        dropped = np.concatenate([[0], np.cumsum(lost)])
        placed = np.where(np.arange(len(kept)) < pivot, starts[1:] - kept, starts[:-1])
        targets = dropped[pivot] + starts[:-1] - dropped[:-1]
        return int(kept[placed != targets].sum())

    for _ in range(200):
        count = int(rng.integers(1, 12))
        kept = rng.integers(0, 50, count)
        lost = rng.integers(0, 3, count) * (rng.random(count) < 0.3)
        pivot, moved = _compaction_pivot(kept, lost)
        assert moved == moved_by(pivot, kept, lost)
        assert moved == min(moved_by(p, kept, lost) for p in range(count + 1))
    kept = np.full(10, 100)
    for lost in ([3] + [0] * 9, [0] * 9 + [5]):
        assert _compaction_pivot(kept, np.array(lost))[1] == 0
    assert _compaction_pivot(kept, np.array([3, 1] + [0] * 8))[1] == 100


def test_x_ownership_square_follows_rows_rectangular_is_even():
    rows = [np.array([0, 3, 6]), np.array([1, 4]), np.array([2, 5])]
    assert all(np.array_equal(a, b) for a, b in zip(x_owners(rows, 7, 7), rows))
    owned = x_owners(rows, 7, 10)
    assert [len(o) for o in owned] == [3, 3, 4]
    np.testing.assert_array_equal(np.concatenate(owned), np.arange(10))


def test_chained_products_is_the_power_iteration():
    matrix = sp.random(60, 60, density=0.2, random_state=3)
    matrix = sp.csr_matrix(matrix + matrix.T + 10 * sp.eye(60))
    x = np.random.default_rng(2).uniform(-1, 1, 60)
    y = matrix @ x
    assert np.array_equal(chained_products(matrix, x, 1), y)  # each row summed in order
    # ||A x_k|| tends to the largest |eigenvalue|.
    largest = np.max(np.abs(np.linalg.eigvalsh(matrix.toarray())))
    assert np.linalg.norm(chained_products(matrix, x, 400)) == pytest.approx(largest, rel=1e-8)
    assert np.all(chained_products(sp.csr_matrix((5, 5)), np.ones(5), 3) == 0)


@pytest.mark.parametrize("cores", [1, 3, 64])
def test_chained_products_on_threads_equal_scipys(monkeypatch, cores):
    """The reference's compiled product on any number of threads: SciPy's product, bit for bit
    (empty rows, a dense row, a rectangular matrix, an empty one, unsorted rows, int64
    indices), chained or not."""
    from hisparse import threads
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    rng = np.random.default_rng(4)
    square = sp.random(200, 200, density=0.05, random_state=5, format="lil")
    square[7, :] = rng.random(200)
    square[20:40, :] = 0
    square = sp.csr_matrix(square)
    shuffled = square.copy()
    for row in range(0, 200, 3):  # rows whose entries are not in column order
        lo, hi = shuffled.indptr[row], shuffled.indptr[row + 1]
        order = rng.permutation(hi - lo)
        shuffled.indices[lo:hi], shuffled.data[lo:hi] = shuffled.indices[lo:hi][order], \
            shuffled.data[lo:hi][order]
    wide = sp.random(30, 90, density=0.1, random_state=6, format="csr")
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    for matrix in (square, shuffled, wide, sp.csr_matrix((3, 4))):
        x = rng.uniform(-1, 1, matrix.shape[1])
        assert np.array_equal(chained_products(matrix, x, 1), matrix @ x)
    x = rng.uniform(-1, 1, 200)
    y = square @ x
    for _ in range(4):
        y = square @ (y / np.linalg.norm(y))
    assert np.array_equal(chained_products(square, x, 5), y)


# -- the halo exchange against SciPy (MPI) --------------------------------------------------------

@pytest.mark.parallel(nprocs=[2, 4])
def test_halo_exchange_products_match_scipy(nprocs):
    comm = get_world()
    transport = MpiTransport(comm)
    failed = []
    for name in CASES:
        matrix = _matrix(name, comm.size)
        m, n = matrix.shape
        rng = np.random.default_rng(11)  # the same partition on every rank
        row_owner, x_owner = _owners(name, matrix, comm.size, rng)
        x = rng.uniform(-1, 1, n)
        rows = np.flatnonzero(row_owner == comm.rank)
        owned = np.flatnonzero(x_owner == comm.rank)
        block = CSRMatrix.from_scipy(matrix).rows(rows)
        position = local_positions(owned, n)
        halo = HaloExchange(transport, owned, ghost_columns(block, position), n)
        local, ghost, ghost_rows = split_blocks(block, position, len(owned), halo.ghosts)
        x_local = x[owned]  # a rank holds only its own entries of x
        ghosts = np.full(halo.n_ghosts, np.nan)
        halo(x_local, ghosts)
        packed = np.full(halo.n_ghosts, np.nan)
        halo(x_local, packed, send_buffer=x_local[halo.send_index], packed=True)
        y = local.to_scipy() @ x_local
        y[ghost_rows] += ghost.to_scipy() @ ghosts
        ok = (np.array_equal(ghosts, x[halo.ghosts]) and np.array_equal(packed, ghosts)
              and np.allclose(y, matrix[rows] @ x, rtol=1e-14, atol=1e-14))
        if name == "block_diagonal":
            ok = ok and halo.n_ghosts == 0 and halo.n_send == 0
        if name == "arrow":  # only rank 0's rows need ghosts; the others only send
            ok = ok and (halo.n_ghosts > 0) == (comm.rank == 0)
        if not agree(comm, ok):
            failed.append(name)
    assert not failed, f"rank {comm.rank}: {failed}"


# -- the operation's chain, in one process per rank (MPI on the CPU; NCCL or MPI on the GPU) ------

def _operation_y(comm, problem, backend, transport, params, strategy, device=None,
                 repeated_values=False):
    """Set up SpMV on ``problem`` (rank 0's; ``None`` elsewhere), run two repetitions, collect;
    returns ``(y on rank 0, the operation)``. ``repeated_values``: every rank's part gets its
    values (all equal) as one value repeated, as a graph made on the GPU hands them over."""
    from hisparse.arrays import repeated
    config = config_from_dict({"operation": {"name": "spmv", "params": params},
                               "input": {"path": "unused.h5"}, "backend": backend,
                               "partition": {"strategy": strategy}})
    ctx = RunContext(config=config, comm=comm, local_comm=node_local(comm), backend=backend,
                     timer=PhaseTimer(SpMV.phases()), device=device, transport=transport)
    op = SpMV(ctx)
    if repeated_values:
        distribute = op.distribute

        def distribute_repeated(problem):
            part, shared = distribute(problem)
            data = part["data"]
            assert len(data) < 2 or np.all(data == data[0])
            part["data"] = repeated(data[0] if len(data) else 0, len(data), data.dtype)
            return part, shared
        op.distribute = distribute_repeated
    op.setup(problem)
    try:
        for _ in range(2):
            op.run_once()
        op.collect()
        return op.result(), op
    finally:
        op.teardown()


OPERATION_CASES = [  # (matrix, params, strategy)
    ("poisson", {"format": "csr", "iterations": 5}, "nnz_balanced"),
    ("poisson", {"format": "csr5", "sigma": 4, "iterations": 5}, "row_modulo"),
    ("empty_rows", {"format": "csr", "iterations": 3}, "row_blocks"),
    ("arrow", {"format": "csr5", "sigma": 2, "iterations": 4}, "row_blocks"),  # ghost-free ranks
    ("rectangular_wide", {"format": "csr5", "sigma": 2, "iterations": 3}, "nnz_balanced"),
    ("rectangular_tall", {"format": "csr", "iterations": 2}, "row_modulo"),
    # the checkerboard's grid: expand and fold (1 x R below 4 ranks: fold only)
    ("poisson", {"format": "csr5", "sigma": 4, "iterations": 5}, "checkerboard"),
    ("empty_rows", {"format": "csr", "iterations": 3, "reorder": "degree"}, "checkerboard"),
    ("rectangular_wide", {"format": "csr", "iterations": 1}, "checkerboard"),
]


def _operation_matrix(name):
    if name == "poisson":
        return generators.poisson([14, 9], stencil=5).to_scipy()
    return _matrix(name)


def _check_operation_cases(comm, backend, transport, device=None, rtol=1e-12):
    """Every OPERATION_CASES run through the operation against this test's own power chain
    (square) or product (rectangular); returns the failing cases (rank 0)."""
    failed = []
    for name, params, strategy in OPERATION_CASES:
        matrix = _operation_matrix(name)
        problem = CSRMatrix.from_scipy(matrix) if comm.rank == 0 else None
        y, op = _operation_y(comm, problem, backend, transport, dict(params, x="random"),
                             strategy, device)
        if comm.rank == 0:
            x = run_x(matrix.shape[1])
            square = matrix.shape[0] == matrix.shape[1]
            reference = power_chain(matrix, x, params["iterations"] if square else 1)
            if np.max(np.abs(y - reference)) > rtol * np.max(np.abs(reference)):
                failed.append(name)
    return failed


@pytest.mark.parallel(nprocs=[2, 4])
def test_operation_chain_matches_power_iteration_cpu(nprocs):
    comm = get_world()
    failed = _check_operation_cases(comm, "cpu", MpiTransport(comm))
    assert agree(comm, not failed), failed


# -- the ghost block's kernel, merged blocks, the exchange's kind (CPU, 1 to 4 ranks) ------------

def _power_law(n, ncols=None, seed=4):
    """A power-law matrix: row lengths from a Zipf law (some rows hold a sizeable share of the
    columns) and columns drawn with a skew towards low numbers, as a graph's hubs are."""
    rng = np.random.default_rng(seed)
    ncols = n if ncols is None else ncols
    lengths = np.minimum(rng.zipf(1.7, n), ncols // 2)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.minimum((rng.pareto(0.9, len(rows)) * 3).astype(np.int64), ncols - 1)
    cols = (cols * 7919) % ncols  # hubs spread over the ranks' ranges
    matrix = sp.csr_matrix((rng.uniform(-1, 1, len(rows)), (rows, cols)), shape=(n, ncols))
    matrix.sum_duplicates()
    return matrix


#: (params beyond format, sigma and iterations); every one at 1-4 ranks, both partitions, fp32 and
#: fp64, on a square power-law matrix (chained) and a rectangular one
OPTION_CASES = [
    {"ghost_format": "csr5"},
    {"ghost_format": "csr5", "reorder": "degree"},
    {"blocks": "merged"},
    {"exchange": "all_gather"},
    {"exchange": "all_gather", "ghost_format": "csr5", "reorder": "degree"},
    {"exchange": "all_gather", "blocks": "merged", "reorder": "degree"},
    {"exchange": "point_to_point", "blocks": "merged", "reorder": "degree"},
    {"format": "csr", "ghost_format": "csr5", "exchange": "auto"},
    {"ghost_rounds": "always"},
    {"ghost_rounds": "always", "ghost_format": "csr5", "reorder": "degree"},
    {"ghost_rounds": "always", "format": "csr", "exchange": "point_to_point"},
]


def _option_failures(comm, backend, transport, device=None, uniform=False,
                     strategies=("nnz_balanced", "row_modulo", "checkerboard"),
                     repeated_values=False):
    """Every OPTION_CASES run through the operation against this test's own power chain
    (square) or product (rectangular); returns the failing cases (rank 0) and checks that the
    exchange taken is the one asked for (or the one ``auto`` picks by volume). ``uniform``:
    every value 1, as in a graph (the GPU then keeps the one value); ``strategies``: the
    partitions run; ``repeated_values`` (with ``uniform``): the parts' values handed over as
    one value repeated (:func:`_operation_y`)."""
    from hisparse.ops.spmv.plan import choose_exchange
    failed = []
    matrices = {"square": _power_law(160), "rectangular": _power_law(90, 130, seed=5)}
    if uniform:
        for matrix in matrices.values():
            matrix.data[:] = 1.0
    for options in OPTION_CASES:
        for strategy in strategies:
            for dtype, rtol in ((np.float64, 1e-12), (np.float32, 3e-5)):
                for shape, matrix in matrices.items():
                    square = shape == "square"
                    params = {"format": "csr5", "sigma": 4, "iterations": 4 if square else 1,
                              "x": "random", **options}
                    problem = (CSRMatrix.from_scipy(matrix).astype(dtype, np.int32)
                               if comm.rank == 0 else None)
                    y, op = _operation_y(comm, problem, backend, transport, params, strategy,
                                         device, repeated_values)
                    case = f"{options} {strategy} {np.dtype(dtype).name} {shape}"
                    asked = options.get("exchange", "auto")
                    taken = choose_exchange(asked, comm.size, matrix.shape[1],
                                            op.plan.exchange_volumes["point_to_point"])
                    if op.plan.exchange_mode != taken or (comm.size == 1) != (taken == "none"):
                        failed.append(case + f": exchange {op.plan.exchange_mode}")
                    if op.local.merged != (options.get("blocks") == "merged" and comm.size > 1):
                        failed.append(case + ": blocks")
                    # rounds wherever asked and possible (the GPU over NCCL, point to point,
                    # split blocks); never where they cannot run (auto decides by the blocks)
                    possible = (backend == "gpu" and bool(transport.device) and
                                op.plan.exchange_mode == "point_to_point" and not op.local.merged)
                    asked_rounds = options.get("ghost_rounds", "auto")
                    rounds = len(op.plan.rounds)
                    if (asked_rounds == "always" and possible and rounds != comm.size - 1) \
                            or (not possible and rounds):
                        failed.append(case + f": {rounds} rounds")
                    if comm.rank == 0:
                        x = run_x(matrix.shape[1]).astype(dtype).astype(np.float64)
                        reference = power_chain(matrix, x, params["iterations"])
                        scale = np.max(np.abs(reference))
                        if y.dtype != dtype or np.max(np.abs(y - reference)) > rtol * scale:
                            failed.append(case)
    return failed


@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_exchange_and_block_options_match_power_iteration_cpu(nprocs):
    comm = get_world()
    failed = _option_failures(comm, "cpu", MpiTransport(comm))
    assert agree(comm, not failed), failed


@pytest.mark.parallel(nprocs=[1, 3])
def test_repeated_unit_values_match_power_iteration_cpu(nprocs):
    """Every option and partition with the parts' unit values handed over as one value
    repeated (a graph made on the GPU): the same products as the power chain."""
    comm = get_world()
    failed = _option_failures(comm, "cpu", MpiTransport(comm), uniform=True,
                              repeated_values=True)
    assert agree(comm, not failed), failed


def test_ghost_format_default_takes_csr5_only_for_long_ghost_rows():
    from hisparse.ops.spmv.plan import ghost_format
    assert ghost_format(None, "csr5", 0) == "csr"
    assert ghost_format(None, "csr5", 1) == "csr5"
    assert ghost_format(None, "csr", 7) == "csr"  # a CSR run has no CSR5 kernels loaded
    assert ghost_format("csr5", "csr", 0) == "csr5"  # asked for: taken
    assert ghost_format("csr", "csr5", 9) == "csr"


def _hub_matrix(n=700, hubs=(3, 401), seed=8):
    """A sparse square matrix with a few dense rows (graph hubs: more than LONG_GHOST_ROW entries
    reaching over every rank's columns) among rows of a few random entries."""
    rng = np.random.default_rng(seed)
    matrix = sp.random(n, n, density=4 / n, random_state=rng, format="lil")
    for hub in hubs:
        matrix[hub, rng.choice(n, 600, replace=False)] = rng.uniform(-1, 1, 600)
    matrix = matrix.tocsr()
    matrix.setdiag(2.0)
    return matrix


@pytest.mark.parallel(nprocs=[1, 2, 3])
def test_ghost_format_default_follows_the_ghost_rows(nprocs):
    """``ghost_format: null`` takes CSR5 for a ghost block with a hub's long row and CSR-vector
    for a stencil's short ghost rows, at every rank count; both products are the power chain's."""
    from hisparse.ops.spmv.plan import LONG_GHOST_ROW
    comm = get_world()
    failed = []
    cases = {"hubs": (_hub_matrix(), comm.size > 1),
             "stencil": (generators.poisson([9, 8, 7], 27).to_scipy(), False)}
    for name, (matrix, long_rows) in cases.items():
        assert not long_rows or np.diff(matrix.indptr).max() > LONG_GHOST_ROW * 2
        for strategy in ("nnz_balanced", "row_modulo"):
            params = {"format": "csr5", "sigma": 4, "iterations": 3, "x": "random"}
            problem = CSRMatrix.from_scipy(matrix).astype(np.float64, np.int32) \
                if comm.rank == 0 else None
            y, op = _operation_y(comm, problem, "cpu", MpiTransport(comm), params, strategy)
            expected = "csr5" if long_rows else "csr"
            if op.summary()["ghost_format"] != expected:
                failed.append(f"{name} {strategy}: {op.summary()['ghost_format']}")
            if comm.rank == 0:
                reference = power_chain(matrix, run_x(matrix.shape[1]), 3)
                if np.max(np.abs(y - reference)) > 1e-12 * np.max(np.abs(reference)):
                    failed.append(f"{name} {strategy}: product")
    assert agree(comm, not failed), failed


def test_choose_exchange_by_volume():
    from hisparse.ops.spmv.plan import ALL_GATHER_MAX_RATIO, choose_exchange
    assert choose_exchange("auto", 1, 100, 0) == "none"
    assert choose_exchange("all_gather", 1, 100, 0) == "none"
    # 4 ranks, n = 100: an all-gather brings 300 entries in all
    assert choose_exchange("auto", 4, 100, 299) == "all_gather"
    assert choose_exchange("auto", 4, 100, int(300 / ALL_GATHER_MAX_RATIO) - 1) == \
        "point_to_point"
    assert choose_exchange("auto", 4, 100, 0) == "point_to_point"  # nothing to move
    assert choose_exchange("all_gather", 4, 100, 0) == "all_gather"
    assert choose_exchange("point_to_point", 2, 100, 100) == "point_to_point"


def test_merge_and_renumber_blocks():
    """merge_blocks gives each row its local then its ghost entries, at the given offsets;
    renumber_columns renames the columns."""
    from hisparse.distmatrix import merge_blocks, renumber_columns
    rng = np.random.default_rng(3)
    local = CSRMatrix.from_scipy(sp.random(30, 12, density=0.2, random_state=rng, format="csr"))
    ghost = CSRMatrix.from_scipy(sp.random(8, 5, density=0.5, random_state=rng, format="csr"))
    ghost_rows = np.sort(rng.choice(30, 8, replace=False))
    x_all = rng.uniform(-1, 1, 40)
    merged = merge_blocks(local, ghost, ghost_rows, 20, 33, 40)
    want = local.to_scipy() @ x_all[20:32]
    want[ghost_rows] += ghost.to_scipy() @ x_all[33:38]
    np.testing.assert_allclose(merged.to_scipy() @ x_all, want, rtol=1e-14)
    assert merged.shape == (30, 40) and merged.nnz == local.nnz + ghost.nnz
    assert merged.indptr.dtype == merged.indices.dtype
    for row in range(30):  # local entries first, in their order
        got = merged.indices[merged.indptr[row]:merged.indptr[row + 1]]
        mine = local.indices[local.indptr[row]:local.indptr[row + 1]] + 20
        np.testing.assert_array_equal(got[:len(mine)], mine)
    new_column = rng.permutation(5) + 2
    moved = renumber_columns(ghost, new_column, 7)
    np.testing.assert_allclose(moved.to_scipy() @ x_all[:7],
                               ghost.to_scipy() @ x_all[new_column], rtol=1e-14)


@pytest.mark.parallel(nprocs=[3])
def test_halo_exchange_keeps_the_given_order(nprocs):
    """keep_order: each owner's entries arrive in the order asked for (grouped by owner)."""
    comm = get_world()
    n = 60
    owned = np.arange(comm.rank, n, comm.size)
    rng = np.random.default_rng(comm.rank)
    wanted = rng.permutation(np.setdiff1d(np.arange(n), owned))[:25]
    halo = HaloExchange(MpiTransport(comm), owned, wanted, n, keep_order=True)
    owner = halo.ghosts % comm.size
    expected = np.concatenate([wanted[wanted % comm.size == r] for r in range(comm.size)])
    x = np.arange(n, dtype=np.float64) * 1.5
    got = np.full(halo.n_ghosts, np.nan)
    halo(x[owned], got)
    ok = (np.array_equal(halo.ghosts, expected) and np.all(np.diff(owner) >= 0)
          and np.array_equal(got, x[halo.ghosts]))
    with pytest.raises(ValueError, match="repeat"):
        HaloExchange(MpiTransport(comm), owned, np.concatenate([wanted[:3], wanted[:1]]), n,
                     keep_order=True)
    with pytest.raises(ValueError, match="repeat"):  # out of range as well as repeated
        HaloExchange(MpiTransport(comm), owned, np.array([n + 5, 0, n + 5]), n, keep_order=True)
    assert agree(comm, ok)


# -- whole runs (CPU) -----------------------------------------------------------------------------

@pytest.mark.parametrize("nprocs,params,strategy", [
    (2, {"format": "csr5", "iterations": 6}, "row_modulo"),
    (4, {"format": "csr", "iterations": 6}, "nnz_balanced"),
])
def test_chained_run_matches_scipy_power_iteration(tmp_path, nprocs, params, strategy):
    dims = [30, 30]
    cfg = write_config(tmp_path, "spmv", dict(params, x="random"),
                       input={"generate": {"kind": "poisson", "dims": dims}}, backend="cpu",
                       partition={"strategy": strategy})
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["verify_passed"]
    matrix = generators.poisson(dims).to_scipy()
    reference = power_chain(matrix, run_x(matrix.shape[0]), params["iterations"])
    np.testing.assert_allclose(arrays["y"], reference, rtol=1e-12, atol=1e-12)
    ranks = run["rank_vars"]
    assert np.all(ranks["ghosts"] > 0)
    # Every ghost entry a rank receives is sent by another rank.
    assert int(np.sum(ranks["ghosts"])) == int(np.sum(ranks["halo_sends"]))
    np.testing.assert_array_equal(ranks["halo_bytes_per_product"],
                                  8 * (ranks["ghosts"] + ranks["halo_sends"]))
    assert int(np.sum(ranks["local_nnz"] + ranks["ghost_nnz"])) == matrix.nnz
    kinds, scopes = run["phase_kinds"], run["phase_scopes"]
    assert kinds["halo"] == "communication" and kinds["kernel"] == kinds["normalize"] == "compute"
    assert scopes["collect"] == "after" and scopes["halo"] == "repeat"
    for phase in ("halo", "kernel", "normalize"):  # in every repeat, on every rank
        assert np.all(np.isfinite(run["wall"][:, :, run["phases"].index(phase)]))
    # the plan's steps, per rank, add up to no more than the slowest rank's plan phase
    steps = [ranks[f"plan_{step}_seconds"] for step in
             ("own_x", "split", "exchange", "uniform", "reorder", "layout")]
    assert np.all(np.asarray(steps) >= 0)
    plan = np.nanmax(run["wall"][0, :, run["phases"].index("plan")])
    assert np.all(np.sum(steps, axis=0) <= plan + 1e-6)


@pytest.mark.parametrize("chained", [True, False])
def test_reorder_local_keeps_the_product(chained):
    """A local block renumbered by degree, with a ghost block and send positions, gives the
    same local product, ghost rows and packed entries as the original, once y is restored."""
    rng = np.random.default_rng(5)
    n, m = 60, (60 if chained else 45)
    block = sp.random(n, m, density=0.08, random_state=6, format="lil")
    block[np.arange(7), 0] = 1.0  # a much-used column and long rows
    block = block.tocsr()
    ghost = sp.random(9, 5, density=0.5, random_state=7, format="csr")
    ghost_rows = np.sort(rng.choice(n, 9, replace=False)).astype(np.int32)
    send_index = rng.choice(m, 6, replace=False).astype(np.int32)
    local = SpmvLocal(CSRMatrix(block.indptr.astype(np.int32), block.indices.astype(np.int32),
                                block.data, block.shape), rng.uniform(-1, 1, m),
                      CSRMatrix(ghost.indptr.astype(np.int32), ghost.indices.astype(np.int32),
                                ghost.data, ghost.shape), ghost_rows, send_index,
                      chained=chained)
    x_ghost = rng.uniform(-1, 1, 5)

    def product(part):
        y = part.matrix.to_scipy() @ part.x
        y[part.ghost_rows] += part.ghost.to_scipy() @ x_ghost
        return y

    moved, rows = reorder_local(local, True)
    assert rows is not None and np.all(np.diff(moved.ghost_rows) > 0)
    lengths = np.diff(moved.matrix.indptr)
    assert np.all(np.diff(lengths) <= 0)  # long rows first
    np.testing.assert_allclose(restore_rows(product(moved), rows), product(local), rtol=1e-13)
    np.testing.assert_array_equal(moved.x[moved.send_index], local.x[local.send_index])
    assert reorder_local(local, False) == (local, None)


def _renumbered_by(where, matrix, row_ids, new_column):
    """:meth:`CSRMatrix.renumbered` on the host, or the GPU's (all values, or only the columns
    where every value is the same)."""
    if where == "host":
        return matrix.renumbered(row_ids, new_column)
    from hisparse.gpu import RowsOnDevice
    got = RowsOnDevice(same_values=where == "gpu_same_values").renumbered(matrix, row_ids,
                                                                         new_column)
    assert got is not None  # CuPy there, keys of 64 bits, room on the device
    return got


RENUMBER_PLACES = ["host", pytest.param("gpu", marks=pytest.mark.gpu),
                   pytest.param("gpu_same_values", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("where", RENUMBER_PLACES)
@pytest.mark.parametrize("index_dtype,value_dtype", [(np.int32, np.float64),
                                                     (np.int64, np.float32)])
def test_renumbered_is_scipys_permutation_with_sorted_rows(index_dtype, value_dtype, where):
    """Rows of 0 to 90 entries (past the insertion-sort length and below it), any row order,
    any column renumbering: the same arrays as SciPy's A[rows][:, columns] sorted, on the
    host and on the GPU (a selection of rows too, empty rows at both ends)."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 91, size=300)
    lengths[rng.random(300) < 0.2] = 0
    lengths[[0, -1]] = 0
    ncols = 120
    rows_of = np.repeat(np.arange(300), lengths)
    cols = np.concatenate([rng.choice(ncols, k, replace=False) for k in lengths])
    values = np.full(len(cols), 0.5) if where == "gpu_same_values" else \
        rng.uniform(-1, 1, len(cols))
    matrix = sp.csr_matrix((values, (rows_of, cols)), shape=(300, ncols))
    csr = CSRMatrix.from_scipy(matrix).astype(value_dtype, index_dtype)
    columns = rng.permutation(ncols)
    new_column = np.empty_like(columns)
    new_column[columns] = np.arange(ncols)
    for row_ids in (rng.permutation(300), rng.choice(300, 40, replace=False)):
        got = _renumbered_by(where, csr, row_ids, new_column)
        want = csr.to_scipy()[row_ids][:, columns].tocsr()
        want.sort_indices()
        assert got.indices.dtype == index_dtype and got.data.dtype == value_dtype
        assert got.indptr.dtype == csr.indptr.dtype
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
        assert got.shape == (len(row_ids), ncols)


@pytest.mark.gpu
def test_the_gpus_degree_order_is_order_by_count():
    """The GPU's degree order and its inverse equal the host's for ties, hubs past the host's
    16-bit radix clip, zeros, one count and none; a block below ``min_entries`` is the host's
    to order."""
    from hisparse.arrays import order_by_count
    from hisparse.gpu import RowsOnDevice
    rng = np.random.default_rng(12)
    cases = [rng.integers(0, 5, size=5000), (rng.pareto(1.1, 20000) * 4).astype(np.int64),
             np.array([70000, 3, 70000, 65535, 65536, 0, 3]), np.zeros(10, dtype=np.int64),
             np.array([4]), np.zeros(0, dtype=np.int64)]
    for counts in cases:
        order, inverse = RowsOnDevice().degree_order(counts, 1)
        np.testing.assert_array_equal(order, order_by_count(counts))
        np.testing.assert_array_equal(inverse[order], np.arange(len(counts)))
        assert order.dtype == np.int64 and inverse.dtype == np.int64
    assert RowsOnDevice(min_entries=100).degree_order(cases[0], 99) is None


@pytest.mark.gpu
def test_the_gpus_renumbering_keeps_duplicates_in_the_hosts_order():
    """Columns repeated in a row (duplicates kept, values differing) come out of the GPU's
    stable sort in the host's order, and a block with no entries stays empty."""
    from hisparse.gpu import RowsOnDevice
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 40, size=50)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    csr = CSRMatrix(indptr, np.sort(rng.integers(0, 6, size=indptr[-1])).astype(np.int32),
                    rng.uniform(-1, 1, indptr[-1]), (50, 6))
    row_ids, new_column = rng.permutation(50), rng.permutation(6)
    want = csr.renumbered(row_ids, new_column)
    got = RowsOnDevice().renumbered(csr, row_ids, new_column)
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    # a block with no entries is left to the host (nothing to move)
    empty = CSRMatrix(np.zeros(4, np.int64), np.zeros(0, np.int32), np.zeros(0), (3, 6))
    assert RowsOnDevice().renumbered(empty, np.arange(3), np.arange(6)) is None
    assert RowsOnDevice(min_entries=csr.nnz + 1).rows(csr, row_ids) is None
    # rows moved with their columns renamed on the way: renumber_columns of the moved rows
    names = rng.permutation(6)
    got = RowsOnDevice().rows(csr, row_ids, names)
    want = renumber_columns(csr.rows(row_ids), names, 6)
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        assert getattr(got, name).dtype == getattr(want, name).dtype


@pytest.mark.parametrize("where", ["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_use_order_is_order_by_count_of_the_uses(where):
    """The columns' use order (the SpMV plan's ghost order) from the GPU's count and sort, and
    from the host's where the GPU declines, is order_by_count of NumPy's bincount: ties in
    index order, unused columns last, hubs past the host's 16-bit radix clip; a block below
    ``min_entries`` or with no entries is the host's, a column outside the range is named."""
    from hisparse.arrays import order_by_count
    rng = np.random.default_rng(21)
    hubs = np.concatenate([np.full(70000, 2), np.full(65536, 5), np.full(65535, 0),
                           rng.integers(0, 9, 1000)])
    cases = [(rng.integers(0, 50, 5000).astype(np.int32), 60),
             ((rng.pareto(1.1, 40000) * 3).astype(np.int64) % 3000, 3000),
             (rng.permutation(hubs), 9), (np.array([4], np.int32), 5)]
    device_rows = _passes_for(where)
    for values, size in cases:
        order, inverse = use_order(values, size, device_rows)
        np.testing.assert_array_equal(order, order_by_count(np.bincount(values, minlength=size)))
        np.testing.assert_array_equal(inverse[order], np.arange(size))
        assert order.dtype == np.int64 and inverse.dtype == np.int64
    if where == "gpu":
        from hisparse.gpu import RowsOnDevice
        assert RowsOnDevice(min_entries=100).use_order(cases[0][0][:99], 60) is None
        assert RowsOnDevice().use_order(np.zeros(0, np.int32), 60) is None
        with pytest.raises(ValueError, match="7"):
            RowsOnDevice().use_order(np.array([0, 7]), 5)
    else:
        assert device_rows.calls == ["use_order"] * len(cases)


def _local_with_ghosts(uniform, chained):
    """A rank's power-law-ish local block (long rows, a much-used column) with a ghost block
    over some of its rows, send positions and, when not chained, more x entries than rows."""
    rng = np.random.default_rng(8)
    m = 500 if chained else 430
    block = sp.random(500, m, density=0.03, random_state=9, format="lil")
    block[np.arange(40), 3] = 1.0
    block = block.tocsr()
    ghost = sp.random(120, 70, density=0.1, random_state=10, format="csr")
    if uniform:
        block.data[:] = 1.0
        ghost.data[:] = 1.0
    return SpmvLocal(CSRMatrix.from_scipy(block).astype(None, np.int32),
                     rng.uniform(-1, 1, m),
                     CSRMatrix(ghost.indptr.astype(np.int32),
                               np.ascontiguousarray(ghost.indices[::-1]).astype(np.int32),
                               ghost.data, ghost.shape),  # rows not sorted: kept as they are
                     np.sort(rng.choice(500, 120, replace=False)).astype(np.int32),
                     rng.choice(m, 30, replace=False).astype(np.int32), chained=chained)


def _passes_for(where, same_values=False):
    """The passes a test hands the plan: the host stand-in that declines every one
    (:class:`_Asked`), or the GPU's (:class:`hisparse.gpu.RowsOnDevice`)."""
    if where == "host":
        return _Asked()
    from hisparse.gpu import RowsOnDevice
    return RowsOnDevice(same_values=same_values)


class _Asked:
    """A :class:`hisparse.gpu.RowsOnDevice` stand-in that answers ``None`` (no CuPy, no room on
    the device) and counts the calls."""

    def __init__(self):
        self.calls = []

    def degree_order(self, *args):
        self.calls.append("degree_order")

    def use_order(self, *args):
        self.calls.append("use_order")

    def renumbered(self, *args):
        self.calls.append("renumbered")

    def rows(self, *args):
        self.calls.append("rows")


@pytest.mark.parametrize("where", RENUMBER_PLACES + [
    "host_repeated", pytest.param("gpu_repeated", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("chained", [True, False])
def test_reorder_local_with_the_gpus_passes_is_the_hosts(where, chained):
    """The SpMV plan's degree renumbering with the GPU's passes gives the very blocks, x, ghost
    rows and send positions of the host's; where they answer ``None`` (the host stand-in) the
    host's passes make the same; unit values given as one value repeated (a graph made on the
    GPU) give the same blocks."""
    from hisparse.arrays import repeated
    uniform = where in ("gpu_same_values", "gpu_repeated", "host_repeated")
    local = _local_with_ghosts(uniform, chained)
    want, want_rows = reorder_local(local, True)
    if where.endswith("repeated"):
        local = replace(local, **{name: replace(block, data=repeated(1.0, block.nnz))
                                  for name, block in (("matrix", local.matrix),
                                                      ("ghost", local.ghost))})
        where = where.split("_")[0]
    device_rows = _passes_for(where, uniform)
    got, got_rows = reorder_local(local, True, device_rows)
    if where == "host":
        assert device_rows.calls == ["degree_order"] + ([] if chained else ["use_order"]) + \
            ["renumbered", "rows"]
    np.testing.assert_array_equal(got_rows, want_rows)
    for block in ("matrix", "ghost"):
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(getattr(got, block), name),
                                          getattr(getattr(want, block), name))
        assert getattr(got, block).shape == getattr(want, block).shape
    for name in ("x", "ghost_rows", "send_index"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("where", ["host", pytest.param("gpu", marks=pytest.mark.gpu),
                                   pytest.param("gpu_same_values", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("chained", [True, False])
def test_reorder_local_renames_the_ghost_columns_as_renumber_columns_does(where, chained):
    """The halo's receive order given to the degree renumbering (``ghost_columns``) gives the
    blocks the plan made before, when it renamed the ghost columns first
    (:func:`renumber_columns`), on the host and with the GPU's passes; without a degree
    renumbering to ride on it is refused, not dropped."""
    uniform = where == "gpu_same_values"
    local = _local_with_ghosts(uniform, chained)
    names = np.random.default_rng(5).permutation(local.ghost.ncols)
    want, want_rows = reorder_local(
        replace(local, ghost=renumber_columns(local.ghost, names, local.ghost.ncols)), True)
    device_rows = _passes_for(where, uniform)
    got, got_rows = reorder_local(local, True, device_rows, names)
    np.testing.assert_array_equal(got_rows, want_rows)
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got.ghost, name), getattr(want.ghost, name))
        assert getattr(got.ghost, name).dtype == getattr(want.ghost, name).dtype
    assert got.ghost.shape == want.ghost.shape
    np.testing.assert_array_equal(got.ghost_rows, want.ghost_rows)
    with pytest.raises(ValueError, match="renumbering"):
        reorder_local(local, False, None, names)


@pytest.mark.parametrize("nprocs,rows,cols", [(1, 400, 400), (2, 400, 400), (4, 300, 500)])
def test_degree_reorder_run_matches_plain_run(tmp_path, nprocs, rows, cols):
    """reorder: degree on a power-law matrix gives y in the original order: the same as without
    it (chained for square A), at 1, 2 and 4 ranks."""
    generate = {"kind": "random_matrix", "rows": rows, "cols": cols, "nnz_per_row": 6,
                "power_law": 1.5, "seed": 3}
    ys = {}
    for reorder in ("none", "degree"):
        cfg = write_config(tmp_path, "spmv", {"format": "csr5", "iterations": 4,
                                              "reorder": reorder},
                           name=f"{reorder}.yaml", out=reorder, backend="cpu",
                           input={"generate": generate})
        run, arrays = run_config(tmp_path, cfg, nprocs=nprocs, out=reorder)
        assert run["attrs"]["verify_passed"]
        ys[reorder] = arrays["y"]
    np.testing.assert_allclose(ys["degree"], ys["none"], rtol=1e-12,
                               atol=1e-12 * np.max(np.abs(ys["none"])))


# -- GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("params", [{"format": "csr", "iterations": 7},
                                    {"format": "csr5", "iterations": 70}], ids=["csr", "csr5"])
def test_gpu_chained_run_matches_scipy_power_iteration(tmp_path, params):
    """The chain replayed from CUDA graphs (gpu.graphs, the default; 70 products = more than one
    recorded unit of 64) and launched product by product give the same y, bit for bit, and the
    power iteration's."""
    dims = [24, 24, 24]
    runs = {}
    for graphs in (True, False):
        out = f"graphs_{graphs}"
        cfg = write_config(tmp_path, "spmv", dict(params, x="random"), name=f"{out}.yaml",
                           out=out, input={"generate": {"kind": "poisson", "dims": dims,
                                                        "stencil": 27}},
                           backend="gpu", gpu={"graphs": graphs})
        runs[graphs] = run_config(tmp_path, cfg, nprocs=1, out=out)
    matrix = generators.poisson(dims, stencil=27).to_scipy()
    reference = power_chain(matrix, run_x(matrix.shape[0]), params["iterations"])
    for graphs, (run, arrays) in runs.items():
        assert run["attrs"]["backend"] == "gpu" and run["attrs"]["verify_passed"]
        assert np.max(np.abs(arrays["y"] - reference)) <= 1e-12 * np.max(np.abs(reference))
        nodes = run["rank_vars"]["graph_nodes"]
        # device phases timed by CUDA events; a replay is timed as one "kernel"
        timed = ("kernel",) if graphs else ("kernel", "normalize", "start")
        for phase in timed:
            assert np.all(np.isfinite(run["gpu"][:, :, run["phases"].index(phase)]))
        if graphs:
            assert np.all(nodes >= params["iterations"])  # at least one kernel per product
        else:
            assert np.all(nodes == 0)
    np.testing.assert_array_equal(runs[True][1]["y"], runs[False][1]["y"])


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("uniform", [False, True, "repeated"])
@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_modulo",  # apart: pytest -n spreads
                                      "checkerboard"])
def test_gpu_exchange_and_block_options_match_power_iteration(nprocs, uniform, strategy):
    """The ghost block on CSR5 (into mapped rows), merged blocks, the all-gather and the exchange
    in rounds (each rank's ghost part as its round arrives) on NCCL (CUDA graphs replayed),
    against the power chain, fp32 and fp64, each partition (the checkerboard's fold too); unit
    values as arrays and as one value repeated (a graph made on the GPU)."""
    with gpu_transport("nccl") as (comm, device, transport):
        failed = _option_failures(comm, "gpu", transport, device, uniform=bool(uniform),
                                  strategies=(strategy,),
                                  repeated_values=uniform == "repeated")
    assert agree(comm, not failed), failed


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2])
@pytest.mark.parametrize("kind", ["nccl", "mpi"])
def test_gpu_operation_chain_matches_power_iteration(nprocs, kind):
    with gpu_transport(kind) as (comm, device, transport):
        failed = _check_operation_cases(comm, "gpu", transport, device)
    assert agree(comm, not failed), failed


@pytest.mark.parametrize("cuts", [[0.0, 1.0], [0.0, 0.3, 0.3, 0.7, 1.0], [0.0, 0.5, 1.0]])
def test_split_column_ranges_parts_sum_to_the_block(cuts):
    """A power-law ghost block cut by column ranges (an empty range included): every entry in
    exactly one part, in its range, the parts' rows ascending and their products, added into
    the block's rows, equal SciPy's product of the whole block."""
    from hisparse.distmatrix import split_column_ranges
    matrix = _power_law(300, 240)
    block = CSRMatrix.from_scipy(matrix)
    rows = np.arange(1000, 1000 + matrix.shape[0]) * 3  # the block's rows in a larger matrix
    bounds = np.round(np.array(cuts) * matrix.shape[1]).astype(np.int64)
    x = np.random.default_rng(2).uniform(-1, 1, matrix.shape[1])
    y = np.zeros(rows.max() + 1)
    pieces = split_column_ranges(block, rows, bounds)
    assert len(pieces) == len(bounds) - 1
    assert sum(part.nnz for part, _ in pieces) == block.nnz
    for (part, part_rows), low, high in zip(pieces, bounds[:-1], bounds[1:]):
        assert np.all((part.indices >= low) & (part.indices < high))
        assert np.all(np.diff(part.indptr) > 0) and np.all(np.diff(part_rows) > 0)
        y[part_rows] += part.to_scipy() @ x
    np.testing.assert_allclose(y[rows], matrix @ x, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="bounds"):
        split_column_ranges(block, rows, [0, 10])


@pytest.mark.parametrize("value_dtype", [np.float32, np.float64])
def test_split_loops_load_on_a_thread(value_dtype):
    """start_loading_split_loops runs the compiled split once per index dtype on its thread
    (what a multi-rank SpMV starts while it reads): it ends without an error, and both passes
    then hold a compiled version for int32 and for int64 columns with these values."""
    from hisparse.compiled import HAVE_NUMBA
    from hisparse.distmatrix import _row_blocks, start_loading_split_loops
    if not HAVE_NUMBA:
        pytest.skip("Numba is not installed")
    thread = start_loading_split_loops(value_dtype)
    thread.join(60)
    assert not thread.is_alive() and np.isfinite(thread.seconds)
    for passes in (_row_blocks._count_ghost_entries, _row_blocks._place_block_entries):
        columns = {str(signature[1].dtype) for signature in passes.dispatcher().signatures}
        assert {"int32", "int64"} <= columns  # the columns' argument
    values = {str(signature[2].dtype) for signature in
              _row_blocks._place_block_entries.dispatcher().signatures}
    assert np.dtype(value_dtype).name in values


@pytest.mark.parametrize("spec, ranks, loads, strategy", [
    ({"kind": "poisson", "dims": [6, 5, 4], "stencil": 27}, 2, False, "nnz_balanced"),
    ({"kind": "trefethen", "n": 50}, 4, False, "nnz_balanced"),
    ({"kind": "rmat", "scale": 6}, 2, True, "nnz_balanced"),
    ({"kind": "random_matrix", "rows": 40, "nnz_per_row": 4}, 3, True, "nnz_balanced"),
    ("mesh.h5", 2, False, "nnz_balanced"),  # a file whose sampled rows stay near their range
    ("mesh.h5", 3, True, "row_modulo"),  # row-modulo owns no range of x: compiled passes
    ("graph.h5", 2, True, "row_blocks"),  # a file whose rows reach out
    ("missing.h5", 2, True, "nnz_balanced"),  # not readable: the read will say why
    ({"kind": "rmat", "scale": 6}, 1, False, "nnz_balanced"),  # one rank splits nothing
])
def test_split_loader_starts_where_the_split_will_want_it(monkeypatch, tmp_path, spec, ranks,
                                                           loads, strategy):
    """SpMV's before_read starts the compiled split's loader at several ranks, except for an
    input generated by a band (a stencil) or a file whose sampled rows stay near every rank's
    range of x (a mesh's): their split looks at the crossing rows alone. With ``reorder:
    degree`` it starts the renumbering's loader as well, at any rank count, except for a band.
    Neither where the GPU will split and renumber the rank's block."""
    from types import SimpleNamespace
    from hisparse.ops.spmv import op as spmv_op
    from hisparse.io import write_matrix
    write_matrix(str(tmp_path / "mesh.h5"), generators.poisson([10, 10, 10], stencil=27))
    write_matrix(str(tmp_path / "graph.h5"), generators.rmat(10, seed=1))
    started, background = [], []
    monkeypatch.setattr(spmv_op, "start_loading_split_loops",
                        lambda value_dtype: started.append(value_dtype) or "thread")
    monkeypatch.setattr(spmv_op, "in_background",
                        lambda steps, name: background.append(name) or "thread")
    section = {"generate": spec, "path": None, "group": "/"} if not isinstance(spec, str) \
        else {"generate": None, "path": str(tmp_path / spec), "group": "/"}
    band = isinstance(spec, dict) and spec["kind"] in ("poisson", "trefethen")
    for rank, reorder, on_device in itertools.product(range(ranks), ("none", "degree"),
                                                      (False, True)):
        started.clear()
        background.clear()
        monkeypatch.setattr(spmv_op, "plans_on_device", lambda ctx: on_device)
        holder = SimpleNamespace(split_loader=None, row_strategy=strategy,
                                 params={"reorder": reorder}, ctx=SimpleNamespace(
            size=ranks, rank=rank, config={"input": section}, value_dtype=np.float32))
        SpMV.before_read(holder)
        # (neither loader where the GPU will split and renumber the block)
        assert started == ([np.float32] if loads and not on_device else [])
        assert holder.split_loader == ("thread" if loads and not on_device else None)
        assert background == (["hisparse-load-renumber"]
                              if reorder == "degree" and not band and not on_device else [])
    if isinstance(spec, dict):
        assert generators.makes_band(generators.validate_spec(dict(spec))) == \
            (spec["kind"] in ("poisson", "trefethen"))
    tensor = generators.validate_spec({"kind": "random_tensor", "dims": [4, 5, 6]})
    assert not generators.makes_band(tensor)  # no matrix at all


@pytest.mark.parametrize("backend, cupy, scale, ranks, expected", [
    ("gpu", True, 20, 1, True),     # 16.8M edges a rank (a bound): the GPU's renumbering
    ("gpu", True, 20, 8, False),    # 2.1M a rank: the host's
    ("gpu", False, 20, 1, False),   # no CuPy: the host's
    ("cpu", True, 20, 1, False)])
def test_the_renumbering_is_expected_on_the_gpu_for_large_blocks(monkeypatch, backend, cupy,
                                                                 scale, ranks, expected):
    """SpMV expects its degree renumbering on the GPU (so loads no compiled pass for it during
    the read) for a GPU run with CuPy whose input's header puts DEVICE_RENUMBER_MIN_NNZ entries
    or more on a rank."""
    from types import SimpleNamespace
    import hisparse.gpu
    monkeypatch.setattr(hisparse.gpu, "optional_cupy", lambda purpose: object() if cupy else None)
    config = config_from_dict({"operation": {"name": "spmv", "params": {"reorder": "degree"}},
                               "input": {"generate": {"kind": "rmat", "scale": scale}},
                               "backend": backend})
    from hisparse.ops.spmv.plan import plans_on_device
    ctx = SimpleNamespace(backend=backend, size=ranks, config=config)
    assert plans_on_device(ctx) == expected
