"""vLLM Platform for tpu-plugins: vLLM's scheduler, API server and tokenizer; our core runs the model.

What vLLM sees: an out-of-tree platform whose torch tensors live on the host (`device_type`
"cpu": vLLM's own bookkeeping tensors), one worker process per host that drives every local
chip through SPMD (`uni` executor on one host; on a multi-host slice Ray's, one worker per host,
ray_executor.py), and a KV cache of `--block-size` pages sized from the chips' memory.
`--tensor-parallel-size N` becomes the core's mesh, not N vLLM workers.

Through vLLM's platform hooks:
  * `pre_register_and_update(parser)` re-adds `--device` (removed from vLLM in 0.10);
  * `check_and_update_config` picks our worker, maps TP (and --enable-expert-parallel) onto
    the mesh, checks the model and its quantization;
  * `supported_quantization` plus `pre_register_and_update` registering `--quantization int8`
    through vLLM's out-of-tree quantization hook (quantization.py);
  * `validate_request` rejects sampling options the core does not implement, as HTTP 400.

Patch points, each small and named where no hook exists: `ModelConfig.verify_with_parallel_config`
(below: heads not divisible by TP), and in the engine-core process `torch.accelerator` cache
calls (worker.py) and `Scheduler.update_from_output` (request_errors.py: per-request failures).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from tpu_plugins import activation
from tpu_plugins.errors import UserError

logger = logging.getLogger(__name__)

WORKER_QUALNAME = "vllm_tpu.worker.TpuWorker"
TP_KEY = "tpu_plugins_tensor_parallel_size"   # where the user's TP size is kept (additional_config)
EP_KEY = "tpu_plugins_expert_parallel_size"   # and how many of those chips split the experts


def _device_choice(value: str) -> str:
    if value.strip().lower() != activation.DEVICE_NAME:
        raise argparse.ArgumentTypeError(
            f"--device {value!r} is not available here: vLLM is running on the tpu-plugins TPU platform, which "
            "accepts only '--device tpu'. To use vLLM's CPU platform instead, set VLLM_TARGET_DEVICE=cpu.")
    return activation.DEVICE_NAME


def config_error(message: str):
    """A configuration error: one line and exit for `vllm serve`, an exception for the Python API."""
    if len(sys.argv) > 1 and sys.argv[1] == "serve" and sys.argv[0].endswith("vllm"):
        logger.error("tpu-plugins: %s", message)
        raise SystemExit(f"vllm serve: error: {message}")
    raise UserError(message)


_PATCHED = False


def _allow_tensor_parallel_with_padded_heads() -> None:
    """Patch point (no hook exists before it): vLLM's ModelConfig.verify_with_parallel_config
    demands heads divisible by --tensor-parallel-size before any platform hook runs. On TPU the
    TP size is the core's mesh, which pads or replicates heads (tpu_plugins/sharding.py), so the
    check runs here with TP=1; check_and_update_config then moves the TP size to the mesh."""
    global _PATCHED
    if _PATCHED:
        return
    from vllm.config.model import ModelConfig as VllmModelConfig

    original = VllmModelConfig.verify_with_parallel_config

    def verify_with_parallel_config(self, parallel_config):
        tp = parallel_config.tensor_parallel_size
        parallel_config.tensor_parallel_size = 1
        try:
            return original(self, parallel_config)
        finally:
            parallel_config.tensor_parallel_size = tp

    VllmModelConfig.verify_with_parallel_config = verify_with_parallel_config
    _PATCHED = True


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "cpu"       # torch side: vLLM's bookkeeping tensors stay on the host
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    # Ray: one worker per host reserves one "TPU" (ray_executor.py) and sees every chip of its host.
    ray_device_key: str = "TPU"
    ray_noset_device_env_vars: list[str] = ["RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS"]
    device_control_env_var: str = "TPU_VISIBLE_CHIPS"

    # int8: quantized by the core at load time; compressed-tensors: int8 checkpoints (the core
    # checks the scheme and refuses others with what it supports).
    supported_quantization: list[str] = ["int8", "compressed-tensors"]

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float32]

    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        from vllm_tpu import quantization

        _allow_tensor_parallel_with_padded_heads()
        quantization.register()
        if parser is None:
            return
        try:
            parser.add_argument("--device", type=_device_choice, default=activation.DEVICE_NAME,
                                help="Execution device; with tpu-plugins installed and active: 'tpu'.")
        except argparse.ArgumentError:
            pass   # already added (the hook can run twice)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from tpu_plugins.models.config import ModelConfig
        from tpu_plugins.quantization import checkpoint_method

        parallel = vllm_config.parallel_config
        extra = vllm_config.additional_config
        if TP_KEY not in extra:   # first call: take the user's TP size for the mesh
            extra[TP_KEY] = parallel.tensor_parallel_size
            # --enable-expert-parallel: the experts are split over all TP chips (vLLM's EP size = TP)
            extra[EP_KEY] = parallel.tensor_parallel_size if parallel.enable_expert_parallel else 1
            if parallel.pipeline_parallel_size != 1:
                config_error("--pipeline-parallel-size is not supported on TPU; use --tensor-parallel-size.")
        hosts = cls._hosts(extra[TP_KEY], ray_asked=parallel.use_ray)
        # vLLM runs one worker per host (each drives its host's chips): Ray's executor for several
        # hosts, the in-process one for a single host.
        parallel.tensor_parallel_size = hosts
        parallel.world_size = hosts
        parallel.distributed_executor_backend = "uni"
        if hosts > 1:
            from vllm_tpu.ray_executor import TpuRayExecutor, ray_cluster_started   # imports Ray: only when used

            if not ray_cluster_started():
                config_error(f"--tensor-parallel-size {extra[TP_KEY]} spans {hosts} hosts through Ray, but no Ray "
                             "cluster is running: start it first (`ray start --head` on host 0, `ray start "
                             "--address=HOST0:6379` on the others; README: Multi-host slices) or set RAY_ADDRESS.")
            parallel.distributed_executor_backend = TpuRayExecutor
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_QUALNAME
        compilation = vllm_config.compilation_config
        compilation.cudagraph_capture_sizes = []
        try:
            from vllm.config.compilation import CompilationMode

            compilation.mode = CompilationMode.NONE
        except ImportError:
            pass

        model = vllm_config.model_config
        if model is not None:
            try:
                checkpoint_method(ModelConfig.from_hf(model.hf_config.to_dict()).hf)
            except UserError as exc:
                config_error(str(exc))
            if model.dtype not in (torch.bfloat16, torch.float32):
                config_error(f"--dtype {str(model.dtype).removeprefix('torch.')} is not supported on TPU; "
                             "use --dtype bfloat16 or --dtype float32.")

    @classmethod
    def _hosts(cls, tp: int, ray_asked: bool) -> int:
        """Hosts the TP size spans: one while it fits this host's chips, else (with Ray) TP / chips
        per host."""
        from tpu_plugins import runtime

        # JAX must not start in this process: vLLM forks the engine core from it, and JAX does
        # not survive fork(). The chips are counted from the PCI bus or the settings instead.
        local = runtime.local_chips_before_jax()
        if tp <= local:
            return 1
        if not ray_asked:
            config_error(f"--tensor-parallel-size {tp} needs {tp} chips, but {local} are visible on this host. To span "
                         "several hosts add --distributed-executor-backend ray (README: Multi-host slices); on a CPU "
                         f"host simulate a slice with TPU_PLUGINS_SIM_DEVICES={tp}.")
        if tp % local:
            config_error(f"--tensor-parallel-size {tp} does not fill whole hosts of {local} chips. Use a multiple "
                         f"of {local} to span several hosts, or at most {local} on this one (on a CPU host, "
                         f"TPU_PLUGINS_SIM_DEVICES sets the chips each simulated host has).")
        return tp // local

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import SamplingParams

        from vllm_tpu.sampling import unsupported_options

        if isinstance(params, SamplingParams):
            problems = unsupported_options(params)
            if problems:   # a client error: vLLM answers HTTP 400 with this message
                raise VLLMValidationError("Not supported on TPU: " + "; ".join(problems) + ".",
                                          parameter=problems[0].split("=")[0])

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        pass   # sampling seeds are per request, in the core

    @classmethod
    def set_device(cls, device) -> None:
        pass


# Every vLLM process that resolves this platform re-checks the config (the engine core does after
# its handshake, with the host count as vLLM's TP size), so the check is patched on import.
_allow_tensor_parallel_with_padded_heads()
