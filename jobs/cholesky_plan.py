"""Will a Cholesky factorization fit on P GPUs, and how well can it spread? The analysis and the
subtree mapping of ``partition.strategy: subtree`` run on the host (no GPU needed); per rank it
prints the factor flops, the panels it holds, its plan and the GPU engine's update buffers.

    python jobs/cholesky_plan.py 250,250,250 4            (a 7-point Laplacian, 4 ranks)
    python jobs/cholesky_plan.py --input A.h5 2 4 --pieces 0 1024

Options: ``--pieces W ...`` (operation.params.top_piece_columns, default the operation's),
``--ordering`` (auto), ``--relaxation`` (cholmod), ``--block-size`` (1024), ``--streams`` (4,
the config's gpu.streams), ``--precision`` fp64 or fp32, ``--ordering-file PATH``
(operation.params.ordering_file: the ordering computed once for all the rank counts, or read),
``--grid NX,NY[,NZ]`` (operation.params.ordering_grid, for ``--ordering geometric`` of an
``--input``; the Laplacian's dims otherwise), ``--no-level-sets`` (the splits of the ordering
try METIS's separators only:
``ordering.LEVEL_SET_TRIES`` off, for the A/B).

The bytes are the engine's largest arrays: the panels (the factor's values, explicit zeros of
the relaxed supernodes included), the rank's plan (indices, uploaded with it) and the update
chunks (one per stream, the largest top or large supernode's below rows times ``block_size``).
The driver records the measured peak per rank (``chol_rank_peak_bytes``); the 1-rank rows
here are what ``partition.strategy: single`` holds. The speed-up bound is the mapping's
estimate (flops over the simulated critical path; communication left out).
"""
import argparse
import time

import numpy as np

from hisparse import generators
from hisparse.io import read_matrix
from hisparse.ops.cholesky import ordering
from hisparse.ops.cholesky.mapping import subtree_mapping
from hisparse.ops.cholesky.rank_plan import local_plan
from hisparse.ops.cholesky.symbolic import TOP_PIECE_COLUMNS, analyze

GB = 1e9


#: operation.params.small_work's default: larger supernodes are block tasks with update chunks
SMALL_WORK = 2.0 ** 30


def update_chunk_values(nrows, ncols, block_size, also=()):
    """Values of one update chunk buffer of the GPU engine (as it sizes them): over its block
    task supernodes (more than :data:`SMALL_WORK`, and ``also``: a rank's top supernodes), the
    largest below-row count times min(block_size, it)."""
    below = nrows - ncols
    large = ncols * below.astype(np.float64) ** 2 > SMALL_WORK
    large[np.asarray(also, dtype=np.int64)] = True
    below = below[large]
    return int((below * np.minimum(block_size, below)).max()) if len(below) else 0


def report(matrix, nranks, width, args, itemsize):
    started = time.perf_counter()
    sym = analyze(matrix, args.ordering, args.relaxation, block_size=args.block_size,
                  nranks=nranks, top_piece_columns=width, ordering_file=args.ordering_file,
                  grid=args.grid)
    analysed = time.perf_counter() - started
    ncols = np.diff(sym.starts)
    print(f"ranks {nranks}, top_piece_columns {width}: analysis {analysed:.1f} s, nnz(L) "
          f"{sym.factor_nnz:.3e}, flops {sym.flops:.3e}, supernodes {sym.nsuper}")
    if nranks == 1:
        chunk = update_chunk_values(sym.nrows, ncols, args.block_size) * args.streams
        panels = sym.panel_offset[-1] * itemsize
        print(f"  rank 0: panels {panels / GB:.4g} GB, update chunks {chunk * itemsize / GB:.4g}"
              f" GB, total {(panels + chunk * itemsize) / GB:.4g} GB")
        return
    mapping = subtree_mapping(sym, nranks)
    print(f"  top supernodes {len(mapping.top)} (exchanges {len(mapping.chains)}), speed-up "
          f"bound {mapping.rank_flops.sum() / mapping.makespan:.2f}")
    for rank in range(nranks):
        plan, _ = local_plan(sym, mapping, rank)
        chunk = update_chunk_values(plan.nrows, plan.ncols, args.block_size,
                                    plan.top[plan.top >= 0]) * args.streams
        panels = plan.panel_offset[-1] * itemsize
        total = panels + plan.nbytes() + chunk * itemsize
        print(f"  rank {rank}: flops {mapping.rank_flops[rank]:.3e} "
              f"({mapping.rank_flops[rank] / sym.flops:.1%}), panels {panels / GB:.4g} GB, "
              f"plan {plan.nbytes() / GB:.4g} GB, update chunks {chunk * itemsize / GB:.4g}"
              f" GB, total {total / GB:.4g} GB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dims", nargs="?", help="Laplacian grid, e.g. 250,250,250")
    parser.add_argument("ranks", nargs="+", type=int)
    parser.add_argument("--input", help="an HDF5 matrix instead of the Laplacian")
    parser.add_argument("--pieces", nargs="+", type=int, default=[TOP_PIECE_COLUMNS])
    parser.add_argument("--ordering", default="auto")
    parser.add_argument("--relaxation", default="cholmod")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--precision", choices=("fp64", "fp32"), default="fp64")
    parser.add_argument("--ordering-file", help="operation.params.ordering_file")
    parser.add_argument("--grid", help="operation.params.ordering_grid, e.g. 250,250,250")
    parser.add_argument("--no-level-sets", action="store_true",
                        help="the ordering's splits without their level-set tries")
    args = parser.parse_args()
    ordering.LEVEL_SET_TRIES = not args.no_level_sets
    if args.input:
        if args.dims is not None:  # argparse took the first rank count for dims
            args.ranks.insert(0, int(args.dims))
        matrix = read_matrix(args.input).to_scipy()
    elif args.dims:
        matrix = generators.poisson([int(d) for d in args.dims.split(",")]).to_scipy()
        args.grid = args.grid or args.dims
    else:
        parser.error("give the Laplacian's dims or --input")
    args.grid = [int(d) for d in args.grid.split(",")] if args.grid else None
    itemsize = 8 if args.precision == "fp64" else 4
    print(f"matrix: n {matrix.shape[0]}, nnz {matrix.nnz}")
    for nranks in args.ranks:
        for width in (args.pieces if nranks > 1 else [0]):
            report(matrix, nranks, width, args, itemsize)


if __name__ == "__main__":
    main()
