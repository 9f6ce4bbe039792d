#!/bin/bash
# Start a single-node Slurm cluster on localhost (munge + slurmctld + slurmd) for CI.
#
# Debian/Ubuntu, run as root, no systemd needed. Idempotent: installs slurm-wlm and munge only
# when missing, rewrites the config, restarts daemons that are not answering, and returns once
# `sinfo` shows the node idle. Exits non-zero with the daemons' log tails when something fails.
#
#   .ci/slurm-up.sh            # then: sbatch --wait job.sbatch ; .ci/slurm-down.sh
#
# Environment: SLURM_CI_CPUS (CPUs declared for the node; default: nproc, at least 2),
#              SLURM_CI_TIMEOUT (seconds to wait for the node; default 30).
set -euo pipefail

log() { echo "slurm-up: $*" >&2; }
die() {
    log "error: $*"
    for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log; do
        if [ -f "$f" ]; then log "--- last lines of $f"; tail -n 20 "$f" >&2; fi
    done
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "slurm-wlm is not installed and apt-get is not available"
    log "installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    # policy-rc.d stops the package scripts from trying to start services through init.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || { rm -f /usr/sbin/policy-rc.d; die "apt-get install slurm-wlm munge failed"; }
    rm -f /usr/sbin/policy-rc.d
fi

HOST=$(hostname -s)
CPUS=${SLURM_CI_CPUS:-$(nproc)}
[ "$CPUS" -ge 2 ] || CPUS=2
TIMEOUT=${SLURM_CI_TIMEOUT:-30}

# munge: a key and its directories (the postinst normally creates the key; make sure).
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm

CONF=/etc/slurm/slurm.conf
NEW_CONF=$(cat <<CONF
# Written by .ci/slurm-up.sh: a one-node CI cluster on localhost.
ClusterName=ci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MessageTimeout=10
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=NO State=UP
CONF
)
RESTART=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
    printf '%s\n' "$NEW_CONF" > "$CONF"
    RESTART=1
fi

alive() {  # the pid in file $1 is running (a zombie waiting for init to reap it is not)
    local pid
    [ -f "$1" ] && pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
stop() {  # stop the daemon whose pid file is $1
    if alive "$1"; then kill "$(cat "$1")" 2>/dev/null || true
        for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done
    fi
    rm -f "$1"
}

# munged writes its pid to /run/munge/munged.pid.
if ! alive /run/munge/munged.pid; then
    runuser -u munge -- /usr/sbin/munged --force || die "munged did not start"
fi
munge -n | unmunge >/dev/null 2>&1 || die "munge does not round-trip a credential"

if [ "$RESTART" = 1 ]; then stop /run/slurmd.pid; stop /run/slurmctld.pid; fi
if ! alive /run/slurmctld.pid; then /usr/sbin/slurmctld || die "slurmctld did not start"; fi
if ! alive /run/slurmd.pid; then /usr/sbin/slurmd || die "slurmd did not start"; fi

deadline=$((SECONDS + TIMEOUT))
until state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null) && [ "${state%[*~#]}" = idle ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        die "node $HOST is not idle after ${TIMEOUT}s (sinfo state: '${state:-no answer}')"
    fi
    # A node left DOWN/DRAIN by an earlier run: put it back.
    case "${state:-}" in down*|drain*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;; esac
    sleep 0.5
done
log "cluster up: partition debug, node $HOST, $CPUS CPUs ($(sinfo --version))"
