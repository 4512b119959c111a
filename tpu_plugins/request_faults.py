"""A request that cannot be prepared fails alone: the server and every other request go on.

Adapters prepare each request's inputs (its sampling settings, its tokens, its page table)
through `attempt`; an exception there is logged with its traceback and becomes that request's
failure message, which the adapter hands to its framework's per-request error path (vLLM: the
scheduler's request errors, HTTP 500 for that request; SGLang: an abort with status 500).

Not isolated: a failure of the compiled step itself. It runs every request of the batch at
once and updates the KV cache in place, so after it the cache cannot be trusted; that stays
fatal, as it is for the frameworks' own GPU workers.

One named fault-injection point, off unless set, lets the reliability tests cause a request
failure on purpose: with TPU_PLUGINS_FAULT_TOKEN=<token id>, preparing a request whose prompt
contains that token raises InjectedFault.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from tpu_plugins import settings

logger = logging.getLogger(__name__)
T = TypeVar("T")


class InjectedFault(RuntimeError):
    """Raised on purpose by the fault-injection point (settings.FAULT_TOKEN)."""


def check_injected_fault(prompt_ids: Sequence[int]) -> None:
    token = settings.fault_token()
    if token is not None and token in prompt_ids:
        raise InjectedFault(f"fault injected for testing: the prompt contains token {token} "
                            f"({settings.FAULT_TOKEN} is set)")


def attempt(request_id: str, prepare: Callable[[], T]) -> tuple[T | None, str | None]:
    """(prepare(), None), or (None, the message for the client) when preparing raised."""
    try:
        return prepare(), None
    except Exception as exc:   # any bug in one request's preparation is that request's failure
        logger.error("tpu-plugins: request %s could not be prepared; it fails alone, the server goes on",
                     request_id, exc_info=True)
        return None, f"tpu-plugins could not run this request ({type(exc).__name__}: {exc})"
