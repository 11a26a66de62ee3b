"""fastrl.compat.megatron_bridge: megatron-bridge imports without Transformer Engine / triton, its TP
scatter is contiguous, and the Qwen2.5-VL provider gets the config's mrope_section.

Each patch has a test that shows the unpatched upstream behaviour (so an upgrade that fixes it fails
here and asks for the patch's removal) and one that the patched behaviour works.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fastrl import compat
from fastrl.compat import megatron_bridge

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

# In a fresh interpreter: import megatron.bridge as it is, then with the Transformer Engine
# stand-ins alone; report the module each attempt misses.
_UNPATCHED_IMPORTS = """
import importlib, json, sys, warnings
warnings.filterwarnings("ignore")
from fastrl.compat import megatron_bridge as mb

def attempt():
    try:
        import megatron.bridge  # noqa: F401
        return None
    except ModuleNotFoundError as err:
        return err.name

plain = attempt()
for name in mb._TE_SENSITIVE:
    importlib.import_module(name)
sys.modules.update(mb._te_standins())
print(json.dumps({"plain": plain, "te_standin_only": attempt()}))
"""


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _run(*args: str, timeout: float = 240) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_written_for_megatron_bridge_0_3():
    version = importlib.metadata.version("megatron-bridge")
    assert version.startswith("0.3."), f"megatron-bridge {version}: re-check every patch of fastrl/compat/megatron_bridge.py"


@pytest.mark.skipif(_installed("transformer_engine") and _installed("triton"), reason="nothing is stood in")
def test_unpatched_import_needs_transformer_engine_then_triton():
    missing = json.loads(_run("-c", _UNPATCHED_IMPORTS))
    if not _installed("transformer_engine"):
        assert missing["plain"] == "transformer_engine"
    if not _installed("triton"):
        assert missing["te_standin_only"] == "triton"


def test_import_leaves_no_stand_in_and_megatron_sees_no_transformer_engine():
    auto_bridge = compat.import_auto_bridge()
    assert auto_bridge.__name__ == "AutoBridge"
    assert not any(name == "transformer_engine" or name.startswith("transformer_engine.") for name in sys.modules)
    assert not any(vars(m).get("__fastrl_standin__") for m in list(sys.modules.values()) if m is not None)
    if _installed("transformer_engine"):
        return
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer import attention

    assert gpt_layer_specs.HAVE_TE is False and attention.HAVE_TE is False


def test_bridge_splits_row_parallel_weights_into_non_contiguous_views():
    compat.import_auto_bridge()
    from megatron.bridge.models.conversion.param_mapping import RowParallelMapping

    scattered = []

    class TwoRanks(RowParallelMapping):  # rank 0 of TP=2, scatter recorded instead of sent
        tp_size, tp_rank = 2, 0

        def scatter_to_tp_ranks(self, splits, *args, **kwargs):
            scattered.extend(splits)
            return splits[0]

    module = torch.nn.Linear(3, 4, bias=False)  # the rank's shard: [4, 3] of a [4, 6] weight
    TwoRanks("weight", "w.weight").hf_to_megatron(torch.arange(24.0).reshape(4, 6), module)
    assert len(scattered) == 2 and not any(s.is_contiguous() for s in scattered)


@pytest.mark.distributed
def test_gloo_scrambles_a_non_contiguous_scatter_and_not_a_contiguous_one():
    received = json.loads(_run(str(HERE / "_gloo_scatter.py"), timeout=180))
    assert received == {"views": [False, False], "contiguous": [True, True]}


def test_row_parallel_shards_are_made_contiguous_before_the_scatter():
    compat.import_auto_bridge()
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    full = torch.arange(24.0).reshape(4, 6)
    shard = torch.chunk(full, 2, dim=1)[0]  # a row-parallel split: a non-contiguous view
    assert not shard.is_contiguous()
    single_rank = types.SimpleNamespace(tp_size=1)  # the TP=1 path returns the split itself
    upstream = MegatronParamMapping.scatter_to_tp_ranks.__wrapped__
    assert not upstream(single_rank, [shard], shard.shape, torch.float32, torch.device("cpu")).is_contiguous()
    out = MegatronParamMapping.scatter_to_tp_ranks(single_rank, [shard], shard.shape, torch.float32, torch.device("cpu"))
    assert out.is_contiguous()
    assert torch.equal(out, shard)


def _qwen25vl_config(mrope_section=(2, 3, 3)):
    from transformers import Qwen2_5_VLConfig

    rope = {"type": "mrope", "mrope_section": list(mrope_section)} if mrope_section else None
    text = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rope_scaling=rope,
    )  # fmt: skip
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=1, out_hidden_size=64)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision)


def test_qwen25vl_provider_gets_the_configs_mrope_section():
    compat.import_auto_bridge()
    from megatron.bridge.models.qwen_vl.qwen25_vl_bridge import Qwen25VLBridge

    config = _qwen25vl_config((2, 3, 3))  # head_dim 16: the rotary half-dimension 8 splits 2 + 3 + 3
    provider = Qwen25VLBridge().provider_bridge(types.SimpleNamespace(config=config))
    assert provider.mrope_section == [16, 24, 24]  # upstream: the default, whatever the config says
    compat.set_mrope_section(provider, config)
    assert provider.mrope_section == [2, 3, 3]


def test_mrope_section_missing_from_the_config_is_an_error():
    provider = types.SimpleNamespace(mrope_section=[16, 24, 24])
    config = types.SimpleNamespace(text_config=types.SimpleNamespace(rope_scaling={"type": "default"}))
    with pytest.raises(ValueError, match="mrope_section"):
        megatron_bridge.set_mrope_section(provider, config)


# Transformer Engine 2.11 with its core but without its torch extension: the package's __init__
# (as TE's own) tolerates the missing extension with a warning; its pytorch subpackage raises what
# TE's load_framework_extension raises when the shared object is missing.
_TE_WITHOUT_EXTENSION = {
    "transformer_engine/__init__.py": (
        "import warnings\n"
        "try:\n"
        "    from . import pytorch\n"
        "except FileNotFoundError:\n"
        "    warnings.warn('could not find the shared object file for the Transformer Engine PyTorch extension', RuntimeWarning)\n"),
    "transformer_engine/pytorch/__init__.py": (
        "raise FileNotFoundError('Could not find shared object file for Transformer Engine torch lib.')\n"),
}

_RUN_WITHOUT_EXTENSION = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from fastrl.config import ConfigError, ParallelConfig, PrecisionConfig, transformer_engine_available
from fastrl.distributed import parallel_state
from fastrl.models.layer_spec import choose_layers

context = parallel_state.initialize(ParallelConfig(), seed=0)   # megatron-core's first import
refusals = {}
for name, kwargs in (("fp8", {"precision": PrecisionConfig(mode="fp8")}),
                     ("sp", {"precision": PrecisionConfig(mode="bf16"), "sequence_parallel": True})):
    try:
        choose_layers(**kwargs)
    except ConfigError as err:
        refusals[name] = str(err)
print(json.dumps({"bf16": choose_layers(PrecisionConfig(mode="bf16")).impl, "refusals": refusals,
                  "te_available": transformer_engine_available(), "te_module": repr(sys.modules.get("transformer_engine"))}))
"""


def test_transformer_engine_without_its_torch_extension_runs_bf16_on_local_layers(tmp_path):
    """Transformer Engine's core installed, its torch extension not built (a fake ``transformer_engine``
    package whose ``pytorch`` raises ``FileNotFoundError`` on import, as TE 2.11 does): the run's
    first megatron-core import and the bridge import go through, bf16 takes the local layers, FP8
    and sequence parallelism are refused naming the missing extension, and one warning line says so.

    catches: ``hide_unusable_transformer_engine`` not called before megatron-core's first import
    (main before the fix: ``FileNotFoundError: Could not find shared object file for Transformer
    Engine torch lib.`` from ``import megatron.core``, which megatron-core's ``except ImportError``
    does not catch), or ``import_auto_bridge`` restoring no block after its stand-ins (the next
    megatron import raises it again)."""
    for rel, text in _TE_WITHOUT_EXTENSION.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _RUN_WITHOUT_EXTENSION], env=env, capture_output=True, text=True,
                          timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bf16"] == "local" and out["te_available"] is False and out["te_module"] == "None"
    for name in ("fp8", "sp"):
        assert "its PyTorch layers do not import (FileNotFoundError: Could not find shared object file" in out["refusals"][name]
        assert "requirements/gpu-trainer-te.txt" in out["refusals"][name]
    lines = [ln for ln in proc.stderr.splitlines() if "Transformer Engine is installed but its PyTorch layers do not import" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]


def test_nothing_is_hidden_where_transformer_engine_is_not_installed():
    """Without Transformer Engine (these machines) the probe hides nothing and says nothing.

    catches: a probe that blocks ``transformer_engine`` in ``sys.modules`` where it is merely
    absent (the later stand-in import of megatron-bridge would then find its block in place)."""
    assert not megatron_bridge._have("transformer_engine")
    assert megatron_bridge.hide_unusable_transformer_engine() is None
    assert megatron_bridge.transformer_engine_unusable_reason() is None
    assert "transformer_engine" not in sys.modules
