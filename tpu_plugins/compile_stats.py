"""Counts every XLA program this process builds, from JAX's own monitoring events.

`programs_built` rises each time JAX builds an executable (compiled, or loaded from the
persistent cache); `cache_hits` when it was loaded from disk; `backend_compiles` is the
difference: real XLA compilations. The engine reads them around its warm-up: anything built
after warm-up is a recompile, whoever triggered it.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import threading

from jax import monitoring

_BUILD_EVENT = "/jax/core/compile/backend_compile_duration"   # wraps compile-or-load-from-cache
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_counts = {"programs_built": 0, "cache_hits": 0}
_installed = False


def _on_event(event: str, **_kwargs) -> None:
    if event == _CACHE_HIT_EVENT:
        with _lock:
            _counts["cache_hits"] += 1


def _on_duration(event: str, _duration: float, **_kwargs) -> None:
    if event == _BUILD_EVENT:
        with _lock:
            _counts["programs_built"] += 1


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    monitoring.register_event_listener(_on_event)
    monitoring.register_event_duration_secs_listener(_on_duration)


def snapshot() -> dict[str, int]:
    with _lock:
        out = dict(_counts)
    out["backend_compiles"] = out["programs_built"] - out["cache_hits"]
    return out
