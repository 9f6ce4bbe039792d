#!/bin/bash
# Stop the CI Slurm cluster started by .ci/slurm-up.sh: cancel jobs, then stop slurmd,
# slurmctld and munged (by their pid files). Safe to run when nothing is running.
set -uo pipefail

log() { echo "slurm-down: $*" >&2; }
alive() {  # the pid in file $1 is running (a zombie waiting for init to reap it is not)
    local pid
    [ -f "$1" ] && pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
stop() {  # stop <name> <pid file>
    if alive "$2"; then
        kill "$(cat "$2")" 2>/dev/null || true
        for _ in $(seq 100); do alive "$2" || break; sleep 0.1; done
        if alive "$2"; then log "$1 ignored SIGTERM; sending SIGKILL"; kill -9 "$(cat "$2")" 2>/dev/null || true; fi
        log "stopped $1"
    fi
    rm -f "$2"
}

if command -v scancel >/dev/null 2>&1 && alive /run/slurmctld.pid; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
fi
stop slurmd /run/slurmd.pid
stop slurmctld /run/slurmctld.pid
stop munged /run/munge/munged.pid
exit 0
