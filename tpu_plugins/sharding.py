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
    """Heads and vocabulary as laid out for one tensor-parallel size.

    The query heads are `groups` GQA groups of `q_per_group` heads each (zero-padded where the
    model has fewer); each group's KV head is stored `kv_replicas` times, so chip c holds whole
    groups, or an equal share of one group's query heads next to its own KV copy.
    """

    tp: int
    groups: int           # GQA groups after padding
    q_per_group: int      # query heads per group after padding
    kv_replicas: int      # copies of each KV head
    vocab_size: int       # vocabulary, padded to a multiple of tp

    @property
    def num_heads(self) -> int:
        return self.groups * self.q_per_group

    @property
    def num_kv_heads(self) -> int:
        return self.groups * self.kv_replicas

    @property
    def q_per_kv(self) -> int:
        return self.q_per_group // self.kv_replicas


def head_layout(cfg: ModelConfig, tp: int) -> HeadLayout:
    """The cheapest layout (fewest query heads, then fewest KV heads) of:
    split as is; replicate each KV head when chips outnumber them (padding each group's query
    heads to a multiple of the copies); or pad with whole zero groups."""
    vocab = -(-cfg.vocab_size // tp) * tp
    groups, qpk = cfg.num_kv_heads, cfg.q_per_kv
    options = [HeadLayout(tp, -(-groups // tp) * tp, qpk, 1, vocab)]        # as is, or padded groups
    if tp % groups == 0 and tp > groups:
        replicas = tp // groups
        options.append(HeadLayout(tp, groups, -(-qpk // replicas) * replicas, replicas, vocab))
    return min(options, key=lambda layout: (layout.num_heads, layout.num_kv_heads))
