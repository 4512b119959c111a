"""Whether the user asked for a TPU: the one rule all three adapters share.

A framework plugin activates when a TPU is attached, when the command line says
`--device tpu`, or when TPU_PLUGINS_DEVICE=tpu. Everything here is cheap and never raises,
because it runs inside entry points that the frameworks call on every start.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tpu_plugins import runtime, settings

DEVICE_NAME = "tpu"


def device_flag(argv: Sequence[str] | None = None) -> str | None:
    """The value of `--device` on the command line (`--device X` or `--device=X`), if given."""
    args = list(sys.argv if argv is None else argv)
    for i, arg in enumerate(args):
        if arg == "--device" and i + 1 < len(args):
            return args[i + 1].strip().lower()
        if arg.startswith("--device="):
            return arg.split("=", 1)[1].strip().lower()
    return None


def tpu_requested(argv: Sequence[str] | None = None, extra_env_request: bool = False) -> bool:
    """True when the adapters should take over: TPU attached, `--device tpu`, or asked by env.

    `extra_env_request` lets an adapter add its framework's own switch (e.g. SGLANG_PLATFORM).
    """
    try:
        if extra_env_request or device_flag(argv) == DEVICE_NAME:
            return True
        if settings.load().device == DEVICE_NAME:
            return True
        return runtime.tpu_attached()
    except Exception:  # never break the host framework's start-up
        return False
