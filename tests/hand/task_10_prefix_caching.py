"""Task 10's record by hand (tests/hand/__init__.py): the defaults' run (docs/measurements.md,
"Task 10 on its defaults"), 32 chat requests sharing a 90-token system prompt. Its tests:
tests/tasks/test_task_10.py."""
from __future__ import annotations

from common import results, settings
from common.load import LoadLevel
from lessons.task_10.record import (Correctness, EngineRun, OfflineRequest, PageSnapshot,
                                    PrefixCaching, ServerRun, Settings, WorkloadShape)

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
SHARED = [0, 1, 2, 3, 4]   # 90 shared tokens: 5 whole pages of 16 (80 tokens)
# the summary's row of record(): 2,480 of 3,364 prompt tokens from the cache: 73.7%, shown as 74%
SUMMARY_ROW = "hit 74%, TTFT 2.22 -> 1.05 s, vLLM hit 74%"


def hand_peak(is_shared: bool) -> PageSnapshot:
    """Step 3, 16 requests running, 7 pages each; the first 4 shown. Shared: pages 0-4 in every
    table (ref count 16) and 2 of its own each: 5 + 16 x 2 = 37 held, against 16 x 7 = 112."""
    if is_shared:
        tables = {i: SHARED + [5 + 2 * i, 6 + 2 * i] for i in range(4)}
        refs = {p: 16 if p in SHARED else 1 for table in tables.values() for p in table}
        return PageSnapshot(3, 37, 112, 16, tables, refs)
    tables = {i: list(range(7 * i, 7 * i + 7)) for i in range(4)}
    return PageSnapshot(3, 112, 112, 16, tables, {p: 1 for t in tables.values() for p in t})


def hand_run(label: str, duration_s: float, cached: int, ttft_s: float, num_pages: int,
             peak: PageSnapshot | None) -> EngineRun:
    """32 requests of 16 new tokens (512 in all), 3,364 prompt tokens."""
    return EngineRun(label, duration_s, 512 / duration_s, 3364, cached, ttft_s, ttft_s * 1.5,
                     num_pages, 0.005, peak)


def hand_server(label: str, duration_s: float, ttft_s: float, queries: int, hits: int
                ) -> ServerRun:
    level = LoadLevel(32, 32, duration_s, 512, 512 / duration_s, mean_latency_s=duration_s * 0.9,
                      p50_latency_s=duration_s * 0.9, p95_latency_s=duration_s,
                      mean_ttft_s=ttft_s, p95_ttft_s=ttft_s * 1.4, mean_tpot_s=0.1)
    return ServerRun(label, level, queries, hits, 20.0)


def record(header: results.RunHeader | None = None) -> PrefixCaching:
    """The defaults' run (docs/measurements.md): 32 chat requests, 90 tokens shared, 5 whole pages;
    31 x 80 = 2,480 of 3,364 prompt tokens from the cache (73.7%), in mini_engine and in vLLM;
    TTFT 2.22 -> 1.05 s (mini_engine), 2.15 -> 1.02 s (vLLM). Its summary row: "hit 74%, TTFT
    2.22 -> 1.05 s, vLLM hit 74%"."""
    return PrefixCaching(
        Settings(num_requests=32, num_system_tokens=80, num_output_tokens=16, seed=0,
                 page_size_tokens=16, max_num_seqs=16, max_model_len=128,
                 kv_cache_bytes=settings.KV_CACHE_BYTES, port=8000, is_vllm_measured=True),
        WorkloadShape(num_shared_tokens=90, num_prompt_tokens=3364, min_prompt_tokens=103,
                      max_prompt_tokens=107),
        Correctness(num_requests=32, num_identical=32, cached_prompt_tokens=2480,
                    prompt_tokens=3364, num_checked_hf=3, num_identical_hf=3),
        31,
        [hand_run("cache off", 3.9, 0, 2.22, 128, hand_peak(False)),
         hand_run("cache on", 2.5, 2480, 1.05, 53, hand_peak(True))],
        [hand_run("cache off", 3.93, 0, 2.3, 128, hand_peak(False)),
         hand_run("cache on", 3.80, 0, 2.2, 128, hand_peak(False))],
        [hand_server("cache off", 4.0, 2.15, 0, 0), hand_server("cache on", 2.6, 1.02, 3364, 2480)],
        {"first request": OfflineRequest(106, 0), "request 2": OfflineRequest(103, 80),
         "first request again": OfflineRequest(106, 96)},
        header=header or HEADER)
