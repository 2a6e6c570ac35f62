"""The load generator of tasks 6-7, measured the way vLLM's own `vllm bench serve` does it:
every request is streamed, so each has a time to first token (TTFT), a time per output token
after the first (TPOT) and an end-to-end latency; failures are counted, never dropped."""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import aiohttp

from common import settings

REQUEST_TIMEOUT_S = 600


@dataclass
class RequestResult:
    success: bool
    output_tokens: int = 0
    prompt_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    error: str = ""

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (vLLM's TPOT)."""
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def completion_payload(model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """The /v1/completions body of the lab. min_tokens (a vLLM extension) holds the
    end-of-sequence token off, so every request generates max_tokens, as in tasks 1-2."""
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
               "temperature": settings.TEMPERATURE, "min_tokens": max_tokens}
    if stream:
        payload.update(stream=True, stream_options={"include_usage": True})
    return payload


async def send_streaming(session: aiohttp.ClientSession, base_url: str, model: str, prompt: str,
                         max_tokens: int) -> RequestResult:
    start = time.perf_counter()
    ttft = None
    usage = {}
    try:
        async with session.post(f"{base_url}/v1/completions",
                                json=completion_payload(model, prompt, max_tokens, True)) as resp:
            if resp.status != 200:
                body = await resp.text()
                try:
                    message = json.loads(body).get("error", {}).get("message", body)
                except ValueError:
                    message = body
                return RequestResult(False, error=f"HTTP {resp.status}: {str(message)[:200]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if ttft is None and choices and choices[0].get("text"):
                    ttft = time.perf_counter() - start
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return RequestResult(False, error=f"{type(e).__name__}: {e}"[:200])
    latency = time.perf_counter() - start
    return RequestResult(True, usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0),
                         ttft if ttft is not None else latency, latency)


def percentile(values: list[float], pct: float) -> float:
    """The pct-th percentile (0.0 for no values), by linear interpolation between the closest
    ranks, as numpy.percentile and `vllm bench serve` take it."""
    values = sorted(values)
    if not values:
        return 0.0
    k = (len(values) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


@dataclass
class LevelResult:
    """num_users requests sent at once, one per user."""
    num_users: int
    duration_s: float
    requests: list[RequestResult]

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.success]

    @property
    def num_failed(self) -> int:
        return len(self.requests) - len(self.ok)

    @property
    def total_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def throughput(self) -> float:
        """Output tokens per second over the wall time of the whole level."""
        return self.total_tokens / self.duration_s

    def latency_stat(self, what: str) -> float:
        values = sorted(getattr(r, what) for r in self.ok)
        return statistics.fmean(values) if values else 0.0

    def latency_percentile(self, pct: float) -> float:
        return percentile([r.latency_s for r in self.ok], pct)

    @property
    def errors(self) -> list[str]:
        """The distinct errors of the failed requests, sorted."""
        return sorted({r.error for r in self.requests if not r.success})

    def seconds(self, value: float) -> str:
        """A latency for a report: '-' where no request succeeded (nothing was measured)."""
        return f"{value:.2f}" if self.ok else "-"

    def summary(self) -> dict:
        def measured(value: float, digits: int) -> float | None:   # None: no request succeeded
            return round(value, digits) if self.ok else None

        return {"users": self.num_users, "total_tokens": self.total_tokens,
                "duration_s": round(self.duration_s, 3), "throughput_tok_s": round(self.throughput, 2),
                "mean_latency_s": measured(self.latency_stat("latency_s"), 3),
                "p50_latency_s": measured(self.latency_percentile(50), 3),
                "p95_latency_s": measured(self.latency_percentile(95), 3),
                "mean_ttft_s": measured(self.latency_stat("ttft_s"), 3),
                "mean_tpot_s": measured(self.latency_stat("tpot_s"), 4),
                "succeeded": len(self.ok), "failed": self.num_failed,
                "errors": self.errors}


async def _run(base_url: str, model: str, prompts: list[str], max_tokens: int,
               concurrent: bool) -> LevelResult:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)   # no client-side cap on concurrent requests
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        if concurrent:
            results = await asyncio.gather(*(send_streaming(session, base_url, model, p, max_tokens)
                                              for p in prompts))
        else:
            results = [await send_streaming(session, base_url, model, p, max_tokens)
                       for p in prompts]
        return LevelResult(len(prompts), time.perf_counter() - start, list(results))


def run_level(base_url: str, model: str, prompts: list[str], max_tokens: int,
              concurrent: bool = True) -> LevelResult:
    """Send every prompt at once (concurrent) or one after another; wait for all."""
    return asyncio.run(_run(base_url, model, prompts, max_tokens, concurrent))


def user_prompts(num_users: int) -> list[str]:
    """One prompt per user, different so no two requests share a whole prompt, and short
    (at most 13 tokens): 13 + 50 new tokens fit task 7's max_model_len of 64."""
    topics = ["a large language model", "inference", "a GPU", "a KV cache", "batching",
              "a tokenizer", "attention", "a neural network", "quantization", "an API server"]
    return [f"User {i + 1}: explain what {topics[i % len(topics)]} is."
            for i in range(num_users)]
