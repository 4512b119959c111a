"""The scheduler-facing half of SGLang's ModelRunner, with no torch model and no torch KV cache.

SGLang's scheduler, radix cache and allocators need a ModelRunner's bookkeeping: a request ->
token-slot table (`ReqToTokenPool`), a token-slot allocator, and the limits derived from them.
This runner builds exactly those, sized from the core engine's KV cache: SGLang's pages are the
engine's pages (same page size; slot = page * page_size + offset; page 0 is the padding page
both sides reserve). Nothing else: weights and K/V live in the core engine (worker.py).

`device` is pinned to "cpu": every torch tensor SGLang makes for a batch (token ids, slot
tables, sampling settings) is host-side, whatever `--device` says.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo

logger = logging.getLogger(__name__)


class SlotsOnlyKVCache(KVCache):
    """Satisfies the allocator's KVCache interface; holds no buffers (the engine has the K/V)."""

    def __init__(self, size: int, page_size: int, dtype: torch.dtype):
        # KVCache.__init__ would set up device memory pools; only the bookkeeping fields are needed.
        self.size, self.page_size, self.dtype, self.store_dtype = size, page_size, dtype, dtype
        self.device = "cpu"
        self.layer_num = self.start_layer = self.end_layer = 0
        self.mem_usage = 0
        self.cpu_offloading_chunk_size = 8192
        self.layer_transfer_counter = None
        self.enable_custom_mem_pool = False
        self.custom_mem_pool = None

    def _no_buffers(self, *args, **kwargs):
        raise RuntimeError("tpu-plugins: K/V live in the core engine's cache, not in SGLang's pool.")

    get_key_buffer = get_value_buffer = get_kv_buffer = set_kv_buffer = _no_buffers

    def get_kv_size_bytes(self):
        return 0, 0


class _NoTorchModel:
    """Stands in for the torch model where ModelRunner inspects it."""

    from sglang.srt.configs.shared_experts import SharedExpertsConfig as _Shared
    shared_experts_config = _Shared()

    @staticmethod
    def forward():
        pass


class TpuModelRunner(ModelRunner):
    canary_manager = None
    prefill_aware_swa = False

    # ModelRunner.__init__ assigns the server's device ("tpu"); torch-side we are the host.
    device = property(lambda self: "cpu", lambda self, value: None)

    def __init__(self, *args, kv_slots: int, max_running_requests: int, **kwargs):
        self._kv_slots = kv_slots
        self._max_running = max_running_requests
        super().__init__(*args, **kwargs)

    @property
    def logical_max_total_num_tokens(self) -> int:
        return self.max_total_num_tokens

    @property
    def preloaded_weights_bytes(self) -> int:
        return 0

    def load_model(self):
        self.model = _NoTorchModel()
        self.sliding_window_size = None
        self.dtype = self.model_config.dtype
        self.weight_load_mem_usage = 0

    def initialize(self):
        from sglang.srt.runtime_context import get_exec
        from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

        self.memory_saver_adapter = TorchMemorySaverAdapter.create(enable=get_exec().features.enable_memory_saver)
        self.sampler = None
        self.load_model()
        layers = self.model_config.num_hidden_layers
        self.layer_info = ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers)
        self.kv_cache_dtype = self.dtype
        self.max_total_num_tokens = self._kv_slots
        self.max_running_requests = self._max_running
        self.is_hybrid_swa = False
        self.req_to_token_pool = ReqToTokenPool(size=self.max_running_requests,
                                                max_context_len=self.model_config.context_len, device="cpu",
                                                enable_memory_saver=False)
        self.token_to_kv_pool = SlotsOnlyKVCache(self.max_total_num_tokens, self.page_size, self.kv_cache_dtype)
        if self.page_size == 1:
            self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
                size=self.max_total_num_tokens, dtype=self.kv_cache_dtype, device="cpu",
                kvcache=self.token_to_kv_pool, need_sort=False)
        else:
            self.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(
                size=self.max_total_num_tokens, page_size=self.page_size, dtype=self.kv_cache_dtype, device="cpu",
                kvcache=self.token_to_kv_pool, need_sort=False)
        self.decode_cuda_graph_runner = None
        self.attn_backend = None
        self.init_ngram_embedding_manager()
        logger.info("tpu-plugins: %d KV token slots, %d running requests at most", self.max_total_num_tokens,
                    self.max_running_requests)

    def alloc_memory_pool(self, memory_pool_config=None, *, draft_parallel_layout=None):
        pass

    def init_attention_backends(self):
        pass

    def init_cuda_graphs(self):
        pass
