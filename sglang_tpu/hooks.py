"""SGLang hooks of tpu-plugins (registered by the `sglang.srt.plugins` entry point).

SGLang has no platform hook for the model worker, so this uses its official HookRegistry:

  * REPLACE `sglang.srt.managers.scheduler.Scheduler.init_tp_model_worker`: the scheduler's
    worker becomes our TpuTpModelWorker (worker.py), which runs batches on the core engine.

  * BEFORE `sglang.srt.sampling.sampling_params.SamplingParams.verify`: requests asking for
    what the core's sampler does not implement (`logit_bias`) are refused where SGLang refuses
    its own invalid parameters, as HTTP 400, instead of being silently sampled without it.

  * BEFORE `sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request`: a
    request's top-logprob count and prompt token ids are checked against what the core serves
    (0..MAX_LOGPROBS, 0..vocab-1) where SGLang checks the prompt's length, so they are refused
    as HTTP 400; unchecked, the core's sampler would raise inside the scheduler process and
    take the whole server down.

  * AFTER `sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling`: `n` below 1
    is refused with a message that names it (SGLang answers 400 "range() arg 3 must not be zero").

Everything else goes through SGLang's platform interface (platform.py), plus one import-time
compatibility shim (torchvision_compat.py).
"""

from __future__ import annotations

WORKER_TARGET = "sglang.srt.managers.scheduler.Scheduler.init_tp_model_worker"
VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
PARALLEL_SAMPLING_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"
VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def init_tp_model_worker(self) -> None:
    from sglang.srt.runtime_context import get_device

    from sglang_tpu.worker import TpuTpModelWorker

    self.tp_worker = TpuTpModelWorker(server_args=self.server_args, gpu_id=get_device().gpu_id,
                                      nccl_port=self.nccl_port)


def refuse_unsupported_sampling(params, *args, **kwargs) -> None:
    if params.logit_bias:
        raise ValueError("logit_bias is not supported on the tpu-plugins TPU platform; leave it out.")


def refuse_what_the_core_cannot_serve(manager, obj, input_ids, *args, **kwargs) -> None:
    from tpu_plugins.sampling import MAX_LOGPROBS

    top_n = getattr(obj, "top_logprobs_num", None)
    if getattr(obj, "return_logprob", False) and isinstance(top_n, int) and not 0 <= top_n <= MAX_LOGPROBS:
        raise ValueError(f"top_logprobs_num (logprobs) must be between 0 and {MAX_LOGPROBS}, got {top_n}.")
    vocab = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if input_ids and vocab:
        bad = [t for t in input_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is out of range: token ids must be in [0, {vocab - 1}].")


def refuse_n_below_one(result, request, *args, **kwargs) -> None:
    n = getattr(request, "parallel_sample_num", 1)
    if isinstance(n, int) and n < 1:
        raise ValueError(f"n (the number of samples per prompt) must be at least 1, got {n}.")


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(WORKER_TARGET, init_tp_model_worker, HookType.REPLACE)
    HookRegistry.register(VERIFY_TARGET, refuse_unsupported_sampling, HookType.BEFORE)
    HookRegistry.register(VALIDATE_TARGET, refuse_what_the_core_cannot_serve, HookType.BEFORE)
    HookRegistry.register(PARALLEL_SAMPLING_TARGET, refuse_n_below_one, HookType.AFTER)
