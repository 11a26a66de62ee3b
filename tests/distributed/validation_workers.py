"""Rank functions of the DP-split validation test (importable by spawned processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class AnswerEngine:
    """A fake engine that answers question ``i`` with ``\\boxed{<answer i>}`` when ``i`` is in
    ``correct``, else ``\\boxed{wrong}``; records which prompts it decoded. ``skew`` makes one rank
    answer differently (as engines on different GPUs may)."""

    def __init__(self, answers: list[str], correct: set[int], skew: bool = False) -> None:
        self.answers, self.correct, self.skew = answers, correct, skew
        self.decoded: list[int] = []
        self.pad_token_id = 0

    def generate(self, prompts, n, sampling, *, weight_version=None):
        from fastrl.rollout.engine import Rollouts

        ids = [int(p.text) for p in prompts]
        self.decoded.extend(ids)
        texts = [f"\\boxed{{{self.answers[i] if (i in self.correct) != self.skew else 'wrong'}}}" for i in ids for _ in range(n)]
        import torch

        rows = len(texts)
        return Rollouts(
            prompts=list(prompts), prompt_inputs=[None] * len(prompts), n_per_prompt=[n] * len(prompts),
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            response_token_ids=[torch.ones(1, dtype=torch.long)] * rows, logprobs=[torch.zeros(1)] * rows,
            finish_reasons=["stop"] * rows, response_texts=texts,
        )

    def wake(self) -> None:
        pass

    def sleep(self) -> None:
        pass


class Scorer:
    def score(self, responses, truths):
        from fastrl.rewards import get_reward

        reward = get_reward("easy_vqa")
        return [reward(r, t) for r, t in zip(responses, truths)]


def validation_worker(questions: int, batch_prompts: int, skew_rank: int | None, tp: int = 1) -> dict[str, Any]:
    from fastrl.config import ParallelConfig, RolloutConfig
    from fastrl.data import Record
    from fastrl.distributed import parallel_state
    from fastrl.rollout.engine import RolloutPrompt, SamplingParams
    from fastrl.training import validation

    ctx = parallel_state.initialize(ParallelConfig(tensor_model_parallel_size=tp), seed=1)
    records = [Record(question_id=i, problem=f"q{i}", answer=f"a{i}") for i in range(questions)]
    correct = {i for i in range(questions) if i % 3 == 0}
    engine = AnswerEngine([r.answer for r in records], correct, skew=ctx.rank == skew_rank)
    stops: list[int] = []

    def should_stop() -> bool:
        stops.append(1)
        return False

    sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=4, seed=0)
    direct = validation.validate(
        engine, [RolloutPrompt(str(i)) for i in range(questions)], records, Scorer(), sampling,
        batch_prompts=batch_prompts, should_stop=should_stop, dp_rank=ctx.dp_rank, dp_size=ctx.dp_size,
    )
    decoded = list(engine.decoded)
    run = SimpleNamespace(
        cfg=SimpleNamespace(rollout=RolloutConfig(), reward=SimpleNamespace(accuracy_threshold=0.5)),
        prompts=SimpleNamespace(prompt_of=lambda r: RolloutPrompt(str(r.question_id))), val=records,
        engine=engine, scorer=Scorer(), actor=SimpleNamespace(policy_version=None), ctx=ctx,
    )
    policy = validation.validate_policy(run)
    return {
        "decoded": decoded, "stop_checks": len(stops), "accuracy": direct["val/accuracy"],
        "policy_accuracy": policy["val/accuracy"], "questions": direct["val/questions"],
    }
