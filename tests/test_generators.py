"""Generators against independent constructions."""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.errors import ConfigError


def _laplacian_1d(n):
    return sp.diags([-1, 2, -1], [-1, 0, 1], shape=(n, n))


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


def test_random_tensor_hits_targets():
    tensor = generators.random_tensor([50, 60, 70], nnz=20000, fibers_per_nnz=0.2, seed=3)
    assert tensor.shape == (50, 60, 70)
    assert 0.85 * 20000 <= tensor.nnz <= 20000
    fibers = np.unique(tensor.indices[:, :2], axis=0)
    assert abs(len(fibers) / tensor.nnz - 0.2) < 0.05
    assert len(np.unique(tensor.indices, axis=0)) == tensor.nnz  # no duplicates


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
    # issue 16: d = 1 - a - b - c must not be negative
    ({"kind": "rmat", "scale": 4, "a": 0.6, "b": 0.3, "c": 0.3}, r"a \+ b \+ c = 1\.2 exceeds 1"),
])
def test_bad_specs_name_the_key(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        generators.validate_spec(spec)
