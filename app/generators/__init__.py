"""Synthetic inputs with a seed: Poisson stencils, R-MAT graphs, Trefethen matrices, random
matrices and FROSTT-like random tensors.

A generator spec is a mapping ``{kind: NAME, ...params}``; :func:`validate_spec` checks it against
the generator's parameters and :func:`generate` builds the object. The same specs are accepted by
``input.generate`` in a run config and by ``hisparse generate``.

Every matrix generator can also make a part of its matrix alone (:func:`part_source`): stencil
and band rows are built per row, random matrices in fixed row blocks and R-MAT edges in fixed edge
blocks, each block from its own stream seeded by ``(seed, 0, block)``. So ranks that each make
their own rows get, together, exactly the matrix :func:`generate` makes for the same seed,
whatever their number. The random tensor is made by fiber ranges the same way
(:func:`tensor_source`), every random number a hash of the seed and the fiber's number, so a
range is the same bits whether NumPy or CuPy (on a GPU) makes it.

The package's modules, private: ``_common`` (threads, band rows, shared checks), ``_poisson``,
``_rmat``, ``_keyed_permutation`` (the keyed Feistel permutation), ``_trefethen``,
``_random_matrix``, ``_tensor`` and ``_registry`` (one class per kind, the specs and the part
sources); everything else imports the names below from ``hisparse.generators``.
"""
from ._keyed_permutation import (PERMUTATION_ROUNDS, PERMUTATION_STREAM, Permutation,
                                 keyed_permutation)
from ._poisson import poisson, poisson_rows
from ._rmat import (DEVICE_EDGES_MIN, PCG64_MULTIPLIER, RMAT_EDGE_BLOCK, RMAT_MAX_SCALE,
                    UNIT_ROWS_BYTES_PER_KEY, RmatRowsOnDevice, lcg_jump, rmat, rmat_block_table,
                    rmat_blocks, rmat_edges, rmat_edges_on_device, rmat_part_edges, unit_rows)
from ._trefethen import trefethen
from ._random_matrix import (RANDOM_ROW_BLOCK, random_matrix, random_matrix_blocks,
                             random_matrix_rows)
from ._tensor import (TENSOR_FIBER_STEP, TENSOR_FIBER_STEP_GPU, FiberRecipe, TensorSource,
                      random_tensor, tensor_source)
from ._registry import (GENERATORS, Generator, PartSource, Poisson, RandomMatrix, RandomTensor,
                        Rmat, Trefethen, generate, generator_of, grid_of_spec, makes_band,
                        part_source, spec_kind, validate_spec)

__all__ = ["poisson", "poisson_rows", "trefethen",
           "rmat", "rmat_edges", "rmat_edges_on_device", "rmat_part_edges", "rmat_blocks",
           "rmat_block_table", "lcg_jump", "unit_rows", "RmatRowsOnDevice", "RMAT_EDGE_BLOCK",
           "RMAT_MAX_SCALE", "DEVICE_EDGES_MIN", "UNIT_ROWS_BYTES_PER_KEY", "PCG64_MULTIPLIER",
           "keyed_permutation", "Permutation", "PERMUTATION_ROUNDS", "PERMUTATION_STREAM",
           "random_matrix", "random_matrix_rows", "random_matrix_blocks", "RANDOM_ROW_BLOCK",
           "random_tensor", "tensor_source", "TensorSource", "FiberRecipe", "TENSOR_FIBER_STEP",
           "TENSOR_FIBER_STEP_GPU",
           "Generator", "Poisson", "Rmat", "Trefethen", "RandomMatrix", "RandomTensor",
           "GENERATORS", "validate_spec", "generator_of", "generate", "PartSource", "part_source",
           "makes_band", "grid_of_spec", "spec_kind"]
