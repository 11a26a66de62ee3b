"""bench/gpu_memory_timeline.py on the CPU: its model against the memory plan's counts and against a
directory transformers saved, and the CPU smoke run of the same entry (tiny shapes, gloo, fp32) that
the GPU machine runs at Qwen2.5-VL-3B's dimensions."""

import json
import os
import subprocess
import sys

import pytest

from tests.functional.conftest import REPO

#: Every phase of the check, in order: written out here, not imported, so that a phase the script
#: leaves out fails the smoke test.
EXPECTED_PHASES = [
    "start-up", "warm-up step", "generation", "old", "ref", "update", "empty_cache", "refit", "validation",
    "save dp_reshardable", "save fully_reshardable", "level-1 sleep", "level-1 wake",
]


def test_3b_config_has_the_published_dimensions_the_plan_counts(tmp_path):
    """The check's 3B directory, read back as the memory plan reads a model directory, has the
    published Qwen2.5-VL-3B-Instruct dimensions of ``KNOWN_MODELS`` (3.75B parameters), so the plan
    beside the measurement is the plan of the measured model.

    catches: the text config's MLP width written 8 below the dimensions' (tools/mutants.toml
    ``timeline-3b-dims``)."""
    from bench.timeline_model import QWEN25_VL_3B, write_model_dir
    from fastrl.models.model_dims import KNOWN_MODELS, ModelDims

    config = json.loads((write_model_dir(tmp_path / "hf", QWEN25_VL_3B) / "config.json").read_text())
    dims = ModelDims.from_hf_config(config, "Qwen/Qwen2.5-VL-3B-Instruct")
    assert dims == KNOWN_MODELS["Qwen/Qwen2.5-VL-3B-Instruct"]
    assert 3.7e9 < dims.total_params() < 3.8e9
    assert config["model_type"] == "qwen2_5_vl" and config["text_config"]["tie_word_embeddings"] is True
    assert config["text_config"]["rope_scaling"]["mrope_section"] == [16, 24, 24]
    assert config["vision_config"]["fullatt_block_indexes"] == [7, 15, 23, 31]
    assert (config["image_token_id"], config["vision_start_token_id"], config["vision_end_token_id"]) == (151655, 151652, 151653)


@pytest.mark.parametrize("tied", [True, False])
def test_weight_names_are_those_transformers_saves(tmp_path, tied):
    """The names the check gives megatron-bridge's export (its directory holds no weights) are the
    names transformers writes for the same shapes (megatron-bridge exports a weight only when its
    name is among them; tied embeddings: no ``lm_head.weight``).

    catches: ``self_attn.o_proj.weight`` missing from the decoder layer's names (tools/mutants.toml
    ``timeline-weight-names``)."""
    from dataclasses import replace

    from bench.timeline_model import SMOKE, hf_weight_names
    from fastrl.config import ModelConfig
    from fastrl.models.hf_dirs import hf_weight_names as saved_names
    from fastrl.models.tiny import build_tiny_hf_model_dir

    model = ModelConfig(source="tiny", tiny_hidden_size=64, tiny_num_layers=2, tiny_intermediate_size=128,
                        tiny_vision_hidden_size=32, tiny_vision_depth=1)
    saved = saved_names(build_tiny_hf_model_dir(tmp_path / "tiny", model, tie_word_embeddings=tied))
    assert hf_weight_names(replace(SMOKE, dims=replace(SMOKE.dims, tie_word_embeddings=tied))) == saved
    assert ("lm_head.weight" in saved) is not tied


@pytest.mark.long(60)
def test_cpu_smoke_runs_every_phase_and_writes_the_tables(tmp_path):
    """The GPU check's entry with tiny shapes on the CPU: every phase ran, in order, without error;
    the engine stand-in process started, held what vLLM's sleep levels leave (its whole share awake,
    the runtime alone after a level-2 sleep, the weights alone during a refit, the weights in host
    memory after a level-1 sleep), took both refits over the CUDA IPC transport (the recording fake's
    handles, one per bucket) and exited 0; the save's state dict of each optimizer format was built
    with optimizer tensors; the all-gather probe gathered both ways; memory reads "n/a (CPU)" and
    every compared row carries the plan's numbers; the three output files are well-formed.

    catches: a phase left out of the timeline (tools/mutants.toml ``timeline-phase-skipped``: the
    level-1 wake); a level-2 sleep that keeps the stand-in's weights (``timeline-standin-level2-keeps-weights``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "bench/gpu_memory_timeline.py", "--cpu-smoke", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory_timeline.json", "memory_timeline.jsonl", "memory_timeline.md"]
    result = json.loads((tmp_path / "memory_timeline.json").read_text())
    rows = result["rows"]
    assert [r["phase"] for r in rows] == EXPECTED_PHASES
    assert [r["status"] for r in rows] == ["ok"] * len(EXPECTED_PHASES), [r.get("traceback") for r in rows]
    streamed = [json.loads(line)["phase"] for line in (tmp_path / "memory_timeline.jsonl").read_text().splitlines()]
    assert streamed == EXPECTED_PHASES
    by = {r["phase"]: r for r in rows}

    # memory is not measured on the CPU; the plan's numbers are there for every compared phase
    assert all(r[k] is None for r in rows for k in ("peak_allocated_bytes", "reserved_bytes", "device_used_bytes"))
    compared = [r for r in rows if r["plan_phase"]]
    assert len(compared) == 10 and all(0 < r["plan"]["trainer_gib"] < r["plan"]["total_gib"] for r in compared)
    assert by["save fully_reshardable"]["plan"]["trainer_gib"] > by["save dp_reshardable"]["plan"]["trainer_gib"]
    assert by["update"]["plan"]["trainer_gib"] > by["empty_cache"]["plan"]["trainer_gib"]

    # the stand-in's memory as vLLM's sleep levels leave it
    sizes = result["settings"]["engine_bytes"]
    share = sizes["weights"] + sizes["kv_cache"] + sizes["runtime"]
    states = {phase: (by[phase]["engine"]["state"], by[phase]["engine"]["claimed_bytes"]) for phase in by}
    assert states["start-up"] == states["generation"] == states["validation"] == ("awake: weights + KV", share)
    assert states["old"] == states["update"] == states["empty_cache"] == ("asleep (level 2)", sizes["runtime"])
    assert states["refit"] == ("weights only", sizes["runtime"] + sizes["weights"])
    assert states["level-1 sleep"] == ("asleep (level 1: weights in host memory)", sizes["runtime"])
    assert by["level-1 sleep"]["engine"]["host_weights_bytes"] == sizes["weights"]
    assert states["level-1 wake"] == ("awake: weights + KV", share)

    # both refits went through the CUDA IPC transport into the stand-in, bucket by bucket
    refit = by["refit"]["details"]
    assert refit["tensors"] > 10 and refit["fake_ipc_handles"] >= 2
    assert by["refit"]["engine"]["received_tensors"] == 2 * refit["tensors"]
    for fmt in ("dp_reshardable", "fully_reshardable"):
        counted = by[f"save {fmt}"]["details"]
        assert counted["model"]["tensors"] > 0 and counted["optimizer"]["tensors"] > 0, (fmt, counted)
    assert all(p["status"] == "ok" and p["backend"] == "gloo" for p in result["collective_probe"])
    assert [p["shard_bytes"] for p in result["collective_probe"]] == [4096, 65536]
    standin = result["engine_standin"]
    assert standin["exit_code"] == 0
    assert ["sleep", 2] in standin["calls"] and ["wake_up", ["weights"]] in standin["calls"]
    assert ["wake_up", ["kv_cache"]] in standin["calls"] and ["sleep", 1] in standin["calls"]

    md = (tmp_path / "memory_timeline.md").read_text()
    assert md.strip() in proc.stdout
    for phase in EXPECTED_PHASES:
        assert f"| {phase} | ok |" in md
    assert "| old | ok |" in md and "| n/a (CPU) | n/a (CPU) | n/a (CPU) | n/a (CPU): asleep (level 2) |" in md
    assert "| all-gather probe | backend |" in md and "memory plan (" in md
