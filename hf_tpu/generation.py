"""The fast path of `model.generate()` on "tpu": the core engine, for architectures it serves.

transformers' own generate runs op by op on the device (correct for any model, one JAX call per
torch op). For a causal LM the core engine supports, greedy and sampled generation instead run
on the engine's compiled ragged step (paged KV cache, one program per token bucket, no
recompilation per token), built once per model from the model's own weights. Anything the
engine does not do (beam search, logits processors, streamers, output scores, ...) falls back
to transformers' generate. `op_by_op()` turns the fast path off (benchmarks compare both).

transformers has no per-device hook for generate, so `GenerationMixin.generate` is wrapped
(`install`); the wrapper only acts for models on "tpu".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import weakref

import numpy as np
import torch

from hf_tpu.tensor import TpuTensor, from_host

logger = logging.getLogger(__name__)
_state = threading.local()
# model -> {"weights": the arrays it was built from, "generator": OfflineGenerator}. Kept beside the
# model, not on it, so deepcopy, pickling and save_pretrained of the model never see it.
_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# GenerationConfig fields the engine honours; any other field that differs from its default
# sends the call to transformers' generate.
_SUPPORTED_FIELDS = {
    "max_length", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p",
    "repetition_penalty", "eos_token_id", "pad_token_id", "bos_token_id", "use_cache",
    "transformers_version", "_from_model_config", "return_legacy_cache", "cache_implementation",
}
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
_TOKEN_BUDGET = 512          # tokens per engine step (chunked prefill)
_MIN_CACHE_TOKENS = 4096
# Smallest step bucket off TPU (on a TPU the engine's default, 16 rows, fills a bf16 tile): on
# JAX's CPU backend a batch-1 decode padded to 16 rows costs 1.6x one padded to 4 (measured: 67
# vs 41 ms per token, SmolLM2 fp32).
_MIN_BUCKET_OFF_TPU = 4


@contextlib.contextmanager
def op_by_op():
    """Within this block, generate() on "tpu" runs transformers' own loop (no engine)."""
    previous = getattr(_state, "disabled", False)
    _state.disabled = True
    try:
        yield
    finally:
        _state.disabled = previous


def install() -> None:
    """Wrap GenerationMixin.generate once (called when transformers is imported)."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate
    if getattr(original, "_tpu_plugins", False):
        return

    @functools.wraps(original)
    def generate(self, inputs=None, generation_config=None, **kwargs):
        if not getattr(_state, "disabled", False) and getattr(self, "device", None) is not None \
                and self.device.type == "tpu":
            result = engine_generate(self, inputs, generation_config, kwargs)
            if result is not None:
                return result
        return original(self, inputs, generation_config, **kwargs)

    generate._tpu_plugins = True
    GenerationMixin.generate = generate


def engine_generate(model, inputs, generation_config, kwargs):
    """Token ids as transformers' generate returns them, or None when the engine cannot serve the call."""
    from transformers.generation.configuration_utils import GenerationConfig, GenerationMode

    model_config = _supported_model(model)
    if model_config is None:
        return None
    generic = {"logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model", "streamer",
               "negative_prompt_ids", "negative_prompt_attention_mask", "custom_generate", "synced_gpus",
               "tokenizer", "assistant_tokenizer"}
    if any(kwargs.get(k) is not None for k in generic):
        return None
    config, model_kwargs = model._prepare_generation_config(generation_config, **dict(kwargs))
    if config.get_generation_mode() not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        return None
    default = GenerationConfig()
    default.update(**model.generation_config._get_default_generation_params(), defaults_only=True)
    changed = {k for k, v in config.to_dict().items()
               if k not in _SUPPORTED_FIELDS and v not in (None, False) and getattr(default, k, None) != v}
    if changed:
        logger.info("tpu: generate() with %s runs op by op (the engine path does not take them)", sorted(changed))
        return None
    input_ids = inputs if inputs is not None else model_kwargs.pop("input_ids", None)
    attention_mask = model_kwargs.pop("attention_mask", None)
    if input_ids is None or model_kwargs or input_ids.ndim != 2:
        return None

    ids = _host(input_ids)
    mask = _host(attention_mask) if attention_mask is not None else np.ones_like(ids)
    prompts = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]
    max_new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - ids.shape[1]
    if max_new <= 0:
        return input_ids
    eos = config.eos_token_id
    eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)

    from tpu_plugins.offline import GenerationParams
    from tpu_plugins.sampling import SamplingParams

    if config.do_sample:
        sampling = SamplingParams(temperature=config.temperature or 1.0, top_k=config.top_k or 0,
                                  top_p=config.top_p if config.top_p is not None else 1.0, min_p=config.min_p or 0.0,
                                  repetition_penalty=config.repetition_penalty or 1.0)
    else:
        sampling = SamplingParams(temperature=0.0, repetition_penalty=config.repetition_penalty or 1.0)
    params = []
    for _ in prompts:
        # Seeds from torch's generator, so torch.manual_seed makes sampled outputs reproducible.
        seed = int(torch.randint(0, 2**62, (1,)).item()) if config.do_sample else None
        params.append(GenerationParams(sampling=_with_seed(sampling, seed), max_tokens=max_new,
                                       stop_token_ids=tuple(eos), ignore_eos=True))
    generator = _generator(model, model_config, need_tokens=[len(p) + max_new for p in prompts])
    completions = generator.generate(prompts, params)

    steps = max(len(c.token_ids) for c in completions)
    out = np.full((ids.shape[0], ids.shape[1] + steps), pad, dtype=np.int64)
    out[:, :ids.shape[1]] = ids
    for i, c in enumerate(completions):
        out[i, ids.shape[1]:ids.shape[1] + len(c.token_ids)] = c.token_ids
    result = torch.from_numpy(out)
    return from_host(result, input_ids.device.index) if isinstance(input_ids, TpuTensor) else result


def _with_seed(sampling, seed):
    import dataclasses

    return dataclasses.replace(sampling, seed=seed)


def _host(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy().astype(np.int64)


def _supported_model(model):
    """The core engine's ModelConfig for this model, or None (architecture, dtype, placement)."""
    from tpu_plugins.errors import UserError
    from tpu_plugins.models.config import ModelConfig

    if model.dtype not in _DTYPES or getattr(model.config, "is_encoder_decoder", False):
        return None
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1 or next(iter(devices)).type != "tpu":
        return None                      # split across devices (device_map) or partly on the host
    try:
        return ModelConfig.from_hf(model.config.to_dict())
    except (UserError, KeyError, TypeError, ValueError):
        return None


def _weights_of(model) -> list:
    return [p._elem for p in model.parameters() if isinstance(p, TpuTensor)]   # int8 values and scales included


def _generator(model, model_config, need_tokens: list[int]):
    """The model's engine and scheduler, built on first use; rebuilt when the weights or the
    needed KV cache size changed."""
    from tpu_plugins.engine import MIN_TOKEN_BUCKET, Engine, EngineConfig
    from tpu_plugins.offline import OfflineGenerator

    cached = _engines.get(model)
    weights = _weights_of(model)
    page_size = 16
    pages = sum(math.ceil(n / page_size) + 1 for n in need_tokens)
    if cached is not None:
        same = len(cached["weights"]) == len(weights) and all(a is b for a, b in zip(cached["weights"], weights))
        if same and cached["generator"].engine.kv_spec.num_pages >= pages:
            return cached["generator"]
    pages = max(pages, _MIN_CACHE_TOKENS // page_size, 2 * (cached["generator"].engine.kv_spec.num_pages if cached else 0))
    state = model.state_dict()

    def reader(tensor):
        if isinstance(tensor, TpuTensor):
            return lambda: np.asarray(tensor._elem)
        return lambda: tensor.detach().numpy() if tensor.dtype == torch.int8 else tensor.detach().float().numpy()

    from tpu_plugins import runtime

    config = EngineConfig(
        model=getattr(model, "name_or_path", "") or "transformers-model", dtype=_DTYPES[model.dtype],
        max_model_len=max(max(need_tokens), min(model_config.max_position_embeddings, 8192)),
        max_num_seqs=64, max_num_batched_tokens=_TOKEN_BUDGET, page_size=page_size, num_pages=pages, progress=False,
        min_token_bucket=MIN_TOKEN_BUCKET if runtime.current().kind == "tpu" else _MIN_BUCKET_OFF_TPU)
    engine = Engine(config, model_config=model_config, weights=[(name, reader(t)) for name, t in state.items()])
    # No warm-up: a generate() call compiles only the token buckets it uses (each once, then
    # cached in memory and on disk), which keeps the first call short.
    generator = OfflineGenerator(engine)
    _engines[model] = {"weights": weights, "generator": generator}
    return generator


def built_engine(model):
    """The core engine generate() built for this model, or None."""
    cached = _engines.get(model)
    return cached["generator"].engine if cached else None
