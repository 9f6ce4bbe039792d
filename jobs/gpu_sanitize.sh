#!/bin/bash
# compute-sanitizer on small runs of every operation's GPU kernels: memcheck, and racecheck where
# the kernels use shared memory. On the GPU machine, from the project root:
#   OUT=/tmp/out bash jobs/gpu_sanitize.sh
# Writes $OUT/sanitize.log and prints one summary line per run; exits non-zero if any run failed.
set -u
OUT=${OUT:-results}
mkdir -p "$OUT"
COMMON=(--set run.repeats=1 --set run.warmup=0 --set 'peers=[]' --set backend=gpu
        --set verify.enabled=true --set output.dir=/tmp/hisparse-sanitize --quiet)
status=0
check() {  # check NAME TOOL CONFIG [--set K=V]...
    local name=$1 tool=$2
    shift 2
    rm -rf /tmp/hisparse-sanitize
    compute-sanitizer --tool "$tool" --error-exitcode 9 hisparse run "$@" "${COMMON[@]}" \
        > /tmp/hisparse-sanitize.log 2>&1
    local rc=$?
    echo "== $name ($tool): rc $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
        /tmp/hisparse-sanitize.log | tail -1)" | tee -a "$OUT/sanitize.log"
    if [ "$rc" -ne 0 ]; then
        tail -20 /tmp/hisparse-sanitize.log >> "$OUT/sanitize.log"
        status=1
    fi
}
SMALL_TENSOR=(--set 'input.generate.dims=[40,30,50]' --set input.generate.nnz=6000)
check spmv-csr5 memcheck inputs/bench_spmv_poisson27.yaml --set 'input.generate.dims=[12,12,12]' \
    --set operation.params.iterations=3
check spmv-csr memcheck inputs/bench_spmv_poisson27.yaml --set 'input.generate.dims=[12,12,12]' \
    --set operation.params.iterations=3 --set operation.params.format=csr
check spgemm memcheck inputs/bench_spgemm_poisson27_80.yaml --set 'input.generate.dims=[10,10,10]'
check spgemm-keep memcheck inputs/bench_spgemm_poisson27_80.yaml \
    --set 'input.generate.dims=[10,10,10]' --set operation.params.keep_distributed=true
for tool in memcheck racecheck; do
    check sptv "$tool" inputs/bench_sptv_nell2_resident.yaml "${SMALL_TENSOR[@]}" \
        --set operation.params.sweep=false
    check cpals "$tool" inputs/bench_cpals_nell2_20m.yaml "${SMALL_TENSOR[@]}" \
        --set operation.params.max_iters=2
    check cholesky "$tool" inputs/bench_cholesky_trefethen20000.yaml --set input.generate.n=400
done
exit "$status"
