"""The load generator of tasks 6-8, 10 and the benchmarks, measured the way vLLM's own
`vllm bench serve` does it: every request is streamed, so each has a time to first token (TTFT),
a time per output token after the first (TPOT) and an end-to-end latency; failures are counted,
never dropped. A level of load has one form, LoadLevel: what run_level returns, and what a task
saves in its result as it is."""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from common import measure, metrics, results, settings

REQUEST_TIMEOUT_S = 600


@dataclass
class RequestResult:
    success: bool
    output_tokens: int = 0
    prompt_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    error: str = ""
    start_s: float = 0.0          # time.perf_counter() when the request was sent
    # when each streamed chunk came, in seconds after start_s: vLLM streams a chunk a request a
    # step (its text may be empty while the detokenizer waits for the rest of a character)
    token_times_s: list[float] = field(default_factory=list)
    text: str = ""                # the answer as streamed, its chunks joined

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (vLLM's TPOT)."""
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    @property
    def itl_s(self) -> list[float]:
        """The gaps between streamed chunks (vLLM's inter-token latency, ITL)."""
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:])]


# How a server is told to hold the end-of-sequence token off: vLLM's extension min_tokens
# (mini_engine's server takes it too), or a GenerationConfig as JSON (`transformers serve`, which
# refuses fields it does not know)
HOLD_EOS = ("min_tokens", "generation_config")


def completion_payload(model: str, prompt: str, max_tokens: int, stream: bool,
                       temperature: float | None = None, hold_eos: str = "min_tokens") -> dict:
    """The /v1/completions body of the lab. The end-of-sequence token is held off (HOLD_EOS), so
    every request generates max_tokens, as in tasks 1-2. temperature: the lab's
    settings.TEMPERATURE unless given (0: greedy, as task 12 compares answers token for token)."""
    temperature = settings.TEMPERATURE if temperature is None else temperature
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
               "temperature": temperature}
    if hold_eos == "min_tokens":
        payload["min_tokens"] = max_tokens
    else:
        payload["generation_config"] = json.dumps({
            "max_new_tokens": max_tokens, "min_new_tokens": max_tokens,
            "do_sample": temperature > 0, "temperature": temperature or 1.0})
    if stream:
        payload.update(stream=True, stream_options={"include_usage": True})
    return payload


async def send_streaming(session: aiohttp.ClientSession, base_url: str, model: str, prompt: str,
                         max_tokens: int, temperature: float | None = None,
                         hold_eos: str = "min_tokens") -> RequestResult:
    start = time.perf_counter()
    ttft = None
    usage = {}
    times: list[float] = []
    texts: list[str] = []
    payload = completion_payload(model, prompt, max_tokens, True, temperature, hold_eos)
    try:
        async with session.post(f"{base_url}/v1/completions", json=payload) as resp:
            if resp.status != 200:
                body = await resp.text()
                try:
                    message = json.loads(body).get("error", {}).get("message", body)
                except ValueError:
                    message = body
                return RequestResult(False, error=f"HTTP {resp.status}: {str(message)[:200]}",
                                     start_s=start)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):      # the server failed the request mid-stream
                    message = chunk["error"].get("message", chunk["error"])
                    return RequestResult(False, error=f"stream error: {message}"[:200],
                                         start_s=start)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if choices:   # one chunk a step, as vllm bench serve counts them for its ITL
                    times.append(time.perf_counter() - start)
                    texts.append(choices[0].get("text") or "")
                    if ttft is None and choices[0].get("text"):
                        ttft = times[-1]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return RequestResult(False, error=f"{type(e).__name__}: {e}"[:200], start_s=start)
    latency = time.perf_counter() - start
    return RequestResult(True, usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0),
                         ttft if ttft is not None else latency, latency, start_s=start,
                         token_times_s=times, text="".join(texts))


@dataclass
class HttpCall(results.Record):
    """One /v1/completions request: the answer, how long it took, the tokens it counted."""
    text: str
    latency_s: float
    prompt_tokens: int
    completion_tokens: int


class CallFailed(Exception):
    """The server refused the request, or could not be reached (the message is one line)."""


def send_openai(base_url: str, model: str, prompt: str, max_tokens: int,
                hold_eos: str = "min_tokens") -> HttpCall:
    """One request with the official OpenAI SDK, whole: only base_url differs from OpenAI's API.
    What holds EOS off (a server's extension) goes through extra_body."""
    import openai

    # no key needed locally; no retries, whose waits would count in the latency
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0)
    payload = completion_payload(model, prompt, max_tokens, False, hold_eos=hold_eos)
    extra = {k: payload[k] for k in HOLD_EOS if k in payload}
    start = time.perf_counter()
    try:
        completion = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens,
            temperature=payload["temperature"], extra_body=extra)
    except openai.APIStatusError as e:
        raise CallFailed(f"the server refused the request: {refusal(e.status_code, e.response.text)}")
    except openai.APIConnectionError as e:
        raise CallFailed(f"the server at {base_url} cannot be reached ({e})")
    except openai.OpenAIError as e:          # an answer the SDK cannot read, for one
        raise CallFailed(f"the OpenAI SDK failed: {type(e).__name__}: {e}")
    return HttpCall(completion.choices[0].text, time.perf_counter() - start,
                    completion.usage.prompt_tokens, completion.usage.completion_tokens)


def refusal(status: int, body: str) -> str:
    """'HTTP 400: <the error's message>', from an OpenAI-style error body (else its start)."""
    try:
        return f"HTTP {status}: {json.loads(body)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:200]}"


def percentile(values: list[float], pct: float) -> float:
    """The pct-th percentile (0.0 for no values), by linear interpolation between the closest
    ranks, as numpy.percentile and `vllm bench serve` take it."""
    values = sorted(values)
    if not values:
        return 0.0
    k = (len(values) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def seconds(value: float | None) -> str:
    """A latency for a report: '-' where nothing was measured (no request succeeded)."""
    return "-" if value is None else f"{value:.2f}"


@dataclass
class LoadLevel(results.Record):
    """One load level: num_users requests, one per user, sent at once (is_concurrent) or one
    after another, each streamed. Its figures are those of the requests that succeeded (None:
    none did); failures are counted. This record is what run_level returns and what tasks 6-7
    save as it is; `requests` keeps the raw per-request results of a level measured now (not
    saved: a level read back from disk has none)."""
    num_users: int
    num_ok: int                             # requests that succeeded
    duration_s: float                       # wall time of the level, first send to last token
    num_output_tokens: int                  # of the requests that succeeded
    tokens_per_s: float                     # num_output_tokens / duration_s, all users together
    mean_latency_s: float | None = None     # end to end, per request
    p50_latency_s: float | None = None
    p95_latency_s: float | None = None
    mean_ttft_s: float | None = None        # time to first token
    p95_ttft_s: float | None = None
    mean_tpot_s: float | None = None        # time per output token after the first
    errors: list[str] = field(default_factory=list)   # the failed requests' errors, distinct
    is_concurrent: bool = True
    engine_itl_s: float | None = None       # the server's own mean inter-token latency over
                                            # the level, from /metrics (None: not read)
    requests: list[RequestResult] = field(default_factory=list, init=False, repr=False,
                                          compare=False)

    @classmethod
    def of(cls, requests: list[RequestResult], duration_s: float,
           is_concurrent: bool = True) -> "LoadLevel":
        """The level's figures from its requests' results, the results kept in `requests`."""
        ok = [r for r in requests if r.success]

        def mean(what: str) -> float | None:
            return statistics.fmean(sorted(getattr(r, what) for r in ok)) if ok else None

        def pct(what: str, p: float) -> float | None:
            return percentile([getattr(r, what) for r in ok], p) if ok else None

        num_tokens = sum(r.output_tokens for r in ok)
        level = cls(len(requests), len(ok), duration_s, num_tokens, num_tokens / duration_s,
                    mean("latency_s"), pct("latency_s", 50), pct("latency_s", 95),
                    mean("ttft_s"), pct("ttft_s", 95), mean("tpot_s"),
                    sorted({r.error for r in requests if not r.success}), is_concurrent)
        level.requests = list(requests)
        return level

    @property
    def num_failed(self) -> int:
        return self.num_users - self.num_ok

    @property
    def ok(self) -> list[RequestResult]:
        """The raw results of the requests that succeeded (measured now; none when read back)."""
        return [r for r in self.requests if r.success]


async def _run(base_url: str, model: str, prompts: list[str], max_tokens: int,
               concurrent: bool, temperature: float | None, hold_eos: str) -> LoadLevel:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)   # no client-side cap on concurrent requests
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        if concurrent:
            requests = await asyncio.gather(*(send_streaming(session, base_url, model, p,
                                                             max_tokens, temperature, hold_eos)
                                              for p in prompts))
        else:
            requests = [await send_streaming(session, base_url, model, p, max_tokens, temperature,
                                             hold_eos)
                        for p in prompts]
        return LoadLevel.of(list(requests), time.perf_counter() - start, concurrent)


def run_level(base_url: str, model: str, prompts: list[str], max_tokens: int,
              concurrent: bool = True, temperature: float | None = None,
              hold_eos: str = "min_tokens") -> LoadLevel:
    """Send every prompt at once (concurrent) or one after another; wait for all. One user per
    prompt: the level's num_users is len(prompts). temperature, hold_eos: completion_payload's."""
    return asyncio.run(_run(base_url, model, prompts, max_tokens, concurrent, temperature,
                            hold_eos))


def measured_level(base_url: str, model: str, prompts: list[str], max_tokens: int,
                   concurrent: bool = True, hold_eos: str = "min_tokens") -> LoadLevel:
    """One level, and the engine's own mean inter-token latency over it, from the server's
    /metrics (None where it has none): its step without the API server and HTTP, which the
    client's TPOT includes."""
    before = metrics.read(base_url)
    level = run_level(base_url, model, prompts, max_tokens, concurrent=concurrent,
                      hold_eos=hold_eos)
    level.engine_itl_s = metrics.engine_itl_s(before, metrics.read(base_url))
    return level


def levels_in_turns(base_url: str, model: str, users: list[int], max_tokens: int, passes: int,
                    hold_eos: str = "min_tokens", indent: str = "  ") -> list[list[LoadLevel]]:
    """Every level's passes, the levels taking turns (1, 5, 10, 20, then again), so the
    machine's drift lands in every level's spread rather than in one level; a line a pass. A
    pass in which a request failed is the last."""
    found: list[list[LoadLevel]] = [[] for _ in users]
    for p in range(passes):
        for i, num_users in enumerate(users):
            print(f"{indent}Pass {p + 1}/{passes}, {num_users} user{'s' * (num_users > 1)}...",
                  end=" ", flush=True)
            level = measured_level(base_url, model, user_prompts(num_users), max_tokens,
                                   hold_eos=hold_eos)
            found[i].append(level)
            print(f"{level.tokens_per_s:.1f} tok/s, {seconds(level.mean_latency_s)} s avg, "
                  f"{level.num_ok}/{num_users} ok", flush=True)
        if p + 1 < passes and any(lv[-1].num_failed for lv in found):
            # a request failed: the server is down or refusing, and a pass more measures nothing
            print(f"{indent}A request failed in pass {p + 1}: no more passes.", flush=True)
            break
    return found


def median_passes(passes: list[list[LoadLevel]]) -> list[LoadLevel]:
    """Each level's median pass by tokens/s, kept whole: its latencies are that pass's."""
    return [measure.median_pass(lv, lambda p: p.tokens_per_s) for lv in passes]


def user_prompts(num_users: int) -> list[str]:
    """One prompt per user, different so no two requests share a whole prompt, and short
    (at most 13 tokens): 13 + 50 new tokens fit task 7's max_model_len of 64."""
    topics = ["a large language model", "inference", "a GPU", "a KV cache", "batching",
              "a tokenizer", "attention", "a neural network", "quantization", "an API server"]
    return [f"User {i + 1}: explain what {topics[i % len(topics)]} is."
            for i in range(num_users)]
