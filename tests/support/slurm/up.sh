#!/bin/bash
# Start a Slurm cluster of N "nodes" (n1..nN) on this one host: munged, slurmctld and one slurmd
# per node (Debian's slurmd runs several side by side), all state, logs and pid files under $D.
# Ports: slurmctld on $CTLD_PORT, node i's slurmd on $SLURMD_PORT + i - 1. Stop it with down.sh.
#   D=/tmp/slurm N=2 CTLD_PORT=16817 SLURMD_PORT=17001 bash up.sh
set -euo pipefail
D=${D:?state directory}
N=${N:-2}
CTLD_PORT=${CTLD_PORT:-16817}
SLURMD_PORT=${SLURMD_PORT:-17001}
mkdir -p "$D/munge" "$D/state" "$D/log"
for i in $(seq 1 "$N"); do mkdir -p "$D/spool/n$i"; done
chmod 0755 "$D/munge"
if [ ! -f "$D/munge/munge.key" ]; then
    dd if=/dev/urandom bs=1 count=1024 of="$D/munge/munge.key" 2>/dev/null
    chmod 0400 "$D/munge/munge.key"
fi
cat > "$D/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
MinJobAge=4
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName=n[1-$N] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$SLURMD_PORT-$((SLURMD_PORT + N - 1))] CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=n[1-$N] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
munged --force -S "$D/munge/munge.sock" --key-file="$D/munge/munge.key" \
    --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/munged.seed" \
    --log-file="$D/log/munged.log"
slurmctld -f "$D/slurm.conf" -c  # -c: empty state
for i in $(seq 1 "$N"); do slurmd -f "$D/slurm.conf" -N "n$i"; done
export SLURM_CONF=$D/slurm.conf
for _ in $(seq 1 300); do  # up to 30 s for every node to be idle and responding
    if [ "$(sinfo -h -r -t idle -o '%D' 2>/dev/null)" = "$N" ]; then
        exit 0
    fi
    sleep 0.1
done
echo "up.sh: slurm did not come up" >&2
tail -n 20 "$D"/log/*.log >&2
exit 1
