"""SpMV's plan at its share (issue 33): the halo exchange planned from each rank's range of x
(no owner table of the vector's length) against a plan worked out from a whole owner table here,
the all-gather of index lists, the ghost block's rows moved piece by piece and put in the new
row order without a sort, and a rank's share of the random x made without the rest."""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.formats import CSRMatrix, _csr
from hisparse.ops import make_vector
from hisparse.ops.spmv.local import ghost_rows_in_order
from hisparse.ops.spmv.plan import vector_share
from hisparse.parallel import HaloExchange, MpiTransport, get_world
from hisparse.parallel import all_gather_concatenated

from helpers import agree


# -- the halo's plan against one worked out from a whole owner table --------------------------

def _owner_map(kind, n, size, rng):
    """Owner of every index (-1: none) for an ownership ``kind``, the same on every rank."""
    if kind == "ranges":  # consecutive blocks in rank order, the last rank owning nothing
        bounds = np.linspace(0, n, size, dtype=np.int64)
        return np.searchsorted(bounds, np.arange(n), side="right") - 1
    if kind == "reversed_ranges":  # consecutive blocks, rank size - 1 first, a gap at the end
        owner = np.full(n, -1)
        cuts = np.linspace(0, n - 3, size + 1, dtype=np.int64)
        for block in range(size):
            owner[cuts[block]:cuts[block + 1]] = size - 1 - block
        return owner
    if kind == "modulo":
        return np.arange(n) % size
    return rng.integers(0, size, size=n)  # scattered


def _asked(owner, rank, size, keep_order):
    """What rank ``rank`` asks for (the same draw on every rank): a random subset of the
    others' indices, unsorted when the order is kept; rank 1 asks for nothing."""
    rng = np.random.default_rng(500 + rank)
    others = np.flatnonzero((owner != rank) & (owner >= 0))
    if rank == 1 or not len(others):
        return np.zeros(0, np.int64)
    wanted = rng.choice(others, size=min(40, len(others)), replace=False)
    return wanted if keep_order else np.sort(wanted)


def _expected_plan(owner, rank, size, keep_order):
    """(ghosts in receive order, recv counts, send counts, send index) of ``rank``, from the
    whole owner table: grouped by owner (ascending within an owner unless the order is kept)."""
    def receive(r):
        asked = _asked(owner, r, size, keep_order)
        if not keep_order:
            asked = np.unique(asked)
        return asked[np.argsort(owner[asked], kind="stable")]
    ghosts = receive(rank)
    owned = np.flatnonzero(owner == rank)
    sends = [receive(r)[owner[receive(r)] == rank] for r in range(size)]
    send_index = np.concatenate([np.searchsorted(owned, s) for s in sends])
    return (ghosts, np.bincount(owner[ghosts], minlength=size),
            np.array([len(s) for s in sends]), send_index)


@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_halo_plan_matches_the_plan_from_a_whole_owner_table(nprocs):
    comm = get_world()
    n, failed = 301, []
    for kind in ("ranges", "reversed_ranges", "modulo", "scattered"):
        owner = _owner_map(kind, n, comm.size, np.random.default_rng(7))
        owned = np.flatnonzero(owner == comm.rank)
        x = np.random.default_rng(3).standard_normal(n)
        for keep_order in (False, True):
            asked = _asked(owner, comm.rank, comm.size, keep_order)
            halo = HaloExchange(MpiTransport(comm), owned, asked, n, keep_order=keep_order)
            ghosts, recv_counts, send_counts, send_index = _expected_plan(
                owner, comm.rank, comm.size, keep_order)
            got = np.full(halo.n_ghosts, np.nan)
            halo(x[owned], got)
            base = asked if keep_order else np.unique(asked)
            ok = (np.array_equal(halo.ghosts, ghosts) and
                  np.array_equal(halo.recv_counts, recv_counts) and
                  np.array_equal(halo.send_counts, send_counts) and
                  np.array_equal(halo.send_index, send_index) and
                  np.array_equal(base[halo.receive_order], halo.ghosts) and
                  np.array_equal(got, x[ghosts]))
            if not ok:
                failed.append((kind, keep_order))
    assert agree(comm, not failed), f"rank {comm.rank}: {failed}"


@pytest.mark.parallel(nprocs=[2, 4])
def test_halo_plan_over_ranges_makes_nothing_of_the_vector_length(nprocs):
    """Ranges 2^38 apart in a vector of 2^40 entries (int64 indices): an owner table of the
    vector's length (8 TiB) could not be made, so the plan works from the ranges alone."""
    comm = get_world()
    n, width = 1 << 40, 50
    starts = np.arange(comm.size, dtype=np.int64) << 38
    owned = starts[comm.rank] + np.arange(width, dtype=np.int64)
    rng = np.random.default_rng(comm.rank)
    others = np.concatenate([s + np.arange(width) for r, s in enumerate(starts) if r != comm.rank])
    asked = rng.choice(others, size=30, replace=False)
    value = (owned % 1000).astype(np.float64)  # entry i of x is i mod 1000
    ok = True
    for keep_order in (False, True):
        halo = HaloExchange(MpiTransport(comm), owned, asked, n, keep_order=keep_order)
        got = np.full(halo.n_ghosts, np.nan)
        halo(value, got)
        owners = halo.ghosts >> 38
        expected = asked[np.argsort(asked >> 38, kind="stable")] if keep_order else \
            np.sort(asked)
        ok = ok and np.array_equal(halo.ghosts, expected) and np.all(np.diff(owners) >= 0)
        ok = ok and np.array_equal(got, (halo.ghosts % 1000).astype(np.float64))
    with pytest.raises(ValueError, match="owned by no rank"):  # between the ranges
        HaloExchange(MpiTransport(comm), owned, np.array([width + 7], dtype=np.int64), n)
    assert agree(comm, ok)


@pytest.mark.parallel(nprocs=[3])
def test_all_gather_concatenated_in_rank_order(nprocs):
    comm = get_world()
    mine = np.arange(comm.rank * 10, comm.rank * 10 + comm.rank + 2, dtype=np.int64)[::-1]
    expected = np.concatenate(comm.allgather(mine))
    ok = True
    for n, dtype in ((1000, np.int32), (1 << 33, np.int64)):
        got, counts = all_gather_concatenated(comm, mine, n)
        ok = ok and got.dtype == dtype and np.array_equal(got, expected)
        ok = ok and np.array_equal(counts, np.arange(comm.size) + 2)
    assert agree(comm, ok)


# -- the ghost block's rows ----------------------------------------------------------------------

def _power_law_block(seed=0, rows=400, ncols=900):
    """A CSR block with empty rows and a few rows far longer than the rest."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.6, rows), 700) * (rng.random(rows) > 0.2)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    indices = rng.integers(0, ncols, int(indptr[-1])).astype(np.int32)  # unsorted, repeated
    return CSRMatrix(indptr, indices, rng.standard_normal(int(indptr[-1])), (rows, ncols))


@pytest.mark.parametrize("piece", [7, 64, 1 << 18])
def test_rows_taken_in_pieces_equal_scipy_row_selection(monkeypatch, piece):
    monkeypatch.setattr(_csr, "ROW_PIECE", piece)  # many pieces, rows longer than one
    block = _power_law_block()
    order = np.random.default_rng(1).permutation(block.nrows)[:350]
    got = block.rows(order)
    # SciPy's row selection keeps each row's entries in their order (no sorting here)
    expected = sp.csr_matrix((block.data, block.indices, block.indptr), shape=block.shape)[order]
    assert got.indptr.dtype == block.indptr.dtype and got.indices.dtype == block.indices.dtype
    assert got.shape == (350, block.ncols)
    assert np.array_equal(got.indptr, expected.indptr)
    assert np.array_equal(got.indices, expected.indices)
    assert np.array_equal(got.data, expected.data)
    empty = block.rows(np.zeros(0, np.int64))
    assert empty.nrows == 0 and empty.nnz == 0


def test_ghost_rows_follow_the_new_row_order():
    """The ghost block's rows sorted by their new numbers, as an argsort of them would."""
    rng = np.random.default_rng(2)
    local_rows = 500
    ghost_rows = np.sort(rng.choice(local_rows, size=120, replace=False)).astype(np.int32)
    ghost = _power_law_block(seed=3, rows=120)
    rows = rng.permutation(local_rows)  # new -> old
    new_row = np.empty_like(rows)
    new_row[rows] = np.arange(local_rows)
    moved, moved_rows = ghost_rows_in_order(ghost, ghost_rows, rows, new_row)
    order = np.argsort(new_row[ghost_rows], kind="stable")
    expected = ghost.to_scipy()[order]
    assert np.array_equal(moved_rows, new_row[ghost_rows][order])
    assert np.all(np.diff(moved_rows) > 0)
    assert np.array_equal(moved.indptr, expected.indptr)
    assert np.array_equal(moved.indices, expected.indices)
    assert np.array_equal(moved.data, expected.data)


# -- a rank's share of x --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("first,count", [(0, 1), (0, 2000), (1, 17), (1234, 766), (777, 0)])
def test_vector_share_is_the_whole_vectors_slice(dtype, first, count):
    n, seed = 2000, 12345
    owned = np.arange(first, first + count, dtype=np.int64)
    for spec in ("random", "ones"):
        share = vector_share(spec, n, owned, dtype, seed)
        whole = make_vector(spec, n, dtype, seed)
        assert share.dtype == whole.dtype
        assert np.array_equal(share, whole[owned])  # bit for bit


def test_vector_share_declines_scattered_entries_and_files():
    assert vector_share("random", 100, np.array([0, 2, 4]), np.float64, 1) is None
    assert vector_share("x.h5:/x", 100, np.arange(10), np.float64, 1) is None
