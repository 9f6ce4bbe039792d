"""Generators against independent constructions."""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.generators import (_common, _keyed_permutation, _poisson, _random_matrix, _rmat,
                                 _tensor)
from hisparse import threads as host_threads
from hisparse.errors import ConfigError


def _laplacian_1d(n):
    return sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))


def test_poisson_2d_5_point_matches_kronecker_sum():
    nx, ny = 6, 5
    ref = sp.kron(_laplacian_1d(nx), sp.eye(ny)) + sp.kron(sp.eye(nx), _laplacian_1d(ny))
    got = generators.poisson([nx, ny], 5).to_scipy()
    assert abs(got - ref).max() == 0
    assert got.nnz == 5 * nx * ny - 2 * (nx + ny)


def test_poisson_3d_27_point_stencil_by_loops():
    n = 4
    got = generators.poisson([n, n, n], 27).to_scipy().toarray()
    idx = lambda i, j, k: (i * n + j) * n + k  # noqa: E731
    for i, j, k in [(0, 0, 0), (1, 2, 3), (2, 2, 2)]:
        row = got[idx(i, j, k)]
        neighbours = [(a, b, c) for a in range(i - 1, i + 2) for b in range(j - 1, j + 2)
                      for c in range(k - 1, k + 2)
                      if 0 <= a < n and 0 <= b < n and 0 <= c < n]
        assert np.count_nonzero(row) == len(neighbours)
        assert row[idx(i, j, k)] == 26.0
        assert all(row[idx(*p)] == -1.0 for p in neighbours if p != (i, j, k))
    assert np.all(np.linalg.eigvalsh(got) > 0)


def _kronecker_poisson(dims, stencil, scale):
    """The Poisson matrix by Kronecker products (the construction the generator used before it
    was built row by row)."""
    if stencil in (5, 7):
        matrix = None
        for axis, size in enumerate(dims):
            before = sp.identity(int(np.prod(dims[:axis])), format="csr")
            after = sp.identity(int(np.prod(dims[axis + 1:])), format="csr")
            term = sp.kron(sp.kron(before, _laplacian_1d(size)), after, format="csr")
            matrix = term if matrix is None else matrix + term
    else:
        box = None
        for size in dims:
            ones = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(size, size), format="csr")
            box = ones if box is None else sp.kron(box, ones, format="csr")
        matrix = -box
        matrix.setdiag(float(stencil - 1))
    matrix = (matrix * scale).tocsr()
    matrix.sort_indices()
    return matrix


@pytest.mark.parametrize("dims,stencil,scale", [
    ([6, 5], 5, 1.0), ([7, 4], 9, 2.5), ([4, 5, 3], 7, 1.0), ([4, 4, 4], 27, 0.5),
    ([1, 5], 5, 1.0), ([3, 1, 2], 27, 1.0)])
def test_poisson_rows_equal_the_kronecker_construction(dims, stencil, scale):
    ref = _kronecker_poisson(dims, stencil, scale)
    got = generators.poisson(dims, stencil, scale)
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.data, ref.data)
    assert got.symmetric
    rows = np.sort(np.random.default_rng(0).choice(ref.shape[0], ref.shape[0] // 3,
                                                   replace=False))
    part = generators.poisson_rows(dims, rows, stencil, scale).to_scipy()
    assert abs(part - ref[rows]).max() == 0 and part.shape == (len(rows), ref.shape[1])


@pytest.mark.parametrize("dims,stencil", [([13, 11, 9], 27), ([40, 37], 5), ([8, 9, 7], 7),
                                          ([30, 1], 9)])
def test_band_rows_built_by_threads_equal_one_thread(monkeypatch, dims, stencil):
    """Rows built in many chunks by a pool of threads give the same CSR arrays, bit for bit, as
    one thread and as the Kronecker construction; so do a part's rows and lengths."""
    def built(cores):
        monkeypatch.setattr(host_threads, "usable_cores", lambda: cores)
        n = int(np.prod(dims))
        rows = np.sort(np.random.default_rng(2).choice(n, n // 3, replace=False))
        band = _poisson._poisson_band(dims, stencil, 1.5)
        return generators.poisson(dims, stencil, 1.5), band.build(rows, band.nrows), \
            band.lengths(rows)

    monkeypatch.setattr(_common, "_ROW_CHUNK", 7)  # tens of chunks, shared by the threads
    threads, one = built(4), built(1)
    ref = _kronecker_poisson(dims, stencil, 1.5)
    for many, single in zip(threads[:2], one[:2]):
        for field in ("indptr", "indices", "data"):
            assert getattr(many, field).dtype == getattr(single, field).dtype
            np.testing.assert_array_equal(getattr(many, field), getattr(single, field))
    np.testing.assert_array_equal(threads[2], one[2])
    np.testing.assert_array_equal(threads[0].indptr, ref.indptr)
    np.testing.assert_array_equal(threads[0].indices, ref.indices)
    np.testing.assert_array_equal(threads[0].data, ref.data)
    assert threads[1].indices.dtype == np.int32


def test_trefethen_equals_its_diagonals():
    for n in (1, 2, 31, 32, 33, 100):
        steps = [1 << k for k in range(12) if (1 << k) < n]
        primes = [p for p in range(2, 1000) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
        ref = sp.diags([np.array(primes[:n], float)] + [np.ones(n - k) for k in steps] * 2,
                       [0] + steps + [-k for k in steps], shape=(n, n), format="csr")
        assert abs(generators.trefethen(n).to_scipy() - ref).max() == 0


def test_trefethen_structure():
    n = 40
    got = generators.trefethen(n).to_scipy().toarray()
    primes = [p for p in range(2, 400) if all(p % d for d in range(2, int(p ** 0.5) + 1))][:n]
    np.testing.assert_array_equal(np.diag(got), primes)
    for i in range(n):
        for j in range(n):
            d = abs(i - j)
            expected_one = d > 0 and (d & (d - 1)) == 0
            assert (got[i, j] == 1.0) == expected_one or i == j


def test_rmat_is_power_law_and_seeded():
    a = generators.rmat(12, 8, seed=1)
    b = generators.rmat(12, 8, seed=1)
    assert np.array_equal(a.indices, b.indices)
    lengths = a.row_lengths()
    assert a.shape == (4096, 4096)
    assert lengths.max() > 10 * lengths.mean()  # heavy rows exist
    assert a.nnz <= 8 * 4096


def test_rmat_blocks_made_apart_give_the_same_graph(monkeypatch):
    monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", 700)
    scale, edge_factor, seed = 9, 7, 11
    nblocks = generators.rmat_blocks(scale, edge_factor)
    assert nblocks == -(-7 * 512 // 700)
    src, dst = generators.rmat_edges(scale, edge_factor, seed=seed)
    pieces = [generators.rmat_edges(scale, edge_factor, seed=seed, blocks=range(lo, hi))
              for lo, hi in ((0, 2), (2, 3), (3, nblocks))]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in pieces]), src)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in pieces]), dst)
    # The matrix is the edge set: one unit entry per distinct edge (SciPy's assembly).
    ref = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(512, 512)).tocsr()
    ref.data[:] = 1.0
    got = generators.rmat(scale, edge_factor, seed=seed).to_scipy()
    assert abs(got - ref).max() == 0 and got.nnz == ref.nnz
    assert (generators.rmat(scale, edge_factor, seed=seed + 1).to_scipy() != got).nnz > 0
    sym = generators.rmat(scale, edge_factor, seed=seed, symmetric=True).to_scipy()
    assert abs(sym - sym.T).max() == 0



@pytest.mark.parametrize("workers", [1, 4])
def test_rmat_edges_follow_the_quadrant_descent(monkeypatch, workers):
    """Every edge is the quadrant descent of its block's stream, level by level (this test's
    own walk, with a search over the cumulative probabilities), then the keyed permutation;
    the same edges with one thread or several."""
    monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", 300)
    monkeypatch.setattr(_common, "_MAX_BUILD_WORKERS", workers)
    monkeypatch.setattr(host_threads, "usable_cores", lambda: 8)
    scale, edge_factor, seed, a, b, c = 8, 5, 4, 0.5, 0.2, 0.2
    nedges = edge_factor << scale
    src, dst = generators.rmat_edges(scale, edge_factor, a, b, c, seed=seed,
                                     blocks=range(1, 4))
    cumulative = np.array([a, a + b, a + b + c])
    ref_src, ref_dst = [], []
    for block in range(1, 4):
        count = min(300, nedges - 300 * block)
        rng = np.random.default_rng([seed, 0, block])
        s = np.zeros(count, np.int64)
        d = np.zeros(count, np.int64)
        for level in range(scale):
            quadrant = np.searchsorted(cumulative, rng.random(count), side="right")
            s += (quadrant // 2) * 2 ** level
            d += (quadrant % 2) * 2 ** level
        ref_src.append(s)
        ref_dst.append(d)
    n = 1 << scale
    np.testing.assert_array_equal(
        src, generators.keyed_permutation(np.concatenate(ref_src), n, seed))
    np.testing.assert_array_equal(
        dst, generators.keyed_permutation(np.concatenate(ref_dst), n, seed))
    with pytest.raises(ValueError, match="range"):
        generators.rmat_edges(scale, edge_factor, seed=seed, blocks=[0, 2])

@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4099])
def test_keyed_permutation_is_a_bijection(n):
    ids = np.arange(n, dtype=np.int64)
    image = generators.keyed_permutation(ids, n, seed=7)
    np.testing.assert_array_equal(np.sort(image), ids)
    if n >= 64:  # a real shuffle, changing with the seed
        assert (image != ids).mean() > 0.9
        assert (image != generators.keyed_permutation(ids, n, seed=8)).mean() > 0.9


def test_random_matrix_blocks_made_apart_give_the_same_matrix(monkeypatch):
    monkeypatch.setattr(_random_matrix, "RANDOM_ROW_BLOCK", 50)
    for power_law in (0.0, 1.1):
        whole = generators.random_matrix(333, 90, nnz_per_row=6, seed=4, power_law=power_law)
        csr = whole.to_scipy()
        assert whole.shape == (333, 90) and csr.has_canonical_format
        assert np.abs(whole.data).max() <= 6  # at most 6 draws in [-1, 1) summed per entry
        parts = [generators.random_matrix_rows(333, 90, 6, 4, power_law, blocks=range(lo, hi))
                 for lo, hi in ((0, 3), (3, 4), (4, 7))]
        assert [p.shape[0] for p in parts] == [150, 50, 133]  # blocks of 50 rows
        stacked = sp.vstack([p.to_scipy() for p in parts]).tocsr()
        assert abs(stacked - whole.to_scipy()).max() == 0
        assert stacked.nnz == whole.nnz


def test_random_tensor_hits_targets():
    tensor = generators.random_tensor([50, 60, 70], nnz=20000, fibers_per_nnz=0.2, seed=3)
    assert tensor.shape == (50, 60, 70)
    assert 0.85 * 20000 <= tensor.nnz <= 1.05 * 20000
    fibers = np.unique(tensor.indices[:, :2], axis=0)
    # 4000 fibers asked, but the fiber space holds 3000: every one is used.
    assert len(fibers) == 50 * 60
    assert len(np.unique(tensor.indices, axis=0)) == tensor.nnz  # no duplicates
    roomy = generators.random_tensor([300, 200, 500], nnz=30000, fibers_per_nnz=0.1, seed=3)
    fibers = np.unique(roomy.indices[:, :2], axis=0)
    assert abs(len(fibers) / roomy.nnz - 0.1) < 0.005
    assert abs(roomy.nnz - 30000) < 0.02 * 30000
    assert ((roomy.values >= 0) & (roomy.values < 1)).all()


def test_random_tensor_fiber_lengths_are_lognormal():
    """Long fibers (the rounding to whole nonzeros matters little there) have lognormal lengths:
    log-lengths with the skew as standard deviation, around the mean the target implies."""
    skew = 0.5
    tensor = generators.random_tensor([400, 500, 100000], nnz=400000, fibers_per_nnz=0.005,
                                      seed=11, skew=skew)
    _, lengths = np.unique(tensor.indices[:, :2], axis=0, return_counts=True)
    assert len(lengths) == 2000
    logs = np.log(lengths)
    assert abs(logs.std() - skew) < 0.03
    # E[w] = exp(skew^2 / 2) for lognormal(0, skew) weights scaled to 200 nonzeros per fiber.
    assert abs(logs.mean() - (np.log(200) - skew ** 2 / 2)) < 0.03
    # Fibers hold distinct, ascending mode-2 indices, spread over the whole mode.
    first = np.concatenate([[True], (np.diff(tensor.indices[:, :2], axis=0) != 0).any(axis=1)])
    steps = np.diff(tensor.indices[:, 2])
    assert (steps[~first[1:]] > 0).all()
    assert tensor.indices[:, 2].max() > 99000 and tensor.indices[:, 2].min() < 1000


def test_random_tensor_weight_table_is_the_lognormal_quantile_function():
    from scipy.stats import lognorm
    skew = 1.3
    table, steps, mean = _tensor._weight_table(skew)
    count = len(table) - 1
    at = np.array([1, 1000, count // 3, count // 2, count - 5000, count - 1])
    np.testing.assert_allclose(table[at], lognorm.ppf(at / count, skew), rtol=1e-7)
    np.testing.assert_array_equal(steps, np.diff(table))
    assert mean == pytest.approx(np.exp(skew ** 2 / 2), rel=2e-3)


def test_random_tensor_fiber_ranges_made_apart_give_the_same_tensor(monkeypatch):
    monkeypatch.setattr(_tensor, "TENSOR_FIBER_STEP", 64)
    for spec in ({"dims": [20, 30, 40], "nnz": 3000, "fibers_per_nnz": 0.2, "seed": 4},
                 {"dims": [6, 50, 7, 8], "nnz": 2500, "fibers_per_nnz": 0.1, "mode": 1,
                  "seed": 9, "skew": 2.5}):
        whole = generators.random_tensor(**spec)
        source = generators.tensor_source(**spec)
        cuts = [0, 1, 63, 64, 65, source.nfibers // 2, source.nfibers]
        pieces = [source.fibers(range(lo, hi)) for lo, hi in zip(cuts[:-1], cuts[1:])]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in pieces]), whole.indices)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in pieces]), whole.values)
        other = [m for m in range(len(spec["dims"])) if m != spec.get("mode", 2)]
        # Fibers whole inside a range, each range's fibers new: as many distinct fibers as the
        # ranges' sum, and the seed changes the tensor.
        counts = [len(np.unique(p[0][:, other], axis=0)) for p in pieces]
        assert sum(counts) == len(np.unique(whole.indices[:, other], axis=0)) == source.nfibers
    changed = generators.random_tensor(**dict(spec, seed=10))
    assert changed.nnz != whole.nnz or not np.array_equal(changed.indices, whole.indices)


def test_random_matrix_row_lengths():
    uniform = generators.random_matrix(200, 300, nnz_per_row=5, seed=2)
    assert uniform.shape == (200, 300) and uniform.row_lengths().max() <= 5
    skewed = generators.random_matrix(2000, nnz_per_row=8, power_law=1.0, seed=2)
    assert skewed.row_lengths().max() > 20 * np.median(skewed.row_lengths())


@pytest.mark.parametrize("spec,needle", [
    ({"kind": "poison", "dims": [3, 3]}, "did you mean 'poisson'"),
    ({"kind": "poisson", "dims": [3, 3], "stencil": 27}, "stencil"),
    ({"kind": "poisson"}, "dims"),
    ({"kind": "rmat", "scale": 4, "a": 1.5}, "generate.a"),
    ({"kind": "random_tensor", "dims": [3, 3], "mode": 4}, "generate.mode"),
    ({"kind": "random_tensor", "dims": [2 ** 31, 2 ** 31, 5]}, r"generate.dims.*2\*\*62"),
    # issue 16: d = 1 - a - b - c must not be negative
    ({"kind": "rmat", "scale": 4, "a": 0.6, "b": 0.3, "c": 0.3}, r"a \+ b \+ c = 1\.2 exceeds 1"),
])
def test_bad_specs_name_the_key(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        generators.validate_spec(spec)


@pytest.mark.parametrize("n", [3, 1000, 4099, 1 << 21])
def test_compiled_permutation_is_the_numpy_walk(n):
    """The compiled cycle walk (what runs with Numba) gives the NumPy passes' bits."""
    ids = np.random.default_rng(n).integers(0, n, size=5000)
    bits = max(2, int(n - 1).bit_length())
    bits += bits & 1
    keys = np.random.SeedSequence([9, 1]).generate_state(4, dtype=np.uint64)
    expected = _keyed_permutation._feistel_walk_numpy(ids.astype(np.uint64), np.uint64(n),
                                                      np.uint64(bits // 2),
                                                      np.uint64((1 << (bits // 2)) - 1), keys)
    np.testing.assert_array_equal(generators.keyed_permutation(ids, n, seed=9),
                                  expected.astype(np.int64))


@pytest.mark.parametrize("levels", [1, 21, 32])
def test_compiled_rmat_block_is_the_numpy_passes(levels):
    """The compiled block (drawing from the generator as it goes, an edge's two ids in one word,
    then permuted) gives the NumPy passes' bits of the same stream drawn first, then the NumPy
    walk; thresholds equal to draws of the stream check the comparisons' sides."""
    count, n = 3000, 1 << levels
    draws = np.random.default_rng(2).random((levels, count))
    low, middle, high = sorted(draws[0, :3])  # three draws of level 0 lie on the thresholds
    want = [np.zeros(count, np.int64) for _ in range(2)]
    _rmat._rmat_bits_numpy(draws, low, middle, high, *want)
    assert want[0].any() and want[1].any() and max(want[0].max(), want[1].max()) < n
    params = _keyed_permutation._permutation(n, 7, 4, 1)
    walk = (*params.words(), params.keys)
    got = [np.full(count, -1, np.int64) for _ in range(2)]
    words = np.full(count, 12345, np.uint64)  # whatever a thread's buffer held before
    _rmat._rmat_block_host(np.random.default_rng(2), levels, low, middle, high, words,
                           *walk, *got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, _keyed_permutation._feistel_walk_numpy(
            w.astype(np.uint64), *walk).astype(np.int64))


@pytest.mark.parametrize("blocks", [None, range(1, 3)])
def test_rmat_edges_compiled_and_numpy_paths_agree(monkeypatch, blocks):
    """Small inputs take NumPy's passes (no Numba import), larger ones the compiled block: the
    same edges either way."""
    made = {}
    for name, least in (("numpy", 1 << 62), ("compiled", 0)):
        monkeypatch.setattr(_rmat, "_COMPILED_EDGES_MIN", least)
        made[name] = generators.rmat_edges(14, edge_factor=16, seed=4, blocks=blocks)
    for got, want in zip(made["compiled"], made["numpy"]):
        np.testing.assert_array_equal(got, want)
    assert len(made["numpy"][0]) == (16 << 14 if blocks is None else 2 * generators.RMAT_EDGE_BLOCK)


def test_rmat_part_edges_go_to_the_gpu_from_the_threshold(monkeypatch):
    """A GPU run's part source hands a rank's R-MAT blocks to the device maker from
    DEVICE_EDGES_MIN edges (with the run context), to the host below it and without a device."""
    spec = {"kind": "rmat", "scale": 14, "edge_factor": 16, "seed": 4}
    source = generators.part_source(generators.validate_spec(dict(spec)))
    calls = []

    def on_device(ctx, **params):
        calls.append((ctx, params["blocks"]))
        return generators.rmat_edges(**params)

    monkeypatch.setattr(_rmat, "rmat_edges_on_device", on_device)
    monkeypatch.setattr(_rmat, "DEVICE_EDGES_MIN", 2 * generators.RMAT_EDGE_BLOCK)
    context = object()
    for blocks, device, expected in ((range(0, 2), context, [(context, range(0, 2))]),
                                     (range(0, 1), context, []),
                                     (range(0, 2), None, [])):
        calls.clear()
        got = source.edges(blocks, device)
        assert calls == expected
        assert len(got[0]) == len(blocks) * generators.RMAT_EDGE_BLOCK
        np.testing.assert_array_equal(got[0], generators.rmat_edges(14, 16, seed=4,
                                                                    blocks=blocks)[0])


def test_rmat_scale_is_bounded():
    with pytest.raises(ValueError, match="scale must be 1..32"):
        generators.rmat_edges(33, blocks=range(0))
    problems = dict(generators.Rmat.problems({"scale": 33, "a": 0.57, "b": 0.19, "c": 0.19}))
    assert "at most 32" in problems["scale"]


@pytest.mark.parametrize("spec", [
    {"kind": "poisson", "dims": [7, 6], "stencil": 9, "scale": 2.0},
    {"kind": "rmat", "scale": 7, "edge_factor": 4, "seed": 5},
    {"kind": "trefethen", "n": 300},
    {"kind": "random_matrix", "rows": 500, "cols": 70, "nnz_per_row": 5, "seed": 3},
    {"kind": "random_tensor", "dims": [30, 20, 40], "nnz": 2000, "seed": 2}],
    ids=lambda spec: spec["kind"])
def test_each_generator_class_is_its_kind(spec):
    """One class per kind: ``generate`` builds what its builder function builds (the same bits),
    ``spec_kind`` is what the object is, and its part source makes the whole object from all of
    its parts (rows for a matrix, every fiber for a tensor)."""
    kind = generators.GENERATORS[spec["kind"]]
    assert kind.NAME == spec["kind"] and generators.generator_of(spec) is kind
    params = {k: v for k, v in generators.validate_spec(spec).items() if k != "kind"}
    direct = {"poisson": generators.poisson, "rmat": generators.rmat,
              "trefethen": generators.trefethen, "random_matrix": generators.random_matrix,
              "random_tensor": generators.random_tensor}[spec["kind"]](**params)
    made = generators.generate(spec)
    source = generators.part_source(generators.validate_spec(spec))
    if generators.spec_kind(spec) == "tensor":
        assert kind.MAKES == "tensor" and not kind.SLOW_TO_REMAKE
        np.testing.assert_array_equal(made.indices, direct.indices)
        np.testing.assert_array_equal(made.values, direct.values)
        indices, values = source.fibers()
        np.testing.assert_array_equal(indices, made.indices)
        np.testing.assert_array_equal(values, made.values)
        return
    assert kind.MAKES == "matrix"
    for name in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(made, name), getattr(direct, name))
    assert source.shape == made.shape and source.symmetric == made.symmetric
    rows = np.arange(made.nrows, dtype=np.int64)
    if source.band is not None:
        got = source.band.build(rows, made.ncols).to_scipy()
    elif source.row_blocks is not None:
        got = source.row_blocks(range(source.nblocks)).to_scipy()
    else:
        src, dst = source.edges(range(source.nblocks))
        got = generators.unit_rows(src, dst, rows, made.ncols).to_scipy()
    assert (got != made.to_scipy()).nnz == 0
    # Random draws and routing per entry: slow to make again; stencils and bands are not.
    assert kind.SLOW_TO_REMAKE == (spec["kind"] in ("rmat", "random_matrix"))


@pytest.mark.parametrize("count,key_range", [(0, 10), (1000, 7), (50_000, 10**9),
                                             (60_000, 2**46), (40_000, 40_000)])
def test_bucketed_key_sort_equals_one_sort(monkeypatch, count, key_range):
    """The edge keys sorted and de-duplicated in buckets of the key range on several threads
    (forced here at any size and core count) equal one sort of them all."""
    from hisparse import threads
    monkeypatch.setattr(_common, "_BUCKET_SORT_MIN", 0)
    monkeypatch.setattr(threads, "usable_cores", lambda: 6)
    keys = np.random.default_rng(count).integers(0, key_range, count).astype(np.int64)
    expected = np.unique(keys)
    got = _common._sorted_unique_keys(keys, key_range)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("nrows,ncols,count,cores", [(1, 5, 300, 1), (40, 40, 5000, 6),
                                                     (3000, 2**40, 20_000, 3),
                                                     (100_000, 100, 30_000, 64)])
def test_rows_by_buckets_equal_the_key_sort(monkeypatch, nrows, ncols, count, cores):
    """unit_rows' compiled grouping (forced at any size and core count: several buckets and
    chunks, buckets of one row, more buckets than rows hold edges) gives the NumPy key sort's
    block: the same rows, each one's distinct columns sorted; duplicate edges collapse, rows
    without edges stay empty, and rows that are not a range are found by search."""
    from hisparse import threads
    rng = np.random.default_rng(count)
    rows = np.sort(rng.choice(3 * nrows, size=nrows, replace=False)).astype(np.int64)
    src = rows[rng.integers(0, max(nrows // 2, 1), count)]  # the later rows get no edge
    dst = rng.integers(0, min(ncols, 50), count)  # few columns: many duplicate edges
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(_rmat, "_COMPILED_ROWS_MIN", 1 << 62)
    expected = generators.unit_rows(src, dst, rows, ncols)
    monkeypatch.setattr(_rmat, "_COMPILED_ROWS_MIN", 0)
    got = generators.unit_rows(src, dst, rows, ncols)
    assert expected.nnz < count  # duplicates were there to collapse
    for name in ("indptr", "indices", "data"):
        want = getattr(expected, name)
        assert getattr(got, name).dtype == want.dtype
        np.testing.assert_array_equal(getattr(got, name), want)


def _pcg64_output(state):
    """PCG64's XSL-RR output of a 128-bit state (Python ints)."""
    high, low = state >> 64, state & ((1 << 64) - 1)
    word, turn = high ^ low, high >> 58
    return ((word >> turn) | (word << ((64 - turn) & 63))) & ((1 << 64) - 1)


@pytest.mark.parametrize("scale, edge_factor, seed, blocks", [
    (9, 16, 5, None),             # one block, shorter than RMAT_EDGE_BLOCK
    (12, 20, 3, None),            # two blocks, the last one partial
    (13, 16, 0, range(1, 2))])    # a rank's share
def test_rmat_block_table_jumps_reach_every_draw(scale, edge_factor, seed, blocks):
    """The GPU kernel's arithmetic, run here with Python ints: each edge jumps its block's
    stream (``lcg_jump``) to its first draw, then one level at a time by the table's level jump;
    its bits and the permutation give the edges the host makes from NumPy's generator."""
    blocks = range(generators.rmat_blocks(scale, edge_factor)) if blocks is None else blocks
    table = generators.rmat_block_table(scale, edge_factor, seed, blocks)
    src, dst = generators.rmat_edges(scale, edge_factor, seed=seed, blocks=blocks)
    permutation = _keyed_permutation._permutation(1 << scale, seed, 4, 1)
    walk = (*permutation.words(), permutation.keys)
    first = blocks[0] * generators.RMAT_EDGE_BLOCK
    mask = (1 << 128) - 1
    checked = list(range(0, len(src), 389)) + [len(src) - 1]
    for index in checked:
        edge = first + index
        row = [int(v) for v in table[edge // generators.RMAT_EDGE_BLOCK - blocks[0]]]
        state, increment, level_mul, level_add = ((row[k] << 64) | row[k + 1]
                                                  for k in range(0, 8, 2))
        jump_mul, jump_add = generators.lcg_jump(edge % generators.RMAT_EDGE_BLOCK + 1,
                                                 generators.PCG64_MULTIPLIER, increment)
        state = (jump_mul * state + jump_add) & mask
        bits = [0, 0]
        low, middle, high = 0.57, 0.57 + 0.19, 0.57 + 0.19 + 0.19  # rmat_edges' thresholds
        for level in range(scale):
            if level:
                state = (level_mul * state + level_add) & mask
            r = (_pcg64_output(state) >> 11) * 2.0 ** -53
            bits[0] |= int(r >= middle) << level
            bits[1] |= int((low <= r < middle) or r >= high) << level
        made = _keyed_permutation._feistel_walk_numpy(np.array(bits, np.uint64), *walk)
        assert (int(made[0]), int(made[1])) == (src[index], dst[index]), index
    assert len(checked) > 20


@pytest.mark.gpu
@pytest.mark.parametrize("scale, edge_factor, seed, symmetric, block", [
    (12, 16, 3, False, None),   # two blocks, one partial
    (13, 16, 0, True, None),    # reverse edges: every key twice over
    (14, 1, 7, True, 1000),     # one edge a vertex: many empty rows; blocks of 1000 edges
    (10, 40, 1, False, 777)])   # dense rows, many repeated edges; an odd block size
def test_rmat_unit_rows_on_device_are_the_hosts(tmp_path, monkeypatch, scale, edge_factor, seed,
                                                symmetric, block):
    """The whole R-MAT matrix made on the GPU from sorted edge keys (RmatRowsOnDevice) is the
    host's unit rows of the host's edges: the same row pointers and columns."""
    from helpers import gpu_bound, run_context
    if block is not None:
        monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", block)
    params = {"scale": scale, "edge_factor": edge_factor, "a": 0.57, "b": 0.19, "c": 0.19,
              "seed": seed, "symmetric": symmetric}
    n = 1 << scale
    src, dst = generators.rmat_edges(**params)
    want = generators.unit_rows(src, dst, np.arange(n, dtype=np.int64), n)
    with gpu_bound() as device:
        run_context(tmp_path, "spmv", backend="gpu", device=device,
                    input={"generate": {"kind": "rmat", "scale": scale}})
        whole = generators.RmatRowsOnDevice(params)
        indptr, columns = whole.make()
        # the columns of the rows from n / 3 on, as a rank holding them downloads them
        first = int(indptr[n // 3])
        tail = whole.download(columns, first, len(columns), np.int32)
        columns = columns.get()
        whole.release()
    assert tail.dtype == np.int32
    np.testing.assert_array_equal(tail, want.indices[first:])
    assert want.nnz > 0 and len(indptr) == n + 1
    assert edge_factor > 1 or np.any(np.diff(want.indptr) == 0)  # empty rows in that case
    assert indptr.dtype == np.int64 and columns.dtype == np.int64
    np.testing.assert_array_equal(indptr, want.indptr)
    np.testing.assert_array_equal(columns, want.indices)


@pytest.mark.gpu
@pytest.mark.parametrize("scale, edge_factor, seed, blocks, symmetric, block, piece", [
    (12, 20, 3, None, False, None, None),         # two blocks, the last partial
    (13, 16, 0, range(1, 3), True, None, None),   # a rank's share, reverse edges added
    (14, 16, 7, None, False, None, 2),            # launches of two blocks each
    (10, 16, 1, range(2, 9), False, 1000, 3)])    # blocks of 1000 edges (not a power of two)
def test_rmat_edges_on_device_are_the_hosts(tmp_path, monkeypatch, scale, edge_factor, seed,
                                             blocks, symmetric, block, piece):
    """The GPU's R-MAT edges (each edge jumping its block's PCG64 stream) are the host's, bit
    for bit, whatever the blocks, their size and the pieces the device makes them in."""
    from helpers import gpu_bound, run_context
    from hisparse.gpu import _rmat as device_rmat
    if block is not None:
        monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", block)
    if piece is not None:
        monkeypatch.setattr(device_rmat, "PIECE_EDGES", piece * _rmat.RMAT_EDGE_BLOCK)
    want = generators.rmat_edges(scale, edge_factor, seed=seed, symmetric=symmetric,
                                 blocks=blocks)
    with gpu_bound() as device:
        ctx = run_context(tmp_path, "spmv", backend="gpu", device=device,
                          input={"generate": {"kind": "rmat", "scale": scale}})
        got = generators.rmat_edges_on_device(ctx, scale, edge_factor, seed=seed,
                                              symmetric=symmetric, blocks=blocks)
    assert len(want[0]) > 0
    for g, w in zip(got, want):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w)
