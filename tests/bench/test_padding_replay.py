"""bench/padding_replay.py: a run's trained rows replayed through a recipe's token-budget cut."""

from __future__ import annotations

import json

import pytest

from bench import padding_replay as R


def _tokenizer(text, add_special_tokens=False):
    return {"input_ids": text.split()}


def _write_run(tmp_path, rows):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "dp0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_replay_counts_the_padding_of_both_cuts_over_the_trained_rows(tmp_path):
    """One step whose trained rows are 300, 200, 90, 90 and 90 tokens (10 of prompt each), one
    pruned row and one superseded by a resume: under a 600-token budget the greedy fill cuts [300, 200, 90] [90, 90] (1,080
    computed tokens), the trainer's cut [300, 200] [90, 90, 90] (870), both for 770 real tokens;
    neither of the other two is counted.

    catches: pruned rows replayed as trained (tools/mutants.toml ``padding-replay-pruned-rows``),
    the prompt's tokens left out of a row's length (``padding-replay-no-prompt``), and a resumed
    run's superseded rows counted (``padding-replay-superseded``)."""
    from fastrl.training.geometry import step_geometry
    from recipes.registry import get_recipe

    prompt = " ".join(["w"] * 10)
    rows = [{"step": 1, "prompt": prompt, "response_token_ids": [0] * (n - 10), "kept": True} for n in (300, 200, 90, 90, 90)]
    rows.append({"step": 1, "prompt": prompt, "response_token_ids": [0] * 500, "kept": False})
    run = _write_run(tmp_path, rows)
    (run / "rollouts" / "dp0.superseded.jsonl").write_text(json.dumps(rows[0]) + "\n")  # a resume's earlier rows
    steps = R.step_lengths(run, _tokenizer)
    assert steps == {1: [300, 200, 90, 90, 90]}
    cfg = get_recipe("smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu")
    assert cfg.trainer.micro_batch_tokens == 600
    totals = R.replay(steps, step_geometry(cfg, 1, 8))
    for pass_name in ("update", "log_prob"):
        assert totals[f"{pass_name}/greedy"] == {"real": 770, "computed": 1080, "micro_batches": 2}
        assert totals[f"{pass_name}/fewest_padded"] == {"real": 770, "computed": 870, "micro_batches": 2}


def test_replay_refuses_rows_without_their_fields_naming_file_and_line(tmp_path):
    run = _write_run(tmp_path, [{"step": 1, "prompt": "p", "response_token_ids": [1]}, {"step": 1, "prompt": "p"}])
    with pytest.raises(ValueError, match=r"dp0.jsonl:2: the row has no 'response_token_ids'"):
        R.step_lengths(run, _tokenizer)
    with pytest.raises(FileNotFoundError, match="has no dp"):
        R.step_lengths(tmp_path / "missing", _tokenizer)


def test_greedy_fill_is_the_fill_of_the_earlier_trainer():
    from fastrl.training.geometry import greedy_fill

    assert greedy_fill([300, 200, 90, 90, 90], 600, 8) == [3, 2]
    assert greedy_fill([5, 5, 5], 100, 2) == [2, 1]
    assert greedy_fill([], 10, 2) == []
