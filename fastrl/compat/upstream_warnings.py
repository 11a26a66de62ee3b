"""Known-benign warnings of upstream packages, filtered where they are issued.

Written against megatron-core 0.16.1, megatron-bridge 0.3.1, transformers 4.57 and torch 2.13 (the
trainer environment, ``requirements.txt``). A CPU run of a vLLM recipe printed about 30 such lines
before and between its own (``Transformer Engine and Apex are not installed`` once per megatron
module that checks, deprecations inside megatron-core's own calls), burying the trainer's few.
Each entry below is a warning that says nothing the user can act on in a FastRL run, with the
reason; everything else still shows.

Only warnings issued by the named upstream modules are matched (``warnings.filterwarnings``'s
``module``: the module whose code issued the warning; ``logging.Filter`` on the named upstream
logger), so a FastRL warning -- every one is a ``fastrl.*`` logger record -- is never hidden,
whatever its text. :func:`filter_benign_upstream_warnings` installs them (idempotent); the trainer
calls it first at start-up (:func:`fastrl.training.run.run`), before the upstream imports that warn.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class BenignWarning:
    """A ``warnings.warn`` of an upstream module: ``category``, the start of its message (a regex,
    case-insensitive, as ``warnings.filterwarnings`` matches it) and the issuing module (a regex
    matched at the start of the module's name), with why it is benign."""

    category: type[Warning]
    message: str
    module: str
    why: str


@dataclass(frozen=True)
class BenignLogRecord:
    """A record of an upstream logger (its exact name) whose message starts with ``message`` (a regex)."""

    logger: str
    message: str
    why: str


BENIGN_WARNINGS: tuple[BenignWarning, ...] = (
    BenignWarning(
        UserWarning, r"Transformer Engine and Apex are not installed", r"megatron\.core\.",
        "megatron-core's fused-kernel packages are absent on CPU machines (and on GPUs installed without them); "
        "its local fallbacks are the code FastRL then runs; precision.mode=fp8, which needs Transformer Engine, "
        "is refused at start-up without it (fastrl.config.model.check_machine_supports)",
    ),
    BenignWarning(
        UserWarning, r"Apex is not installed\. Falling back to Torch Norm", r"megatron\.core\.",
        "the same: torch's norms are the ones FastRL uses without Transformer Engine",
    ),
    BenignWarning(
        UserWarning, r"The legacy GroupedMLP will be deprecated", r"megatron\.core\.",
        "printed when the layer-spec module is imported; FastRL builds no mixture-of-experts layers",
    ),
    BenignWarning(
        UserWarning, r"full scope is deprecated", r"megatron\.core\.transformer\.transformer_config",
        "megatron-core's own default for cuda_graph_scope; FastRL captures no CUDA graphs",
    ),
    BenignWarning(
        UserWarning, r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed",
        r"megatron\.core\.optimizer\.",
        "megatron-core's optimizer probes every parameter for a gradient with hasattr (optimizer.py); the "
        "non-leaf views it probes never carry one",
    ),
    BenignWarning(
        FutureWarning, r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
        r"torch\.distributed\.",
        "the deprecated collectives are called by megatron-core's distributed optimizer (FastRL calls neither); "
        "they work in torch 2.13",
    ),
    BenignWarning(
        FutureWarning, r"`load_state_dict` is deprecated", r"megatron\.core\.dist_checkpointing\.",
        "printed on every resume: megatron-core 0.16.1's checkpoint loader calls torch's deprecated "
        "torch.distributed.checkpoint.load_state_dict (FastRL does not); it works in torch 2.13",
    ),
    BenignWarning(
        FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor", r"torch\.distributed\.checkpoint\.",
        "printed on every resume: megatron-core's sharded state dicts are torch ShardedTensors, which torch's "
        "checkpoint planner still loads in torch 2.13",
    ),
)

BENIGN_LOG_RECORDS: tuple[BenignLogRecord, ...] = (
    BenignLogRecord(
        "megatron.bridge.utils.fusions", r"gradient_accumulation_fusion requires FusedLayerNorm",
        "megatron-bridge turns the fusion off where the fused kernel is missing, once per model built (twice: "
        "actor and reference); nothing else changes",
    ),
    BenignLogRecord(
        "transformers.configuration_utils", r"`torch_dtype` is deprecated! Use `dtype` instead!",
        "megatron-bridge 0.3.1 passes torch_dtype to transformers itself (its PreTrainedCausalLM), whatever "
        "FastRL asks",
    ),
)


class _DropBenign(logging.Filter):
    """Drops the records of one :class:`BenignLogRecord`."""

    def __init__(self, rule: BenignLogRecord) -> None:
        super().__init__()
        self.rule = rule
        self.pattern = re.compile(rule.message)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def filter_benign_upstream_warnings() -> None:
    """Ignore :data:`BENIGN_WARNINGS` and drop :data:`BENIGN_LOG_RECORDS` in this process (idempotent)."""
    for w in BENIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=w.message, category=w.category, module=w.module)
    for rule in BENIGN_LOG_RECORDS:
        logger = logging.getLogger(rule.logger)
        if not any(isinstance(f, _DropBenign) and f.rule == rule for f in logger.filters):
            logger.addFilter(_DropBenign(rule))
