#!/bin/bash
# The whole scaling study of docs/scaling/ in one command on one multi-GPU machine: every
# operation's strong series, SpMV on an R-MAT graph of scale 23 (row blocks, and the
# checkerboard's grid), the weak series of SpMV (27-point stencil) and SpGEMM (R-MAT), and
# Cholesky's (ordering computed in every run, and read from a saved ordering file),
# each by jobs/device_study.sh, then one report over all of them (time to solution first,
# per-repeat totals, efficiencies, CSV and plots).
#
#   jobs/scaling_study.sh [-o DIR] [--ranks 1,2,4] [--gpus 4] [--repeats 5] [--only NAME]...
#
# DIR defaults to $OUT/scaling (or results/scaling). Peers and verification are off in the
# timed series (verification runs in the GPU tests and in the R-MAT run's --verify below).
# --only strong|rmat|weak|cholesky|size runs that part alone (repeatable; size, issue 34's 250^3
# Cholesky on every GPU of the machine, verified, its results in DIR_size: runs only when
# asked for).
set -uo pipefail
# One machine: Open MPI's ob1 layer over shared memory starts in 0.05 s where UCX's probe of the
# network took 0.25 s of every rank's start-up (docs/cluster.md, "Open MPI on one node"); the
# device_study.sh runs (hisparse jobs scripts) export it themselves, the size case below by this.
export OMPI_MCA_pml="${OMPI_MCA_pml-ob1}"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

# --ranks and --gpus reach every device_study.sh call as they were given (device_study.sh checks
# them and has the same defaults).
DIR="${OUT:-results}/scaling"
REPEATS=5
ONLY=()
PASSED=()
while [ $# -gt 0 ]; do
    case "$1" in
        -o|--output) DIR=$2; shift 2 ;;
        --ranks|--gpus) PASSED+=("$1" "$2"); shift 2 ;;
        --repeats) REPEATS=$2; shift 2 ;;
        --only) ONLY+=("$2"); shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "scaling_study: unknown argument $1" >&2; usage ;;
    esac
done
wanted() {
    local part
    [ ${#ONLY[@]} -eq 0 ] && [ "$1" != size ] && return 0
    for part in "${ONLY[@]}"; do [ "$part" = "$1" ] && return 0; done
    return 1
}

HERE=$(cd "$(dirname "$0")/.." && pwd)
STUDY=(bash "$HERE/jobs/device_study.sh" -o "$DIR" ${PASSED[@]+"${PASSED[@]}"}
       --set 'peers=[]' --set "run.repeats=$REPEATS" --set verify.enabled=false)
failed=0
if wanted strong; then
    "${STUDY[@]}" --timeout 240 "$HERE/inputs/bench_spmv_scaling.yaml" \
        "$HERE/inputs/bench_spgemm_poisson27_128.yaml" "$HERE/inputs/bench_spgemm_rmat18.yaml" \
        "$HERE/inputs/bench_sptv_nell2_multigpu.yaml" "$HERE/inputs/bench_cpals_nell2_20m.yaml" \
        || failed=1
fi
if wanted rmat; then
    "${STUDY[@]}" --timeout 300 --set input.generate.scale=23 "$HERE/inputs/bench_spmv_rmat.yaml" \
        || failed=1
    # the same graph on the checkerboard's grid (auto keeps the row blocks below 16 ranks)
    "${STUDY[@]}" --timeout 300 --id bench_spmv_rmat_checkerboard --set input.generate.scale=23 \
        --set partition.strategy=checkerboard "$HERE/inputs/bench_spmv_rmat.yaml" || failed=1
fi
if wanted weak; then
    "${STUDY[@]}" --timeout 200 --kind weak --weak 'input.generate.dims[0]=multiply' \
        "$HERE/inputs/bench_spmv_scaling.yaml" || failed=1
    "${STUDY[@]}" --timeout 200 --kind weak --weak input.generate.scale=log2 \
        "$HERE/inputs/bench_spgemm_weak_rmat.yaml" || failed=1
fi
if wanted cholesky; then
    "${STUDY[@]}" --timeout 300 "$HERE/inputs/bench_cholesky_lap120_multigpu.yaml" \
        "$HERE/inputs/bench_cholesky_grid2000_multigpu.yaml" || failed=1
    # The same matrices with a saved ordering (operation.params.ordering_file): the priming run
    # computes and writes it, every run of the series reads it, as a user's study of one matrix
    # would after its first run.
    mkdir -p "$DIR/orderings"
    for matrix in lap120 grid2000; do
        "${STUDY[@]}" --timeout 300 --id "bench_cholesky_${matrix}_saved_ordering" \
            --set "operation.params.ordering_file=$DIR/orderings/$matrix.h5" \
            "$HERE/inputs/bench_cholesky_${matrix}_multigpu.yaml" || failed=1
    done
fi
# Issue 34's size case: a 3-D Laplacian of 250^3 (its factor, 175 GB, larger than one H200; 103-111
# GB a GPU on two) factored and solved on every GPU of the machine at once, verified; not a series.
if wanted size; then
    SIZE_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$SIZE_GPUS" -ge 1 ] || SIZE_GPUS=4
    timeout 600 mpirun -n "$SIZE_GPUS" --bind-to none -x NCCL_NVLS_ENABLE=0 hisparse run \
        "$HERE/inputs/bench_cholesky_lap250_multigpu.yaml" \
        --set 'peers=[]' --set "output.dir=${DIR%/}_size" || failed=1
fi
hisparse report "$DIR" --output "$DIR" || failed=1
exit $failed
