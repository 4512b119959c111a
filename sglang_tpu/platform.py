"""SGLang platform for tpu-plugins: SGLang's servers, scheduler, radix cache and tokenizer; our
core runs the model.

What SGLang sees: an out-of-tree platform (`_enum = OOT`) whose device is "tpu" (the user's
`--device tpu` stays in the server arguments and in `/server_info`), whose torch tensors live on
the host (`device_type` "cpu": the scheduler's token ids, slot tables and sampling settings),
and a model worker of ours (hooks.py) that runs each batch on the core engine.

Device checks: SGLang passes `--device` to `torch.get_device_module(device)` when it sets up its
process groups, so the platform makes sure torch's "tpu" device exists (the one hf_tpu provides;
its streams and events are the host's). No SGLang tensor is placed on it: which device SGLang
tensors use is the model runner's `device`, "cpu" (model_runner.py).
"""

from __future__ import annotations

import logging
import sys

from sglang.srt.platforms.interface import PlatformEnum, SRTPlatform

from tpu_plugins import activation, settings
from tpu_plugins.errors import UserError

logger = logging.getLogger(__name__)

DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16"}   # SGLang --dtype -> core
CPU_MEMORY_SHARE = 8 * 2**30
DEFAULT_PREFILL_CHUNK = 512
DEFAULT_PAGE_SIZE = 16   # what the JAX CPU stand-in offers, as the core engine assumes


def name_torch_device() -> None:
    """torch.device("tpu") and torch.get_device_module("tpu") resolve: the Hugging Face adapter's
    torch device (hf_tpu/torch_device.py). SGLang's own tensors stay on the host."""
    from hf_tpu import torch_device

    torch_device.register()


def config_error(message: str):
    """One line and exit for `python -m sglang.launch_server`; an exception for the Python API."""
    if sys.argv and sys.argv[0].endswith(("launch_server.py", "/sglang")):
        raise SystemExit(f"sglang.launch_server: error: {message}")
    raise UserError(message)


class TpuSRTPlatform(SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name = activation.DEVICE_NAME
    device_type = "cpu"          # torch-side bookkeeping tensors

    def __init__(self):
        super().__init__()
        name_torch_device()

    def apply_server_args_defaults(self, server_args) -> None:
        if server_args.dtype not in ("auto", *DTYPES):
            config_error(f"--dtype {server_args.dtype} is not supported on TPU; use bfloat16, float32 or auto.")
        # The worker runs each batch to completion (sampling included) before the next is
        # scheduled: grammar masks and penalties then always see the latest token.
        server_args.disable_overlap_schedule = True
        server_args.disable_cuda_graph = True
        # Prefill in chunks of at most 512 tokens unless the user chose: the engine compiles
        # one program per power-of-two token count up to this size before serving.
        if server_args.chunked_prefill_size is None:
            server_args.chunked_prefill_size = DEFAULT_PREFILL_CHUNK
        chunk = server_args.chunked_prefill_size
        if chunk > 0 and (server_args.max_prefill_tokens is None or server_args.max_prefill_tokens > chunk):
            server_args.max_prefill_tokens = chunk
        # KV pages of 16 tokens unless the user chose: SGLang's paged allocator then hands out
        # whole pages, which are the engine's pages (page size 1 makes attention walk tokens one by one).
        if server_args.page_size is None:
            server_args.page_size = DEFAULT_PAGE_SIZE
        # --tp-size N (and --ep-size M of those chips for the experts) is the core's mesh inside
        # one worker, not N SGLang worker processes.
        tp, ep = server_args.tp_size or 1, server_args.ep_size or 1
        if tp % ep:
            config_error(f"--ep-size {ep} must divide --tp-size {tp}: the experts are split over {ep} of the "
                         f"{tp} tensor-parallel chips.")
        if tp > 1:
            settings.set_sglang_mesh_tp(tp)
            server_args.tp_size = 1
        if ep > 1:
            settings.set_sglang_mesh_ep(ep)
            server_args.ep_size = 1

    def get_default_attention_backend(self) -> str:
        return "torch_native"    # never built: attention runs in the core engine

    def get_device(self, device_id: int | None = None) -> str:
        return activation.DEVICE_NAME

    def get_device_total_memory(self, device_id: int = 0) -> int:
        # Runs in SGLang's API-server process too, where JAX must not start: a static answer.
        # SGLang uses it only for defaults (chunk sizes); the worker sizes the KV cache itself.
        from tpu_plugins import chips, runtime

        return chips.CHIPS["v5e"].hbm_bytes if runtime.tpu_attached() else CPU_MEMORY_SHARE

    def get_current_memory_usage(self, device=None) -> float:
        return 0.0

    def is_pin_memory_available(self, device=None) -> bool:
        return False
