"""Prompt text from Jinja templates, and filtering of prompts that are too long.

The built-in templates ship with this package, in ``fastrl/data/templates/<name>.jinja``
(:data:`TEMPLATE_DIR`); a recipe names one (``data.template``) or gives the path of its own
``.jinja`` file. A template sees
``problem`` (the record's question text), ``num_images`` and ``metadata``; it never sees the
answer (rendering a template that uses an unknown variable raises). The built-in templates ask for
``<thinking>...</thinking>`` reasoning followed by a ``\\boxed{}`` answer, as in the reference
experiments.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import jinja2
import jinja2.meta

from fastrl.data.record import LoadReport, Record

logger = logging.getLogger(__name__)


#: The built-in prompt templates (package data of ``fastrl``).
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


def list_templates() -> list[str]:
    """Names of the built-in templates (in :data:`TEMPLATE_DIR`)."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja"))


def resolve_template(name_or_path: str | Path) -> Path:
    """A template name (``"geometry_thinking"``) or a path to a ``.jinja`` file -> its path.

    Raises:
        FileNotFoundError: neither a file nor a known template name (listing the known names).
    """
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jinja" or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"prompt template file {path} does not exist")
        return path
    candidate = TEMPLATE_DIR / f"{name_or_path}.jinja"
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(
        f"unknown prompt template {str(name_or_path)!r}; known: {list_templates()} (in {TEMPLATE_DIR}), "
        "or give a path to a .jinja file"
    )


@functools.lru_cache(maxsize=32)
def _compile(path: str, mtime_ns: int) -> jinja2.Template:
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    return environment.from_string(Path(path).read_text(encoding="utf-8"))


def load_template(name_or_path: str | Path) -> jinja2.Template:
    """The compiled template (cached; reloaded when the file changes)."""
    path = resolve_template(name_or_path)
    return _compile(str(path.resolve()), path.stat().st_mtime_ns)


def render_prompt(template: str | Path, record: Record) -> str:
    """The prompt text of ``record`` (surrounding whitespace stripped).

    Raises:
        FileNotFoundError: see :func:`resolve_template`.
        jinja2.UndefinedError: the template uses a variable other than ``problem``,
            ``num_images`` and ``metadata`` (for example ``answer``).
    """
    return prompt_renderer(template)(record)


def prompt_renderer(template: str | Path) -> Callable[[Record], str]:
    """:func:`render_prompt` with the template looked up once (for rendering many records).

    Raises:
        FileNotFoundError: see :func:`resolve_template`.
    """
    compiled = load_template(template)
    source = resolve_template(template).read_text(encoding="utf-8")
    uses_metadata = "metadata" in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source))
    cache: dict[tuple[str, int], str] = {}

    def render(record: Record) -> str:
        if uses_metadata:
            return compiled.render(problem=record.problem, num_images=len(record.images), metadata=record.metadata).strip()
        key = (record.problem, len(record.images))  # datasets repeat question texts (easy-vqa)
        if key not in cache:
            cache[key] = compiled.render(problem=record.problem, num_images=key[1], metadata=record.metadata).strip()
        return cache[key]

    return render


#: Dropped rows :func:`filter_records_by_length` names in its warning (the rest are counted).
NAMED_DROPS = 5


def filter_long_prompts(
    records: Sequence[Record],
    template: str | Path,
    length_fn: Callable[[str], int],
    max_length: int,
    *,
    report: LoadReport | None = None,
) -> list[Record]:
    """Records whose rendered prompt has ``length_fn(prompt) <= max_length``.

    ``length_fn`` is typically the tokenizer's token count of the chat-formatted prompt; image
    tokens count only if ``length_fn`` adds them. The number filtered is logged and, when given,
    added to ``report.prompts_filtered_too_long`` (metric ``data/prompts_filtered_too_long``).
    """
    render = prompt_renderer(template)
    return filter_records_by_length(
        records, lambda r: length_fn(render(r)), max_length, report=report,
        what=f"template {template}",
    )


def filter_records_by_length(
    records: Sequence[Record],
    length_of: Callable[[Record], int],
    max_length: int,
    *,
    report: LoadReport | None = None,
    what: str = "",
) -> list[Record]:
    """Records with ``length_of(record) <= max_length`` (the prompt's tokens, image tokens included,
    as the trainer computes them: :func:`fastrl.training.prompting.prompt_length`).

    The number filtered is logged (with ``what``, e.g. the split) with the first
    :data:`NAMED_DROPS` dropped rows, each by file and row (``report.origins``; else by question
    id) and its token count, and, when ``report`` is given, added to
    ``report.prompts_filtered_too_long`` (metric ``data/prompts_filtered_too_long``) with
    ``report.rows_kept`` updated.

    Raises:
        ValueError: ``max_length < 1``.
    """
    if max_length < 1:
        raise ValueError(f"max_length ({max_length}) must be >= 1")
    kept, dropped = [], []
    for r in records:
        n = length_of(r)
        if n <= max_length:
            kept.append(r)
        else:
            dropped.append((r, n))
    filtered = len(dropped)
    if report is not None:
        report.prompts_filtered_too_long += filtered
        report.rows_kept = len(kept)
    if filtered:
        where = report.where if report is not None else (lambda qid: f"question id {qid}")
        named = "; ".join(f"{where(r.question_id)}: {n} tokens" for r, n in dropped[:NAMED_DROPS])
        more = f"; and {filtered - NAMED_DROPS} more" if filtered > NAMED_DROPS else ""
        logger.warning(
            "filtered %d of %d prompt(s) longer than %d tokens%s: %s%s", filtered, len(records), max_length,
            f" ({what})" if what else "", named, more,
        )
    return kept
