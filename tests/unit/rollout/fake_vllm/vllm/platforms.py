"""``vllm.platforms.current_platform`` of the stand-in (the engine server asks whether it is the CPU)."""

import types

current_platform = types.SimpleNamespace(is_cpu=lambda: True)
