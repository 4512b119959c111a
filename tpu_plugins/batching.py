"""Building a RaggedBatch from scheduler-side facts: for each sequence, the tokens to run this
step, the position of the first of them, and the sequence's page list.

Used by every scheduler that hands out pages (our offline loop, vLLM's block tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tpu_plugins.engine import RaggedBatch


@dataclass(frozen=True)
class SeqChunk:
    token_ids: Sequence[int]   # this step's tokens of the sequence
    start: int                 # position of the first of them (= tokens already in the cache)
    pages: Sequence[int]       # the sequence's page table, covering at least start + len(token_ids)


def ragged_batch(chunks: Sequence[SeqChunk], page_size: int) -> RaggedBatch:
    ids, positions, slots, q_lens, kv_lens, tables = [], [], [], [], [], []
    for chunk in chunks:
        n = len(chunk.token_ids)
        pos = np.arange(chunk.start, chunk.start + n)
        pages = np.asarray(chunk.pages, np.int64)
        ids.append(np.asarray(chunk.token_ids, np.int64))
        positions.append(pos)
        slots.append(pages[pos // page_size] * page_size + pos % page_size)
        q_lens.append(n)
        kv_lens.append(chunk.start + n)
        tables.append(chunk.pages)
    return RaggedBatch(np.concatenate(ids), np.concatenate(positions), np.concatenate(slots),
                       np.asarray(q_lens), np.asarray(kv_lens), tables)
