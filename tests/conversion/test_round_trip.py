"""Hugging Face -> megatron distributed checkpoint -> Hugging Face, through tools/convert_checkpoint.py
and fastrl.models.conversion: bit-exact weights at every TP/PP layout (also when exported at another
layout than imported, and in bfloat16), megatron logits equal to Hugging Face's (float32), tied
embeddings kept tied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import check, run_tool
from conversion_workers import round_trip_worker
from launcher import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.long(120)]


def read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory (one file or an indexed set of shards)."""
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    assert files, f"no safetensors in {hf_dir}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(f))
        assert not set(part) & set(out), f"a tensor is stored twice ({f})"
        out.update(part)
    return out


def assert_bit_exact(source: Path, exported: Path) -> None:
    a, b = read_weights(source), read_weights(exported)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


def hf_reference_logits(hf_dir: Path) -> torch.Tensor:
    from tools.verify_conversion import hf_logits, load_hf_model, sample_inputs

    return hf_logits(load_hf_model(hf_dir), sample_inputs(hf_dir))


def test_cli_import_export_is_bit_exact_and_keeps_tied_embeddings(tied_hf: Path, imported_tp1: Path, tmp_path: Path):
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration

    from fastrl.models.conversion import tie_word_embeddings
    from fastrl.models.tiny import load_processor

    info = json.loads((imported_tp1 / "fastrl_import.json").read_text())
    assert info["source_hf_dir"] == str(tied_hf.resolve()) and info["dtype"] == "float32"
    assert (imported_tp1 / "actor" / "metadata.json").is_file() and (imported_tp1 / "hf" / "config.json").is_file()
    assert not list((imported_tp1 / "hf").glob("*.safetensors"))

    out = tmp_path / "hf"
    proc = check(run_tool("convert_checkpoint", "export", "--ckpt", imported_tp1, "--out", out, "--max-shard-size", "200KB"))
    assert f"wrote {out}" in proc.stdout
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3 and (out / "model.safetensors.index.json").is_file()
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    for f in shards:  # within the limit, or a single tensor larger than it
        tensors = [n for n, file in weight_map.items() if file == f.name]
        assert f.stat().st_size <= 200_000 + 4096 or len(tensors) == 1, (f.name, f.stat().st_size, tensors)
    assert_bit_exact(tied_hf, out)

    assert "lm_head.weight" not in weight_map and "model.embed_tokens.weight" in weight_map
    config = json.loads((out / "config.json").read_text())
    assert tie_word_embeddings(config) and config["torch_dtype"] == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (tied_hf / name).read_bytes(), name

    for cls in (Qwen2_5_VLForConditionalGeneration, AutoModelForImageTextToText):
        model = cls.from_pretrained(out, torch_dtype=torch.float32)
        head, embed = model.lm_head.weight, model.model.language_model.embed_tokens.weight
        assert head.data_ptr() == embed.data_ptr(), f"{cls.__name__}: lm_head is not tied to the embedding"
    original = Qwen2_5_VLForConditionalGeneration.from_pretrained(tied_hf, torch_dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, original.lm_head.weight)
    processor = load_processor(out)
    assert processor.tokenizer.get_vocab() == load_processor(tied_hf).tokenizer.get_vocab()


def test_verify_tool_accepts_the_imported_checkpoint(tied_hf: Path, imported_tp1: Path):
    proc = check(run_tool("verify_conversion", "--hf", tied_hf, "--ckpt", imported_tp1, "--tol", "1e-5"))
    lines = proc.stdout.splitlines()
    logits_row = next(line for line in lines if line.startswith("logits "))
    assert float(logits_row.split()[1]) <= 1e-5
    assert any(line.startswith("model.embed_tokens.weight ") and "0.000e+00" in line for line in lines)
    assert "OK" in lines[-1]


LAYOUTS = [  # model, (import TP, PP) -> (export TP, PP); the same two or four processes do both
    # tied embeddings at PP > 1: the last stage holds a copy of the embedding as its output layer
    pytest.param("tied_hf", (1, 2), (1, 1), id="tied-pp2-to-tp1"),
    # bfloat16 checkpoint (import and export in bf16; the logits from a float32 actor loaded from it)
    pytest.param("tied_bf16_hf", (2, 1), (1, 1), id="tied-bf16-tp2-to-tp1"),
    pytest.param("untied_hf", (1, 2), (2, 1), id="untied-pp2-to-tp2"),
    pytest.param("untied_hf", (2, 2), (2, 2), id="untied-tp2xpp2"),
]


@pytest.mark.parametrize("model, import_layout, export_layout", LAYOUTS)
def test_round_trip_at_layout(request: pytest.FixtureRequest, tmp_path: Path, model, import_layout, export_layout):
    hf_dir = request.getfixturevalue(model)
    world = import_layout[0] * import_layout[1]
    results = run_distributed(round_trip_worker, world, hf_dir, tmp_path, import_layout, export_layout, timeout_s=240)
    info = json.loads((tmp_path / "imported" / "fastrl_import.json").read_text())
    assert (info["tensor_model_parallel_size"], info["pipeline_model_parallel_size"]) == import_layout
    assert info["dtype"] == ("bfloat16" if "bf16" in model else "float32")
    assert_bit_exact(hf_dir, tmp_path / "exported")
    names = json.loads((tmp_path / "exported" / "fastrl_export.json").read_text())
    assert names["tensors"] == len(read_weights(hf_dir))
    has_head = "lm_head.weight" in read_weights(tmp_path / "exported")
    assert has_head == model.startswith("untied")

    reference = hf_reference_logits(hf_dir)
    for r in results:  # every rank holds the full logits; all agree with Hugging Face
        logits = r["logits"][..., : reference.shape[-1]]
        assert logits.shape == reference.shape
        assert (logits - reference).abs().max() <= 1e-5, f"rank {r['rank']}"
    assert reference.abs().max() > 1e-3  # not a degenerate all-zero output
