"""Model definitions and converters: the tiny Qwen2.5-VL policy (:mod:`fastrl.models.tiny`)."""
