"""Known-benign upstream warnings are filtered where they are issued, FastRL's never (issue 45, item 8d)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

from fastrl.compat.upstream_warnings import BENIGN_LOG_RECORDS, BENIGN_WARNINGS, filter_benign_upstream_warnings

REPO = Path(__file__).resolve().parents[3]

#: The upstream lines of a CPU run of a vLLM recipe (qwen2_tiny_text_fastrl_grpo_vllm_cpu, the SmolLM2
#: recipe), verbatim: (category, message, issuing module).
SEEN = [
    (UserWarning, "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.", "megatron.core.optimizer"),
    (UserWarning, "Apex is not installed. Falling back to Torch Norm", "megatron.core.models.gpt.gpt_layer_specs"),
    (UserWarning, "The legacy GroupedMLP will be deprecated in Megatron-Core v0.12.0. Please update the TransformerEngine "
                  "to version>=1.7.0 and use TEGroupedMLP.", "megatron.core.extensions.transformer_engine_spec_provider"),
    (UserWarning, "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.",
     "megatron.core.transformer.transformer_config"),
    (UserWarning, "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't "
                  "be populated during autograd.backward().", "megatron.core.optimizer.optimizer"),
    (FutureWarning, "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
                    "`torch.distributed.reduce_scatter_single` instead.", "torch.distributed.c10d_logger"),
    (FutureWarning, "`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
                    "`torch.distributed.all_gather_single` instead.", "torch.distributed.c10d_logger"),
    # a resume of the default CPU recipe
    (FutureWarning, "`load_state_dict` is deprecated and will be removed in future versions. Please use `load` instead.",
     "megatron.core.dist_checkpointing.strategies.torch"),
    (FutureWarning, "Please use DTensor instead and we are deprecating ShardedTensor.",
     "torch.distributed.checkpoint.planner_helpers"),
    (FutureWarning, "Please use DTensor instead and we are deprecating ShardedTensor.",
     "torch.distributed.checkpoint.default_planner"),
]


def _issued(category, message, module) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_benign_upstream_warnings()  # inserted ahead of "always", as at start-up ahead of the defaults
        warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
    return [str(w.message) for w in caught]


def test_each_seen_upstream_warning_is_filtered_and_the_same_text_from_fastrl_is_not():
    """catches: a filter list that misses a line the runs print (a regex that does not match the
    upstream text or its issuing module), or one that matches by text alone and would hide a
    FastRL warning with the same words."""
    for category, message, module in SEEN:
        assert _issued(category, message, module) == [], message
        assert _issued(category, message, "fastrl.training.trainer") == [message]
    assert _issued(UserWarning, "Transformer Engine is required for fp8", "megatron.core.fp8_utils") != []  # others show


def test_benign_upstream_log_records_are_dropped_and_fastrl_records_kept(caplog):
    """catches: the fusion notice and transformers' torch_dtype deprecation still printed once per model
    built, or a filter put on a shared (root or fastrl) logger that drops FastRL's records."""
    filter_benign_upstream_warnings()
    filter_benign_upstream_warnings()  # idempotent: one filter per logger
    with caplog.at_level(logging.INFO):
        for rule in BENIGN_LOG_RECORDS:
            upstream = logging.getLogger(rule.logger)
            assert sum(type(f).__name__ == "_DropBenign" for f in upstream.filters) == 1
            text = rule.message.replace("\\", "").replace("`", "`") + " (as logged)"
            upstream.warning(text)
            logging.getLogger("fastrl.trainer").warning(text)
    fastrl_lines = [r for r in caplog.records if r.name == "fastrl.trainer"]
    assert len(fastrl_lines) == len(BENIGN_LOG_RECORDS)
    assert not [r for r in caplog.records if r.name in {rule.logger for rule in BENIGN_LOG_RECORDS}]
    assert len(BENIGN_WARNINGS) + len(BENIGN_LOG_RECORDS) <= 10  # a short list, each entry with its reason


#: megatron-core modules the trainer imports that warn when imported on a machine without
#: Transformer Engine / Apex (seven lines, megatron_fsdp's among them)
WARNING_IMPORTS = ("import megatron.core.optimizer, megatron.core.models.gpt.gpt_layer_specs, "
                   "megatron.core.models.vision.vit_layer_specs, megatron.core.distributed")


def _import_stderr(filtered: bool) -> str:
    code = ("from fastrl.compat.upstream_warnings import filter_benign_upstream_warnings as f; f(); " if filtered else "")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-c", code + WARNING_IMPORTS], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_the_real_megatron_imports_print_no_listed_warning():
    """catches: a regex that does not match what megatron-core really issues at import (its texts,
    its module names such as megatron_fsdp's under megatron/core/distributed/fsdp/src), checked
    against the installed packages."""
    assert _import_stderr(filtered=False).count("Warning: ") >= 5  # the premise: they print without the filter
    assert "Warning" not in _import_stderr(filtered=True)
