#!/bin/bash
# Strong-scaling study on one multi-GPU machine without a scheduler (e.g. 4 GPUs):
# for each config, `hisparse jobs --no-scheduler --launcher mpirun` writes the 1-2-4 rank loop
# (mpirun -n R, --oversubscribe --bind-to none under Open MPI) and this script runs it; then `hisparse report`
# writes the table, CSV and (when matplotlib is installed) the plots into the study directory.
#
#   jobs/device_study.sh [-o DIR] [--ranks 1,2,4] [--gpus G] [--timeout S] [--set K=V]...
#                        [--kind strong|weak] [--weak KEY=RULE]... [--no-prime] [--id ID] CONFIG...
#
# DIR defaults to $OUT/study (or results/study without $OUT). Each config becomes one series with
# study id = the config's file name (--id ID: that id, for one config run with other --set
# values than another series of the same file); a config that fails does not stop the others,
# and the script exits non-zero at the end if any did. Before its series each config runs once at
# each rank count of the series (a weak series: its base size), one repeat, outside the study
# (--no-prime skips them): a machine's first run of an operation fills the kernel and CuPy
# caches, and that would land in the time to solution of the series' first run at that count
# (the kernels of a distributed product, e.g. the ghost block's tile height, differ by rank
# count: R-MAT 23 at 2 ranks compiled 1.5 s in its timed upload after a one-rank prime).
set -uo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

DIR="${OUT:-results}/study"
RANKS="1,2,4"
GPUS=4
TIMEOUT=0
SETS=()
KIND=strong
WEAK=()
PRIME=1
ID=""
CONFIGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -o|--output) DIR=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        --gpus) GPUS=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --set) SETS+=(--set "$2"); shift 2 ;;
        --kind) KIND=$2; shift 2 ;;
        --weak) WEAK+=(--weak "$2"); shift 2 ;;
        --no-prime) PRIME=0; shift ;;
        --id) ID=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "device_study: unknown option $1" >&2; usage ;;
        *) CONFIGS+=("$1"); shift ;;
    esac
done
[ ${#CONFIGS[@]} -gt 0 ] || { echo "device_study: give at least one config" >&2; usage; }
if [ -n "$ID" ] && [ ${#CONFIGS[@]} -gt 1 ]; then
    echo "device_study: --id names one series: give one config with it" >&2; exit 2
fi
command -v hisparse >/dev/null 2>&1 || { echo "device_study: hisparse is not on PATH" >&2; exit 2; }
command -v mpirun >/dev/null 2>&1 || { echo "device_study: mpirun is not on PATH" >&2; exit 2; }

mkdir -p "$DIR/logs"
# The priming runs' launcher flags: the jobs' own under Open MPI (no binding, oversubscription
# allowed), none under another MPI.
MPI_FLAGS=()
mpirun --version 2>/dev/null | grep -q "Open MPI" && MPI_FLAGS=(--oversubscribe --bind-to none)
# Enough cores per rank for the host-side work, never zero.
CPUS=$(( $(nproc) / GPUS )); [ "$CPUS" -ge 1 ] || CPUS=1
failed=()
for config in "${CONFIGS[@]}"; do
    id=$(basename "$config"); id=${id%.yaml}; id=${id%.yml}
    [ -n "$ID" ] && id=$ID
    [ "$KIND" = weak ] && id="${id}_weak"
    if [ "$PRIME" = 1 ]; then
        echo "=== $id: priming runs at ranks $RANKS, not in the study ($(date -u +%H:%M:%S))"
        prime_dir=$(mktemp -d)
        for ranks in ${RANKS//,/ }; do
            launch=()
            [ "$ranks" -gt 1 ] && launch=(mpirun -n "$ranks" "${MPI_FLAGS[@]}")
            ${launch[@]+"${launch[@]}"} hisparse run "$config" --quiet ${SETS[@]+"${SETS[@]}"} \
                --set run.repeats=1 --set run.warmup=0 --set verify.enabled=false \
                --set "output.dir=$prime_dir" >/dev/null 2>&1 ||
                echo "device_study: priming run of $id at $ranks ranks failed (the series runs anyway)"
        done
        rm -rf "$prime_dir"
    fi
    echo "=== $id: $KIND scaling over ranks $RANKS ($(date -u +%H:%M:%S))"
    if ! hisparse jobs "$config" --no-scheduler --launcher mpirun --kind "$KIND" --ranks "$RANKS" \
            --gpus-per-node "$GPUS" --cpus-per-rank "$CPUS" --study-id "$id" --study-dir "$DIR" \
            ${SETS[@]+"${SETS[@]}"} ${WEAK[@]+"${WEAK[@]}"}; then
        failed+=("$id (generation)"); continue
    fi
    if [ "$TIMEOUT" -gt 0 ]; then
        timeout "$TIMEOUT" bash "$DIR/jobs/$id/run.sh" 2>&1 | tee "$DIR/logs/$id.log"
    else
        bash "$DIR/jobs/$id/run.sh" 2>&1 | tee "$DIR/logs/$id.log"
    fi
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || failed+=("$id (exit $rc)")
done

echo "=== report ($(date -u +%H:%M:%S))"
hisparse report "$DIR" --output "$DIR" || failed+=("report")
if [ ${#failed[@]} -gt 0 ]; then
    echo "device_study: failed: ${failed[*]}" >&2
    exit 1
fi
