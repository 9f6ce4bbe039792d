"""SpMV's two-dimensional (checkerboard) placement (``partition.strategy: checkerboard``, and
``auto``'s choice by volume): the grid, the fold's sum, every rank's entries after the move
against a placement and volumes counted here from the whole matrix, and whole runs against
SciPy (CPU backend; the GPU engines' checks are in tests/test_spmv.py's gpu tests)."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.distmatrix import Checkerboard, fold_block, processor_grid
from hisparse.formats import CSRMatrix
from hisparse.partition import nnz_balanced_blocks

from helpers import read_run, run_config, write_config
from test_spmv import power_chain


@pytest.mark.parametrize("size", range(1, 26))
def test_processor_grid_is_the_most_square_factorisation(size):
    rows, cols = processor_grid(size)
    assert rows * cols == size and rows <= cols
    # no factor pair of size lies closer to the square
    assert not [d for d in range(rows + 1, math.isqrt(size) + 1) if size % d == 0]


def test_fold_block_adds_each_rows_terms_in_sender_order():
    """``y[fold_rows] += fold @ received`` is the scatter-add of the received partial sums
    onto their rows; each row's terms come in the order they were received."""
    rng = np.random.default_rng(4)
    targets = rng.integers(0, 30, 200)
    received = rng.standard_normal(200)
    fold, rows = fold_block(targets, 30, np.float64, np.int32)
    y = rng.standard_normal(30)
    want = y.copy()
    np.add.at(want, targets, received)
    y[rows] += fold.to_scipy() @ received
    np.testing.assert_allclose(y, want, rtol=1e-14)
    assert np.all(np.diff(rows) > 0) and fold.nnz == 200
    for row in range(fold.nrows):  # positions ascend within a row: the senders' order
        positions = fold.indices[fold.indptr[row]:fold.indptr[row + 1]]
        assert np.all(np.diff(positions) > 0)
    with pytest.raises(ValueError, match="outside the owned rows"):
        fold_block(np.array([3, 30]), 30, np.float64, np.int32)


def grid_placement(matrix, size):
    """This file's own placement of the whole matrix: nnz-balanced row blocks, x owned as the
    rows (square) or evenly (rectangular), the most square grid; per rank the set of (row,
    column) entries it must hold, and the entries each layout moves per product (row blocks'
    halo; grid expand + fold), counted from the whole matrix."""
    coo = sp.coo_matrix(matrix)
    m, n = matrix.shape
    bounds = nnz_balanced_blocks(sp.csr_matrix(matrix).indptr, size)
    row_owner = np.searchsorted(bounds, coo.row, side="right") - 1
    x_bounds = bounds if m == n else n * np.arange(size + 1) // size
    x_owner = np.searchsorted(x_bounds, coo.col, side="right") - 1
    _, cols = processor_grid(size)
    holder = (row_owner // cols) * cols + x_owner % cols
    row_blocks = len({(r, c) for r, c, o in zip(row_owner, coo.col, x_owner) if o != r})
    expand = len({(h, c) for h, c, o in zip(holder, coo.col, x_owner) if o != h})
    fold = len({(h, r) for h, r, o in zip(holder, coo.row, row_owner) if o != h})
    entries = [set(zip(coo.row[holder == h], coo.col[holder == h])) for h in range(size)]
    return bounds, x_bounds, entries, row_blocks, expand + fold


def _rmat(scale=8):
    return generators.generate({"kind": "rmat", "scale": scale, "edge_factor": 8,
                                "seed": 2}).to_scipy()


@pytest.mark.parallel(nprocs=[3, 4, 6])
@pytest.mark.parametrize("shape", ["square", "wide", "narrow"])
def test_every_entry_moves_to_its_grid_place(nprocs, shape):
    """After :meth:`Checkerboard.redistribute` each rank holds exactly the entries this file
    places on it (values kept), over its own rows then its foreign rows ascending, and
    :meth:`Checkerboard.volumes` summed over the ranks counts what this file counts; also
    where x has fewer entries than there are ranks (some own none)."""
    from hisparse.distmatrix import ghost_columns, local_positions, locate_entries
    from hisparse.parallel import get_world
    comm = get_world()
    columns = {"wide": 300, "narrow": 2}
    matrix = sp.csr_matrix(_rmat()) if shape == "square" else \
        sp.random(90, columns[shape], density=0.3 if shape == "narrow" else 0.06,
                  random_state=np.random.default_rng(1), format="csr")
    bounds, x_bounds, entries, row_blocks, grid = grid_placement(matrix, comm.size)
    rank = comm.rank
    rows = np.arange(bounds[rank], bounds[rank + 1])
    owned = np.arange(x_bounds[rank], x_bounds[rank + 1])
    mine = CSRMatrix.from_scipy(matrix[rows[0]:rows[-1] + 1])
    board = Checkerboard(comm, rows, owned)
    position = local_positions(owned, matrix.shape[1])
    located = locate_entries(mine, position)
    ghosts = ghost_columns(mine, position, located)
    remote = located[1] if located[1] is not None else np.zeros(0, np.int64)
    expand, fold = board.volumes(mine, ghosts, remote)
    totals = comm.allreduce(np.array([len(ghosts), expand + fold]))
    assert totals.tolist() == [row_blocks, grid]
    extended, foreign = board.redistribute(mine)
    assert np.all(np.diff(foreign) > 0) and not np.isin(foreign, rows).any()
    row_ids = np.concatenate([rows, foreign])
    held = sp.csr_matrix(extended.to_scipy()).tocoo()
    got = set(zip(row_ids[held.row], held.col))
    assert got == entries[rank] and held.nnz == len(entries[rank])
    np.testing.assert_array_equal(held.data, matrix.toarray()[row_ids[held.row], held.col])


@pytest.mark.parallel(nprocs=[4])
def test_auto_takes_the_layout_that_moves_fewer_entries(nprocs, tmp_path, monkeypatch):
    """``partition.strategy: auto``, told to weigh the grid from 4 ranks (its threshold
    lowered), records both volumes (equal to this file's counts) and takes the grid exactly
    where it moves fewer: a dense random graph (every rank needs most of x) goes on the grid,
    a 2-D stencil (a thin halo) stays in row blocks; y against the power chain computed
    here."""
    from hisparse.driver import run
    from hisparse.ops.spmv import plan as spmv_plan
    from hisparse.parallel import get_world
    monkeypatch.setattr(spmv_plan, "CHECKERBOARD_MIN_RANKS", 4)
    comm = get_world()
    folder = type(tmp_path)(comm.bcast(str(tmp_path), root=0))
    specs = {"rmat": {"kind": "rmat", "scale": 9, "edge_factor": 16, "seed": 3},
             "poisson": {"kind": "poisson", "dims": [30, 20]}}
    chosen = {}
    for name, spec in specs.items():
        config = None
        if comm.rank == 0:
            config = str(write_config(folder, "spmv", {"iterations": 3, "x": "ones"},
                                      name=f"{name}.yaml", out=name, backend="cpu",
                                      input={"generate": spec},
                                      partition={"strategy": "auto"}))
        path = run(comm.bcast(config, root=0), comm=comm)
        if comm.rank:
            continue
        results, arrays = read_run(path)
        matrix = generators.generate(spec).to_scipy()
        _, _, _, row_blocks, grid = grid_placement(matrix, comm.size)
        attrs = results["attrs"]
        assert attrs["partition_entries_row_blocks"] == row_blocks
        assert attrs["partition_entries_checkerboard"] == grid
        chosen[name] = attrs["partition"]
        assert attrs["checkerboard_grid"] == ("2x2" if grid < row_blocks else "none")
        # what the ranks record they move is what was weighed for the layout taken
        ranks = results["rank_vars"]
        moved = int(np.sum(ranks["ghosts"]) + np.sum(ranks["fold_receives"]))
        assert moved == min(grid, row_blocks)
        assert np.sum(ranks["foreign_rows"]) == np.sum(ranks["fold_receives"])
        want = power_chain(matrix, np.ones(matrix.shape[1]), 3)
        np.testing.assert_allclose(arrays["y"], want, rtol=1e-12, atol=1e-12)
    if comm.rank == 0:
        assert chosen == {"rmat": "checkerboard", "poisson": "nnz_balanced"}


@pytest.mark.parallel(nprocs=[4])
def test_auto_keeps_row_blocks_below_the_threshold(nprocs, tmp_path):
    """Below ``CHECKERBOARD_MIN_RANKS`` ``auto`` does not weigh the grid (nothing recorded, no
    set-up spent on it) even where the grid would move fewer entries."""
    from hisparse.driver import run
    from hisparse.ops.spmv import plan as spmv_plan
    from hisparse.parallel import get_world
    comm = get_world()
    assert comm.size < spmv_plan.CHECKERBOARD_MIN_RANKS
    folder = type(tmp_path)(comm.bcast(str(tmp_path), root=0))
    config = None
    if comm.rank == 0:
        config = str(write_config(folder, "spmv", {"x": "ones"}, backend="cpu",
                                  input={"generate": {"kind": "rmat", "scale": 9,
                                                      "edge_factor": 16, "seed": 3}},
                                  partition={"strategy": "auto"}))
    path = run(comm.bcast(config, root=0), comm=comm)
    if comm.rank == 0:
        attrs = read_run(path)[0]["attrs"]
        assert attrs["partition"] == "nnz_balanced" and attrs["checkerboard_grid"] == "none"
        assert "partition_entries_checkerboard" not in attrs


def test_checkerboard_runs_at_one_rank_as_row_blocks(tmp_path):
    """One rank has nothing to place: the run is the plain product, recorded as no grid."""
    spec = {"kind": "rmat", "scale": 7, "edge_factor": 4, "seed": 1}
    config = write_config(tmp_path, "spmv", {"iterations": 2, "x": "ones"}, backend="cpu",
                          input={"generate": spec}, partition={"strategy": "checkerboard"})
    results, arrays = run_config(tmp_path, config)
    matrix = generators.generate(spec).to_scipy()
    want = power_chain(matrix, np.ones(matrix.shape[1]), 2)
    np.testing.assert_allclose(arrays["y"], want, rtol=1e-12, atol=1e-12)
    assert results["attrs"]["checkerboard_grid"] == "none"
