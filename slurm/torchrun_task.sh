#!/usr/bin/env bash
# The Slurm task of the torchrun launch (slurm/train.sbatch with FASTRL_LAUNCH=torchrun), one per
# node: runs torchrun and passes a stop signal on to torchrun's workers.
#
# Why: Slurm's proctrack/cgroup plugin, the usual one on GPU clusters, delivers a signal other than
# KILL (`scancel --signal=USR1`, the time-limit TERM) only to the step's task processes, the direct
# children of slurmstepd (this script), never to their descendants; torchrun itself dies on USR1
# without its workers saving, and starts its workers in sessions of their own. So torchrun runs here
# with USR1 ignored, and a USR1 or TERM that reaches this script is sent as USR1 to each of
# torchrun's workers (its child processes): each finishes its step, saves and exits 0, and torchrun
# then exits 0. (With proctrack/linuxproc or pgid the workers may get the signal directly as well;
# the trainer's stop request is idempotent.)
#
# Usage: slurm/torchrun_task.sh torchrun [torchrun arguments...]
set -u
trap '' USR1            # inherited by torchrun, which would die on it
"$@" &
launcher=$!
forward() {
  echo "torchrun_task: $1 received at $(date -u +%FT%TZ), forwarding USR1 to the workers of torchrun (pid ${launcher})" >&2
  pkill -USR1 -P "${launcher}" || true
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
rc=0
while :; do
  wait "${launcher}" && rc=0 || rc=$?
  kill -0 "${launcher}" 2>/dev/null || break  # still running: wait was interrupted by a trapped signal
done
exit "${rc}"
