"""Tensor and expert parallelism as data: how each weight is laid out over the mesh.

Heads, the MLP intermediate and the vocabulary are split over every chip of the slice: the
`expert` and `model` mesh axes together (TP below; with no expert parallelism the expert axis
has size 1 and this is plain tensor parallelism over `model`). A mixture-of-experts layer
splits its experts over `expert` and each expert's intermediate over `model`, so a mesh of
expert=E x model=M runs attention with tensor parallelism E*M and the experts with E-way
expert parallelism (vLLM's --enable-expert-parallel is expert=TP, model=1).

When the heads do not divide, whole GQA groups are padded with zero heads (a group = one KV
head and the query heads that read it), so every chip holds the same number of complete
groups and the attention kernel sees a uniform query-per-KV ratio. Zero query heads produce
zero outputs and their rows of o_proj are zero, so results are unchanged; the cost is the
padded heads' work.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

from dataclasses import dataclass

from jax.sharding import PartitionSpec as P

from tpu_plugins.mesh import EXPERT, MODEL
from tpu_plugins.models.config import ModelConfig

TP = (EXPERT, MODEL)   # every chip: the axes heads, the dense MLP and the vocabulary are split over

# Logical weight name -> how it is split. Weights are stored [in, out]; experts [expert, in, out].
RULES: dict[str, P] = {
    "embed": P(TP, None),           # [vocab, hidden]: vocabulary split
    "lm_head": P(None, TP),         # [hidden, vocab]
    "q": P(None, TP), "k": P(None, TP), "v": P(None, TP),   # heads split
    "q_bias": P(TP), "k_bias": P(TP), "v_bias": P(TP),
    "o": P(TP, None),               # [heads * head_dim, hidden]: contraction split, all-reduce after
    "gate": P(None, TP), "up": P(None, TP),                # intermediate split
    "down": P(TP, None),
    "input_norm": P(), "post_attn_norm": P(), "final_norm": P(), "q_norm": P(), "k_norm": P(),
    "router": P(),                  # [hidden, experts]: every chip routes every token
    "experts_gate": P(EXPERT, None, MODEL), "experts_up": P(EXPERT, None, MODEL),
    "experts_down": P(EXPERT, MODEL, None),
}
KV_CACHE = P(None, None, TP, None)   # [pages, page_size, 2 * kv_heads, head_dim]: heads split
HEADS = P(None, TP, None)            # activations [tokens, heads, head_dim]


def scale_rule(name: str) -> P:
    """The split of an int8 weight's per-output-channel scale ([out], experts [expert, out]):
    its weight's split without the contraction (input) axis."""
    rule = RULES[name]
    if name.startswith("experts_"):
        axes = tuple(rule) + (None,) * (3 - len(rule))
        return P(axes[0], axes[2])
    axes = tuple(rule) + (None,) * (2 - len(rule))
    return P(axes[1])


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
