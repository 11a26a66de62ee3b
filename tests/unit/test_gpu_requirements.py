"""The GPU requirement sets of the README ("GPU quick start") resolve for Python 3.12 on x86_64 Linux.

``uv pip compile --python-version 3.12 --python-platform x86_64-manylinux_2_28`` resolves each set
against the package index (PyPI, or ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``) from package metadata
only: nothing is installed and no multi-GB CUDA wheel is downloaded. A pin that breaks the
resolution (a yanked version, a new upper bound, a CUDA mismatch) fails here. These tests need the
package index (marker ``network``; CI has it); the uv cache is kept next to pytest's temporary
directories, so later runs only revalidate the index pages.

Sets:
- trainer: ``-c constraints-gpu.txt requirements.txt gpu-trainer.txt``; megatron-bridge
  (``nodeps.txt``, installed with ``--no-deps``) must accept what it resolved to, and the
  Transformer Engine torch extension (``gpu-trainer-te.txt``, built from source) must exist at the
  version of ``transformer-engine``;
- engine: ``-c constraints-gpu.txt gpu-engine.txt`` (vLLM), on the trainer's torch.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
REQ = REPO / "requirements"
TARGET = ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28"]
TRAINER = ["-c", "requirements/constraints-gpu.txt", "requirements.txt", "requirements/gpu-trainer.txt"]
ENGINE = ["-c", "requirements/constraints-gpu.txt", "requirements/gpu-engine.txt"]


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        pytest.fail("uv is not installed; it is in requirements.txt (pip install uv==0.13.9)")


def _pins(path: Path) -> dict[str, Requirement]:
    """``name -> requirement`` of a requirement file's own lines (no -r / -c lines)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[req.name.lower()] = req
    return out


def _pinned_version(path: Path, name: str) -> str:
    spec = str(_pins(path)[name].specifier)
    assert spec.startswith("=="), f"{path.name}: {name} must be pinned with ==, got {spec!r}"
    return spec[2:]


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp().parent / "fastrl-uv-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_set(args: list[str], cache: Path, *, timeout: float = 300) -> dict[str, str]:
    """``name -> version`` that uv resolves ``args`` to for Python 3.12 / manylinux x86_64."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
    cmd = [_uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--cache-dir", str(cache), *TARGET, *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd[1:])} failed in {time.monotonic() - start:.0f} s:\n{proc.stderr[-3000:]}")
    found = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", proc.stdout, flags=re.MULTILINE))
    assert found, f"no pins in the output of {' '.join(cmd[1:])}:\n{proc.stdout[-2000:]}"
    print(f"{' '.join(args)}: {len(found)} packages in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return {name.lower(): version for name, version in found.items()}


@pytest.mark.network
def test_trainer_set_resolves_with_one_cuda_and_what_megatron_bridge_accepts(uv_cache):
    lock = compile_set(TRAINER, uv_cache)
    torch_pin = _pinned_version(REQ / "constraints-gpu.txt", "torch")
    te_pin = _pinned_version(REQ / "gpu-trainer.txt", "transformer-engine")
    assert lock["torch"] == torch_pin
    assert lock["megatron-core"] == _pinned_version(REPO / "requirements.txt", "megatron-core")
    assert Version(lock["transformers"]).major < 5  # megatron-bridge 0.3.1
    assert lock["transformer-engine"] == lock["transformer-engine-cu13"] == te_pin
    # torch's CUDA 13 libraries and no CUDA 12 build of anything beside them
    assert "nvidia-nccl-cu13" in lock
    assert not [name for name in lock if name.endswith("-cu12")], sorted(n for n in lock if n.endswith("-cu12"))

    # megatron-bridge is installed with --no-deps: its declared ranges must hold for what resolved
    bridge_pin = _pinned_version(REQ / "nodeps.txt", "megatron-bridge")
    assert compile_set(["--no-deps", "requirements/nodeps.txt"], uv_cache)["megatron-bridge"] == bridge_pin
    if importlib.metadata.version("megatron-bridge") != bridge_pin:
        pytest.skip("the installed megatron-bridge is not nodeps.txt's: its declared ranges cannot be read here")
    checked = []
    for line in importlib.metadata.requires("megatron-bridge") or []:
        req = Requirement(line)
        name = req.name.lower()
        if req.marker is None and name in lock:
            assert req.specifier.contains(lock[name], prereleases=True), f"megatron-bridge needs {req}, resolved {lock[name]}"
            checked.append(name)
    assert {"transformers", "megatron-core", "transformer-engine", "torch"} <= set(checked)

    # the torch extension of Transformer Engine exists (as a source distribution) at the same version
    te_torch = compile_set(["--no-deps", "requirements/gpu-trainer-te.txt"], uv_cache)
    assert te_torch["transformer-engine-torch"] == te_pin


@pytest.mark.network
def test_engine_set_resolves_on_the_trainers_torch(uv_cache):
    lock = compile_set(ENGINE, uv_cache)
    assert lock["vllm"] == _pinned_version(REQ / "gpu-engine.txt", "vllm")
    assert lock["torch"] == _pinned_version(REQ / "constraints-gpu.txt", "torch")
    assert Version(lock["transformers"]).major >= 5
    assert "nvidia-nccl-cu13" in lock  # the same CUDA 13 torch build as the trainer's


def _gpu_quick_start() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## GPU quick start\n(.*?)(?=^## )", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## GPU quick start' section"
    return match.group(1)


def test_every_file_the_gpu_quick_start_names_exists():
    section = _gpu_quick_start()
    named = set(re.findall(r"(?<![\w./-])((?:requirements|tools|slurm|docs)/[\w./-]+\.(?:txt|py|sh|sbatch|md))", section))
    named |= {"requirements.txt"} if "requirements.txt" in section else set()
    assert {"requirements/constraints-gpu.txt", "requirements/gpu-trainer.txt", "requirements/gpu-engine.txt",
            "tools/convert_checkpoint.py", "slurm/submit.sh"} <= named
    missing = sorted(p for p in named if not (REPO / p).is_file())
    assert not missing, f"README 'GPU quick start' names files that do not exist: {missing}"


def test_gpu_requirement_files_are_pinned():
    """Every package of the GPU sets is pinned exactly, or is a build tool (lower bound only)."""
    build_tools = {"wheel", "ninja", "cmake"}
    for name in ("constraints-gpu.txt", "gpu-trainer.txt", "gpu-trainer-te.txt", "gpu-engine.txt"):
        for pkg, req in _pins(REQ / name).items():
            if pkg in build_tools:
                continue
            assert str(req.specifier).startswith("=="), f"requirements/{name}: {req} is not pinned with =="
