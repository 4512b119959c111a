"""SGLang hooks of tpu-plugins (registered by the `sglang.srt.plugins` entry point).

SGLang has no platform hook for the model worker, so this uses its official HookRegistry:

  * REPLACE `sglang.srt.managers.scheduler.Scheduler.init_tp_model_worker`: the scheduler's
    worker becomes our TpuTpModelWorker (worker.py), which runs batches on the core engine.

  * BEFORE `sglang.srt.sampling.sampling_params.SamplingParams.verify`: requests asking for
    what the core's sampler does not implement (`logit_bias`) are refused where SGLang refuses
    its own invalid parameters, as HTTP 400, instead of being silently sampled without it.

Everything else goes through SGLang's platform interface (platform.py), plus one import-time
compatibility shim (torchvision_compat.py).
"""

from __future__ import annotations

WORKER_TARGET = "sglang.srt.managers.scheduler.Scheduler.init_tp_model_worker"
VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"


def init_tp_model_worker(self) -> None:
    from sglang.srt.runtime_context import get_device

    from sglang_tpu.worker import TpuTpModelWorker

    self.tp_worker = TpuTpModelWorker(server_args=self.server_args, gpu_id=get_device().gpu_id,
                                      nccl_port=self.nccl_port)


def refuse_unsupported_sampling(params, *args, **kwargs) -> None:
    if params.logit_bias:
        raise ValueError("logit_bias is not supported on the tpu-plugins TPU platform; leave it out.")


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(WORKER_TARGET, init_tp_model_worker, HookType.REPLACE)
    HookRegistry.register(VERIFY_TARGET, refuse_unsupported_sampling, HookType.BEFORE)
