"""Traffic for the load tests: varied OpenAI requests, sent one at a time or all at once, streamed.

`request_specs` makes a fixed set of completions and chat requests with prompts from a few words
to a few hundred tokens and output lengths from 1 to 48 tokens, all greedy. `send_all` streams
many of them concurrently (one asyncio task and one connection each) and reassembles each
stream: its text, its finish reason, the usage the server reports, and whether `[DONE]` came.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import aiohttp
import requests

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

_SUBJECTS = ["the sea", "tensor processing units", "a small village", "prime numbers", "the moon landing",
             "a recipe for bread", "the history of Rome", "compilers", "a cat and a dog", "mountain weather",
             "the French revolution", "how rain forms", "a chess opening", "the speed of light", "gardening",
             "an old lighthouse"]
_FORMS = ["Write a short story about {}.", "Explain {} to a child.", "List three facts about {}.",
          "Once upon a time, {} was", "Here is a poem about {}:", "Q: What do you know about {}?\nA:"]


@dataclass(frozen=True)
class Spec:
    endpoint: str
    body: dict

    def streaming(self) -> dict:
        return {**self.body, "stream": True, "stream_options": {"include_usage": True}}


@dataclass
class Answer:
    text: str
    finish_reason: str | None
    completion_tokens: int | None
    done: bool = True            # the stream ended with [DONE] (always True for a non-streamed answer)


def request_specs(model: str, count: int, seed: int = 0) -> list[Spec]:
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        topic = _SUBJECTS[rng.randrange(len(_SUBJECTS))]
        text = _FORMS[rng.randrange(len(_FORMS))].format(topic)
        if rng.random() < 0.25:   # a long prompt: a few hundred tokens of context first
            text = " ".join(f"Note {k}: {rng.choice(_SUBJECTS)}." for k in range(rng.randrange(10, 30))) + " " + text
        fields = {"model": model, "max_tokens": rng.randrange(1, 49), "temperature": 0}
        if i % 2:
            specs.append(Spec(CHAT, {**fields, "messages": [{"role": "user", "content": text}]}))
        else:
            specs.append(Spec(COMPLETIONS, {**fields, "prompt": text}))
    return specs


def send_one(base_url: str, spec: Spec, timeout: float = 300) -> Answer:
    response = requests.post(base_url + spec.endpoint, json=spec.body, timeout=timeout)
    response.raise_for_status()
    body = response.json()
    choice = body["choices"][0]
    text = choice["message"]["content"] if spec.endpoint == CHAT else choice["text"]
    return Answer(text or "", choice["finish_reason"], body["usage"]["completion_tokens"])


async def _stream(session: aiohttp.ClientSession, base_url: str, spec: Spec) -> Answer:
    pieces, finish, usage, done = [], None, None, False
    async with session.post(base_url + spec.endpoint, json=spec.streaming()) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:500]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or []:
                piece = choice["delta"].get("content") if spec.endpoint == CHAT else choice.get("text")
                pieces.append(piece or "")
                finish = choice.get("finish_reason") or finish
    return Answer("".join(pieces), finish, usage, done)


async def _stream_all(base_url: str, specs: list[Spec], timeout: float) -> list[Answer | BaseException]:
    connector = aiohttp.TCPConnector(limit=0)   # one connection per stream, all open at once
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        return await asyncio.gather(*(_stream(session, base_url, s) for s in specs), return_exceptions=True)


def stream_all(base_url: str, specs: list[Spec], timeout: float = 1200) -> list[Answer | BaseException]:
    return asyncio.run(_stream_all(base_url, specs, timeout))


async def _abandon(base_url: str, specs: list[Spec], chunks_before_leaving: int) -> int:
    """Start streams, read a few chunks of each, then drop every connection. Returns how many started."""
    started = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        async def one(spec):
            nonlocal started
            response = await session.post(base_url + spec.endpoint, json=spec.streaming())
            seen = 0
            async for raw in response.content:
                if raw.strip().startswith(b"data:"):
                    seen += 1
                    if seen >= chunks_before_leaving:
                        break
            started += seen >= chunks_before_leaving
            response.close()     # the client goes away mid-stream
        await asyncio.gather(*(one(s) for s in specs))
    return started


def abandon_streams(base_url: str, specs: list[Spec], chunks_before_leaving: int = 3) -> int:
    return asyncio.run(_abandon(base_url, specs, chunks_before_leaving))
