"""Model definitions: the tiny Qwen2.5-VL policy as a Hugging Face directory (:mod:`fastrl.models.tiny`),
megatron-core policies built through megatron-bridge (:mod:`fastrl.models.provider`) and the layer
choice (:mod:`fastrl.models.layer_spec`)."""
