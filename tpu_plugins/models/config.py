"""ModelConfig: the architecture facts the core needs, read from a Hugging Face config.json.

One decoder (models/decoder.py) serves every family; what differs between Llama, Mistral,
Qwen2, Qwen3 and the mixture-of-experts Mixtral and Qwen3-MoE is data here (biases, q/k
norms, sliding window, experts), chosen by the `architectures` entry through the FAMILIES table.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tpu_plugins.errors import UserError


@dataclass(frozen=True)
class Family:
    qkv_bias: bool = False     # Qwen2: biases on q, k and v projections
    qk_norm: bool = False      # Qwen3: RMSNorm on each head's q and k before RoPE
    uses_sliding_window: bool = False  # Mistral/Qwen2 configs may set sliding_window
    # Mixture of experts, and whether its top-k routing weights are renormalised when the
    # config does not say.
    moe: bool = False
    norm_topk_default: bool = True


# Keyed by the `architectures` entry of config.json.
FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(uses_sliding_window=True),
    "Qwen2ForCausalLM": Family(qkv_bias=True, uses_sliding_window=True),
    "Qwen3ForCausalLM": Family(qk_norm=True, uses_sliding_window=True),
    "MixtralForCausalLM": Family(uses_sliding_window=True, moe=True),
    # transformers' Qwen3MoeConfig defaults norm_topk_prob to False; released checkpoints set True.
    "Qwen3MoeForCausalLM": Family(qk_norm=True, uses_sliding_window=True, moe=True,
                                  norm_topk_default=False),
}


@dataclass(frozen=True)
class MoeConfig:
    """Top-k routed experts (no shared expert): softmax over every expert's router logit, keep
    the k largest, renormalise them if `norm_topk_prob`, and sum the k experts' SwiGLU outputs."""

    num_experts: int
    experts_per_token: int
    intermediate_size: int           # each expert's FFN width
    norm_topk_prob: bool
    dense_layers: tuple[int, ...] = ()   # layers with a plain MLP instead (Qwen3-MoE mlp_only_layers / sparse step)


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"                  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    family: Family
    sliding_window: int | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoeConfig | None = None
    hf: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index not in self.moe.dense_layers

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        archs = hf.get("architectures") or []
        arch = next((a for a in archs if a in FAMILIES), None)
        if arch is None:
            raise UserError(
                f"Unsupported architecture {archs or hf.get('model_type')!r}. "
                f"Supported: {', '.join(sorted(FAMILIES))}."
            )
        family = FAMILIES[arch]
        heads = hf["num_attention_heads"]
        kv_heads = hf.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise UserError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}.")
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        kind = rope.get("rope_type", rope.get("type", "default")) or "default"
        if kind not in ("default", "llama3"):
            raise UserError(f"RoPE type {kind!r} is not supported yet; supported: default, llama3.")
        scaling = RopeScaling(
            kind=kind,
            factor=float(rope.get("factor", 1.0)),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
        )
        window = hf.get("sliding_window") if family.uses_sliding_window else None
        if window is not None and hf.get("use_sliding_window") is False:
            window = None  # Qwen2/3 configs carry a window size but switch it off
        moe = _moe_config(hf, family) if family.moe else None
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            family=family,
            sliding_window=int(window) if window else None,
            attn_logit_softcap=hf.get("attn_logit_softcapping"),
            final_logit_softcap=hf.get("final_logit_softcapping"),
            eos_token_ids=eos_ids,
            moe=moe,
            hf=hf,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> "ModelConfig":
        """From a model folder or a config.json file."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise UserError(f"No config.json at {path}; pass a Hugging Face model folder or a config.json file.")
        try:
            return cls.from_hf(json.loads(file.read_text()))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UserError(f"{file} is not a usable Hugging Face config ({type(exc).__name__}: {exc}).") from None


def _moe_config(hf: dict, family: Family) -> MoeConfig:
    # Released configs name the count num_experts (Qwen3-MoE) or num_local_experts (Mixtral);
    # transformers 5 saves both families with num_local_experts.
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    if not experts:
        raise UserError(f"{hf['architectures']} config has no expert count (num_experts or num_local_experts).")
    experts, top_k = int(experts), int(hf["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise UserError(f"num_experts_per_tok={top_k} must be between 1 and the expert count {experts}.")
    layers = hf["num_hidden_layers"]
    step = int(hf.get("decoder_sparse_step") or 1)
    dense = {i for i in range(layers) if (i + 1) % step} | set(hf.get("mlp_only_layers") or ())
    return MoeConfig(num_experts=experts, experts_per_token=top_k,
                     intermediate_size=int(hf.get("moe_intermediate_size") or hf["intermediate_size"]),
                     norm_topk_prob=bool(hf.get("norm_topk_prob", family.norm_topk_default)),
                     dense_layers=tuple(sorted(dense)))
