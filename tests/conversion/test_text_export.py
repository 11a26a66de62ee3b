"""``convert_checkpoint.py export`` of a text-recipe trainer checkpoint without ``--hf`` (issue 45,
item 5): the template is the run's own tiny Qwen2 (``model.architecture='qwen2'``), the export is
bit-exact, and a template of another model is one error line, not a raw traceback.

The trainer checkpoint is an imported checkpoint of the recipe's tiny text model, re-labelled as a
trainer checkpoint (``train_state.pt`` with the recipe's config, no import record): the same
``actor/`` format, without a vLLM training run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_VL, check, run_tool

pytestmark = [pytest.mark.distributed]

TEXT_RECIPE = "qwen2_tiny_text_fastrl_grpo_vllm_cpu"


@pytest.fixture(scope="module")
def text_run_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(trainer checkpoint root, the Hugging Face directory its weights came from)``."""
    from fastrl.checkpoint.layout import COMPLETE_MARKER, IMPORT_INFO, TRAIN_STATE, step_dir_name
    from fastrl.models.tiny import build_tiny_text_model_dir
    from recipes.registry import get_recipe

    cfg = get_recipe(TEXT_RECIPE)
    base = tmp_path_factory.mktemp("text_run")
    source = build_tiny_text_model_dir(base / "hf", cfg.model)
    imported = base / "imported"
    check(run_tool("convert_checkpoint", "import", "--hf", source, "--out", imported))
    step = base / "checkpoints" / step_dir_name(3)
    shutil.copytree(imported, step)
    shutil.rmtree(step / "hf")
    (step / IMPORT_INFO).unlink()
    torch.save({"config": cfg.to_dict(), "step": 3}, step / TRAIN_STATE)
    files = {str(p.relative_to(step)): p.stat().st_size for p in sorted(step.rglob("*")) if p.is_file() and p.name != COMPLETE_MARKER}
    (step / COMPLETE_MARKER).write_text(json.dumps({"step": 3, "files": files}))
    return step.parent, source


def test_text_run_exports_without_hf_bit_exact(text_run_checkpoint, tmp_path):
    """catches: the export rebuilding the tiny Qwen2.5-VL for a model.architecture='qwen2' run (it died
    with a raw KeyError: "visual.patch_embed.proj.weight from model not in state dict ...")."""
    from safetensors.torch import load_file

    root, source = text_run_checkpoint
    out = tmp_path / "hf"
    proc = run_tool("convert_checkpoint", "export", "--ckpt", root, "--out", out, "--no-progress")
    check(proc)
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    exported, original = load_file(str(out / "model.safetensors")), load_file(str(source / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_template_of_another_model_is_one_error_line(text_run_checkpoint, tmp_path):
    """catches: torch's CheckpointException (a BaseException, past the tool's one-line handler)
    escaping as a [rank0] traceback when the template describes another model than the checkpoint."""
    from fastrl.models.tiny import build_tiny_hf_model_dir

    root, _ = text_run_checkpoint
    vl = build_tiny_hf_model_dir(tmp_path / "vl", TINY_VL)
    proc = run_tool("convert_checkpoint", "export", "--ckpt", root, "--out", tmp_path / "hf", "--hf", vl, "--no-progress")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("convert_checkpoint: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "(qwen2_5_vl): KeyError" in errors[0] and "pass --hf" in errors[0], errors[0]
    assert not (tmp_path / "hf").exists()
