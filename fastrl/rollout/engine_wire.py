"""The wire protocol between the trainer's engine client and the engine process (standard library only).

Imported by both sides: :mod:`fastrl.rollout.engine_process` and :mod:`fastrl.rollout.engine_client`
(the trainer's environment) and :mod:`fastrl.rollout.engine_server` (run as a script by the engine
environment's interpreter, which must not import fastrl's other modules). Keep it free of fastrl, torch
and third-party imports.

Framing: each message is an 8-byte big-endian length followed by a pickled ``dict`` (protocol 5) on a
Unix stream socket (one end of a ``socketpair`` passed to the child as file descriptor
``--fd``). A request is ``{"op": <name>, ...}``; a reply is ``{"ok": True, ...}`` or
``{"ok": False, "error": <one line>, "kind": <error kind>}``. Payloads hold plain Python values
(lists of ints and floats, strings); weights never travel on the socket: they go through shared
memory files named in the ``load_weights`` request, or CUDA IPC handles (:mod:`fastrl.rollout.refit_transport`).

Operations (request fields -> reply fields):

* ``ready`` (sent by the server once, unasked): ``pid``, ``vllm_version``, ``default_stop_token_ids``.
* ``generate``: ``prompts`` (texts), ``images`` (per prompt, PNG bytes), ``sizes``, ``seeds``, ``sampling`` (temperature, top_p, top_k,
  max_tokens, stop_token_ids), ``weight_version`` (the trainer's refit count, or None: unchecked) ->
  ``outputs``: per sent prompt ``{"prompt_token_ids", "completions": [(token_ids, logprobs,
  finish_reason)]}`` and ``time_s``; an engine whose loaded weight version is behind
  ``weight_version`` refuses with kind ``"stale_weights"`` (:func:`stale_weights_message`).
* ``load_weights``: ``buckets``: list of ``(path, entries)``, entries ``(name, dtype, shape, offset,
  nbytes)`` -> ``count``.
* ``set_weight_version``: ``version`` -> (nothing): sent by the client after every bucket of a refit
  (or of a restart's replay) was loaded; the engine's loaded weight version from then on.
* ``score``: ``sequences`` (token ids), ``starts`` (index of the first scored token) -> ``logprobs``
  (per sequence, the log-probs of tokens ``starts[i]:``).
* ``group_sums``: -> ``sums``: per parameter group (:func:`weight_group`), the sum of squares of the
  weights the engine loaded (the model directory's, then each refit's).
* ``load_weights_ipc`` (GPU): ``handles`` (CUDA IPC handles of one flat uint8 bucket buffer, one
  per engine worker), ``entries``, ``sums`` -> ``count``.
* ``sleep``, ``wake``, ``reset_prefix_cache``, ``health``, ``shutdown``.
"""

from __future__ import annotations

import pickle
import re
import socket
import struct

PROTOCOL_VERSION = 1
_HEADER = struct.Struct(">Q")
MAX_MESSAGE_BYTES = 1 << 34


class WireClosed(ConnectionError):
    """The peer closed the socket (or died) before a whole message arrived."""


def send_message(sock: socket.socket, message: dict) -> None:
    """Send one framed message."""
    data = pickle.dumps(message, protocol=5)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 22))
        if not chunk:
            raise WireClosed(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> dict:
    """Receive one framed message (blocking; honours the socket's timeout: ``socket.timeout``).

    Raises:
        WireClosed: the peer closed the connection.
    """
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > MAX_MESSAGE_BYTES:
        raise WireClosed(f"message of {length} bytes: corrupt stream")
    return pickle.loads(_recv_exact(sock, length))


def error_reply(error: BaseException | str, kind: str = "error") -> dict:
    """A failure reply with a one-line message."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"ok": False, "error": " ".join(str(text).split())[:2000], "kind": kind}


#: Error kind of a generate request refused because the engine's weights are older than the trainer's.
STALE_WEIGHTS = "stale_weights"


def stale_weights_message(engine: str, loaded: int, requested: int | None) -> str | None:
    """Why an engine holding weight version ``loaded`` must not generate for the trainer's policy
    version ``requested`` (its count of refits), or None when it may (``requested`` None: unchecked,
    or ``loaded >= requested``). Shared by every engine (the in-process ones and the engine process)
    so that the check and its message are one."""
    if requested is None or loaded >= requested:
        return None
    return (
        f"{engine} holds weight version {loaded} but the trainer asked to generate with policy version "
        f"{requested}: {requested - loaded} refit(s) did not reach the engine, so these rollouts would come "
        f"from stale weights; nothing was generated. Check the refit path (transport, engine log); "
        f"docs/engine.md, 'Stale weights'"
    )


_LAYER_PREFIX = re.compile(r"^(.*?\.(?:layers|blocks)\.\d+)\.")


def weight_group(name: str) -> str:
    """The parameter group of a weight name: its transformer block (``model.layers.3``,
    ``visual.blocks.0``) or else its module (``model.embed_tokens``, ``lm_head``). The same in
    Hugging Face and vLLM naming (vLLM fuses q/k/v and gate/up inside a block), so sums over a group
    compare across the two (the unit refit verification reports)."""
    match = _LAYER_PREFIX.match(name)
    return match.group(1) if match else name.rpartition(".")[0]


#: vLLM model classes that need torchvision (absent from the CPU engine environment).
NEEDS_TORCHVISION = (
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
)
