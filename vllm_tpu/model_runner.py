"""Maps vLLM's SchedulerOutput onto the core's ragged step, and the samples back to ModelRunnerOutput.

Per request we keep what vLLM's scheduler does not resend: the prompt, the tokens sampled so
far (with async scheduling the next step is scheduled before its input token is known to the
scheduler, so the runner remembers it), the block table, and the sampling settings.
`execute_model` runs the step and keeps the logits; `sample_tokens` applies vLLM's grammar
bitmask and min_tokens / allowed_token_ids as a token mask, samples on device, and reports.

A request whose preparation raises (its sampling settings, its chunk) fails alone: it leaves
the step, is reported to the scheduler as a request error (request_errors.py), and is skipped
until the scheduler lists it as finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, LogprobsLists, LogprobsTensors, ModelRunnerOutput

from tpu_plugins.batching import SeqChunk, ragged_batch
from tpu_plugins.engine import Engine
from tpu_plugins.request_faults import attempt, check_injected_fault
from tpu_plugins.sampling import chunk_prompt_logprobs, fresh_seed, unpack_token_bitmask
from vllm_tpu import request_errors
from vllm_tpu.sampling import to_core


@dataclass
class _Request:
    prompt: list[int]
    params: object                      # vLLM SamplingParams
    pages: list[int]
    seed: int
    output: list[int] = field(default_factory=list)
    prompt_lp: list | None = field(default_factory=list)   # PromptLogprobs chunks; None once reported

    def __post_init__(self):
        self.core = to_core(self.params)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class _Step:
    req_ids: list[str]
    completes: list[bool]               # False for a prefill chunk that does not reach the end
    logits: object                      # device array, one row per request (None: no request left)
    failed: list[str]                   # scheduled, but failed: reported with no token


class TpuModelRunner:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.requests: dict[str, _Request] = {}
        self.failed: set[str] = set()             # failed, not yet finished by the scheduler
        self._unreported: dict[str, str] = {}     # failures the scheduler has not been told of
        self._step: _Step | None = None

    # -- state -------------------------------------------------------------------------------
    def _update(self, so) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            self.failed.discard(req_id)
        for new in so.scheduled_new_reqs:
            req, error = attempt(new.req_id, lambda: self._admit(new))
            if error:
                self._fail(new.req_id, error)
            else:
                self.requests[new.req_id] = req
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in self.failed:
                continue
            req = self.requests[req_id]
            blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                req.pages = list(blocks[0]) if blocks else []
                if req_id in cached.all_token_ids:
                    req.output = list(cached.all_token_ids[req_id][len(req.prompt):])
            elif blocks:
                req.pages += blocks[0]

    @staticmethod
    def _admit(new) -> _Request:
        check_injected_fault(new.prompt_token_ids)
        seed = new.sampling_params.seed
        return _Request(prompt=list(new.prompt_token_ids), params=new.sampling_params, pages=list(new.block_ids[0]),
                        seed=seed if seed is not None else fresh_seed())

    def _fail(self, req_id: str, message: str) -> None:
        self.requests.pop(req_id, None)
        self.failed.add(req_id)
        self._unreported[req_id] = message

    # -- the step ----------------------------------------------------------------------------
    def execute_model(self, so):
        self._update(so)
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        if so.kv_cache_block_copies:
            self.engine.copy_pages([(c.src_block_id, c.dst_block_id) for c in so.kv_cache_block_copies])
        computed = dict(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        computed.update((new.req_id, new.num_computed_tokens) for new in so.scheduled_new_reqs)
        req_ids, chunks, completes, prompt_rows = [], [], [], []
        for req_id in so.num_scheduled_tokens:
            if req_id in self.failed:
                continue
            req, start, n = self.requests[req_id], computed[req_id], so.num_scheduled_tokens[req_id]
            chunk, error = attempt(req_id, lambda: self._chunk(req, start, n))
            if error:
                self._fail(req_id, error)
                continue
            req_ids.append(req_id)
            chunks.append(chunk)
            completes.append(start + n >= len(req.prompt) + len(req.output))
            prompt_rows.append(req.params.prompt_logprobs is not None and req.prompt_lp is not None
                               and start < len(req.prompt))
        failed = [r for r in so.num_scheduled_tokens if r in self.failed]
        if not chunks:
            self._step = _Step([], [], None, failed)
            return None
        batch = ragged_batch(chunks, self.engine.config.page_size)
        if any(prompt_rows):
            logits, token_logits = self.engine.execute_with_token_logits(batch)
            self._collect_prompt_logprobs(req_ids, chunks, prompt_rows, token_logits)
        else:
            logits = self.engine.execute(batch)
        self._step = _Step(req_ids, completes, logits, failed)
        return None

    def _chunk(self, req: _Request, start: int, n: int) -> SeqChunk:
        tokens = req.tokens
        if start + n > len(tokens):
            raise RuntimeError(f"tokens {start}..{start + n} were scheduled; the request has {len(tokens)}")
        if start + n > len(req.pages) * self.engine.config.page_size:
            raise RuntimeError(f"{len(req.pages)} KV pages cannot hold {start + n} tokens")
        return SeqChunk(tokens[start:start + n], start, req.pages)

    def _collect_prompt_logprobs(self, req_ids, chunks, wanted, token_logits) -> None:
        row = 0
        for req_id, chunk, want in zip(req_ids, chunks, wanted):
            n = len(chunk.token_ids)
            if want:
                req = self.requests[req_id]
                if chunk.start == 0:
                    req.prompt_lp = []
                got = chunk_prompt_logprobs(token_logits[row:row + n], req.prompt, chunk.start,
                                            req.params.prompt_logprobs)
                if got is not None:
                    req.prompt_lp.append(got)
            row += n

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        step, self._step = self._step, None
        if step is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        failures, self._unreported = self._unreported, {}
        if step.logits is None:   # every scheduled request failed
            return request_errors.attach(ModelRunnerOutput(
                req_ids=step.failed, req_id_to_index={r: i for i, r in enumerate(step.failed)},
                sampled_token_ids=[[] for _ in step.failed]), failures)
        reqs = [self.requests[r] for r in step.req_ids]
        mask = self._token_mask(step.req_ids, reqs, grammar_output)
        out = self.engine.sample(step.logits, [r.core for r in reqs], [len(r.output) for r in reqs],
                                 [r.seed for r in reqs], [(r.prompt, r.output) for r in reqs], mask)
        sampled, prompt_lps = [], {}
        for i, (req_id, req, complete) in enumerate(zip(step.req_ids, reqs, step.completes)):
            if not complete:
                sampled.append([])
                continue
            token = int(out.token_ids[i])
            req.output.append(token)
            sampled.append([token])
            if req.params.prompt_logprobs is not None and req.prompt_lp is not None:
                prompt_lps[req_id] = _prompt_logprobs_tensors(req.prompt, req.prompt_lp)
                req.prompt_lp = None   # reported once, when the prompt is done
        req_ids = step.req_ids + step.failed   # failed ones last: logprob rows stay aligned with the others
        return request_errors.attach(ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled + [[] for _ in step.failed], logprobs=_logprobs_lists(reqs, out),
            prompt_logprobs_dict=prompt_lps), failures)

    def _token_mask(self, req_ids, reqs, grammar_output) -> np.ndarray | None:
        vocab = self.engine.model_config.vocab_size
        mask = None

        def row(i):
            nonlocal mask
            if mask is None:
                mask = np.ones((len(reqs), vocab), bool)
            return mask[i]

        if grammar_output is not None and len(grammar_output.structured_output_request_ids):
            allowed = unpack_token_bitmask(grammar_output.grammar_bitmask, vocab)
            index = {r: i for i, r in enumerate(req_ids)}
            for k, req_id in enumerate(grammar_output.structured_output_request_ids):
                if req_id in index:
                    row(index[req_id])[:] &= allowed[k]
        for i, req in enumerate(reqs):
            p = req.params
            if p.allowed_token_ids:
                keep = np.zeros(vocab, bool)
                keep[[t for t in p.allowed_token_ids if 0 <= t < vocab]] = True
                row(i)[:] &= keep
            if p.min_tokens and len(req.output) < p.min_tokens:
                stops = [t for t in p.all_stop_token_ids if 0 <= t < vocab]
                row(i)[stops] = False
        return mask


def _logprobs_lists(reqs, out) -> LogprobsLists | None:
    wanted = [r.params.logprobs for r in reqs if r.params.logprobs is not None]
    if not wanted:
        return None
    width = max(wanted) + 1
    ids = np.zeros((len(reqs), width), np.int32)
    lps = np.zeros((len(reqs), width), np.float32)
    ids[:, 0], lps[:, 0] = out.token_ids, out.logprobs
    if width > 1:
        ids[:, 1:], lps[:, 1:] = out.top_ids[:, : width - 1], out.top_logprobs[:, : width - 1]
    return LogprobsLists(ids, lps, np.asarray(out.ranks, np.int32))


def _prompt_logprobs_tensors(prompt: list[int], chunks) -> LogprobsTensors:
    """vLLM's layout: [prompt_len - 1, n + 1], column 0 the actual prompt token."""
    n = chunks[0].top_ids.shape[1] if chunks else 0
    lps = np.concatenate([c.logprobs for c in chunks]) if chunks else np.zeros(0, np.float32)
    ids = np.zeros((len(lps), n + 1), np.int32)
    values = np.zeros((len(lps), n + 1), np.float32)
    ids[:, 0], values[:, 0] = prompt[1:len(lps) + 1], lps
    if n:
        ids[:, 1:] = np.concatenate([c.top_ids for c in chunks])
        values[:, 1:] = np.concatenate([c.top_logprobs for c in chunks])
    ranks = np.concatenate([c.ranks for c in chunks]) if chunks else np.zeros(0, np.int32)
    return LogprobsTensors(_host_tensor(ids), _host_tensor(values), _host_tensor(ranks))


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """numpy gives a zero-size array stride 0, and vLLM's output encoder (which views each tensor
    as bytes) fails on it, killing the engine's output thread: a one-token prompt with prompt
    logprobs has no rows. Zero-size tensors are made fresh, with ordinary strides."""
    tensor = torch.from_numpy(array)
    return tensor if array.size else torch.empty(array.shape, dtype=tensor.dtype)
