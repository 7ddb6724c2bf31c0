#!/usr/bin/env bash
# Install (Debian packages) and start a one-node Slurm with munge on this machine, as root.
# The test suite submits the sbatch templates of jobs/ to it; CI runs this before the tests.
# Safe to run again: it leaves a Slurm that already answers alone.
#
#   sudo bash hpc/slurm-up.sh           # then: sinfo; sbatch jobs/single-node.sbatch ...
#
# Environment:
#   PSF_SLURM_CPUS   CPUs the node declares (default 32, more than the cores: jobs may oversubscribe)
#   PSF_SLURM_CONF   where slurm.conf goes (default /etc/slurm/slurm.conf)
# Exit status 0: Slurm answers (sinfo shows the node idle); 3: Slurm cannot be had here (not root,
# no apt-get, or the packages do not install); 1: it was installed but did not come up.
set -uo pipefail
cpus="${PSF_SLURM_CPUS:-32}"
conf="${PSF_SLURM_CONF:-/etc/slurm/slurm.conf}"
say() { echo "slurm-up: $*" >&2; }

if command -v sinfo >/dev/null 2>&1 && timeout 10 sinfo -h -o %T 2>/dev/null | grep -qE "idle|mix|alloc"; then
    say "Slurm already answers"; exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root: cannot install or start Slurm here"; exit 3
fi
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
        || ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || { say "no apt-get: cannot install Slurm's packages"; exit 3; }
    say "installing slurmctld, slurmd, slurm-client and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/tmp/slurm-up-apt.log 2>&1; then
        timeout 300 apt-get update -q >>/tmp/slurm-up-apt.log 2>&1
        apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge \
            >>/tmp/slurm-up-apt.log 2>&1 || { say "the packages did not install (see /tmp/slurm-up-apt.log)"; exit 3; }
    fi
fi

host="$(hostname -s)"
memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$(dirname "$conf")" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > "$conf" <<EOF
# One-node Slurm written by psframework's hpc/slurm-up.sh
ClusterName=psf
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
# a requeued job may start again after cred_expire seconds (Slurm default 120, at least 5)
AuthInfo=cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
# Slurm starts a requeued job at a periodic pass of its main scheduler (sched_interval, 60 s by
# default) or of backfill (bf_interval, 30 s), not when the job becomes eligible: pass often here.
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=300
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile /etc/munge/munge.key >/dev/null 2>&1 \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- munged || { say "munged did not start"; exit 1; }
fi
# Only this machine's own daemons: a cluster of hosts' Slurm (hpc/netcluster slurm) runs in its namespaces.
pkill -x slurmctld --ns $$ --nslist net; pkill -x slurmd --ns $$ --nslist net; sleep 1
slurmctld -c || { say "slurmctld did not start (see /var/log/slurm/slurmctld.log)"; exit 1; }
slurmd -c || { say "slurmd did not start (see /var/log/slurm/slurmd.log)"; exit 1; }
for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qE "^(idle|mix|alloc)"; then
        say "Slurm is up: node $host, $cpus CPUs, partition debug"; exit 0
    fi
    sleep 1
done
say "Slurm did not bring its node up in 60 s; sinfo says: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
exit 1
