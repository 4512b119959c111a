"""A minimal continuous-batching loop over the engine, for the demo, tests and benchmarks.

vLLM and SGLang bring their own schedulers; this one exists so the core can generate on its
own. Each step it decodes every running request, then fills the remaining token budget with
prefill chunks (chunked prefill), allocating pages from a PageAllocator. When pages run out it
preempts the newest request, frees its pages and later recomputes it from its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tpu_plugins.batching import SeqChunk, ragged_batch
from tpu_plugins.engine import Engine
from tpu_plugins.errors import UserError
from tpu_plugins.kv_cache import PageAllocator
from tpu_plugins.sampling import SamplingParams, chunk_prompt_logprobs, fresh_seed


@dataclass(frozen=True)
class GenerationParams:
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    prompt_logprobs: int | None = None      # top-n log-probabilities of each prompt token (0: the token's own)


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str                      # "stop" or "length"
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[float | None] | None = None     # first prompt token has none
    prompt_top_logprobs: list[dict[int, float] | None] | None = None


@dataclass
class _Request:
    index: int
    prompt: list[int]
    params: GenerationParams
    seed: int
    output: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    computed: int = 0                       # tokens whose K/V is in the cache
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[dict[int, float] | None] | None = None
    finish_reason: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class OfflineGenerator:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.pages = PageAllocator(engine.kv_spec.num_pages)
        self.page_size = engine.config.page_size
        self.eos = set(engine.model_config.eos_token_ids)
        self.preemptions = 0

    def generate(self, prompts: list[list[int]], params: GenerationParams | list[GenerationParams]) -> list[Completion]:
        if isinstance(params, GenerationParams):
            params = [params] * len(prompts)
        limit = self.engine.max_model_len
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise UserError(f"Prompt {i} is empty; give at least one token.")
            if len(prompt) >= limit:
                raise UserError(f"Prompt {i} has {len(prompt)} tokens; max_model_len is {limit}, which leaves no room "
                                "to generate. Shorten the prompt or raise max_model_len.")
        waiting = deque(_Request(i, list(p), gp, gp.sampling.seed if gp.sampling.seed is not None
                                 else fresh_seed()) for i, (p, gp) in enumerate(zip(prompts, params)))
        running: list[_Request] = []
        done: list[_Request] = []
        while waiting or running:
            scheduled = self._schedule(waiting, running)
            self._run(scheduled)
            for req in [r for r, _ in scheduled if r.finish_reason]:
                running.remove(req)
                self.pages.free(req.pages)
                req.pages = []
                done.append(req)
        done.sort(key=lambda r: r.index)
        return [Completion(r.prompt, r.output, r.finish_reason, r.logprobs, r.top_logprobs,
                           r.prompt_logprobs, r.prompt_top_logprobs) for r in done]

    # -- scheduling ----------------------------------------------------------------------
    def _grow(self, req: _Request, kv_len: int) -> bool:
        need = -(-kv_len // self.page_size) - len(req.pages)
        if need <= 0:
            return True
        if need > self.pages.num_free:
            return False
        req.pages += self.pages.allocate(need)
        return True

    def _preempt(self, req: _Request, running: list[_Request], waiting: deque) -> None:
        running.remove(req)
        self.pages.free(req.pages)
        req.pages, req.computed = [], 0
        waiting.appendleft(req)
        self.preemptions += 1

    def _schedule(self, waiting: deque, running: list[_Request]) -> list[tuple[_Request, int]]:
        budget = self.engine.config.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        for req in list(running):   # decodes (and unfinished prefills), oldest first
            if req not in running:
                continue
            chunk = min(len(req.tokens) - req.computed, budget)
            while not self._grow(req, req.computed + chunk):
                victim = running[-1]
                self._preempt(victim, running, waiting)
                if victim is req:
                    break
            if req in running and chunk > 0:
                scheduled.append((req, chunk))
                budget -= chunk
        while waiting and budget > 0 and len(running) < self.engine.config.max_num_seqs:
            req = waiting[0]
            chunk = min(len(req.tokens) - req.computed, budget)
            if not self._grow(req, req.computed + chunk):
                if not running:
                    raise UserError("The KV cache is too small for even one request; give the engine more pages.")
                break
            waiting.popleft()
            running.append(req)
            scheduled.append((req, chunk))
            budget -= chunk
        return scheduled

    # -- one step ------------------------------------------------------------------------
    def _run(self, scheduled: list[tuple[_Request, int]]) -> None:
        batch = ragged_batch([SeqChunk(req.tokens[req.computed:req.computed + chunk], req.computed, req.pages)
                              for req, chunk in scheduled], self.page_size)
        wants_prompt = [r.params.prompt_logprobs is not None and r.computed < len(r.prompt) for r, _ in scheduled]
        if any(wants_prompt):
            logits, token_logits = self.engine.execute_with_token_logits(batch)
            self._record_prompt_logprobs(scheduled, wants_prompt, token_logits)
        else:
            logits = self.engine.execute(batch)
        reqs = [r for r, _ in scheduled]
        sampled = self.engine.sample(
            logits, [r.params.sampling for r in reqs], [len(r.output) for r in reqs], [r.seed for r in reqs],
            [(r.prompt, r.output) for r in reqs])
        for i, (req, chunk) in enumerate(scheduled):
            req.computed += chunk
            if req.computed < len(req.tokens):
                continue   # a prefill chunk that did not reach the end: its sample is not used
            token = int(sampled.token_ids[i])
            req.output.append(token)
            if req.params.sampling.logprobs is not None:
                req.logprobs.append(float(sampled.logprobs[i]))
                n = req.params.sampling.logprobs
                if n:
                    req.top_logprobs.append({int(t): float(lp) for t, lp in
                                             zip(sampled.top_ids[i, :n], sampled.top_logprobs[i, :n])})
            if (token in self.eos and not req.params.ignore_eos) or token in req.params.stop_token_ids:
                req.finish_reason = "stop"
            elif len(req.output) >= req.params.max_tokens or len(req.tokens) >= self.engine.max_model_len:
                req.finish_reason = "length"

    def _record_prompt_logprobs(self, scheduled, wants, token_logits: np.ndarray) -> None:
        row = 0
        for (req, chunk), want in zip(scheduled, wants):
            if want:
                if req.prompt_logprobs is None or req.computed == 0:
                    req.prompt_logprobs, req.prompt_top_logprobs = [None], [None]
                got = chunk_prompt_logprobs(token_logits[row:row + chunk], req.prompt, req.computed,
                                            req.params.prompt_logprobs)
                if got is not None:
                    req.prompt_logprobs += got.logprobs.tolist()
                    req.prompt_top_logprobs += [dict(zip(i.tolist(), v.tolist())) for i, v in zip(got.top_ids, got.top_logprobs)]
            row += chunk
