#!/bin/bash
# Run a FastRL job under mpirun or srun so that TERM, INT or HUP to this script asks every rank to
# finish its step, save and exit 0 -- the same as USR1 -- instead of tearing the job down.
#
#   slurm/graceful_launch.sh mpirun -n 2 python -m fastrl.train --recipe NAME key=value ...
#   slurm/graceful_launch.sh srun --mpi=pmix -n 2 python -m fastrl.train --recipe NAME ...
#
# Why (measured with Open MPI 4.1.4 and Slurm 22.05, docs/slurm.md "Stop signals by launcher"):
#   - mpirun forwards USR1 and USR2 to the ranks, but on TERM, INT or HUP it tears the job down
#     (TERM to the ranks after odls_base_sigkill_timeout, KILL one timeout later, exit 1), and it
#     refuses SIGTERM/SIGINT in ess_base_forward_signals; a longer sigkill timeout only delays the
#     TERM by as much as it gives the ranks.
#   - srun forwards USR1, but on TERM it cancels the step (the tasks get KILL at once, exit 137),
#     and one INT only prints the step's status (two within a second abort it).
# This script starts the launcher in its own session (so a Ctrl-C on the terminal reaches only this
# script, not the launcher), and on the first TERM/INT/HUP sends USR1 to the launcher, which
# forwards it to every rank; the trainer handles USR1 like TERM (fastrl/checkpoint/signals.py).
# A second TERM/INT/HUP is passed on as TERM (the launcher's own teardown: no checkpoint). USR1
# and USR2 to this script are passed on unchanged. The exit status is the launcher's.
#
# The job's stop signal must be USR1 (stage.exit_signal, the default): that is what is forwarded.

set -uo pipefail

prog=${0##*/}
usage="usage: ${prog} mpirun|mpiexec|srun [launcher options] COMMAND [ARGS...]"
if [ $# -eq 0 ]; then
  echo "${prog}: no launcher given; ${usage}" >&2
  exit 2
fi
case "${1##*/}" in
  mpirun|mpiexec|orterun|srun) ;;
  torchrun)
    echo "${prog}: torchrun is not supported: it dies on USR1 instead of forwarding it (docs/slurm.md," \
         "\"Stop signals by launcher\"); send TERM to torchrun itself, or launch with mpirun/srun; ${usage}" >&2
    exit 2
    ;;
  *)
    echo "${prog}: '$1' is not a launcher this script knows forwards USR1 to every rank" \
         "(mpirun, mpiexec, srun); ${usage}" >&2
    exit 2
    ;;
esac
if ! command -v "$1" >/dev/null 2>&1; then
  echo "${prog}: launcher '$1' not found on PATH" >&2
  exit 127
fi
if ! command -v setsid >/dev/null 2>&1; then
  echo "${prog}: setsid (util-linux) not found; it keeps a terminal's Ctrl-C away from the launcher" >&2
  exit 127
fi

stops=0
pid=
on_stop() {
  stops=$((stops + 1))
  [ -n "${pid}" ] || return 0  # before the launcher started: forwarded as soon as it has (below)
  if [ "${stops}" -eq 1 ]; then
    echo "${prog}: $1 received at $(date -u +%FT%TZ); forwarding USR1 to ${launcher_name} (pid ${pid}):" \
         "every rank finishes its step, saves and exits 0 ($1 again tears the job down without saving)" >&2
    kill -USR1 "${pid}" 2>/dev/null || true
  else
    echo "${prog}: $1 received again at $(date -u +%FT%TZ); passing TERM to ${launcher_name}: no checkpoint" >&2
    kill -TERM "${pid}" 2>/dev/null || true
  fi
}
launcher_name=${1##*/}
trap 'on_stop TERM' TERM
trap 'on_stop INT' INT
trap 'on_stop HUP' HUP
trap 'kill -USR1 "${pid}" 2>/dev/null || true' USR1
trap 'kill -USR2 "${pid}" 2>/dev/null || true' USR2

# Not a process-group leader here (no job control in a script), so setsid execs in place: $! is
# the launcher's pid.
setsid "$@" &
pid=$!
if [ "${stops}" -gt 0 ]; then
  echo "${prog}: a stop signal arrived before ${launcher_name} started; forwarding USR1 to it" >&2
  kill -USR1 "${pid}" 2>/dev/null || true
fi
rc=0
while :; do
  wait "${pid}" && rc=0 || rc=$?
  kill -0 "${pid}" 2>/dev/null || break  # still running: the wait was interrupted by a trapped signal
done
exit "${rc}"
