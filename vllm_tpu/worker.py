"""vLLM Worker for tpu-plugins: one process per host, every local chip, the core engine underneath.

Called by vLLM's uni-process executor (one host) or by every host's copy under its Ray
executor (ray_executor.py), in this order: init_device, load_model,
get_kv_cache_spec, determine_available_memory, initialize_from_config (allocates the page
pool vLLM sized), compile_or_warm_up_model (compiles every bucket before the server says
ready), then execute_model / sample_tokens for each step.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import torch
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from tpu_plugins import distributed
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.errors import UserError
from vllm_tpu import request_errors
from vllm_tpu.model_runner import TpuModelRunner
from vllm_tpu.platform import EP_KEY, TP_KEY

COORDINATOR_KEY = "tpu_plugins/jax_coordinator"
TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
# Under vLLM's logger namespace, so the line appears in vLLM's own start-up log.
logger = init_logger("vllm.tpu_plugins")


def _model_folder(model: str) -> Path:
    path = Path(model)
    if path.is_dir():
        return path
    try:   # a hub id already in the local Hugging Face cache; nothing is downloaded here
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        raise UserError(f"Model {model!r} is not a local folder or a cached Hugging Face model.") from None


def _no_torch_accelerator_cache_to_empty() -> None:
    """Patch point (engine-core process only): vLLM's shutdown calls torch.accelerator.empty_cache()
    on every platform that is not its CPU platform, and torch raises when it has no accelerator.
    Our arrays are JAX's, so there is no torch cache to empty: make the calls no-ops here."""
    if torch.accelerator.is_available():
        return
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, lambda: None)


class TpuWorker(WorkerBase):
    def __init__(self, vllm_config, local_rank: int = 0, rank: int = 0, distributed_init_method: str = "",
                 is_driver_worker: bool = True, **kwargs):
        super().__init__(vllm_config=vllm_config, local_rank=local_rank, rank=rank,
                         distributed_init_method=distributed_init_method, is_driver_worker=is_driver_worker)
        self.engine: Engine | None = None
        self.model_runner: TpuModelRunner | None = None

    def init_device(self) -> None:
        from tpu_plugins import runtime

        hosts = self.vllm_config.parallel_config.world_size
        if hosts > 1:   # one worker per host (ray_executor.py): join the others before JAX starts
            if runtime.tpu_attached():   # a real slice: JAX numbers the hosts as the TPU VMs do
                distributed.join(distributed.Hosts(hosts))
            else:
                distributed.join(distributed.Hosts(hosts, self.rank, self._coordinator(hosts)))
            logger.info("tpu-plugins: host %d of %d joined the slice (pid %d)", self.rank, hosts, os.getpid())
        runtime.current()
        _no_torch_accelerator_cache_to_empty()
        request_errors.fail_requests_the_runner_could_not_run()

    def _coordinator(self, hosts: int) -> str:
        """Host 0's JAX coordinator address, agreed through vLLM's own rendezvous: the TCP store
        at `distributed_init_method`, which vLLM's executor opened on rank 0's host."""
        from torch.distributed import TCPStore

        address = urlparse(self.distributed_init_method)
        store = TCPStore(address.hostname, address.port, world_size=hosts, is_master=False,
                         timeout=timedelta(seconds=distributed.JOIN_TIMEOUT_S))
        if self.rank == 0:
            store.set(COORDINATOR_KEY, f"{address.hostname}:{distributed.free_port()}")
        return store.get(COORDINATOR_KEY).decode()

    def load_model(self, *args, **kwargs) -> None:
        c = self.vllm_config
        self.engine = Engine(EngineConfig(
            model=_model_folder(c.model_config.model),
            dtype=TORCH_DTYPES[c.model_config.dtype],
            max_model_len=c.model_config.max_model_len,
            max_num_seqs=c.scheduler_config.max_num_seqs,
            max_num_batched_tokens=c.scheduler_config.max_num_batched_tokens,
            page_size=c.cache_config.block_size,
            memory_fraction=c.cache_config.gpu_memory_utilization,
            tensor_parallel_size=c.additional_config.get(TP_KEY, 1),
            expert_parallel_size=c.additional_config.get(EP_KEY, 1),
            # --quantization int8 quantizes at load; compressed-tensors checkpoints are read as they are
            quantization="int8" if c.model_config.quantization == "int8" else None,
            prompt_logprobs=True,
        ), defer_kv_cache=True)
        logger.info("tpu-plugins engine: %s", self.engine.describe())
        self.model_runner = TpuModelRunner(self.engine)

    def get_kv_cache_spec(self) -> dict:
        engine = self.engine
        spec = FullAttentionSpec(block_size=engine.config.page_size, num_kv_heads=engine.layout.num_kv_heads,
                                 head_size=engine.model_config.head_dim, dtype=self.vllm_config.model_config.dtype)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(engine.model_config.num_layers)}

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBHNC"]

    def determine_available_memory(self) -> int:
        # vLLM divides this by the page size of every layer's spec (all heads, as laid out), so
        # report the whole slice's KV budget: per-device budget x chips.
        return self.engine.budget_pages() * self.engine.page_bytes_per_device() * self.engine.layout.tp

    def initialize_from_config(self, kv_cache_config) -> None:
        self.engine.allocate_kv_cache(kv_cache_config.num_blocks)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        start = time.perf_counter()
        self.engine.warmup()
        return CompilationTimes(language_model=time.perf_counter() - start, encoder=0.0)

    def get_supported_tasks(self):
        return ("generate",)

    def execute_model(self, scheduler_output, *args, **kwargs):
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output, *args, **kwargs):
        return self.model_runner.sample_tokens(grammar_output)

    def take_draft_token_ids(self):
        return None

    def reset_encoder_cache(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        self.model_runner = None
        self.engine = None

    # Counters the tests and benchmarks read through collective_rpc.
    def tpu_plugins_stats(self) -> dict:
        c = self.engine.counters
        return {"warmup_compiles": c.warmup_compiles, "recompiles": c.recompiles,
                "num_pages": self.engine.kv_spec.num_pages}
