"""Task 11's load on vLLM's server (task_11_chunked_prefill.py sends it): the chats streamed at
once; the long documents sent the moment every chat has streamed its first few tokens (read
from the chats' own streams as they come), streamed too. Also the tokens per engine step, read
from /metrics' histogram vllm:iteration_tokens_total before and after the load (its buckets: how
many steps computed how many tokens), and the steps of the documents' prefill as the chats'
streams show them."""
from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from common import load
from lessons.task_11.record import IterationTokens

ITERATION_TOKENS = "vllm:iteration_tokens_total"


def iteration_histogram(text: str) -> tuple[dict[float, float], float, float]:
    """(upper bound -> cumulative steps, steps, tokens) of vllm:iteration_tokens_total in one
    /metrics text, summed over engines; +Inf is float('inf')."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ITERATION_TOKENS + "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == ITERATION_TOKENS + "_count":
                count += sample.value
            elif sample.name == ITERATION_TOKENS + "_sum":
                total += sample.value
    return buckets, count, total


def iteration_tokens(before: str, after: str) -> IterationTokens | None:
    """The steps of one load, by how many tokens each computed: after's histogram minus
    before's, each bucket on its own (not cumulative); None if the server does not export it."""
    (b0, n0, s0), (b1, n1, s1) = iteration_histogram(before), iteration_histogram(after)
    if not b1:
        return None
    bounds = sorted(le for le in b1 if le != float("inf"))
    cumulative = [b1[le] - b0.get(le, 0.0) for le in bounds]
    steps = {int(le): round(c - p) for le, c, p in zip(bounds, cumulative, [0.0] + cumulative)}
    return IterationTokens(round(n1 - n0), round(s1 - s0), steps)


def tokens_at_arrival(chats: list[load.RequestResult], longs: list[load.RequestResult]) -> int:
    """The fewest tokens any chat had streamed when the first document was sent."""
    begin = min(r.start_s for r in longs)
    return min(sum(c.start_s + t < begin for t in c.token_times_s) for c in chats)


def prefill_steps(chats: list[load.RequestResult], longs: list[load.RequestResult]) -> int | None:
    """The steps the long documents' prefill took, as the chats' streams show them: a chat
    decoding makes a token a step, so its tokens that came between the first document's send
    and the last document's first token count those steps, less the first of them (it ends the
    step that was running when the documents came). The most of any chat: a chunk that carried
    two tokens hides a step. None when a chat had finished before the last first token."""
    begin = min(r.start_s for r in longs)
    end = max(r.start_s + r.ttft_s for r in longs)
    if any(c.start_s + c.token_times_s[-1] < end for c in chats):
        return None
    return max(1, max(sum(begin < c.start_s + t <= end for t in c.token_times_s)
                      for c in chats) - 1)


class _Watched:
    """The session load.send_streaming posts through, counting each response's chunks with
    text as send_streaming reads them (`async for raw in resp.content`, the same test of a
    chunk), so the load can send the documents the moment every chat has streamed arrive_after
    tokens: no polling, and nothing read from the server while the chats stream."""

    def __init__(self, session: aiohttp.ClientSession, num_chats: int, arrive_after: int):
        self.session, self.num_chats, self.arrive_after = session, num_chats, arrive_after
        self.counts: list[int] = []          # per request, in the order they were posted
        self.arrived = asyncio.Event()       # every chat has streamed arrive_after tokens

    def post(self, *args, **kwargs):
        self.counts.append(0)
        return _WatchedPost(self, len(self.counts) - 1, self.session.post(*args, **kwargs))

    def count(self, i: int, raw: bytes) -> None:
        line = raw.strip()
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            choices = json.loads(line[5:]).get("choices") or []
            self.counts[i] += bool(choices and choices[0].get("text"))
        chats = self.counts[:self.num_chats]
        if len(chats) == self.num_chats and min(chats) >= self.arrive_after:
            self.arrived.set()


class _WatchedPost:
    """session.post's context manager, its response's content counted by _Watched."""

    def __init__(self, watched: _Watched, i: int, post):
        self.watched, self.i, self.post = watched, i, post

    async def __aenter__(self):
        resp = await self.post.__aenter__()
        watched, i = self.watched, self.i

        async def content():
            async for raw in resp.content:
                watched.count(i, raw)
                yield raw
        return SimpleNamespace(status=resp.status, text=resp.text, content=content())

    async def __aexit__(self, *exc):
        return await self.post.__aexit__(*exc)


async def _staggered(base_url: str, model: str, chats: list[str], longs: list[str],
                     chat_output: int, long_output: int, arrive_after: int):
    timeout = aiohttp.ClientTimeout(total=load.REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        watched = _Watched(session, len(chats), arrive_after)
        start = time.perf_counter()
        chat_tasks = [asyncio.create_task(load.send_streaming(watched, base_url, model, p,
                                                              chat_output)) for p in chats]
        arrived = asyncio.create_task(watched.arrived.wait())
        # the documents go once every chat has streamed arrive_after tokens (or one has ended)
        await asyncio.wait([arrived, *chat_tasks], return_when=asyncio.FIRST_COMPLETED)
        arrived.cancel()
        long_results = await asyncio.gather(*(load.send_streaming(session, base_url, model, p,
                                                                  long_output) for p in longs))
        chat_results = await asyncio.gather(*chat_tasks)
        return list(chat_results), list(long_results), time.perf_counter() - start


def staggered_load(base_url: str, model: str, chats: list[str], longs: list[str],
                   chat_output: int, long_output: int, arrive_after: int):
    """(chat results, long results, the load's seconds): the chats at once, the long documents
    once the chats have made arrive_after tokens each (or one has finished)."""
    return asyncio.run(_staggered(base_url, model, chats, longs, chat_output, long_output,
                                  arrive_after))
