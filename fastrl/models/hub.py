"""Model directories from ``model.hf_path``: a local Hugging Face directory or a hub id.

A hub id (``Qwen/Qwen2.5-VL-7B-Instruct``) resolves through ``huggingface_hub`` to its snapshot in
the local cache, so the trainer (:func:`fastrl.training.policy_source.prepare_policy_dir`) and
``tools/convert_checkpoint.py import --hf`` take the same names as ``from_pretrained``. The cache
and the network are the hub's own settings, read when a model is resolved:

- ``HF_HUB_CACHE`` (else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``): where snapshots live;
- ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``): never download; the snapshot must be in the
  cache already. Compute nodes of a cluster usually have no internet: download once on a login node
  (``hf download Qwen/Qwen2.5-VL-7B-Instruct``) with the same ``HF_HOME`` on shared storage.

A model that cannot be found is one :class:`ModelNotAvailableError` line naming the id, the cache and
the command that downloads it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastrl.models.errors import ModelNotAvailableError

__all__ = ["ModelNotAvailableError", "download_command", "hub_cache_dir", "hub_offline", "is_hub_id", "resolve_model_dir"]

#: ``org/name`` as the hub spells repository ids (no scheme, no further slashes).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the form of a hub repository id (``org/name``)."""
    return bool(_HUB_ID.fullmatch(text)) and not text.startswith((".", "~"))


def hub_cache_dir() -> Path:
    """The hub cache, from the environment at call time (``HF_HUB_CACHE``, ``HF_HOME/hub``, or
    ``$XDG_CACHE_HOME/huggingface/hub`` with ``~/.cache`` as the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "true", "yes", "on")


def download_command(repo_id: str) -> str:
    """The command that puts ``repo_id`` into the cache (run it where the hub is reachable)."""
    return f"hf download {repo_id} (or: huggingface-cli download {repo_id})"


def resolve_model_dir(path_or_id: str | os.PathLike[str], *, revision: str | None = None,
                      local_files_only: bool | None = None) -> Path:
    """The local Hugging Face directory of ``path_or_id``.

    Args:
        path_or_id: an existing directory (returned as it is), a hub id such as
            ``Qwen/Qwen2.5-VL-7B-Instruct`` (resolved to its cached snapshot, downloaded first
            unless the hub is offline), or ``packaged:<name>``, a model shipped in a PyPI package
            (:mod:`fastrl.models.packaged`; its converted directory in the FastRL cache).
        revision: branch, tag or commit of a hub id (default: ``main``).
        local_files_only: never download (default: :func:`hub_offline`).

    Raises:
        ModelNotAvailableError: not a directory and not a hub id; or a hub id that is not in the
            cache while offline, cannot be downloaded, or whose snapshot has no ``config.json``.
    """
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if text.startswith("packaged:"):  # a model shipped in a PyPI package, converted once (fastrl.models.packaged)
        from fastrl.models.packaged import packaged_model_dir

        return packaged_model_dir(text)
    if not is_hub_id(text):
        raise ModelNotAvailableError(
            f"model directory {text} does not exist; model.hf_path is a local Hugging Face directory or a "
            f"hub id such as Qwen/Qwen2.5-VL-7B-Instruct"
        )
    offline = hub_offline() if local_files_only is None else local_files_only
    cache = hub_cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id=text, revision=revision, cache_dir=str(cache), local_files_only=offline))
    except LocalEntryNotFoundError:
        why = "downloads are off (HF_HUB_OFFLINE=1)" if offline else "the hub could not be reached"
        raise ModelNotAvailableError(
            f"model {text} is not a local directory, nor in the Hugging Face cache {cache}, and {why}; download it "
            f"first where the hub "
            f"is reachable (a login node), with the same HF_HOME: {download_command(text)}"
        ) from None
    except (HfHubHTTPError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelNotAvailableError(f"model {text} could not be downloaded into {cache}: {first}") from None
    if not (folder / "config.json").is_file():
        raise ModelNotAvailableError(
            f"model {text}: the cached snapshot {folder} has no config.json (an incomplete download?); "
            f"complete it with: {download_command(text)}"
        )
    return folder
