"""Task 14's vLLM side: the lab's server started once per KV cache dtype (--kv-cache-dtype auto,
fp8, fp8_e5m2; blocks of 32, prefix caching off so that every prompt is computed), and on each:
its capacity read from /metrics (cache_config_info), the greedy answers and the passage's
log-probabilities (prompt_logprobs, a vLLM extension of /v1/completions), then the memory-bound
load, its running requests sampled from /metrics. Part 2's prompts and passage go in as token
ids, the same ones mini_engine reads; part 3's prompts as the text both engines tokenize."""
from __future__ import annotations

import json
import urllib.request

from common import load, metrics, server
from lessons.task_14.record import Throughput

TIMEOUT_S = 300


def complete(srv, payload: dict) -> dict:
    """One /v1/completions request, not streamed: its first choice."""
    request = urllib.request.Request(f"{srv.base_url}/v1/completions",
                                     data=json.dumps({"model": srv.model_name, **payload}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
        return json.loads(resp.read())["choices"][0]


def answers(srv, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy, EOS allowed, one prompt after another: the answers' token ids."""
    return [complete(srv, {"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                           "return_token_ids": True})["token_ids"] for p in prompts]


def passage_logprobs(srv, ids: list[int]) -> list[float]:
    """log p(token i | tokens before it) for i = 1..n-1, as vLLM computed them."""
    choice = complete(srv, {"prompt": ids, "max_tokens": 1, "temperature": 0,
                            "prompt_logprobs": 0})
    return [entry[str(token)]["logprob"]
            for token, entry in zip(ids[1:], choice["prompt_logprobs"][1:])]


def load_run(srv, name: str, prompts: list[str], tokens: int, page: int) -> tuple[Throughput, str]:
    """Every prompt at once, tokens each, EOS held off: (what ran, the first error or '')."""
    before = metrics.snapshot(metrics.fetch(srv.base_url), 0.0)
    with metrics.Sampler(srv.base_url) as sampler:
        level = load.run_level(srv.base_url, srv.model_name, prompts, tokens, temperature=0)
    after = metrics.snapshot(metrics.fetch(srv.base_url), 0.0)
    run = Throughput("vLLM", name, blocks(srv) * page, sampler.max_running,
                     round(after.preemptions - before.preemptions), level.num_output_tokens,
                     level.duration_s, level.mean_tpot_s)
    return run, level.errors[0] if level.errors else ""


def start(model_choice, dtype: str, kv_cache_dtype: str, s) -> server.Server:
    """The lab's server at the load's budget, this KV cache dtype, blocks of s.page_tokens."""
    config = server.ServerConfig(
        model_choice.path, model_choice.name, dtype, max_model_len=s.max_model_len,
        max_num_seqs=s.load_requests, kv_cache_bytes=s.load_kv_bytes, port=s.port,
        block_size=s.page_tokens, enable_prefix_caching=False,
        engine_args=("--kv-cache-dtype", kv_cache_dtype))
    return server.ensure_server(config, progress=server.in_report)


def blocks(srv) -> int:
    """The KV blocks vLLM made of the budget, as its /metrics reports them."""
    cache = metrics.info_labels(metrics.fetch(srv.base_url), "vllm:cache_config")
    return int(cache["num_gpu_blocks"])
