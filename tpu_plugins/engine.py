"""The inference engine: one compiled step over a ragged batch, driven by any scheduler.

    engine = Engine(EngineConfig(model="/path/to/hf-folder", dtype="float32"))
    engine.warmup()                        # compiles every bucket (progress bar)
    logits = engine.execute(batch)         # RaggedBatch -> device logits, one row per sequence
    out = engine.sample(logits, params, steps, seeds, histories, allowed_mask)   # -> SamplerOutput

A scheduler that sizes the cache itself (vLLM) builds the engine with `defer_kv_cache=True`,
reads `budget_pages()` / `page_bytes_per_device()`, then calls `allocate_kv_cache(n)`.
`batching.ragged_batch` turns (tokens, start position, page list) per sequence into a batch;
`execute_with_token_logits` also returns every token's logits (prompt log-probabilities);
`copy_pages` copies whole pages (copy-on-write of prefix-cache hits).

A `RaggedBatch` is any mix of prefill chunks and single-token decodes, as flat tokens plus,
per sequence, its query length, its KV length after this step, and its page table; `slot_mapping`
says where each new token's K/V goes (page * page_size + offset). The engine writes the K/V,
attends through ragged paged attention, and returns logits for each sequence's last token
(or for the rows in `logits_indices`).

Shapes: the token count is padded to a power-of-two bucket (16 .. max_num_batched_tokens);
the sequence count to min(token bucket, max_num_seqs), so one program serves each token
bucket. `warmup()` compiles them all; any compile after it increments `recompiles`. Compiled
programs are kept in a persistent on-disk cache, so a second start skips compilation.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import functools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from tpu_plugins import chips, compile_stats, kv_cache, runtime, sampling, settings
from tpu_plugins.errors import UserError
from tpu_plugins.loader import LoadStats, abstract_params, load_params
from tpu_plugins.mesh import MeshShape, make_mesh
from tpu_plugins.models import decoder, moe
from tpu_plugins.kernels.ragged_attention import BlockSizes
from tpu_plugins.models.attention import IMPLEMENTATIONS, AttentionSpec
from tpu_plugins.models.config import ModelConfig
from tpu_plugins.models.rope import inverse_frequencies
from tpu_plugins.quantization import check_method, checkpoint_method
from tpu_plugins.sharding import head_layout

logger = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "fp32": jnp.float32, "bf16": jnp.bfloat16}
MIN_TOKEN_BUCKET = 16
PAGE_COPY_GROUP = 16


@dataclass
class EngineConfig:
    model: str | Path                      # HF folder (weights) or config.json (abstract, for AOT)
    dtype: str = "bfloat16"
    max_model_len: int | None = None       # default: the model's max_position_embeddings, capped at 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    page_size: int = 16
    num_pages: int | None = None           # default: from memory_fraction
    memory_fraction: float = 0.9           # of device memory (TPU HBM); on CPU of a host-memory share
    tensor_parallel_size: int = 1          # chips the model is split over (attention heads, vocabulary)
    expert_parallel_size: int = 1          # of those, how many split the experts (divides the TP size)
    attention: str = "auto"                # "auto", "reference" or "pallas"
    moe: str = "auto"                      # experts' grouped matmul: "auto", "reference" or "megablox"
    quantization: str | None = None        # "int8": quantize float linear weights at load time
    compile_cache_dir: Path | None = None  # default: $TPU_PLUGINS_CACHE/jax-compile
    progress: bool = True
    prompt_logprobs: bool = False          # also warm up the all-token-logits programs
    min_token_bucket: int = MIN_TOKEN_BUCKET   # smallest step; on a CPU 4 decodes small batches faster


@dataclass
class RaggedBatch:
    """One step's work, on the host. Lengths: tokens T, sequences S."""

    token_ids: np.ndarray       # [T] int
    positions: np.ndarray       # [T] int
    slot_mapping: np.ndarray    # [T] int: page * page_size + offset (-1: do not write)
    query_lens: np.ndarray      # [S] int, each >= 1, sum = T
    kv_lens: np.ndarray         # [S] int: KV length after this step
    page_tables: list           # S sequences' page id lists (or an [S, W] array)
    logits_indices: np.ndarray | None = None  # [S] token rows to return logits for; default: last of each


@dataclass
class Counters:
    """Programs built by this process (compiled, or loaded from the disk cache), from JAX's events."""

    at_start: dict = field(default_factory=dict)
    after_warmup: dict | None = None

    @property
    def warmed_up(self) -> bool:
        return self.after_warmup is not None

    @property
    def warmup_compiles(self) -> int:
        end = self.after_warmup or compile_stats.snapshot()
        return end["programs_built"] - self.at_start["programs_built"]

    @property
    def recompiles(self) -> int:
        if self.after_warmup is None:
            return 0
        return compile_stats.snapshot()["programs_built"] - self.after_warmup["programs_built"]

    reported: int = 0

    def report_new_recompiles(self) -> None:
        """Log once per new program built after warm-up, so servers' logs show it."""
        count = self.recompiles
        if count > self.reported:
            self.reported = count
            logger.warning("tpu-plugins: programs compiled after warm-up: %d in total", count)


def token_buckets(max_tokens: int, smallest: int = MIN_TOKEN_BUCKET) -> list[int]:
    buckets, b = [], smallest
    while b < max_tokens:
        buckets.append(b)
        b *= 2
    buckets.append(max_tokens)
    return buckets


def enable_compile_cache(directory: Path) -> None:
    """JAX's persistent cache for every program, however fast it compiled. Process-wide: JAX
    opens the cache at its first compilation, so the first engine's directory holds."""
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class Engine:
    def __init__(self, config: EngineConfig, *, abstract: bool = False, mesh=None, defer_kv_cache: bool = False,
                 model_config: ModelConfig | None = None, weights=None):
        """Load the model (or, with `abstract`, only its shapes). The KV cache is allocated now
        (config.num_pages, else what the memory budget holds), or later by `allocate_kv_cache`
        when `defer_kv_cache` is set: vLLM sizes the cache itself after loading the model.

        `model_config` and `weights` ((HF name, read) pairs, see loader.load_params) build the
        engine from a model already in memory; `config.model` then only names it."""
        self.config = config
        # Before anything compiles, so every program of this process can come from the disk cache.
        # Not for AOT: a compile-only TPU client cannot load cached executables back.
        if not abstract:
            enable_compile_cache(Path(config.compile_cache_dir or settings.load().cache_dir / "jax-compile"))
        self.runtime = runtime.current()
        path = Path(config.model)
        self.model_config = model_config or ModelConfig.from_path(path)
        cfg = self.model_config
        if config.dtype not in DTYPES:
            raise UserError(f"dtype {config.dtype!r} is not supported; use one of: float32, bfloat16.")
        self.dtype = DTYPES[config.dtype]
        self.max_model_len = config.max_model_len or min(cfg.max_position_embeddings, 8192)
        # int8 when asked to quantize, or when the checkpoint already is (compressed-tensors)
        self.quantization = check_method(config.quantization) or checkpoint_method(cfg.hf)
        self._validate_config()
        tp, ep = config.tensor_parallel_size, config.expert_parallel_size
        self.mesh = mesh if mesh is not None else make_mesh(MeshShape(expert=ep, model=tp // ep))
        self.layout = head_layout(cfg, self.mesh.shape["expert"] * self.mesh.shape["model"])
        self.pages_per_seq = math.ceil(self.max_model_len / config.page_size)
        # The chip the programs are built for: a real TPU, or abstract TPU devices (AOT).
        device = self.mesh.devices.flat[0]
        on_tpu = device.platform == "tpu"
        self.target_chip = chips.chip_for_device_kind(device.device_kind) if on_tpu else None
        impl = config.attention
        if impl == "auto":
            impl = "pallas" if on_tpu else "reference"
        if impl not in IMPLEMENTATIONS:
            raise UserError(f"attention={impl!r} is not one of: auto, {', '.join(IMPLEMENTATIONS)}.")
        self.attention = AttentionSpec(
            sm_scale=cfg.sm_scale, sliding_window=cfg.sliding_window, soft_cap=cfg.attn_logit_softcap,
            implementation=impl,
            # JAX's tuned blocks for the target chip, per bucket; fixed ones in interpret mode on a CPU.
            block_sizes=None if on_tpu else BlockSizes(), device_kind=device.device_kind if on_tpu else None)
        self.moe = None
        if cfg.moe is not None:
            moe_impl = config.moe if config.moe != "auto" else ("megablox" if on_tpu else "reference")
            if moe_impl not in moe.IMPLEMENTATIONS:
                raise UserError(f"moe={moe_impl!r} is not one of: auto, {', '.join(moe.IMPLEMENTATIONS)}.")
            self.moe = moe.MoeSpec(num_experts=cfg.moe.num_experts, top_k=cfg.moe.experts_per_token,
                                   norm_topk_prob=cfg.moe.norm_topk_prob, implementation=moe_impl,
                                   interpret=moe_impl == "megablox" and not on_tpu)
        self.inv_freq = jnp.asarray(inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        self.buckets = token_buckets(config.max_num_batched_tokens, config.min_token_bucket)
        compile_stats.install()
        self.counters = Counters(at_start=compile_stats.snapshot())
        self._programs: dict = {}
        self._placeholders: dict = {}

        self.load_stats = LoadStats()
        if abstract:
            self.params = abstract_params(cfg, self.layout, self.dtype, self.mesh, self.quantization)
        else:
            if weights is None and not path.is_dir():
                raise UserError(f"{path} is not a model folder; weights are needed to run (a config.json alone is "
                                "enough only for ahead-of-time compilation).")
            self.params = load_params(path, cfg, self.layout, self.dtype, self.mesh, progress=config.progress,
                                      tensors=weights, quantization=self.quantization, stats=self.load_stats)
        self._abstract = abstract
        logger.info("tpu-plugins: %s", self.describe())
        self.kv_spec: kv_cache.KVCacheSpec | None = None
        self.kv_caches = None
        self._step = jax.jit(self._forward, donate_argnums=(1,), static_argnames=("all_logits",))
        if not defer_kv_cache:
            self.allocate_kv_cache(config.num_pages or min(self.max_useful_pages(), self.budget_pages()))

    def describe(self) -> str:
        """One line for start-up logs: what runs where."""
        hosts = self.runtime.num_hosts
        return (f"{self.model_config.architecture} on a mesh of {dict(self.mesh.shape)}"
                f"{f' across {hosts} hosts' if hosts > 1 else ''}, weights {self.config.dtype}"
                f"{' + int8' if self.quantization else ''}, attention {self.attention.implementation}"
                f"{f', experts {self.moe.implementation}' if self.moe else ''}")

    # -- configuration -------------------------------------------------------------------
    def _validate_config(self) -> None:
        c = self.config
        problems = []
        if c.max_num_seqs < 1 or c.max_num_batched_tokens < 1 or c.page_size < 1:
            problems.append("max_num_seqs, max_num_batched_tokens and page_size must be positive")
        if c.max_num_batched_tokens < c.max_num_seqs:
            problems.append(f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= max_num_seqs ({c.max_num_seqs})")
        if self.max_model_len > self.model_config.max_position_embeddings:
            problems.append(f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                            f"{self.model_config.max_position_embeddings}")
        if not 0 < c.memory_fraction <= 1:
            problems.append(f"memory_fraction must be in (0, 1], got {c.memory_fraction}")
        tp, ep = c.tensor_parallel_size, c.expert_parallel_size
        if tp < 1 or ep < 1 or tp % ep:
            problems.append(f"expert_parallel_size ({ep}) must divide tensor_parallel_size ({tp}); both >= 1")
        elif (moe_cfg := self.model_config.moe) is not None:
            if moe_cfg.num_experts % ep:
                problems.append(f"the model's {moe_cfg.num_experts} experts do not divide over "
                                f"expert_parallel_size={ep}; use a divisor of {moe_cfg.num_experts}")
            if moe_cfg.intermediate_size % (tp // ep):
                problems.append(f"the experts' intermediate size {moe_cfg.intermediate_size} does not divide over "
                                f"{tp // ep} chips per expert group; use expert parallelism over more of the "
                                "tensor-parallel chips")
        if problems:
            raise UserError("Invalid engine configuration: " + "; ".join(problems) + ".")

    def allocate_kv_cache(self, num_pages: int) -> None:
        """(Re)create the page pool with `num_pages` pages per layer."""
        if num_pages < 2:
            raise UserError(f"The KV cache needs at least 2 pages, got {num_pages}.")
        cfg = self.model_config
        self.kv_spec = kv_cache.KVCacheSpec(cfg.num_layers, num_pages, self.config.page_size, self.layout.num_kv_heads,
                                            cfg.head_dim, np.dtype(self.dtype))
        self.kv_caches = None   # free the old pool before making the new one
        self.kv_caches = (kv_cache.abstract(self.kv_spec, self.mesh) if self._abstract
                          else kv_cache.allocate(self.kv_spec, self.mesh))

    def page_bytes_per_device(self) -> int:
        """One page of every layer's K and V, on one device (heads are split over the model axis)."""
        cfg = self.model_config
        spec = kv_cache.KVCacheSpec(cfg.num_layers, 1, self.config.page_size, self.layout.num_kv_heads,
                                    cfg.head_dim, np.dtype(self.dtype))
        return spec.bytes_per_page // self.layout.tp

    def max_useful_pages(self) -> int:
        """Every sequence at full length, plus the reserved page: more is never used."""
        return self.config.max_num_seqs * self.pages_per_seq + 1

    def memory_per_device(self) -> int:
        if self.target_chip is not None:     # a TPU, real or abstract (AOT): its HBM per device
            return self.target_chip.hbm_bytes_per_device
        memory = self.runtime.hbm_bytes_per_device or 0
        if self.runtime.kind == "cpu":
            memory = min(memory, 8 * 2**30)   # a sane host-memory budget for the stand-in
        return memory

    def kv_budget_bytes(self) -> int:
        """Bytes per device left for the KV cache: memory x memory_fraction - weights - activations."""
        weights = self.weight_bytes() // self.layout.tp
        memory = self.memory_per_device()
        budget = int(memory * self.config.memory_fraction) - weights - self.activation_bytes()
        if budget < 2 * self.page_bytes_per_device():
            raise UserError(
                f"The KV cache does not fit: {memory / 2**30:.1f} GiB per device x memory fraction "
                f"{self.config.memory_fraction} leaves {max(budget, 0) / 2**30:.2f} GiB after {weights / 2**30:.2f} GiB "
                "of weights. Raise the memory fraction, use more chips (tensor parallelism) or a smaller dtype.")
        return budget

    def budget_pages(self) -> int:
        return kv_cache.pages_for_budget(self.kv_budget_bytes(), self.page_bytes_per_device())

    def weight_bytes(self) -> int:
        leaves = jax.tree_util.tree_leaves(self.params) if hasattr(self, "params") else None
        if leaves:
            return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)
        from tpu_plugins.loader import param_shapes
        shapes = jax.tree_util.tree_leaves(param_shapes(self.model_config, self.layout), is_leaf=lambda x: isinstance(x, tuple))
        return sum(int(np.prod(s)) for s in shapes) * np.dtype(self.dtype).itemsize

    def activation_bytes(self) -> int:
        """A rough upper bound of one step's live activations, reserved before sizing the cache."""
        cfg, c = self.model_config, self.config
        mlp = cfg.intermediate_size
        if cfg.moe is not None:   # every routed (token, expert) pair's rows, for the grouped matmuls
            mlp = max(mlp, cfg.moe.experts_per_token * (cfg.moe.intermediate_size + cfg.hidden_size))
        per_token = 4 * (cfg.hidden_size * 4 + mlp * 3 + self.layout.num_heads * cfg.head_dim * 3)
        return c.max_num_batched_tokens * per_token + c.max_num_seqs * self.layout.vocab_size * 4 * 4

    # -- the step --------------------------------------------------------------------------
    def _forward(self, params, kv_caches, batch, all_logits=False):
        return decoder.forward(params, kv_caches, batch, cfg=self.model_config, layout=self.layout,
                               attn=self.attention, mesh=self.mesh, inv_freq=self.inv_freq, moe=self.moe,
                               all_logits=all_logits)

    def bucket_for(self, num_tokens: int) -> tuple[int, int]:
        for b in self.buckets:
            if num_tokens <= b:
                return b, min(b, self.config.max_num_seqs)
        raise UserError(f"A batch of {num_tokens} tokens exceeds max_num_batched_tokens "
                        f"({self.config.max_num_batched_tokens}).")

    def abstract_batch(self, tokens: int, seqs: int) -> dict:
        i32 = jnp.int32
        s = jax.ShapeDtypeStruct
        return {"token_ids": s((tokens,), i32), "positions": s((tokens,), i32), "slot_mapping": s((tokens,), i32),
                "kv_lens": s((seqs,), i32), "page_table": s((seqs, self.pages_per_seq), i32),
                "cu_q_lens": s((seqs + 1,), i32), "num_seqs": s((1,), i32), "logits_indices": s((seqs,), i32)}

    def lower(self, tokens: int, seqs: int, all_logits: bool = False):
        """The step for one bucket, lowered (not compiled): for AOT analysis and warm-up."""
        with jax.set_mesh(self.mesh):
            return self._step.lower(self.params, self.kv_caches, self.abstract_batch(tokens, seqs), all_logits=all_logits)

    def _program(self, tokens: int, seqs: int, all_logits: bool = False):
        key = (tokens, seqs, all_logits)
        program = self._programs.get(key)
        if program is None:
            if self.counters.warmed_up:
                logger.warning("tpu-plugins: compiling a step for %d tokens / %d seqs after warm-up", tokens, seqs)
            program = self.lower(tokens, seqs, all_logits).compile()
            self._programs[key] = program
        return program

    def pad_batch(self, batch: RaggedBatch) -> tuple[dict, int]:
        """Validate a host batch and pad it to its bucket. Returns (arrays, number of sequences)."""
        q_lens = np.asarray(batch.query_lens, np.int64)
        kv_lens = np.asarray(batch.kv_lens, np.int64)
        T, S = len(batch.token_ids), len(q_lens)
        c = self.config
        problems = []
        if S == 0 or T == 0:
            problems.append("the batch is empty")
        if S > c.max_num_seqs:
            problems.append(f"{S} sequences exceed max_num_seqs ({c.max_num_seqs})")
        if q_lens.sum() != T or (q_lens < 1).any():
            problems.append(f"query_lens must be >= 1 and sum to the {T} tokens (got sum {q_lens.sum()})")
        if (kv_lens < q_lens).any() or (kv_lens > self.max_model_len).any():
            problems.append(f"every kv_len must be in [query_len, max_model_len={self.max_model_len}]")
        if len(batch.positions) != T or len(batch.slot_mapping) != T or len(batch.page_tables) != S:
            problems.append("positions, slot_mapping and page_tables must match the token and sequence counts")
        if problems:
            raise UserError("Invalid batch: " + "; ".join(problems) + ".")
        tokens, seqs = self.bucket_for(T)
        out = {
            "token_ids": np.zeros(tokens, np.int32), "positions": np.zeros(tokens, np.int32),
            "slot_mapping": np.full(tokens, -1, np.int32), "kv_lens": np.zeros(seqs, np.int32),
            "page_table": np.zeros((seqs, self.pages_per_seq), np.int32),
            "cu_q_lens": np.zeros(seqs + 1, np.int32), "num_seqs": np.array([S], np.int32),
            "logits_indices": np.zeros(seqs, np.int32),
        }
        out["token_ids"][:T] = batch.token_ids
        out["positions"][:T] = batch.positions
        out["slot_mapping"][:T] = batch.slot_mapping
        out["kv_lens"][:S] = kv_lens
        cu = np.cumsum(q_lens)
        out["cu_q_lens"][1:S + 1] = cu
        out["cu_q_lens"][S + 1:] = cu[-1]
        for i, pages in enumerate(batch.page_tables):
            pages = np.asarray(pages, np.int32)[: self.pages_per_seq]
            needed = -(-int(kv_lens[i]) // c.page_size)
            if len(pages) < needed:
                raise UserError(f"Invalid batch: sequence {i} has {len(pages)} pages for {kv_lens[i]} tokens.")
            if len(pages) and (pages.min() < 0 or pages.max() >= self.kv_spec.num_pages):
                raise UserError(f"Invalid batch: sequence {i} names a page outside 0..{self.kv_spec.num_pages - 1}.")
            out["page_table"][i, : len(pages)] = pages
        if batch.logits_indices is None:
            out["logits_indices"][:S] = cu - 1
        else:
            out["logits_indices"][:S] = batch.logits_indices
        return out, S

    def execute(self, batch: RaggedBatch) -> jax.Array:
        """Run one step: writes the batch's K/V and returns logits f32 [S_bucket, vocab] on
        device, one row per sequence (rows past the batch's sequences are padding)."""
        arrays, _ = self.pad_batch(batch)
        program = self._program(len(arrays["token_ids"]), len(arrays["kv_lens"]))
        logits, self.kv_caches = program(self.params, self.kv_caches, arrays)
        self.counters.report_new_recompiles()
        return logits

    def execute_with_token_logits(self, batch: RaggedBatch) -> tuple[jax.Array, np.ndarray]:
        """As `execute`, and also every token's logits on the host ([T, vocab], unpadded), for
        prompt log-probabilities."""
        arrays, _ = self.pad_batch(batch)
        program = self._program(len(arrays["token_ids"]), len(arrays["kv_lens"]), all_logits=True)
        logits, token_logits, self.kv_caches = program(self.params, self.kv_caches, arrays)
        return logits, _to_host(token_logits)[: len(batch.token_ids), : self.model_config.vocab_size]

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole pages (every layer's K and V) from src to dst: copy-on-write for a
        scheduler's partial prefix-cache hits. Runs in fixed groups so it never recompiles."""
        for start in range(0, len(pairs), PAGE_COPY_GROUP):
            group = pairs[start:start + PAGE_COPY_GROUP]
            src = np.zeros(PAGE_COPY_GROUP, np.int32)
            dst = np.full(PAGE_COPY_GROUP, self.kv_spec.num_pages, np.int32)   # out of range: dropped
            src[: len(group)], dst[: len(group)] = zip(*group)
            self.kv_caches = _copy_pages(self.kv_caches, src, dst)

    # -- sampling --------------------------------------------------------------------------
    def sample(self, logits: jax.Array, params: list[sampling.SamplingParams], steps: list[int],
               seeds: list[int], histories: list[tuple[list[int], list[int]]] | None = None,
               allowed_mask: np.ndarray | None = None) -> sampling.SamplerOutput:
        """Sample one token per row. `steps[i]` counts row i's generated tokens (its RNG
        position); `seeds[i]` is its seed; `histories[i]` = (prompt ids, output ids) for
        penalties; `allowed_mask` [S, vocab] bool for constrained decoding."""
        rows = logits.shape[0]
        n = len(params)
        f32, i32 = np.float32, np.int32

        def col(values, dtype, fill):
            arr = np.full(rows, fill, dtype)
            arr[:n] = values
            return arr

        # Fixed shapes per row count (histories up to max_model_len, a full-vocabulary mask), so
        # the sampler is one program per bucket whatever the requests ask for. Batches that need
        # neither reuse placeholders kept on the device, so nothing large crosses per step.
        vocab = logits.shape[1]
        no_history, all_allowed = self._sampler_placeholders(rows, vocab)
        penalties = any(p.uses_penalties for p in params)
        prompt_ids = output_ids = no_history
        if penalties:
            prompt_ids = np.full((rows, self.max_model_len), -1, i32)
            output_ids = np.full((rows, self.max_model_len), -1, i32)
            for i, (p_ids, o_ids) in enumerate(histories or []):
                prompt_ids[i, : len(p_ids)] = p_ids[: self.max_model_len]
                output_ids[i, : len(o_ids)] = o_ids[: self.max_model_len]
        mask = all_allowed
        if allowed_mask is not None:
            mask = np.ones((rows, vocab), bool)
            mask[:n, : allowed_mask.shape[1]] = allowed_mask
            mask[:n, allowed_mask.shape[1]:] = False
        top = any((p.logprobs or 0) > 0 for p in params)
        out = sampling.sample(
            logits, col([p.temperature for p in params], f32, 0), col([p.top_k for p in params], i32, 0),
            col([p.top_p for p in params], f32, 1), col([p.min_p for p in params], f32, 0),
            col([s % 2**32 for s in seeds], np.uint32, 0), col(steps, i32, 0),
            col([p.repetition_penalty for p in params], f32, 1), col([p.presence_penalty for p in params], f32, 0),
            col([p.frequency_penalty for p in params], f32, 0), prompt_ids, output_ids, mask,
            np.bool_(penalties), np.bool_(allowed_mask is not None), np.bool_(top))
        tokens, lps, ranks, top_ids, top_lps = jax.device_get(out)
        self.counters.report_new_recompiles()
        return sampling.SamplerOutput(tokens[:n], lps[:n], ranks[:n], top_ids[:n] if top else None,
                                      top_lps[:n] if top else None)

    def _sampler_placeholders(self, rows: int, vocab: int):
        if rows not in self._placeholders:
            self._placeholders[rows] = (jax.device_put(np.full((rows, self.max_model_len), -1, np.int32)),
                                        jax.device_put(np.ones((rows, vocab), bool)))
        return self._placeholders[rows]

    # -- warm-up ---------------------------------------------------------------------------
    def warmup(self) -> None:
        """Compile every step bucket, the plain sampler for each, and the page copy, before serving."""
        self.copy_pages([(0, 0)])
        buckets = [(b, min(b, self.config.max_num_seqs)) for b in self.buckets]
        for tokens, seqs in tqdm(buckets, desc="Compiling step buckets", disable=not self.config.progress):
            if self.config.prompt_logprobs:
                self._program(tokens, seqs, all_logits=True)
            program = self._program(tokens, seqs)
            # Sample from logits placed exactly as the step leaves them, so serving hits this program.
            logits = jax.device_put(np.zeros((seqs, self.layout.vocab_size), np.float32), program.output_shardings[0])
            for temperature in (0.0, 1.0):
                self.sample(logits, [sampling.SamplingParams(temperature=temperature)], [0], [0])
        self.counters.after_warmup = compile_stats.snapshot()


def _to_host(array: jax.Array) -> np.ndarray:
    """An array's value on this host. One split across hosts (the vocabulary of a multi-host
    slice) is gathered from every host: a collective, so every host calls this at the same step."""
    if array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


@functools.partial(jax.jit, donate_argnums=(0,))
def _copy_pages(kv_caches, src, dst):
    return [cache.at[dst].set(cache[src], mode="drop") for cache in kv_caches]
