"""Tensor parallelism as data: how each weight is laid out over the mesh's model axis.

Heads, the MLP intermediate and the vocabulary are split over `model`. When the heads do not
divide, whole GQA groups are padded with zero heads (a group = one KV head and the query
heads that read it), so every chip holds the same number of complete groups and the
attention kernel sees a uniform query-per-KV ratio. Zero query heads produce zero outputs and
their rows of o_proj are zero, so results are unchanged; the cost is the padded heads' work.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

from dataclasses import dataclass

from jax.sharding import PartitionSpec as P

from tpu_plugins.mesh import MODEL
from tpu_plugins.models.config import ModelConfig

# Logical weight name -> how it is split. Weights are stored [in, out].
RULES: dict[str, P] = {
    "embed": P(MODEL, None),        # [vocab, hidden]: vocabulary split
    "lm_head": P(None, MODEL),      # [hidden, vocab]
    "q": P(None, MODEL), "k": P(None, MODEL), "v": P(None, MODEL),   # heads split
    "q_bias": P(MODEL), "k_bias": P(MODEL), "v_bias": P(MODEL),
    "o": P(MODEL, None),            # [heads * head_dim, hidden]: contraction split, all-reduce after
    "gate": P(None, MODEL), "up": P(None, MODEL),                      # intermediate split
    "down": P(MODEL, None),
    "input_norm": P(), "post_attn_norm": P(), "final_norm": P(), "q_norm": P(), "k_norm": P(),
}
KV_CACHE = P(None, None, MODEL, None)   # [pages, page_size, 2 * kv_heads, head_dim]: heads split
HEADS = P(None, MODEL, None)            # activations [tokens, heads, head_dim]


@dataclass(frozen=True)
class HeadLayout:
    """Head and vocabulary counts as laid out for one tensor-parallel size."""

    tp: int
    num_heads: int        # query heads, after padding
    num_kv_heads: int     # KV heads, after replication or padding
    kv_replicas: int      # copies of each original KV head (1 unless replicated)
    vocab_size: int       # vocabulary, padded to a multiple of tp

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


def head_layout(cfg: ModelConfig, tp: int) -> HeadLayout:
    """Choose how heads spread over `tp` chips, cheapest first:
    split as is; replicate each KV head when the chips outnumber them and each group's query
    heads divide among the copies; otherwise pad with whole zero groups."""
    vocab = -(-cfg.vocab_size // tp) * tp
    groups, qpk = cfg.num_kv_heads, cfg.q_per_kv
    if groups % tp == 0:
        return HeadLayout(tp, cfg.num_heads, groups, 1, vocab)
    if tp % groups == 0 and qpk % (tp // groups) == 0:
        replicas = tp // groups
        return HeadLayout(tp, cfg.num_heads, groups * replicas, replicas, vocab)
    padded = -(-groups // tp) * tp
    return HeadLayout(tp, padded * qpk, padded, 1, vocab)
