"""FastRL: fast group-relative RL for vision-language models (MDAP pruning + adaptive rollout sampling)."""

__version__ = "0.1.0"
