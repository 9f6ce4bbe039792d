#!/bin/bash
# Stop 64 on nvidia-h200-x2, last call: the whole GPU suite on two GPUs after the stop's last
# GPU change (SpGEMM's hash), as much as the device time left allows.
cd "$(dirname "$0")/../../.."
date
timeout 225 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite_d136.log 2>&1; echo "rc $?"
tail -3 $OUT/suite_d136.log; grep -E "^(FAILED|ERROR)" $OUT/suite_d136.log | head -30
date
