"""The word-level tokenizer of the tiny Qwen2.5-VL policy (:mod:`fastrl.models.tiny`).

The tokenizer is word level (``tokenizers`` ``WordLevel`` model) over a fixed vocabulary built from
the easy-vqa questions and answers, the chat-template words and the response markup
(``<thinking>``, ``</thinking>``, ``\\boxed{``, ``}``), plus any extra texts the caller passes.
Pre-tokenization splits on whitespace, then isolates markup tags (``<thinking>``), LaTeX commands
with their opening brace (``\\boxed{``), words, and single punctuation characters, so that
``\\boxed{red}`` becomes ``\\boxed{`` ``red`` ``}``. Decoding joins tokens with single spaces and
removes the space before ``? . , ! : }`` and after ``{``, so canonically spaced text (single spaces,
no space before punctuation or inside braces) round-trips exactly.

Token ids follow Qwen's layout conventions where they matter: the model's vocabulary
(``config.vocab_size``) is padded to a multiple of 64 (tensor-parallel splits of the embedding and
output layer), so it is larger than the tokenizer; ids at and above ``len(tokenizer)`` never decode
to text and the rollout engines never sample them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
UNK = "<|unk|>"

#: Special tokens, in id order (ids 0..8). ``<|endoftext|>`` is bos, pad and eos of the tokenizer
#: (as in Qwen2.5 base models); chat turns end with ``<|im_end|>``.
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD, UNK,
)

#: Default system prompt of the Qwen2.5-VL chat template.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

#: The model's vocabulary size is padded to a multiple of this.
VOCAB_MULTIPLE = 64

#: Pre-tokenizer pattern applied to each whitespace-separated chunk (pieces are isolated).
PRETOKENIZE_PATTERN = r"</?[A-Za-z_]+>|\\[A-Za-z]+\{|\w+|[^\w\s]"

# Decoding: tokens are joined with single spaces, then these spaces are removed.
_DECODE_FIXES: tuple[tuple[str, str], ...] = (
    (" ?", "?"), (" .", "."), (" ,", ","), (" !", "!"), (" :", ":"), (" ;", ";"),
    ("{ ", "{"), (" }", "}"), ("( ", "("), (" )", ")"),
)

# Qwen2.5-VL's chat template (system prompt added when the first message is not a system turn).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def base_vocabulary_texts() -> list[str]:
    """The fixed texts whose words form the base vocabulary of the tiny tokenizer.

    Covers: every easy-vqa question (train and test split) and answer; the chat-template words
    (roles, the default system prompt, ``Picture``/``Video`` labels); the response markup
    ``<thinking> ... </thinking> \\boxed{ANSWER}``; the words of short reasoning sentences about the
    image ("the shape is red", "the image shows a red circle", "so the answer is yes"); and common
    instruction words of a prompt template ("Answer the question. Think step by step first, then
    put the final answer in \\boxed{}.") and the instruction of ``easy_vqa_thinking.jinja``.

    Returns:
        A list of texts; the order is fixed so the vocabulary (and token ids) is reproducible.
    """
    from easy_vqa import get_answers, get_test_questions, get_train_questions

    texts: list[str] = []
    for questions, answers, _ in (get_train_questions(), get_test_questions()):
        texts.extend(questions)
        texts.extend(answers)
    texts.extend(get_answers())
    texts.extend(
        [
            "system user assistant",
            DEFAULT_SYSTEM_PROMPT,
            "Picture 1: Video 1:",
            "<thinking> the shape is red </thinking> \\boxed{red}",
            "the image shows a red circle , so the answer is yes .",
            "there is no blue shape in the image , it is not present ; the color of the shape is green",
            "Answer the question about the image . Think step by step first , then put the final "
            "answer in \\boxed{} : reason inside <thinking> and </thinking> with your reasoning",
            "( ) { } ? ! .",
            # fastrl/data/templates/easy_vqa_thinking.jinja
            "First think briefly inside <thinking> </thinking> tags, then give a one-word answer in \\boxed{}.",
        ]
    )
    return texts


def pre_tokenize_words(text: str) -> list[str]:
    """Split ``text`` into the pieces that the tiny tokenizer maps to ids (special tokens excluded).

    Example: ``"<thinking> the shape is red </thinking> \\boxed{red}"`` ->
    ``["<thinking>", "the", "shape", "is", "red", "</thinking>", "\\boxed{", "red", "}"]``.
    """
    specials = "|".join(re.escape(t) for t in SPECIAL_TOKENS)
    pieces: list[str] = []
    for chunk in re.split(specials, text):
        for word in chunk.split():
            pieces.extend(re.findall(PRETOKENIZE_PATTERN, word))
    return pieces


def build_vocabulary(extra_texts: Iterable[str] = ()) -> list[str]:
    """Ordered vocabulary: special tokens, then the base words (sorted), then new extra words (sorted).

    New words from ``extra_texts`` are appended after the base words, so base token ids do not move
    when extra texts are added.
    """
    base = list(_base_words())
    seen = set(base)
    extra = sorted(set(w for t in extra_texts for w in pre_tokenize_words(t)) - seen)
    return list(SPECIAL_TOKENS) + base + extra


@functools.cache
def _base_words() -> tuple[str, ...]:
    return tuple(sorted(set(w for t in base_vocabulary_texts() for w in pre_tokenize_words(t))))


def build_tiny_tokenizer(extra_texts: Iterable[str] = ()):
    """The word-level tokenizer of the tiny model, as a ``transformers`` fast tokenizer.

    Args:
        extra_texts: texts whose words must also be in the vocabulary (e.g. rendered prompt
            templates, dataset questions beyond easy-vqa).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with bos = pad = eos = ``<|endoftext|>``,
        unk = ``<|unk|>``, the Qwen2.5-VL special tokens and the Qwen2.5-VL chat template.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = build_vocabulary(extra_texts)
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated")]
    )
    # WordPiece with a prefix that never occurs = "join with single spaces"; Fuse makes one string
    # on which the Replace steps remove the spaces that canonical text does not have.
    core.decoder = decoders.Sequence(
        [decoders.WordPiece(prefix="\u0000##", cleanup=False), decoders.Fuse()]
        + [decoders.Replace(a, b) for a, b in _DECODE_FIXES]
    )
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def padded_vocab_size(num_tokens: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``num_tokens`` rounded up to a multiple of ``multiple``."""
    return -(-num_tokens // multiple) * multiple
