"""How the engine process configures vLLM and its sampling requests: loaded by path by
``engine_server.py`` (standard library only, as the engine environment has no fastrl).

Written against vLLM 0.32.0; ``tests/unit/rollout/test_vllm_engine_helpers.py`` and
``tests/vllm/test_sampling_requests.py`` test each function.
"""

from __future__ import annotations

#: vLLM 0.32's default token budget of one scheduler step for ``LLM`` on CPU
#: (``EngineArgs.get_batch_defaults``: 4096 per tensor-parallel worker).
VLLM_CPU_STEP_TOKENS = 4096


def whole_prefills(kwargs: dict) -> dict:
    """``llm_kwargs`` for vLLM on CPU with every prompt prefilled in one scheduler step.

    vLLM 0.32 splits a prefill over steps when the step's token budget runs out (chunked prefill);
    the partial steps' sampled tokens are discarded, and for a seeded request the model runner
    rewinds its generator with ``Generator.get_offset()``, which a CPU generator does not have:
    ``RuntimeError: CPU Generator does not use offset`` (``vllm/v1/worker/gpu_model_runner.py``).
    Every sampled request of this engine is seeded (:meth:`EngineProcessClient.generate`), so any
    step whose prompts exceed the budget (8 prompts x n=8 x 82 tokens > 4096) would fail. With
    chunked prefill off a request waits for a step with room for its whole prompt; the budget is
    raised to ``max_model_len`` where that is larger, as vLLM requires.

    Raises:
        ValueError: ``enable_chunked_prefill=True`` was asked for.
    """
    if kwargs.get("enable_chunked_prefill"):
        raise ValueError("enable_chunked_prefill=True: vLLM on CPU cannot chunk the prefill of a seeded request "
                         "(RuntimeError: CPU Generator does not use offset); leave it out")
    workers = int(kwargs.get("tensor_parallel_size") or 1)
    budget = int(kwargs.get("max_num_batched_tokens") or VLLM_CPU_STEP_TOKENS * workers)
    return {**kwargs, "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(budget, int(kwargs.get("max_model_len") or 0))}


def suppression_bias(suppressed_ids: list[int]) -> dict[int, float] | None:
    """The ``logit_bias`` of every sampling request: -inf on each suppressed token id, None when
    there is none.

    This takes the tokens out of sampling exactly as ``allowed_token_ids`` on their complement would
    (both runners fill -inf before the temperature, so ``processed_logprobs`` are the same softmax
    over the samplable tokens), but in what both of vLLM 0.32's model runners accept: its GPU
    runner (V2) refuses more than 1,024 ``allowed_token_ids`` per request
    (``vllm/v1/worker/gpu/sample/logit_bias.py``: ``ValueError: Too many allowed token IDs``),
    where a Qwen vocabulary would need ~151,600, and takes up to 1,024 ``logit_bias`` entries, which
    the client checks (``engine_process.check_suppression_size``). ``bad_words`` cannot say it: they are
    strings, tokenized by vLLM, and the padded vocabulary's ids are no token. ``SamplingParams``
    keeps the value as given (only ``from_optional``, the OpenAI server's path, clamps to +-100).
    """
    return {int(i): float("-inf") for i in suppressed_ids} or None
