"""Counts every XLA program this process builds, from JAX's own monitoring events.

`programs_built` rises each time JAX compiles a program or loads one from the persistent
cache; `backend_compiles` only when XLA really compiles. The engine reads them around its
warm-up: anything built after warm-up is a recompile, whoever triggered it.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import threading

from tpu_plugins import runtime

from jax import monitoring  # noqa: E402

_BUILD_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_counts = {"programs_built": 0, "backend_compiles": 0}
_installed = False


def _on_event(event: str, **_kwargs) -> None:
    if event == _BUILD_EVENT:
        with _lock:
            _counts["programs_built"] += 1


def _on_duration(event: str, _duration: float, **_kwargs) -> None:
    if event == _COMPILE_EVENT:
        with _lock:
            _counts["backend_compiles"] += 1


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
        return dict(_counts)
