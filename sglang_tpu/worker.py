"""SGLang's TP model worker, running each ScheduleBatch on the core engine.

SGLang's scheduler hands the worker a `ScheduleBatch`: its requests, this step's token ids
(prefill chunks, or one token per request when decoding), and each request's token slots in
`req_to_token` (radix-cache prefix first, then the slots allocated for this step). The engine's
KV cache has SGLang's page size and one page per SGLang page (slot = page * page_size + offset),
so every page_size-th slot of a request, divided by the page size, is its page table:
radix-cache hits, chunked prefill, eviction and retraction need nothing here. The worker samples with the core's sampler (greedy, temperature, top-k/p, min-p,
penalties, seeds, logprobs) under SGLang's grammar bitmask, and returns the tokens as the
int64 host tensor SGLang feeds back as the next decode's input.

Tensor parallelism (`--tp-size N`) is the core's mesh in this one process; SGLang sees one worker.

A request whose preparation raises (its sampling settings, its seed) fails alone: it is
finished as SGLang's own abort with status 500 and its message (its row of this step runs
greedily and is thrown away); the batch and the scheduler go on.
"""

from __future__ import annotations

import hashlib
import logging
from http import HTTPStatus

import numpy as np
import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult

from tpu_plugins import sampling, settings
from tpu_plugins.batching import SeqChunk, ragged_batch
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.request_faults import attempt, check_injected_fault
from sglang_tpu.platform import DTYPES

logger = logging.getLogger(__name__)

TOP_K_ALL = 1 << 30   # SGLang's "no top-k"


def engine_dtype(requested: str, model_dtype) -> str:
    """SGLang's --dtype (checked by the platform at start-up) -> the core's."""
    if requested == "auto":
        return "float32" if model_dtype == torch.float32 else "bfloat16"
    return DTYPES[requested]


def core_params(req) -> sampling.SamplingParams:
    p = req.sampling_params
    greedy = p.top_k == 1 or p.temperature < 1e-5
    top_n = req.logprob.top_logprobs_num if req.return_logprob and req.logprob is not None else None
    return sampling.SamplingParams(
        temperature=0.0 if greedy else p.temperature, top_k=0 if p.top_k in (-1, TOP_K_ALL) else p.top_k,
        top_p=p.top_p, min_p=p.min_p, repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        logprobs=min(top_n or 0, sampling.MAX_LOGPROBS) if req.return_logprob else None)


def stop_token_ids(req) -> set[int]:
    """Every token that would end the request (SGLang's own rule for min_new_tokens)."""
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    tokenizer = req.tokenizer
    if tokenizer is not None:
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
    return ids


class TpuTpModelWorker(TpModelWorker):
    def _init_model_runner(self):
        from sglang_tpu.model_runner import TpuModelRunner

        from sglang.srt.runtime_context import get_model, get_schedule

        # Resolved settings (the platform's defaults included) live in SGLang's runtime context.
        sched, model = get_schedule(), get_model()
        page_size = sched.page_size or 1
        running = sched.max_running_requests or 64
        # A prefill batch holds at most one chunk of tokens (the whole context when chunking is off).
        chunk = sched.chunked_prefill_size if sched.chunked_prefill_size and sched.chunked_prefill_size > 0 \
            else self.model_config.context_len
        config = EngineConfig(
            model=model.model_path, dtype=engine_dtype(model.dtype, self.model_config.dtype),
            max_model_len=self.model_config.context_len, max_num_seqs=running,
            max_num_batched_tokens=max(chunk, running), page_size=page_size,
            memory_fraction=sched.mem_fraction_static or 0.9,
            tensor_parallel_size=settings.sglang_mesh_tp(), expert_parallel_size=settings.sglang_mesh_ep(),
            # --quantization int8 quantizes at load; compressed-tensors checkpoints are read as they are
            quantization="int8" if self.server_args.quantization == "int8" else None, progress=False,
            prompt_logprobs=True)   # any request may ask for prompt logprobs: warm those programs too
        self.engine = Engine(config, defer_kv_cache=True)
        pages = min(self.engine.budget_pages(), self.engine.max_useful_pages())
        if sched.max_total_tokens:
            pages = min(pages, sched.max_total_tokens // page_size + 1)
        self.engine.allocate_kv_cache(pages)   # page 0: the padding page, as in SGLang's allocator
        self.engine.warmup()
        self._model_runner = TpuModelRunner(
            model_config=self.model_config, mem_fraction_static=sched.mem_fraction_static, gpu_id=self.gpu_id,
            nccl_port=self.nccl_port, server_args=self.server_args, is_draft_worker=self.is_draft_worker,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            memory_pool_config=self.memory_pool_config, kv_slots=(pages - 1) * page_size,
            max_running_requests=config.max_num_seqs)

    def get_pad_input_ids_func(self):
        return None

    def init_cuda_graphs(self):
        pass

    def init_attention_backends(self):
        pass

    # -- one step -----------------------------------------------------------------------------
    def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False,
                                 skip_attn_backend_init=None, *, capture_hidden_mode=None, **kwargs):
        reqs = batch.reqs
        if not reqs or batch.forward_mode.is_idle():
            return GenerationBatchResult(logits_output=LogitsProcessorOutput(next_token_logits=None),
                                         next_token_ids=torch.empty(0, dtype=torch.int64))
        seq_lens = batch.seq_lens_cpu.tolist()
        if batch.forward_mode.is_extend():
            starts, counts = list(batch.prefix_lens), list(batch.extend_lens)
        else:
            starts, counts = [n - 1 for n in seq_lens], [1] * len(reqs)
        input_ids = batch.input_ids.cpu().numpy()
        table = self.model_runner.req_to_token_pool.req_to_token
        pool_rows = batch.req_pool_indices.cpu().tolist()
        page_size = self.engine.config.page_size
        chunks, offset = [], 0
        for row, start, count, length in zip(pool_rows, starts, counts, seq_lens):
            pages = table[row, :length:page_size].numpy() // page_size
            chunks.append(SeqChunk(input_ids[offset:offset + count], start, pages))
            offset += count
        ragged = ragged_batch(chunks, page_size)

        wants_prompt_logprobs = batch.return_logprob and batch.forward_mode.is_extend() and any(
            count > start for count, start in zip(counts, batch.extend_logprob_start_lens))
        if wants_prompt_logprobs:
            logits, token_logits = self.engine.execute_with_token_logits(ragged)
        else:
            logits, token_logits = self.engine.execute(ragged), None

        params, seeds = self._prepare(reqs, batch.forward_mode.is_extend())
        out = self.engine.sample(
            logits, params, [len(r.output_ids) for r in reqs], seeds,
            [(r.origin_input_ids, r.output_ids) for r in reqs] if any(p.uses_penalties for p in params) else None,
            self._allowed_tokens(batch))
        result = LogitsProcessorOutput(next_token_logits=None)
        if batch.return_logprob:
            self._fill_logprobs(result, batch, out, params, counts, token_logits)
        return GenerationBatchResult(logits_output=result,
                                     next_token_ids=torch.as_tensor(np.asarray(out.token_ids), dtype=torch.int64))

    def _prepare(self, reqs, prefill: bool) -> tuple[list[sampling.SamplingParams], list[int]]:
        """Each request's sampling settings and seed; a request whose preparation fails is aborted alone."""
        params, seeds = [], []
        for req in reqs:
            def prepare(req=req):
                if prefill:
                    check_injected_fault(req.origin_input_ids)
                return core_params(req), self._seed(req)

            prepared, error = attempt(req.rid, prepare)
            if error:
                req.to_finish = FINISH_ABORT(error, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
                prepared = sampling.SamplingParams(temperature=0.0), 0
            params.append(prepared[0])
            seeds.append(prepared[1])
        return params, seeds

    @staticmethod
    def _seed(req) -> int:
        seed = req.sampling_params.sampling_seed
        if seed is None:   # unseeded: from the request id (random per request), so nothing is stored
            seed = int.from_bytes(hashlib.blake2b(req.rid.encode(), digest_size=8).digest(), "little")
        return seed

    def _allowed_tokens(self, batch) -> np.ndarray | None:
        """bool [requests, vocab]: SGLang's grammar bitmask, and stop tokens banned for requests
        short of their min_new_tokens. None when nothing is constrained."""
        vocab = self.engine.model_config.vocab_size
        mask = None
        if batch.has_grammar:
            info = batch.sampling_info
            info.grammars = [r.grammar for r in batch.reqs]
            info.update_regex_vocab_mask()
            grammar, info.grammar_mask = info.grammar_mask, None
            if grammar is not None:
                mask = sampling.unpack_token_bitmask(grammar.vocab_mask.cpu().numpy(), vocab)
        for i, req in enumerate(batch.reqs):
            if len(req.output_ids) < (req.sampling_params.min_new_tokens or 0):
                if mask is None:
                    mask = np.ones((len(batch.reqs), vocab), bool)
                banned = [t for t in stop_token_ids(req) if 0 <= t < vocab]
                mask[i, banned] = False
        return mask

    def _fill_logprobs(self, result, batch, out, params, counts, token_logits) -> None:
        """SGLang's shapes: one logprob per request; per-request rows of top-n; for prompt
        logprobs one flat tensor over every request's positions [start, extend_len)."""
        result.next_token_logprobs = torch.as_tensor(np.asarray(out.logprobs, np.float32))
        tops = batch.top_logprobs_nums or [0] * len(batch.reqs)
        empty_f, empty_i = torch.empty(0), torch.empty(0, dtype=torch.int64)
        if any(tops):
            result.next_token_top_logprobs_val = [torch.as_tensor(out.top_logprobs[i, :k]) if k else empty_f
                                                  for i, k in enumerate(tops)]
            result.next_token_top_logprobs_idx = [torch.as_tensor(out.top_ids[i, :k]) if k else empty_i
                                                  for i, k in enumerate(tops)]
        if not batch.forward_mode.is_extend():
            return
        starts = batch.extend_logprob_start_lens
        next_ids = batch.extend_input_logprob_token_ids
        next_ids = next_ids.numpy() if next_ids is not None else np.zeros(sum(counts), np.int64)
        values, top_vals, top_idx, offset, cursor = [], [], [], 0, 0
        for count, start, k in zip(counts, starts, tops):
            n = max(count - start, 0)
            if n and token_logits is not None:
                lp = sampling.prompt_logprobs(token_logits[offset + start: offset + count],
                                              next_ids[cursor: cursor + n], max(k, 1))
                values.append(lp.logprobs)
                top_vals.append([row[:k].tolist() for row in lp.top_logprobs] if k else [])
                top_idx.append([row[:k].tolist() for row in lp.top_ids] if k else [])
            else:
                top_vals.append([])
                top_idx.append([])
            offset += count
            cursor += n
        result.input_token_logprobs = torch.as_tensor(np.concatenate(values) if values else np.zeros(0, np.float32))
        if any(tops):
            result.input_top_logprobs_val, result.input_top_logprobs_idx = top_vals, top_idx
