#!/bin/bash
# Stop what up.sh started under $D: cancel every job (its processes outlive slurmd otherwise),
# then end the daemons by the pids in their pid files (TERM, then KILL after 10 s).
D=${D:?state directory}
export SLURM_CONF=$D/slurm.conf
if [ -s "$D/slurmctld.pid" ] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null; then
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        # shellcheck disable=SC2086
        scancel $jobs
        for _ in $(seq 1 150); do
            [ -z "$(squeue -h 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
fi
pids=()
for f in "$D"/slurmd-*.pid "$D/slurmctld.pid" "$D/munge/munged.pid"; do
    [ -s "$f" ] || continue
    p=$(cat "$f")
    kill -TERM "$p" 2>/dev/null && pids+=("$p")
done
for _ in $(seq 1 100); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
done
for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
        echo "down.sh: pid $p still alive: KILL" >&2
        kill -KILL "$p"
    fi
done
exit 0
