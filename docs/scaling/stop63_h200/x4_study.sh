#!/bin/bash
# For a 4-GPU machine (nvidia-h200-x4; prepared in stop 63, run when one is lent): issue 33's
# and 34's 4-GPU points on this code, in two device calls (each under the 10-minute limit):
#   bash docs/scaling/stop63_h200/x4_study.sh a   the CP-ALS NCCL tests (4 GPUs), then the
#                                                 strong series and R-MAT 23 at 1, 2 and 4 GPUs
#   bash docs/scaling/stop63_h200/x4_study.sh b   Cholesky 120^3 and 2000^2 at 1, 2 and 4 GPUs,
#                                                 then 250^3 on the 4 GPUs (issue 34's size case)
# Results and the study's report under $OUT/s (a) and $OUT/c, $OUT/c_size (b).
cd "$(dirname "$0")/../../.."
part=${1:-a}
exec > >(tee $OUT/x4_$part.log) 2>&1
date; nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = a ]; then
  timeout 150 python3 -m pytest -m gpu -n 4 -q -o addopts="" -p no:cacheprovider tests/test_cpals.py \
    -k "transports or graphs_replay or fits_match" > $OUT/suite_x4.log 2>&1; tail -2 $OUT/suite_x4.log
  timeout 420 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2,4 --gpus 4 --only strong --only rmat
  find $OUT/s -name "*.h5" -size +20M -delete
else
  timeout 330 bash jobs/scaling_study.sh -o $OUT/c --ranks 1,2,4 --gpus 4 --only cholesky
  timeout 240 bash jobs/scaling_study.sh -o $OUT/c --only size
  find $OUT/c $OUT/c_size -name "*.h5" -size +20M -delete
fi
date
