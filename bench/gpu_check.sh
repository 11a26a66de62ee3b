#!/usr/bin/env bash
# One-shot check of the GPU path on a single GPU machine (an H200) that has Python 3.12 and a CUDA
# build of torch but no package index: installs the wheels of bench/gpu_wheels.txt from
# shared/wheels (fetch them first, where an index is reachable: tools/fetch_gpu_wheels.sh) into a
# private directory put first on PYTHONPATH, then runs bench/gpu_check.py, which prints one table
# (actor step of the tiny and ~1B Qwen2.5-VL policies in bf16, FP8 rows, 5 training steps of the
# default recipe with NCCL, the CUDA IPC refit into one and two engine workers), then the memory
# timeline of one Qwen2.5-VL-3B-architecture step beside the memory plan (bench/gpu_memory_timeline.py:
# an engine stand-in process, the CUDA IPC refit, the save's state dict per optimizer format, an
# all-gather probe), within 10 minutes (the first three parts: about 2.5 measured on an H200; the
# timeline: not yet run on a GPU, limit 240 s; gpu_check.py --total-timeout 560 keeps the table
# inside GPU_CHECK_LIMIT_S). Results go to $OUT when set, else runs/gpu_check; the timeline alone:
#   bench/gpu_check.sh --skip-actor --skip-train --skip-ipc
#
#   bench/gpu_check.sh                 # on the GPU machine
#   bench/gpu_check.sh --cpu-smoke     # here: same entry, tiny sizes, CPU, project venv, < 1 minute
#   bench/gpu_check.sh --dry-run       # the commands it would run
#
# Environment: WHEELS_DIR (default shared/wheels), GPU_CHECK_SITE (default /tmp/fastrl-gpu-site),
# PYTHON (default python3 on the GPU machine, .venv/bin/python for --cpu-smoke / --dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS_DIR:-shared/wheels}
SITE=${GPU_CHECK_SITE:-/tmp/fastrl-gpu-site}
LIMIT_S=${GPU_CHECK_LIMIT_S:-590}

local_run=0
for arg in "$@"; do
    case "$arg" in
        --cpu-smoke|--dry-run) local_run=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    esac
done

if [ "$local_run" = 1 ]; then
    PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
else
    PY=${PYTHON:-python3}
    missing=()
    while read -r spec; do
        name=$(echo "${spec%%[=<>!~ ]*}" | tr 'A-Z-.' 'a-z__')
        ls "$WHEELS"/*.whl 2>/dev/null | xargs -r -n1 basename | tr 'A-Z-.' 'a-z__' | grep -q "^${name}_" \
            || missing+=("$spec")
    done < <(grep -vE '^\s*(#|$)' bench/gpu_wheels.txt)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "gpu_check: no wheel in $WHEELS for: ${missing[*]}; run tools/fetch_gpu_wheels.sh where a package index is reachable" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec timeout "$LIMIT_S" "$PY" bench/gpu_check.py "$@"
