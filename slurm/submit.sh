#!/bin/bash
# Submit a FastRL run as N chained Slurm stages (slurm/train.sbatch), each starting only after the
# previous one completed successfully (--dependency=afterok); if a stage fails, the later ones are
# cancelled by Slurm (--kill-on-invalid-dep=yes) instead of pending forever.
#
# Usage:
#   slurm/submit.sh --recipe NAME --run-dir DIR [--stages N] [--stage-steps K] [--stage-seconds S]
#                   [--grace SECONDS] [--launch mpi|torchrun] [--dry-run]
#                   [key=value ...] [-- SBATCH_OPTIONS ...]
#
# Example (two nodes of 8 GPUs, three stages of at most 4 hours):
#   slurm/submit.sh --recipe qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16 --run-dir runs/geo3k-7b \
#       --stages 3 rollout.n=8 parallel.world_size=16 -- --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --time=04:00:00
#
# --grace: seconds between Slurm's stop signal and the time limit; the trainer finishes its step
# (which may hold a validation) and saves in them. submit.sh runs the recipe's --dry-run
# (FASTRL_VENV's python, else `python`), which estimates that time from the memory plan
# (fastrl/models/stop_budget.py: `# stop grace: >= N s ...`): without --grace it takes N, a --grace
# below N is refused with the parts of the estimate; a recipe without a memory plan (no
# parallel.world_size) gets 300 s unless --grace says otherwise.
#
# A run is finished when DIR/FINISHED exists (the trainer writes it when the last step is done);
# submitting a finished run, or a run that still has jobs in the queue, submits nothing and says so.
# Logs: DIR/logs/stage<k>-<jobid>.out; the submitted job ids are appended to DIR/logs/jobs.txt.
set -euo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "fastrl submit: $*" >&2; exit 2; }

recipe="" run_dir="" stages=1 stage_steps="" stage_seconds="" grace="" launch=mpi dry_run=0
overrides=() sbatch_opts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --recipe) recipe=${2:?--recipe needs a value}; shift 2 ;;
    --run-dir) run_dir=${2:?--run-dir needs a value}; shift 2 ;;
    --stages) stages=${2:?--stages needs a value}; shift 2 ;;
    --stage-steps) stage_steps=${2:?--stage-steps needs a value}; shift 2 ;;
    --stage-seconds) stage_seconds=${2:?--stage-seconds needs a value}; shift 2 ;;
    --grace) grace=${2:?--grace needs a value}; shift 2 ;;
    --launch) launch=${2:?--launch needs a value}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; sbatch_opts=("$@"); break ;;
    -*) die "unknown option '$1' (sbatch options go after --); see --help" ;;
    *=*) overrides+=("$1"); shift ;;
    *) die "unknown argument '$1' (overrides are key=value; sbatch options go after --); see --help" ;;
  esac
done

[ -n "${recipe}" ] || die "--recipe is required (python -m fastrl.train --list-recipes)"
[ -n "${run_dir}" ] || die "--run-dir is required (the run directory: logs, checkpoints, FINISHED marker)"
[[ "${stages}" =~ ^[1-9][0-9]*$ ]] || die "--stages must be a positive integer, got '${stages}'"
[ -z "${grace}" ] || [[ "${grace}" =~ ^[0-9]+$ ]] || die "--grace must be a number of seconds, got '${grace}'"
[ -z "${stage_steps}" ] || [[ "${stage_steps}" =~ ^[1-9][0-9]*$ ]] || die "--stage-steps must be a positive integer, got '${stage_steps}'"
[ -z "${stage_seconds}" ] || [[ "${stage_seconds}" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--stage-seconds must be a number, got '${stage_seconds}'"
case "${launch}" in mpi|torchrun) ;; *) die "--launch must be mpi or torchrun, got '${launch}'" ;; esac

# The stop grace against the recipe's estimate (its --dry-run; also refuses a recipe that does not resolve).
python_bin="${FASTRL_VENV:+${FASTRL_VENV}/bin/}python"
if ! plan=$("${python_bin}" -m fastrl.train --recipe "${recipe}" --dry-run ${overrides[@]+"${overrides[@]}"} 2>&1); then
  die "${python_bin} -m fastrl.train --recipe ${recipe} --dry-run failed: $(printf '%s\n' "${plan}" | tail -n 1)"
fi
stop_line=$(printf '%s\n' "${plan}" | grep -m 1 '^# stop grace: >= ' || true)
if [ -n "${stop_line}" ]; then
  need=$(printf '%s\n' "${stop_line}" | sed 's/^# stop grace: >= \([0-9][0-9]*\) s.*/\1/')
  if [ -z "${grace}" ]; then
    grace=${need}
  elif [ "${grace}" -lt "${need}" ]; then
    die "--grace ${grace} s is shorter than a stop of this recipe needs: ${stop_line#\# }; pass --grace ${need} or more"
  fi
  echo "fastrl submit: stop signal ${grace} s before the time limit (${stop_line#\# })" >&2
else
  grace=${grace:-300}
  echo "fastrl submit: stop signal ${grace} s before the time limit (no estimate: the recipe's --dry-run prints no memory plan without parallel.world_size)" >&2
fi

run_dir=$(realpath -m "${run_dir}")
name=$(basename "${run_dir}")
comment="fastrl-run:${run_dir}"
sbatch_file="$(cd "$(dirname "$0")" && pwd)/train.sbatch"

if [ -f "${run_dir}/FINISHED" ]; then
  echo "fastrl submit: run ${run_dir} is already finished (${run_dir}/FINISHED: $(head -c 200 "${run_dir}/FINISHED" | tr '\n' ' ')); nothing submitted"
  exit 0
fi
if [ "${dry_run}" = 0 ]; then
  queued=$(squeue -h -u "$(id -un)" -o "%i %k" | awk -v c="${comment}" '$2 == c {print $1}' | sort -n | paste -sd, -)
  if [ -n "${queued}" ]; then
    echo "fastrl submit: run ${run_dir} already has jobs in the queue (${queued}); nothing submitted (scancel them to resubmit)"
    exit 0
  fi
  mkdir -p "${run_dir}/logs"
fi

export FASTRL_RECIPE="${recipe}" FASTRL_RUN_DIR="${run_dir}" FASTRL_LAUNCH="${launch}"
export FASTRL_REPO="${FASTRL_REPO:-$(cd "$(dirname "$0")/.." && pwd)}"  # slurm/torchrun_task.sh is found there
export FASTRL_STAGE_STEPS="${stage_steps}" FASTRL_STAGE_SECONDS="${stage_seconds}"
previous=""
for ((k = 1; k <= stages; k++)); do
  log="${run_dir}/logs/stage${k}-%j.out"
  cmd=(sbatch --parsable --job-name="fastrl-${name}" --comment="${comment}" --output="${log}"
       --signal="B:USR1@${grace}" --kill-on-invalid-dep=yes)
  [ -n "${previous}" ] && cmd+=(--dependency="afterok:${previous}")
  cmd+=(${sbatch_opts[@]+"${sbatch_opts[@]}"} "${sbatch_file}" ${overrides[@]+"${overrides[@]}"})  # empty arrays: bash < 4.4 with set -u
  if [ "${dry_run}" = 1 ]; then
    echo "FASTRL_RECIPE=${recipe} FASTRL_RUN_DIR=${run_dir} FASTRL_LAUNCH=${launch} FASTRL_STAGE_STEPS=${stage_steps} FASTRL_STAGE_SECONDS=${stage_seconds} FASTRL_STAGE=${k} ${cmd[*]}"
    previous="<stage${k}>"
    continue
  fi
  job=$(FASTRL_STAGE="${k}" "${cmd[@]}")
  job=${job%%;*}
  echo "stage ${k}/${stages}: job ${job}$([ -n "${previous}" ] && echo " (after ${previous})")  log ${log//%j/${job}}"
  echo "stage ${k} job ${job} submitted $(date -u +%FT%TZ)" >> "${run_dir}/logs/jobs.txt"
  previous=${job}
done
if [ "${dry_run}" = 0 ]; then
  echo "watch: squeue --name=fastrl-${name} -o '%.10i %.12j %.8T %.10M %.10l %R'   logs: tail -f ${run_dir}/logs/stage*.out"
fi
