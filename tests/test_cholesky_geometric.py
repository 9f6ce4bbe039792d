"""``ordering: geometric``: nested dissection of a regular grid by coordinate planes (no graph
algorithm), for matrices whose rows are a grid's points in row-major order."""
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from hisparse import generators
from hisparse.errors import ConfigError, HisparseError
from hisparse.ops.cholesky import geometric, ordering
from hisparse.ops.cholesky.geometric import grid_nested_dissection, grid_of
from hisparse.ops.cholesky.symbolic import analyze

from helpers import run_config, write_config


def _halves(dims, perm):
    """The first box, the second box and the separating plane of the top split, as the
    ordering lists them: the plane across the longest extent is the last (prod / extent)."""
    axis = int(np.argmax(dims))
    plane = int(np.prod(dims)) // dims[axis]
    left = plane * (dims[axis] // 2)
    return perm[:left], perm[left:len(perm) - plane], perm[len(perm) - plane:]


@pytest.mark.parametrize("dims, stencil", [([7, 5], 9), ([12, 9], 5), ([4, 6, 5], 27),
                                           ([6, 6, 6], 7), ([1, 9], 9), ([9], None)])
def test_the_last_plane_separates_the_two_halves_for_any_one_point_stencil(dims, stencil):
    """The ordering is a permutation whose last rows are the middle plane across the longest
    extent: without them the graph of the full-box stencil (every neighbour one point away)
    falls apart between the rows ordered before the second half and the second half, and the
    same holds again inside the first half."""
    n = int(np.prod(dims))
    perm = grid_nested_dissection(dims, leaf=1)
    assert perm.dtype == np.int64 and np.array_equal(np.sort(perm), np.arange(n))
    graph = (generators.poisson(dims, stencil=stencil).to_scipy() != 0).astype(np.int8) \
        if len(dims) > 1 else sp.diags([1, 1, 1], [-1, 0, 1], shape=(n, n), format="csr",
                                       dtype=np.int8)
    for depth in range(2):
        left, right, plane = _halves(dims, perm)
        assert len(left) and len(right)
        rest = np.concatenate([left, right])
        _, labels = connected_components(graph[rest][:, rest], directed=False)
        assert not set(labels[:len(left)]) & set(labels[len(left):]), (dims, depth)
        # the first half is a box of its own: its rows, renumbered in it, split alike
        coords = np.stack(np.unravel_index(left, dims), axis=1)
        low, high = coords.min(axis=0), coords.max(axis=0) + 1
        if depth == 1 or int(np.prod(high - low)) < 3:
            break
        box = [int(e) for e in high - low]
        local = np.ravel_multi_index(tuple((coords - low).T), box)
        keep = np.ravel_multi_index(tuple(np.stack(np.unravel_index(
            np.arange(int(np.prod(box))), box), axis=1).T + low[:, None]), dims)
        graph, dims, perm = graph[keep][:, keep], box, local


@pytest.mark.parametrize("dims", [[9, 7], [6, 7, 5], [30, 4]])
def test_a_diagonal_cut_separates_a_stencil_of_face_neighbours(dims):
    """With a stencil of face neighbours the first cut may be a diagonal plane: its points are
    the ordering's last, and without them the 5/7-point graph falls apart between the two sides
    (the points below the plane, ordered first, and those above)."""
    n = int(np.prod(dims))
    perm = grid_nested_dissection(dims, leaf=1, faces_only=True)
    assert np.array_equal(np.sort(perm), np.arange(n))
    coords = np.stack(np.unravel_index(np.arange(n), dims), axis=1).astype(np.int64)
    directions = geometric.FACE_STENCIL_DIRECTIONS[len(dims)]
    ids, work = np.arange(n, dtype=np.int64), coords.copy()
    k, c, below, above = geometric._cut_piece(ids, work, np.empty_like(ids), np.empty_like(work),
                                             directions, 0, n)
    projection = coords @ directions[k]
    assert below and above and set(perm[below + above:]) == set(np.flatnonzero(projection == c))
    assert set(perm[:below]) == set(np.flatnonzero(projection < c))
    graph = (generators.poisson(dims).to_scipy() != 0).astype(np.int8)
    rest = perm[:below + above]
    _, labels = connected_components(graph[rest][:, rest], directed=False)
    assert not set(labels[:below]) & set(labels[below:])


def test_the_diagonal_dissection_is_the_same_on_any_number_of_threads():
    """A grid large enough for the top's chunked passes (geometric.PARALLEL_PIECE points) gives
    the same ordering on one thread and on several."""
    import numba
    dims = [48, 40, 36]
    assert int(np.prod(dims)) >= geometric.PARALLEL_PIECE
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = grid_nested_dissection(dims, faces_only=True)
        numba.set_num_threads(max(2, before))
        many = grid_nested_dissection(dims, faces_only=True)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)


@pytest.mark.parametrize("dims", [[48, 40, 36], [300, 250]])
def test_a_cut_in_chunks_on_threads_is_the_cut_on_one_thread(dims):
    """The top's cut in chunks (extents, sides and the scatter from each chunk's offsets) is
    the one-thread cut: the same plane, the same sides, the same partition of the points."""
    n = int(np.prod(dims))
    coords = np.stack(np.unravel_index(np.arange(n), dims), axis=1).astype(np.int64)
    directions = geometric.FACE_STENCIL_DIRECTIONS[len(dims)]
    made = []
    for cut in (geometric._cut_piece, geometric._cut_piece_on_threads):
        ids, work = np.arange(n, dtype=np.int64), coords.copy()
        result = cut(ids, work, np.empty_like(ids), np.empty_like(work), directions, 0, n)
        made.append((tuple(int(v) for v in result), ids, work))
    assert made[0][0] == made[1][0] and made[0][0][0] >= 0
    np.testing.assert_array_equal(made[0][1], made[1][1])
    np.testing.assert_array_equal(made[0][2], coords[made[0][1]])


@pytest.mark.parametrize("dims, stencil, most", [([40, 40], 5, 1.2), ([40, 40], 9, 1.05),
                                                 ([14, 14, 14], 7, 1.2), ([20, 20, 20], 7, 1.05),
                                                 ([12, 12, 12], 27, 1.0)])
def test_its_fill_is_far_below_the_natural_orders_and_near_metis(dims, stencil, most):
    """Fill of the Cholesky factor: under 0.6 of the natural (banded) order's, and at most
    ``most`` times METIS's where pymetis is installed (measured: 1.07, 1.00, 1.12, 0.99, 0.92;
    the diagonal planes pull ahead of METIS as the 7-point cube grows: 0.73 on 64^3), and, with
    a stencil of face neighbours, under 0.9 of what the boxes alone give."""
    a = generators.poisson(dims, stencil=stencil).to_scipy()
    geometric = analyze(a, "geometric", "cholmod", grid=dims).stats["factor_nnz"]
    assert geometric < 0.6 * analyze(a, "natural", "cholmod").stats["factor_nnz"]
    if ordering.have_pymetis():
        assert geometric <= most * analyze(a, "metis", "cholmod").stats["factor_nnz"]
    if stencil in (5, 7):
        boxes = grid_nested_dissection(dims)
        assert geometric < 0.9 * analyze(a[boxes][:, boxes].tocsr(), "natural",
                                         "cholmod").stats["factor_nnz"]


@pytest.mark.parametrize("dims, stencil", [([30, 28], 5), ([30, 28], 9), ([8, 7, 6], 27),
                                           ([8, 7, 6], 7)])
def test_auto_cuts_a_known_grid_by_planes(dims, stencil):
    """``auto`` takes the planes for a known 2-D or 3-D grid, diagonal ones too for a stencil
    of face neighbours, and never the planes without a grid."""
    a = generators.poisson(dims, stencil=stencil).to_scipy()
    perm, used = ordering.fill_reducing_order(a, "auto", grid=dims)
    assert used == "geometric"
    np.testing.assert_array_equal(perm, grid_nested_dissection(dims,
                                                               faces_only=stencil in (5, 7)))
    assert ordering.fill_reducing_order(a, "auto")[1] != "geometric"


def test_a_grid_that_is_not_the_matrixs_is_refused_by_name():
    with pytest.raises(HisparseError, match="ordering_grid"):
        grid_of(None, 12)
    with pytest.raises(HisparseError, match=r"ordering_grid: \[3, 5\] is not a grid of the "
                                            r"matrix's 12 rows"):
        grid_of([3, 5], 12)
    assert grid_of([3, 4], 12) == (3, 4)


def test_the_config_refuses_extents_that_are_not_positive_integers(tmp_path):
    from hisparse.config import load_config
    cfg = write_config(tmp_path, "cholesky", {"ordering": "geometric", "ordering_grid": [4, 0]},
                       input={"generate": {"kind": "poisson", "dims": [4, 4]}})
    with pytest.raises(ConfigError, match="ordering_grid"):
        load_config(cfg)


def _logdet(a):
    sign, value = np.linalg.slogdet(a.toarray())
    assert sign > 0
    return value


@pytest.mark.parametrize("nranks, method", [(1, "geometric"), (3, "geometric"), (2, "auto")])
def test_a_generated_grid_is_ordered_by_its_dims_at_any_rank_count(tmp_path, nranks, method):
    """``ordering: geometric`` (and ``auto``, for a 2-D grid) on a generated poisson input takes
    the generator's dims: the run verifies, records the ordering, and its logdet is the
    matrix's (NumPy's, dense)."""
    dims = [30, 28]
    cfg = write_config(tmp_path, "cholesky", {"ordering": method, "nrhs": 2},
                       input={"generate": {"kind": "poisson", "dims": dims}}, backend="cpu")
    run, _ = run_config(tmp_path, cfg, nprocs=nranks)
    attrs = run["attrs"]
    assert attrs["verify_passed"] and attrs["chol_ordering"] == "geometric"
    assert attrs["chol_logdet"] == pytest.approx(_logdet(generators.poisson(dims).to_scipy()),
                                                 rel=1e-10)


def test_a_file_takes_its_grid_from_ordering_grid_at_two_ranks(tmp_path):
    """A 27-point Laplacian read from a file, its grid given: verified at 2 ranks; without the
    grid the run fails on every rank with one line naming the key."""
    from hisparse.formats import CSRMatrix
    from hisparse.io import write_matrix
    dims = [11, 10, 9]
    a = generators.poisson(dims, stencil=27).to_scipy()
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(a, symmetric=True))
    cfg = write_config(tmp_path, "cholesky", {"ordering": "geometric", "ordering_grid": dims},
                       input={"path": str(path)}, backend="cpu")
    run, _ = run_config(tmp_path, cfg, nprocs=2)
    assert run["attrs"]["verify_passed"] and run["attrs"]["chol_ordering"] == "geometric"
    assert run["attrs"]["chol_logdet"] == pytest.approx(_logdet(a), rel=1e-10)
    cfg = write_config(tmp_path, "cholesky", {"ordering": "geometric"}, name="nogrid.yaml",
                       out="nogrid", input={"path": str(path)}, backend="cpu")
    proc = run_config(tmp_path, cfg, nprocs=2, out="nogrid", expect_rc=2)
    assert "ordering_grid" in proc.stderr
